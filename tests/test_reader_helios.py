"""The Helios / Acme trace reader on rows written in the public traces' shape."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from headway.schema import JOB_SCHEMA, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.helios import READER
from headway.traces.registry import sniff

DATA = Path(__file__).parent / "data"
HELIOS = DATA / "helios_cluster_log.csv"
ACME = DATA / "acme_trace_seren.csv"


def test_helios_rows_map_vc_to_group_and_naive_times_from_shanghai() -> None:
    res = READER.read(HELIOS, ReadOptions())
    assert res.table.schema == JOB_SCHEMA and res.table.num_rows == 6
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    first = jobs["1425511"]
    assert first.user == "uXBbc" and first.group == "vcJkd" and first.name == "train_resnet"
    assert first.submit_time == dt.datetime(2020, 6, 9, 10, 41, 1, tzinfo=dt.UTC)
    assert first.runtime == 36848  # the trace's own duration column
    assert jobs["1425512"].name == "bert,large" and jobs["1425512"].state == "FAILED"
    assert jobs["1425514"].gpus == 16 and jobs["1425514"].nodes == 2 and jobs["1425514"].wait == 600
    assert jobs["1425516"].state == "NODE_FAIL"
    assert {"partition", "time_limit", "exit_code"} <= set(res.missing_fields)


def test_helios_bad_gpu_count_is_a_bad_row_with_its_line() -> None:
    res = READER.read(HELIOS, ReadOptions())
    assert res.bad_row_count == 1 and res.bad_rows[0].line == 8 and "gpu_num" in res.bad_rows[0].reason


def test_tz_option_overrides_the_default() -> None:
    res = READER.read(HELIOS, ReadOptions(tz="UTC"))
    first = table_to_records(res.table)[0]
    assert first.submit_time == dt.datetime(2020, 6, 9, 18, 41, 1, tzinfo=dt.UTC)


def test_acme_times_keep_their_offset_and_float_counts_are_read() -> None:
    res = READER.read(ACME, ReadOptions(tz="America/New_York"))  # ignored: the times carry +08:00
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert res.bad_row_count == 0 and len(jobs) == 4
    assert jobs["5778432"].start_time == dt.datetime(2023, 2, 28, 16, 18, 54, tzinfo=dt.UTC)
    assert jobs["5778432"].runtime == 117 and jobs["5778432"].gpus == 8
    assert jobs["5778501"].cpus == 512 and jobs["5778501"].state == "CANCELLED"
    assert "group" in res.missing_fields


def test_epoch_second_times_are_accepted(tmp_path: Path) -> None:
    p = tmp_path / "h.csv"
    p.write_text("job_id,user,gpu_num,state,submit_time,start_time,end_time\n7,u1,2,COMPLETED,100,160,3760\n")
    job = table_to_records(READER.read(p, ReadOptions()).table)[0]
    assert job.wait == 60 and job.runtime == 3600


def test_sniff_picks_helios_for_both_shapes_and_refuses_other_csvs(tmp_path: Path) -> None:
    assert sniff(HELIOS) == "helios" and sniff(ACME) == "helios"
    p = tmp_path / "x.csv"
    p.write_text("name,value\n1,2\n")
    assert not READER.sniff(p, p.read_bytes())
    with pytest.raises(BadInputError, match="no job_id column"):
        READER.read(p, ReadOptions())


def test_epoch_times_beyond_any_calendar_are_bad_rows_not_year_57972(tmp_path: Path) -> None:
    """Milliseconds read as seconds were stored in year 57972 (and broke the audit); 14 digits crashed.
    The submit time makes the row bad; the row names every time it could not read."""
    p = tmp_path / "h.csv"
    p.write_text(
        "job_id,user,gpu_num,state,submit_time,start_time,end_time\n"
        "1,a,2,COMPLETED,1767258000000,1767258000000,1767258060000\n"
        "2,a,2,COMPLETED,99999999999999,99999999999999,99999999999999\n"
        "3,b,1,COMPLETED,1767258000,1767258000,1767258060\n"
    )
    res = READER.read(p, ReadOptions())
    assert [j.job_id for j in table_to_records(res.table)] == ["3"]
    assert [(b.line, b.reason) for b in res.bad_rows] == [
        (
            2,
            "submit_time: epoch time out of range (read as seconds) ('1767258000000'); "
            "start_time: epoch time out of range (read as seconds) ('1767258000000'); "
            "end_time: epoch time out of range (read as seconds) ('1767258060000')",
        ),
        (
            3,
            "submit_time: epoch time out of range (read as seconds) ('99999999999999'); "
            "start_time: epoch time out of range (read as seconds) ('99999999999999'); "
            "end_time: epoch time out of range (read as seconds) ('99999999999999')",
        ),
    ]
    # Counted once per column and reason; start and end (stored as null on a kept row) count no row here.
    assert [(p.column, p.effect, p.count) for p in res.problems] == [("submit_time", "row skipped", 2)]
    with pytest.raises(BadInputError, match=r"h.csv:2: submit_time: epoch time out of range"):
        READER.read(p, ReadOptions(strict=True))
