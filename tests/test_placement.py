"""Placement: gang jobs, first-fit vs topology, fractional GPUs, and the cluster's bookkeeping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy.placement import _top_sum, fits_empty, gang_size, max_nodes_for, place, placeable, take
from headway.policy.snapshot import Allocation
from headway.sim.cluster import Cluster, ClusterSpec, ClusterSpecError, NodeSpec


def arrays(
    free: list[int], gpn: int = 8, racks: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    f = np.array(free, dtype=np.int64)
    share = np.where(np.arange(gpn)[None, :] < f[:, None], 1000, 0).astype(np.int64)
    rack = np.array(racks if racks is not None else [0] * len(free), dtype=np.int64)
    return f, share, rack, int(rack.max()) + 1


def test_gang_size_rounds_whole_gpus_up_and_keeps_fractions_as_shares() -> None:
    assert gang_size(0.25) == (0, 250)
    assert gang_size(1.0) == (1, 0)
    assert gang_size(1.5) == (2, 0)
    assert gang_size(0.0) == (0, 0)
    assert max_nodes_for(16, 1, 8) == 2
    assert max_nodes_for(4, 1, 8) == 1
    assert max_nodes_for(4, 3, 8) == 3


def test_topology_takes_the_tightest_node_first_fit_the_first() -> None:
    free, share, rack, nr = arrays([8, 3, 2, 8])
    assert place("first-fit", free, share, rack, nr, 2, 1) == Allocation((0,), (2,))
    assert place("topology", free, share, rack, nr, 2, 1) == Allocation((2,), (2,))
    assert place("topology", free, share, rack, nr, 3, 1) == Allocation((1,), (3,))


def test_a_single_node_gang_is_not_split_across_nodes() -> None:
    free, share, rack, nr = arrays([4, 4])
    assert place("topology", free, share, rack, nr, 8, 1) is None
    assert place("first-fit", free, share, rack, nr, 8, 1) is None
    assert not placeable(free, share, 8, 1)
    assert placeable(free, share, 8, 2)


def test_topology_keeps_a_multi_node_gang_inside_one_rack() -> None:
    # rack 0: nodes 0,1 (8 free each); rack 1: nodes 2,3 (8 free each) plus node 4 partially used.
    free, share, rack, nr = arrays([8, 2, 8, 8, 6], racks=[0, 0, 1, 1, 1])
    a = place("topology", free, share, rack, nr, 16, 2)
    assert a is not None and sorted(a.nodes) == [2, 3] and sum(a.counts) == 16
    ff = place("first-fit", free, share, rack, nr, 16, 3)
    assert ff is not None and sum(ff.counts) == 16
    assert {int(rack[n]) for n in ff.nodes} == {0, 1}  # first-fit walks node order across racks


def test_fractional_jobs_pack_onto_the_fullest_gpu_that_fits_under_topology() -> None:
    free, share, rack, nr = arrays([2, 2], gpn=2)
    share[0, 0] = 300  # partly used GPU
    free[0] = 1
    share[1, 1] = 600
    free[1] = 1
    topo = place("topology", free, share, rack, nr, 0.25, 1)
    assert topo is not None and (topo.nodes[0], topo.frac_gpu) == (0, 0)
    ff = place("first-fit", free, share, rack, nr, 0.5, 1)
    assert ff is not None and (ff.nodes[0], ff.frac_gpu) == (0, 1)  # first GPU with 0.5 free
    assert place("topology", free, share, rack, nr, 0.5, 1) == Allocation((1,), (0,), 1, 500)


def test_first_fit_takes_nodes_in_order_unless_that_spans_too_many_then_the_fullest() -> None:
    free, share, rack, nr = arrays([1, 3, 1, 8, 8])
    assert place("first-fit", free, share, rack, nr, 5, 3) == Allocation((3,), (5,))  # one node holds it
    assert place("first-fit", free, share, rack, nr, 9, 4) == Allocation((0, 1, 2, 3), (1, 3, 1, 4))
    assert place("first-fit", free, share, rack, nr, 9, 3) == Allocation((3, 4), (8, 1))
    assert place("first-fit", free, share, rack, nr, 16, 2) == Allocation((3, 4), (8, 8))
    assert place("first-fit", free, share, rack, nr, 20, 2) is None
    assert place("first-fit", free, share, rack, nr, 19, 3) == Allocation((3, 4, 1), (8, 8, 3))
    assert place("first-fit", free, share, rack, nr, 20, 3) is None  # 21 free, but on 5 nodes


def test_a_share_among_equally_free_gpus_goes_to_the_node_with_fewest_whole_free_gpus() -> None:
    free, share, rack, nr = arrays([3, 1, 2], gpn=4, racks=[0, 1, 1])
    share[0, 3] = share[1, 2] = share[2, 3] = 400  # three GPUs with 0.4 free
    topo = place("topology", free, share, rack, nr, 0.25, 1)
    assert topo == Allocation((1,), (0,), 2, 250)  # node 1: one whole free GPU, the fewest
    assert place("first-fit", free, share, rack, nr, 0.25, 1) == Allocation((0,), (0,), 0, 250)
    # no partial GPU fits: a whole one on the node with the fewest, then the tightest rack
    assert place("topology", free, share, rack, nr, 0.5, 1) == Allocation((1,), (0,), 0, 500)


def test_take_updates_whole_free_counts_and_shares_consistently() -> None:
    free, share, _rack, _nr = arrays([4, 4], gpn=4)
    used = take(free, share, Allocation((0,), (3,)))
    assert len(used) == 3 and free.tolist() == [1, 4]
    take(free, share, Allocation((1,), (0,), 2, 400))
    assert free.tolist() == [1, 3] and share[1, 2] == 600


def test_cluster_allocate_and_release_round_trip_keeps_invariants() -> None:
    c = Cluster(ClusterSpec.from_flags(3, 4, 2))
    a = c.allocate(Allocation((0, 1), (4, 2)), holder=0)
    b = c.allocate(Allocation((2,), (0,), 0, 250), holder=1)
    c.validate()
    assert c.busy == pytest.approx(6.25) and c.free.tolist() == [0, 2, 3]
    assert (c.owner[0] == 0).all()
    c.move_holder(a, 5)
    assert (c.owner[0] == 5).all()
    c.release(a, 0)
    c.release(b, 250)
    c.validate()
    assert c.busy == pytest.approx(0.0) and c.free.tolist() == [4, 4, 4]


def test_fits_empty_respects_node_sizes() -> None:
    ng = np.array([2, 2, 8], dtype=np.int64)
    assert fits_empty(ng, 8, 1)
    assert not fits_empty(ng, 9, 1)
    assert fits_empty(ng, 12, 3)


def test_cluster_from_flags_racks_consecutive_nodes() -> None:
    spec = ClusterSpec.from_flags(10, 8, 4)
    assert spec.capacity_gpus == 80 and spec.n_racks == 3
    assert [n.rack for n in spec.nodes][:5] == [0, 0, 0, 0, 1]
    with pytest.raises(ClusterSpecError):
        ClusterSpec.from_flags(0, 8)


def test_cluster_from_toml_groups_and_named_racks(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text(
        'nodes_per_rack = 2\n[[nodes]]\ncount = 3\ngpus = 8\nmodel = "A100"\n'
        '[[nodes]]\ncount = 2\ngpus = 4\nrack = "edge"\n'
    )
    spec = ClusterSpec.from_toml(f)
    assert [n.gpus for n in spec.nodes] == [8, 8, 8, 4, 4]
    assert [n.rack for n in spec.nodes] == [0, 0, 1, 2, 2]
    assert spec.nodes[0].model == "A100"
    bad = tmp_path / "bad.toml"
    bad.write_text("[[nodes]]\ncount = 2\n")
    with pytest.raises(ClusterSpecError, match="gpus"):
        ClusterSpec.from_toml(bad)


@pytest.mark.parametrize("model", ["100", "true", '["A100"]', "{ kind = 'A100' }"])
def test_a_toml_gpu_model_that_is_not_a_string_is_a_cluster_error(tmp_path: Path, model: str) -> None:
    """Was accepted by plain Python and a TypeError traceback from the compiled NodeSpec."""
    f = tmp_path / "c.toml"
    f.write_text(f"[[nodes]]\ncount = 2\ngpus = 8\nmodel = {model}\n")
    with pytest.raises(ClusterSpecError, match=r"\[\[nodes\]\] #1: model must be a string"):
        ClusterSpec.from_toml(f)


@pytest.mark.shared
def test_cluster_from_the_alibaba_node_list(shared_traces: Path) -> None:
    spec = ClusterSpec.from_alibaba(shared_traces / "alibaba-fgd-2023" / "openb_node_list_gpu_node.csv")
    assert len(spec.nodes) == 1213
    assert spec.capacity_gpus == sum(n.gpus for n in spec.nodes) and spec.max_node_gpus == 8


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(4, 8), (8, 8), (4, 80)]))
def test_the_cluster_takes_and_gives_back_the_gpus_placement_take_would(
    seed: int, shape: tuple[int, int]
) -> None:
    """`Cluster.allocate` writes GPUs through its own flat views; it must pick exactly the GPUs of
    `placement.take` on the same arrays, and `release` must restore what was there."""
    n_nodes, g = shape
    rng = np.random.default_rng(seed)
    spec = ClusterSpec(tuple(NodeSpec(f"n{i}", int(rng.integers(1, g + 1)), i // 2) for i in range(n_nodes)))
    c = Cluster(spec)
    held: list[tuple[list[tuple[int, int]], int]] = []
    for step in range(80):
        if held and rng.random() < 0.4:
            used, frac = held.pop(int(rng.integers(len(held))))
            c.release(used, frac)
        else:
            free_whole = [n for n in range(n_nodes) if c.free[n] > 0]
            if not free_whole:
                continue
            if rng.random() < 0.2:  # a fractional job on a GPU with enough share left
                n = int(rng.choice(free_whole))
                gi = int(np.flatnonzero(c.share[n] >= 250)[0])
                alloc = Allocation((n,), (0,), gi, 250)
            else:
                picked = rng.choice(
                    free_whole, size=min(len(free_whole), int(rng.integers(1, 4))), replace=False
                )
                nodes = tuple(sorted(int(n) for n in picked))
                alloc = Allocation(nodes, tuple(int(rng.integers(1, c.free[n] + 1)) for n in nodes))
            free0, share0 = c.free.copy(), c.share.copy()
            want = take(free0, share0, alloc)
            got = c.allocate(alloc, step)
            assert got == want
            np.testing.assert_array_equal(c.free, free0)
            np.testing.assert_array_equal(c.share, share0)
            held.append((got, alloc.frac_milli))
        c.validate()
    for used, frac in held:
        c.release(used, frac)
    assert c.busy == 0 and (c.owner[c.owner != -2] == -1).all()
    np.testing.assert_array_equal(c.free, [n.gpus for n in spec.nodes])


@given(
    st.lists(st.integers(0, 16), min_size=1, max_size=40),
    st.data(),
    st.integers(1, 9),
)
def test_the_k_largest_free_counts_of_a_rack_sum_as_sorting_them_would(
    free: list[int], data: st.DataObject, k: int
) -> None:
    mem = data.draw(st.lists(st.integers(0, len(free) - 1), max_size=20, unique=True))
    assert _top_sum(free, mem, k) == sum(sorted((free[n] for n in mem), reverse=True)[:k])
