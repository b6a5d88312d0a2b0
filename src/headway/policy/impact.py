"""Impact (`impact`, and `impact-oracle` on the truth): expected successful work per GPU-hour first,
with a starvation bound and a repeat-failure hold (DESIGN.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from headway.policy.base import Policy
from headway.policy.factors import DAY, HOUR, class_table, fairshare_of, lognormal_mean, slip_end
from headway.policy.preempt import (
    DEFAULT_CHECKPOINT_S,
    DEFAULT_RESTART_S,
    URGENT_CLASSES,
    Planned,
    cheapest_block,
    class_rank,
    classes_waiting,
    gang_of,
    progress_lost,
)
from headway.policy.snapshot import F64, I64, Ranking, Snapshot, Start
from headway.policy.survival import expected_remaining, p_complete_after

CLASS_WEIGHT: dict[str, float] = {"low": 0.5, "normal": 1.0, "high": 2.0, "urgent": 4.0}
# The starvation bound. While a starved job waits at the head nothing may pass it, so a bound shorter
# than the queue's usual delays turns impact into strict FIFO: on the Philly replay at load 1.0
# (weeks-long queues) normal = 1 / 7 / 14 / 30 days gave a mean time-to-success of 734k / 601k / 377k /
# 258k s (CHANGELOG.md, "Policies"). Set it to what your users can accept.
CLASS_MAX_WAIT: dict[str, float] = {"low": 60 * DAY, "normal": 30 * DAY, "high": 7 * DAY, "urgent": 1 * DAY}
# Preemption (docs/policies.md): a high or urgent gang that cannot be placed may stop preemptible jobs of
# lower classes, none before it has run its class's minimum runtime (KAI's and Kueue's guard: a job
# gets some work done), and none twice within its class's window.
PREEMPT_CLASSES: tuple[str, ...] = URGENT_CLASSES
CLASS_MIN_RUNTIME: dict[str, float] = {"low": 600.0, "normal": 1800.0, "high": 3600.0}
CLASS_PREEMPT_WINDOW: dict[str, float] = {"low": 3600.0, "normal": 4 * HOUR, "high": 12 * HOUR}
# Tiers: 0 starved, 1 normal, 2 held, 3 fail-fast probe, 4 urgent (a preempting class); ranked in the
# order starved, urgent, probe, normal, held.
_TIER_ORDER = np.array([0, 3, 4, 2, 1], dtype=np.int64)
PROBE_TIER, URGENT_TIER = 3, 4


@dataclass(frozen=True)
class Impact(Policy):
    """DESIGN.md's impact ordering: w * p / c x fair share, with a starvation bound and a failure hold.

    c = gpus * (p * R + (1 - p) * F) in GPU-hours. Tiers, in rank order: 0 starved (waited past the class
    max_wait: earliest deadline first; GPUs it could use go only to jobs whose time limit ends before its
    planned start), 4 urgent (a high or urgent job: never held, a strict reservation like a starved one,
    and it may preempt), 3 fail-fast probe (off by default), 1 normal, 2 held (its user+name failed
    `hold_after` times in a row with no success since). By default only a starved or urgent head holds
    a reservation and a normal job that does not fit is skipped; `reserve="head"` is classic EASY with
    backfill on predicted runtimes. Running jobs' ends are survival-aware (policy/survival.py).
    """

    name: ClassVar[str] = "impact"
    mode: ClassVar[str] = "easy"
    wakes: ClassVar[bool] = True  # at the next starvation deadline
    tier_names: ClassVar[tuple[str, ...]] = (
        "starved (past max_wait)",
        "normal",
        "held (repeat failures)",
        "fail-fast probe",
        "urgent (high or urgent class)",
    )
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
    # Preemption for high and urgent gangs (`preemption=False`: the same policy without it).
    preemption: bool = True
    preempt_classes: tuple[str, ...] = PREEMPT_CLASSES
    min_runtime_s: dict[str, float] = field(default_factory=lambda: dict(CLASS_MIN_RUNTIME))
    preempt_window_s: dict[str, float] = field(default_factory=lambda: dict(CLASS_PREEMPT_WINDOW))
    restart_penalty_s: float = DEFAULT_RESTART_S
    checkpoint_default_s: float = DEFAULT_CHECKPOINT_S
    max_preemptors: int = 8  # pending jobs per pass that may try to preempt
    # The fail-fast lane: under contention, a job with a low or unknown chance to complete whose failures
    # come early (predicted median time to failure within `probe_s`) may start ahead of its rank for a
    # probe of `probe_s`; if it survives it is requeued, preemptible, with its chance updated by survival.
    # At most `probe_share` of the GPUs run probes at once.
    fail_fast: bool = False
    probe_s: float = 600.0
    probe_p: float = 0.5
    probe_share: float = 0.05

    @property
    def preemptive(self) -> bool:  # type: ignore[override]
        return self.preemption

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
        ps = p.p_success
        ran = p.attained > 0
        if ran.any():  # it ran before (preempted, or a probe) without failing: survival tells more
            executed = p.attained / np.maximum(p.gpus, 1e-3)
            after = p_complete_after(executed, ps, p.runtime, p.runtime_p90, p.time_to_failure)
            ps = np.where(ran & np.isfinite(after), after, ps)
        return ps, r, p.time_to_failure

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
        urgent = self._urgent(snap.classes)
        if urgent is not None:
            # A high or urgent job is never held: its class says the work matters now (its failures
            # still lower its p, and so its place among the urgent).
            tier = np.where((tier != 0) & urgent[p.klass], URGENT_TIER, tier)
        if self.fail_fast:
            tier = np.where(self._probes(snap, ps, ttf, tier), PROBE_TIER, tier)
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

    def _urgent(self, classes: Sequence[str]) -> npt.NDArray[np.bool_] | None:
        """Per class index, whether it is a preempting class (None: the trace has none)."""
        flags = np.array([c in self.preempt_classes for c in classes], dtype=bool)
        return flags if flags.any() else None

    def rank(self, snap: Snapshot) -> Ranking:
        """As the base, tiers in the order starved, urgent, fail-fast probe, normal, held."""
        p = snap.pending
        if len(p) <= 1 or (not self.fail_fast and self._urgent(snap.classes) is None):
            return super().rank(snap)  # the tier numbers sort as the tiers rank
        tier, score, factors = self.scores(snap)
        order = np.lexsort((p.key, p.submit, -score, _TIER_ORDER[tier]))
        return Ranking(self.name, order.astype(np.int64), score, tier, factors, self.tier_names, p.job_id)

    def _probes(self, snap: Snapshot, ps: F64, ttf: F64, tier: I64) -> npt.NDArray[np.bool_]:
        """Pending jobs the fail-fast lane starts first: under contention (more GPUs asked than free),
        never run before, low or unknown chance, failures predicted within the probe, up to the lane's
        GPUs (those of running probes counted), earliest submitted first."""
        p, r = snap.pending, snap.running
        out = np.zeros(len(p), dtype=bool)
        if float(p.gpus.sum()) <= float(snap.cluster.free.sum()):
            return out
        lane = self.probe_share * snap.cluster.capacity - float(r.gpus[r.probe].sum())
        ok = (tier == 1) & (p.attained <= 0) & ~(ps >= self.probe_p) & (ttf <= self.probe_s)
        ok &= p.gpus <= lane
        at = np.flatnonzero(ok)
        if len(at) == 0:
            return out
        at = at[np.argsort(p.submit[at], kind="stable")]
        out[at[np.cumsum(p.gpus[at]) <= lane]] = True
        return out

    def probe_seconds(self, ranking: Ranking) -> dict[int, float]:
        if not self.fail_fast or len(ranking.order) == 0:
            return {}
        return {int(i): self.probe_s for i in np.flatnonzero(ranking.tier == PROBE_TIER)}

    def pending_estimate(self, snap: Snapshot) -> F64:
        return np.fmin(self.inputs(snap)[1], snap.pending.time_limit)

    def running_end(self, snap: Snapshot) -> F64:
        """Survival-aware expected end (policy/survival.py); the slip rule where predictions are unknown,
        the probe's end for a probe, the time limit as a cap."""
        r = snap.running
        elapsed = np.maximum(snap.now - r.start, 0.0)
        rem = expected_remaining(elapsed, r.p_success, r.runtime, r.runtime_p90, r.time_to_failure)
        slip = slip_end(r.start, r.runtime, r.runtime_p90, r.time_limit, snap.now)
        end = np.where(np.isfinite(rem), snap.now + rem, slip)
        if r.probe.any():
            end = np.where(r.probe, np.minimum(end, np.maximum(r.start + self.probe_s, snap.now)), end)
        cap = r.start + r.time_limit
        end = np.where(np.isfinite(cap) & (cap > snap.now), np.minimum(end, cap), end)
        if self.may_preempt(snap):
            # A job a waiting high or urgent gang may stop frees its GPUs, for that gang's reservation, as
            # soon as it is past its minimum runtime: the plan drains the nodes preemption can finish.
            w = class_rank(snap.classes, self.class_weight)
            top = float(w[snap.pending.klass[np.isin(snap.pending.klass, self._urgent_idx(snap))]].max())
            min_rt = class_table(snap.classes, r.klass, self.min_runtime_s, 0.0)
            victim = r.preemptible & (w[r.klass] < top)
            end = np.where(victim, np.minimum(end, np.maximum(r.start + min_rt, snap.now)), end)
        return np.asarray(end, dtype=np.float64)

    # --- preemption ----------------------------------------------------------------------------------

    def _urgent_idx(self, snap: Snapshot) -> list[int]:
        return [i for i, c in enumerate(snap.classes) if c in self.preempt_classes]

    def may_preempt(self, snap: Snapshot) -> bool:
        if not self.preemption or len(snap.running) == 0 or not snap.running.preemptible.any():
            return False
        return classes_waiting(snap, self.preempt_classes)

    def victim_cost(self, snap: Snapshot) -> tuple[F64, npt.NDArray[np.bool_]]:
        """Per running job: the expected cost of stopping it now, GPUs x (progress lost + restart) x
        P(complete | ran this long) (an unknown chance counts as 1), and whether it may be stopped at all
        (preemptible, past its class's minimum runtime, not preempted within its class's window)."""
        r, now = snap.running, snap.now
        elapsed = np.maximum(now - r.start, 0.0)
        lost = progress_lost(elapsed, r.checkpoint_every)
        pc = p_complete_after(elapsed, r.p_success, r.runtime, r.runtime_p90, r.time_to_failure)
        pc = np.where(np.isfinite(pc), pc, 1.0)
        # a tiny per-GPU term: among victims that lose nothing, stop the fewest GPUs
        cost = r.gpus * ((lost + self.restart_penalty_s) * pc + 1e-3)
        min_rt = class_table(snap.classes, r.klass, self.min_runtime_s, 0.0)
        window = class_table(snap.classes, r.klass, self.preempt_window_s, 0.0)
        since = now - r.last_preempted
        ok = r.preemptible & (elapsed >= min_rt) & ~(since < window)
        return np.asarray(cost, dtype=np.float64), ok

    def preemptions(
        self, snap: Snapshot, ranking: Ranking, free: I64, share: I64, started: set[int]
    ) -> tuple[list[int], list[Start]]:
        """In rank order, each waiting high or urgent gang stops the cheapest set of lower-class victims
        that frees a contiguous block for it (`preempt.cheapest_block`), up to a waiting starved job:
        none behind it may take GPUs by preemption (the starvation bound holds)."""
        r, p = snap.running, snap.pending
        if not self.may_preempt(snap):
            return [], []
        cost, ok = self.victim_cost(snap)
        if not ok.any():
            return [], []
        w = class_rank(snap.classes, self.class_weight)
        rw = w[r.klass]
        allowed = {i for i, c in enumerate(snap.classes) if c in self.preempt_classes}
        planned = Planned(snap)
        tried = 0
        tier = ranking.tier
        for pos in ranking.order.tolist():
            if tried >= self.max_preemptors:
                break
            if int(p.key[pos]) in started:
                continue
            starved = int(tier[pos]) == 0
            plan = None
            if int(p.klass[pos]) in allowed and int(tier[pos]) != 2:
                cands = planned.free_of(np.flatnonzero(ok & (rw < w[int(p.klass[pos])])).tolist())
                if cands:
                    tried += 1
                    job = gang_of(p, pos)
                    plan = cheapest_block(self.placement, snap.cluster, free, share, cands, cost, job)
            if plan is not None:
                planned.take(pos, plan)
            elif starved:
                break  # nobody behind a waiting starved job may take GPUs by preemption (the bound)
        return planned.result()

    def strict_head(self, ranking: Ranking, pos: int) -> bool:
        """A starved head, or a high or urgent one: only a job whose time limit ends before its planned
        start may take GPUs it could use (predictions cannot push it back)."""
        return int(ranking.tier[pos]) in (0, URGENT_TIER)

    def reserve_mask(self, ranking: Ranking) -> npt.NDArray[np.bool_] | None:
        """A starved job, and a high or urgent one: GPUs drain for it when it does not fit."""
        tier = ranking.tier
        return None if self.reserve == "head" else np.asarray((tier == 0) | (tier == URGENT_TIER))

    def wake_at(self, snap: Snapshot) -> float | None:
        """The earliest starvation deadline still ahead (the job then moves to the starved tier), and,
        while a high or urgent gang waits, the next time a running job becomes a victim it may stop
        (past its minimum runtime, out of its window)."""
        p = snap.pending
        if len(p) == 0:
            return None
        deadline = self.deadline(snap.classes, p.submit, p.klass)
        times = [deadline[deadline > snap.now]]
        if self.may_preempt(snap):
            r = snap.running
            min_rt = class_table(snap.classes, r.klass, self.min_runtime_s, 0.0)
            window = class_table(snap.classes, r.klass, self.preempt_window_s, 0.0)
            out_of_window = np.where(np.isnan(r.last_preempted), -np.inf, r.last_preempted + window)
            eligible = np.maximum(r.start + min_rt, out_of_window)
            times.append(eligible[r.preemptible & (eligible > snap.now) & np.isfinite(eligible)])
        ahead = np.concatenate(times)
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
