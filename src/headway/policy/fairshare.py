"""Fair share alone (`fairshare`): Slurm's multifactor with only PriorityWeightFairshare set.

A site that weighs nothing but fair share runs this: the user who used least (decayed, over their
share) goes first, ties in submit order, with multifactor's EASY backfill on time limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from headway.policy.multifactor import Multifactor


@dataclass(frozen=True)
class FairShare(Multifactor):
    """Multifactor with age and size weighted 0: the fair-share factor orders the queue."""

    name: ClassVar[str] = "fairshare"
    w_age: float = 0.0
    w_size: float = 0.0
