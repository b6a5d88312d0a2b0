"""Parquet in the job schema (what `headway export` and `headway synth` write) read back by `ingest`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.sim.synth import generate
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.parquet import READER
from headway.traces.registry import sniff

runner = CliRunner()


def test_an_export_ingested_into_a_new_store_audits_the_same(tmp_path: Path) -> None:
    src = tmp_path / "a.parquet"
    pq.write_table(generate(300, seed=4), src)
    first, second, exported = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "e.parquet"
    for argv in (
        ["ingest", str(src), "--db", str(first)],
        ["export", "--db", str(first), "--parquet", str(exported)],
        ["ingest", str(exported), "--db", str(second), "--json"],
    ):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["files"][0]["format"] == "parquet"
    audits = [
        json.loads(runner.invoke(app, ["audit", "--db", str(db), "--json"]).stdout) for db in (first, second)
    ]
    for key in ("totals", "by_state", "wasted_gpu_hours", "weekly"):
        assert audits[0][key] == audits[1][key], key


def test_each_row_keeps_its_source_unless_source_is_given(tmp_path: Path) -> None:
    t = generate(10, seed=1)
    t = t.set_column(t.schema.get_field_index("source"), "source", pa.array(["x"] * 5 + ["y"] * 5))
    p = tmp_path / "two.parquet"
    pq.write_table(t, p)
    assert sniff(p) == "parquet"
    assert sorted(set(READER.read(p, ReadOptions()).table.column("source").to_pylist())) == ["x", "y"]
    assert set(READER.read(p, ReadOptions(source="lab")).table.column("source").to_pylist()) == {"lab"}


def test_rows_that_break_the_schemas_rules_are_bad_rows(tmp_path: Path) -> None:
    t = generate(6, seed=2)
    states = t.column("state").to_pylist()
    states[1] = "EXPLODED"
    gpus = t.column("gpus").to_pylist()
    gpus[2] = -1.0
    end = t.column("end_time").to_pylist()
    end[3] = t.column("start_time")[3].as_py().replace(year=2000)
    t = t.set_column(t.schema.get_field_index("state"), "state", pa.array(states, pa.string()))
    t = t.set_column(t.schema.get_field_index("gpus"), "gpus", pa.array(gpus, pa.float64()))
    t = t.set_column(
        t.schema.get_field_index("end_time"), "end_time", pa.array(end, t.schema.field("end_time").type)
    )
    p = tmp_path / "bad.parquet"
    pq.write_table(t, p)
    res = READER.read(p, ReadOptions())
    assert res.rows_read == 6 and res.table.num_rows == 3 and res.bad_row_count == 3
    assert [b.line for b in res.bad_rows] == [2, 3, 4]
    assert {b.reason for b in res.bad_rows} == {
        "state: not a job state",
        "gpus: negative",
        "ends before it starts",
    }
    assert pc.all(pc.is_in(res.table.column("job_id"), value_set=t.column("job_id"))).as_py()
    with pytest.raises(BadInputError, match=r"bad.parquet:2: state"):
        READER.read(p, ReadOptions(strict=True))


def test_an_empty_job_id_is_a_bad_row_as_in_the_text_formats(tmp_path: Path) -> None:
    """Three rows with '' as their id collapsed into one stored job."""
    t = generate(5, seed=3)
    ids = t.column("job_id").to_pylist()
    ids[1] = ids[2] = ""
    ids[3] = "  "
    t = t.set_column(t.schema.get_field_index("job_id"), "job_id", pa.array(ids, pa.string()))
    p = tmp_path / "ids.parquet"
    pq.write_table(t, p)
    res = READER.read(p, ReadOptions())
    assert res.table.num_rows == 2 and [b.line for b in res.bad_rows] == [2, 3, 4]
    assert {b.reason for b in res.bad_rows} == {"job_id: empty"}


def test_a_parquet_file_of_something_else_is_one_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), p)
    with pytest.raises(BadInputError, match=r"not a Parquet file in the job schema.*no job_id column"):
        READER.read(p, ReadOptions())
    res = runner.invoke(app, ["ingest", str(p), "--db", str(tmp_path / "j.duckdb")])
    assert res.exit_code == 1 and "no job_id column" in res.output and "Traceback" not in res.output


def test_times_past_the_calendar_are_bad_rows(tmp_path: Path) -> None:
    """Arrow holds times 292,000 years out; Python and every report stop at 9999 (one such row broke the
    audit of the whole store)."""
    ts = pa.timestamp("us", tz="UTC")
    t = pa.table(
        {
            "job_id": ["1", "2"],
            "state": ["COMPLETED", "FAILED"],
            "gpus": [1.0, 1.0],
            "submit_time": pa.array([1_700_000_000_000_000, 57_972 * 365 * 86_400 * 10**6], ts),
        }
    )
    p = tmp_path / "far.parquet"
    pq.write_table(t, p)
    res = READER.read(p, ReadOptions())
    assert res.table.column("job_id").to_pylist() == ["1"]
    assert [(b.line, b.reason) for b in res.bad_rows] == [(2, "submit_time: beyond year 9999")]


def test_the_preemption_fields_pass_through_an_export_and_back(tmp_path: Path) -> None:
    """A Parquet file's preemptible and checkpoint_every (issue 27) are stored, exported and read back;
    a file without them (an older export) reads them as null, not listed among missing fields."""
    t = pa.table(
        {
            "job_id": ["1", "2", "3"],
            "state": ["COMPLETED", "RUNNING", "PENDING"],
            "preemptible": pa.array([1, 0, None], pa.int8()),  # a 0/1 column written by pandas
            "checkpoint_every": [600, None, 1800],
        }
    )
    src, db, out = tmp_path / "in.parquet", tmp_path / "j.duckdb", tmp_path / "out.parquet"
    pq.write_table(t, src)
    for argv in (["ingest", str(src), "--db", str(db)], ["export", "--db", str(db), "--parquet", str(out)]):
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, res.output
    back = READER.read(out, ReadOptions())
    cols = ("job_id", "preemptible", "checkpoint_every")
    got = sorted(back.table.select(cols).to_pylist(), key=lambda r: r["job_id"])
    assert [tuple(r.values()) for r in got] == [("1", True, 600), ("2", False, None), ("3", None, 1800)]
    assert pq.read_schema(out).field("preemptible").type == pa.bool_()
    older = tmp_path / "older.parquet"
    pq.write_table(t.drop_columns(["preemptible", "checkpoint_every"]), older)
    res_old = READER.read(older, ReadOptions())
    assert res_old.table.column("preemptible").null_count == 3
    assert not {"preemptible", "checkpoint_every"} & set(res_old.missing_fields)
