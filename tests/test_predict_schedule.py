"""The retraining schedule: when the online predictor refits, and that drift brings a refit forward."""

from __future__ import annotations

import math

import pytest

from headway.predict.api import EndedJob, SubmittedJob
from headway.predict.model import TrainConfig
from headway.predict.online import OnlinePredictor
from headway.predict.schedule import DAY, HOUR, RetrainSchedule, Served


def test_no_model_before_enough_jobs_ended_then_a_first_fit_at_once() -> None:
    s = RetrainSchedule(min_train=200, min_new=50)
    assert not s.due(0.0, ended=199, new=199, trained=0, last_fit=None)
    assert s.due(0.0, ended=200, new=200, trained=0, last_fit=None)


def test_growth_is_a_share_of_the_last_fits_rows() -> None:
    s = RetrainSchedule(growth=0.1, min_new=50)
    t = 10 * DAY
    assert not s.due(t, ended=10_900, new=999, trained=10_000, last_fit=t - DAY)
    assert s.due(t, ended=11_000, new=1_000, trained=10_000, last_fit=t - DAY)
    # a short history refits after few ends (but never fewer than min_new)
    assert not s.due(t, ended=249, new=49, trained=200, last_fit=t - DAY)
    assert s.due(t, ended=250, new=50, trained=200, last_fit=t - DAY)


def test_the_floor_holds_back_every_reason_and_the_ceiling_forces_one() -> None:
    s = RetrainSchedule(growth=0.1, floor_s=HOUR, ceiling_s=30 * DAY, drift_z=3.0)
    t = 100 * DAY
    assert not s.due(t, ended=20_000, new=10_000, trained=10_000, last_fit=t - 0.5 * HOUR, drift=9.0)
    assert not s.due(t, ended=10_100, new=100, trained=10_000, last_fit=t - 29 * DAY)
    assert s.due(t, ended=10_100, new=100, trained=10_000, last_fit=t - 30 * DAY)
    assert not s.due(t, ended=10_100, new=49, trained=10_000, last_fit=t - 60 * DAY)  # too few new ends
    assert s.due(t, ended=10_100, new=100, trained=10_000, last_fit=t - DAY, drift=-3.0)
    assert not s.due(t, ended=10_100, new=100, trained=10_000, last_fit=t - DAY, drift=2.9)


def test_served_drift_is_a_z_score_of_completions_against_their_expected_count() -> None:
    d = Served()
    assert d.z() == 0.0
    for k in range(100):
        d.add(0.5, k < 80)  # 80 completions where 50 were expected, sd 5
    assert d.z() == pytest.approx(6.0)
    calibrated = Served()
    for k in range(100):
        calibrated.add(0.8, k % 5 != 0)
    assert calibrated.z() == pytest.approx(0.0)


def _job(i: int, t: float) -> SubmittedJob:
    return SubmittedJob(str(i), f"u{i % 5}", "g", f"n{i % 4}", None, None, t, 1.0, 1, None)


def test_a_drop_in_the_success_rate_brings_the_next_fit_forward() -> None:
    """Growth alone would wait for 1,000 more ends; the outcomes of the jobs the model predicted, far
    below its P(complete), make it refit after a few hundred."""
    sch = RetrainSchedule(growth=1.0, min_train=200, min_new=50, floor_s=0.0, ceiling_s=math.inf)
    p = OnlinePredictor(schedule=sch, config=TrainConfig(rounds=20, quantile_rounds=10))
    fits_at: list[int] = []
    for i in range(1_600):
        t = 600.0 * i
        j = _job(i, t)
        p.predict([j], now=t)
        completed = i % 10 < 8 if i < 1_000 else i % 10 == 0  # 80% complete, then 10%
        p.observe_end(EndedJob(j, t, t + 300.0, "COMPLETED" if completed else "FAILED"))
        if p.maybe_retrain(t + 1.0):
            fits_at.append(i)
    assert fits_at[0] == 200 and fits_at[1] == 400 and fits_at[2] == 800  # growth: the rows doubled
    after = [i for i in fits_at if i >= 1_000]
    assert after and after[0] < 1_100  # the drop was seen within a hundred ends, not after 800


def test_evaluating_the_schedule_fits_only_on_jobs_ended_before_the_jobs_it_serves() -> None:
    import numpy as np

    from headway.predict.evaluate import scheduled_predictions, split
    from headway.predict.features import build_features
    from headway.predict.synthetic import make_history

    frame = build_features(make_history(3000, seed=4, users=12, days=20))
    _, test = split(frame, 0.3)
    sch = RetrainSchedule(growth=0.05, min_new=20, floor_s=0.0)
    pred, metas = scheduled_predictions(frame, test, TrainConfig(rounds=20, quantile_rounds=10), sch)
    assert len(pred) == len(test) and len(metas) >= 2
    assert np.all((pred.p_success > 0) & (pred.p_success < 1))
    assert metas[0]["served_from"] == frame.submit[test[0]]
    for meta in metas:  # each fit's newest end precedes the first job it served
        assert meta["trained_until"] < meta["served_from"]
    served_from = [m["served_from"] for m in metas]
    assert served_from == sorted(served_from) and len(set(served_from)) == len(metas)
