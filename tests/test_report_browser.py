"""The HTML audit report opened in a real headless Chromium: every chart must actually draw, offline.

Needs Debian's `chromium` (tests/setup/services.sh installs it). Skips without it, unless
HEADWAY_REQUIRE_SERVICES=1 (CI), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from headway.audit import audit_report, write_html
from headway.audit.html import CHART_IDS
from headway.store import JobStore
from headway.traces.base import ReadOptions
from headway.traces.registry import get_reader

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("HEADWAY_REQUIRE_SERVICES") == "1":
            pytest.fail("chromium is missing and HEADWAY_REQUIRE_SERVICES=1 (run tests/setup/services.sh)")
        pytest.skip("chromium not installed (tests/setup/services.sh installs it)")
    return exe


def _philly_sample(request: pytest.FixtureRequest) -> Path:
    """The bundled Philly sample, or the shared trace when the package data is not there."""
    try:
        from headway.data import sample_path

        return sample_path("philly_jobs.json.gz")
    except (ImportError, FileNotFoundError):
        shared: Path = request.getfixturevalue("shared_traces")  # skips when absent
        return shared / "philly-dre" / "philly_jobs.json"


# Headless, and no connections of its own (this machine's closed network refuses them, many at a time).
CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _dump_dom(exe: str, page: Path, profile: Path, width: int = 1400) -> str:
    cmd = [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        f"--window-size={width},3000",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def _sections(dom: str) -> dict[str, str]:
    """Chart id -> the DOM of its <section> (sections do not nest)."""
    out = {}
    for m in re.finditer(r'<section class="chart" id="([^"]+)">(.*?)</section>', dom, re.S):
        out[m.group(1)] = m.group(2)
    return out


def test_every_chart_of_the_html_report_draws_in_headless_chromium(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    exe = chromium()
    src = _philly_sample(request)
    res = get_reader("philly").read(src, ReadOptions())
    db = tmp_path / "jobs.duckdb"
    with JobStore(db) as store:
        store.upsert(res.table)
        report = audit_report(store.con)
    page = write_html(report, tmp_path / "report.html")
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=['\"]?https?:", text, re.I), (
        "report loads a script from the network"
    )
    assert not re.search(r"<link[^>]+href=['\"]?https?:", text, re.I)

    dom = _dump_dom(exe, page, tmp_path / "profile")
    sections = _sections(dom)
    assert set(CHART_IDS) <= set(sections), f"charts missing from the page: {set(CHART_IDS) - set(sections)}"
    for cid in CHART_IDS:
        html = sections[cid]
        assert 'class="main-svg"' in html, f"{cid}: plotly drew no svg"
        traces = re.findall(r'class="trace (bars|scatter)[^"]*"', html)
        assert traces, f"{cid}: no trace drawn"
        bars = len(re.findall(r'<g class="point"><path d="M[^"]+"', html))
        lines = len(re.findall(r'class="js-line" d="M[-\d.,]+L', html))  # a polyline, not a legend stub
        assert bars + lines > 0, f"{cid}: traces have no bars or lines"
    # the outcome chart has one bar per state; the early-failure chart one line per outcome
    assert len(re.findall(r'<g class="point"><path d="M', sections["chart-outcome"])) == len(
        report["by_state"]
    )
    assert len(re.findall(r'class="js-line" d="M[-\d.,]+L', sections["chart-early"])) == 2


def test_the_simulate_reports_charts_fit_their_cells_side_by_side(tmp_path: Path) -> None:
    """Two charts a row at 1,400 px: each is drawn at its cell's width (a chart drawn before the other
    cells existed took the whole page and was cut off, its time-to-success curve with it)."""
    import subprocess
    import sys

    exe = chromium()
    trace = tmp_path / "t.parquet"
    for argv in (
        ["synth", "-n", "150", "--out", str(trace), "--seed", "2"],
        [
            "simulate",
            str(trace),
            "--nodes",
            "4",
            "--policy",
            "fifo,impact",
            "--html",
            str(tmp_path / "s.html"),
        ],
    ):
        res = subprocess.run([sys.executable, "-m", "headway.cli", *argv], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    dom = _dump_dom(exe, tmp_path / "s.html", tmp_path / "profile", width=1400)
    widths = [float(w) for w in re.findall(r'<svg class="main-svg"[^>]*? width="([\d.]+)"', dom)]
    assert len(widths) >= 6, "the six charts did not draw"
    assert max(widths) <= 700, f"charts wider than half the page: {widths}"


def test_names_in_chart_labels_are_text_not_markup(tmp_path: Path) -> None:
    """A user or job name is anyone's to choose on a cluster: `<a href=...>` in one must not become a
    link (or a line break, or bold) in the admin's report."""
    import csv
    import subprocess
    import sys

    exe = chromium()
    names = ['<a href="https://example.com/x">alice</a>', "bob<br>carol", "<b>dave</b>", "a&b"]
    with (tmp_path / "jobs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "owner", "state", "gpus", "submit", "start", "end"])
        for i, u in enumerate(names):
            w.writerow([i, u, "FAILED", 8 - i, 1_700_000_000, 1_700_000_060, 1_700_000_060 + 3600 * (5 - i)])
    (tmp_path / "map.toml").write_text(
        '[format]\ntime_format = "epoch"\n[fields]\njob_id = "id"\nuser = "owner"\nstate = "state"\n'
        'submit_time = "submit"\nstart_time = "start"\nend_time = "end"\ngpus = "gpus"\n'
    )
    db, page = tmp_path / "j.duckdb", tmp_path / "r.html"
    for argv in (
        ["ingest", str(tmp_path / "jobs.csv"), "--mapping", str(tmp_path / "map.toml"), "--db", str(db)],
        ["audit", "--db", str(db), "--html", str(page)],
    ):
        res = subprocess.run([sys.executable, "-m", "headway.cli", *argv], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    chart = _sections(_dump_dom(exe, page, tmp_path / "profile"))["chart-top"]
    labels = re.findall(r'class="ytick"><text[^>]*>(.*?)</text>', chart, re.S)
    assert "<a " not in chart and "xlink:href" not in chart and "<tspan" not in "".join(labels)
    shown = sorted(n.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for n in names)
    assert sorted(labels) == shown  # as text: the DOM escapes what the page shows
