"""The scheduling policies: each ranks a snapshot; one shared loop turns a ranking into a Decision.

Every policy is a frozen dataclass of its knobs. `rank` orders pending jobs by (tier, score): a lower
tier always goes first (e.g. starved before normal before held), a higher score first within a tier,
then earlier submit, then key. `decide` walks that order, places gangs on a scratch copy of the free
GPUs, and, for policies with a reservation, plans it and backfills around it (docs/policies.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from headway.policy.passes import _NO_INTS, HOUR, SMALL_QUEUE, Z90, decide_pass, first_deadline, impact_order
from headway.policy.placement import PLACEMENTS, gang_size, place, place_fresh, placeable, take
from headway.policy.snapshot import (
    F64,
    FULL_SHARE,
    I64,
    Allocation,
    ClusterView,
    Decision,
    Ranking,
    Reservation,
    Snapshot,
    Start,
)

DAY = 86400.0
_ORDER_ONE: I64 = np.zeros(1, dtype=np.int64)
_ORDER_ONE.setflags(write=False)
# Whether the shared pass is compiled (headway._native): impact's short-queue scores on plain floats
# are then several times faster than its numpy form; as plain Python they are not, and stay off.
_COMPILED = not hasattr(decide_pass, "__code__")
CLASS_WEIGHT: dict[str, float] = {"low": 0.5, "normal": 1.0, "high": 2.0, "urgent": 4.0}
# The starvation bound. While a starved job waits at the head nothing may pass it, so a bound shorter
# than the queue's usual delays turns impact into strict FIFO: on the Philly replay at load 1.0
# (weeks-long queues) normal = 1 / 7 / 14 / 30 days gave a mean time-to-success of 734k / 601k / 377k /
# 258k s (CHANGELOG.md, "Policies"). Set it to what your users can accept.
CLASS_MAX_WAIT: dict[str, float] = {"low": 60 * DAY, "normal": 30 * DAY, "high": 7 * DAY, "urgent": 1 * DAY}


def fairshare(snap: Snapshot) -> F64:
    """Slurm's classic factor 2^(-usage/share) per user, usage normalised over all users' decayed usage."""
    total = float(snap.usage.sum())
    if total <= 0:
        return np.ones(len(snap.usage))
    shares = np.maximum(snap.shares, 1e-12)
    return np.asarray(np.exp2(-(snap.usage / total) / shares), dtype=np.float64)


def slip_end(start: F64, first: F64, p90: F64, limit: F64, now: float) -> F64:
    """Expected end of running jobs: the estimate, then p90 once passed, then half the elapsed time more.

    A job past its estimate re-plans the reservation at every pass with this updated end (slip handling).
    A time limit caps the estimate (the job would be killed there) while it is still ahead.
    """
    e1 = start + first
    e2 = start + np.fmax(p90, first)
    e3 = now + np.maximum(60.0, 0.5 * (now - start))
    est = np.where(e1 > now, e1, np.where(e2 > now, e2, e3))
    cap = start + limit
    capped = np.isfinite(cap) & (cap > now)
    return np.where(capped, np.minimum(est, cap), est)


@dataclass(frozen=True)
class Policy:
    """Base: a name, a placement, and the shared decide loop."""

    name: ClassVar[str] = "base"
    oracle: ClassVar[bool] = False
    # Whether any decision reads the predictions (p, R, R90, F) of pending or running jobs. A policy
    # that never does (strict / greedy modes, or backfill on time limits only) replays without the
    # predictor: it decides exactly the same, several times faster (tests/test_sim_predictions.py).
    uses_predictions: ClassVar[bool] = True
    # strict: stop at the first job that does not fit (the Helios simulator's baselines); greedy: skip
    # what does not fit; easy: the first job that does not fit gets a reservation, others backfill.
    mode: ClassVar[str] = "greedy"
    tier_names: ClassVar[tuple[str, ...]] = ("queued",)
    placement: str = "first-fit"
    backfill_depth: int = 500  # jobs tested behind the reservation (Slurm's bf_max_job_test default)
    restart_penalty_s: float = 0.0  # added to a preempted job's remaining runtime at each restart

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choose one of {', '.join(PLACEMENTS)}")

    # --- what subclasses define -------------------------------------------------------------------
    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        """(tier, score, factors) per pending position."""
        raise NotImplementedError

    def pending_estimate(self, snap: Snapshot) -> F64:
        """Runtime a backfill candidate is expected to take (seconds)."""
        return np.full(len(snap.pending), np.inf)

    def running_end(self, snap: Snapshot) -> F64:
        """Expected end of each running job (reservation planning)."""
        r = snap.running
        return slip_end(r.start, r.runtime, r.runtime_p90, r.time_limit, snap.now)

    def strict_head(self, ranking: Ranking, pos: int) -> bool:
        """True when nothing may pass this head job on GPUs it could use (starvation bound)."""
        return False

    def reserve_mask(self, ranking: Ranking) -> npt.NDArray[np.bool_] | None:
        """Easy mode: which jobs get a reservation when first not to fit (None: all, classic EASY).

        A job outside the mask that does not fit is skipped, as in greedy mode.
        """
        return None

    def wake_at(self, snap: Snapshot) -> float | None:
        return None

    def wake_after(self, snap: Snapshot, starts: Sequence[Start]) -> float | None:
        """A preemptive policy's next pass for what this pass started (not yet in `snap.running`)."""
        return None

    # Whether a pass over a queue of one job that fits is exactly that start plus `wake_one`, and a pass
    # where no pending job can be placed is only its `wake_at` (true of every policy here but a
    # preemptive one): a simulator may then skip the snapshot and the pass and place the job through
    # `place_one`, the pass's own placement (tests/test_engine_fastpath.py), and ask `wake_one` or
    # `wake_queue` instead of `wake_at`. A subclass that overrides `wake_at` must override both too.
    single_fast: ClassVar[bool] = False

    def place_one(self, view: ClusterView, gpus: float, max_nodes: int) -> Allocation | None:
        """Where `decide` starts a queue of one job on `view` (None: it does not fit now), by the same
        index and placement call."""
        return place_fresh(view, self.placement, gpus, max_nodes)

    def wake_one(self, now: float, submit: float, klass: int, classes: Sequence[str]) -> float | None:
        """`wake_at` for a snapshot at `now` whose queue is this one job."""
        return None

    def wake_queue(self, now: float, submit: F64, klass: I64, classes: Sequence[str]) -> float | None:
        """`wake_at` for a snapshot at `now` whose pending jobs have these submit times and classes: a
        simulator asks it between passes without building a snapshot."""
        return None

    def short_order(self, snap: Snapshot) -> tuple[I64, I64, F64] | None:
        """(order, tier, score) of a short queue (2 to SMALL_QUEUE jobs) without numpy's per-call cost,
        exactly as `scores` and the lexsort in `rank` give them; None: use those."""
        return None

    def preemptions(
        self, snap: Snapshot, ranking: Ranking, free: I64, share: I64, started: set[int]
    ) -> tuple[list[int], list[Start]]:
        return [], []

    # --- the shared core --------------------------------------------------------------------------
    def rank(self, snap: Snapshot) -> Ranking:
        p = snap.pending
        if len(p) <= 1:
            # One job (or none) has one order: scores are computed only if someone reads them (a head
            # that does not fit, an explanation), as most simulator passes see a queue of one job.
            order = _ORDER_ONE if len(p) else _NO_INTS
            return Ranking.deferred(self.name, order, partial(self.scores, snap), self.tier_names, p.job_id)
        if len(p) <= SMALL_QUEUE:
            short = self.short_order(snap)
            if short is not None:  # the factors (read only to explain a pass) as `scores` gives them
                order, tier, score = short
                compute = partial(self.scores, snap)
                return Ranking.deferred(self.name, order, compute, self.tier_names, p.job_id, tier, score)
        tier, score, factors = self.scores(snap)
        order = np.lexsort((p.key, p.submit, -score, tier))
        return Ranking(self.name, order.astype(np.int64), score, tier, factors, self.tier_names, p.job_id)

    def decide(self, snap: Snapshot) -> Decision:
        """Walk the ranking: start what fits, plan a reservation and backfill around it (passes.py, the
        loop every policy shares, compiled in a built install)."""
        return decide_pass(self, snap, type(self).preemptions is not Policy.preemptions)

    def _try(
        self, free: I64, share: I64, rack: I64, n_racks: int, gpus: float, max_nodes: int, whole: int
    ) -> Allocation | None:
        if whole > 0 and (whole > (free.sum() if max_nodes > 1 else free.max(initial=0))):
            return None
        return place(self.placement, free, share, rack, n_racks, gpus, max_nodes)

    def _reserve(
        self,
        snap: Snapshot,
        pos: int,
        whole: int,
        free: I64,
        share: I64,
        taken: list[tuple[list[tuple[int, int]], int]],
    ) -> tuple[Reservation, float, I64, npt.NDArray[np.bool_]]:
        """The earliest time the head's gang fits given running jobs' expected ends; each node's slack
        (GPUs free by then beyond what the head needs: a job running past then may take that many of them,
        and no more of the free ones now); and which GPUs the plan counts on being free by then
        ([node, gpu]; every one when it has no time)."""
        p, view = snap.pending, snap.cluster
        g = max(int(whole), 1)  # a fractional head is planned as one whole GPU (conservative)
        m = int(p.max_nodes[pos])
        est_run = self.running_end(snap)
        # owner -2 (shared or absent) -> never, unless its sharers are known below; -1 (free at the
        # snapshot) -> -inf: now if still free, else the end of what this pass put on it.
        ext = np.append(est_run, [math.inf, -math.inf])
        rel = ext[view.owner]
        if view.frac_at:
            nd, gi, at = _sharers(view.frac_at, snap.running.key)
            if len(at):
                rel[nd, gi] = -math.inf
                np.maximum.at(rel, (nd, gi), est_run[at])  # a shared GPU frees when its last sharer ends
        if taken:
            est_p = self.pending_estimate(snap)
            for used, tpos in taken:
                e = snap.now + est_p[tpos] if math.isfinite(est_p[tpos]) else math.inf
                for nd_, gi_ in used:
                    if share[nd_, gi_] < FULL_SHARE and e > rel[nd_, gi_]:
                        rel[nd_, gi_] = e
        rel[share == FULL_SHARE] = snap.now
        rel[np.isneginf(rel) | (view.share < 0)] = math.inf
        rel_sorted = np.sort(rel, axis=1)
        key, jid = int(p.key[pos]), str(p.job_id[pos])

        def never() -> tuple[Reservation, float, I64, npt.NDArray[np.bool_]]:
            return (
                Reservation(key, jid, math.inf, ()),
                math.inf,
                np.zeros_like(free),
                np.ones(rel.shape, bool),
            )

        if m == 1:
            if g > rel_sorted.shape[1]:
                return never()
            t_node = rel_sorted[:, g - 1]
            node = int(np.argmin(t_node))
            t = float(t_node[node])
            if not math.isfinite(t):
                return never()
            need = np.zeros_like(free)
            need[node] = g
            counted = rel <= t
            at_t = counted.sum(axis=1)
            return Reservation(key, jid, t, (node,)), t, np.clip(at_t - need, 0, None), counted
        flat = rel_sorted[np.isfinite(rel_sorted)]
        times = _candidate_times(flat, rel_sorted, g, m)
        lo, hi = 0, len(times) - 1
        if hi < 0 or not placeable((rel <= times[hi]).sum(axis=1), share, g, m):
            return never()
        while lo < hi:
            mid = (lo + hi) // 2
            if placeable((rel <= times[mid]).sum(axis=1), share, g, m):
                hi = mid
            else:
                lo = mid + 1
        t = float(times[lo])
        counted = rel <= t
        at_t = counted.sum(axis=1)
        alloc = place(self.placement, at_t.copy(), share, view.rack, view.n_racks, float(g), m)
        need = np.zeros_like(free)
        if alloc is not None:
            for nd_, c in zip(alloc.nodes, alloc.counts, strict=True):
                need[nd_] = c
        return (
            Reservation(key, jid, t, alloc.nodes if alloc else ()),
            t,
            np.clip(at_t - need, 0, None),
            counted,
        )


def _sharers(frac_at: Mapping[int, tuple[int, int]], running_key: I64) -> tuple[I64, I64, I64]:
    """(node, gpu, running position) of each running fractional job in `frac_at` (running key ->
    (node, gpu)); keys not among the running jobs are left out."""
    fk = np.fromiter(frac_at.keys(), dtype=np.int64, count=len(frac_at))
    loc = np.array(list(frac_at.values()), dtype=np.int64).reshape(-1, 2)
    srt = np.argsort(running_key, kind="stable")
    i = np.minimum(np.searchsorted(running_key[srt], fk), max(len(srt) - 1, 0))
    ok = (running_key[srt[i]] == fk) if len(srt) else np.zeros(len(fk), bool)
    return loc[ok, 0], loc[ok, 1], srt[i[ok]]


def _candidate_times(flat: F64, rel_sorted: F64, g: int, m: int) -> F64:
    """The sorted release times among which a multi-node head's reservation lies.

    Not before the g-th GPU is released (fewer GPUs cannot hold it); not after m nodes each have
    ceil(g / m) GPUs free (that holds it). Searching only between the two gives the same earliest time
    as searching all release times, over far fewer of them.
    """
    c = -(-g // m)
    n_nodes, per_node = rel_sorted.shape
    if len(flat) < g or c > per_node or m > n_nodes:
        return np.unique(flat)
    low = np.partition(flat, g - 1)[g - 1]
    high = np.partition(rel_sorted[:, c - 1], m - 1)[m - 1]
    if not math.isfinite(float(high)):
        return np.unique(flat)
    return np.unique(flat[(flat >= low) & (flat <= high)])


@lru_cache(maxsize=64)
def _class_values(classes: tuple[str, ...], table: tuple[tuple[str, float], ...], default: float) -> F64:
    d = dict(table)
    out = np.array([d.get(c, default) for c in classes] or [default], dtype=np.float64)
    out.setflags(write=False)
    return out


def _per_class(classes: Sequence[str], table: dict[str, float], default: float) -> list[float] | float:
    """Each class's value as plain floats (one float when the trace has a single class): what the
    compiled short-queue loops index by class, the same values `_class_table` gives per job."""
    if len(classes) == 1:
        return float(table.get(classes[0], default))
    return _class_values(tuple(classes), tuple(table.items()), default).tolist()


def _class_table(classes: Sequence[str], klass: I64, table: dict[str, float], default: float) -> F64 | float:
    """Per job of these classes, the class's value (a scalar when the trace has a single class)."""
    if len(classes) == 1:
        return table.get(classes[0], default)
    vals = _class_values(tuple(classes), tuple(table.items()), default)
    return vals[klass]


def fairshare_of(snap: Snapshot, users: I64) -> F64:
    """`fairshare(snap)[users]`, computed only for the users asked about."""
    total = float(snap.usage.sum())
    if total <= 0:
        return np.ones(len(users))
    return np.asarray(np.exp2(-(snap.usage[users] / total) / np.maximum(snap.shares[users], 1e-12)))


@dataclass(frozen=True)
class Fifo(Policy):
    """First come, first served, strictly: the first job that does not fit waits and blocks the rest.

    This is textbook FIFO and the Helios simulator's FIFO (no backfill); `fifo-skip` skips instead.
    """

    name: ClassVar[str] = "fifo"
    uses_predictions: ClassVar[bool] = False
    mode: ClassVar[str] = "strict"
    single_fast: ClassVar[bool] = True

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        return np.zeros(len(p), np.int64), -p.submit, {"waited_h": (snap.now - p.submit) / HOUR}


@dataclass(frozen=True)
class FifoSkip(Fifo):
    """Submit order, but a job that does not fit is skipped, not waited for (backfill without reservation)."""

    name: ClassVar[str] = "fifo-skip"
    mode: ClassVar[str] = "greedy"


@dataclass(frozen=True)
class SjfOracle(Policy):
    """Shortest job first on the TRUE runtime: an upper bound no real scheduler can reach."""

    name: ClassVar[str] = "sjf-oracle"
    uses_predictions: ClassVar[bool] = False
    oracle: ClassVar[bool] = True
    mode: ClassVar[str] = "strict"  # as the Helios simulator's SJF
    single_fast: ClassVar[bool] = True

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        if p.oracle_runtime is None:
            raise ValueError("sjf-oracle needs the true runtimes in the snapshot")
        return np.zeros(len(p), np.int64), -p.oracle_runtime, {"true_runtime_h": p.oracle_runtime / HOUR}


def lognormal_mean(median: F64, p90: F64) -> F64:
    """Mean of the log-normal with this median and 90th percentile (p90 below the median counts as
    equal to it: no spread). exp(sigma^2 / 2) grows fast, so sigma is capped at 3 (a factor 90)."""
    sigma = np.minimum(np.log(np.fmax(p90, median) / median) / Z90, 3.0)
    out: F64 = median * np.exp(0.5 * sigma * sigma)
    return np.where(np.isnan(sigma), median, out)


def expected_runtime(p_success: F64, runtime: F64, ttf: F64, limit: F64) -> F64:
    r = np.where(np.isfinite(limit), np.fmin(runtime, limit), runtime)
    f = np.where(np.isfinite(limit), np.fmin(ttf, limit), ttf)
    return np.asarray(p_success * r + (1.0 - p_success) * f, dtype=np.float64)


@dataclass(frozen=True)
class Qssf(Policy):
    """Helios's quasi-shortest-service-first: smallest predicted runtime x GPUs first."""

    name: ClassVar[str] = "qssf"
    mode: ClassVar[str] = "strict"  # as the Helios simulator's QSSF
    single_fast: ClassVar[bool] = True

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        dur = expected_runtime(p.p_success, p.runtime, p.time_to_failure, p.time_limit)
        service = dur * p.gpus / HOUR
        return np.zeros(len(p), np.int64), -service, {"pred_gpu_h": service, "pred_runtime_h": dur / HOUR}


def _stop(view: ClusterView, free: I64, share: I64, v: int) -> bool:
    """Give running job `v`'s whole GPUs back on (free, share), in place; False when it holds none."""
    mask = view.owner == v
    if not mask.any():
        return False
    share[mask] = FULL_SHARE
    free += mask.sum(axis=1)
    return True


_CROSS_TOL = 1e-6  # GPU-seconds: LAS's tolerance at a queue threshold (Las._queue)


@dataclass(frozen=True)
class Las(Policy):
    """Tiresias's discretised 2D-LAS: queues by attained GPU-service, FIFO inside a queue, preemptive.

    A pending job may preempt running jobs of a strictly lower queue when it cannot be placed otherwise;
    a preempted job keeps its progress (checkpoint) and pays `restart_penalty_s` when it restarts.
    A job waiting longer than `promote_knob` x its executed time goes back to the top queue (Tiresias).
    """

    name: ClassVar[str] = "las"
    uses_predictions: ClassVar[bool] = False
    thresholds: tuple[float, ...] = (1 * HOUR, 10 * HOUR)  # GPU-seconds between queues
    promote_knob: float = 8.0
    restart_penalty_s: float = 30.0
    max_preemptors: int = 8  # pending jobs per pass that may try to preempt

    @property
    def tier_names(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"queue {i}" for i in range(len(self.thresholds) + 1))

    def _queue(self, attained: F64) -> I64:
        # Attained service a hair below a threshold counts as past it: a pass asked for at the crossing
        # recomputes start + elapsed time in floats and may land 1e-11 short, and the job would then keep
        # its queue until some unrelated event.
        thr = np.asarray(self.thresholds)
        return np.searchsorted(thr, attained + _CROSS_TOL, side="right").astype(np.int64)

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        q = self._queue(p.attained)
        executed = p.attained / np.maximum(p.gpus, 1e-9)
        promote = (executed > 0) & ((snap.now - p.last_stop) >= self.promote_knob * executed)
        q = np.where(promote, 0, q)
        return q, -p.last_stop, {"attained_gpu_h": p.attained / HOUR, "queue": q.astype(np.float64)}

    def _running_queue(self, snap: Snapshot) -> I64:
        r = snap.running
        return self._queue(r.attained + r.gpus * (snap.now - r.start))

    def preemptions(
        self, snap: Snapshot, ranking: Ranking, free: I64, share: I64, started: set[int]
    ) -> tuple[list[int], list[Start]]:
        r, p, view = snap.running, snap.pending, snap.cluster
        if len(r) == 0 or len(p) == 0:
            return [], []
        rq = self._running_queue(snap)
        victims_order = np.lexsort((-r.start, -rq))  # lowest queue first, then the latest started
        victims_q, victims_ok = rq[victims_order], r.preemptible[victims_order]
        gone: set[int] = set()
        out_keys: list[int] = []
        starts: list[Start] = []
        tried = 0
        below_q: dict[int, list[int]] = {}
        tier = ranking.tier
        own_q = self._queue(p.attained).tolist()  # promotion orders, never preempts
        for pos in ranking.order.tolist():
            if tried >= self.max_preemptors:
                break
            if int(p.key[pos]) in started:
                continue
            q = own_q[pos]
            below = below_q.get(q)
            if below is None:
                below = below_q[q] = victims_order[(victims_q > q) & victims_ok].tolist()  # victims order
            cands = [v for v in below if v not in gone]
            if not cands:
                if int(tier[pos]) < q:
                    continue  # promoted ahead of its own queue: a job behind it may rank lower
                break  # later jobs are in this queue or a lower one: nobody below them to preempt either
            tried += 1
            job = (float(p.gpus[pos]), int(p.max_nodes[pos]), gang_size(float(p.gpus[pos]))[0])
            f2, s2 = free.copy(), share.copy()
            chosen: list[int] = []
            alloc = None
            for v in cands:  # freed one by one, lowest queue first, until the job fits
                if not _stop(view, f2, s2, v):
                    continue
                chosen.append(v)
                alloc = self._try(f2, s2, view.rack, view.n_racks, *job)
                if alloc is not None:
                    break
            if alloc is None:
                continue
            # Victims taken before the one that made it fit may not be needed (another node's, a job too
            # small to matter): keep only those it cannot fit without, latest added tried first.
            for v in reversed(chosen[:-1]):
                fewer = [u for u in chosen if u != v]
                got, g2, t2 = self._fits_after(view, free, share, fewer, *job)
                if got is not None:
                    chosen, alloc, f2, s2 = fewer, got, g2, t2
            free[:], share[:] = f2, s2
            take(free, share, alloc)
            gone.update(chosen)
            keys = tuple(int(r.key[v]) for v in chosen)
            out_keys.extend(keys)
            starts.append(Start(int(p.key[pos]), str(p.job_id[pos]), alloc, preempts=keys))
        return out_keys, starts

    def _fits_after(
        self,
        view: ClusterView,
        free: I64,
        share: I64,
        victims: list[int],
        gpus: float,
        max_nodes: int,
        whole: int,
    ) -> tuple[Allocation | None, I64, I64]:
        """Where a job fits once `victims` (running positions) are stopped, and the free GPUs then."""
        f2, s2 = free.copy(), share.copy()
        for v in victims:
            _stop(view, f2, s2, v)
        return self._try(f2, s2, view.rack, view.n_racks, gpus, max_nodes, whole), f2, s2

    def wake_at(self, snap: Snapshot) -> float | None:
        r = snap.running
        if len(snap.pending) == 0 or len(r) == 0:
            return None
        return self._next_queue_change(snap.now, r.attained + r.gpus * (snap.now - r.start), r.gpus)

    def wake_after(self, snap: Snapshot, starts: Sequence[Start]) -> float | None:
        """When a job started in this pass crosses into a lower queue, where a waiting job may preempt it
        (Tiresias demotes a job the moment it crosses; without a pass then, it ran on until some
        unrelated event)."""
        p = snap.pending
        at = np.flatnonzero(np.isin(p.key, np.fromiter((s.key for s in starts), np.int64, len(starts))))
        if len(at) == 0:
            return None
        return self._next_queue_change(snap.now, p.attained[at], p.gpus[at])

    def _next_queue_change(self, now: float, attained: F64, gpus: F64) -> float | None:
        thr = np.asarray((*self.thresholds, math.inf))
        nxt = thr[self._queue(attained)]
        t = now + (nxt - attained) / np.maximum(gpus, 1e-9)
        t = t[(t > now) & np.isfinite(t)]  # one that rounds to now must not hide the others
        return float(t.min()) if len(t) else None


@dataclass(frozen=True)
class Multifactor(Policy):
    """Slurm's priority/multifactor with EASY backfill on time limits.

    priority = W_age * min(age / max_age, 1) + W_fs * fairshare + W_size * gpus / capacity
    Weights are those of the configuration example in Slurm's multifactor documentation (age 1000,
    fair share 10000, job size 1000; PriorityFavorSmall=NO) with PriorityMaxAge 7 days and a 7-day
    usage half-life (slurm.conf defaults). Backfill uses the job's time limit, or `partition_max_s`
    where it has none (default 7 days: Slurm's MaxTime is unlimited, a backfill needs a bound).
    """

    name: ClassVar[str] = "multifactor"
    uses_predictions: ClassVar[bool] = False
    mode: ClassVar[str] = "easy"
    single_fast: ClassVar[bool] = True
    w_age: float = 1000.0
    w_fairshare: float = 10000.0
    w_size: float = 1000.0
    max_age_s: float = 7 * DAY
    partition_max_s: float = 7 * DAY

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        age = np.minimum((snap.now - p.submit) / self.max_age_s, 1.0)
        fs = fairshare_of(snap, p.user)
        size = p.gpus / max(snap.cluster.capacity, 1.0)
        prio = self.w_age * age + self.w_fairshare * fs + self.w_size * size
        return np.zeros(len(p), np.int64), prio, {"age": age, "fairshare": fs, "size": size}

    def _limit(self, limit: F64) -> F64:
        return np.where(np.isfinite(limit), limit, self.partition_max_s)

    def pending_estimate(self, snap: Snapshot) -> F64:
        return self._limit(snap.pending.time_limit)

    def running_end(self, snap: Snapshot) -> F64:
        r = snap.running
        lim = self._limit(r.time_limit)
        return slip_end(r.start, lim, lim, np.full(len(r), np.inf), snap.now)


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
    single_fast: ClassVar[bool] = True
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

    def short_order(self, snap: Snapshot) -> tuple[I64, I64, F64] | None:
        if not (_COMPILED and self.fairshare_power == 1.0 and type(self).inputs is Impact.inputs):
            return None  # impact-oracle reads the truth: through the vector form
        return self.order_on_floats(snap)

    def order_on_floats(self, snap: Snapshot) -> tuple[I64, I64, F64]:
        """`passes.impact_order` with this policy's class tables: `short_order` in the compiled build
        (tests call it in both)."""
        weight = _per_class(snap.classes, self.class_weight, 1.0)
        max_wait = _per_class(snap.classes, self.max_wait_s, self.max_wait_s.get("normal", DAY))
        return impact_order(snap, weight, max_wait, self.hold_after, self.runtime_estimate == "mean")

    def inputs(self, snap: Snapshot) -> tuple[F64, F64, F64]:
        """(p, R, F) per pending job: the predictions (R as `runtime_estimate` says)."""
        p = snap.pending
        r = p.runtime
        if self.runtime_estimate == "mean":
            r = lognormal_mean(r, p.runtime_p90)
        return p.p_success, r, p.time_to_failure

    def _max_wait(self, classes: Sequence[str], klass: I64) -> F64 | float:
        return _class_table(classes, klass, self.max_wait_s, self.max_wait_s.get("normal", DAY))

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        ps, rt, ttf = self.inputs(snap)
        w = _class_table(snap.classes, p.klass, self.class_weight, 1.0)
        r = np.fmin(rt, p.time_limit)  # fmin ignores a NaN (no limit)
        f = np.fmin(ttf, p.time_limit)
        c = np.maximum(p.gpus, 1e-3) * (ps * r + (1 - ps) * f) / HOUR
        fs = fairshare_of(snap, p.user)
        if self.fairshare_power != 1.0:
            fs = fs**self.fairshare_power
        score = w * ps / np.maximum(c, 1e-6) * fs
        deadline = p.submit + self._max_wait(snap.classes, p.klass)
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
        p = snap.pending
        return self.wake_queue(snap.now, p.submit, p.klass, snap.classes)

    def wake_queue(self, now: float, submit: F64, klass: I64, classes: Sequence[str]) -> float | None:
        if len(submit) == 0:
            return None
        if len(submit) <= SMALL_QUEUE:
            return self._first_deadline(now, submit.tolist(), klass.tolist(), classes)
        deadline = submit + self._max_wait(classes, klass)
        future = deadline[deadline > now]
        return float(future.min()) if len(future) else None

    def wake_one(self, now: float, submit: float, klass: int, classes: Sequence[str]) -> float | None:
        # `_first_deadline` of one job: its class's bound as there (a float64 from the table when the
        # trace has several classes), without building the table.
        default = self.max_wait_s.get("normal", DAY)
        if len(classes) == 1:
            d = submit + self.max_wait_s.get(classes[0], default)
        else:
            d = submit + float(self.max_wait_s.get(classes[klass], default))
        return float(d) if d > now else None

    def _first_deadline(
        self, now: float, submits: list[float], klasses: list[int], classes: Sequence[str]
    ) -> float | None:
        """The earliest starvation deadline after `now`, on plain floats: the same float additions and
        comparisons as the vector form (exact), for a short queue (most passes) in a few list reads."""
        max_wait = _per_class(classes, self.max_wait_s, self.max_wait_s.get("normal", DAY))
        return first_deadline(now, submits, klasses, max_wait)


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
