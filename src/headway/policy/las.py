"""Tiresias's discretised 2D-LAS (`las`): queues by attained GPU-service, preemptive."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import HOUR
from headway.policy.preempt import DEFAULT_RESTART_S, Planned, gang_of, make_room
from headway.policy.snapshot import F64, I64, Ranking, Snapshot, Start

_CROSS_TOL = 1e-6  # GPU-seconds: LAS's tolerance at a queue threshold (Las._queue)


@dataclass(frozen=True)
class Las(Policy):
    """Tiresias's discretised 2D-LAS: queues by attained GPU-service, FIFO inside a queue, preemptive.

    A pending job may preempt running jobs of a strictly lower queue when it cannot be placed otherwise;
    a preempted job checkpoints as it stops (Tiresias' assumption; a job's own `checkpoint_every` says
    otherwise) and pays `restart_penalty_s` when it restarts.
    Every job may be preempted, as in Tiresias (the `preemptible` flag is for class-based preemption).
    A job waiting longer than `promote_knob` x its executed time goes back to the top queue (Tiresias).
    """

    name: ClassVar[str] = "las"
    uses_predictions: ClassVar[bool] = False
    preemptive: ClassVar[bool] = True
    wakes: ClassVar[bool] = True  # when a running job crosses into a lower queue
    thresholds: tuple[float, ...] = (1 * HOUR, 10 * HOUR)  # GPU-seconds between queues
    promote_knob: float = 8.0
    restart_penalty_s: float = DEFAULT_RESTART_S
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
        victims_q = rq[victims_order]
        planned = Planned(snap)
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
                below = below_q[q] = victims_order[victims_q > q].tolist()  # victims order
            cands = planned.free_of(below)
            if not cands:
                if int(tier[pos]) < q:
                    continue  # promoted ahead of its own queue: a job behind it may rank lower
                break  # later jobs are in this queue or a lower one: nobody below them to preempt either
            tried += 1
            plan = make_room(self.placement, snap.cluster, free, share, cands, gang_of(p, pos))
            if plan is not None:
                planned.take(pos, plan)
        return planned.result()

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
