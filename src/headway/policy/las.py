"""Tiresias's discretised 2D-LAS (`las`): queues by attained GPU-service, preemptive."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import HOUR
from headway.policy.placement import gang_size, place, take
from headway.policy.snapshot import F64, FULL_SHARE, I64, Allocation, ClusterView, Ranking, Snapshot, Start

_CROSS_TOL = 1e-6  # GPU-seconds: LAS's tolerance at a queue threshold (Las._queue)
Job = tuple[float, int, int]  # (gpus, max_nodes, whole GPUs) of a pending job


@dataclass(frozen=True)
class Las(Policy):
    """Tiresias's discretised 2D-LAS: queues by attained GPU-service, FIFO inside a queue, preemptive.

    A pending job may preempt running jobs of a strictly lower queue when it cannot be placed otherwise;
    a preempted job keeps its progress (checkpoint) and pays `restart_penalty_s` when it restarts.
    A job waiting longer than `promote_knob` x its executed time goes back to the top queue (Tiresias).
    """

    name: ClassVar[str] = "las"
    uses_predictions: ClassVar[bool] = False
    preemptive: ClassVar[bool] = True
    wakes: ClassVar[bool] = True  # when a running job crosses into a lower queue
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
        """In rank order, up to `max_preemptors` waiting jobs each stop the fewest running jobs of lower
        queues (lowest queue first, then the latest started) that make room for it."""
        r, p = snap.running, snap.pending
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
            plan = self._make_room(snap.cluster, free, share, cands, job)
            if plan is None:
                continue
            chosen, alloc = plan
            gone.update(chosen)
            keys = tuple(int(r.key[v]) for v in chosen)
            out_keys.extend(keys)
            starts.append(Start(int(p.key[pos]), str(p.job_id[pos]), alloc, preempts=keys))
        return out_keys, starts

    def _make_room(
        self, view: ClusterView, free: I64, share: I64, cands: list[int], job: Job
    ) -> tuple[list[int], Allocation] | None:
        """Stop candidates (running positions, in order) until `job` fits, keep only those it needs, and
        place it: (victims, allocation), with (free, share) updated in place; None: it never fits."""
        f2, s2 = free.copy(), share.copy()
        chosen: list[int] = []
        alloc = None
        for v in cands:  # freed one by one, lowest queue first, until the job fits
            if not _stop(view, f2, s2, v):
                continue
            chosen.append(v)
            alloc = self._try(f2, s2, view, *job)
            if alloc is not None:
                break
        if alloc is None:
            return None
        # Victims taken before the one that made it fit may not be needed (another node's, a job too
        # small to matter): keep only those it cannot fit without, latest added tried first.
        for v in reversed(chosen[:-1]):
            fewer = [u for u in chosen if u != v]
            got, g2, t2 = self._fits_after(view, free, share, fewer, job)
            if got is not None:
                chosen, alloc, f2, s2 = fewer, got, g2, t2
        free[:], share[:] = f2, s2
        take(free, share, alloc)
        return chosen, alloc

    def _try(
        self, free: I64, share: I64, view: ClusterView, gpus: float, max_nodes: int, whole: int
    ) -> Allocation | None:
        if whole > 0 and (whole > (free.sum() if max_nodes > 1 else free.max(initial=0))):
            return None
        return place(self.placement, free, share, view.rack, view.n_racks, gpus, max_nodes)

    def _fits_after(
        self, view: ClusterView, free: I64, share: I64, victims: list[int], job: Job
    ) -> tuple[Allocation | None, I64, I64]:
        """Where a job fits once `victims` (running positions) are stopped, and the free GPUs then."""
        f2, s2 = free.copy(), share.copy()
        for v in victims:
            _stop(view, f2, s2, v)
        return self._try(f2, s2, view, *job), f2, s2

    def wake_at(self, snap: Snapshot) -> float | None:
        """When a running job crosses into a lower queue, where a waiting job may preempt it."""
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


def _stop(view: ClusterView, free: I64, share: I64, v: int) -> bool:
    """Give running job `v`'s whole GPUs back on (free, share), in place; False when it holds none."""
    mask = view.owner == v
    if not mask.any():
        return False
    share[mask] = FULL_SHARE
    free += mask.sum(axis=1)
    return True
