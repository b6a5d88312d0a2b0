"""The multi-node topology search (histogram + per-rack scan) chooses exactly what the vectorised
search it replaced chose: kept below as the reference, ties included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import _counts, _tightest_for_rest, _topology
from headway.policy.snapshot import I64, Allocation

_BIG = np.iinfo(np.int64).max // 4


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
    order = np.argsort(-free, kind="stable")
    cs = np.cumsum(free[order])
    if cs[-1] < g:
        return None
    k = int(np.searchsorted(cs, g)) + 1
    if k > max_nodes:
        return None
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
    else:
        nodes = order.tolist()
    chosen = nodes[: k - 1]
    rest = g - int(free[chosen].sum()) if chosen else g
    last = _tightest_for_rest(free, chosen, nodes, rest)
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
