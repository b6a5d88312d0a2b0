"""The audit's cancelled jobs, split by when they were cancelled (docs/audit-json.md, `cancelled`): never
started, within 10 minutes of starting, after 80%+ of the time limit, the rest, and jobs without a time
limit apart; so a site can tell cancellations that spent GPUs from those that saved them.

The real-data tests count the buckets again with pandas from slurmdbd's own job table, read straight from
the CSV (not through headway's reader), and skip without ../shared. The same plain reading checks what the
audit shows of that table exported without job names and groups: each user's runs of failures, keyed by
user alone and labelled so, where it used to show none."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from headway.audit import render_html, render_terminal
from headway.audit.compute import CANCEL_BUCKETS
from headway.audit.html import CANCELLED_CHART_IDS
from headway.audit.render import gh, pct
from headway.cli import app
from headway.schema import State
from test_audit import HOUR, MIN, job, report_of, store_with, terminal_and_html

# Slurm's job_states enum (slurm.h): the base state is the low byte of the job table's `state` column.
SLURM_BASE_STATE = {3: "COMPLETED", 4: "CANCELLED", 5: "FAILED", 6: "TIMEOUT", 7: "NODE_FAIL", 11: "OOM"}
# What a run of repeat failures is made of: the owner's own failures (a node failure is left out of the
# sequence, as the hold leaves it: policy/inputs.py STREAK_FAILURES).
OWN_FAILURES = {"FAILED", "TIMEOUT", "OOM"}


def job_table_frame(path: Path) -> pd.DataFrame:
    """slurmdbd's job table as pandas reads it, one row a job, with what the audit needs computed from the
    raw columns: GPUs (the largest gres/gpu count, tres ids >= 1001, allocated else requested), state,
    start (0 = unset), runtime, time limit (minutes in the table) and GPU-hours."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)

    def gpus(tres: str) -> float:
        counts = [
            float(v) for k, v in (p.split("=", 1) for p in tres.split(",") if "=" in p) if int(k) >= 1001
        ]
        return max(counts) if counts else 0.0

    out = pd.DataFrame({"job_id": df["id_job"], "user": df["id_user"]})
    alloc, req = df["tres_alloc"].map(gpus), df["tres_req"].map(gpus)
    out["gpus"] = alloc.where(alloc > 0, req)
    for col in ("time_submit", "time_start", "time_end", "timelimit", "state"):
        out[col] = df[col].astype(float).astype("int64")
    out["state"] = (out["state"] & 0xFF).map(SLURM_BASE_STATE).fillna("OTHER")
    out["started"] = out["time_start"] > 0
    ended = out["started"] & (out["time_end"] > 0)
    out["runtime"] = (out["time_end"] - out["time_start"]).where(ended)
    out["limit_s"] = (out["timelimit"] * 60).where(out["timelimit"] > 0)
    out["gpu_hours"] = out["gpus"] * out["runtime"].fillna(0).clip(lower=0) / 3600
    # when a job ended, as the audit orders jobs: end, else start, else submit
    t = out["time_end"].where(out["time_end"] > 0, out["time_start"])
    out["t"] = t.where(t > 0, out["time_submit"])
    return out[out["gpus"] > 0]  # the audit's default scope: GPU jobs


def cancel_bucket(started: bool, runtime: float | None, limit_s: float | None) -> str:
    """The documented rule, written again plainly: first match wins."""
    if not started:
        return "never_started"
    if runtime is not None and runtime <= 600:
        return "within_10_min"
    if limit_s is None or limit_s != limit_s or limit_s <= 0:  # NaN: no limit
        return "no_time_limit"
    if runtime is not None and runtime >= 0.8 * limit_s:
        return "near_time_limit"
    return "rest"


def test_each_cancelled_job_falls_in_one_bucket_by_when_it_was_cancelled(tmp_path: Path) -> None:
    c = State.CANCELLED
    jobs = [
        job("queued", c, runtime=None, limit_s=3600),  # never started: 0 GPU-hours, still counted
        job("quick", c, gpus=2, runtime=10 * MIN, limit_s=3600),  # exactly 10 min: within
        job("short-limit", c, runtime=9 * MIN, limit_s=10 * 60),  # 90% of a 10-min limit, but within 10 min
        job("near", c, gpus=4, runtime=48 * MIN, limit_s=3600),  # exactly 80% of its limit: near
        job("mid", c, runtime=47 * MIN, limit_s=3600),  # 78%: the rest
        job("nolimit", c, gpus=8, runtime=2 * HOUR, limit_s=None),  # no limit: its own bucket
        job("ok", State.COMPLETED, runtime=HOUR, limit_s=3600),  # not cancelled: in no bucket
    ]
    r = report_of(store_with(tmp_path, jobs))
    cz = r["cancelled"]
    assert list(cz["by_bucket"]) == list(CANCEL_BUCKETS)  # always all five, in the documented order
    got = {k: (v["jobs"], v["gpu_hours"]) for k, v in cz["by_bucket"].items()}
    assert got == {
        "never_started": (1, 0.0),
        "within_10_min": (2, pytest.approx(2 * 10 / 60 + 9 / 60)),
        "rest": (1, pytest.approx(47 / 60)),
        "near_time_limit": (1, pytest.approx(4 * 48 / 60)),
        "no_time_limit": (1, pytest.approx(16.0)),
    }
    assert cz["jobs"] == 6 and cz["gpu_hours"] == pytest.approx(sum(g for _, g in got.values()))
    assert cz["by_bucket"]["no_time_limit"]["share_gpu_hours"] == pytest.approx(16.0 / cz["gpu_hours"])
    assert cz["by_bucket"]["never_started"]["share_jobs"] == pytest.approx(1 / 6)
    assert cz["share_of_gpu_hours"] == pytest.approx(cz["gpu_hours"] / (cz["gpu_hours"] + 1.0))
    assert cz["early_s"] == 600 and cz["near_limit_share"] == 0.8


def test_top_users_by_cancelled_gpu_hours_carry_their_count_and_their_split(tmp_path: Path) -> None:
    c = State.CANCELLED
    jobs = [job(f"a{i}", c, user="alice", runtime=None) for i in range(5)]  # five withdrawn from the queue
    jobs += [job("a5", c, user="alice", gpus=8, runtime=55 * MIN, limit_s=3600)]  # near the limit
    jobs += [job(f"b{i}", c, user="bob", gpus=2, runtime=5 * MIN) for i in range(2)]
    jobs += [job("n0", c, user=None, gpus=1, runtime=30 * MIN, limit_s=7200)]  # 0.5 GPU-h: above bob
    r = report_of(store_with(tmp_path, jobs), top=2)
    users = r["cancelled"]["by_user"]
    assert [(u["user"], u["jobs"]) for u in users] == [("alice", 6), ("(none)", 1)]  # top 2 by GPU-hours
    alice = users[0]
    assert alice["gpu_hours"] == pytest.approx(8 * 55 / 60)
    assert alice["by_bucket"]["never_started"] == {"jobs": 5, "gpu_hours": 0.0}
    assert alice["by_bucket"]["near_time_limit"]["gpu_hours"] == pytest.approx(8 * 55 / 60)
    assert alice["by_bucket"]["within_10_min"] == {"jobs": 0, "gpu_hours": 0.0}
    total = 8 * 55 / 60 + 2 * 2 * 5 / 60 + 30 / 60
    assert alice["share_of_cancelled_gpu_hours"] == pytest.approx(8 * 55 / 60 / total)
    assert users[1]["by_bucket"]["rest"]["gpu_hours"] == pytest.approx(30 / 60)


def test_a_log_without_cancelled_jobs_says_so_and_draws_no_cancelled_chart(tmp_path: Path) -> None:
    r = report_of(store_with(tmp_path, [job("1", State.COMPLETED), job("2", State.FAILED)]))
    assert r["cancelled"]["jobs"] == 0 and r["cancelled"]["by_user"] == []
    assert all(b["share_jobs"] is None for b in r["cancelled"]["by_bucket"].values())
    con = Console(record=True, width=100)
    render_terminal(r, con)
    assert "Cancelled: no cancelled jobs." in con.export_text()
    page = render_html(r)
    assert "No cancelled jobs." in page and not any(f'id="{cid}"' in page for cid in CANCELLED_CHART_IDS)


def report_of_job_table(shared_traces: Path, tmp_path: Path) -> dict[str, Any]:
    """The audit of slurmdbd's real job table, ingested by `headway ingest` as a site would."""
    src = shared_traces / "slurm-22.05" / "slurmdb_job_table.csv"
    db = tmp_path / "jt.duckdb"
    res = CliRunner().invoke(app, ["ingest", "--db", str(db), str(src)])
    assert res.exit_code == 0, res.output
    return report_of(db)


def test_cancelled_buckets_of_the_real_slurm_job_table_match_a_pandas_count_of_the_csv(
    shared_traces: Path, tmp_path: Path
) -> None:
    r = report_of_job_table(shared_traces, tmp_path)
    df = job_table_frame(shared_traces / "slurm-22.05" / "slurmdb_job_table.csv")
    cz = df[df["state"] == "CANCELLED"].copy()
    cz["bucket"] = [
        cancel_bucket(bool(s), None if rt != rt else float(rt), lim)
        for s, rt, lim in zip(cz["started"], cz["runtime"], cz["limit_s"], strict=True)
    ]
    want = cz.groupby("bucket").agg(jobs=("job_id", "size"), gpu_hours=("gpu_hours", "sum"))
    got = r["cancelled"]
    assert got["jobs"] == len(cz) == r["by_state"]["CANCELLED"]["jobs"]
    assert got["gpu_hours"] == pytest.approx(cz["gpu_hours"].sum())
    assert got["share_of_gpu_hours"] == pytest.approx(cz["gpu_hours"].sum() / df["gpu_hours"].sum())
    jobs_in = {str(k): int(v) for k, v in want["jobs"].items()}
    gpu_hours_in = {str(k): float(v) for k, v in want["gpu_hours"].items()}
    for k in CANCEL_BUCKETS:
        assert got["by_bucket"][k]["jobs"] == jobs_in.get(k, 0), k
        assert got["by_bucket"][k]["gpu_hours"] == pytest.approx(gpu_hours_in.get(k, 0.0), abs=1e-9), k
    # this export: a 500-job pending burst cancelled unstarted, and one user's blockers cancelled running
    assert got["by_bucket"]["never_started"]["jobs"] > 400
    per_user = cz.groupby("user").agg(jobs=("job_id", "size"), gpu_hours=("gpu_hours", "sum"))
    per_user = per_user.reset_index().sort_values(
        ["gpu_hours", "jobs", "user"], ascending=[False, False, True]
    )
    assert [(u["user"], u["jobs"]) for u in got["by_user"]] == [
        (str(u), int(n)) for u, n in zip(per_user["user"], per_user["jobs"], strict=True)
    ][:10]
    user_gpu_hours = {str(k): float(v) for k, v in per_user.set_index("user")["gpu_hours"].items()}
    for u in got["by_user"]:
        assert u["gpu_hours"] == pytest.approx(user_gpu_hours[u["user"]])


def test_the_terminal_and_the_html_report_show_the_cancelled_breakdown_and_its_figures(
    shared_traces: Path, tmp_path: Path
) -> None:
    r = report_of_job_table(shared_traces, tmp_path)
    cz = r["cancelled"]
    con = Console(record=True, width=120)
    render_terminal(r, con)
    text = con.export_text()
    assert f"Cancelled: {cz['jobs']:,} jobs, {gh(cz['gpu_hours'])} GPU-hours" in text
    assert "Cancelled jobs by when they were cancelled" in text and "Top users by cancelled GPU-hours" in text
    for b in cz["by_bucket"].values():
        row = next(line for line in text.splitlines() if b["label"] in line)
        assert f" {b['jobs']:,} " in row and pct(b["share_gpu_hours"]) in row
    top = cz["by_user"][0]
    assert any(line.split("│")[1].strip() == top["user"] for line in text.splitlines() if "│" in line)

    page = render_html(r)
    section = page[page.index("<h2>Cancelled jobs</h2>") : page.index("<h2>Waiting</h2>")]
    assert all(f'<section class="chart" id="{cid}">' in section for cid in CANCELLED_CHART_IDS)
    cells = re.findall(r"<td>(.*?)</td>", section)
    for b in cz["by_bucket"].values():
        i = cells.index(b["label"])
        assert cells[i + 1 : i + 5] == [f"{b['jobs']:,}", pct(b["share_jobs"]), gh(b["gpu_hours"]),
                                       pct(b["share_gpu_hours"])]  # fmt: skip
    assert top["user"] in cells and gh(top["gpu_hours"]) in cells


def write_without_names_or_groups(src: Path, out: Path) -> Path:
    """The job table as a site might export it without `job_name`, `account` and `id_group`."""
    with src.open(newline="") as f, out.open("w", newline="") as g:
        rows = csv.reader(f)
        header = next(rows)
        keep = [i for i, h in enumerate(header) if h not in {"job_name", "account", "id_group"}]
        w = csv.writer(g)
        for row in [header, *rows]:
            w.writerow([row[i] for i in keep])
    return out


def runs_of_failures(df: pd.DataFrame, min_run: int = 3) -> list[tuple[str, int, float, bool]]:
    """Per user alone: (user, failures, their GPU-hours, a success followed) for each run of `min_run`+
    own failures between successes, jobs in end-time order; cancelled jobs and node failures are not in
    the sequence."""
    seq = df[df["state"].isin(OWN_FAILURES | {"COMPLETED"})].sort_values(["user", "t"], kind="stable")
    out = []
    for user, jobs in seq.groupby("user"):
        n, g = 0, 0.0
        for state, hours in zip(jobs["state"], jobs["gpu_hours"], strict=True):
            if state in OWN_FAILURES:
                n, g = n + 1, g + hours
                continue
            if n >= min_run:
                out.append((str(user), n, g, True))
            n, g = 0, 0.0
        if n >= min_run:
            out.append((str(user), n, g, False))
    return out


def test_the_real_job_table_without_names_or_groups_shows_each_users_runs_by_user_alone(
    shared_traces: Path, tmp_path: Path
) -> None:
    src = shared_traces / "slurm-22.05" / "slurmdb_job_table.csv"
    bare = write_without_names_or_groups(src, tmp_path / "bare.csv")
    db = tmp_path / "bare.duckdb"
    res = CliRunner().invoke(app, ["ingest", "--db", str(db), str(bare)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    rf = json.loads(res.stdout)["repeat_failures"]
    df = job_table_frame(src)
    seq = df[df["state"].isin(OWN_FAILURES | {"COMPLETED"})]
    # ties in end time between a success and a failure of one user would make the order a guess
    assert (seq.groupby(["user", "t"])["state"].agg(lambda s: s.isin(OWN_FAILURES).nunique()) <= 1).all()
    want = runs_of_failures(df)
    assert want, "the job table has runs of failures"
    assert rf["key"] == "user" and rf["key_label"] == "by user alone: this log has no job names or groups"
    assert rf["keyed_jobs"] == {"user+name": 0, "user+group": 0, "user": len(seq)}
    assert rf["streaks"] == len(want) and rf["jobs"] == sum(n for _, n, _, _ in want)
    got = sorted((x["user"], x["failures"], x["success_followed"]) for x in rf["rows"])
    assert got == sorted((u, n, ok) for u, n, _, ok in want)
    for x in rf["rows"]:
        g = next(g for u, n, g, _ in want if (u, n) == (x["user"], x["failures"]))
        assert x["gpu_hours"] == pytest.approx(g) and x["key"] == "user" and x["name"] is x["group"] is None
    text, page = terminal_and_html(db)
    assert "Repeat failures (by user alone: this log has no job names or groups): " in text
    assert "(any job)" in text and "no user+name failed" not in text
    assert "by user alone: this log has no job names or groups" in page and "(any job)" in page


@pytest.mark.browser
@pytest.mark.slow
def test_the_cancelled_charts_draw_in_headless_chromium(tmp_path: Path) -> None:
    """Both cancelled charts draw bars in a real browser: one bar per bucket with GPU-hours, and a stacked
    bar per user (Chromium as tests/test_report_browser.py drives it; skips without it)."""
    from test_report_browser import _dump_dom, _sections, chromium

    exe = chromium()
    c = State.CANCELLED
    jobs = [
        job("q", c, runtime=None),
        job("early", c, user="bob", gpus=2, runtime=5 * MIN, limit_s=3600),
        job("mid", c, user="carol", runtime=30 * MIN, limit_s=3600),
        job("late", c, gpus=8, runtime=55 * MIN, limit_s=3600),
        job("open", c, user="dan", gpus=4, runtime=2 * HOUR),
        job("ok", State.COMPLETED),
    ]
    page = tmp_path / "r.html"
    page.write_text(render_html(report_of(store_with(tmp_path, jobs))))
    sections = _sections(_dump_dom(exe, page, tmp_path / "profile"))
    bars = {
        cid: len(re.findall(r'<g class="point"><path d="M', sections[cid])) for cid in CANCELLED_CHART_IDS
    }
    # one bar per bucket (never started one of height 0); per user (alice, bob, carol, dan) one segment for
    # each bucket that can hold GPU-hours (never started cannot)
    assert bars == {
        "chart-cancelled": len(CANCEL_BUCKETS),
        "chart-cancelled-users": 4 * (len(CANCEL_BUCKETS) - 1),
    }
