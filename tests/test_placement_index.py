"""FreeIndex, the one placement index: through a pass of placements and takes it must place as the
rules say, ties included. The oracle here (`reference_place`) recomputes each placement from the
arrays as the rules are written, on plain lists; a brute force over every node subset (tiny clusters)
checks that a gang is placed exactly when some placement exists, on the fewest nodes for topology."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import FreeIndex, gang_size, place, placeable, take
from headway.policy.snapshot import FULL_SHARE, I64, Allocation
from test_placement_topology import reference_spread


def _split(free: list[int], nodes: list[int], g: int) -> Allocation:
    counts, left = [], g
    for n in nodes:
        counts.append(min(free[n], left))
        left -= counts[-1]
    return Allocation(tuple(nodes), tuple(counts))


def _fraction(
    how: str, free: list[int], share: list[list[int]], rack: list[int], milli: int
) -> Allocation | None:
    gpus = [(n, gi) for n, row in enumerate(share) for gi, s in enumerate(row) if s >= milli]  # row-major
    if not gpus:
        return None
    if how == "first-fit":
        n, gi = gpus[0]
        return Allocation((n,), (0,), gi, milli)
    # the least free share that fits; ties: fewest whole free GPUs on the node, tightest rack, lowest
    rack_free = [sum(f for m, f in enumerate(free) if rack[m] == r) for r in range(max(rack) + 1)]
    smin = min(share[n][gi] for n, gi in gpus)
    n, gi = min(
        ((n, gi) for n, gi in gpus if share[n][gi] == smin),
        key=lambda p: (min(free[p[0]], 1023) * (1 << 32) + rack_free[rack[p[0]]], p),
    )
    return Allocation((n,), (0,), gi, milli)


def reference_place(
    how: str, free: list[int], share: list[list[int]], rack: list[int], gpus: float, max_nodes: int
) -> Allocation | None:
    """The placement rules, from the arrays (the oracle)."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        return Allocation((), ()) if milli == 0 else _fraction(how, free, share, rack, milli)
    holds = [n for n in range(len(free)) if free[n] >= whole]
    if how == "first-fit" and holds:
        return Allocation((holds[0],), (whole,))
    if how == "topology" and holds:  # the tightest rack that holds it, its tightest node, the lowest
        rack_free = [sum(f for m, f in enumerate(free) if rack[m] == r) for r in range(max(rack) + 1)]
        return Allocation((min(holds, key=lambda n: (rack_free[rack[n]], min(free[n], 1023), n)),), (whole,))
    if max_nodes == 1:
        return None
    if how == "topology":
        return reference_spread(free, rack, whole, max_nodes)
    in_order = [n for n in range(len(free)) if free[n] > 0]
    fullest = sorted(in_order, key=lambda n: (-free[n], n))
    for nodes in (in_order, fullest):
        acc = list(itertools.accumulate(free[n] for n in nodes))
        k = next((i + 1 for i, a in enumerate(acc) if a >= whole), None)
        if k is not None and k <= max_nodes:
            return _split(free, nodes[:k], whole)
    return None


def _cluster(seed: int, nodes: int, gpn: int, per_rack: int) -> tuple[I64, I64, I64, int]:
    rng = np.random.default_rng(seed)
    share = np.where(rng.random((nodes, gpn)) < 0.5, FULL_SHARE, 0).astype(np.int64)
    part = rng.random((nodes, gpn)) < 0.1
    share[part] = rng.integers(1, FULL_SHARE, int(part.sum()))
    if rng.random() < 0.3:  # nodes of mixed sizes: no GPU past a node's own (-1)
        size = rng.integers(1, gpn + 1, nodes)
        share[np.arange(gpn)[None, :] >= size[:, None]] = -1
    free = (share == FULL_SHARE).sum(axis=1).astype(np.int64)
    rack = (np.arange(nodes) // per_rack).astype(np.int64)
    return free, share, rack, int(rack.max()) + 1


REQUESTS = st.lists(
    st.tuples(st.sampled_from([0.25, 0.5, 0.75, 1, 1, 2, 3, 4, 8, 12, 16, 24]), st.integers(1, 4)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), nodes=st.integers(1, 40), per_rack=st.integers(1, 6), requests=REQUESTS)
def test_a_pass_on_the_index_places_as_the_rules_say(
    seed: int, nodes: int, per_rack: int, requests: list[tuple[float, int]]
) -> None:
    for mode in ("topology", "first-fit", "mixed"):
        free, share, rack, n_racks = _cluster(seed, nodes, 8, per_rack)
        ref_free, ref_share = free.copy(), share.copy()
        index = FreeIndex(free, rack, n_racks, share)  # takes write `free` and `share` in place
        for i, (gpus, max_nodes) in enumerate(requests):
            how = mode if mode != "mixed" else ("first-fit", "topology")[(i // 10) % 2]
            want = reference_place(how, ref_free.tolist(), ref_share.tolist(), rack.tolist(), gpus, max_nodes)
            got = index.place(how, gpus, max_nodes)
            assert got == want
            if got is not None:
                assert index.take(got) == take(ref_free, ref_share, got)
            assert np.array_equal(free, ref_free) and np.array_equal(share, ref_share)
            assert index.total == int(ref_free.sum()) and index.max_free() == int(ref_free.max(initial=0))
            index.check(free, rack, n_racks)


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 4), min_size=1, max_size=7),
    racks=st.integers(1, 3),
    g=st.integers(1, 12),
    max_nodes=st.integers(1, 4),
)
def test_a_gang_is_placed_exactly_when_some_nodes_hold_it_and_topology_uses_the_fewest(
    free: list[int], racks: int, g: int, max_nodes: int
) -> None:
    """Brute force over every set of at most `max_nodes` nodes (the oracle of existence)."""
    f = np.array(free, dtype=np.int64)
    share = np.where(np.arange(4)[None, :] < f[:, None], FULL_SHARE, 0).astype(np.int64)
    rack = (np.arange(len(free)) % racks).astype(np.int64)
    sizes = [
        k
        for k in range(1, max_nodes + 1)
        for nodes in itertools.combinations(range(len(free)), k)
        if sum(free[n] for n in nodes) >= g
    ]
    assert placeable(f, share, float(g), max_nodes) == bool(sizes)
    assert FreeIndex(f, rack, int(rack.max()) + 1).placeable(g, max_nodes) == bool(sizes)
    for how in ("first-fit", "topology"):
        got = place(how, f, share, rack, int(rack.max()) + 1, float(g), max_nodes)
        assert (got is not None) == bool(sizes)
        if got is not None:
            assert sum(got.counts) == g and len(got.nodes) <= max_nodes
            assert all(0 < c <= free[n] for n, c in zip(got.nodes, got.counts, strict=True))
            if how == "topology":
                assert len(got.nodes) == min(sizes)


def test_counts_below_zero_hold_nothing_but_still_count_in_their_rack() -> None:
    # A backfill's spare GPUs may fall below zero. Node 1 (-2) holds nothing; it makes rack 0's total
    # 3, below rack 1's 4, so topology's one-node placement takes rack 0's node 0 (as it always did).
    free = np.array([5, -2, 4, 0], dtype=np.int64)
    share = np.where(np.arange(8)[None, :] < np.maximum(free, 0)[:, None], FULL_SHARE, 0).astype(np.int64)
    rack = np.array([0, 0, 1, 1], dtype=np.int64)
    assert place("topology", free, share, rack, 2, 4.0, 1) == Allocation((0,), (4,))
    assert place("first-fit", free, share, rack, 2, 9.0, 2) == Allocation((0, 2), (5, 4))
    assert place("topology", free, share, rack, 2, 9.0, 3) == Allocation((0, 2), (5, 4))
    assert not placeable(free, share, 10.0, 4)


def test_a_share_may_take_a_whole_gpu_on_a_node_counted_at_zero() -> None:
    """A caller may count fewer whole free GPUs than `share` has (a backfill's spare GPUs): a share still
    goes to any GPU with room, and topology puts such a node (the fewest counted) first."""
    share = np.array([[0, 0], [FULL_SHARE, 0], [FULL_SHARE, FULL_SHARE]], dtype=np.int64)
    free = np.array([0, 0, 2], dtype=np.int64)  # node 1's free GPU is not counted
    rack = np.zeros(3, dtype=np.int64)
    assert place("first-fit", free, share, rack, 1, 0.5, 1) == Allocation((1,), (0,), 0, 500)
    assert place("topology", free, share, rack, 1, 0.5, 1) == Allocation((1,), (0,), 0, 500)
    assert place("topology", free, share, rack, 1, 1.0, 1) == Allocation((2,), (1,))


def test_an_index_over_counts_alone_places_whole_gangs() -> None:
    """Without a share array (the simulator's live index, a backfill's spare GPUs) whole gangs place."""
    free, _, rack, n_racks = _cluster(5, 30, 8, 4)
    index = FreeIndex(free, rack, n_racks)
    share = np.where(np.arange(8)[None, :] < free[:, None], FULL_SHARE, 0).astype(np.int64)
    for how in ("first-fit", "topology"):
        for g, m in ((1, 1), (3, 1), (8, 1), (12, 2), (20, 4)):
            assert index.place(how, float(g), m) == reference_place(
                how, free.tolist(), share.tolist(), rack.tolist(), float(g), m
            )


def test_a_long_first_fit_pass_keeps_its_node_lists_current() -> None:
    free, share, rack, n_racks = _cluster(11, 48, 8, 4)
    index = FreeIndex(free, rack, n_racks, share, copy_on_write=True)
    requests = [0.25, 1, 0.5, 2, 1, 0.75, 4, 1, 3, 0.5, 8, 12] * 12
    for gpus in requests:
        max_nodes = max(1, int(np.ceil(gpus / 8)))
        f, s = index.free, index.share
        want = reference_place("first-fit", f.tolist(), s.tolist(), rack.tolist(), gpus, max_nodes)
        got = index.place("first-fit", gpus, max_nodes)
        assert got == want
        if got is not None:
            index.take(got)
        index.check(index.free, rack, n_racks)
    assert index.free_l == index.free.tolist()
    assert not np.array_equal(index.free, free)  # copied at the first take: the caller's arrays kept
