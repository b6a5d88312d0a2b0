"""A multi-node reservation searches only the release times that can hold its answer, and finds the
same earliest time as a search over every release time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import placeable
from headway.policy.reserve import _candidate_times
from headway.policy.snapshot import FULL_SHARE


def earliest(times: np.ndarray, rel: np.ndarray, share: np.ndarray, g: int, m: int) -> float:
    """The first time in `times` at which the gang fits (inf: never), by the reservation's own search."""
    if len(times) == 0 or not placeable((rel <= times[-1]).sum(axis=1), share, g, m):
        return float("inf")
    lo, hi = 0, len(times) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if placeable((rel <= times[mid]).sum(axis=1), share, g, m):
            hi = mid
        else:
            lo = mid + 1
    return float(times[lo])


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    nodes=st.integers(1, 30),
    gpn=st.sampled_from([1, 2, 4, 8]),
    g=st.integers(1, 80),
    m=st.integers(2, 12),
    never=st.floats(0.0, 0.5),
    ties=st.booleans(),
)
def test_the_narrowed_search_finds_the_same_reservation_time(
    seed: int, nodes: int, gpn: int, g: int, m: int, never: float, ties: bool
) -> None:
    rng = np.random.default_rng(seed)
    rel = rng.exponential(3600.0, (nodes, gpn))
    if ties:  # many GPUs released at the same instants
        rel = np.round(rel / 1800.0) * 1800.0
    rel[rng.random((nodes, gpn)) < never] = np.inf  # GPUs whose release is unknown
    share = np.full((nodes, gpn), FULL_SHARE, dtype=np.int64)
    rel_sorted = np.sort(rel, axis=1)
    flat = rel_sorted[np.isfinite(rel_sorted)]
    full = earliest(np.unique(flat), rel, share, g, m)
    narrowed = earliest(_candidate_times(flat, rel_sorted, g, m), rel, share, g, m)
    assert narrowed == full
