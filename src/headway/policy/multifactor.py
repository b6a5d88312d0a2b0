"""Slurm's priority/multifactor with EASY backfill on time limits (`multifactor`): the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import DAY, fairshare_of, slip_end
from headway.policy.snapshot import F64, I64, Snapshot


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
