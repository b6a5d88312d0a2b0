"""`headway synth`: writes a trace the rest of headway reads, and fails cleanly on bad input."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.schema import JOB_SCHEMA

runner = CliRunner()


def test_synth_writes_parquet_in_the_job_schema(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    res = runner.invoke(app, ["synth", "--jobs", "500", "--out", str(out), "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["jobs"] == 500
    assert sum(doc["states"].values()) == 500
    t = pq.read_table(out)
    assert t.schema.equals(JOB_SCHEMA)
    assert t.num_rows == 500


def test_synth_sacct_output_ingests_into_the_store(tmp_path: Path) -> None:
    out = tmp_path / "s.txt"
    db = tmp_path / "jobs.duckdb"
    res = runner.invoke(app, ["synth", "-n", "300", "-o", str(out), "--format", "sacct"])
    assert res.exit_code == 0, res.output
    assert "headway ingest --format sacct --tz UTC" in res.stdout
    res = runner.invoke(
        app, ["ingest", "--format", "sacct", "--tz", "UTC", "--db", str(db), "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["jobs_in_store"] == 300


def test_synth_csv_comes_with_a_mapping_that_ingests_it(tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    db = tmp_path / "jobs.duckdb"
    res = runner.invoke(app, ["synth", "-n", "120", "-o", str(out), "--format", "csv", "--json"])
    assert res.exit_code == 0, res.output
    mapping = tmp_path / "s.mapping.toml"
    assert mapping.is_file()
    args = ["ingest", "--format", "csv", "--mapping", str(mapping), "--db", str(db), "--json", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["jobs_in_store"] == 120
    assert doc["files"][0]["bad_rows"] == 0


def test_synth_rejects_unknown_format_in_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["synth", "-n", "10", "-o", str(tmp_path / "x"), "--format", "xlsx"])
    assert res.exit_code == 1
    assert "--format" in res.output
    assert "Traceback" not in res.output


def test_synth_rejects_a_missing_directory(tmp_path: Path) -> None:
    res = runner.invoke(app, ["synth", "-n", "10", "-o", str(tmp_path / "nope" / "x.parquet")])
    assert res.exit_code == 1
    assert "no such directory" in " ".join(res.output.split())


def test_no_output_option_replaces_a_job_store(tmp_path: Path) -> None:
    """A store named by mistake as an output file (a model, a synthetic log, an export, a report) is
    refused before any work, and keeps every job."""
    db = tmp_path / "jobs.duckdb"
    res = runner.invoke(app, ["synth", "-n", "80", "-o", str(tmp_path / "s.parquet")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["ingest", "--db", str(db), str(tmp_path / "s.parquet")])
    assert res.exit_code == 0, res.output
    before = db.read_bytes()
    for argv in (
        ["predict", "train", "--db", str(db), "--out", str(db)],
        ["synth", "-n", "10", "-o", str(db)],
        ["synth", "-n", "10", "-o", str(db), "--format", "csv"],
        ["export", "--db", str(db), "--parquet", str(db)],
        ["audit", "--db", str(db), "--html", str(db)],
    ):
        res = runner.invoke(app, argv)
        assert res.exit_code == 1, argv
        assert "is a DuckDB database (a job store?)" in res.output, argv
    assert db.read_bytes() == before
    res = runner.invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["totals"]["jobs"] == 80


def test_an_output_that_is_a_pipe_is_written_not_read(tmp_path: Path) -> None:
    """The store check opened the output to read its first bytes: on a FIFO or /dev/stdout it waited
    for a writer for ever."""
    import os
    import threading

    from headway.store import is_duckdb_file

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert not is_duckdb_file(fifo)  # returns at once
    res = runner.invoke(app, ["synth", "-n", "5", "-o", str(fifo), "--format", "sacct"])
    reader.join(timeout=30)
    assert res.exit_code == 0, res.output
    assert got and got[0].startswith(b"JobID|")


def test_demo_refuses_a_report_named_as_its_store(tmp_path: Path) -> None:
    same = tmp_path / "x"
    res = runner.invoke(app, ["demo", "--db", str(same), "--html", str(same)])
    assert res.exit_code == 1 and "is the job store given as --db" in " ".join(res.output.split())
    assert not same.exists()


def test_synth_of_more_jobs_than_memory_holds_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A quadrillion jobs need petabytes (more than any address space): numpy's MemoryError came out as a
    Python traceback; it is one error line now, and nothing is written."""
    out = tmp_path / "huge.parquet"
    res = runner.invoke(app, ["synth", "-n", str(10**15), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "not enough memory to generate that many jobs" in " ".join(res.stderr.split())
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["csv", "sacct"])
def test_synth_that_fails_midway_leaves_no_half_written_trace(tmp_path: Path, fmt: str) -> None:
    """A write that failed (a full disk) left a truncated CSV or sacct file under the name given,
    which `ingest` then read as a shorter trace; now nothing is left but what was there before."""
    out = tmp_path / f"s.{fmt}"
    code = "import sys; from headway.cli import app; sys.argv[0] = 'headway'; app()"

    def limit_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    res = subprocess.run(
        [sys.executable, "-c", code, "synth", "-n", "5000", "-o", str(out), "--format", fmt],
        capture_output=True,
        text=True,
        preexec_fn=limit_files,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=300,
    )
    assert res.returncode == 1, res.stderr
    assert "cannot write" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["0", "1"])
def test_sacct_with_a_profile_of_gpu_shares_is_refused_whatever_the_seed(tmp_path: Path, seed: str) -> None:
    """`--profile alibaba --format sacct` failed only when the drawn jobs held a GPU share, after
    generating them: `-n 2 --seed 0` wrote a file, `--seed 1` failed."""
    out = tmp_path / "a.txt"
    args = ["synth", "-n", "2", "--seed", seed, "--profile", "alibaba", "--format", "sacct", "-o", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "sacct cannot express" in " ".join(res.stderr.split())
    assert not out.exists()
