"""A FreeIndex kept live (the simulator's): `set_free` after every change keeps its counts, rack
totals, histogram and heaps current, and a pass on its copy-on-write `scratch` places as the rules
say (`reference_place`, the oracle in test_placement_index.py) without changing it."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import FreeIndex
from headway.policy.snapshot import FULL_SHARE, I64
from test_placement_index import reference_place


def _cluster(nodes: int, gpn: int, per_rack: int) -> tuple[I64, I64, I64, int]:
    free = np.full(nodes, gpn, dtype=np.int64)
    share = np.full((nodes, gpn), FULL_SHARE, dtype=np.int64)
    rack = (np.arange(nodes) // per_rack).astype(np.int64)
    return free, share, rack, int(rack.max()) + 1


def _counts(index: FreeIndex) -> tuple[list[int], list[int], int]:
    return index.free_l.copy(), index.hist.copy(), index.total


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 40),
    gpn=st.integers(1, 8),
    per_rack=st.integers(1, 6),
    moves=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 8)), max_size=300),
)
def test_a_live_index_tracks_every_change_exactly(
    nodes: int, gpn: int, per_rack: int, moves: list[tuple[int, int]]
) -> None:
    free, share, rack, n_racks = _cluster(nodes, gpn, per_rack)
    live = FreeIndex(free, rack, n_racks)
    live.scratch(free, share).place("topology", 1.0, 1)  # built on first use, in the live index
    live.scratch(free, share).place("first-fit", 1.0, 1)
    assert live.ff is not None and live.heaps is not None
    for raw_node, raw_free in moves:
        n, f = raw_node % nodes, raw_free % (gpn + 1)
        free[n] = f
        live.set_free(n, f)
        live.check(free, rack, n_racks)  # counts, rack totals, histogram, heaps and their tops
        assert live.max_free() == int(free.max(initial=0))
        assert live.total == int(free.sum())
        for g in range(1, gpn + 2):
            fits = [m for m in range(nodes) if free[m] >= g]
            assert live.placeable(g, 1) == bool(fits)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 30),
    per_rack=st.integers(1, 5),
    used=st.lists(st.integers(0, 8), min_size=30, max_size=30),
    jobs=st.lists(
        st.tuples(st.sampled_from([0.5, 1, 2, 3, 4, 8, 12, 16, 24]), st.integers(1, 4)), max_size=12
    ),
)
def test_a_pass_on_a_scratch_of_the_live_index_places_as_the_rules_say(
    nodes: int, per_rack: int, used: list[int], jobs: list[tuple[float, int]]
) -> None:
    free, share, rack, n_racks = _cluster(nodes, 8, per_rack)
    live = FreeIndex(free, rack, n_racks)
    for n in range(nodes):
        share[n, : used[n]] = 0
        free[n] = 8 - used[n]
        live.set_free(n, int(free[n]))
    for how in ("topology", "first-fit"):
        before = _counts(live)
        scratch = live.scratch(free, share)
        for g, m in jobs:
            want = reference_place(how, scratch.free.tolist(), scratch.share.tolist(), rack.tolist(), g, m)
            got = scratch.place(how, g, m)
            assert got == want
            if got is not None:
                scratch.take(got)
            scratch.check(scratch.free, rack, n_racks)
        # The pass wrote neither the live arrays nor the live lists (it may have built the heaps there,
        # for the GPUs as they are: the live index keeps them from then on).
        live.check(free, rack, n_racks)
        assert _counts(live) == before


def test_placeable_asks_the_fullest_nodes_together() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        free, _, rack, n_racks = _cluster(9, 8, 3)
        free[:] = rng.integers(0, 9, 9)
        live = FreeIndex(free, rack, n_racks)
        for g in (1, 9, 12, 16, 24, 40):
            for m in (1, 2, 3, 5):
                some = any(
                    sum(int(free[n]) for n in nodes) >= g
                    for k in range(1, m + 1)
                    for nodes in itertools.combinations(range(9), k)
                )
                assert live.placeable(g, m) == some


def test_a_node_freeing_more_than_any_node_had_grows_the_index() -> None:
    """A cluster that starts partly used: a node may later free more GPUs than any node had."""
    free = np.array([1, 0, 2], dtype=np.int64)
    share = np.where(np.arange(8)[None, :] < free[:, None], FULL_SHARE, 0).astype(np.int64)
    rack = np.array([0, 0, 1], dtype=np.int64)
    live = FreeIndex(free, rack, 2)
    assert live.scratch(free, share).place("topology", 2.0, 1) is not None  # heaps built (counts 0..2)
    free[1] = 8
    share[1] = FULL_SHARE
    live.set_free(1, 8)
    live.check(free, rack, 2)
    assert live.hist == [0, 1, 1, 0, 0, 0, 0, 0, 1] and live.max_free() == 8
    for how in ("topology", "first-fit"):
        assert live.scratch(free, share).place(how, 5.0, 1) == reference_place(
            how, free.tolist(), share.tolist(), rack.tolist(), 5.0, 1
        )


def test_heaps_are_rebuilt_before_stale_entries_pile_up() -> None:
    free, share, rack, n_racks = _cluster(16, 8, 4)
    live = FreeIndex(free, rack, n_racks)
    live.scratch(free, share).place("topology", 1.0, 1)
    rng = np.random.default_rng(0)
    for _ in range(5000):
        n, f = int(rng.integers(0, 16)), int(rng.integers(0, 9))
        free[n] = f
        live.set_free(n, f)
    assert live.heaps is not None and sum(map(len, live.heaps)) <= 2 * (2 * 16 + 256)
    live.check(free, rack, n_racks)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 24),
    per_rack=st.integers(1, 6),
    moves=st.lists(st.tuples(st.integers(0, 10**6), st.integers(-4, 8)), max_size=120),
    jobs=st.lists(st.tuples(st.sampled_from([1, 2, 3, 5, 8, 12, 20]), st.integers(1, 4)), max_size=6),
)
def test_an_index_of_counts_that_go_below_zero_places_as_the_rules_say(
    nodes: int, per_rack: int, moves: list[tuple[int, int]], jobs: list[tuple[int, int]]
) -> None:
    """A backfill's spare GPUs: counts may fall below zero (nothing there, but the rack's total falls)."""
    free, _, rack, n_racks = _cluster(nodes, 8, per_rack)
    spare = FreeIndex(free, rack, n_racks)
    spare.scratch(free, np.zeros((nodes, 8), dtype=np.int64)).place("topology", 1.0, 1)  # the heaps
    for raw_node, f in moves:
        n = raw_node % nodes
        free[n] = f
        spare.set_free(n, f)
        spare.check(free, rack, n_racks)
    share = np.where(np.arange(8)[None, :] < np.maximum(free, 0)[:, None], FULL_SHARE, 0).astype(np.int64)
    for how in ("topology", "first-fit"):
        for g, m in jobs:
            want = reference_place(how, free.tolist(), share.tolist(), rack.tolist(), float(g), m)
            assert spare.place(how, float(g), m) == want
