"""The decision log in the job store: its reader and writer on real DuckDB files, a Slurm --apply pass
through stand-in Slurm commands, and a real local daemon copying its passes into its store."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from headway import decision_log as dl
from headway.decision_log import DecisionRecord
from headway.local.db import StateDB
from headway.local.store_sync import to_decision
from headway.slurm.sync import SlurmSync, SyncOptions
from headway.store import JobStore
from test_local_support import DaemonProc, start_daemon, wait_until
from test_slurm_adapter import RatePredictor, _runner, fake_slurm

__all__ = ["fake_slurm", "start_daemon"]

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=dt.UTC)


def _rec(i: int, **kw: object) -> DecisionRecord:
    base: dict[str, object] = {
        "at": T0 + dt.timedelta(minutes=i),
        "source": "sacct",
        "adapter": "slurm",
        "policy": "impact",
        "ok": True,
        "applied": True,
        "duration_s": 0.5 + i,
    }
    return DecisionRecord(**(base | kw))  # type: ignore[arg-type]


def test_every_field_comes_back_from_a_store_file_also_read_only(tmp_db: Path) -> None:
    full = DecisionRecord(
        at=T0,
        source="sacct",
        adapter="slurm",
        policy="impact",
        ok=False,
        applied=True,
        duration_s=1.25,
        error="queue read 90 s ago (over 60 s): stale, wrote nothing",
        started=("7", "8"),
        written=({"job_id": "11", "old": None, "new": 87500}, {"job_id": "12", "old": 5, "new": 6}),
        ranking=(
            {
                "job_id": "11",
                "rank": 1,
                "tier": "normal",
                "score": 0.25,
                "p_success": 0.9,
                "runtime_s": 3600.0,
                "reason": "normal; score 0.25 (p=0.9)",
                "estimated_start": "2026-03-01T13:00:00+00:00",
                "user": "dave",
                "name": "finetune",
                "gpus": 8.0,
            },
            {"job_id": "12", "rank": 2, "tier": "held", "score": float("nan"), "user": None, "gpus": 1.0},
        ),
        running=({"job_id": "1", "user": "alice", "name": "train", "gpus": 4.0, "where": "2 nodes"},),
        pending=19,
    )
    with JobStore(tmp_db) as store:
        did = dl.record(store.con, full)
    with JobStore(tmp_db, read_only=True) as store:
        got = dl.get(store.con, did)
        assert dl.has_log(store.con) and dl.latest(store.con) == got
    assert got is not None and got.id == did
    assert got.at == T0 and got.at.utcoffset() == dt.timedelta(0)
    # NaN is not JSON: it comes back as a missing value
    assert got.ranking[1]["score"] is None
    fixed = full.ranking[1] | {"score": None}
    assert got == dataclasses.replace(full, ranking=(full.ranking[0], fixed), id=did)


def test_readers_on_a_store_without_the_log_answer_nothing(tmp_db: Path) -> None:
    con = duckdb.connect(str(tmp_db))
    con.execute("CREATE TABLE jobs (job_id VARCHAR)")  # a store written before the log existed
    con.close()
    con = duckdb.connect(str(tmp_db), read_only=True)
    try:
        assert not dl.has_log(con)
        assert dl.passes(con) == [] and dl.for_job(con, "sacct", "1") == []
        assert dl.get(con, 1) is None and dl.latest(con) is None
        assert dl.first_applied(con) is None and dl.pass_stats(con) == []
    finally:
        con.close()


def test_a_job_finds_the_passes_that_started_wrote_or_ranked_it_not_those_it_ran_through(
    tmp_db: Path,
) -> None:
    with JobStore(tmp_db) as store:
        ranked = dl.record(store.con, _rec(0, ranking=({"job_id": "5", "rank": 1},)))
        wrote = dl.record(store.con, _rec(1, written=({"job_id": "5", "old": 0, "new": 9},)))
        dl.record(store.con, _rec(2, running=({"job_id": "5", "where": "1 node"},)))
        local = dl.record(store.con, _rec(3, source="local", adapter="local", started=("5",)))
        found = dl.for_job(store.con, "sacct", "5")
        assert [r.id for r in found] == [wrote, ranked]  # newest first; the other source's job 5 apart
        assert [r.id for r in dl.for_job(store.con, "local", "5")] == [local]
        assert [r.id for r in dl.for_job(store.con, "sacct", "5", limit=1)] == [wrote]
        assert dl.for_job(store.con, "sacct", "6") == []


def test_passes_page_newest_first_and_stats_count_each_adapters_passes(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        ids = [dl.record(store.con, _rec(i, ok=i != 2, error=None if i != 2 else "down")) for i in range(5)]
        dl.record(store.con, _rec(9, source="local", adapter="local", duration_s=None))
        con = store.con
        assert [r.id for r in dl.passes(con, source="sacct", limit=2)] == [ids[4], ids[3]]
        assert [r.id for r in dl.passes(con, source="sacct", before_id=ids[3])] == ids[2::-1]
        assert dl.passes(con, limit=0) == []
        last = dl.latest(con, adapter="slurm")
        assert last is not None and last.id == ids[4]
        stats = {(s["adapter"], s["source"]): s for s in dl.pass_stats(con)}
    slurm = stats[("slurm", "sacct")]
    assert (slurm["passes"], slurm["errors"], slurm["last_duration_s"]) == (5, 1, 4.5)
    assert slurm["mean_duration_s"] == pytest.approx(2.5) and slurm["last_at"] == T0 + dt.timedelta(minutes=4)
    assert stats[("local", "local")]["passes"] == 1 and stats[("local", "local")]["mean_duration_s"] is None


def test_first_applied_is_the_earliest_ok_pass_that_acted_under_that_policy(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        con = store.con
        assert dl.first_applied(con) is None  # the table is there, no pass yet
        dl.record(con, _rec(5))
        dl.record(con, _rec(1, ok=False, error="slurmctld down"))  # earlier but failed
        dl.record(con, _rec(2, applied=False))  # earlier but did not act
        dl.record(con, _rec(0, policy="fifo"))  # earlier, another policy
        dl.record(con, _rec(3))
        assert dl.first_applied(con) == T0 + dt.timedelta(minutes=3)
        assert dl.first_applied(con, "fifo") == T0
        assert dl.first_applied(con, None) == T0


def test_a_pass_copied_twice_under_its_origin_id_is_stored_once(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        rec = _rec(0, source="local", adapter="local", started=("3",))
        first = dl.record(store.con, rec, origin_id=7)
        assert dl.record(store.con, rec, origin_id=7) == first
        other = dl.record(store.con, _rec(1, source="local", adapter="local"), origin_id=7)  # another time
        assert other != first and len(dl.passes(store.con)) == 2


def test_a_naive_time_is_refused_not_stored_in_some_zone(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store, pytest.raises(ValueError, match="tz-aware"):
        dl.record(store.con, _rec(0, at=dt.datetime(2026, 1, 1)))


def test_for_job_finds_a_jobs_passes_among_many_spread_over_row_groups(tmp_db: Path) -> None:
    """1,000 passes of 200 ranked jobs each, laid out as record() lays them (two of DuckDB's row groups
    of decision_jobs): a job ranked in passes on both sides gets every one, newest first, whole. (Its
    speed on 10,000 such passes, ~40 ms, is measured by hand, not in a test.)"""
    with JobStore(tmp_db) as store:
        con = store.con
        con.execute(
            "INSERT INTO decisions (ran_at, source, adapter, policy, ok, applied, duration_s, pending) "
            "SELECT TIMESTAMPTZ '2026-01-01 00:00:00+00' + to_seconds(i * 30), 'sacct', 'slurm', 'impact', "
            "true, true, 1.0, 200 FROM range(1000) t(i)"
        )
        con.execute(
            "INSERT INTO decision_jobs SELECT d, 'sacct', (1000 + d // 2 + k)::VARCHAR, 'ranked', k, "
            "json_object('job_id', (1000 + d // 2 + k)::VARCHAR, 'rank', k + 1, 'tier', 'normal')::VARCHAR "
            "FROM range(1, 1001) a(d), range(200) b(k)"
        )
    with JobStore(tmp_db, read_only=True) as store:
        found = dl.for_job(store.con, "sacct", "1400", limit=1000)
        few = dl.for_job(store.con, "sacct", "1400", limit=3)
    # job 1400 is ranked at k = 400 - d // 2 for 0 <= k < 200: passes 402 to 801
    assert [r.id for r in found] == list(range(801, 401, -1))
    assert all(len(r.ranking) == 200 and r.ranking[0]["rank"] == 1 for r in found)
    assert all(any(e["job_id"] == "1400" for e in r.ranking) for r in found)
    assert [r.id for r in few] == [801, 800, 799]


# --------------------------------------------------------------------------- the Slurm adapter
def test_an_apply_pass_records_its_ranking_and_writes_and_a_dry_run_nothing(
    fake_slurm: Path, tmp_path: Path
) -> None:
    db = tmp_path / "j.duckdb"
    dry = SlurmSync(_runner(fake_slurm), SyncOptions(apply=False, db=db), predictor_factory=RatePredictor)
    assert dry.run_pass().ok and not db.exists()  # a dry run writes nothing to the store

    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), predictor_factory=RatePredictor)
    report = sync.run_pass()
    assert report.ok and report.plan is not None
    with JobStore(db, read_only=True) as store:
        (rec,) = dl.passes(store.con)
        top = dl.for_job(store.con, "sacct", report.plan.rows[0].job_id)
    assert (rec.adapter, rec.source, rec.policy, rec.ok, rec.applied) == (
        "slurm",
        "sacct",
        "impact",
        True,
        True,
    )
    assert rec.duration_s is not None and rec.duration_s > 0 and rec.pending == 19 and rec.started == ()
    assert rec.at == dt.datetime.fromtimestamp(report.at, dt.UTC)
    assert [(w["job_id"], w["old"], w["new"]) for w in rec.written] == [
        (c.job_id, c.old, c.new) for c in report.applied
    ]
    assert len(rec.written) == 18  # job 13 failed ("already finished"): not a write made
    assert [e["job_id"] for e in rec.ranking] == [r.job_id for r in report.plan.rows]
    first = rec.ranking[0]
    assert first["rank"] == 1 and first["tier"] and first["reason"] and first["user"] and first["gpus"]
    f = report.plan.rows[0].factors  # the impact policy's p and R (hours; capped by the time limit)
    assert first["p_success"] == f["p"] and first["runtime_s"] == pytest.approx(f["R_h"] * 3600.0)
    assert first["estimated_start"] is None
    assert {r["job_id"] for r in rec.running} and all(
        r["where"].endswith(("node", "nodes")) for r in rec.running
    )
    assert len(rec.running) == report.plan.running
    assert [r.id for r in top] == [rec.id]


def test_a_failed_apply_pass_is_recorded_with_its_error(fake_slurm: Path, tmp_path: Path) -> None:
    db = tmp_path / "j.duckdb"
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), predictor_factory=RatePredictor)
    (fake_slurm / "garbage").touch()
    report = sync.run_pass()
    assert not report.ok
    with JobStore(db, read_only=True) as store:
        rec = dl.latest(store.con, adapter="slurm")
        assert dl.first_applied(store.con) is None  # a failed pass applied nothing
    assert rec is not None and not rec.ok and rec.error == report.error and "not JSON" in (rec.error or "")
    assert rec.ranking == () and rec.written == () and rec.pending is None


def test_a_store_held_by_a_reader_fails_no_pass_and_the_record_follows_later(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.duckdb"
    JobStore(db).close()
    monkeypatch.setattr("headway.slurm.sync.LOG_WAIT_S", 0.2)
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), predictor_factory=RatePredictor)
    assert sync.run_pass().ok  # stores the history now, so the next passes have none to store
    code = (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); print('held', flush=True)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code + "; time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert sync.run_pass().ok and sync.run_pass().ok  # the log cannot be written: the passes go on
    finally:
        holder.kill()
        holder.wait()
    assert capsys.readouterr().err.count("decision log not written") == 1  # said once
    assert sync.run_pass().ok
    with JobStore(db, read_only=True) as store:
        recs = dl.passes(store.con)
    assert len(recs) == 4 and [r.at for r in recs] == sorted((r.at for r in recs), reverse=True)


def test_a_pass_that_ends_the_command_is_recorded_before_it_does(fake_slurm: Path, tmp_path: Path) -> None:
    """Slurm not configured here (a missing slurm.conf) ends `slurm sync`; the dashboard still sees why."""
    import os

    from headway.slurm.runner import Runner, SlurmMissing

    db = tmp_path / "j.duckdb"
    env = {
        **os.environ,
        "PATH": f"{fake_slurm}:{os.environ['PATH']}",
        "SLURM_CONF": str(tmp_path / "no.conf"),
    }
    sync = SlurmSync(Runner(timeout_s=10, env=env), SyncOptions(apply=True, db=db), RatePredictor)
    with pytest.raises(SlurmMissing):
        sync.run_pass()
    with JobStore(db, read_only=True) as store:
        rec = dl.latest(store.con)
    assert rec is not None and not rec.ok and "no such file" in (rec.error or "")


# --------------------------------------------------------------------------- the local queue
def _local_passes(store: Path) -> list[DecisionRecord] | None:
    """The store's local passes (None while the daemon holds the store)."""
    try:
        con = duckdb.connect(str(store), read_only=True)
    except duckdb.Error:
        return None
    try:
        return dl.passes(con, source="local")
    finally:
        con.close()


def test_a_daemon_that_starts_jobs_copies_each_pass_into_the_store_once(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """A long job's pass reaches the store on its own (after DECISIONS_ALONE_AFTER_S); a short job's
    goes with its end; later flushes copy neither again."""
    d = start_daemon(gpus="2")
    store = d.state_dir / "jobs.duckdb"

    def started(*ids: int) -> Callable[[], bool]:
        def check() -> bool:
            got = _local_passes(store)
            return got is not None and {str(i) for i in ids} <= {j for r in got for j in r.started}

        return check

    long = d.submit(["sleep", "60"], name="long")
    wait_until(started(long), 20, "the pass that started the long job in the store")
    short = d.submit(["true"], name="short")
    wait_until(started(long, short), 20, "the pass that started the short job in the store")
    time.sleep(0.5)  # more flushes: nothing is copied again
    con = duckdb.connect(str(store), read_only=True)
    try:
        recs = dl.passes(con, source="local")
        mine = dl.for_job(con, "local", str(short))
    finally:
        con.close()
    queue = sqlite3.connect(str(d.state_dir / "queue.sqlite"))
    try:
        logged = queue.execute("SELECT count(*), min(stored) FROM decisions").fetchone()
    finally:
        queue.close()
    assert logged == (len(recs), 1) == (2, 1)
    by_start = {j: r for r in recs for j in r.started}
    assert sorted(by_start) == sorted([str(long), str(short)])  # each start once
    one, two = by_start[str(long)], by_start[str(short)]
    assert (one.adapter, one.source, one.ok, one.applied, one.policy) == (
        "local",
        "local",
        True,
        True,
        "impact",
    )
    assert one.duration_s is not None and one.duration_s >= 0 and one.pending == 1 and one.running == ()
    entry = next(e for e in one.ranking if e["job_id"] == str(long))
    assert entry["name"] == "long" and entry["gpus"] == 1 and entry["rank"] == 1 and entry["user"]
    assert entry["reason"] and entry["tier"] == entry["reason"].split("; score")[0]
    # The short job's pass saw the long one running, on the GPU it holds.
    (ran,) = two.running
    assert ran["job_id"] == str(long) and ran["name"] == "long" and ran["where"] in ("GPU 0", "GPU 1")
    assert [r.id for r in mine] == [two.id]


def test_an_old_queue_database_gains_the_decision_columns_and_copies_its_passes(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    con = sqlite3.connect(str(path))
    con.execute(
        "CREATE TABLE decisions (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, "
        "policy TEXT NOT NULL, decision TEXT NOT NULL DEFAULT '', starts TEXT NOT NULL, "
        "ranking TEXT NOT NULL, reservation TEXT)"
    )
    ranking = [
        {
            "job_id": 4,
            "rank": 1,
            "score": 0.5,
            "factors": {"p": 0.8, "R_h": 0.5},
            "reason": "normal; score 0.5",
        }
    ]
    con.execute(
        "INSERT INTO decisions (time, policy, starts, ranking) VALUES (?, 'impact', ?, ?)",
        (T0.timestamp(), json.dumps([[4, [0]]]), json.dumps(ranking)),
    )
    con.commit()
    con.close()
    db = StateDB(path)
    try:
        (row,) = db.unstored_decisions()
        rec = to_decision(dict(row), {4: {"user": "ann", "name": "job", "gpus": 1}})
    finally:
        db.close()
    assert rec.started == ("4",) and rec.duration_s is None and rec.running == () and rec.at == T0
    (e,) = rec.ranking
    assert (e["tier"], e["p_success"], e["runtime_s"], e["user"], e["estimated_start"]) == (
        "normal",
        0.8,
        1800.0,
        "ann",
        None,
    )


def test_old_rankings_are_pruned_and_the_passes_with_their_starts_kept(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        rank = ({"job_id": "9", "rank": 1},)
        old = dl.record(store.con, _rec(0, started=("9",), ranking=rank))
        new = dl.record(store.con, _rec(60 * 24 * 100, ranking=rank))
        assert dl.prune(store.con, T0 + dt.timedelta(days=dl.KEEP_RANKINGS_DAYS)) == 1
        kept = dl.get(store.con, old)
        assert kept is not None and kept.started == ("9",) and kept.ranking == ()
        latest = dl.get(store.con, new)
        assert latest is not None and len(latest.ranking) == 1
        assert dl.first_applied(store.con) == T0
