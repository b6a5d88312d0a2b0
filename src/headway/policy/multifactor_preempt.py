"""Slurm's multifactor priority with preempt/qos (`multifactor-preempt`): the preempting peer.

What a Slurm site gets with `PreemptType=preempt/qos`, `PreemptMode=REQUEUE` and a QOS per class: the
class (QOS) weighs in the priority (PriorityWeightQOS), and a waiting job of a higher class that does
not fit stops the newest preemptible jobs of lower classes until it fits, with no regard for where
their GPUs are or for whether they were about to finish. Slurm's PreemptExemptTime is unset by default:
no minimum runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from headway.policy.impact import CLASS_WEIGHT
from headway.policy.multifactor import Multifactor
from headway.policy.preempt import (
    DEFAULT_CHECKPOINT_S,
    DEFAULT_RESTART_S,
    Planned,
    class_rank,
    classes_waiting,
    gang_of,
    make_room,
)
from headway.policy.snapshot import F64, I64, Ranking, Snapshot, Start


@dataclass(frozen=True)
class MultifactorPreempt(Multifactor):
    """Multifactor + a QOS factor (class weight / the highest, x `w_qos`), preempting as preempt/qos."""

    name: ClassVar[str] = "multifactor-preempt"
    preemptive: ClassVar[bool] = True
    w_qos: float = 10000.0  # as the fair-share weight: a class outranks age and size
    class_weight: dict[str, float] = field(default_factory=lambda: dict(CLASS_WEIGHT))
    preempt_classes: tuple[str, ...] = ("high", "urgent")
    restart_penalty_s: float = DEFAULT_RESTART_S
    checkpoint_default_s: float = DEFAULT_CHECKPOINT_S
    max_preemptors: int = 8  # pending jobs per pass that may try to preempt

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        tier, prio, factors = super().scores(snap)
        w = class_rank(snap.classes, self.class_weight)
        qos = w[snap.pending.klass] / max(float(w.max()), 1e-9)
        factors["qos"] = qos
        return tier, prio + self.w_qos * qos, factors

    def may_preempt(self, snap: Snapshot) -> bool:
        return classes_waiting(snap, self.preempt_classes) and bool(snap.running.preemptible.any())

    def preemptions(
        self, snap: Snapshot, ranking: Ranking, free: I64, share: I64, started: set[int]
    ) -> tuple[list[int], list[Start]]:
        """In rank order, each waiting job of a preempting class stops the newest preemptible running
        jobs of strictly lower classes until it fits."""
        r, p = snap.running, snap.pending
        if len(r) == 0 or not r.preemptible.any():
            return [], []
        w = class_rank(snap.classes, self.class_weight)
        rw = w[r.klass]
        newest = np.lexsort((-r.key, -r.start))
        allowed = {i for i, c in enumerate(snap.classes) if c in self.preempt_classes}
        planned = Planned(snap)
        tried = 0
        for pos in ranking.order.tolist():
            if tried >= self.max_preemptors:
                break
            if int(p.klass[pos]) not in allowed or int(p.key[pos]) in started:
                continue
            ok = r.preemptible[newest] & (rw[newest] < w[int(p.klass[pos])])
            cands = planned.free_of(newest[ok].tolist())
            if not cands:
                continue
            tried += 1
            plan = make_room(self.placement, snap.cluster, free, share, cands, gang_of(p, pos))
            if plan is not None:
                planned.take(pos, plan)
        return planned.result()
