"""The dashboard in a real browser: Playwright driving Debian's chromium against `headway serve` (a real
process on the loopback). Each page loads without a console error, its charts draw, and its figures are
those of `headway audit --json` on the same store. Skips without chromium, unless
HEADWAY_REQUIRE_SERVICES=1 (CI). With HEADWAY_SCREENSHOT=FILE it also saves the overview there (the
README's picture)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_report_browser import CHROMIUM_FLAGS, chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HEADWAY = str(Path(sys.executable).with_name("headway"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    from headway.data import sample_path

    tmp = tmp_path_factory.mktemp("served")
    db, sims = tmp / "philly.duckdb", tmp / "sims"
    sims.mkdir()
    run = lambda *a: subprocess.run([HEADWAY, *a], capture_output=True, text=True, check=True)  # noqa: E731
    run("ingest", str(sample_path("philly_jobs.json.gz")), "--db", str(db), "--json")
    audit = json.loads(run("audit", "--db", str(db), "--json").stdout)
    run("synth", "-n", "300", "-o", str(tmp / "t.parquet"), "--json")
    (sims / "small.json").write_text(
        run("simulate", str(tmp / "t.parquet"), "--policy", "fifo,impact", "--json").stdout
    )
    port = _free_port()
    proc = subprocess.Popen(
        [HEADWAY, "serve", "--db", str(db), "--port", str(port), "--simulations", str(sims)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=5) as r:
                assert r.read() == b"ok"
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(
                    f"headway serve did not come up: {proc.stderr.read() if proc.stderr else ''}"
                ) from None
            time.sleep(0.2)
    try:
        yield base, audit
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def browser(served: Any) -> Iterator[Any]:
    exe = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=list(CHROMIUM_FLAGS))
        try:
            yield b
        finally:
            b.close()


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="networkidle")
    return page, errors


def _charts_drawn(page: Any) -> list[str]:
    ids: list[str] = page.eval_on_selector_all("section.chart", "els => els.map(e => e.id)")
    for cid in ids:
        page.wait_for_selector(f"#{cid} .main-svg", timeout=15000)
        assert (
            page.eval_on_selector(
                f"#{cid}",
                "e => e.querySelectorAll('.main-svg .trace, .main-svg .point, .main-svg path').length",
            )
            > 0
        ), cid
    return ids


def test_the_overview_draws_its_charts_and_shows_the_audits_figures(browser: Any, served: Any) -> None:
    base, audit = served
    page, errors = _open(browser, base + "/")
    ids = _charts_drawn(page)
    assert set(ids) == {"chart-outcome", "chart-weekly-rate", "chart-weekly-hours", "chart-waiting"}
    assert page.inner_text("#v-jobs") == f"{audit['totals']['audited_jobs']:,}"
    rows = page.eval_on_selector_all("#weekly tr", "rs => rs.length")
    assert rows == len(audit["weekly"]) + 1
    first_week = page.inner_text("#weekly tr:nth-child(2) td:first-child")
    assert first_week == audit["weekly"][-1]["week"]
    shot = os.environ.get("HEADWAY_SCREENSHOT")
    if shot:
        page.set_viewport_size({"width": 1400, "height": 900})
        page.screenshot(path=shot)
    assert errors == []


@pytest.mark.parametrize(
    ("path", "charts"),
    [
        ("/compare?at=2017-11-01&days=14", {"chart-compare-rates", "chart-compare-waits"}),
        ("/users", {"chart-users"}),
        ("/users/e90b30", {"chart-outcome", "chart-weekly-rate"}),
        ("/decisions", set()),
        ("/simulations", set()),
        ("/simulations/small.json", {"chart-sim-tts", "chart-sim-wait", "chart-sim-goodput"}),
        ("/queue", set()),
    ],
)
def test_each_page_loads_without_a_console_error_and_draws_its_charts(
    browser: Any, served: Any, path: str, charts: set[str]
) -> None:
    base, _audit = served
    page, errors = _open(browser, base + path)
    assert set(_charts_drawn(page)) == charts
    assert errors == []


def test_the_users_page_lists_the_audits_top_wasters(browser: Any, served: Any) -> None:
    base, audit = served
    page, _errors = _open(browser, base + "/users")
    shown = page.eval_on_selector_all("#users tr td:first-child", "tds => tds.map(t => t.innerText)")
    top = [u["key"] for u in audit["top"]["user"]]
    assert shown[: len(top)] == top


def test_a_simulation_file_opened_in_the_page_shows_its_table_and_charts(
    browser: Any, served: Any, tmp_path: Path
) -> None:
    base, _audit = served
    page, errors = _open(browser, base + "/simulations")
    with urllib.request.urlopen(base + "/api/simulations/small.json") as r:
        table = json.load(r)
    with urllib.request.urlopen(base + "/api/simulations") as r:
        assert json.load(r) == ["small.json"]
    sim = tmp_path / "upload.json"  # a simulate --json output on the user's disk
    sim.write_text(json.dumps({"policies": {r["policy"]: r["values"] for r in table["rows"]}}))
    page.set_input_files("#sim-upload", str(sim))
    page.wait_for_selector("#sim-result table")
    page.wait_for_selector("#chart-sim-tts .main-svg")
    cells = page.eval_on_selector_all(
        "#sim-result table tr td:first-child", "tds => tds.map(t => t.innerText)"
    )
    assert cells == [r["policy"] for r in table["rows"]]
    assert errors == []
