"""The policies under their former module's names: each lives in its own module of policy/ now (base.py
holds the Policy class and the pass every policy shares; registry.py lists them). Kept so that
`from headway.policy.policies import X` goes on working."""

from headway.policy.base import Policy
from headway.policy.factors import (
    DAY,
    HOUR,
    Z90,
    expected_runtime,
    fairshare,
    fairshare_of,
    lognormal_mean,
    slip_end,
)
from headway.policy.fifo import Fifo, FifoSkip
from headway.policy.impact import CLASS_MAX_WAIT, CLASS_WEIGHT, Impact, ImpactOracle
from headway.policy.las import Las
from headway.policy.multifactor import Multifactor
from headway.policy.qssf import Qssf
from headway.policy.sjf import SjfOracle

__all__ = [
    "CLASS_MAX_WAIT",
    "CLASS_WEIGHT",
    "DAY",
    "HOUR",
    "Z90",
    "Fifo",
    "FifoSkip",
    "Impact",
    "ImpactOracle",
    "Las",
    "Multifactor",
    "Policy",
    "Qssf",
    "SjfOracle",
    "expected_runtime",
    "fairshare",
    "fairshare_of",
    "lognormal_mean",
    "slip_end",
]
