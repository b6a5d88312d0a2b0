"""The audit's totals against an independent computation in plain Python over the raw files.

Two real formats: the Philly job log (json + datetime) and Slurm's `sacct -P` output (str.split('|')).
Each ingests through `headway ingest` and reads the figures from `headway audit --json`, so the whole path
(reader, store, SQL) is checked against a few lines of Python that share no code with it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from headway.cli import app

pytestmark = pytest.mark.shared

SUCCESS = {"COMPLETED"}
WASTE = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}
ENDED = SUCCESS | WASTE | {"CANCELLED", "PREEMPTED"}


def _ingest_and_audit(tmp_path: Path, fmt: str, path: Path, *extra: str) -> dict[str, Any]:
    db = tmp_path / f"{fmt}.duckdb"
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", "--format", fmt, "--db", str(db), "--json", *extra, str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def _expected(jobs: list[tuple[str, float, float | None]]) -> dict[str, Any]:
    """(state, gpus, runtime seconds or None) -> the audit's headline figures, by DESIGN.md's definitions."""
    by_state: dict[str, dict[str, float]] = defaultdict(lambda: {"jobs": 0, "gpu_hours": 0.0})
    gpu_jobs = 0
    total_gh = 0.0
    for state, gpus, runtime in jobs:
        gh = gpus * max(runtime or 0.0, 0.0) / 3600.0
        total_gh += gh
        if gpus > 0:  # the audit covers GPU jobs by default
            gpu_jobs += 1
            by_state[state]["jobs"] += 1
            by_state[state]["gpu_hours"] += gh
    ended_n = sum(v["jobs"] for s, v in by_state.items() if s in ENDED)
    ended_gh = sum(v["gpu_hours"] for s, v in by_state.items() if s in ENDED)
    ok = by_state.get("COMPLETED", {"jobs": 0, "gpu_hours": 0.0})
    return {
        "jobs": len(jobs),
        "gpu_jobs": gpu_jobs,
        "gpu_hours": total_gh,
        "by_state": dict(by_state),
        "rate_count": ok["jobs"] / ended_n,
        "rate_gh": ok["gpu_hours"] / ended_gh,
        "wasted": sum(v["gpu_hours"] for s, v in by_state.items() if s in WASTE),
    }


def _assert_matches(report: dict[str, Any], exp: dict[str, Any]) -> None:
    assert report["totals"]["jobs"] == exp["jobs"]
    assert report["totals"]["gpu_jobs"] == exp["gpu_jobs"]
    assert report["totals"]["gpu_hours"] == pytest.approx(exp["gpu_hours"], rel=1e-9)
    assert set(report["by_state"]) == set(exp["by_state"])
    for state, v in exp["by_state"].items():
        assert report["by_state"][state]["jobs"] == v["jobs"], state
        assert report["by_state"][state]["gpu_hours"] == pytest.approx(v["gpu_hours"], rel=1e-9, abs=1e-9)
    assert report["completion_rate"]["by_count"] == pytest.approx(exp["rate_count"], rel=1e-12)
    assert report["completion_rate"]["by_gpu_hours"] == pytest.approx(exp["rate_gh"], rel=1e-9)
    assert report["wasted_gpu_hours"] == pytest.approx(exp["wasted"], rel=1e-9)


def _philly_jobs(path: Path) -> list[tuple[str, float, float | None]]:
    pacific = ZoneInfo("America/Los_Angeles")  # the trace's naive times are the cluster's local time

    def t(s: str | None) -> dt.datetime | None:
        if not s or s == "None":
            return None
        # to UTC before subtracting: Python subtracts two times of one zone as wall-clock times (no DST)
        return dt.datetime.strptime(s, "%Y-%m-%d %H:%M:%S").replace(tzinfo=pacific).astimezone(dt.UTC)

    out = []
    for j in json.loads(path.read_text()):
        state = {"Pass": "COMPLETED", "Failed": "FAILED", "Killed": "CANCELLED"}[j["status"]]
        gpus = float(sum(len(d["gpus"]) for d in j["detail"] or []))
        start, end = t(j["start_time"]), t(j["end_time"])
        runtime = (end - start).total_seconds() if start and end else None
        out.append((state, gpus, runtime))
    return out


def test_philly_audit_totals_match_a_plain_python_count_of_the_raw_json(
    tmp_path: Path, shared_traces: Path
) -> None:
    raw = shared_traces / "philly-dre" / "philly_jobs.json"
    report = _ingest_and_audit(tmp_path, "philly", raw)
    exp = _expected(_philly_jobs(raw))
    _assert_matches(report, exp)
    assert exp["jobs"] == 5910


def test_philly_must_show_failed_is_46_3_percent_of_jobs_and_32_2_percent_of_gpu_hours(
    tmp_path: Path, shared_traces: Path
) -> None:
    report = _ingest_and_audit(tmp_path, "philly", shared_traces / "philly-dre" / "philly_jobs.json")
    failed = report["by_state"]["FAILED"]
    assert round(failed["share_jobs"] * 100, 1) == 46.3
    assert round(failed["share_gpu_hours"] * 100, 1) == 32.2
    res = CliRunner().invoke(app, ["audit", "--db", str(tmp_path / "philly.duckdb")], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    failed_line = next(line for line in res.stdout.splitlines() if "FAILED" in line)
    assert "46.3%" in failed_line and "32.2%" in failed_line


def _sacct_gpus(tres: str) -> float:
    untyped, typed = None, 0.0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            untyped = float(value)
        elif key.startswith("gres/gpu:"):
            typed += float(value)
    return untyped if untyped is not None else typed


def _sacct_jobs(path: Path) -> list[tuple[str, float, float | None]]:
    lines = path.read_text().splitlines()
    header = lines[0].split("|")
    out = []
    for line in lines[1:]:
        if not line.strip():
            continue
        row = dict(zip(header, line.split("|"), strict=True))
        if "." in row["JobID"]:  # a job step, not a job
            continue
        state = row["State"].split()[0]
        assert state in ENDED | {"RUNNING", "PENDING"}, state
        runtime = None
        if row["Start"] not in ("Unknown", "None", "") and row["End"] not in ("Unknown", "None", ""):
            start = dt.datetime.fromisoformat(row["Start"])
            end = dt.datetime.fromisoformat(row["End"])
            runtime = (end - start).total_seconds()
        out.append((state, _sacct_gpus(row["AllocTRES"]), runtime))
    return out


def test_sacct_audit_totals_match_a_plain_python_count_of_the_raw_text(
    tmp_path: Path, shared_traces: Path
) -> None:
    pytest.importorskip("headway.traces.sacct")
    raw = shared_traces / "slurm-22.05" / "sacct_allocations.txt"
    report = _ingest_and_audit(tmp_path, "sacct", raw, "--tz", "UTC")
    exp = _expected(_sacct_jobs(raw))
    _assert_matches(report, exp)
    assert exp["jobs"] == 23 and exp["by_state"]["TIMEOUT"]["jobs"] == 1
    assert report["timeouts"]["jobs"] == 1 and report["timeouts"]["time_limits_known"] is True
