from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.data import sample_path
from headway.store import JobStore


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_demo_ingests_the_sample_prints_the_audit_and_writes_the_report(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    db, html = tmp_path / "headway-demo.duckdb", tmp_path / "headway-report.html"
    assert db.is_file() and html.is_file()
    assert "headway-report.html" in result.stdout and "headway-demo.duckdb" in result.stdout
    assert "FAILED" in result.stdout and "Jeon et al." in result.stdout
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html") and len(page) > 100_000  # chart library inlined
    with JobStore(db, read_only=True) as store:
        assert store.count() == 5910


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str]]:
    """One `headway demo --json` run shared by the tests that read its output (the demo takes seconds)."""
    d = tmp_path_factory.mktemp("demo")
    args = ["demo", "--db", str(d / "d.duckdb"), "--html", str(d / "r.html"), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), args


def test_demo_json_is_one_object_with_the_philly_failure_shares(
    demo_json: tuple[dict[str, Any], list[str]],
) -> None:
    doc, args = demo_json
    assert doc["ingest"]["jobs_stored"] == 5910 and doc["ingest"]["bad_rows"] == 0
    assert doc["html"] == args[4] and Path(args[4]).is_file()
    audit = doc["audit"]
    failed, total = audit["by_state"]["FAILED"], audit["totals"]
    assert round(100 * failed["jobs"] / total["jobs"], 1) == 46.3
    assert round(100 * failed["gpu_hours"] / total["gpu_hours"], 1) == 32.2


def test_running_demo_twice_does_not_duplicate_jobs(demo_json: tuple[dict[str, Any], list[str]]) -> None:
    first, args = demo_json
    second = json.loads(CliRunner().invoke(app, args).stdout)
    assert first["ingest"]["jobs_in_store"] == second["ingest"]["jobs_in_store"] == 5910


def test_demo_into_a_directory_is_one_clear_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--db", str(tmp_path), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    message = " ".join(result.output.split())  # rich wraps long lines
    assert "is a directory; give a file name for --db" in message and "Traceback" not in message


def _independent_philly_totals() -> dict[str, tuple[int, float]]:
    """Jobs and GPU-hours per status straight from the raw JSON, without any headway code."""
    pacific = ZoneInfo("America/Los_Angeles")

    def t(s: str) -> dt.datetime:
        # to UTC before subtracting: Python subtracts two times of the same zone as naive wall clocks
        return dt.datetime.strptime(s, "%Y-%m-%d %H:%M:%S").replace(tzinfo=pacific).astimezone(dt.UTC)

    out: dict[str, tuple[int, float]] = {}
    for job in json.loads(gzip.decompress(sample_path("philly_jobs.json.gz").read_bytes())):
        gpus = sum(len(node["gpus"]) for node in job["detail"])
        hours = (t(job["end_time"]) - t(job["start_time"])).total_seconds() / 3600
        n, h = out.get(job["status"], (0, 0.0))
        out[job["status"]] = (n + 1, h + gpus * hours)
    return out


def test_demo_audit_totals_match_an_independent_count_of_the_raw_file(
    demo_json: tuple[dict[str, Any], list[str]],
) -> None:
    audit = demo_json[0]["audit"]
    raw = _independent_philly_totals()
    assert audit["totals"]["jobs"] == sum(n for n, _ in raw.values())
    assert audit["totals"]["gpu_hours"] == pytest.approx(sum(h for _, h in raw.values()))
    for status, state in (("Pass", "COMPLETED"), ("Failed", "FAILED")):
        assert audit["by_state"][state]["jobs"] == raw[status][0]
        assert audit["by_state"][state]["gpu_hours"] == pytest.approx(raw[status][1])


def test_every_bundled_sample_exists_and_is_attributed() -> None:
    from headway.data import SAMPLES

    attribution = (sample_path("philly_jobs.json.gz").parent / "ATTRIBUTION.md").read_text()
    for name in SAMPLES:
        assert sample_path(name).stat().st_size > 0
        assert f"`{name}`" in attribution
    assert "CC BY 4.0" in attribution and "Jeon" in attribution
    with pytest.raises(FileNotFoundError, match=r"samples: philly_jobs\.json\.gz"):
        sample_path("nope.csv")
