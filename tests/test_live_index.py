"""The simulator's live one-node index gives the placements a scan of the arrays gives.

`LiveIndex` follows the cluster's free GPUs through allocations and releases; a pass reads its best
one-node topology placement and copies its lists instead of building them. These tests drive it with
random changes and compare it with the vector computations it replaces.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import FreeIndex, LiveIndex, _topology, place, take


def _cluster(nodes: int, gpn: int, per_rack: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    free = np.full(nodes, gpn, dtype=np.int64)
    share = np.full((nodes, gpn), 1000, dtype=np.int64)
    rack = (np.arange(nodes) // per_rack).astype(np.int64)
    return free, share, rack, int(rack.max()) + 1


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 40),
    gpn=st.integers(1, 8),
    per_rack=st.integers(1, 6),
    moves=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 8)), max_size=300),
)
def test_live_index_tracks_every_change_exactly(
    nodes: int, gpn: int, per_rack: int, moves: list[tuple[int, int]]
) -> None:
    free, _, rack, n_racks = _cluster(nodes, gpn, per_rack)
    live = LiveIndex(free, rack, n_racks)
    for raw_node, raw_free in moves:
        n, f = raw_node % nodes, raw_free % (gpn + 1)
        free[n] = f
        live.set_free(n, f)
        live.check(free, rack, n_racks)  # best one-node node per size, rack totals, histogram


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 30),
    per_rack=st.integers(1, 5),
    used=st.lists(st.integers(0, 8), min_size=30, max_size=30),
    jobs=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 24]), st.integers(1, 4)), max_size=12),
)
def test_a_pass_seeded_from_the_live_index_places_as_the_arrays_do(
    nodes: int, per_rack: int, used: list[int], jobs: list[tuple[int, int]]
) -> None:
    free, share, rack, n_racks = _cluster(nodes, 8, per_rack)
    live = LiveIndex(free, rack, n_racks)
    for n in range(nodes):
        share[n, : used[n]] = 0
        free[n] = 8 - used[n]
        live.set_free(n, int(free[n]))
    for how in ("topology", "first-fit"):
        seeded = FreeIndex(free, share, rack, n_racks, copy_on_write=True, live=live)
        plain_free, plain_share = free.copy(), share.copy()
        for g, m in jobs:
            got = seeded.place(how, float(g), m)
            want = place(how, plain_free, plain_share, rack, n_racks, float(g), m)
            assert got == want
            if got is not None:
                seeded.take(got)
                take(plain_free, plain_share, got)
        live.check(free, rack, n_racks)  # the pass never wrote the live arrays or lists


def test_spans_agrees_with_the_topology_search_on_when_a_gang_cannot_be_placed() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        free, _, rack, n_racks = _cluster(24, 8, 4)
        free[:] = rng.integers(0, 9, 24)
        live = LiveIndex(free, rack, n_racks)
        for g in (9, 12, 16, 24, 40):
            for m in (2, 3, 5):
                if (free >= g).any():
                    continue
                assert live.spans(g, m) == (_topology(free, rack, n_racks, g, m) is not None)
