"""Feature rows of new jobs do not depend on how they are batched, and the online predictor uses them."""

from __future__ import annotations

import copy
import gc

import numpy as np

from headway.predict.api import EndedJob, SubmittedJob
from headway.predict.features import HISTORY_FEATURES, RollingState
from headway.predict.online import OnlinePredictor
from headway.predict.schedule import RetrainSchedule


def _state_with_history(seed: int) -> RollingState:
    rng = np.random.default_rng(seed)
    st = RollingState()
    t = 0.0
    for _ in range(400):
        t += float(rng.exponential(300.0))
        user = [None, "a", "b", "c", "d"][int(rng.integers(0, 5))]
        name = [None, "x", "y"][int(rng.integers(0, 3))]
        group = [None, "g1", "g2"][int(rng.integers(0, 3))]
        state = ["COMPLETED", "FAILED", "CANCELLED"][int(rng.integers(0, 3))]
        start = None if rng.random() < 0.1 else t - float(rng.exponential(2000.0))
        st.observe_end(user, group, name, float(rng.choice([1.0, 2.0, 8.0])), start, t, state)
        if rng.random() < 0.3:  # some submissions in between, so the last-hour counts are not empty
            st.row(user, group, name, 1.0, t)
    return st


def _batch(seed: int, n: int, t0: float) -> list[tuple[str | None, str | None, str | None, float, float]]:
    rng = np.random.default_rng(seed)
    users = [None, "a", "b", "c", "d", "new1", "new2"]
    jobs = []
    t = t0
    for _ in range(n):
        t += float(rng.choice([0.0, 0.0, 60.0, 1800.0, 4000.0]))  # ties, bursts and gaps over an hour
        jobs.append(
            (
                users[int(rng.integers(0, len(users)))],
                [None, "g1", "g2", "g3"][int(rng.integers(0, 4))],
                [None, "x", "y", "z"][int(rng.integers(0, 4))],
                float(rng.choice([1.0, 2.0, 8.0, 16.0])),
                t,
            )
        )
    return jobs


def test_batch_rows_equal_one_by_one_rows_including_the_state_they_leave() -> None:
    for seed in range(5):
        st = _state_with_history(seed)
        other = copy.deepcopy(st)
        jobs = _batch(seed + 100, 300, 400 * 300.0)
        one = np.array([st.row(*j) for j in jobs], dtype=np.float64)
        users, groups, names, gpus, ts = (list(c) for c in zip(*jobs, strict=True))
        many = other.rows(users, groups, names, gpus, ts)
        np.testing.assert_array_equal(one, many)  # bit-identical, NaNs in the same places
        assert np.isnan(one).any() and not np.isnan(one).all()
        # Both leave the same submission history behind, so the next rows agree too.
        nxt = _batch(seed + 200, 50, ts[-1] + 10.0)
        u2, g2, n2, gp2, t2 = (list(c) for c in zip(*nxt, strict=True))
        np.testing.assert_array_equal(
            np.array([st.row(*j) for j in nxt], dtype=np.float64), other.rows(u2, g2, n2, gp2, t2)
        )


def test_batch_rows_equal_one_by_one_when_times_go_back() -> None:
    """Jobs first seen late (submitted before ones already counted) take the job-by-job deque steps."""
    for seed in range(3):
        st = _state_with_history(seed)
        other = copy.deepcopy(st)
        jobs = _batch(seed + 300, 200, 400 * 300.0)
        order = np.random.default_rng(seed).permutation(len(jobs))
        jobs = [jobs[i] for i in order]
        one = np.array([st.row(*j) for j in jobs], dtype=np.float64)
        users, groups, names, gpus, ts = (list(c) for c in zip(*jobs, strict=True))
        np.testing.assert_array_equal(one, other.rows(users, groups, names, gpus, ts))
        assert {u: list(s.submits) for u, s in st.users.items()} == {
            u: list(s.submits) for u, s in other.users.items()
        }


def test_empty_batch_gives_an_empty_matrix() -> None:
    assert RollingState().rows([], [], [], [], []).shape == (0, len(HISTORY_FEATURES))


def _job(i: int, t: float, user: str) -> SubmittedJob:
    return SubmittedJob(f"j{i}", user, "g", None, None, None, t, 2.0, 1, 7200.0)


def test_online_batch_predictions_equal_one_job_at_a_time_and_the_scalar_path() -> None:
    rng = np.random.default_rng(3)
    a, b, c = (OnlinePredictor(schedule=RetrainSchedule(min_train=100, min_new=10)) for _ in range(3))
    for i in range(300):
        user = f"u{i % 7}"
        end = 100.0 + 50.0 * i
        state = "COMPLETED" if rng.random() < 0.6 else "FAILED"
        e = EndedJob(_job(i, end - 200.0, user), end - 100.0 * (1 + i % 5), end, state)
        for p in (a, b, c):
            p.observe_end(e)
    now = 100.0 + 50.0 * 300
    assert all(p.maybe_retrain(now) for p in (a, b, c))  # same history, same (deterministic) model
    jobs = [_job(1000 + k, now - float(k), f"u{k % 9}") for k in range(200)]
    jobs.append(jobs[3])  # the same job twice in one batch: one row, one prediction
    whole = a.predict(jobs, now)
    single = [b.predict([j], now) for j in jobs]
    scalar = np.array([c.predict_one(j, now) for j in jobs])
    for k, field in enumerate(("p_success", "runtime", "runtime_p90", "time_to_failure")):
        one_by_one = np.concatenate([getattr(s, field) for s in single])
        np.testing.assert_array_equal(getattr(whole, field), one_by_one)
        np.testing.assert_array_equal(scalar[:, k], one_by_one)


def test_batch_rows_stay_equal_to_one_by_one_rows_as_jobs_end_between_batches() -> None:
    """Each key's part is kept between batches and recomputed only when that key ends: interleaving
    ends (of known and brand-new keys) with batches must still give `row`'s numbers."""
    rng = np.random.default_rng(9)
    st = _state_with_history(7)
    other = copy.deepcopy(st)
    t = 400 * 300.0
    for k in range(6):
        jobs = _batch(500 + k, 120, t)
        one = np.array([st.row(*j) for j in jobs], dtype=np.float64)
        users, groups, names, gpus, ts = (list(c) for c in zip(*jobs, strict=True))
        np.testing.assert_array_equal(one, other.rows(users, groups, names, gpus, ts))
        t = ts[-1] + 10.0
        for _ in range(40):  # ends in between, some of keys no batch has seen yet
            t += float(rng.exponential(100.0))
            end = (
                [None, "a", "b", "new1", f"fresh{k}"][int(rng.integers(0, 5))],
                [None, "g1", "g3", f"g{k + 10}"][int(rng.integers(0, 4))],
                [None, "x", "z", f"n{k}"][int(rng.integers(0, 4))],
                float(rng.choice([1.0, 2.0, 16.0, 32.0])),
                t - float(rng.exponential(900.0)),
                t,
                ["COMPLETED", "FAILED"][int(rng.integers(0, 2))],
            )
            st.observe_end(*end)
            other.observe_end(*end)
        t += 1.0


def test_submission_counts_of_bursts_are_the_users_submissions_in_the_hour_before() -> None:
    """Bursts read in batches (every job within minutes, the later bursts with the earlier ones still in
    the hour): each job counts its user's submissions read before it in the hour before its own."""
    for seed in range(3):
        st = _state_with_history(seed)
        seen = {u: list(s.submits) for u, s in st.users.items()}
        rng = np.random.default_rng(seed)
        t = max(x for v in seen.values() for x in v) + 10.0  # times go on from the history's
        for _ in range(3):
            jobs = []
            for _ in range(150):
                t += float(rng.choice([0.0, 0.0, 5.0, 40.0]))
                user = [None, "a", "b", "c", "d", "new1"][int(rng.integers(0, 6))]
                jobs.append((user, None, ["x", None][int(rng.integers(0, 2))], 1.0, t))
            users, groups, names, gpus, ts = (list(c) for c in zip(*jobs, strict=True))
            got = st.rows(users, groups, names, gpus, ts)[:, HISTORY_FEATURES.index("user_submits_last_hour")]
            for (user, *_, tj), n in zip(jobs, got.tolist(), strict=True):
                if user is None:
                    assert np.isnan(n)
                    continue
                before = seen.setdefault(user, [])
                assert n == sum(1 for x in before if x > tj - 3600.0)
                before.append(tj)


def test_a_batch_of_new_jobs_wakes_no_garbage_collection() -> None:
    """Building a batch's feature rows allocates no object per job that the collector tracks: 10k of them
    ran young collections inside the call, and now and then a full one over the whole rolling state."""
    p = OnlinePredictor()
    for i in range(300):
        p.observe_end(EndedJob(_job(i, 50.0 * i, f"u{i % 7}"), 50.0 * i, 50.0 * i + 30.0, "COMPLETED"))
    now = 50.0 * 300
    jobs = [_job(10_000 + k, now, f"u{k % 9}") for k in range(10_000)]
    p.predict([], now)  # fold the ends in first
    gc.collect()
    before = sum(s["collections"] for s in gc.get_stats())
    pred = p.predict(jobs, now)
    assert sum(s["collections"] for s in gc.get_stats()) == before
    assert len(pred) == len(jobs)
