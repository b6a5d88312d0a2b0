"""A job store of the headway before preemption (issue 27) through the commands: read as it is by those
that only read, upgraded in place by the first that writes, its earlier export still replaceable."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
from typer.testing import CliRunner

from headway.cli import app
from test_store import OLD_JOBS, OLD_VIEW

runner = CliRunner()

# Ten ended jobs of two users, as the earlier headway stored them (no preemption columns).
OLD_ROWS = """INSERT INTO jobs SELECT i::VARCHAR, CASE WHEN i % 2 = 0 THEN 'ann' ELSE 'bob' END, 'lab',
    'train', 'gpu', 'normal', TIMESTAMPTZ '2026-01-01 00:00:00+00' + INTERVAL (i) HOUR,
    TIMESTAMPTZ '2026-01-01 00:10:00+00' + INTERVAL (i) HOUR,
    TIMESTAMPTZ '2026-01-01 01:10:00+00' + INTERVAL (i) HOUR, 4.0, 1, 8, 64000, 7200,
    CASE WHEN i % 3 = 0 THEN 'FAILED' ELSE 'COMPLETED' END, CASE WHEN i % 3 = 0 THEN 1 ELSE 0 END, 'old'
    FROM range(10) t(i)"""


def _earlier_store(db: Path) -> None:
    with duckdb.connect(str(db)) as c:
        c.execute(OLD_JOBS)
        c.execute(OLD_VIEW)
        c.execute(OLD_ROWS)


def _columns(db: Path) -> list[str]:
    with duckdb.connect(str(db), read_only=True) as c:
        return [str(r[0]) for r in c.execute("DESCRIBE jobs").fetchall()]


def test_an_earlier_store_audits_and_exports_read_only_then_is_upgraded_by_the_next_ingest(
    tmp_path: Path,
) -> None:
    db, out = tmp_path / "old.duckdb", tmp_path / "jobs.parquet"
    _earlier_store(db)
    res = runner.invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    totals = json.loads(res.stdout)["totals"]
    assert (totals["jobs"], totals["gpu_hours"]) == (10, 40.0)  # ten 1-hour runs of 4 GPUs
    # An export of the earlier headway (its columns less the two) may be replaced by a new one.
    with duckdb.connect(str(db), read_only=True) as c:
        c.execute(f"COPY (SELECT * FROM jobs_v) TO '{out}' (FORMAT PARQUET)")
    res = runner.invoke(app, ["export", "--db", str(db), "--parquet", str(out)])
    assert res.exit_code == 0, res.output
    exported = pq.read_table(out)
    assert exported.num_rows == 10 and exported.column("preemptible").null_count == 10
    assert "preemptible" not in _columns(db)  # reading changed nothing
    # The first command that writes adds the columns; the jobs stay, the new ones carry the fields.
    new = tmp_path / "new.parquet"
    table = exported.select(["job_id", "state", "source", "user", "submit_time", "gpus"]).slice(0, 2)
    table = table.append_column("preemptible", [[True, False]]).append_column(
        "checkpoint_every", [[600, None]]
    )
    pq.write_table(table.set_column(0, "job_id", [["n1", "n2"]]), new)
    res = runner.invoke(app, ["ingest", str(new), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    assert _columns(db)[-2:] == ["preemptible", "checkpoint_every"]
    with duckdb.connect(str(db), read_only=True) as c:
        got = c.execute(
            "SELECT count(*), count(preemptible), sum(checkpoint_every), "
            "count(*) FILTER (WHERE gpu_hours > 0) FROM jobs_v"
        ).fetchone()
    assert got == (12, 2, 600, 10)
