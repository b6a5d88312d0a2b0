"""FreeIndex (the per-pass incremental placement index) must place exactly as `place` does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import FreeIndex, place, take
from headway.policy.snapshot import FULL_SHARE


def _cluster(
    seed: int, nodes: int, gpn: int, per_rack: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    share = np.where(rng.random((nodes, gpn)) < 0.5, FULL_SHARE, 0).astype(np.int64)
    part = rng.random((nodes, gpn)) < 0.1
    share[part] = rng.integers(1, FULL_SHARE, int(part.sum()))
    free = (share == FULL_SHARE).sum(axis=1).astype(np.int64)
    rack = (np.arange(nodes) // per_rack).astype(np.int64)
    return free, share, rack, int(rack.max()) + 1


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    nodes=st.integers(1, 40),
    per_rack=st.integers(1, 6),
    requests=st.lists(st.sampled_from([0.25, 0.5, 1, 1, 2, 3, 4, 8, 12, 16]), min_size=1, max_size=60),
)
def test_free_index_places_like_place_through_a_pass(
    seed: int, nodes: int, per_rack: int, requests: list[float]
) -> None:
    for mode in ("topology", "first-fit", "mixed"):
        free, share, rack, n_racks = _cluster(seed, nodes, 8, per_rack)
        ref_free, ref_share = free.copy(), share.copy()
        index = FreeIndex(free, share, rack, n_racks)
        for i, gpus in enumerate(requests):
            how = mode if mode != "mixed" else ("first-fit", "topology")[(i // 10) % 2]
            max_nodes = max(1, int(np.ceil(gpus / 8)))
            want = place(how, ref_free, ref_share, rack, n_racks, float(gpus), max_nodes)
            got = index.place(how, float(gpus), max_nodes)
            assert got == want
            if want is not None:
                assert index.take(got) == take(ref_free, ref_share, want)  # type: ignore[arg-type]
            assert np.array_equal(free, ref_free) and np.array_equal(share, ref_share)
            assert index.total == int(ref_free.sum())
            assert index.max_free() == int(ref_free.max(initial=0))


def test_free_index_switches_to_heaps_and_keeps_rack_totals() -> None:
    free, share, rack, n_racks = _cluster(3, 64, 8, 8)
    index = FreeIndex(free, share, rack, n_racks)
    for _ in range(FreeIndex.BUCKETS_AFTER + 5):
        alloc = index.place("topology", 1.0, 1)
        assert alloc is not None
        index.take(alloc)
    assert index._heaps is not None
    assert np.array_equal(
        index.rack_free, np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64)
    )


def test_free_index_first_fit_lists_place_like_place_through_a_long_pass() -> None:
    # Past LISTS_AFTER placements first fit reads per-count node heaps: the same GPUs as the vector scan.
    free, share, rack, n_racks = _cluster(11, 48, 8, 4)
    ref_free, ref_share = free.copy(), share.copy()
    index = FreeIndex(free, share, rack, n_racks)
    requests = [0.25, 1, 0.5, 2, 1, 0.75, 4, 1, 3, 0.5, 8, 12] * 12
    for gpus in requests:
        max_nodes = max(1, int(np.ceil(gpus / 8)))
        want = place("first-fit", ref_free, ref_share, rack, n_racks, float(gpus), max_nodes)
        got = index.place("first-fit", float(gpus), max_nodes)
        assert got == want
        if want is not None:
            assert index.take(got) == take(ref_free, ref_share, want)  # type: ignore[arg-type]
        assert index.max_free() == int(ref_free.max(initial=0))
    assert index._free_l == ref_free.tolist()  # the lists were built and kept current
