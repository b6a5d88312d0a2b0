"""The dashboard's JSON API, pages and /metrics on real stores: the figures are the audit's, the live
queue comes from a real daemon or the decision log, and nothing a user controls gets out of its place."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from headway import decision_log as dl
from headway.audit import audit_report
from headway.schema import records_to_table
from headway.store import JobStore
from headway.web import ServeConfig, create_app
from test_local_support import DaemonProc, start_daemon, wait_until

__all__ = ["start_daemon"]

HEADWAY = str(Path(sys.executable).with_name("headway"))


@pytest.fixture(scope="module")
def philly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from headway.data import sample_path

    db = tmp_path_factory.mktemp("philly") / "philly.duckdb"
    subprocess.run(
        [HEADWAY, "ingest", str(sample_path("philly_jobs.json.gz")), "--db", str(db), "--json"],
        capture_output=True,
        check=True,
    )
    return db


def _client(db: Path, **kw: Any) -> TestClient:
    return TestClient(create_app(ServeConfig(db=db, **kw)))


def test_api_summary_is_the_object_audit_json_prints_for_the_same_store(philly: Path) -> None:
    cli = subprocess.run(
        [HEADWAY, "audit", "--db", str(philly), "--json", "--top", "7"],
        capture_output=True,
        text=True,
        check=True,
    )
    audit = json.loads(cli.stdout)
    api = _client(philly).get("/api/summary", params={"top": 7}).json()
    for cli_only in ("db", "anchor"):
        audit.pop(cli_only, None)
    assert api == audit
    assert api["weekly"] and all("p90_wait_s" in w and "wasted_cost_usd" in w for w in api["weekly"])


def test_the_overview_page_shows_the_audits_headline_figures_and_weeks(philly: Path) -> None:
    r = audit_report(JobStore(philly, read_only=True).con)
    page = _client(philly).get("/").text
    assert f'<b id="v-jobs">{r["totals"]["audited_jobs"]:,}</b>' in page
    for w in r["weekly"]:
        assert f"<td>{w['week']}</td>" in page
    for cid in ("chart-outcome", "chart-weekly-rate", "chart-weekly-hours", "chart-waiting"):
        assert f'data-chart="{cid}"' in page and f'id="{cid}-plot"' in page
    assert "cdn" not in page.lower()


def test_a_users_page_is_the_audit_scoped_to_that_user(philly: Path) -> None:
    client = _client(philly)
    users = client.get("/api/users").json()
    top = users["users"][0]
    mine = client.get(f"/api/users/{top['key']}").json()
    assert mine["report"]["wasted_gpu_hours"] == pytest.approx(top["wasted_gpu_hours"])
    assert mine["report"]["totals"]["audited_jobs"] == top["jobs"]
    assert {j["job_id"] for j in mine["jobs"]} and all(j["job_id"] for j in mine["jobs"])
    assert users["repeat_failures"]["streaks"] > 0
    assert client.get("/users/nobody-here").status_code == 404
    assert client.get("/api/users/nobody-here").json()["detail"].startswith("no jobs of user")


def test_before_and_after_equals_the_audit_of_each_window_and_shows_the_load(philly: Path) -> None:
    client = _client(philly)
    c = client.get("/api/compare", params={"at": "2017-11-01", "days": 14}).json()
    con = JobStore(philly, read_only=True).con
    for side in ("before", "after"):
        w = c[side]["window"]
        r = audit_report(
            con, since=dt.datetime.fromisoformat(w["since"]), until=dt.datetime.fromisoformat(w["until"])
        )
        assert c[side]["completion_rate"] == pytest.approx(r["completion_rate"]["by_count"])
        assert c[side]["goodput_per_gpu_hour"] == pytest.approx(r["completion_rate"]["by_gpu_hours"])
        assert c[side]["median_wait_s"] == pytest.approx(r["waiting"]["overall"]["median_s"])
        assert c[side]["jobs"] == r["totals"]["audited_jobs"]
        lo, hi = c[side]["interval"]["completion_rate"]
        assert lo <= c[side]["completion_rate"] <= hi
        assert c[side]["offered"]["gpu_hours_per_day"] == pytest.approx(r["totals"]["audited_gpu_hours"] / 14)
    assert {m["verdict"] for m in c["metrics"]} <= {"better", "worse", "within noise", "unknown"}
    assert "Offered load" in client.get("/compare", params={"at": "2017-11-01", "days": 14}).text


def test_before_and_after_defaults_to_the_first_day_a_pass_was_applied(tmp_path: Path, philly: Path) -> None:
    db = tmp_path / "s.duckdb"
    db.write_bytes(philly.read_bytes())
    with JobStore(db) as store:
        at = dt.datetime(2017, 11, 3, 14, 30, tzinfo=dt.UTC)
        dl.record(store.con, dl.DecisionRecord(at, "philly", "slurm", "impact", True, True, 1.0))
    c = _client(db).get("/api/compare").json()
    assert c["at"].startswith("2017-11-03T00:00") and "decision log" in c["chosen_because"]


def test_metrics_parse_with_prometheus_clients_own_parser_and_match_the_store(philly: Path) -> None:
    text = _client(philly).get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    r = audit_report(JobStore(philly, read_only=True).con)
    ended = {
        s.labels["outcome"]: s.value for s in fams["headway_jobs_ended"].samples if s.name.endswith("_total")
    }
    assert ended["success"] == r["by_outcome"]["success"]["jobs"]
    assert ended["waste"] == r["by_outcome"]["waste"]["jobs"]
    rate = {s.labels["by"]: s.value for s in fams["headway_completion_rate"].samples}
    assert rate["count"] == pytest.approx(r["completion_rate"]["by_count"])
    assert "headway_store_age_seconds" in fams and fams["headway_queue_up"].samples[0].value == 0
    labels = {k for f in fams.values() for s in f.samples for k in s.labels}
    assert "user" not in labels and "job_id" not in labels  # bounded by default
    per_user = _client(philly, metrics_per_user=True).get("/metrics").text
    assert 'headway_user_wasted_gpu_hours{user="' in per_user


def test_every_request_but_healthz_needs_the_token(philly: Path) -> None:
    client = _client(philly, token="s3cret")
    assert client.get("/healthz").text == "ok"
    assert client.get("/api/summary").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert client.get("/api/summary", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/summary", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    browser = _client(philly, token="s3cret")
    first = browser.get("/?token=s3cret", follow_redirects=False)
    assert first.status_code == 303 and "token" not in first.headers["location"]
    assert browser.get("/").status_code == 200  # the cookie carries it from then on


def test_hostile_job_names_are_escaped_in_every_page(tmp_path: Path) -> None:
    from headway.schema import JobRecord, State

    db = tmp_path / "h.duckdb"
    t0 = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    rows = [
        JobRecord(
            job_id=str(i),
            user="<img src=x onerror=alert(1)>",
            name="<script>alert('x')</script>",
            submit_time=t0,
            start_time=t0 + dt.timedelta(minutes=1),
            end_time=t0 + dt.timedelta(hours=1),
            gpus=1,
            state=State.FAILED,
            source="evil",
        )
        for i in range(4)
    ]
    with JobStore(db) as store:
        store.upsert(records_to_table(rows))
    client = _client(db)
    for path in ("/", "/users", "/users/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E", "/jobs/evil/1"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
    assert "script-src 'self'" in client.get("/").headers["content-security-policy"]


def test_simulations_are_read_from_the_folder_only_and_never_through_a_link(tmp_path: Path) -> None:
    sims = tmp_path / "sims"
    sims.mkdir()
    out = {
        "policies": {"fifo": {"time_to_success_mean": 7200.0}, "impact": {"time_to_success_mean": 3600.0}},
        "ratios": {"baseline": "fifo", "policies": {"impact": {"time_to_success_mean": 0.5}}},
        "trace": {"label": "t", "jobs": 2},
        "cluster": {"description": "1 node"},
    }
    (sims / "run.json").write_text(json.dumps(out))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"policies": {"stolen": {}}}))
    os.symlink(secret, sims / "link.json")
    db = tmp_path / "e.duckdb"
    JobStore(db).close()
    client = _client(db, simulations=sims)
    assert client.get("/api/simulations").json() == ["link.json", "run.json"]
    t = client.get("/api/simulations/run.json").json()
    assert [r["policy"] for r in t["rows"]] == ["fifo", "impact"] and t["baseline"] == "fifo"
    assert t["rows"][1]["ratios"]["time_to_success_mean"] == 0.5
    assert client.get("/api/simulations/link.json").status_code == 404  # O_NOFOLLOW
    assert client.get("/api/simulations/..%2Fsecret.json").status_code == 404
    up = client.post("/api/simulations/render", content=json.dumps(out)).json()
    assert up["rows"][0]["policy"] == "fifo" and set(up["charts"]) >= {"chart-sim-tts"}
    bad = client.post("/api/simulations/render", content=b"[1, 2]")
    assert bad.status_code == 422 and "simulate --json" in bad.json()["detail"]


def test_the_slurm_queue_is_the_last_applied_pass_of_the_decision_log(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    at = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
    rank = [
        {
            "job_id": "41",
            "rank": 1,
            "tier": "normal",
            "score": 2.0,
            "p_success": 0.9,
            "runtime_s": 600.0,
            "reason": "fails fast",
            "estimated_start": None,
            "user": "alice",
            "name": "a",
            "gpus": 2,
        },
        {
            "job_id": "42",
            "rank": 2,
            "tier": "held (repeat failures)",
            "score": 0.1,
            "p_success": 0.2,
            "runtime_s": 60.0,
            "reason": "held",
            "estimated_start": None,
            "user": "bob",
            "name": "b",
            "gpus": 8,
        },
    ]
    with JobStore(db) as store:
        dl.record(store.con, dl.DecisionRecord(at, "sacct", "slurm", "impact", True, True, 0.4, ranking=()))
        dl.record(
            store.con,
            dl.DecisionRecord(
                at + dt.timedelta(minutes=1),
                "sacct",
                "slurm",
                "impact",
                True,
                True,
                0.7,
                written=({"job_id": "41", "old": 0, "new": 100},),
                ranking=tuple(rank),
                running=({"job_id": "40", "user": "carol", "name": "c", "gpus": 4, "where": "1 nodes"},),
                pending=2,
            ),
        )
    client = _client(db, slurm=True)
    q = client.get("/api/queue").json()
    assert q["adapter"] == "slurm" and q["ok"] and [j["job_id"] for j in q["pending"]] == ["41", "42"]
    assert q["pending"][1]["tier"] == "held (repeat failures)" and q["running"][0]["job_id"] == "40"
    job = client.get("/api/jobs/sacct/41").json()
    assert [d["written"] for d in job["decisions"]] == [[{"job_id": "41", "old": 0, "new": 100}]]
    assert "fails fast" in client.get("/queue").text
    page = client.get(f"/decisions/{q['decision_id']}").text
    assert "Priorities written" in page and "/jobs/sacct/41" in page
    fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    pending = {(s.labels["state"], s.labels["tier"]): s.value for s in fams["headway_queue_gpus"].samples}
    assert pending[("pending", "held (repeat failures)")] == 8
    passes = {s.name: s.value for s in fams["headway_passes"].samples}
    assert passes["headway_passes_total"] == 2


def test_the_local_queue_shows_rank_and_why_and_never_a_jobs_argv_or_cwd(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon(gpus="1")
    store = d.state_dir / "jobs.duckdb"
    running = d.submit(["sleep", "60"], name="runner")
    waiting = d.submit(["sleep", "1", "--api-key=TOPSECRET"], name="waiter", cwd=str(tmp_path))
    wait_until(store.exists, 20, "the daemon's job store")
    client = _client(store, state_dir=d.state_dir)

    def ranked() -> bool:
        q = client.get("/api/queue").json()
        return any(j["job_id"] == str(waiting) and j["rank"] == 1 for j in q["pending"]) and bool(
            q["running"]
        )

    wait_until(ranked, 20, "the waiting job ranked behind the running one")
    q = client.get("/api/queue").json()
    (w,) = q["pending"]
    assert w["reason"] and "rank 1 of 1" in w["reason"] and q["gpus_total"] == 1 and q["gpus_free"] == 0
    assert q["running"][0]["job_id"] == str(running) and q["running"][0]["where"] == "GPU 0"
    for text in (json.dumps(q), client.get("/queue").text, client.get("/metrics").text):
        assert "TOPSECRET" not in text and str(tmp_path) not in text


def test_serve_refuses_two_live_queues_and_a_missing_store_in_one_line(tmp_path: Path) -> None:
    both = subprocess.run(
        [HEADWAY, "serve", "--db", str(tmp_path / "x.duckdb"), "--state-dir", str(tmp_path), "--slurm"],
        capture_output=True,
        text=True,
    )
    assert both.returncode == 1 and "give one live queue" in both.stderr and "Traceback" not in both.stderr
    missing = subprocess.run(
        [HEADWAY, "serve", "--db", str(tmp_path / "x.duckdb")], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "no job store here yet" in missing.stderr


def test_the_openapi_schema_lists_every_api_route_and_no_page_loads_from_a_cdn(philly: Path) -> None:
    client = _client(philly)
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {"/api/summary", "/api/compare", "/api/queue", "/api/users", "/api/decisions", "/metrics"} <= paths
    assert client.get("/docs").status_code == 404


def test_a_changed_store_is_recomputed_in_the_background_while_the_last_answer_is_served(
    tmp_path: Path,
) -> None:
    from headway.web.storeview import StoreView

    db = tmp_path / "c.duckdb"
    JobStore(db).close()
    view = StoreView(db)
    count = lambda con: con.execute("SELECT count(*) FROM jobs").fetchone()[0]  # noqa: E731
    assert view.get("n", count) == (0, 0.0)
    t0 = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    with JobStore(db) as store:
        store.upsert(records_to_table([_job("1", t0)]))
    stale, _age = view.get("n", count)  # answered at once, from before the write
    assert stale == 0
    wait_until(lambda: view.get("n", count)[0] == 1, 10, "the recomputed count")


def _job(job_id: str, t0: dt.datetime) -> Any:
    from headway.schema import JobRecord, State

    return JobRecord(
        job_id=job_id,
        user="u",
        name="n",
        submit_time=t0,
        start_time=t0,
        end_time=t0 + dt.timedelta(hours=1),
        gpus=1,
        state=State.COMPLETED,
        source="s",
    )
