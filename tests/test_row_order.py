"""A replay and the predictor's features depend on the jobs, not on the order of the rows they came in."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.sim.cluster import ClusterSpec
from headway.sim.metrics import compute
from headway.sim.run import prepare, run_simulation
from headway.sim.synth import generate


def _with_ties(n: int) -> pa.Table:
    """A synthetic trace whose submit times are cut to the minute, so many jobs share one."""
    t = generate(n, seed=5)
    us = pc.cast(t.column("submit_time"), pa.int64())
    minute = pc.multiply(pc.divide(us, 60_000_000), 60_000_000)
    col = pc.cast(minute, t.schema.field("submit_time").type)
    return t.set_column(t.schema.get_field_index("submit_time"), "submit_time", col)


def test_shuffled_rows_give_the_same_order_and_the_same_replay() -> None:
    t = _with_ties(600)
    spec = ClusterSpec.from_flags(4, 8, 2)
    shuffled = t.take(pa.array(np.random.default_rng(3).permutation(t.num_rows)))
    a, b = prepare(t, spec, load=1.0)[0], prepare(shuffled, spec, load=1.0)[0]
    assert list(a.job_id) == list(b.job_id)
    assert len(a.submit) - len(set(np.asarray(a.submit).tolist())) > 50  # the trace really has ties
    for policy in ("fifo", "multifactor"):
        ra = compute(run_simulation(t, spec, policy=policy, load=1.0))
        rb = compute(run_simulation(shuffled, spec, policy=policy, load=1.0))
        ra.pop("sim_wall_seconds"), rb.pop("sim_wall_seconds")
        assert ra == rb


def test_jobs_of_one_second_go_in_the_schedulers_numbering_not_as_text() -> None:
    from headway.schema import natural_key as _natural

    ids = ["app_17_10000", "app_17_9999", "app_9_5", "123_10", "123_9", "124"]
    assert sorted(ids, key=_natural) == ["123_9", "123_10", "124", "app_9_5", "app_17_9999", "app_17_10000"]


def test_features_of_shuffled_rows_are_the_same_rows_in_the_same_order() -> None:
    from headway.predict.features import build_features

    t = _with_ties(600)
    shuffled = t.take(pa.array(np.random.default_rng(4).permutation(t.num_rows)))
    a, b = build_features(t), build_features(shuffled)
    assert list(a.job_id) == list(b.job_id)
    np.testing.assert_array_equal(a.X, b.X)  # "submissions in the last hour" counts the tied jobs alike
