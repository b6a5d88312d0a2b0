"""The scheduling core: pure functions over a frozen snapshot (no I/O, no clock).

`get_policy(name).rank(snapshot)` orders every pending job with its factors and a reason;
`.decide(snapshot)` returns a Decision (jobs to start with their GPUs, jobs to preempt, the reservation).
"""

from headway.policy.base import Policy
from headway.policy.placement import PLACEMENTS, gang_size, max_nodes_for, place
from headway.policy.registry import (
    BASELINE,
    DEFAULT_COMPARISON,
    LIVE_POLICIES,
    POLICIES,
    REGISTRY,
    Registered,
    get_policy,
    live_policy_error,
)
from headway.policy.snapshot import (
    Allocation,
    ClusterView,
    Decision,
    PendingJobs,
    Ranking,
    Reservation,
    RunningJobs,
    Snapshot,
    Start,
)

__all__ = [
    "BASELINE",
    "DEFAULT_COMPARISON",
    "LIVE_POLICIES",
    "PLACEMENTS",
    "POLICIES",
    "REGISTRY",
    "Allocation",
    "ClusterView",
    "Decision",
    "PendingJobs",
    "Policy",
    "Ranking",
    "Registered",
    "Reservation",
    "RunningJobs",
    "Snapshot",
    "Start",
    "gang_size",
    "get_policy",
    "live_policy_error",
    "max_nodes_for",
    "place",
]
