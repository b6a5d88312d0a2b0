"""Ordering: with the GPU busy, jobs of users with good and bad histories start in impact order under
`--policy impact`, and in submit order under `--policy fifo`. The histories are ingested into the job
store the daemon's predictor learns from, as a server's past would be."""

from __future__ import annotations

import datetime as dt
import os
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest

from headway.schema import JobRecord, State, records_to_table
from headway.store import JobStore
from test_local_support import DaemonProc, as_user, need_users, shared_dir, start_daemon, wait_until

__all__ = ["shared_dir", "start_daemon"]

GOOD, BAD = "good-exp", "bad-exp"


def _seed_history(store: Path, user: str, rename: dict[str, str] | None = None, prefix: str = "h") -> None:
    """300 past jobs of `user`: `good-exp` nearly always completes, `bad-exp` nearly always fails
    (`rename` maps those names to others, e.g. to give a second user the opposite record)."""
    t0 = dt.datetime.now(dt.UTC) - dt.timedelta(days=3)
    recs = []
    for i in range(300):
        name = GOOD if i % 2 == 0 else BAD
        ok = (i % 19 != 0) if name == GOOD else (i % 23 == 1)  # no fixed streak announces the next outcome
        submit = t0 + dt.timedelta(minutes=10 * i)
        start = submit + dt.timedelta(minutes=1)
        runtime = dt.timedelta(minutes=10) if ok else dt.timedelta(minutes=6)
        recs.append(
            JobRecord(
                f"{prefix}{i}",
                State.COMPLETED if ok else State.FAILED,
                "past",
                user=user,
                name=(rename or {}).get(name, name),
                submit_time=submit,
                start_time=start,
                end_time=start + runtime,
                gpus=1.0,
                time_limit=3600,
            )
        )
    with JobStore(store) as s:
        s.upsert(records_to_table(recs))


def _start_order(d: DaemonProc, ids: list[int]) -> list[int]:
    hist = {j["id"]: j for j in d.ask({"op": "history", "limit": 1000})["jobs"]}
    return sorted(ids, key=lambda i: hist[i]["start_ts"])


@pytest.mark.parametrize("policy", ["impact", "fifo"])
def test_queue_starts_jobs_in_impact_order_or_submit_order_under_fifo(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path, policy: str
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    store = tmp_path / "history.duckdb"
    _seed_history(store, me)
    d = start_daemon("--policy", policy, "--db", str(store), gpus="1")
    blocker = d.submit(["sleep", "60"], name="blocker")
    wait_until(lambda: d.ask({"op": "queue"})["jobs"][0]["state"] == "RUNNING", 20, "the blocker to run")
    names = [BAD, GOOD, BAD, GOOD, BAD, GOOD]
    ids = [d.submit(["sleep", "0.1"], name=n, time_limit=3600) for n in names]
    by_id = dict(zip(ids, names, strict=True))
    wait_until(
        lambda: all(j["p_success"] is not None for j in d.ask({"op": "queue"})["jobs"][1:]), 20, "predictions"
    )
    queue = d.ask({"op": "queue"})["jobs"]
    p = {j["id"]: j["p_success"] for j in queue}
    # The predictor learnt the histories: good-exp is likelier to complete than bad-exp.
    assert min(p[i] for i in ids if by_id[i] == GOOD) > max(p[i] for i in ids if by_id[i] == BAD)
    d.ask({"op": "cancel", "id": blocker})
    wait_until(lambda: len(d.ask({"op": "history", "limit": 1000})["jobs"]) == 7, 30, "all jobs to end")
    order = _start_order(d, ids)
    if policy == "fifo":
        assert order == ids
    else:
        assert [by_id[i] for i in order] == [GOOD] * 3 + [BAD] * 3
        # Within a class the order is still the submit order (equal impact).
        assert [i for i in order if by_id[i] == GOOD] == [i for i in ids if by_id[i] == GOOD]
    # `why` explains the waiting job's place with the impact factors.
    why = d.ask({"op": "why", "id": ids[0]})
    assert why["job"]["state"] == "COMPLETED" and why["decision_id"] is not None


def test_why_tells_a_pending_job_its_rank_factors_and_estimated_start(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    store = tmp_path / "history.duckdb"
    _seed_history(store, me)
    d = start_daemon("--db", str(store), gpus="1")
    d.submit(["sleep", "60"], name=GOOD, time_limit=120)
    bad = d.submit(["true"], name=BAD, time_limit=3600)
    good = d.submit(["true"], name=GOOD, time_limit=3600)
    wait_until(lambda: d.ask({"op": "why", "id": bad}).get("rank") == 2, 20, "the ranking")
    w = d.ask({"op": "why", "id": bad})
    assert w["of"] == 2 and w["policy"] == "impact"
    assert set(w["factors"]) >= {"p", "c_gpu_h", "w", "fairshare"}
    text = "\n".join(w["explanation"])
    assert "rank 2 of 2" in text and "chance to complete" in text and f"ranked ahead of it: {good}" in text
    assert w["estimated_start"] is not None


def test_jobs_of_a_user_with_a_good_history_start_before_those_of_a_user_with_a_bad_one(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    alice, bob = need_users()
    store = shared_dir / "history.duckdb"
    _seed_history(store, alice.pw_name, rename={BAD: "skip"})  # alice: `train` nearly always completes
    _seed_history(
        store, bob.pw_name, rename={GOOD: "skip", BAD: GOOD}, prefix="b"
    )  # bob: nearly always fails
    d = start_daemon("--db", str(store), gpus="1", state_dir=shared_dir / "state")
    blocker = d.submit(["sleep", "60"], name="blocker")
    wait_until(lambda: d.ask({"op": "queue"})["jobs"][0]["state"] == "RUNNING", 20, "the blocker to run")
    env = {"PATH": "/usr/bin:/bin"}
    who = [bob, alice, bob, alice, bob, alice]
    ids = []
    for pw in who:
        msg = {"op": "submit", "argv": ["true"], "cwd": "/", "env": env, "name": GOOD, "time_limit": 3600}
        ids.append(as_user(pw, d.state_dir, msg)["reply"]["id"])
    user_of = dict(zip(ids, (pw.pw_name for pw in who), strict=True))
    wait_until(
        lambda: all(j["p_success"] is not None for j in d.ask({"op": "queue"})["jobs"]), 20, "predictions"
    )
    d.ask({"op": "cancel", "id": blocker})
    wait_until(lambda: len(d.ask({"op": "history", "limit": 1000})["jobs"]) == 7, 30, "all jobs to end")
    order = _start_order(d, ids)
    assert [user_of[i] for i in order] == [alice.pw_name] * 3 + [bob.pw_name] * 3


def test_a_restart_loads_the_saved_model_instead_of_retraining(tmp_path: Path) -> None:
    import time

    from headway.local.core import LocalJob
    from headway.local.ordering import build_predictor, submitted_for_predictor

    store = tmp_path / "history.duckdb"
    _seed_history(store, "ann")
    fresh = build_predictor(store)
    assert fresh.model is None and fresh.trainings == 0  # start-up never trains
    assert fresh.maybe_retrain(time.time())  # what the daemon's retraining thread does when it is due
    fresh.model.save(tmp_path / "predictor.json")
    restarted = build_predictor(store, model=tmp_path / "predictor.json")
    assert restarted.model is not None and restarted.trainings == 0
    assert not restarted.maybe_retrain(time.time())  # the loaded model is current: not due again
    now = time.time()
    jobs = [
        LocalJob(id=i, user="ann", uid=0, name=n, gpus=1, submit_time=now) for i, n in enumerate([GOOD, BAD])
    ]
    p = restarted.predict([submitted_for_predictor(j) for j in jobs], now).p_success
    assert p[0] > p[1]


def test_a_restart_with_a_model_file_whose_boosters_are_damaged_starts_from_the_fallbacks(
    tmp_path: Path,
) -> None:
    """A `predictor.json` whose boosters were not an object raised AttributeError out of the predictor's
    start-up (only ModelFileError, OSError and ValueError are caught there)."""
    import json
    import time

    from headway.local.ordering import build_predictor

    store = tmp_path / "history.duckdb"
    _seed_history(store, "ann")
    fresh = build_predictor(store)
    assert fresh.maybe_retrain(time.time())
    path = tmp_path / "predictor.json"
    fresh.model.save(path)
    doc = json.loads(path.read_text())
    doc["boosters"] = list(doc["boosters"].values())
    path.write_text(json.dumps(doc))
    restarted = build_predictor(store, model=path)
    assert restarted.model is None


def test_why_tells_a_held_job_that_it_is_held_for_repeat_failures_and_its_score(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """`why` cut the policy's words at the first ' (': a held job read 'tier and score: held', without
    'repeat failures' or its score (a starved one likewise read just 'starved')."""
    d = start_daemon(gpus="1")
    failed = [d.submit(["false"], name="flaky") for _ in range(3)]
    ended = lambda: {j["id"] for j in d.ask({"op": "history", "limit": 10})["jobs"]}  # noqa: E731
    wait_until(lambda: ended() >= set(failed), 20, "the 3 failures")
    d.submit(["sleep", "60"], name="blocker")
    held = d.submit(["false"], name="flaky")
    d.submit(["true"], name="other")
    wait_until(lambda: d.ask({"op": "why", "id": held}).get("rank") == 2, 20, "the ranking")
    w = d.ask({"op": "why", "id": held})
    assert w["job"]["reason"] == "Held"
    text = "\n".join(w["explanation"])
    assert "tier and score: held (repeat failures); score " in text, text
    assert "failed 3 times in a row" in text, text


def test_a_running_job_counts_towards_fair_share_once_however_many_passes_see_it() -> None:
    """Each pass reads the running jobs afresh: a pass must not add a run to the book, or the next pass
    would count it twice. Its usage accrues with decay while it runs, and ending it changes nothing."""
    import math

    from headway.local.core import JobState, LocalJob, QueueView
    from headway.local.ordering import LocalPlanner, add_end
    from headway.policy.inputs import HALF_LIFE_S

    day = 86400.0
    job = LocalJob(1, "ann", 1000, "train", 2, 0.0, state=JobState.RUNNING, start_time=0.0, gpu_ids=(0, 1))
    other = LocalJob(2, "bob", 1001, "eval", 1, 5.0)
    planner = LocalPlanner("fifo")

    def usage(now: float, running: tuple[LocalJob, ...]) -> dict[str, float]:
        free = () if running else (0, 1)
        snap = planner.snapshot(QueueView(now, (0, 1), free, (other,), running))
        return dict(zip(list(snap.users), snap.usage.tolist(), strict=True))

    def want(now: float) -> float:
        return 2 * (1 - 2 ** (-now / HALF_LIFE_S)) * HALF_LIFE_S / math.log(2)

    assert usage(day, (job,)) == usage(day, (job,)) == {"ann": pytest.approx(want(day), abs=1e-3), "bob": 0.0}
    assert usage(3 * day, (job,))["ann"] == pytest.approx(want(3 * day), abs=1e-3)
    at_end = usage(3 * day, (job,))["ann"]
    add_end(planner.book, "ann", "train", "COMPLETED", 2.0, 0.0, 3 * day)
    assert usage(3 * day, ())["ann"] == pytest.approx(at_end, abs=1e-3)
    assert usage(10 * day, ())["ann"] == pytest.approx(at_end * 2 ** (-7 * day / HALF_LIFE_S), abs=1e-3)


def test_a_restarted_queue_reads_back_the_usage_and_streaks_its_database_holds(tmp_path: Path) -> None:
    from headway.local.db import StateDB
    from headway.local.ordering import fail_streak, load_book
    from headway.local.paths import STATE_DB

    db = StateDB(tmp_path / STATE_DB)
    base = {"uid": 1000, "gid": 1000, "argv": "[]", "cwd": "/", "env": "{}", "gpus": 1, "priority": "normal"}
    for i, state in enumerate(["FAILED", "TIMEOUT", "COMPLETED", "FAILED", "FAILED"]):
        db.insert_job(
            {
                **base,
                "user": "ann",
                "name": "sweep",
                "submit_time": 100.0 * i,
                "state": state,
                "start_time": 100.0 * i,
                "end_time": 100.0 * i + 50,
            }
        )
    db.insert_job({**base, "user": "bob", "name": "x", "submit_time": 0.0, "state": "PENDING"})
    db.close()
    book = load_book(tmp_path)
    assert fail_streak(book, "ann", "sweep") == 2 and fail_streak(book, "bob", "x") == 0
    assert book.ledger.users == ["ann"]  # a pending job is no history
    assert book.ledger.usage(500.0)[0] == pytest.approx(250.0, rel=1e-3)
