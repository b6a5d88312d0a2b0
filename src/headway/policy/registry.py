"""The one list of scheduling policies: what `simulate`, `sweep`, the live queue and the Slurm adapter offer.

Each entry names a Policy class (its `name`, `oracle` and `uses_predictions` live on the class, so they
are said once) and whether `headway simulate` compares it by default. The order here is the order every
listing shows. Adding a policy: its class (a Policy subclass in its own module of policy/, fifo.py
the smallest example: `scores`, and the class variables saying its mode and whether it preempts or
wakes), one entry below, and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from headway.policy.base import Policy
from headway.policy.fairshare import FairShare
from headway.policy.fifo import Fifo, FifoSkip
from headway.policy.impact import Impact, ImpactOracle
from headway.policy.las import Las
from headway.policy.multifactor import Multifactor
from headway.policy.multifactor_preempt import MultifactorPreempt
from headway.policy.qssf import Qssf
from headway.policy.sjf import SjfOracle


@dataclass(frozen=True, slots=True)
class Registered:
    """One policy as the commands offer it."""

    cls: type[Policy]
    compared_by_default: bool = False  # in `headway simulate`'s and `sweep`'s default --policy

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def oracle(self) -> bool:
        """Reads the truth (true runtimes or outcomes): a replay can run it, a live queue cannot."""
        return self.cls.oracle


REGISTRY: tuple[Registered, ...] = (
    Registered(Fifo, compared_by_default=True),
    Registered(Multifactor, compared_by_default=True),
    Registered(Qssf, compared_by_default=True),
    Registered(Las, compared_by_default=True),
    Registered(Impact, compared_by_default=True),
    Registered(SjfOracle),
    Registered(FifoSkip),
    Registered(ImpactOracle),
    Registered(FairShare),
    Registered(MultifactorPreempt),
)
POLICIES: dict[str, type[Policy]] = {r.name: r.cls for r in REGISTRY}
# What a live queue can run: an oracle needs the truth, which only a replay has.
LIVE_POLICIES: tuple[str, ...] = tuple(r.name for r in REGISTRY if not r.oracle)
DEFAULT_COMPARISON: tuple[str, ...] = tuple(r.name for r in REGISTRY if r.compared_by_default)
# What comparisons give ratios to: Slurm's own default ordering, the policy a site already runs.
BASELINE = "multifactor"


def live_policy_error(name: str) -> str | None:
    """Why `name` cannot order a live queue (None when it can)."""
    if name in LIVE_POLICIES:
        return None
    why = " (an oracle needs the truth: `headway simulate` only)" if name in POLICIES else ""
    return f"unknown --policy {name!r}{why}; choose one of {', '.join(LIVE_POLICIES)}"


def knobs_for(name: str, knobs: dict[str, object]) -> dict[str, object]:
    """The knobs policy `name` has (`--no-preemption` turns impact's preemption off and means nothing
    to a policy that never preempts by class)."""
    from dataclasses import fields

    have = {f.name for f in fields(POLICIES[name])} if name in POLICIES else set()
    return {k: v for k, v in knobs.items() if k in have}


def get_policy(name: str, placement: str | None = None, **knobs: object) -> Policy:
    """A policy by name; `placement` None keeps the policy's default (topology for impact)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    cls = POLICIES[name]
    if placement is not None:
        knobs["placement"] = placement
    return cls(**knobs)  # type: ignore[arg-type]
