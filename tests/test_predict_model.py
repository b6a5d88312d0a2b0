"""The models: better than the baseline on learnable data, saved and loaded intact, safe fallbacks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from headway.predict import model as model_module
from headway.predict.evaluate import auc, brier, ece, evaluate, runtime_profile, split
from headway.predict.features import FeatureFrame, build_features
from headway.predict.model import (
    _TREE,
    PREDICT_THREADS,
    SHRINK_GRID,
    Calibration,
    ModelFileError,
    Predictor,
    TrainConfig,
    _best_shrink,
    _corrections,
    fallback_predictions,
    tree_input,
)
from headway.predict.synthetic import make_history

FAST = TrainConfig(rounds=60, quantile_rounds=40, early_stopping=10)


@pytest.fixture(scope="module")
def frame():  # type: ignore[no-untyped-def]
    return build_features(make_history(6_000, seed=11, users=30, days=12))


def test_metrics_agree_with_definitions() -> None:
    y = np.array([True, False, True, False])
    assert auc(y, np.array([0.9, 0.1, 0.8, 0.2])) == 1.0
    assert auc(y, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
    assert brier(y, np.array([1.0, 0.0, 0.5, 0.5])) == pytest.approx(0.125)
    # all predictions 0.7 in one bin, observed 0.5: ECE 0.2
    assert ece(y, np.full(4, 0.7)) == pytest.approx(0.2)
    prof = runtime_profile(np.array([100.0, 150.0, 1000.0]), np.array([100.0, 100.0, 100.0]))
    assert prof["within_10pct"] == pytest.approx(1 / 3)
    assert prof["within_50pct"] == pytest.approx(2 / 3)
    assert prof["within_10x"] == pytest.approx(1.0)


def test_temporal_split_trains_only_on_jobs_ended_before_the_test_period(frame) -> None:  # type: ignore[no-untyped-def]
    train, test = split(frame, 0.3)
    first_test_submit = frame.submit[test[0]]
    assert (frame.end[train] < first_test_submit).all()
    assert (frame.submit[test] >= first_test_submit).all()
    assert len(test) == round(frame.ended.sum() * 0.3)


def test_model_beats_the_per_user_baseline_on_learnable_history(frame) -> None:  # type: ignore[no-untyped-def]
    r = evaluate(frame, 0.3, FAST)
    assert r["auc"] > r["baseline"]["auc"] + 0.02
    assert r["brier"] < r["baseline"]["brier"]
    assert r["runtime"]["within_50pct"] > r["baseline"]["runtime"]["within_50pct"]
    # the median runtime is the recent-runs median (no tree corrections by default); p90 and ttf are trees
    assert set(r["model"]["models"]) == {"p_success", "runtime_q90", "ttf_q50"}
    assert r["retrain"] == "daily" and r["other_mode"]["retrain"] == "none"


def test_runtime_trees_can_be_switched_on_and_a_useless_correction_is_shrunk_away(frame) -> None:  # type: ignore[no-untyped-def]
    model = Predictor.fit(frame, config=replace(FAST, runtime_trees=True))
    assert "runtime_q50" in model.boosters and model.meta["shrink"]["runtime_q50"] in SHRINK_GRID
    rng = np.random.default_rng(1)
    target = rng.normal(0.0, 1.0, 500)
    assert _best_shrink(target, rng.normal(0.0, 1.0, 500), target, 0.5) == 0.0  # noise: keep none of it
    assert _best_shrink(np.zeros(500), target, target, 0.5) == 1.0  # the exact correction: keep all


def test_recency_weights_let_the_calibration_follow_a_drifting_success_rate() -> None:
    rng = np.random.default_rng(4)
    p = rng.uniform(0.3, 0.7, 4000)
    y = np.concatenate([rng.random(2000) < 0.8, rng.random(2000) < 0.2])  # the rate falls halfway
    age_days = np.linspace(20.0, 0.0, 4000)
    weight = 0.5 ** (age_days / 3.0)
    recent = Calibration.fit("platt", p, y, weight).apply(np.array([0.5]))[0]
    flat = Calibration.fit("platt", p, y).apply(np.array([0.5]))[0]
    assert recent < 0.3 < 0.4 < flat


def test_saved_model_loads_and_predicts_identically(frame, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = Predictor.fit(frame, config=FAST)
    path = tmp_path / "m.json"
    model.save(path)
    again = Predictor.load(path)
    a, b = model.predict_frame(frame), again.predict_frame(frame)
    for field in ("p_success", "runtime", "runtime_p90", "time_to_failure"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), rtol=1e-9)
    assert (a.runtime_p90 >= a.runtime).all()
    cap = np.nan_to_num(frame.time_limit, nan=np.inf)
    assert (a.runtime <= cap).all() and (a.time_to_failure <= cap).all()
    assert ((a.p_success > 0) & (a.p_success < 1)).all()


def test_training_is_deterministic(frame) -> None:  # type: ignore[no-untyped-def]
    rows = np.flatnonzero(frame.ended)[:3000]
    a = Predictor.fit(frame, rows, FAST).predict_frame(frame)
    b = Predictor.fit(frame, rows, FAST).predict_frame(frame)
    np.testing.assert_array_equal(a.p_success, b.p_success)


def test_models_trained_side_by_side_are_the_ones_trained_one_by_one(frame) -> None:  # type: ignore[no-untyped-def]
    rows = np.flatnonzero(frame.ended)[:3000]
    side = Predictor.fit(frame, rows, FAST)
    alone = Predictor.fit(frame, rows, replace(FAST, parallel=False))
    assert sorted(side.boosters) == sorted(alone.boosters) and len(side.boosters) >= 3
    for key, booster in side.boosters.items():
        assert booster.model_to_string() == alone.boosters[key].model_to_string()
    assert side.calibration == alone.calibration and side.meta["shrink"] == alone.meta["shrink"]
    a, b = side.predict_frame(frame), alone.predict_frame(frame)
    for field in ("p_success", "runtime", "runtime_p90", "time_to_failure"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_a_large_batch_predicts_the_same_numbers_with_its_boosters_side_by_side(
    frame: FeatureFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boosters of a batch of PARALLEL_ROWS rows or more run on a thread each: every number must be
    bit for bit the one of the boosters run one after another (with OpenMP threads, as before)."""
    model = Predictor.fit(frame, np.flatnonzero(frame.ended)[:3000], FAST)
    assert len(model.boosters) >= 3 and len(frame) >= model_module.PARALLEL_ROWS
    Xd = model.design(frame.X, frame.cats)
    Xt = tree_input(Xd)
    assert Xt.flags["C_CONTIGUOUS"] and Xt.tobytes() == np.ascontiguousarray(Xd[:, _TREE]).tobytes()
    side = _corrections(model.boosters, Xt)
    for key, booster in model.boosters.items():
        for threads in (1, PREDICT_THREADS):
            alone = booster.predict(Xt, raw_score=True, num_threads=threads)
            assert side[key].tobytes() == alone.tobytes()
    fast = model.predict_design(Xd, frame.time_limit)
    monkeypatch.setattr(model_module, "PARALLEL_ROWS", len(frame) + 1)  # one after another
    slow = model.predict_design(Xd, frame.time_limit)
    for field in ("p_success", "runtime", "runtime_p90", "time_to_failure"):
        assert getattr(fast, field).tobytes() == getattr(slow, field).tobytes()


def test_bad_model_files_give_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no model file"):
        Predictor.load(tmp_path / "missing.json")
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    with pytest.raises(ModelFileError, match="not a headway model file"):
        Predictor.load(junk)
    other = tmp_path / "other.json"
    other.write_text('{"format": "headway-predictor", "version": 99}')
    with pytest.raises(ModelFileError, match="version 99"):
        Predictor.load(other)


def test_too_little_history_falls_back_to_running_rates_and_medians() -> None:
    small = build_features(make_history(60, seed=2, users=3, days=2))
    model = Predictor.fit(small, config=TrainConfig(min_rows=100))
    assert model.boosters == {}
    p = model.predict_frame(small)
    fb = fallback_predictions(small.X, small.time_limit)
    np.testing.assert_allclose(p.runtime, fb.runtime, rtol=1e-12)
    np.testing.assert_allclose(p.p_success, np.clip(fb.p_success, 0.001, 0.999))
    # a job with no history at all gets the prior and a time-limit based runtime
    assert np.isfinite(p.runtime).all() and (p.runtime > 0).all()


def test_calibration_maps_monotonically_and_fixes_a_biased_score() -> None:
    rng = np.random.default_rng(0)
    true_p = rng.uniform(0, 1, 20_000)
    y = rng.random(20_000) < true_p
    logit = np.log(true_p / (1 - true_p))
    biased = 1 / (1 + np.exp(-(2.0 * logit - 1.5)))  # overconfident and too pessimistic
    for kind in ("isotonic", "platt"):
        cal = Calibration.fit(kind, biased, y)
        out = cal.apply(np.sort(biased))
        assert (np.diff(out) >= -1e-12).all()
        assert ece(y, cal.apply(biased)) < 0.02 < ece(y, biased)


def test_a_history_of_many_months_still_trains_trees() -> None:
    """With a calibration slice of weeks, every fit row weighed 2^-(days / 3) < 1e-6: LightGBM's absolute
    hessian floor let no split through, and a year of history gave one empty tree per model."""
    long = build_features(make_history(12_000, seed=5, users=40, days=240))
    model = Predictor.fit(long, config=FAST)
    trees = {k: b.num_trees() for k, b in model.boosters.items()}
    assert trees and min(trees.values()) > 1, trees


def test_calibration_never_reverses_the_models_order() -> None:
    """A slice where the model ranks backwards (no signal, a small store) fits a negative slope: that
    would turn every probability around, so the model's own numbers are kept instead."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0.2, 0.8, 400)
    y = rng.random(400) < (1.0 - p)  # the lower the score, the likelier the success
    cal = Calibration.fit("platt", p, y)
    assert cal.kind == "identity"
    assert (np.diff(cal.apply(np.sort(p))) >= 0).all()


def test_a_model_file_with_a_calibration_that_is_not_numbers_is_refused(tmp_path: Path) -> None:
    import json

    model = Predictor.fit(build_features(make_history(2_000, seed=3, users=10, days=6)), config=FAST)
    path = tmp_path / "m.json"
    model.save(path)
    doc = json.loads(path.read_text())
    doc["calibration"] = {"kind": "platt", "a": "x", "b": 0.0}
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match="damaged model file"):
        Predictor.load(path)


@pytest.mark.parametrize(
    ("part", "value", "why"),
    [
        ("vocab", None, "vocab and meta must be objects"),
        ("vocab", {"partition": [1, 2]}, "vocab: every category must list words"),
        ("calibration", {"kind": "isotonic", "x": [0.5, 0.1], "y": [0.2, 0.4]}, "not in increasing order"),
        ("calibration", {"kind": "isotonic", "x": [], "y": []}, "isotonic thresholds empty"),
    ],
)
def test_a_damaged_model_file_is_named_with_what_is_wrong(
    tmp_path: Path, part: str, value: object, why: str
) -> None:
    """`"vocab": null` was an AttributeError traceback; unsorted thresholds read as "not a number"."""
    import json

    model = Predictor.fit(build_features(make_history(2_000, seed=3, users=10, days=6)), config=FAST)
    path = tmp_path / "m.json"
    model.save(path)
    doc = json.loads(path.read_text())
    doc[part] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match=f"damaged model file.*{why}"):
        Predictor.load(path)


@pytest.mark.parametrize(
    ("part", "key", "value", "why"),
    [
        ("boosters", None, [], "boosters must be an object"),
        ("boosters", "p_success", 5, "not a LightGBM model text"),
        ("boosters", "bogus", "tree", "unknown model 'bogus'"),
        ("meta", "shrink", [1], "shrink must be an object"),
        ("meta", "shrink", {"runtime_q90": "x"}, "not a finite number"),
        ("meta", "runtime_start", "bogus", "unknown runtime start"),
        ("meta", "prior", "bogus", "unknown prior"),
        ("meta", "sources", 5, "sources must list names"),
    ],
)
def test_a_model_file_with_damaged_boosters_or_summary_is_refused_when_loaded(
    tmp_path: Path, part: str, key: str | None, value: object, why: str
) -> None:
    """These loaded and then failed as tracebacks (AttributeError, KeyError) in `predict show` and in
    the local queue's start-up, which only catches ModelFileError; a wrong prior was silently another."""
    import json

    model = Predictor.fit(build_features(make_history(2_000, seed=3, users=10, days=6)), config=FAST)
    path = tmp_path / "m.json"
    model.save(path)
    doc = json.loads(path.read_text())
    if key is None:
        doc[part] = value
    else:
        doc[part][key] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match=f"damaged model file.*{why}"):
        Predictor.load(path)


def test_one_failed_run_does_not_put_a_job_name_as_low_as_one_that_always_fails() -> None:
    """A small queue's history that the model separates perfectly gave Platt an unbounded slope: a name
    with one failed run got p = 0.001, as low as a name that failed forty times in a row. Platt's own
    smoothed targets keep the map finite; the order stays."""
    import datetime as dt

    from headway.predict.api import EndedJob, SubmittedJob
    from headway.predict.online import OnlinePredictor
    from headway.schema import JobRecord, State, records_to_table

    rng = np.random.default_rng(0)
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    recs = []
    for i in range(400):
        t += dt.timedelta(seconds=60)
        r = rng.random()
        if r < 0.8:
            name, st = "true", State.COMPLETED
        elif r < 0.9:
            name, st = "bad", State.FAILED
        else:
            name, st = f"exp{i}", State.COMPLETED if rng.random() < 0.7 else State.FAILED
        end = t + dt.timedelta(seconds=5)
        recs.append(
            JobRecord(
                str(i + 1),
                st,
                "local",
                "root",
                None,
                name,
                submit_time=t,
                start_time=t,
                end_time=end,
                gpus=1.0,
            )
        )
    t += dt.timedelta(seconds=60)
    end = t + dt.timedelta(seconds=5)
    recs.append(
        JobRecord(
            "9999",
            State.FAILED,
            "local",
            "root",
            None,
            "flaky",
            submit_time=t,
            start_time=t,
            end_time=end,
            gpus=1.0,
        )
    )
    frame = build_features(records_to_table(recs))
    model = Predictor.fit(frame)
    assert model.calibration.kind == "platt"
    online = OnlinePredictor(model)
    for k in np.flatnonzero(frame.ended).tolist():
        j = SubmittedJob(
            frame.job_id[k], "root", None, frame.name[k], None, None, float(frame.submit[k]), 1.0, 1, None
        )
        online.observe_end(EndedJob(j, float(frame.start[k]), float(frame.end[k]), frame.state[k]))
    now = float(frame.end.max()) + 10.0
    names = ("flaky", "true", "bad")
    p = dict(
        zip(
            names,
            online.predict(
                [SubmittedJob(f"n-{n}", "root", None, n, None, None, now, 1.0, 1, None) for n in names], now
            ).p_success,
            strict=True,
        )
    )
    assert p["bad"] < p["flaky"] < p["true"]
    assert p["flaky"] > 0.1 and p["bad"] < 0.2, p
