"""The multi-node topology search (histogram + per-rack scan) chooses exactly what the vectorised
search it replaced chose: kept below as the reference, ties included (with its multi-rack step, racks
by the sum of their k fullest nodes, written the plain way)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import _counts, _tightest_for_rest, _topology
from headway.policy.snapshot import I64, Allocation

_BIG = np.iinfo(np.int64).max // 4


def _fewest_nodes(free: I64, g: int, max_nodes: int) -> tuple[I64, int] | None:
    """Nodes by free GPUs (most first, stable) and how many of them the gang needs at least."""
    order = np.argsort(-free, kind="stable")
    cs = np.cumsum(free[order])
    if cs[-1] < g:
        return None
    k = int(np.searchsorted(cs, g)) + 1
    return None if k > max_nodes else (order, k)


def reference_topology(
    free: I64, rack: I64, n_racks: int, g: int, max_nodes: int, rack_free: I64 | None = None
) -> Allocation | None:
    ok1 = free >= g
    if ok1.any():
        rf = np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64)
        key = np.where(ok1, rf[rack] * 1024 + np.minimum(free, 1023), _BIG)
        return Allocation((int(np.argmin(key)),), (g,))
    if max_nodes == 1:
        return None
    fewest = _fewest_nodes(free, g, max_nodes)
    if fewest is None:
        return None
    order, k = fewest
    by_rack = np.lexsort((-free, rack))
    r_sorted = rack[by_rack]
    starts = np.searchsorted(r_sorted, np.arange(n_racks))
    within = np.arange(len(free)) - starts[r_sorted]
    fr = free[by_rack]
    topk = np.bincount(r_sorted, weights=np.where(within < k, fr, 0), minlength=n_racks)
    ok = topk >= g
    if ok.any():
        total = rack_free if rack_free is not None else np.bincount(rack, weights=free, minlength=n_racks)
        r = int(np.argmin(np.where(ok, total, np.inf)))
        nodes = by_rack[starts[r] : starts[r] + int((r_sorted == r).sum())].tolist()
    else:  # no rack holds it: racks by the sum of their k fullest nodes, until those hold it
        picked: list[int] = []
        for r in sorted(range(n_racks), key=lambda r: (-topk[r], r)):
            if topk[r] <= 0:
                break
            picked.append(r)
            pool = np.sort(fr[np.isin(r_sorted, picked) & (within < k)])[::-1][:k]
            if pool.sum() >= g:
                break
        nodes = [int(n) for n in order if rack[n] in picked]  # fullest first, ties by node index
    chosen = nodes[: k - 1]
    rest = g - int(free[chosen].sum()) if chosen else g
    last = _tightest_for_rest(free.tolist(), chosen, nodes, rest)
    if last is None:
        return _counts(free, nodes[:k], g)
    return _counts(free, [*chosen, last], g)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    nodes=st.integers(1, 60),
    gpn=st.sampled_from([1, 2, 4, 8]),
    n_racks=st.integers(1, 9),
    shuffled=st.booleans(),
    g=st.integers(1, 64),
    max_nodes=st.integers(1, 12),
    busy=st.floats(0.0, 1.0),
)
def test_topology_places_as_the_reference_search(
    seed: int, nodes: int, gpn: int, n_racks: int, shuffled: bool, g: int, max_nodes: int, busy: float
) -> None:
    rng = np.random.default_rng(seed)
    free = rng.binomial(gpn, 1.0 - busy, nodes).astype(np.int64)
    rack = (np.arange(nodes) * n_racks // nodes).astype(np.int64)
    if shuffled:  # racks need not be consecutive nodes (named racks in a TOML cluster)
        rack = rng.permutation(rack)
    n_r = int(rack.max()) + 1
    totals = np.bincount(rack, weights=free, minlength=n_r).astype(np.int64)
    for rf in (None, totals):
        assert _topology(free, rack, n_r, g, max_nodes, rf) == reference_topology(
            free, rack, n_r, g, max_nodes, rf
        )


def fullest_anywhere(free: I64, g: int, max_nodes: int) -> Allocation | None:
    """What topology placement did for a gang no rack holds before it counted racks: the fullest nodes
    anywhere, the tightest node for the rest."""
    fewest = _fewest_nodes(free, g, max_nodes)
    if fewest is None:
        return None
    order, k = fewest
    nodes = order.tolist()
    chosen = nodes[: k - 1]
    rest = g - int(free[chosen].sum()) if chosen else g
    last = _tightest_for_rest(free.tolist(), chosen, nodes, rest)
    return _counts(free, [*chosen, last] if last is not None else nodes[:k], g)


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
    new, old = _topology(free, rack, n_r, g, nodes), fullest_anywhere(free, g, nodes)
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
    new, old = _topology(free, rack, int(rack.max()) + 1, g, nodes), fullest_anywhere(free, g, nodes)
    assert new is not None and old is not None and sum(new.counts) == g
    assert len(new.nodes) == len(old.nodes) == 5
    assert len(set(rack[list(new.nodes)].tolist())) == len(set(rack[list(old.nodes)].tolist())) == 3


def test_a_gang_of_two_racks_is_not_spread_over_three() -> None:
    """9 nodes of 8 GPUs, 3 racks of 3; a 32-GPU gang needs 4 nodes: rack 2's three free nodes and one of
    rack 1's, not the fullest nodes wherever they are (nodes 0, 4, 5 and 6: three racks)."""
    free = np.array([8, 0, 2, 2, 8, 8, 8, 8, 8], dtype=np.int64)
    rack = np.repeat(np.arange(3), 3).astype(np.int64)
    got = _topology(free, rack, 3, 32, 4)
    assert got is not None and len(got.nodes) == 4
    assert len(set(rack[list(got.nodes)].tolist())) == 2
