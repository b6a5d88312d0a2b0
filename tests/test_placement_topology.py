"""Topology placement of gangs no single node holds (`FreeIndex._spread`): the same choice, ties
included, as the plain search below, a test oracle written from the rule on sorted lists: the fewest
nodes; the tightest rack whose k fullest nodes hold the gang; else racks by the sum of their k fullest
nodes until those hold it (or, when fewer, the racks of the k fullest nodes anywhere); then the k-1
fullest of those nodes and the tightest node for the rest."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import place
from headway.policy.snapshot import FULL_SHARE, I64, Allocation


def share_of(free: I64, gpn: int) -> I64:
    """Whole free GPUs first on each node, the rest busy."""
    return np.where(np.arange(gpn)[None, :] < free[:, None], FULL_SHARE, 0).astype(np.int64)


def _split(free: list[int], nodes: list[int], g: int) -> Allocation:
    counts, left = [], g
    for n in nodes:
        counts.append(min(free[n], left))
        left -= counts[-1]
    return Allocation(tuple(nodes), tuple(counts))


def reference_spread(free: list[int], rack: list[int], g: int, max_nodes: int) -> Allocation | None:
    """Topology for a gang that no single node holds (the oracle; plain lists)."""
    n_racks = max(rack) + 1
    fullest = sorted((n for n in range(len(free)) if free[n] > 0), key=lambda n: (-free[n], n))
    k, acc = 0, 0
    while acc < g and k < len(fullest):
        acc += free[fullest[k]]
        k += 1
    if acc < g or k > max_nodes:
        return None
    members = [[n for n in range(len(free)) if rack[n] == r] for r in range(n_racks)]
    top = [sorted((free[n] for n in mem if free[n] > 0), reverse=True)[:k] for mem in members]
    total = [sum(free[n] for n in mem) for mem in members]
    fits = [r for r in range(n_racks) if sum(top[r]) >= g and total[r] >= g]
    if fits:
        r = min(fits, key=lambda r: (total[r], r))
        nodes = sorted(members[r], key=lambda n: (-free[n], n))
    else:
        picked: list[int] = []
        for r in sorted((r for r in range(n_racks) if top[r]), key=lambda r: (-sum(top[r]), r)):
            picked.append(r)
            if sum(sorted((f for q in picked for f in top[q]), reverse=True)[:k]) >= g:
                break
        theirs = sorted({rack[n] for n in fullest[:k]})
        if len(theirs) < len(picked):
            picked = theirs
        nodes = sorted((n for r in picked for n in members[r]), key=lambda n: (-free[n], n))
    chosen = nodes[: k - 1]
    rest = g - sum(free[n] for n in chosen)
    last = min((n for n in nodes if n not in chosen and free[n] >= rest), key=lambda n: free[n])
    return _split(free, [*chosen, last], g)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    nodes=st.integers(1, 60),
    gpn=st.sampled_from([1, 2, 4, 8]),
    n_racks=st.integers(1, 9),
    shuffled=st.booleans(),
    g=st.integers(1, 64),
    max_nodes=st.integers(2, 12),
    busy=st.floats(0.0, 1.0),
)
def test_topology_spreads_a_gang_as_the_reference_search(
    seed: int, nodes: int, gpn: int, n_racks: int, shuffled: bool, g: int, max_nodes: int, busy: float
) -> None:
    rng = np.random.default_rng(seed)
    free = rng.binomial(gpn, 1.0 - busy, nodes).astype(np.int64)
    if (free >= g).any():
        free = np.minimum(free, g - 1)  # no single node holds it: the spread decides
    rack = (np.arange(nodes) * n_racks // nodes).astype(np.int64)
    if shuffled:  # racks need not be consecutive nodes (named racks in a TOML cluster)
        rack = rng.permutation(rack)
    n_r = int(rack.max()) + 1
    got = place("topology", free, share_of(free, gpn), rack, n_r, float(g), max_nodes)
    assert got == reference_spread(free.tolist(), rack.tolist(), g, max_nodes)


def fullest_anywhere(free: I64, g: int, max_nodes: int) -> Allocation | None:
    """What topology placement did for a gang no rack holds before it counted racks: the fullest nodes
    anywhere, the tightest node for the rest."""
    order = sorted(range(len(free)), key=lambda n: (-int(free[n]), n))
    k, acc = 0, 0
    while acc < g and k < len(order):
        acc += int(free[order[k]])
        k += 1
    if acc < g or k > max_nodes:
        return None
    fl = free.tolist()
    chosen = order[: k - 1]
    rest = g - sum(fl[n] for n in chosen)
    last = min((n for n in order if n not in chosen and fl[n] >= rest), key=lambda n: fl[n])
    return _split(fl, [*chosen, last], g)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    nodes=st.integers(2, 60),
    gpn=st.sampled_from([2, 4, 8]),
    n_racks=st.integers(2, 9),
    g=st.integers(2, 64),
    busy=st.floats(0.0, 1.0),
)
def test_a_gang_no_rack_holds_spans_no_more_nodes_or_racks_than_the_fullest_nodes_anywhere(
    seed: int, nodes: int, gpn: int, n_racks: int, g: int, busy: float
) -> None:
    rng = np.random.default_rng(seed)
    free = rng.binomial(gpn, 1.0 - busy, nodes).astype(np.int64)
    rack = rng.permutation((np.arange(nodes) * n_racks // nodes).astype(np.int64))
    n_r = int(rack.max()) + 1
    new = place("topology", free, share_of(free, gpn), rack, n_r, float(g), nodes)
    old = fullest_anywhere(free, g, nodes)
    assert (new is None) == (old is None)
    if new is None or old is None:
        return
    assert sum(new.counts) == g and all(c <= free[n] for n, c in zip(new.nodes, new.counts, strict=True))
    assert len(new.nodes) == len(old.nodes)
    assert len(set(rack[list(new.nodes)].tolist())) <= len(set(rack[list(old.nodes)].tolist()))


def test_a_gang_no_rack_holds_takes_the_racks_of_the_fullest_nodes_when_greedy_racks_would_be_more() -> None:
    """Found by the property above (seed 7, 32 nodes of 8, 7 racks, a 32-GPU gang): taking racks by
    their k fullest nodes needed 4 racks where the 5 fullest nodes anywhere lie in 3."""
    seed, nodes, gpn, n_racks, g, busy = 7, 32, 8, 7, 32, 0.4375
    rng = np.random.default_rng(seed)
    free = rng.binomial(gpn, 1.0 - busy, nodes).astype(np.int64)
    rack = rng.permutation((np.arange(nodes) * n_racks // nodes).astype(np.int64))
    n_r = int(rack.max()) + 1
    new = place("topology", free, share_of(free, gpn), rack, n_r, float(g), nodes)
    old = fullest_anywhere(free, g, nodes)
    assert new is not None and old is not None and sum(new.counts) == g
    assert len(new.nodes) == len(old.nodes) == 5
    assert len(set(rack[list(new.nodes)].tolist())) == len(set(rack[list(old.nodes)].tolist())) == 3
    assert new == reference_spread(free.tolist(), rack.tolist(), g, nodes)


def test_a_gang_of_two_racks_is_not_spread_over_three() -> None:
    """9 nodes of 8 GPUs, 3 racks of 3; a 32-GPU gang needs 4 nodes: rack 2's three free nodes and one of
    rack 1's, not the fullest nodes wherever they are (nodes 0, 4, 5 and 6: three racks)."""
    free = np.array([8, 0, 2, 2, 8, 8, 8, 8, 8], dtype=np.int64)
    rack = np.repeat(np.arange(3), 3).astype(np.int64)
    got = place("topology", free, share_of(free, 8), rack, 3, 32.0, 4)
    assert got == Allocation((4, 5, 6, 7), (8, 8, 8, 8))


def test_a_gang_one_rack_holds_goes_to_the_tightest_such_rack_and_its_tightest_last_node() -> None:
    # rack 0 (nodes 0-2) has 14 free, rack 1 (nodes 3-5) 11: both hold 10 GPUs on two nodes (k = 2);
    # rack 1 is tighter. Its fullest node (6) and, for the 4 left, the tightest that holds them (4, not 5).
    free = np.array([8, 6, 0, 6, 4, 1], dtype=np.int64)
    rack = np.repeat(np.arange(2), 3).astype(np.int64)
    got = place("topology", free, share_of(free, 8), rack, 2, 10.0, 2)
    assert got == Allocation((3, 4), (6, 4))
    assert place("topology", free, share_of(free, 8), rack, 2, 10.0, 1) is None
