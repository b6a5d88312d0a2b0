"""The online predictor: causal by construction, cold-start fallbacks, periodic retraining."""

from __future__ import annotations

import numpy as np
import pytest

from headway.predict.api import EndedJob, SubmittedJob
from headway.predict.api import OnlinePredictor as OnlineProtocol
from headway.predict.features import build_features
from headway.predict.model import TrainConfig
from headway.predict.online import OnlinePredictor, _hist
from headway.predict.schedule import RetrainSchedule
from headway.predict.synthetic import make_history
from headway.schema import table_to_records


def _job(i: int, t: float, user: str = "u", name: str | None = "n") -> SubmittedJob:
    return SubmittedJob(str(i), user, "g", name, None, None, t, 1.0, 1, 7200.0)


def test_it_satisfies_the_contract_the_simulator_uses() -> None:
    p: OnlineProtocol = OnlinePredictor()
    pred = p.predict([_job(1, 0.0)], now=0.0)
    assert len(pred) == 1 and 0 < pred.p_success[0] < 1
    assert pred.runtime[0] <= 7200.0


def test_an_end_is_invisible_until_the_clock_passes_it() -> None:
    p = OnlinePredictor()
    p.observe_end(EndedJob(_job(1, 0.0), 0.0, 100.0, "FAILED"))
    at_end = p.predict([_job(2, 100.0)], now=100.0)
    assert p.state.ended == 0  # ended at 100, asked at 100: not strictly before
    later = p.predict([_job(3, 101.0)], now=101.0)
    assert p.state.ended == 1
    assert later.p_success[0] < at_end.p_success[0]  # the user's failure now counts


def test_a_pending_job_keeps_the_features_it_was_first_served() -> None:
    p = OnlinePredictor()
    first = p.predict([_job(1, 0.0)], now=0.0)
    p.observe_end(EndedJob(_job(9, 0.0), 0.0, 5.0, "FAILED"))
    again = p.predict([_job(1, 0.0)], now=10.0)
    np.testing.assert_array_equal(first.p_success, again.p_success)


def test_cold_start_uses_the_running_median_runtime() -> None:
    p = OnlinePredictor()
    for i, rt in enumerate((1000.0, 2000.0, 3000.0)):
        p.observe_end(EndedJob(_job(i, 0.0), 0.0, rt, "COMPLETED"))
    pred = p.predict([_job(10, 5000.0)], now=5000.0)
    assert pred.runtime[0] == pytest.approx(2000.0)


def test_replaying_a_history_matches_batch_features_and_retrains_as_it_grows() -> None:
    t = make_history(1500, seed=5, users=8, days=3)
    frame = build_features(t)
    recs = sorted(table_to_records(t), key=lambda r: r.submit_time)  # type: ignore[arg-type, return-value]
    p = OnlinePredictor(
        schedule=RetrainSchedule(growth=1.0, min_train=400, floor_s=0.0, drift_z=float("inf")),
        config=TrainConfig(rounds=30, quantile_rounds=20),
    )
    events = []
    for r in recs:
        sj = SubmittedJob(
            r.job_id,
            r.user,
            r.group,
            r.name,
            r.partition,
            r.priority_class,
            r.submit_time.timestamp(),  # type: ignore[union-attr]
            r.gpus,
            r.nodes,
            None if r.time_limit is None else float(r.time_limit),
        )
        events.append((sj.submit_time, 0, sj, r))
        events.append((r.end_time.timestamp(), 1, sj, r))  # type: ignore[union-attr]
    events.sort(key=lambda e: (e[0], e[1]))
    served: dict[str, np.ndarray] = {}
    retrains = 0
    for time_, kind, sj, r in events:
        if kind == 0:
            p.predict([sj], now=time_)
            served[sj.job_id] = np.array(_hist(p._rows[sj.job_id], sj.job_id))
            retrains += p.maybe_retrain(time_)
        else:
            p.observe_end(EndedJob(sj, r.start_time.timestamp(), time_, r.state.value))  # type: ignore[union-attr]
    n_hist = len(served[frame.job_id[0]])
    for k, jid in enumerate(frame.job_id.tolist()):
        np.testing.assert_allclose(served[jid], frame.X[k, :n_hist], rtol=1e-12, equal_nan=True)
    assert retrains == p.trainings >= 2
    assert p.model is not None


def test_mark_trained_counts_retraining_from_a_loaded_model() -> None:
    p = OnlinePredictor(schedule=RetrainSchedule(min_train=1, min_new=1, floor_s=0.0))
    for i in range(5):
        p.observe_end(EndedJob(_job(i, 0.0), 0.0, 10.0 + i, "COMPLETED" if i % 2 else "FAILED"))
    p.mark_trained(100.0)
    assert p.state.ended == 5  # the clock moved past every reported end
    assert not p.maybe_retrain(101.0)  # nothing new since the loaded model


def test_a_retraining_sees_the_newest_examples_after_old_ones_are_dropped() -> None:
    def replay(window: int) -> OnlinePredictor:
        p = OnlinePredictor(schedule=RetrainSchedule(window=window))
        for i in range(2500):
            j = SubmittedJob(
                str(i), f"u{i % 7}", "g", f"n{i % 5}", None, None, 10.0 * i, 1.0 + i % 3, 1, None
            )
            p.predict([j], now=j.submit_time)
            p.observe_end(
                EndedJob(j, j.submit_time, j.submit_time + 5.0 + i % 11, ("COMPLETED", "FAILED")[i % 3 == 0])
            )
        p.predict([], now=1e9)
        return p

    trimmed, whole = replay(300), replay(10**6)
    assert len(whole._history) == 2500 and len(trimmed._history) < 2500  # old examples were dropped
    got, want = trimmed._history.frame(300), whole._history.frame(300)
    assert got.job_id.tolist() == [str(i) for i in range(2200, 2500)]
    for f in ("X", "submit", "start", "end", "time_limit", "gpus"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
    for f in ("job_id", "user", "name", "state"):
        assert getattr(got, f).tolist() == getattr(want, f).tolist()
    assert {k: v.tolist() for k, v in got.cats.items()} == {k: v.tolist() for k, v in want.cats.items()}
    assert got.runtime.tolist() == [5.0 + i % 11 for i in range(2200, 2500)]


def test_a_fresh_queue_does_not_give_every_new_job_0_or_100_percent() -> None:
    """The cluster's recent share is a new user's starting point: after 3 ended jobs its raw value (0/3,
    2/2) made every new job 0% or 100%; smoothed toward the all-time rate like every other rate."""
    t = 1_700_000_000.0

    def job(i: int, user: str, name: str) -> SubmittedJob:
        return SubmittedJob(str(i), user, None, name, None, None, t + i, 1.0, 1, None)

    for state, n, low, high in (("FAILED", 3, 0.05, 0.3), ("COMPLETED", 2, 0.6, 0.9)):
        o = OnlinePredictor()
        for i in range(n):
            o.observe_end(EndedJob(job(i, "ann", "x"), t + i, t + i + 1, state))
        p = float(o.predict([job(10, "bob", "y")], t + 10).p_success[0])
        assert low < p < high, (state, p)


def test_jobs_cancelled_before_they_started_are_no_history() -> None:
    """An admin's clean-up of queued jobs is not a run of failures: it leaves every prediction alone."""
    clean, cleaned = OnlinePredictor(), OnlinePredictor()
    t = 1000.0
    for i in range(20):  # the user's record: 20 successes
        for p in (clean, cleaned):
            p.observe_end(EndedJob(_job(i, t, "bob"), t + 10, t + 500.0, "COMPLETED"))
        t += 600.0
    for i in range(450):  # 450 queued jobs of another user, cancelled before any started
        j = _job(1000 + i, t, "ann")
        cleaned.observe_end(EndedJob(j, t + 60, t + 60, "CANCELLED", started=False))
    now = t + 120.0
    probe = [_job(5000, now, "bob"), _job(5001, now, "carol")]
    a, b = clean.predict(probe, now), cleaned.predict(probe, now)
    assert np.allclose(a.p_success, b.p_success)
    # A job that ran and was cancelled is still history.
    ran = OnlinePredictor()
    ran.observe_end(EndedJob(_job(7, 10.0, "bob"), 20.0, 500.0, "CANCELLED"))
    fresh = OnlinePredictor()
    probe2 = [_job(8, 600.0, "bob")]
    assert ran.predict(probe2, 600.0).p_success[0] < fresh.predict(probe2, 600.0).p_success[0]


def test_features_count_no_job_cancelled_before_it_started() -> None:
    import pyarrow as pa

    table = make_history(200, seed=4, users=3, days=2)
    state = np.asarray(table.column("state").to_pylist(), dtype=object)
    start = table.column("start_time")
    never = np.zeros(len(state), dtype=bool)
    never[::7] = True
    table = table.set_column(
        table.schema.get_field_index("state"), "state", pa.array(np.where(never, "CANCELLED", state).tolist())
    )
    table = table.set_column(
        table.schema.get_field_index("start_time"),
        "start_time",
        pa.array([None if n else v for n, v in zip(never, start.to_pylist(), strict=True)], start.type),
    )
    frame = build_features(table)
    by_id = dict(zip(frame.job_id.tolist(), frame.ended.tolist(), strict=True))
    ids = table.column("job_id").to_pylist()
    assert not any(by_id[ids[i]] for i in np.flatnonzero(never))
    assert sum(by_id.values()) == len(ids) - int(never.sum())


def test_a_requeued_jobs_earlier_runs_are_no_history() -> None:
    fresh, runs, preempted = OnlinePredictor(), OnlinePredictor(), OnlinePredictor()
    for i in range(30):  # 30 runs of bob's requeued jobs (ID@START), and 30 jobs that ended preempted
        t = 1000.0 + i * 100
        j = _job(i, t, "bob")
        runs.observe_end(EndedJob(j._replace(job_id=f"{i}@20261130T0000{i:02d}Z"), t, t + 50, "PREEMPTED"))
        preempted.observe_end(EndedJob(j, t, t + 50, "PREEMPTED"))
    probe = [_job(99, 5000.0, "bob")]
    p0, p_runs = fresh.predict(probe, 5000.0), runs.predict(probe, 5000.0)
    assert np.allclose(p0.p_success, p_runs.p_success)
    assert preempted.predict(probe, 5000.0).p_success[0] < p0.p_success[0]
