"""The mode-seeking runtime estimate: it hits at least as often as the median, it is the same number in
the batch features and the online state, and `auto` picks the start that hits most on the latest jobs."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from headway.predict.features import (
    DENSE_WINDOW,
    HISTORY_FEATURES,
    START_ONLY_FEATURES,
    RollingState,
    Window,
    build_features,
    dense_estimate,
)
from headway.predict.model import AUTO_STARTS, TREE_FEATURES, Predictor, TrainConfig, pick_runtime_start
from headway.predict.synthetic import make_history

FAST = TrainConfig(rounds=40, quantile_rounds=30, early_stopping=10)


def _hits(p: float, ys: np.ndarray) -> int:
    """How many runtimes a prediction is within +-50% of (the claim's rule, in seconds)."""
    return int(np.sum(np.abs(p - ys) / ys <= 0.5 + 1e-9))


def test_dense_estimate_sits_on_the_cluster_of_runtimes_not_between_clusters() -> None:
    ys = np.array([60.0, 70.0, 80.0, 3000.0, 3100.0, 3300.0, 3400.0])  # median 3000, mode near 3200
    est = math.exp(dense_estimate([sorted(np.log(ys).tolist())])[0])
    assert _hits(est, ys) == 4
    skewed = np.array([100.0, 110.0, 120.0, 130.0, 5000.0, 9000.0, 20000.0, 50000.0, 90000.0])
    est2 = math.exp(dense_estimate([sorted(np.log(skewed).tolist())])[0])
    assert _hits(est2, skewed) == 4 > _hits(float(np.median(skewed)), skewed)


def test_dense_estimate_hits_at_least_as_often_as_the_window_median() -> None:
    rng = np.random.default_rng(5)
    windows = [np.sort(rng.normal(7.0, 1.5, int(rng.integers(1, 26)))) for _ in range(400)]
    est = dense_estimate([w.tolist() for w in windows])
    for w, e in zip(windows, est.tolist(), strict=True):
        ys = np.exp(w)
        med = ys[int(0.5 * (len(ys) - 1) + 0.5)]  # the rank rule of Window.quantile
        assert _hits(math.exp(e), ys) >= _hits(med, ys)


def test_ties_go_to_the_candidate_closest_to_the_median() -> None:
    one = dense_estimate([[math.log(500.0)]])[0]
    assert one == math.log(500.0)
    far = dense_estimate([[math.log(100.0), math.log(10_000.0)]])[0]  # every candidate hits one
    assert far == math.log(10_000.0)  # the upper middle value is the median by the rank rule
    assert np.isnan(dense_estimate([[]])[0])
    assert dense_estimate([]).shape == (0,)


def test_runtimes_exactly_twice_apart_both_count() -> None:
    est = dense_estimate([sorted([math.log(60.0), math.log(120.0), math.log(90.0)])])[0]
    assert _hits(math.exp(est), np.array([60.0, 90.0, 120.0])) == 3


def test_window_keeps_enough_runtimes_for_the_dense_estimate_while_quantiles_use_their_own() -> None:
    w = Window()
    for v in range(30):
        w.add(float(v), 5, DENSE_WINDOW + 5)
    assert w.sorted == [25.0, 26.0, 27.0, 28.0, 29.0]
    assert list(w.order) == [float(v) for v in range(30 - DENSE_WINDOW - 5, 30)]
    assert w.last_sorted(DENSE_WINDOW) == [float(v) for v in range(30 - DENSE_WINDOW, 30)]


def test_online_dense_column_is_recomputed_only_when_the_key_has_a_new_success() -> None:
    st = RollingState()
    col = HISTORY_FEATURES.index("user_log_runtime_dense")
    for i in range(12):
        st.observe_end("a", None, None, 1.0, 0.0, 100.0 + 10 * i, "COMPLETED")
    first = st.row("a", None, None, 1.0, 1000.0)[col]
    st.observe_end("a", None, None, 1.0, 0.0, 2000.0, "FAILED")  # not a runtime: same estimate
    assert st.row("a", None, None, 1.0, 3000.0)[col] == first
    st.observe_end("a", None, None, 1.0, 0.0, 50_000.0, "COMPLETED")
    assert st.users["a"].dense_ok is False
    st.row("a", None, None, 1.0, 60_000.0)
    assert st.users["a"].dense_ok is True


@pytest.fixture(scope="module")
def frame():  # type: ignore[no-untyped-def]
    return build_features(make_history(4_000, seed=3, users=25, days=10))


def test_auto_picks_the_start_with_the_most_hits_on_the_latest_jobs(frame) -> None:  # type: ignore[no-untyped-def]
    rows = np.flatnonzero(frame.ended)
    start, scores = pick_runtime_start(frame, rows, 0.35)
    assert set(scores) == set(AUTO_STARTS)
    assert scores[start] == max(scores.values())
    model = Predictor.fit(frame, config=FAST)
    assert model.meta["runtime_start"] in AUTO_STARTS
    assert model.meta["runtime_start_scores"][model.meta["runtime_start"]] == max(scores.values())


def test_trees_never_see_the_runtime_start_columns(frame) -> None:  # type: ignore[no-untyped-def]
    model = Predictor.fit(frame, config=replace(FAST, runtime_start="shape_dense"))
    assert all(b.num_feature() == len(TREE_FEATURES) for b in model.boosters.values())
    sub = frame.take(np.arange(len(frame) - 300, len(frame)))
    a = model.predict_frame(sub)
    for name in START_ONLY_FEATURES:
        sub.X[:, list(HISTORY_FEATURES).index(name)] += 1.0  # the estimate moves, nothing else
    b = model.predict_frame(sub)
    np.testing.assert_array_equal(a.p_success, b.p_success)
    np.testing.assert_array_equal(a.time_to_failure, b.time_to_failure)
    moved = ~np.isnan(sub.col("shape_log_runtime_dense"))
    assert (b.runtime[moved] > a.runtime[moved]).any()
    assert (b.runtime_p90 >= b.runtime).all()  # p90 stays at least the point estimate
