"""Shortest job first on the true runtime (`sjf-oracle`): a bound no real scheduler can reach."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import HOUR
from headway.policy.snapshot import F64, I64, Snapshot


@dataclass(frozen=True)
class SjfOracle(Policy):
    """Shortest job first on the TRUE runtime: an upper bound no real scheduler can reach."""

    name: ClassVar[str] = "sjf-oracle"
    uses_predictions: ClassVar[bool] = False
    oracle: ClassVar[bool] = True
    mode: ClassVar[str] = "strict"  # as the Helios simulator's SJF

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        if p.oracle_runtime is None:
            raise ValueError("sjf-oracle needs the true runtimes in the snapshot")
        return np.zeros(len(p), np.int64), -p.oracle_runtime, {"true_runtime_h": p.oracle_runtime / HOUR}
