"""What no reader should take literally: limits of 0 or less, node counts of 0 or less, missing GPU counts,
a job listed twice, an empty Parquet file; and metrics that only mean something with users to compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from typer.testing import CliRunner

from headway.cli import app
from headway.schema import JOB_SCHEMA

runner = CliRunner()

MAPPING = """
[format]
time_format = "epoch"
[fields]
job_id = "id"
user = "user"
name = "name"
state = "state"
submit_time = "submit"
start_time = "start"
end_time = "end"
gpus = "gpus"
nodes = "nodes"
time_limit = "limit"
[states]
ok = "COMPLETED"
fail = "FAILED"
"""
HEADER = "id,user,name,state,submit,start,end,gpus,nodes,limit\n"


def _trace(tmp_path: Path, rows: str) -> list[str]:
    (tmp_path / "map.toml").write_text(MAPPING)
    csv = tmp_path / "jobs.csv"
    csv.write_text(HEADER + rows)
    return [str(csv), "--mapping", str(tmp_path / "map.toml")]


def _simulate(args: list[str]) -> tuple[dict[str, Any], str]:
    """The JSON, and the reader's notes in one string."""
    res = runner.invoke(app, ["simulate", *args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out, " | ".join(out["trace"]["notes"])


def _one_node(tmp_path: Path, rows: str, *extra: str) -> tuple[dict[str, Any], str]:
    """A replay on one node of 4 GPUs (fifo unless `extra` says otherwise)."""
    return _simulate([*_trace(tmp_path, rows), "--nodes", "1", "--gpus-per-node", "4", *extra])


def test_a_time_limit_of_zero_or_less_is_no_limit_and_does_not_jump_the_queue(tmp_path: Path) -> None:
    # One node of 4 GPUs: A runs first; B (50 s, submitted next) should follow it at 100 s. Read at face
    # value, C's limit of 0 and D's of -60 made them the cheapest jobs (impact) or backfillable (EASY).
    args = _trace(
        tmp_path,
        "A,u1,n1,ok,1000000,1000000,1000100,4,1,1000\n"
        "B,u2,n2,ok,1000001,1000001,1000051,4,1,1000\n"
        "C,u3,n3,ok,1000002,1000002,1005002,4,1,0\n"
        "D,u4,n4,ok,1000003,1000003,1005003,4,1,-60\n",
    )
    doc, notes = _simulate(
        [*args, "--nodes", "1", "--gpus-per-node", "4", "--policy", "impact,multifactor", "--explain", "B"]
    )
    assert "2 row(s) with a time limit of 0 or less: read as no time limit" in notes
    for policy in ("impact", "multifactor"):
        assert doc["explain"][policy]["queue_delay"] == 99.0, policy


def test_bad_node_counts_and_missing_gpu_counts_are_named_not_guessed(tmp_path: Path) -> None:
    rows = (
        "A,u1,n1,ok,1000000,1000000,1000100,2,0,\nB,u2,n2,ok,1000001,1000001,1000051,,1,\n"
        "C,u2,n2,ok,1000002,1000002,1000052,1,-3,\n"
    )
    doc, notes = _one_node(tmp_path, rows, "--policy", "fifo")
    assert "2 row(s) with a node count of 0 or less: read as unknown" in notes
    assert "1 row(s) without a GPU count: left unknown" in notes
    assert doc["excluded_counts"] == {"no GPU count in the trace": 1}
    assert doc["policies"]["fifo"]["jobs"] == 2


def test_a_job_listed_twice_is_replayed_once_from_its_last_listing(tmp_path: Path) -> None:
    rows = (
        "A,u1,n1,fail,1000000,1000000,1000100,2,1,\nB,u2,n2,ok,1000001,1000001,1000051,1,1,\n"
        "A,u1,n1,ok,1000000,1000000,1000300,2,1,\n"
    )
    doc, _ = _one_node(tmp_path, rows, "--policy", "fifo")
    fifo = doc["policies"]["fifo"]
    assert fifo["jobs"] == 2 and fifo["jobs_successful"] == 2  # A's last listing: COMPLETED, 300 s
    assert list(doc["excluded_counts"].values()) == [1]
    assert next(iter(doc["excluded_counts"])).startswith("listed again later in the trace")


def test_an_empty_parquet_file_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    pq.write_table(JOB_SCHEMA.empty_table(), empty)
    res = runner.invoke(app, ["simulate", str(empty)])
    assert res.exit_code == 1 and "no jobs to simulate" in res.stderr, res.output
    db = tmp_path / "s.duckdb"
    ing = runner.invoke(app, ["ingest", str(empty), "--db", str(db), "--json"])
    assert ing.exit_code == 0, ing.output
    assert json.loads(ing.stdout)["files"][0]["jobs_stored"] == 0


def test_fairness_needs_two_users_and_slowdown_never_drops_below_one(tmp_path: Path) -> None:
    # z0 lasts 0 s and z2 10 s, both start at once: JCT / max(runtime, 10 s) would be 0 and 1.
    rows = (
        "z0,{u},n,ok,1000000,1000000,1000000,2,1,\nz1,{u},n,ok,1000000,1000000,1000050,2,1,\n"
        "z2,{u},n,ok,1000000,1000000,1000010,2,1,\n"
    )
    lone, _ = _one_node(tmp_path, rows.format(u="u1"))
    for m in lone["policies"].values():
        assert m["jain_fairness"] is None
        assert m["bounded_slowdown_mean"] >= 1.0
    nobody, _ = _one_node(tmp_path, rows.format(u=""))
    assert all(m["jain_fairness"] is None for m in nobody["policies"].values())


def test_explain_of_a_preempted_job_counts_every_wait_not_only_the_first(tmp_path: Path) -> None:
    args = _trace(
        tmp_path,
        "A,u1,n1,ok,1000000,1000000,1020000,4,1,\nB,u2,n2,ok,1001000,1001000,1011000,4,1,\n"
        "C,u3,n3,ok,1002000,1002000,1002500,4,1,\n",
    )
    las = [*args, "--nodes", "1", "--gpus-per-node", "4", "--policy", "las", "--explain", "A"]
    doc, _ = _simulate(las)
    a = doc["explain"]["las"]
    assert a["queue_delay"] == 0.0 and a["preemptions"] >= 1
    # End to end 30,590 s against 20,000 s of its own work: every wait and restart penalty counted.
    assert a["waited_in_all"] == doc["explain"]["las"]["job"]["end"] - 20_000.0 > 10_000.0
    text = runner.invoke(app, ["simulate", *las]).stdout
    assert "preempted" in text and "waiting or restarting in all" in text


def test_a_gpu_count_no_cluster_has_is_a_bad_row_and_the_store_still_audits(tmp_path: Path) -> None:
    args = _trace(
        tmp_path,
        "A,u1,n1,ok,1000000,1000000,1000100,1e19,1,\nB,u1,n1,ok,1000000,1000000,1000100,2,1,\n",
    )
    db = tmp_path / "s.duckdb"
    ing = runner.invoke(app, ["ingest", *args, "--db", str(db), "--json"])
    assert ing.exit_code == 0, ing.output
    f = json.loads(ing.stdout)["files"][0]
    assert f["jobs_stored"] == 1 and "GPU count is over 1,000,000" in str(f["bad_row_examples"])
    audit = runner.invoke(app, ["audit", "--db", str(db), "--json"])
    assert audit.exit_code == 0 and json.loads(audit.stdout)["totals"]["gpu_hours"] > 0
