from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway.data import sample_path
from headway.schema import JOB_SCHEMA, State
from headway.store import JobStore
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.philly import READER
from headway.traces.registry import sniff

UTC = dt.UTC


def _job(jobid: str = "application_1_1", status: str = "Pass", **kw: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "status": status,
        "vc": "vc1",
        "jobid": jobid,
        "submitted_time": "2017-10-07 01:11:39",
        "user": "u1",
        "runtime_min": 60.0,
        "start_time": "2017-10-07 01:13:30",
        "end_time": "2017-10-07 02:13:30",
        "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1"]}],
    }
    job.update(kw)
    return job


def _write(tmp_path: Path, jobs: list[Any], name: str = "jobs.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(jobs, indent=2))
    return p


def _rows(path: Path, **kw: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = READER.read(path, ReadOptions(**kw)).table.to_pylist()
    return rows


def test_fields_map_into_the_job_schema(tmp_path: Path) -> None:
    p = _write(
        tmp_path, [_job(detail=[{"ip": "m1", "gpus": ["gpu0", "gpu1"]}, {"ip": "m2", "gpus": ["gpu3"]}])]
    )
    res = READER.read(p, ReadOptions())
    assert res.table.schema == JOB_SCHEMA
    [row] = res.table.to_pylist()
    assert row["job_id"] == "application_1_1"
    assert row["user"] == "u1" and row["group"] == "vc1"
    assert row["name"] is None and row["exit_code"] is None and row["time_limit"] is None
    assert row["gpus"] == 3.0 and row["nodes"] == 2
    assert row["state"] == "COMPLETED" and row["source"] == "philly"
    assert "name" in res.missing_fields and "time_limit" in res.missing_fields
    assert any("no job names" in n for n in res.notes)


@pytest.mark.parametrize(
    ("status", "state"), [("Pass", State.COMPLETED), ("Failed", State.FAILED), ("Killed", State.CANCELLED)]
)
def test_statuses_map_to_schema_states(tmp_path: Path, status: str, state: State) -> None:
    [row] = _rows(_write(tmp_path, [_job(status=status)]))
    assert row["state"] == state.value


def test_naive_pacific_times_become_utc_with_daylight_saving(tmp_path: Path) -> None:
    summer = _job("a", submitted_time="2017-10-07 01:00:00")  # PDT, UTC-7
    winter = _job("b", submitted_time="2017-12-07 01:00:00")  # PST, UTC-8
    rows = {r["job_id"]: r for r in _rows(_write(tmp_path, [summer, winter]))}
    assert rows["a"]["submit_time"] == dt.datetime(2017, 10, 7, 8, 0, tzinfo=UTC)
    assert rows["b"]["submit_time"] == dt.datetime(2017, 12, 7, 9, 0, tzinfo=UTC)


def test_timezone_option_overrides_pacific(tmp_path: Path) -> None:
    [row] = _rows(_write(tmp_path, [_job()]), tz="UTC")
    assert row["submit_time"] == dt.datetime(2017, 10, 7, 1, 11, 39, tzinfo=UTC)
    with pytest.raises(BadInputError, match="unknown timezone"):
        READER.read(_write(tmp_path, [_job()]), ReadOptions(tz="Mars/Olympus"))


def test_job_spanning_the_autumn_clock_change_runs_an_extra_hour(tmp_path: Path) -> None:
    # 2017-11-05 02:00 PDT -> 01:00 PST: wall clocks show 3 h, the job really ran 4 h.
    job = _job(start_time="2017-11-04 23:00:00", end_time="2017-11-05 02:00:00")
    [row] = _rows(_write(tmp_path, [job]))
    assert (row["end_time"] - row["start_time"]) == dt.timedelta(hours=4)


def test_none_and_missing_times_are_null_not_invented(tmp_path: Path) -> None:
    queued = _job("q", status="Killed", start_time=None, end_time="None", detail=[])
    del queued["submitted_time"]
    [row] = _rows(_write(tmp_path, [queued]))
    assert row["submit_time"] is None and row["start_time"] is None and row["end_time"] is None
    assert row["gpus"] is None and row["nodes"] == 1
    assert row["state"] == "CANCELLED"


def test_bad_records_are_skipped_with_their_record_number(tmp_path: Path) -> None:
    jobs: list[Any] = [_job("ok1"), "junk", _job("bad_time", start_time="yesterday"), _job("ok2")]
    jobs.append({"status": "Pass"})  # no jobid
    jobs.append(_job("backwards", start_time="2017-10-07 05:00:00", end_time="2017-10-07 04:00:00"))
    jobs.append(_job("overflow", submitted_time="9999-12-31 23:59:59"))  # past datetime's range in UTC
    p = _write(tmp_path, jobs)
    res = READER.read(p, ReadOptions())
    assert res.table.column("job_id").to_pylist() == ["ok1", "ok2"]
    assert res.rows_read == 7 and res.bad_row_count == 5
    lines = [b.line for b in res.bad_rows]
    assert lines == [2, 3, 5, 6, 7]
    assert all(b.file == str(p) for b in res.bad_rows)
    assert "start_time" in res.bad_rows[1].reason and "jobid" in res.bad_rows[2].reason


def test_strict_makes_the_first_bad_record_fatal(tmp_path: Path) -> None:
    p = _write(tmp_path, [_job("ok"), _job("bad", detail="m1")])
    with pytest.raises(BadInputError, match=r"jobs\.json:2: detail"):
        READER.read(p, ReadOptions(strict=True))


def test_truncated_file_keeps_the_jobs_before_the_damage(tmp_path: Path) -> None:
    text = json.dumps([_job("a"), _job("b"), _job("c")], indent=2)
    p = tmp_path / "cut.json"
    p.write_text(text[: text.index('"c"') + 10])
    res = READER.read(p, ReadOptions())
    assert res.table.column("job_id").to_pylist() == ["a", "b"]
    assert res.bad_row_count == 1 and res.bad_rows[0].line == 3
    assert "rest of the file is skipped" in res.bad_rows[0].reason


@pytest.mark.parametrize(
    ("content", "message"),
    [(b'{"jobid": "x"}', "JSON list"), (b"\x00\x01\xff\xfe junk", "UTF-8"), (b"\x1f\x8bnot gzip", "gzip")],
)
def test_unreadable_files_give_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "x.json"
    p.write_bytes(content)
    with pytest.raises(BadInputError, match=message):
        READER.read(p, ReadOptions())


def test_original_cluster_job_log_shape_uses_the_last_attempt(tmp_path: Path) -> None:
    first = {"start_time": "2017-10-03 10:00:00", "end_time": "2017-10-03 10:05:00", "detail": []}
    last = {
        "start_time": "2017-10-03 11:00:00",
        "end_time": "2017-10-03 13:00:00",
        "detail": [{"ip": "m1", "gpus": ["gpu0"]}, {"ip": "m2", "gpus": ["gpu0"]}],
    }
    job = {"status": "Failed", "vc": "v", "jobid": "j", "submitted_time": "2017-10-03 09:00:00", "user": "u"}
    never = dict(job, jobid="never", status="Killed", attempts=[])
    p = _write(tmp_path, [dict(job, attempts=[first, last]), never])
    res = READER.read(p, ReadOptions())
    rows = {r["job_id"]: r for r in res.table.to_pylist()}
    assert rows["j"]["start_time"] == dt.datetime(2017, 10, 3, 18, 0, tzinfo=UTC)
    assert rows["j"]["gpus"] == 2.0 and rows["j"]["nodes"] == 2 and rows["j"]["state"] == "FAILED"
    assert rows["never"]["start_time"] is None and rows["never"]["gpus"] is None
    assert any("attempts" in n for n in res.notes)


def test_sniff_recognises_plain_and_gzipped_philly_but_not_other_json(tmp_path: Path) -> None:
    plain = _write(tmp_path, [_job()])
    gz = tmp_path / "jobs.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    other = _write(tmp_path, [{"id": 1, "name": "x"}], "other.json")
    assert READER.sniff(plain, plain.read_bytes())
    assert READER.sniff(gz, gz.read_bytes())
    assert not READER.sniff(other, other.read_bytes())
    assert _rows(gz) == _rows(plain)


def test_bundled_sample_is_detected_and_matches_the_shared_trace(shared_traces: Path) -> None:
    bundled = sample_path("philly_jobs.json.gz")
    assert sniff(bundled) == "philly"
    assert (
        READER.read(bundled, ReadOptions()).table
        == READER.read(shared_traces / "philly-dre" / "philly_jobs.json", ReadOptions()).table
    )


def test_real_sample_failed_share_is_46_3_pct_of_jobs_and_32_2_pct_of_gpu_hours(tmp_db: Path) -> None:
    res = READER.read(sample_path("philly_jobs.json.gz"), ReadOptions())
    assert res.rows_read == 5910 and res.bad_row_count == 0
    with JobStore(tmp_db) as store:
        assert store.upsert(res.table) == 5910
        jobs, gpu_hours, failed_jobs, failed_hours = store.con.execute(
            "SELECT count(*), sum(gpu_hours), count(*) FILTER (state = 'FAILED'), "
            "sum(gpu_hours) FILTER (state = 'FAILED') FROM jobs_v"
        ).fetchone() or (0, 0, 0, 0)
    assert round(100 * failed_jobs / jobs, 1) == 46.3
    assert round(100 * failed_hours / gpu_hours, 1) == 32.2
    assert round(gpu_hours / 1000) == 762  # README: 761k GPU-hours (from runtime_min, without DST)


def test_runtime_from_start_end_agrees_with_runtime_min_except_across_the_clock_change() -> None:
    raw = json.loads(gzip.decompress(sample_path("philly_jobs.json.gz").read_bytes()))
    rows = {r["job_id"]: r for r in _rows(sample_path("philly_jobs.json.gz"))}
    off = []
    for job in raw:
        r = rows[job["jobid"]]
        minutes = (r["end_time"] - r["start_time"]).total_seconds() / 60
        if abs(minutes - job["runtime_min"]) > 0.01:
            off.append(minutes - job["runtime_min"])
            assert job["start_time"] < "2017-11-05 02:00:00" <= job["end_time"]
    # runtime_min subtracts naive wall-clock times; 56 jobs ran through the 2017-11-05 repeat hour.
    assert len(off) == 56 and all(abs(d - 60) < 0.01 for d in off)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=20_000), junk=st.binary(max_size=40))
def test_damaged_real_file_never_raises_anything_but_a_clear_error(
    tmp_path: Path, cut: int, junk: bytes
) -> None:
    text = gzip.decompress(sample_path("philly_jobs.json.gz").read_bytes())[:30_000]
    p = tmp_path / "damaged.json"
    p.write_bytes(text[:cut] + junk + text[cut + len(junk) :])
    try:
        res = READER.read(p, ReadOptions())
    except BadInputError as e:
        assert str(e).startswith(str(p))
    else:
        assert res.table.schema == JOB_SCHEMA
        assert res.rows_read >= res.table.num_rows
