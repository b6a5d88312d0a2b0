"""Causal features: hand-worked values, no feature can see the future, and the online path serves the
batch build's rows (one code path, whatever the batches)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from headway.predict import features
from headway.predict.features import HISTORY_FEATURES, FeatureFrame, RollingState, build_features
from headway.predict.synthetic import EPOCH_2024, make_history
from headway.schema import JOB_SCHEMA


def _table(rows: list[dict[str, object]]) -> pa.Table:
    """Jobs from short dicts: times are seconds after EPOCH_2024, None for null."""
    cols: dict[str, list[object]] = {f: [] for f in JOB_SCHEMA.names}
    for i, r in enumerate(rows):
        full = {
            "job_id": str(i),
            "user": "alice",
            "group": "g",
            "name": None,
            "partition": None,
            "priority_class": None,
            "gpus": 1.0,
            "nodes": 1,
            "cpus": None,
            "mem_mb": None,
            "time_limit": None,
            "exit_code": None,
            "source": "t",
            **r,
        }
        for k in ("submit_time", "start_time", "end_time"):
            v = full.get(k)
            full[k] = None if v is None else int((EPOCH_2024 + float(v)) * 1e6)  # type: ignore[arg-type]
        for f in JOB_SCHEMA.names:
            cols[f].append(full.get(f))
    arrays = []
    for f in JOB_SCHEMA:
        if f.name.endswith("_time"):
            arrays.append(pa.array(cols[f.name], pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(cols[f.name], f.type))
    return pa.Table.from_arrays(arrays, schema=JOB_SCHEMA)


def _messy(n: int, seed: int) -> pa.Table:
    """A synthetic history with the awkward cases: null users/names, ties, unstarted and unfinished jobs."""
    t = make_history(n, seed=seed, users=12, days=3)
    rng = np.random.default_rng(seed)
    users = t.column("user").to_pylist()
    names = t.column("name").to_pylist()
    states = t.column("state").to_pylist()
    starts = t.column("start_time").to_pylist()
    submits = t.column("submit_time").to_pylist()
    ends = t.column("end_time").to_pylist()
    for i in range(n):
        u = rng.random()
        if u < 0.05:
            users[i] = None
        elif u < 0.1:
            names[i] = None
        elif u < 0.13:
            states[i], ends[i] = "RUNNING", None
        elif u < 0.15:
            states[i], starts[i] = "CANCELLED", None
        elif u < 0.2 and i > 0:
            submits[i] = ends[i - 1]  # a submission at exactly another job's end
    t = t.set_column(t.schema.get_field_index("user"), "user", pa.array(users, pa.string()))
    t = t.set_column(t.schema.get_field_index("name"), "name", pa.array(names, pa.string()))
    t = t.set_column(t.schema.get_field_index("state"), "state", pa.array(states, pa.string()))
    ts = JOB_SCHEMA.field("submit_time").type
    t = t.set_column(t.schema.get_field_index("start_time"), "start_time", pa.array(starts, ts))
    t = t.set_column(t.schema.get_field_index("end_time"), "end_time", pa.array(ends, ts))
    return t.set_column(t.schema.get_field_index("submit_time"), "submit_time", pa.array(submits, ts))


def _replay_in_batches(f: FeatureFrame, seed: int) -> np.ndarray:
    """History rows of f's jobs as the online path serves them: ends folded in as they happen, each run
    of submissions between two ends read with `RollingState.rows` in batches of random sizes."""
    rng = np.random.default_rng(seed)
    n, er = len(f), np.flatnonzero(f.ended)
    times = np.concatenate([f.submit, f.end[er]])
    kinds = np.concatenate([np.zeros(n, np.int8), np.ones(len(er), np.int8)])
    rows = np.concatenate([np.arange(n), er])
    ev = np.lexsort((rows, kinds, times))  # by time, submissions before ends, then row
    st, out, run = RollingState(), np.full((n, len(HISTORY_FEATURES)), np.nan), []

    def read() -> None:
        while run:
            k = int(rng.integers(1, 40))
            part, run[:k] = run[:k], []
            out[part] = st.rows(
                [f.user[i] for i in part],
                [f.cats["group"][i] for i in part],
                [f.name[i] for i in part],
                [float(f.gpus[i]) for i in part],
                [float(f.submit[i]) for i in part],
            )

    for kind, i in zip(kinds[ev].tolist(), rows[ev].tolist(), strict=True):
        if kind == 0:
            run.append(i)
            continue
        read()
        st.observe_end(f.user[i], f.cats["group"][i], f.name[i], f.gpus[i], f.start[i], f.end[i], f.state[i])
    read()
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_rows_served_online_in_any_batches_are_the_batch_builds_rows(seed: int) -> None:
    """One code path: whatever the batches (and whatever each key's memo or waiting estimate holds across
    them), the online reads give the training rows bit for bit."""
    f = build_features(_messy(3000, seed))
    np.testing.assert_array_equal(_replay_in_batches(f, seed), f.X[:, : len(HISTORY_FEATURES)])


def test_rows_do_not_depend_on_where_the_assembly_chunks_fall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay assembles its rows every _CHUNK jobs; mode-seeking estimates wait across those points."""
    t = _messy(2000, 3)
    whole = build_features(t).X
    monkeypatch.setattr(features, "_CHUNK", 7)
    np.testing.assert_array_equal(build_features(t).X, whole)


def test_keys_a_job_lacks_or_that_have_no_history_yet() -> None:
    """No user, name or group: those columns NaN (a user-less job's rate is the cluster's); a key with no
    ended job yet: 0 jobs, the cluster's rate."""
    t = _table(
        [
            {
                "submit_time": 0,
                "start_time": 0,
                "end_time": 1000,
                "state": "COMPLETED",
                "name": "x",
                "gpus": 2.0,
            },
            {"submit_time": 2000, "user": "bob", "name": None, "group": None},
            {"submit_time": 2000, "name": "x", "gpus": 2},
            {"submit_time": 2000, "user": None, "name": "x"},
        ]
    )
    f = build_features(t)
    prior = (1 + 1) / (1 + 2)
    rate = (1 + 4 * prior) / (1 + 4)
    by_user = {u: k for k, u in enumerate(f.user.tolist()) if k > 0}
    bob, alice, nobody = by_user["bob"], by_user["alice"], by_user[None]

    def col(name: str, k: int) -> float:
        return float(f.col(name)[k])

    assert col("global_success_rate", bob) == pytest.approx(prior)
    assert col("global_last500", bob) == pytest.approx(rate)  # 1 ended job, smoothed toward the prior
    assert (col("user_jobs_ended", bob), col("user_success_rate", bob)) == (0.0, pytest.approx(prior))
    assert col("user_submits_last_hour", bob) == 0.0
    assert all(np.isnan(col(c, bob)) for c in ("name_jobs_ended", "name_success_rate", "group_jobs_ended"))
    assert (col("shape_jobs_ended", bob), col("shape_success_rate", bob)) == (0.0, pytest.approx(prior))
    for c in ("user_jobs_ended", "name_jobs_ended", "group_jobs_ended", "shape_jobs_ended"):
        assert col(c, alice) == 1.0
    for c in ("user_success_rate", "name_success_rate", "group_success_rate", "shape_success_rate"):
        assert col(c, alice) == pytest.approx(rate)
    assert col("user_submits_last_hour", alice) == 1.0  # job 0, 2000 s before
    assert col("user_log_runtime_median", alice) == pytest.approx(np.log(1000))
    assert col("user_log_runtime_dense", alice) == pytest.approx(np.log(1000))
    assert col("shape_log_runtime_dense", alice) == pytest.approx(np.log(1000))
    assert np.isnan(col("user_jobs_ended", nobody)) and np.isnan(col("user_submits_last_hour", nobody))
    assert col("user_success_rate", nobody) == pytest.approx(prior)
    assert np.isnan(col("user_log_runtime_dense", nobody))
    assert (col("name_jobs_ended", nobody), col("group_jobs_ended", nobody)) == (
        0.0,
        1.0,
    )  # (None, "x") is new


def test_a_job_ending_exactly_at_submit_time_is_not_visible() -> None:
    t = _table(
        [
            {"submit_time": 0, "start_time": 0, "end_time": 100, "state": "FAILED"},
            {"submit_time": 100, "start_time": 100, "end_time": 200, "state": "COMPLETED"},
            {"submit_time": 101, "start_time": 101, "end_time": 300, "state": "COMPLETED"},
        ]
    )
    f = build_features(t)
    n = f.col("user_jobs_ended")
    assert n.tolist() == [0.0, 0.0, 1.0]
    assert np.isnan(f.col("user_last1")[1])
    assert f.col("user_last1")[2] == 0.0
    assert f.col("user_fail_streak")[2] == 1.0


def test_history_features_match_a_hand_computation() -> None:
    h = 3600.0
    t = _table(
        [
            {"submit_time": 0, "start_time": 0, "end_time": 1000, "state": "COMPLETED"},
            {"submit_time": 10, "start_time": 10, "end_time": 2010, "state": "FAILED"},
            {"submit_time": 20, "start_time": 20, "end_time": 4020, "state": "COMPLETED"},
            {"submit_time": 5 * h, "start_time": 5 * h, "end_time": 6 * h, "state": "COMPLETED"},
            {"submit_time": 5 * h + 1, "start_time": None, "end_time": None, "state": "PENDING"},
        ]
    )
    f = build_features(t)
    i = 3  # submitted after the first three ended
    prior = (2 + 1) / (3 + 2)
    assert f.col("global_success_rate")[i] == pytest.approx(prior)
    assert f.col("user_success_rate")[i] == pytest.approx((2 + 4 * prior) / (3 + 4))
    assert f.col("user_last1")[i] == 1.0
    assert f.col("user_last3")[i] == pytest.approx(2 / 3)
    assert f.col("user_fail_streak")[i] == 0.0
    assert f.col("user_hours_since_failure")[i] == pytest.approx((5 * h - 2010) / h)
    assert f.col("user_log_runtime_median")[i] == pytest.approx(np.log(4000))  # of [1000, 4000]: upper middle
    assert f.col("user_log_ttf_median")[i] == pytest.approx(np.log(2000))
    assert f.col("user_submits_last_hour").tolist()[:3] == [0.0, 1.0, 2.0]
    assert f.col("user_submits_last_hour")[4] == 1.0  # job 3, 1 s earlier; jobs 0-2 are 5 h old
    assert not f.ended[4]


def _features_by_id(t: pa.Table) -> dict[str, np.ndarray]:
    f = build_features(t)
    return {jid: f.X[k] for k, jid in enumerate(f.job_id.tolist())}


def test_features_of_earlier_jobs_do_not_change_when_future_jobs_are_added() -> None:
    t = make_history(4000, seed=3, users=20, days=4)
    full = _features_by_id(t)
    submit = t.column("submit_time").to_numpy().astype("datetime64[us]").astype(np.int64)
    cut = np.sort(submit)[2500]
    past = _features_by_id(t.filter(pa.array(submit < cut)))
    assert len(past) == 2500
    for jid, row in past.items():
        np.testing.assert_array_equal(row, full[jid])


def test_outcomes_decided_at_end_time_are_invisible_before_it() -> None:
    """Rewrite one job's outcome and runtime (its label exists only from its end on): jobs submitted up to
    its end keep identical features; some job submitted after it sees the change (the test has teeth)."""
    t = make_history(3000, seed=4, users=8, days=3)
    base = _features_by_id(t)
    states = t.column("state").to_pylist()
    ends = t.column("end_time").to_numpy().astype("datetime64[us]").astype(np.int64)
    submits = t.column("submit_time").to_numpy().astype("datetime64[us]").astype(np.int64)
    rng = np.random.default_rng(0)
    changed_later = 0
    for k in rng.choice(len(states), 25, replace=False).tolist():
        flipped = list(states)
        flipped[k] = "FAILED" if states[k] == "COMPLETED" else "COMPLETED"
        new_end = ends.copy()
        new_end[k] = ends[k] + 1  # the runtime changes too, and the end moves 1 us later
        t2 = t.set_column(t.schema.get_field_index("state"), "state", pa.array(flipped, pa.string()))
        t2 = t2.set_column(
            t2.schema.get_field_index("end_time"),
            "end_time",
            pa.array(new_end, pa.int64()).cast(t.schema.field("end_time").type),
        )
        pert = _features_by_id(t2)
        for jid, row in pert.items():
            j = int(jid)
            if submits[j] <= ends[k]:
                np.testing.assert_array_equal(
                    row, base[jid], err_msg=f"job {jid} saw job {k}'s future outcome"
                )
            elif not np.array_equal(row, base[jid], equal_nan=True):
                changed_later += 1
    assert changed_later > 0


def test_peeking_at_the_online_state_records_no_submission() -> None:
    st = RollingState()
    st.observe_end("a", None, "x", 1.0, 0.0, 10.0, "FAILED")
    before = st.peek_row("a", None, "x", 1.0, 20.0)
    again = st.peek_row("a", None, "x", 1.0, 20.0)
    np.testing.assert_array_equal(before, again)
    assert st.users["a"].submits == type(st.users["a"].submits)()
    assert len(before) == len(HISTORY_FEATURES)
    assert before[HISTORY_FEATURES.index("user_fail_streak")] == 1.0
    assert before[HISTORY_FEATURES.index("name_jobs_ended")] == 1.0
