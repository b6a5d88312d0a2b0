"""Gzipped job logs: `ingest` and `simulate` read them like the plain files, and name the user's file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.commands.simulate import load_jobs
from headway.schema import table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.compressed import plain_file, relabel
from headway.traces.sacct import READER

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def _gz(src: Path, dst: Path) -> Path:
    dst.write_bytes(gzip.compress(src.read_bytes()))
    return dst


def test_a_gzipped_sacct_log_gives_the_same_jobs_and_bad_rows_name_the_gz_file(tmp_path: Path) -> None:
    src = DATA / "sacct_edge_cases.txt"
    gz = _gz(src, tmp_path / "jobs.txt.gz")
    plain = READER.read(src, ReadOptions(tz="UTC"))
    with plain_file(gz) as p:
        assert p != gz and p.name == "jobs.txt"
        res = relabel(READER.read(p, ReadOptions(tz="UTC")), p, gz)
    assert not p.exists()  # the temporary copy is gone
    assert table_to_records(res.table) == table_to_records(plain.table)
    assert res.bad_row_count == plain.bad_row_count > 0
    assert {b.file for b in res.bad_rows} == {str(gz)}
    assert "decompressed from gzip" in res.notes


def test_ingest_and_simulate_take_gz_files_and_a_broken_one_is_one_clear_line(tmp_path: Path) -> None:
    gz = _gz(DATA / "sacct_22.05_sample.json", tmp_path / "sacct.json.gz")
    out = runner.invoke(app, ["ingest", str(gz), "--db", str(tmp_path / "s.duckdb"), "--json"])
    assert out.exit_code == 0, out.output
    (f,) = json.loads(out.stdout)["files"]
    assert (f["format"], f["jobs_stored"]) == ("sacct", 4)
    table, info = load_jobs(gz, "auto", None)
    assert table.num_rows == 4 and info.format == "sacct"
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gz.read_bytes()[:60])
    with pytest.raises(BadInputError, match=r"broken.gz: not a readable gzip file"), plain_file(broken):
        pass
    res = runner.invoke(app, ["ingest", str(broken), "--db", str(tmp_path / "s.duckdb")])
    assert res.exit_code != 0 and "not a readable gzip file" in res.output and "Traceback" not in res.output


def test_errors_about_the_temporary_copy_name_the_users_file(tmp_path: Path) -> None:
    gz = tmp_path / "notes.csv.gz"
    gz.write_bytes(gzip.compress(b"just one column\nand no more\n"))
    with pytest.raises(BadInputError) as e, plain_file(gz) as p:
        READER.read(p, ReadOptions())
    assert str(gz) in str(e.value) and "headway-gunzip" not in str(e.value)
