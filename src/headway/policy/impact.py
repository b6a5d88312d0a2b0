"""Impact (`impact`, and `impact-oracle` on the truth): expected successful work per GPU-hour first,
with a starvation bound and a repeat-failure hold (DESIGN.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from headway.policy.base import Policy
from headway.policy.factors import DAY, HOUR, class_table, fairshare_of, lognormal_mean
from headway.policy.snapshot import F64, I64, Ranking, Snapshot

CLASS_WEIGHT: dict[str, float] = {"low": 0.5, "normal": 1.0, "high": 2.0, "urgent": 4.0}
# The starvation bound. While a starved job waits at the head nothing may pass it, so a bound shorter
# than the queue's usual delays turns impact into strict FIFO: on the Philly replay at load 1.0
# (weeks-long queues) normal = 1 / 7 / 14 / 30 days gave a mean time-to-success of 734k / 601k / 377k /
# 258k s (CHANGELOG.md, "Policies"). Set it to what your users can accept.
CLASS_MAX_WAIT: dict[str, float] = {"low": 60 * DAY, "normal": 30 * DAY, "high": 7 * DAY, "urgent": 1 * DAY}


@dataclass(frozen=True)
class Impact(Policy):
    """DESIGN.md's impact ordering: w * p / c x fair share, with a starvation bound and a failure hold.

    c = gpus * (p * R + (1 - p) * F) in GPU-hours. Tiers: 0 starved (waited past the class max_wait:
    earliest deadline first; GPUs it could use go only to jobs whose time limit ends before its planned
    start), 1 normal, 2 held (its user+name failed `hold_after` times in a row with no success since).
    By default only a starved head holds a reservation and a normal job that does not fit is skipped;
    `reserve="head"` is classic EASY with backfill on predicted runtimes. Running jobs past their
    predicted end re-plan the reservation (see `slip_end`).
    """

    name: ClassVar[str] = "impact"
    mode: ClassVar[str] = "easy"
    wakes: ClassVar[bool] = True  # at the next starvation deadline
    tier_names: ClassVar[tuple[str, ...]] = ("starved (past max_wait)", "normal", "held (repeat failures)")
    placement: str = "topology"
    class_weight: dict[str, float] = field(default_factory=lambda: dict(CLASS_WEIGHT))
    max_wait_s: dict[str, float] = field(default_factory=lambda: dict(CLASS_MAX_WAIT))
    hold_after: int = 3
    fairshare_power: float = 1.0  # fairshare ** power: 1 is Slurm's factor, 0 turns fair share off
    # Which head gets a reservation: "starved" (only a job past max_wait; a normal job that does not
    # fit is skipped) or "head" (DESIGN.md's classic EASY: whatever job first does not fit).
    # CHANGELOG.md ("Policies") has the measurements behind the default.
    reserve: str = "starved"
    # R in c: "mean" (default), the expected runtime of a log-normal through the predicted runtime
    # (taken as its median) and p90; "point", the predicted runtime itself. Ordering by expected
    # processing time is what minimises mean completion time without preemption (Smith's rule on
    # expectations), and a right-skewed runtime's mean lies above its typical value.
    runtime_estimate: str = "mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reserve not in ("starved", "head"):
            raise ValueError(f"reserve must be 'starved' or 'head', not {self.reserve!r}")
        if self.runtime_estimate not in ("mean", "point"):
            raise ValueError(f"runtime_estimate must be 'mean' or 'point', not {self.runtime_estimate!r}")

    def inputs(self, snap: Snapshot) -> tuple[F64, F64, F64]:
        """(p, R, F) per pending job: the predictions (R as `runtime_estimate` says)."""
        p = snap.pending
        r = p.runtime
        if self.runtime_estimate == "mean":
            r = lognormal_mean(r, p.runtime_p90)
        return p.p_success, r, p.time_to_failure

    def deadline(self, classes: Sequence[str], submit: F64, klass: I64) -> F64:
        """When each job starves: its submit time plus its class's max_wait."""
        return submit + class_table(classes, klass, self.max_wait_s, self.max_wait_s.get("normal", DAY))

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        ps, rt, ttf = self.inputs(snap)
        w = class_table(snap.classes, p.klass, self.class_weight, 1.0)
        r = np.fmin(rt, p.time_limit)  # fmin ignores a NaN (no limit)
        f = np.fmin(ttf, p.time_limit)
        c = np.maximum(p.gpus, 1e-3) * (ps * r + (1 - ps) * f) / HOUR
        fs = fairshare_of(snap, p.user)
        if self.fairshare_power != 1.0:
            fs = fs**self.fairshare_power
        score = w * ps / np.maximum(c, 1e-6) * fs
        deadline = self.deadline(snap.classes, p.submit, p.klass)
        starved = deadline <= snap.now
        held = p.fail_streak >= self.hold_after
        tier = np.where(starved, 0, np.where(held, 2, 1)).astype(np.int64)
        score = np.where(starved, -deadline, score)
        factors = {
            "p": ps,
            "R_h": r / HOUR,
            "F_h": f / HOUR,
            "c_gpu_h": c,
            "w": w if isinstance(w, np.ndarray) else np.full(c.shape, w),  # np.broadcast_to costs more
            "fairshare": fs,
            "waited_h": (snap.now - p.submit) / HOUR,
        }
        return tier, score, factors

    def pending_estimate(self, snap: Snapshot) -> F64:
        return np.fmin(self.inputs(snap)[1], snap.pending.time_limit)

    def strict_head(self, ranking: Ranking, pos: int) -> bool:
        return int(ranking.tier[pos]) == 0

    def reserve_mask(self, ranking: Ranking) -> npt.NDArray[np.bool_] | None:
        return None if self.reserve == "head" else np.asarray(ranking.tier == 0)

    def wake_at(self, snap: Snapshot) -> float | None:
        """The earliest starvation deadline still ahead: the job then moves to the starved tier."""
        p = snap.pending
        if len(p) == 0:
            return None
        deadline = self.deadline(snap.classes, p.submit, p.klass)
        ahead = deadline[deadline > snap.now]
        return float(ahead.min()) if len(ahead) else None


@dataclass(frozen=True)
class ImpactOracle(Impact):
    """Impact given the truth (outcome and runtime) instead of predictions: what perfect predictions
    would be worth on this trace. An oracle: no real scheduler can run it."""

    name: ClassVar[str] = "impact-oracle"
    oracle: ClassVar[bool] = True
    # No repeat-failure hold: told the truth, a job that will fail already scores 0, and the hold could
    # only hold back one that will succeed after its user's failures.
    hold_after: int = 2**31

    def inputs(self, snap: Snapshot) -> tuple[F64, F64, F64]:
        p = snap.pending
        if p.oracle_runtime is None or p.oracle_success is None:
            raise ValueError("impact-oracle needs the true runtimes and outcomes in the snapshot")
        return p.oracle_success.astype(np.float64), p.oracle_runtime, p.oracle_runtime
