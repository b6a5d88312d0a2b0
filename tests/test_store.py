from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from headway.schema import JobRecord, State, records_to_table, table_to_records, with_derived
from headway.store import Interrupted, JobStore, StoreError

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _job(job_id: str, state: State, hours: float, gpus: float = 2.0) -> JobRecord:
    return JobRecord(
        job_id,
        state,
        "test",
        gpus=gpus,
        submit_time=T0,
        start_time=T0 + dt.timedelta(minutes=5),
        end_time=T0 + dt.timedelta(minutes=5, hours=hours),
    )


def test_reingesting_a_job_replaces_it_instead_of_duplicating(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        store.upsert(records_to_table([_job("1", State.FAILED, 1), _job("2", State.COMPLETED, 1)]))
        store.upsert(records_to_table([_job("1", State.COMPLETED, 3)]))
        assert store.count() == 2
        rows = dict(store.con.execute("SELECT job_id, state FROM jobs").fetchall())
    assert rows == {"1": "COMPLETED", "2": "COMPLETED"}


def test_derived_fields_agree_between_record_arrow_and_sql(tmp_db: Path) -> None:
    job = _job("7", State.COMPLETED, 1.5, gpus=4)
    assert job.runtime == 5400 and job.wait == 300 and job.gpu_hours == 6.0
    arrow = with_derived(records_to_table([job]))
    assert arrow.column("gpu_hours").to_pylist() == [6.0]
    with JobStore(tmp_db) as store:
        store.upsert(records_to_table([job]))
        sql = store.con.execute("SELECT runtime, wait, gpu_hours FROM jobs_v").fetchone()
        assert sql == (5400.0, 300.0, 6.0)
        assert table_to_records(store.table()) == [job]


def test_an_interrupted_upsert_says_truly_whether_it_stored_and_raises_no_duckdb_error(tmp_db: Path) -> None:
    n = 300_000
    ids = pa.array([str(i) for i in range(n)])
    store = JobStore(tmp_db)
    stop = threading.Event()

    def press_ctrl_c() -> None:  # DuckDB's own interrupt, as the Python binding issues on SIGINT
        while not stop.is_set():
            store.con.interrupt()
            time.sleep(0.0005)

    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    try:
        with pytest.raises(Interrupted) as caught:
            for k in range(20):  # until one lands inside an upsert: each batch under a source of its own
                batch = {
                    "job_id": ids,
                    "state": pa.array(["COMPLETED"] * n),
                    "source": pa.array([f"t{k}"] * n),
                }
                store.upsert(pa.table(batch))
    finally:
        stop.set()
        presser.join()
        store.close()
    with JobStore(tmp_db, read_only=True) as after:
        got = after.con.execute("SELECT count(*) FROM jobs WHERE source = ?", [f"t{k}"]).fetchone()
    assert got == ((n if caught.value.stored else 0),)


def test_a_database_that_is_not_a_headway_store_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """An unrelated DuckDB file got headway's tables added; a jobs table of another layout failed later
    with a traceback (or converted types silently)."""
    import duckdb

    other, old = tmp_path / "other.duckdb", tmp_path / "old.duckdb"
    with duckdb.connect(str(other)) as c:
        c.execute("CREATE TABLE t (x INTEGER)")
    with duckdb.connect(str(old)) as c:
        c.execute("CREATE TABLE jobs (job_id BIGINT, state VARCHAR)")
    for path, said in (
        (other, "without a jobs table (t)"),
        (old, "job_id BIGINT where headway has job_id VARCHAR"),
    ):
        for read_only in (False, True):
            with pytest.raises(StoreError, match=re.escape(said)):
                JobStore(path, read_only=read_only)
    with duckdb.connect(str(other)) as c:
        assert [r[0] for r in c.execute("SHOW TABLES").fetchall()] == ["t"]


# Re-ingest never forgets (issue 22): a field the incoming row leaves null keeps the stored known value.
KNOWN: dict[str, object] = {
    "source": "c",
    "user": "ann",
    "group": "ml",
    "name": "train",
    "partition": "gpu",
    "priority_class": "normal",
    "submit_time": T0,
    "start_time": T0 + dt.timedelta(minutes=5),
    "end_time": T0 + dt.timedelta(minutes=65),
    "gpus": 2.0,
    "nodes": 1,
    "cpus": 8,
    "mem_mb": 64000,
    "time_limit": 7200,
    "state": "FAILED",
    "exit_code": 1,
    "preemptible": True,
    "checkpoint_every": 900,
}


def _arrow(*rows: dict[str, object]) -> pa.Table:
    """Rows as a reader hands them over: an Arrow table of the columns it had (the store conforms it)."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    return pa.Table.from_pylist([{k: r.get(k) for k in names} for r in rows])


def _stored(store: JobStore, job_id: str) -> dict[str, object]:
    (row,) = store.table("job_id = ?", [job_id]).to_pylist()
    return row


def test_a_poorer_copy_of_stored_jobs_keeps_every_known_value_it_leaves_null(tmp_db: Path) -> None:
    with JobStore(tmp_db) as store:
        store.upsert(_arrow({"job_id": "1", **KNOWN}, {"job_id": "2", **KNOWN, "user": "bob"}))
        poorer = _arrow(
            # sacct --json's way: no user, no exit code; a job-table export's: no names, no memory
            {"job_id": "1", "source": "c", "state": "FAILED", "submit_time": T0, "time_limit": 3600},
            {"job_id": "2", **KNOWN, "name": "first", "user": None, "exit_code": None},
            {"job_id": "2", **KNOWN, "name": "renamed", "user": None, "exit_code": None},  # last row wins
        )
        assert store.upsert(poorer, refuse_reused_ids=True) == 2
        assert (store.last_added, store.last_updated, store.last_repeats) == (0, 2, 1)
        assert _stored(store, "1") == {"job_id": "1", **KNOWN, "time_limit": 3600}  # a known value wins
        assert _stored(store, "2") == {"job_id": "2", **KNOWN, "user": "bob", "name": "renamed"}
        by_field = {f: 1 for f in ("group", "name", "partition", "priority_class", "start_time")}
        by_field |= {f: 1 for f in ("end_time", "gpus", "nodes", "cpus", "mem_mb")}
        by_field |= {f: 1 for f in ("preemptible", "checkpoint_every")}
        assert store.last_kept_by_field == by_field | {"user": 2, "exit_code": 2}
        assert store.last_kept_values == 16


def test_a_requeued_job_keeps_its_user_and_name_but_not_its_earlier_runs_times_or_exit_code(
    tmp_db: Path,
) -> None:
    """Slurm resets Submit when it requeues a job: the new run waits again with no start, end or exit code
    of its own, and the old run's must not be kept for it; who submitted it and its name still hold."""
    with JobStore(tmp_db) as store:
        store.upsert(_arrow({"job_id": "7", **KNOWN}))
        requeued = {
            "job_id": "7",
            "source": "c",
            "state": "PENDING",
            "submit_time": T0 + dt.timedelta(hours=2),
        }
        store.upsert(_arrow({**requeued, "gpus": 2.0}), refuse_reused_ids=True)
        row = _stored(store, "7")
    assert (row["user"], row["name"], row["cpus"], row["state"]) == ("ann", "train", 8, "PENDING")
    assert row["submit_time"] == T0 + dt.timedelta(hours=2)
    assert (row["start_time"], row["end_time"], row["exit_code"]) == (None, None, None)


def test_the_run_fields_are_kept_only_where_the_incoming_state_has_them(tmp_db: Path) -> None:
    """Same run (same submit time): an ended row with no start keeps the stored start; a pending row
    (an older snapshot) gets no start, since a pending job has none; an ended job listed as running is
    kept whole, and counted as such rather than as kept values."""
    running = {**KNOWN, "state": "RUNNING", "end_time": None, "exit_code": None}
    with JobStore(tmp_db) as store:
        store.upsert(
            _arrow({"job_id": "8", **running}, {"job_id": "9", **running}, {"job_id": "10", **KNOWN})
        )
        store.upsert(
            _arrow(
                {"job_id": "8", **KNOWN, "state": "COMPLETED", "start_time": None, "exit_code": 0},
                {"job_id": "9", **running, "state": "PENDING", "start_time": None},
                {"job_id": "10", **running, "user": None},
            ),
            refuse_reused_ids=True,
        )
        assert _stored(store, "8")["start_time"] == KNOWN["start_time"]
        assert (_stored(store, "9")["state"], _stored(store, "9")["start_time"]) == ("PENDING", None)
        assert _stored(store, "10") == {"job_id": "10", **KNOWN}
        assert (store.last_kept_ended, store.last_kept_by_field) == (1, {"start_time": 1})


def test_replacing_a_different_job_under_the_same_id_keeps_nothing_of_the_stored_one(tmp_db: Path) -> None:
    """Another user's job, or (with --replace, which refuses nothing) one with another submit time, is
    another job: its nulls are its own, not gaps to fill from the job it replaces."""
    later = T0 + dt.timedelta(days=30)
    with JobStore(tmp_db) as store:
        store.upsert(_arrow({"job_id": "5", **KNOWN}, {"job_id": "6", **KNOWN}))
        other = _arrow(
            {"job_id": "5", "source": "c", "state": "COMPLETED", "user": "bob", "submit_time": T0},
            {"job_id": "6", "source": "c", "state": "COMPLETED", "submit_time": later},
        )
        store.upsert(other)
        assert store.last_kept_values == 0 and store.last_kept_by_field == {}
        assert _stored(store, "5")["name"] is None and _stored(store, "5")["user"] == "bob"
        assert _stored(store, "6")["user"] is None and _stored(store, "6")["submit_time"] == later


def test_a_first_ingest_and_a_reingest_of_the_same_rows_keep_no_values(tmp_db: Path) -> None:
    rows = _arrow({"job_id": "1", **KNOWN, "group": None}, {"job_id": "2", **KNOWN, "exit_code": None})
    with JobStore(tmp_db) as store:
        for _ in range(2):
            assert store.upsert(rows, refuse_reused_ids=True) == 2
            assert store.last_kept_values == 0 and store.last_kept_by_field == {}
        assert _stored(store, "1")["group"] is None and _stored(store, "2")["exit_code"] is None


# The jobs table of the headway before issue 27 (preemption), as that headway created it: written out here,
# not derived from JOB_SCHEMA, so it stays the old layout whatever the schema becomes.
OLD_JOBS = """CREATE TABLE jobs ("job_id" VARCHAR, "user" VARCHAR, "group" VARCHAR, "name" VARCHAR,
    "partition" VARCHAR, "priority_class" VARCHAR, "submit_time" TIMESTAMPTZ, "start_time" TIMESTAMPTZ,
    "end_time" TIMESTAMPTZ, "gpus" DOUBLE, "nodes" INTEGER, "cpus" BIGINT, "mem_mb" BIGINT,
    "time_limit" BIGINT, "state" VARCHAR, "exit_code" INTEGER, "source" VARCHAR)"""
OLD_VIEW = """CREATE VIEW jobs_v AS SELECT *, epoch(end_time) - epoch(start_time) AS runtime,
    epoch(start_time) - epoch(submit_time) AS wait, coalesce(gpus, 0)
    * greatest(coalesce(epoch(end_time) - epoch(start_time), 0), 0) / 3600.0 AS gpu_hours FROM jobs"""
OLD_ROWS = """INSERT INTO jobs VALUES
    ('1', 'ann', 'ml', 'train', 'gpu', 'low', '2026-01-01 00:00:00+00', '2026-01-01 00:05:00+00',
     '2026-01-01 01:05:00+00', 2.0, 1, 8, 64000, 7200, 'FAILED', 1, 'c'),
    ('2', 'bob', NULL, NULL, NULL, NULL, '2026-01-01 00:00:00+00', NULL, NULL, 4.0, 1, NULL, NULL, NULL,
     'PENDING', NULL, 'c')"""


def _old_store(path: Path) -> None:
    import duckdb

    with duckdb.connect(str(path)) as c:
        c.execute(OLD_JOBS)
        c.execute(OLD_VIEW)
        c.execute(OLD_ROWS)


def _columns(path: Path) -> list[str]:
    import duckdb

    with duckdb.connect(str(path), read_only=True) as c:
        return [str(r[0]) for r in c.execute("DESCRIBE jobs").fetchall()]


def test_an_earlier_headways_store_is_read_read_only_with_the_new_fields_null_and_left_as_it_was(
    tmp_db: Path,
) -> None:
    """The dashboard and the audit open the store read-only: a store of the headway before preemption is
    read through views that add the two columns as nulls, and the file is not changed."""
    _old_store(tmp_db)
    with JobStore(tmp_db, read_only=True) as store:
        assert store.lacks == ("preemptible", "checkpoint_every") and store.upgraded == ()
        rows = {r["job_id"]: r for r in store.table().to_pylist()}
        assert rows["1"] == {
            "job_id": "1",
            **KNOWN,
            "priority_class": "low",
            "preemptible": None,
            "checkpoint_every": None,
        }
        assert store.table("state = ?", ["PENDING"]).column("job_id").to_pylist() == ["2"]
        got = store.con.execute(
            "SELECT job_id, preemptible, checkpoint_every, runtime, gpu_hours FROM jobs_v ORDER BY job_id"
        ).fetchall()
        assert got == [("1", None, None, 3600.0, 2.0), ("2", None, None, None, 0.0)]
        assert store.con.execute("SELECT count(preemptible), count(*) FROM jobs").fetchone() == (0, 2)
        assert store.count() == 2
    assert "preemptible" not in _columns(tmp_db)


def test_an_earlier_headways_store_gets_the_new_columns_in_place_when_opened_writable(tmp_db: Path) -> None:
    _old_store(tmp_db)
    with JobStore(tmp_db) as store:
        assert store.upgraded == ("preemptible", "checkpoint_every") and store.lacks == ()
        rows = {r["job_id"]: r for r in store.table().to_pylist()}
        assert rows["1"] == {
            "job_id": "1",
            **KNOWN,
            "priority_class": "low",
            "preemptible": None,
            "checkpoint_every": None,
        }
        assert (rows["2"]["user"], rows["2"]["gpus"], rows["2"]["state"]) == ("bob", 4.0, "PENDING")
        # The new fields round-trip, and a later row that leaves them null keeps them (re-ingest never
        # forgets), as for every other field.
        store.upsert(_arrow({"job_id": "1", **KNOWN}, {"job_id": "3", **KNOWN, "preemptible": False}))
        store.upsert(_arrow({"job_id": "1", **KNOWN, "preemptible": None, "checkpoint_every": None}))
        assert store.last_kept_by_field == {"preemptible": 1, "checkpoint_every": 1}
        assert _stored(store, "1") == {"job_id": "1", **KNOWN}
        assert (_stored(store, "3")["preemptible"], _stored(store, "3")["checkpoint_every"]) == (False, 900)
        got = store.con.execute("SELECT preemptible, runtime FROM jobs_v WHERE job_id = '1'").fetchone()
        assert got == (True, 3600.0)
    assert _columns(tmp_db)[-2:] == ["preemptible", "checkpoint_every"]
    with JobStore(tmp_db, read_only=True) as store:  # upgraded once: nothing lacks on the next open
        assert (store.lacks, store.upgraded, store.count()) == ((), (), 3)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # a column of the old layout missing as well: not an earlier headway's table
        (('"source" VARCHAR)', ")"), "16 columns where headway has 19"),
        # the new columns present but of another type: another program's table
        (('"source" VARCHAR)', '"source" VARCHAR, "preemptible" VARCHAR)'), "preemptible VARCHAR"),
    ],
)
def test_a_layout_that_is_not_an_earlier_headways_is_still_refused(
    tmp_db: Path, change: tuple[str, str], said: str
) -> None:
    import duckdb

    with duckdb.connect(str(tmp_db)) as c:
        c.execute(OLD_JOBS.replace(*change))
    for read_only in (True, False):
        with pytest.raises(StoreError, match=re.escape(said)):
            JobStore(tmp_db, read_only=read_only)
    assert "checkpoint_every" not in _columns(tmp_db)
