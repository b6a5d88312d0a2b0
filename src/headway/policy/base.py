"""The Policy base class: a ranking in, a Decision out, by one pass every policy shares.

A policy ranks the pending jobs (`scores`, then `rank`); `decide` walks that order: it starts what fits
on a scratch copy of the free GPUs and, in easy mode, plans a reservation for the first job that does not
fit and backfills around it; a preemptive policy then chooses what to stop (docs/policies.md). The steps
are `_Pass.fill`, `_Pass.reserve`, `_Pass.backfill` and `_Pass.preempt`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from headway.policy.factors import slip_end
from headway.policy.placement import PLACEMENTS, FreeIndex, gang_size, scratch_index
from headway.policy.reserve import Taken, plan_reservation, release_times
from headway.policy.snapshot import (
    F64,
    FULL_SHARE,
    I64,
    Allocation,
    Decision,
    Ranking,
    Reservation,
    Snapshot,
    Start,
)

_UNLIMITED = 1 << 62
_NO_INTS: I64 = np.empty(0, dtype=np.int64)
_NO_INTS.setflags(write=False)
_ORDER_ONE: I64 = np.zeros(1, dtype=np.int64)
_ORDER_ONE.setflags(write=False)
# Longer orders drop, in one vector step, the jobs that cannot fit the free GPUs before the pass walks
# them (the walk's own test would skip each of them; on a short queue the vector step costs more).
FILTER_AFTER = 32


@dataclass(frozen=True)
class Policy:
    """Base: a name, a placement, the hooks a policy defines, and the shared decide pass."""

    name: ClassVar[str] = "base"
    oracle: ClassVar[bool] = False
    # Whether any decision reads the predictions (p, R, R90, F) of pending or running jobs. A policy
    # that never does (strict / greedy modes, or backfill on time limits only) replays without the
    # predictor: it decides exactly the same, several times faster (tests/test_sim_predictions.py).
    uses_predictions: ClassVar[bool] = True
    # Whether `preemptions` may stop running jobs (then every pass may change something, even with no
    # free GPU), and whether `wake_at` may ask for a pass at a time of its own (else it returns None).
    preemptive: ClassVar[bool] = False
    wakes: ClassVar[bool] = False
    # strict: stop at the first job that does not fit (the Helios simulator's baselines); greedy: skip
    # what does not fit; easy: the first job that does not fit gets a reservation, others backfill.
    mode: ClassVar[str] = "greedy"
    tier_names: ClassVar[tuple[str, ...]] = ("queued",)
    placement: str = "first-fit"
    backfill_depth: int = 500  # jobs tested behind the reservation (Slurm's bf_max_job_test default)
    restart_penalty_s: float = 0.0  # added to a preempted job's remaining runtime at each restart
    # How often a preempted job that gives no `checkpoint_every` saved its progress (a replay's
    # assumption; 0: it checkpoints as it stops, losing nothing but the restart penalty).
    checkpoint_default_s: float = 0.0

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
        """When to pass again even if nothing else happens (None: no need); only if `wakes`."""
        return None

    def may_preempt(self, snap: Snapshot) -> bool:
        """Whether a pass could preempt now (a preemptive policy; the simulator skips a pass that could
        neither start nor stop anything)."""
        return self.preemptive

    def probe_seconds(self, ranking: Ranking) -> dict[int, float]:
        """Pending positions to start as fail-fast probes, with their probe slot (seconds)."""
        return {}

    def wake_after(self, snap: Snapshot, starts: Sequence[Start]) -> float | None:
        """A preemptive policy's next pass for what this pass started (not yet in `snap.running`)."""
        return None

    def preemptions(
        self, snap: Snapshot, ranking: Ranking, free: I64, share: I64, started: set[int]
    ) -> tuple[list[int], list[Start]]:
        """Only if `preemptive`: (running keys to stop, the starts they make room for), planned on the
        scratch (free, share) after this pass's starts, which it updates."""
        return [], []

    # --- the shared core --------------------------------------------------------------------------
    def rank(self, snap: Snapshot) -> Ranking:
        """Pending positions by (tier, -score, submit, key)."""
        p = snap.pending
        if len(p) <= 1:
            # One job (or none) has one order: scores are computed only if someone reads them (a head
            # that does not fit, an explanation), as most simulator passes see a queue of one job.
            order = _ORDER_ONE if len(p) else _NO_INTS
            return Ranking.deferred(self.name, order, partial(self.scores, snap), self.tier_names, p.job_id)
        tier, score, factors = self.scores(snap)
        order = np.lexsort((p.key, p.submit, -score, tier))
        return Ranking(self.name, order.astype(np.int64), score, tier, factors, self.tier_names, p.job_id)

    def decide(self, snap: Snapshot) -> Decision:
        """Start what fits in rank order; in easy mode plan the first reservation and backfill around it;
        a preemptive policy then preempts. The snapshot is not changed."""
        ranking = self.rank(snap)
        did = f"{self.name}-{snap.seq}"
        if len(snap.pending) == 0:
            return Decision(did, snap.now, ranking=ranking, wake_at=self.wake_at(snap))
        ps = _Pass(self, snap, ranking)
        head = ps.fill()
        reservation = None
        if head is not None:
            reservation = ps.reserve(head)
            ps.backfill(reservation.start)
        preempt: list[int] = []
        if self.preemptive and self.may_preempt(snap):
            preempt = ps.preempt()
            if reservation is not None and any(s.key == reservation.key for s in ps.starts):
                reservation = None  # the head starts now, on GPUs its preemptions freed
        wake = self._next_wake(snap, ps.starts)
        return Decision(did, snap.now, tuple(ps.starts), tuple(preempt), reservation, wake, ranking)

    def _next_wake(self, snap: Snapshot, starts: Sequence[Start]) -> float | None:
        wake = self.wake_at(snap)
        if self.preemptive and starts:
            later = self.wake_after(snap, starts)
            if later is not None and (wake is None or later < wake):
                wake = later
        return wake


def gang_size_columns(gpus: F64) -> tuple[I64, I64]:
    """`gang_size` of every request as (whole GPUs, milli-GPU shares) columns, computed once per
    distinct request (a long queue asks for a handful of sizes)."""
    values, inverse = np.unique(gpus, return_inverse=True)
    sizes = np.array([gang_size(g) for g in values.tolist()], dtype=np.int64).reshape(-1, 2)
    return sizes[inverse.reshape(-1), 0], sizes[inverse.reshape(-1), 1]


class _Pass:
    """One `decide` pass: the scratch GPUs, the jobs' sizes as plain lists, what started so far.

    Per-job numpy scalar reads would dominate a pass that starts thousands of jobs, and numpy calls on
    tiny arrays one over a queue of one: the walk reads lists. `fmax`, `ftot` and `smax` (the largest
    free node, the free total or -1 where no job spans nodes, the largest free share) bound what can
    still be placed; free GPUs only shrink during a pass, so bounds from before a start stay valid.
    """

    __slots__ = (
        "_arrays",
        "_rmask",
        "_rmask_known",
        "any_multi",
        "counted",
        "fmax",
        "ftot",
        "gpus_l",
        "has_frac",
        "index",
        "milli_l",
        "mn_l",
        "pol",
        "probes",
        "ranking",
        "rest",
        "slack",
        "smax",
        "snap",
        "spare",
        "spare_index",
        "spmax",
        "sptot",
        "starts",
        "strict",
        "taken",
        "unflushed",
        "whole_l",
    )

    def __init__(self, pol: Policy, snap: Snapshot, ranking: Ranking) -> None:
        p = snap.pending
        self.pol, self.snap, self.ranking = pol, snap, ranking
        # The index copies the cluster's arrays on its first `take`, so a pass that starts only its last
        # job (most simulator passes) copies nothing.
        self.index: FreeIndex = scratch_index(snap.cluster)
        self.gpus_l: list[float] = p.gpus.tolist()
        self.mn_l: list[int] = p.max_nodes.tolist()
        self._arrays: tuple[I64, I64] | None = None
        if len(p) > FILTER_AFTER:
            self._arrays = whole, milli = gang_size_columns(p.gpus)
            self.whole_l, self.milli_l = whole.tolist(), milli.tolist()
        else:
            sizes = [gang_size(g) for g in self.gpus_l]
            self.whole_l, self.milli_l = [w for w, _ in sizes], [m for _, m in sizes]
        self.has_frac = any(self.milli_l)
        self.any_multi = max(self.mn_l) > 1
        self.starts: list[Start] = []
        self.probes = pol.probe_seconds(ranking)
        self.taken: Taken = []  # (GPUs used, pending position) of each start taken from the scratch
        # The last start, not yet taken from the scratch GPUs: only a later placement, the reservation
        # or the preemptions read them, and a pass that ends without (most do) skips copying them.
        self.unflushed: tuple[Allocation, int] | None = None
        self._rmask: npt.NDArray[np.bool_] | None = None
        self._rmask_known = False
        self.rest: list[int] = []  # the order after the reservation's head (backfill candidates)
        self.fmax, self.ftot, self.smax = self.limits()

    def share(self) -> I64:
        """The scratch [node, gpu] free shares (the cluster's until the first `take` copies them)."""
        share = self.index.share
        assert share is not None  # a pass's index always has them
        return share

    def limits(self) -> tuple[int, int, int]:
        """(largest free node, free total or -1, largest free share) of the scratch GPUs now."""
        index = self.index
        fm = index.max_free()
        # A whole free GPU is a full share; only without one is the largest partial share needed.
        sm = FULL_SHARE if fm > 0 else (int(self.share().max(initial=0)) if self.has_frac else 0)
        return fm, index.total if self.any_multi else -1, sm

    def rmask(self) -> npt.NDArray[np.bool_] | None:
        """`Policy.reserve_mask`, asked once and only when needed (None outside easy mode)."""
        if not self._rmask_known:
            self._rmask = self.pol.reserve_mask(self.ranking) if self.pol.mode == "easy" else None
            self._rmask_known = True
        return self._rmask

    def sizes(self) -> tuple[I64, I64]:
        """(whole, milli) as arrays, for the vector steps."""
        if self._arrays is None:
            self._arrays = np.array(self.whole_l, np.int64), np.array(self.milli_l, np.int64)
        return self._arrays

    def within(self, pos: int) -> bool:
        """Whether job `pos` is within the bounds (it may fit; False: it cannot)."""
        w = self.whole_l[pos]
        if w > 0:
            return w <= (self.ftot if self.mn_l[pos] > 1 else self.fmax)
        return self.milli_l[pos] <= self.smax

    def flush(self) -> None:
        """Take the last start's GPUs from the scratch, and tighten the bounds."""
        if self.unflushed is not None:
            alloc, pos = self.unflushed
            self.unflushed = None
            self.taken.append((self.index.take(alloc), pos))
            self.fmax, self.ftot, self.smax = self.limits()

    def place(self, pos: int) -> Allocation | None:
        """Where job `pos` goes on the scratch GPUs now (None: it does not fit)."""
        if not self.within(pos):
            return None
        if self.unflushed is not None:
            self.flush()
            if not self.within(pos):
                return None
        how, w, mi = self.pol.placement, self.whole_l[pos], self.milli_l[pos]
        return self.index.place_sized(how, self.gpus_l[pos], w, mi, self.mn_l[pos])

    def candidates(self) -> I64:
        """The ranking's order; a long one without the jobs that cannot fit now and that the walk would
        skip (greedy mode, or outside the reserve mask)."""
        order = self.ranking.order
        mode = self.pol.mode
        if len(order) <= FILTER_AFTER or not (mode == "greedy" or self.rmask() is not None):
            return order
        whole, milli = self.sizes()
        multi = self.snap.pending.max_nodes > 1
        fits = np.where(whole > 0, whole <= np.where(multi, self.ftot, self.fmax), milli <= self.smax)
        rmask = self.rmask()
        if rmask is not None:
            fits |= rmask
        return order[fits[order]]

    def fill(self) -> int | None:
        """Phase 1: in rank order, start what fits until the first job that does not (all, greedy). That
        job's position when it gets a reservation (easy mode; `rest` is then the order after it)."""
        mode = self.pol.mode
        keys, jids = self.snap.pending.key, self.snap.pending.job_id
        order = self.candidates().tolist()
        pruned = False
        i = 0
        while i < len(order):
            pos = order[i]
            i += 1
            alloc = self.place(pos)
            if alloc is not None:
                probe = self.probes.get(pos, 0.0) if self.probes else 0.0
                self.starts.append(Start(int(keys[pos]), str(jids[pos]), alloc, probe_s=probe))
                self.unflushed = (alloc, pos)
                continue
            if mode == "strict":
                return None
            if mode == "easy" and self.reservable(pos):
                self.rest = order[i:]
                return pos
            if not pruned and self.fmax == 0 and self.smax <= 0 and self.unflushed is None:
                # Nothing free: the walk only has to find the jobs of no GPUs and the next reservable one
                order[i:] = self._left_when_full(order[i:])
                pruned = True
        return None

    def reservable(self, pos: int) -> bool:
        """Easy mode: whether job `pos` gets the reservation if it is the first not to fit."""
        rmask = self.rmask()
        return rmask is None or bool(rmask[pos])

    def _left_when_full(self, order: list[int]) -> list[int]:
        """The jobs of `order` a walk over no free GPU can still act on: those of no GPUs (they start)
        and those that would get the reservation (in easy mode with no mask the walk has stopped at the
        first job that did not fit, so this is not asked)."""
        whole_l, milli_l = self.whole_l, self.milli_l
        rmask = self.rmask()
        keep = rmask.tolist() if rmask is not None else [False] * len(whole_l)
        return [q for q in order if keep[q] or not (whole_l[q] or milli_l[q])]

    def reserve(self, head: int) -> Reservation:
        """The head's reservation, and what may backfill around it: each node's slack (GPUs a job running
        past the reservation's start may hold) and `spare`, the free GPUs such a job may take now."""
        pol, snap, index = self.pol, self.snap, self.index
        self.flush()
        est_pending = partial(pol.pending_estimate, snap)
        share = self.share()
        rel = release_times(snap, pol.running_end(snap), share, self.taken, est_pending)
        w = self.whole_l[head]
        reservation, _, slack, self.counted = plan_reservation(snap, head, w, share, rel, pol.placement)
        self.strict = pol.strict_head(self.ranking, head)
        view = snap.cluster
        if self.strict:
            # A starved head: beyond GPUs it can never use, only a job whose *time limit* (a hard
            # bound, never a prediction) ends before its planned start may backfill, so its wait
            # stays bounded by max_wait + the time for GPUs to free + the longest such limit.
            slack = np.where(view.node_gpus >= max(w, 1), 0, _UNLIMITED)
            if self.mn_l[head] > 1:
                slack = np.zeros_like(view.free)
        elif not math.isfinite(reservation.start):
            slack = np.zeros_like(view.free)
        self.slack = slack
        self.spare = np.minimum(index.free, slack)
        self.spare_index = FreeIndex(self.spare, view.rack, view.n_racks, index.share)  # what may backfill
        return reservation

    def backfill(self, shadow: float) -> None:
        """Phase 2 (EASY): a job behind the head that ends before `shadow` (the reservation's start) may
        use any free GPU; one that would run past it only GPUs the reservation will not need."""
        pol, snap = self.pol, self.snap
        if not self.rest:
            return
        if self.strict:
            est = np.where(np.isfinite(snap.pending.time_limit), snap.pending.time_limit, math.inf)
            if not math.isfinite(shadow):
                shadow = -math.inf  # no known start: nothing ends before it
        else:
            est = pol.pending_estimate(snap)
        ends_before = snap.now + est <= shadow
        for tested, pos in enumerate(self._backfill_candidates(ends_before).tolist()):
            if tested >= pol.backfill_depth or (self.fmax == 0 and self.smax <= 0):  # no free GPU at all
                break
            self._backfill_one(pos, bool(ends_before[pos]))

    def _backfill_candidates(self, ends_before: npt.NDArray[np.bool_]) -> I64:
        """The jobs after the head that fit within the bounds (free GPUs only shrink in a pass)."""
        cand = np.array(self.rest, dtype=np.int64)
        whole, milli = self.sizes()
        whole, milli = whole[cand], milli[cand]
        self.spmax, self.sptot = spmax, sptot = int(self.spare.max(initial=0)), int(self.spare.sum())
        multi = self.snap.pending.max_nodes[cand] > 1
        before = ends_before[cand]
        room = np.where(before, np.where(multi, self.ftot, self.fmax), np.where(multi, sptot, spmax))
        return cand[np.where(whole > 0, whole <= room, milli <= self.smax)]

    def _backfill_one(self, pos: int, ends_before: bool) -> None:
        """Start job `pos` behind the reservation if it fits where it may go."""
        w, m, spare = self.whole_l[pos], self.mn_l[pos], self.spare
        if w > 0:
            cap_max, cap_tot = (self.fmax, self.ftot) if ends_before else (self.spmax, self.sptot)
            if w > (cap_tot if m > 1 else cap_max):
                return
        elif self.milli_l[pos] > self.smax:
            return
        alloc = self._backfill_place(pos, ends_before)
        if alloc is None:
            return
        cost = self._backfill_cost(alloc, ends_before)
        if cost is None:
            return
        used = self.index.take(alloc)
        slack, free = self.slack, self.index.free
        for nd, c in zip(alloc.nodes, cost, strict=True):
            if not ends_before:
                slack[nd] -= c
            # Never below 0: a share of a counted GPU that was not whole and free (its sharers end by
            # the reservation's start) costs a GPU of slack, none of the free ones (topology's placement
            # fails on a negative count).
            spare[nd] = max(0, min(int(spare[nd]) - (0 if ends_before else c), int(slack[nd]), int(free[nd])))
            self.spare_index.set_free(nd, int(spare[nd]))
        self.taken.append((used, pos))
        p = self.snap.pending
        probe = self.probes.get(pos, 0.0) if self.probes else 0.0
        self.starts.append(Start(int(p.key[pos]), str(p.job_id[pos]), alloc, backfill=True, probe_s=probe))
        self.fmax, self.ftot, self.smax = self.limits()
        self.spmax, self.sptot = int(spare.max(initial=0)), int(spare.sum())

    def _backfill_place(self, pos: int, ends_before: bool) -> Allocation | None:
        how, w, m = self.pol.placement, self.whole_l[pos], self.mn_l[pos]
        if ends_before:
            return self.index.place_sized(how, self.gpus_l[pos], w, self.milli_l[pos], m)
        if w > 0:
            return self.spare_index.place_sized(how, self.gpus_l[pos], w, 0, m)
        # A share that runs past the reservation may not land on a GPU the plan counts on (free by its
        # start) on a node without slack: shown as full to the placement.
        sh = self.share()
        blocked = self.counted & (self.slack <= 0)[:, None]
        if blocked.any():
            sh = np.where(blocked, 0, sh)
        self.spare_index.reshare(sh)
        return self.spare_index.place_sized(how, self.gpus_l[pos], w, self.milli_l[pos], m)

    def _backfill_cost(self, alloc: Allocation, ends_before: bool) -> tuple[int, ...] | None:
        """GPUs of each node's slack the start uses (None: more than a long job may take)."""
        if alloc.frac_gpu < 0:
            spare, counts = self.spare, alloc.counts
            if not ends_before and any(c > spare[nd] for nd, c in zip(alloc.nodes, counts, strict=True)):
                return None
            return counts
        # A share of a GPU the plan counts on by the reservation's start (a free one, or a shared one
        # whose sharers end by then) keeps that GPU busy past it: it costs one GPU of its node's
        # slack, once.
        at = (alloc.nodes[0], alloc.frac_gpu)
        if self.counted[at] and not ends_before:
            self.counted[at] = False
            return (1,)
        return (0,)

    def preempt(self) -> list[int]:
        """The preemptive policy's part: what to stop for which waiting jobs, on the GPUs left."""
        self.flush()
        started = {s.key for s in self.starts}
        free, share = self.index.writable()
        preempt, more = self.pol.preemptions(self.snap, self.ranking, free, share, started)
        self.starts.extend(more)
        return preempt
