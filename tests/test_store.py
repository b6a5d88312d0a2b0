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
