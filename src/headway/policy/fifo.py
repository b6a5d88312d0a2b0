"""FIFO: submit order, strictly (`fifo`: the first job that does not fit blocks the rest) or skipping
what does not fit (`fifo-skip`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from headway.policy.base import Policy
from headway.policy.factors import HOUR
from headway.policy.snapshot import F64, I64, Snapshot


@dataclass(frozen=True)
class Fifo(Policy):
    """First come, first served, strictly: the first job that does not fit waits and blocks the rest.

    This is textbook FIFO and the Helios simulator's FIFO (no backfill); `fifo-skip` skips instead.
    """

    name: ClassVar[str] = "fifo"
    uses_predictions: ClassVar[bool] = False
    mode: ClassVar[str] = "strict"

    def scores(self, snap: Snapshot) -> tuple[I64, F64, dict[str, F64]]:
        p = snap.pending
        return np.zeros(len(p), np.int64), -p.submit, {"waited_h": (snap.now - p.submit) / HOUR}


@dataclass(frozen=True)
class FifoSkip(Fifo):
    """Submit order, but a job that does not fit is skipped, not waited for (backfill without reservation)."""

    name: ClassVar[str] = "fifo-skip"
    mode: ClassVar[str] = "greedy"
