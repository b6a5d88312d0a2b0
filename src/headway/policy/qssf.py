"""Helios's quasi-shortest-service-first (`qssf`): the smallest predicted GPU-time first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import HOUR, expected_runtime
from headway.policy.snapshot import F64, I64, Snapshot


@dataclass(frozen=True)
class Qssf(Policy):
    """Helios's quasi-shortest-service-first: smallest predicted runtime x GPUs first."""

    name: ClassVar[str] = "qssf"
    mode: ClassVar[str] = "strict"  # as the Helios simulator's QSSF

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        dur = expected_runtime(p.p_success, p.runtime, p.time_to_failure, p.time_limit)
        service = dur * p.gpus / HOUR
        return np.zeros(len(p), np.int64), -service, {"pred_gpu_h": service, "pred_runtime_h": dur / HOUR}
