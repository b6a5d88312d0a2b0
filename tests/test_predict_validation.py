"""Choosing settings without the test jobs: validation folds, noise estimates, and the drift features."""

from __future__ import annotations

import numpy as np
import pytest

from headway.predict.evaluate import (
    block_dependence,
    correlated_ece_floor,
    correlated_labels,
    ece_floor,
    evaluate,
    noise,
    split,
    training_period,
    user_days,
    validation_folds,
)
from headway.predict.features import HISTORY_FEATURES, RollingState, build_features
from headway.predict.model import TrainConfig, fallback_predictions, offsets
from headway.predict.synthetic import make_history

FAST = TrainConfig(rounds=40, quantile_rounds=30, early_stopping=10)


@pytest.fixture(scope="module")
def frame():  # type: ignore[no-untyped-def]
    return build_features(make_history(2_000, seed=21, users=15, days=12))


def test_validation_folds_never_read_the_test_outcomes(frame) -> None:  # type: ignore[no-untyped-def]
    _, test = split(frame, 0.3)
    flipped = frame.take(np.arange(len(frame)))
    flipped.state = flipped.state.copy()
    flipped.state[test] = np.where(flipped.state[test] == "COMPLETED", "FAILED", "COMPLETED")
    a = validation_folds(frame, 0.3, FAST)
    b = validation_folds(flipped, 0.3, FAST)
    assert a == b
    assert [f["fold"] for f in a["folds"]] == ["55%-70%", "70%-85%", "85%-100%"]
    # and the test itself does see them (so the comparison above could have failed)
    assert evaluate(frame, 0.3, FAST, bootstrap=0)["auc"] != evaluate(flipped, 0.3, FAST, bootstrap=0)["auc"]


def test_training_period_hides_outcomes_that_came_after_the_split(frame) -> None:  # type: ignore[no-untyped-def]
    train, test = split(frame, 0.3)
    sub, lab = training_period(frame, 0.3)
    t_split = frame.submit[test[0]]
    assert (sub.submit < t_split).all()
    assert (sub.end[sub.ended] < t_split).all()
    assert len(lab) == len(train)


def test_noise_brackets_the_figures_and_gives_an_ece_floor(frame) -> None:  # type: ignore[no-untyped-def]
    r = evaluate(frame, 0.3, FAST, bootstrap=100)
    nz = r["noise"]
    gain = r["auc"] - r["baseline"]["auc"]
    assert nz["auc_gain"]["p05"] <= gain <= nz["auc_gain"]["p95"]
    assert nz["ece"]["p05"] <= r["ece"] + 0.01
    # a perfectly calibrated model still shows some ECE on a finite test set, shrinking with its size
    assert 0.0 < nz["ece_floor"]["mean"] < 0.1
    tf = frame.take(split(frame, 0.3)[1])
    p = evaluate(frame, 0.3, FAST, bootstrap=0)
    assert "noise" not in p
    small = noise(tf.take(np.arange(200)), _first(r, tf, 200), rounds=100)
    assert small["ece_floor"]["mean"] > nz["ece_floor"]["mean"]


def test_resampling_user_days_widens_the_intervals_when_their_jobs_share_outcomes(frame) -> None:  # type: ignore[no-untyped-def]
    tf = frame.take(split(frame, 0.3)[1])
    block = user_days(tf)
    assert len(np.unique(block)) < len(tf)  # some user submitted several jobs on one day
    # every job of a user-day ends like the day's first job: outcomes fully correlated within a block
    first: dict[int, int] = {}
    for i, b in enumerate(block):
        first.setdefault(int(b), i)
    tied = tf.take(np.arange(len(tf)))
    tied.state = np.array([tf.state[first[int(b)]] for b in block], dtype=object)
    pred = fallback_predictions(tied.X, tied.time_limit)
    nz = noise(tied, pred, rounds=200)
    bl = nz["by_user_day"]
    assert bl["blocks"] == len(first)
    width = {k: nz[k]["p95"] - nz[k]["p05"] for k in ("auc_gain", "ece")}
    block_width = {k: bl[k]["p95"] - bl[k]["p05"] for k in ("auc_gain", "ece")}
    assert block_width["ece"] > width["ece"]
    assert block_width["auc_gain"] > width["auc_gain"]


def _first(r, tf, n):  # type: ignore[no-untyped-def]
    """Some predictions for the first n test jobs (the fallback is enough for the noise floor)."""
    return fallback_predictions(tf.X[:n], tf.time_limit[:n])


def test_the_clusters_recent_rate_counts_its_last_500_ended_jobs() -> None:
    st = RollingState()
    k = HISTORY_FEATURES.index("global_last500")
    assert np.isnan(st.row("u", None, None, 1.0, 0.0)[k])
    for i in range(700):
        st.observe_end("u", None, None, 1.0, float(i), float(i) + 0.5, "COMPLETED" if i < 350 else "FAILED")
    assert st.row("u", None, None, 1.0, 1000.0)[k] == pytest.approx(150 / 500)


def test_recent_prior_starts_a_new_user_at_the_clusters_recent_rate() -> None:
    st = RollingState()
    for i in range(600):  # early successes, then a run of failures: the all-time rate lags behind
        state = "COMPLETED" if i < 300 else "FAILED"
        st.observe_end(f"old{i % 5}", None, None, 1.0, float(i), float(i) + 0.5, state)
    row = np.array([st.row("newcomer", None, None, 1.0, 1000.0)], dtype=np.float64)
    X = np.hstack([row, np.zeros((1, 5))])
    p_all = fallback_predictions(X, np.array([np.nan]), prior="all").p_success[0]
    p_recent = fallback_predictions(X, np.array([np.nan]), prior="recent").p_success[0]
    assert p_all == pytest.approx((300 + 1) / (600 + 2))
    assert p_recent == pytest.approx(200 / 500)  # the last 500 ends: 200 successes, then 300 failures
    off = offsets(X, np.array([np.nan]), prior="recent")["p_success"][0]
    assert off == pytest.approx(np.log(p_recent / (1 - p_recent)))


def test_user_days_keep_users_and_days_apart_and_jobs_without_a_user_alone(frame) -> None:  # type: ignore[no-untyped-def]
    tf = frame.take(np.arange(5))
    tf.user = np.array(["u1", "u", None, "u1", None], dtype=object)
    tf.submit = np.array([9.0, 19.0, 0.0, 9.5, 0.0]) * 86400.0  # "u1" + "9" reads like "u" + "19"
    block = user_days(tf).tolist()
    assert block[0] == block[3]  # one user, one day
    assert len({block[0], block[1], block[2], block[4]}) == 4


def test_validation_of_a_history_with_one_outcome_warns_nothing_and_leaves_the_auc_mean_undefined() -> None:
    """Every fold's AUC is NaN when every job completed: the mean printed numpy's "RuntimeWarning: Mean of
    empty slice" under `headway predict validate`'s table."""
    import math
    import warnings

    import pyarrow as pa

    t = make_history(600, seed=4, users=5, days=4)
    t = t.set_column(t.schema.get_field_index("state"), "state", pa.array(["COMPLETED"] * t.num_rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = validation_folds(build_features(t), 0.3, FAST)
    assert math.isnan(r["mean"]["auc_gain"]) and math.isfinite(r["mean"]["brier_gain"])


def _blocks(n_blocks: int, size: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.15, 0.85, n_blocks * size), np.repeat(np.arange(n_blocks), size)


def test_correlated_labels_stay_calibrated_and_correlate_within_a_block_as_asked() -> None:
    p, block = _blocks(40, 5)
    rng = np.random.default_rng(0)
    draws = np.array([correlated_labels(p, block, 0.5, rng) for _ in range(4000)], dtype=np.float64)
    # each job succeeds with probability p: the draws are a perfectly calibrated model's outcomes
    assert np.abs(draws.mean(axis=0) - p).max() < 0.03
    same = np.corrcoef(draws[:, 0], draws[:, 1])[0, 1]  # two jobs of block 0
    apart = np.corrcoef(draws[:, 0], draws[:, 5])[0, 1]  # block 0 and block 1
    assert same > 0.25 and abs(apart) < 0.06


def test_block_dependence_recovers_how_outcomes_were_drawn() -> None:
    p, block = _blocks(400, 8)
    rng = np.random.default_rng(1)
    got = {
        w: np.mean(
            [block_dependence(correlated_labels(p, block, w, rng), p, block) for _ in range(20)], axis=0
        )
        for w in (0.0, 0.3, 0.6)
    }
    assert got[0.0][0] < 0.03 and got[0.0][1] < 0.03
    # the weight that drew them comes back (residuals are read against the sample's own reliability
    # curve: close, and low if anything); the pairwise correlation is below it, as p differ in a block
    assert 0.24 < got[0.3][1] < 0.33 and 0.5 < got[0.6][1] < 0.63
    assert 0.1 < got[0.3][0] < got[0.3][1] and got[0.3][0] < got[0.6][0] < got[0.6][1]
    # no block with two jobs (a log without users): nothing to measure
    one = np.arange(len(p))
    assert all(np.isnan(block_dependence(correlated_labels(p, one, 0.0, rng), p, one)))


def test_a_calibrated_models_ece_grows_with_correlated_outcomes() -> None:
    p, block = _blocks(150, 12)
    free = correlated_ece_floor(p, block, 0.0, rounds=200)
    tied = correlated_ece_floor(p, block, 0.5, rounds=200)
    assert free["mean"] == pytest.approx(ece_floor(p, rounds=200), abs=0.004)  # weight 0: the usual floor
    assert tied["mean"] > 1.2 * free["mean"]
    assert tied["p05"] <= tied["mean"] <= tied["p95"]
    assert tied["p95"] > free["p95"]


def test_noise_reports_the_user_day_correlation_and_the_floor_it_sets(frame) -> None:  # type: ignore[no-untyped-def]
    tf = frame.take(split(frame, 0.3)[1])
    pred = fallback_predictions(tf.X, tf.time_limit)
    bl = noise(tf, pred, rounds=50)["by_user_day"]
    assert 0.0 <= bl["correlation"] <= 1.0
    assert set(bl["ece_floor"]) == {"mean", "p05", "p95"}
    alone = tf.take(np.arange(len(tf)))
    alone.user = np.full(len(tf), None, dtype=object)  # no users: every job its own block
    bl = noise(alone, pred, rounds=50)["by_user_day"]
    assert bl["correlation"] is None and bl["ece_floor"] is None
