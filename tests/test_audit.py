"""The audit's sections on small hand-built job tables, where every expected figure can be counted by hand."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from headway.audit import audit_report, parse_period, render_terminal, write_html
from headway.audit.compute import anchor_time, compare
from headway.cli import app
from headway.schema import JobRecord, State, records_to_table
from headway.store import JobStore

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)  # a Monday (ISO week 2026-W10)
MIN = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)


def job(
    job_id: str,
    state: State,
    *,
    user: str | None = "alice",
    name: str | None = "train",
    group: str | None = "lab",
    gpus: float = 1.0,
    submit: dt.datetime = T0,
    wait: dt.timedelta = 10 * MIN,
    runtime: dt.timedelta | None = HOUR,
    limit_s: int | None = None,
) -> JobRecord:
    start = submit + wait if runtime is not None else None
    end = start + runtime if start is not None and runtime is not None else None
    return JobRecord(
        job_id,
        state,
        "test",
        user=user,
        group=group,
        name=name,
        gpus=gpus,
        submit_time=submit,
        start_time=start,
        end_time=end,
        time_limit=limit_s,
    )


def store_with(tmp_path: Path, jobs: list[JobRecord]) -> Path:
    db = tmp_path / "audit.duckdb"
    with JobStore(db) as s:
        s.upsert(records_to_table(jobs))
    return db


def report_of(db: Path, **kw: Any) -> dict[str, Any]:
    with JobStore(db, read_only=True) as s:
        return audit_report(s.con, **kw)


def test_totals_split_jobs_by_outcome_class_and_rate_completion_over_ended_jobs(tmp_path: Path) -> None:
    jobs = [
        job("1", State.COMPLETED, gpus=2, runtime=3 * HOUR),  # 6 GPU-h
        job("2", State.FAILED, gpus=1, runtime=2 * HOUR),  # 2
        job("3", State.TIMEOUT, gpus=4, runtime=HOUR),  # 4
        job("4", State.CANCELLED, gpus=1, runtime=HOUR),  # 1
        job("5", State.PREEMPTED, gpus=2, runtime=HOUR),  # 2
        job("6", State.RUNNING, gpus=1, runtime=None),  # not ended
        job("7", State.COMPLETED, gpus=0, runtime=5 * HOUR),  # CPU-only: not audited by default
    ]
    r = report_of(store_with(tmp_path, jobs))
    assert r["totals"]["jobs"] == 7 and r["totals"]["gpu_jobs"] == 6 and r["totals"]["cpu_jobs"] == 1
    assert r["totals"]["gpu_hours"] == pytest.approx(15.0)
    assert r["by_state"]["TIMEOUT"] == {
        "jobs": 1,
        "gpu_hours": 4.0,
        "share_jobs": 1 / 6,
        "share_gpu_hours": 4 / 15,
    }
    assert r["by_outcome"]["waste"]["jobs"] == 2 and r["by_outcome"]["waste"]["gpu_hours"] == pytest.approx(
        6.0
    )
    assert r["by_outcome"]["cancelled"]["jobs"] == 1 and r["by_outcome"]["preempted"]["jobs"] == 1
    assert r["by_outcome"]["unfinished"]["jobs"] == 1
    # ended = success + waste + cancelled + preempted = 5 jobs, 15 GPU-h
    assert r["completion_rate"]["by_count"] == pytest.approx(1 / 5)
    assert r["completion_rate"]["by_gpu_hours"] == pytest.approx(6 / 15)
    assert r["wasted_gpu_hours"] == pytest.approx(6.0) and r["goodput_gpu_hours"] == pytest.approx(6.0)
    assert r["wasted_cost"] == {"usd": pytest.approx(12.0), "usd_per_gpu_hour": 2.0}
    assert any("CPU-only" in n for n in r["notes"])

    with_cpu = report_of(tmp_path / "audit.duckdb", include_cpu=True, gpu_hour_price=3.0)
    assert with_cpu["scope"] == "all_jobs" and with_cpu["by_state"]["COMPLETED"]["jobs"] == 2
    assert with_cpu["completion_rate"]["by_count"] == pytest.approx(2 / 6)
    assert with_cpu["wasted_cost"]["usd"] == pytest.approx(18.0)


def test_top_ranks_by_wasted_gpu_hours_with_each_ones_completion_rate(tmp_path: Path) -> None:
    jobs = [
        job("a1", State.FAILED, user="alice", gpus=8, runtime=HOUR),
        job("a2", State.COMPLETED, user="alice", gpus=8, runtime=HOUR),
        job("b1", State.FAILED, user="bob", gpus=1, runtime=HOUR),
        job("b2", State.FAILED, user="bob", gpus=1, runtime=HOUR, name="eval", group="other"),
        job("c1", State.COMPLETED, user="carol", gpus=16, runtime=HOUR),
    ]
    r = report_of(store_with(tmp_path, jobs), by="group", top=2)
    assert r["top"]["by"] == "group"
    users = r["top"]["user"]
    assert [u["key"] for u in users] == ["alice", "bob"]  # top 2 by waste; carol wasted nothing
    assert users[0]["wasted_gpu_hours"] == 8.0 and users[0]["completion_rate"]["by_count"] == 0.5
    assert users[1]["completion_rate"] == {"by_count": 0.0, "by_gpu_hours": 0.0}
    assert [g["key"] for g in r["top"]["group"]] == ["lab", "other"]
    assert r["top"]["gpus"][0]["key"] == "8"
    assert r["top"]["partition"][0]["key"] == "(none)"


def test_repeat_failures_finds_runs_of_three_and_says_whether_a_success_followed(tmp_path: Path) -> None:
    seq = [State.FAILED, State.FAILED, State.OUT_OF_MEMORY, State.COMPLETED, State.FAILED, State.FAILED]
    jobs = [job(f"a{i}", s, submit=T0 + i * 2 * HOUR, gpus=2) for i, s in enumerate(seq)]
    # bob: 3 own failures with a cancelled job and a node failure in the middle (neither extends nor
    # breaks a run, as for the hold: policy/inputs.py), never a success
    bob = [State.FAILED, State.FAILED, State.CANCELLED, State.NODE_FAIL, State.TIMEOUT]
    jobs += [
        job(f"b{i}", s, user="bob", name=None, group="vc1", submit=T0 + i * HOUR) for i, s in enumerate(bob)
    ]
    # carol: failures of two different job names never form one streak
    jobs += [
        job(f"c{i}", State.FAILED, user="carol", name=f"n{i % 2}", submit=T0 + i * HOUR) for i in range(4)
    ]
    r = report_of(store_with(tmp_path, jobs))["repeat_failures"]
    assert r["streaks"] == 2 and r["jobs"] == 6 and r["unresolved_streaks"] == 1
    rows = {row["user"]: row for row in r["rows"]}
    assert rows["alice"]["failures"] == 3 and rows["alice"]["gpu_hours"] == pytest.approx(6.0)
    assert rows["alice"]["success_followed"] is True and rows["alice"]["key"] == "user+name"
    assert rows["alice"]["states"] == ["FAILED", "OUT_OF_MEMORY"]
    assert rows["bob"]["failures"] == 3 and rows["bob"]["success_followed"] is False
    assert rows["bob"]["states"] == ["FAILED", "TIMEOUT"]
    assert (
        rows["bob"]["key"] == "user+group" and rows["bob"]["group"] == "vc1" and rows["bob"]["name"] is None
    )
    assert "carol" not in rows
    total_waste = 2 * 5 + 4 + 4  # alice 5 failures x 2 GPU-h, bob 4 (its node failure too), carol 4
    assert r["share_of_wasted_gpu_hours"] == pytest.approx((6 + 3) / total_waste)


def test_a_share_of_the_waste_never_exceeds_the_whole_waste(tmp_path: Path) -> None:
    """Every failure is in a streak here: the streaks' GPU-hours, summed streak by streak, came to
    0.9 against 0.8999999999999999 summed over the jobs, and the share read 1.0000000000000002."""
    failed = [job(str(i), State.FAILED, gpus=g, submit=T0 + 10 * i * MIN, runtime=9 * MIN)
              for i, g in enumerate((1.5, 1, 1, 0.5, 1, 1))]  # fmt: skip
    failed[3] = dataclasses.replace(failed[3], state=State.TIMEOUT)
    ok = job("ok", State.COMPLETED, submit=T0 + 25 * MIN, runtime=9 * MIN)
    r = report_of(store_with(tmp_path, [*failed[:3], ok, *failed[3:]]))
    assert r["repeat_failures"]["streaks"] == 2 and r["repeat_failures"]["jobs"] == 6
    assert r["repeat_failures"]["share_of_wasted_gpu_hours"] == 1.0
    assert 0.0 < r["timeouts"]["share_of_wasted_gpu_hours"] <= 1.0


def test_early_failures_share_by_count_and_gpu_hours_within_5_15_60_minutes(tmp_path: Path) -> None:
    runtimes = [3, 10, 30, 120]  # minutes
    jobs = [job(f"f{m}", State.FAILED, runtime=m * MIN, gpus=6) for m in runtimes]
    jobs.append(job("ok", State.COMPLETED, runtime=10 * HOUR))
    ef = report_of(store_with(tmp_path, jobs))["early_failures"]
    assert ef["failed_jobs"] == 4
    within = {e["minutes"]: e for e in ef["within"]}
    assert [within[m]["jobs"] for m in (5, 15, 60)] == [1, 2, 3]
    assert within[15]["share_jobs"] == 0.5
    assert within[60]["share_gpu_hours"] == pytest.approx((3 + 10 + 30) / (3 + 10 + 30 + 120))
    assert ef["median_runtime_s"]["waste"] == pytest.approx(20 * 60)
    assert ef["median_runtime_s"]["success"] == pytest.approx(10 * 3600)
    cdf = dict(zip(ef["cdf"]["minutes"], ef["cdf"]["waste"], strict=True))
    assert cdf[5] == 0.25 and cdf[60] == 0.75 and cdf[10080] == 1.0


def test_over_asking_gives_each_user_the_median_share_of_requested_time_used(tmp_path: Path) -> None:
    limit = 10 * 3600
    jobs = [job(f"a{i}", State.COMPLETED, runtime=h * HOUR, limit_s=limit) for i, h in enumerate([1, 2, 1.5])]
    jobs += [job(f"b{i}", State.COMPLETED, user="bob", runtime=9 * HOUR, limit_s=limit) for i in range(3)]
    jobs.append(job("t", State.TIMEOUT, user="bob", runtime=10 * HOUR, limit_s=limit, gpus=2))
    to = report_of(store_with(tmp_path, jobs))["timeouts"]
    assert to["jobs"] == 1 and to["gpu_hours"] == pytest.approx(20.0) and to["time_limits_known"] is True
    oa = to["over_asking"]
    assert oa["completed_jobs_with_limit"] == 6 and oa["jobs"] == 3 and oa["share_jobs"] == 0.5
    (alice,) = oa["by_user"]  # bob uses 90%: no advice for him
    assert alice["user"] == "alice" and alice["median_used_share"] == pytest.approx(0.15)
    assert "your jobs use a median 15% of the time you request" in alice["advice"]
    assert oa["unused_reserved_gpu_hours"] == pytest.approx((9 + 8 + 8.5) + 3 * 1)


def test_without_time_limits_the_audit_says_so_instead_of_printing_zeros(tmp_path: Path) -> None:
    r = report_of(store_with(tmp_path, [job("1", State.COMPLETED), job("2", State.FAILED)]))
    assert r["timeouts"]["time_limits_known"] is False and r["timeouts"]["over_asking"] is None
    assert any("no time limits" in n for n in r["notes"])
    from rich.console import Console

    con = Console(record=True, width=100)
    render_terminal(r, con)
    text = con.export_text()
    assert "no time limits in this data" in text and "0 jobs hit their time limit" not in text


def test_one_timeout_reads_in_the_singular_in_the_terminal_and_the_page(tmp_path: Path) -> None:
    from rich.console import Console

    from headway.audit.html import render_html

    jobs = [job("1", State.TIMEOUT, limit_s=3600), job("2", State.COMPLETED, limit_s=7200)]
    r = report_of(store_with(tmp_path, jobs))
    con = Console(record=True, width=120)
    render_terminal(r, con)
    assert "Timeouts: 1 job hit its time limit" in con.export_text()
    assert "1 job hit its time limit:" in render_html(r)


def test_grouping_by_a_field_the_data_lacks_says_so_and_names_one_it_has(tmp_path: Path) -> None:
    db = store_with(tmp_path, [job("1", State.COMPLETED, name=None), job("2", State.FAILED, name=None)])
    by_name, by_user = report_of(db, by="name"), report_of(db, by="user")
    assert (
        "no job names in this data: the top-name table is one row, (none); --by user groups by what it has"
        in (by_name["notes"])
    )
    assert not any("in this data: the top-" in n for n in by_user["notes"])


def test_waiting_reports_median_p90_max_overall_by_size_and_for_short_jobs(tmp_path: Path) -> None:
    jobs = [
        job("s1", State.COMPLETED, gpus=1, wait=1 * MIN, runtime=10 * MIN),
        job("s2", State.COMPLETED, gpus=1, wait=3 * MIN, runtime=20 * MIN),
        job("m1", State.COMPLETED, gpus=4, wait=60 * MIN, runtime=5 * HOUR),
        job("l1", State.FAILED, gpus=64, wait=600 * MIN, runtime=30 * MIN, user="bob"),
        job("p", State.PENDING, gpus=1, runtime=None),  # not started: no queueing delay yet
    ]
    wt = report_of(store_with(tmp_path, jobs))["waiting"]
    assert wt["overall"]["jobs"] == 4 and wt["overall"]["max_s"] == 36000.0
    assert wt["overall"]["median_s"] == pytest.approx((3 + 60) / 2 * 60)
    sizes = {b["gpus"]: b for b in wt["by_size"]}
    assert list(sizes) == ["1", "2-4", "33+"]
    assert sizes["1"]["median_s"] == 120.0 and sizes["1"]["jobs"] == 2
    short = wt["short_jobs"]
    assert short["overall"]["jobs"] == 3  # s1, s2, l1 ran < 1 h
    assert {b["gpus"]: b["jobs"] for b in short["by_size"]} == {"1": 2, "33+": 1}
    assert wt["by_user"][0]["user"] == "alice" and wt["by_user"][0]["jobs"] == 3


def test_weekly_series_buckets_by_iso_week_of_submission_and_adds_up_to_the_totals(tmp_path: Path) -> None:
    week = dt.timedelta(days=7)
    jobs = [
        job("1", State.COMPLETED, submit=T0, gpus=2),
        job("2", State.FAILED, submit=T0 + HOUR, gpus=2),
        job("3", State.COMPLETED, submit=T0 + week, gpus=1, wait=2 * HOUR),
        job("4", State.COMPLETED, submit=T0 + week + 6 * 24 * HOUR, gpus=1),  # Sunday: same ISO week
    ]
    r = report_of(store_with(tmp_path, jobs))
    weeks = r["weekly"]
    assert [w["week"] for w in weeks] == ["2026-W10", "2026-W11"]
    assert weeks[0]["week_start"] == "2026-03-02"
    assert weeks[0]["completion_rate"] == {"by_count": 0.5, "by_gpu_hours": 0.5}
    assert weeks[1]["completion_rate"]["by_count"] == 1.0 and weeks[1]["jobs"] == 2
    assert weeks[1]["median_wait_s"] == pytest.approx((2 * 3600 + 600) / 2)
    assert sum(w["goodput_gpu_hours"] for w in weeks) == pytest.approx(r["goodput_gpu_hours"])
    assert sum(w["wasted_gpu_hours"] for w in weeks) == pytest.approx(r["wasted_gpu_hours"])


def test_period_comparison_reports_absolute_and_relative_change_of_headline_figures(tmp_path: Path) -> None:
    day = dt.timedelta(days=1)
    before = [
        job(f"b{i}", State.FAILED if i < 3 else State.COMPLETED, submit=T0 + i * HOUR) for i in range(4)
    ]
    after = [
        job(f"a{i}", State.FAILED if i < 1 else State.COMPLETED, submit=T0 + 10 * day + i * HOUR)
        for i in range(4)
    ]
    db = store_with(tmp_path, before + after)
    with JobStore(db, read_only=True) as s:
        anchor = anchor_time(s.con)
        assert anchor == T0 + 10 * day + 3 * HOUR
        period = parse_period("-5d..", anchor=anchor)
        vs = parse_period("..2026-03-05", anchor=anchor)
        r = audit_report(s.con, since=period.since, until=period.until, vs=vs)
    assert r["totals"]["jobs"] == 4
    c = {m["metric"]: m for m in r["comparison"]["metrics"]}
    assert c["completion_rate_by_count"]["period"] == 0.75 and c["completion_rate_by_count"]["vs"] == 0.25
    assert c["completion_rate_by_count"]["change"] == pytest.approx(0.5)
    assert c["completion_rate_by_count"]["change_rel"] == pytest.approx(2.0)
    assert c["wasted_gpu_hours"]["change"] == pytest.approx(-2.0)
    assert c["wasted_gpu_hours"]["change_rel"] == pytest.approx(-2 / 3)
    assert r["comparison"]["vs"]["until"] == "2026-03-06T00:00:00+00:00"  # a bare end date includes the day


def test_compare_leaves_changes_null_when_a_period_has_no_jobs(tmp_path: Path) -> None:
    db = store_with(tmp_path, [job("1", State.COMPLETED)])
    with JobStore(db, read_only=True) as s:
        a = audit_report(s.con)
        b = audit_report(s.con, since=T0 + 100 * HOUR)
    rows = {m["metric"]: m for m in compare(a, b)["metrics"]}
    assert (
        rows["completion_rate_by_count"]["vs"] is None and rows["completion_rate_by_count"]["change"] is None
    )
    assert rows["jobs"]["change"] == 1 and rows["jobs"]["change_rel"] is None


def test_an_empty_store_gives_zeros_and_nulls_and_a_clear_message(tmp_path: Path) -> None:
    db = store_with(tmp_path, [])
    r = report_of(db)
    assert r["totals"]["jobs"] == 0 and r["totals"]["gpu_hours"] == 0.0 and r["by_state"] == {}
    assert r["completion_rate"] == {"by_count": None, "by_gpu_hours": None}
    assert r["waiting"]["overall"]["median_s"] is None and r["weekly"] == []
    res = CliRunner().invoke(app, ["audit", "--db", str(db)])
    assert res.exit_code == 0 and "Nothing to audit" in res.output
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json", "--since", "30d"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["totals"]["jobs"] == 0


def test_cli_json_is_one_clean_object_and_html_is_self_contained(tmp_path: Path) -> None:
    jobs = [
        job(str(i), State.FAILED if i % 3 == 0 else State.COMPLETED, submit=T0 + i * HOUR) for i in range(30)
    ]
    db = store_with(tmp_path, jobs)
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json", "--html", str(html), "--by", "name"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in (
        "totals",
        "by_state",
        "completion_rate",
        "wasted_gpu_hours",
        "top",
        "repeat_failures",
        "early_failures",
        "timeouts",
        "waiting",
        "weekly",
    ):
        assert key in data
    assert data["by_state"]["FAILED"]["jobs"] == 10 and data["top"]["by"] == "name"
    text = html.read_text()
    assert "<script src=" not in text.replace("'", '"').lower()
    assert 'id="chart-outcome"' in text and "Plotly" in text and len(text) > 1_000_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "expected a date"),
        (["--vs", "-7d.."], "--vs needs --period"),
        (["--period", "-7d..", "--since", "3d"], "either --period or --since"),
        (["--period", "2026-01-01"], "expected a period A..B"),
        (["--by", "color"], "choose one of"),
        (["--since", "2026-03-05", "--until", "2026-03-01"], "empty window"),
        (["--gpu-hour-price", "nan"], "--gpu-hour-price: expected USD per GPU-hour"),
        (["--gpu-hour-price", "inf"], "--gpu-hour-price: expected USD per GPU-hour"),
    ],
)
def test_bad_options_give_one_clear_line_not_a_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    db = store_with(tmp_path, [job("1", State.COMPLETED)])
    res = CliRunner().invoke(app, ["audit", "--db", str(db), *args])
    assert res.exit_code != 0 and message in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_a_missing_store_is_a_one_line_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["audit", "--db", str(tmp_path / "nope.duckdb")])
    assert res.exit_code == 1 and "no job store here yet" in res.output


def test_write_html_replaces_the_file_whole(tmp_path: Path) -> None:
    db = store_with(tmp_path, [job("1", State.COMPLETED), job("2", State.FAILED)])
    out = tmp_path / "report.html"
    out.write_text("old")
    write_html(report_of(db), out)
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".headway-")]


def test_comparing_periods_that_overlap_says_which_jobs_count_twice(tmp_path: Path) -> None:
    day = 24 * HOUR
    db = store_with(tmp_path, [job(str(i), State.COMPLETED, submit=T0 + i * day) for i in range(10)])
    start = T0.date()
    a = f"{start + dt.timedelta(days=5)}..{start + dt.timedelta(days=9)}"
    b = f"{start}..{start + dt.timedelta(days=5)}"  # a bare end date includes its whole day: day 5 too
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json", "--period", a, "--vs", b])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.stdout)["notes"]
    assert any("the two periods overlap" in n for n in notes), notes
    b = f"{start}..{start + dt.timedelta(days=4)}"
    res = CliRunner().invoke(app, ["audit", "--db", str(db), "--json", "--period", a, "--vs", b])
    assert not any("overlap" in n for n in json.loads(res.stdout)["notes"])


def test_small_costs_show_cents_and_large_ones_whole_dollars() -> None:
    from headway.audit.render import usd

    assert [usd(0.0), usd(0.37), usd(12.0), usd(99.5), usd(100.4), usd(490_175.2)] == [
        "$0",
        "$0.37",
        "$12.00",
        "$99.50",
        "$100",
        "$490,175",
    ]


def test_the_weekly_charts_keep_a_week_without_jobs_as_a_gap(tmp_path: Path) -> None:
    from headway.audit.html import figures

    week = dt.timedelta(days=7)
    jobs = [job("1", State.COMPLETED, submit=T0), job("2", State.FAILED, submit=T0 + 3 * week)]
    r = report_of(store_with(tmp_path, jobs))
    assert [w["week"] for w in r["weekly"]] == ["2026-W10", "2026-W13"]  # the JSON lists weeks with jobs
    figs = figures(r)
    rate = figs["chart-weekly-rate"].data[0]
    assert list(rate.x) == ["2026-W10", "2026-W11", "2026-W12", "2026-W13"]
    assert list(rate.y) == [1.0, None, None, 0.0]
    goodput, wasted, wait = figs["chart-weekly-hours"].data
    assert list(goodput.y) == [1.0, 0.0, 0.0, 0.0] and list(wasted.y) == [0.0, 0.0, 0.0, 1.0]
    assert list(wait.y)[1:3] == [None, None]


def test_the_weekly_charts_keep_every_week_with_jobs_across_years_without_any(tmp_path: Path) -> None:
    """A store with an old trace and a recent cluster: gap weeks were filled one by one and the charts
    kept the last 104, all of them but one empty, while the table listed every week with jobs."""
    from headway.audit.html import figures

    week = dt.timedelta(days=7)
    jobs = [job(str(i), State.COMPLETED, submit=T0 - 400 * week + i * week) for i in range(5)]
    jobs.append(job("new", State.FAILED, submit=T0))
    r = report_of(store_with(tmp_path, jobs))
    x = list(figures(r)["chart-weekly-rate"].data[0].x)
    assert len(x) == 7 and x[5] == "(395 weeks without jobs)"
    assert [w["week"] for w in r["weekly"]] == [v for v in x if not v.startswith("(")]


def test_a_weeks_median_wait_counts_only_jobs_that_started(tmp_path: Path) -> None:
    jobs = [job(str(i), State.COMPLETED, wait=HOUR) for i in range(3)]
    jobs += [job(f"p{i}", State.PENDING, runtime=None) for i in range(3)]
    jobs.append(job("c", State.CANCELLED, runtime=None))
    r = report_of(store_with(tmp_path, jobs))
    assert r["waiting"]["overall"]["median_s"] == 3600.0
    assert [w["median_wait_s"] for w in r["weekly"]] == [3600.0]


def test_failures_on_two_clusters_are_not_one_streak_and_a_mixed_store_is_named(tmp_path: Path) -> None:
    db = tmp_path / "audit.duckdb"
    a = [job(f"{i}", State.FAILED, submit=T0 + i * HOUR) for i in range(2)]
    b = [dataclasses.replace(job("1", State.FAILED, submit=T0 + 3 * HOUR), source="other")]
    with JobStore(db) as s:
        s.upsert(records_to_table(a + b))
    r = report_of(db)
    assert r["repeat_failures"]["streaks"] == 0
    assert any("the store holds 2 sources (other, test)" in n for n in r["notes"])
    one = report_of(db, source="test")
    assert not any("sources" in n for n in one["notes"])


def test_audit_json_is_identical_run_after_run_on_a_store_read_in_parallel(tmp_path: Path) -> None:
    """DuckDB sums a large table in parallel, in whatever order its threads finish; plain sums of
    fractional GPU-hours then differed in the last digits from run to run (a diff of two reports of
    the same store showed changes). The audit's float sums are compensated (fsum), so they do not."""
    n = 400_000  # several of DuckDB's row groups, so the scan is split between threads
    with JobStore(tmp_path / "big.duckdb") as store:
        store.con.execute(
            """
            INSERT INTO jobs
            SELECT CAST(i AS VARCHAR), 'u' || (i % 97), 'g' || (i % 7), 'n' || (i % 13), 'gpu', NULL,
                t0 + to_seconds(i * 17), t0 + to_seconds(i * 17 + w),
                t0 + to_seconds(i * 17 + w + 1 + (i * 104729) % 86413),
                [1, 2, 4, 8, 0.5][1 + i % 5], 1, 8, NULL, 90000,
                ['COMPLETED', 'FAILED', 'COMPLETED', 'TIMEOUT', 'CANCELLED', 'FAILED'][1 + (i * 31) % 6],
                NULL, 'bench', NULL, NULL
            FROM (SELECT range AS i, (range * 7919) % 3001 AS w, TIMESTAMPTZ '2026-01-01 00:00:00+00' AS t0
                  FROM range($n))
            """,
            {"n": n},
        )
        store.con.execute("SET threads = 4")
        first = json.dumps(audit_report(store.con), sort_keys=True, default=str)
        for _ in range(4):
            assert json.dumps(audit_report(store.con), sort_keys=True, default=str) == first


def test_a_log_without_users_counts_them_as_unknown_not_as_zero(tmp_path: Path) -> None:
    db = store_with(tmp_path, [job("1", State.COMPLETED, user=None), job("2", State.FAILED, user=None)])
    r = report_of(db)
    assert r["totals"]["users"] is None
    from rich.console import Console

    con = Console(record=True, width=100)
    render_terminal(r, con)
    assert "0 users" not in con.export_text()
    empty = report_of(db, since=T0 + 52 * 7 * 24 * HOUR)
    assert empty["totals"]["jobs"] == 0 and empty["totals"]["users"] == 0


def test_a_change_in_gpu_hours_is_rounded_like_the_figures_it_compares() -> None:
    from headway.audit.render import _change, gh

    # period 0.05 against vs 0.00 must not read "+0.1", nor a tiny drop "-0.0"
    assert _change("hours", 0.0514) == "+" + gh(0.0514) == "+0.05"
    assert _change("hours", -0.0033) == "-0.00"
    assert _change("hours", 38_828.2) == "+38,828" and _change("hours", -42.34) == "-42.3"


def terminal_and_html(db: Path, **kw: Any) -> tuple[str, str]:
    """The audit of `db` as the terminal prints it (100 columns; runs of white space, line breaks of
    wrapped sentences included, read as one space) and as the HTML page reads."""
    from rich.console import Console

    from headway.audit import render_html

    r = report_of(db, **kw)
    con = Console(record=True, width=100)
    render_terminal(r, con)
    return " ".join(con.export_text().split()), render_html(r)


def test_a_log_without_names_or_groups_keys_repeat_failures_by_user_alone_and_says_so(tmp_path: Path) -> None:
    """Without names or groups every job of a user is one sequence: a success of any job ends a run."""
    seq = [State.FAILED, State.TIMEOUT, State.FAILED, State.COMPLETED, State.FAILED, State.OUT_OF_MEMORY]
    jobs = [job(f"a{i}", s, name=None, group=None, submit=T0 + i * HOUR) for i, s in enumerate(seq)]
    jobs += [
        job(f"b{i}", State.FAILED, user="bob", name=None, group=None, submit=T0 + i * HOUR) for i in range(4)
    ]
    db = store_with(tmp_path, jobs)
    rf = report_of(db)["repeat_failures"]
    assert rf["key"] == "user" and rf["key_label"] == "by user alone: this log has no job names or groups"
    assert rf["keyed_jobs"] == {"user+name": 0, "user+group": 0, "user": 10} and rf["unkeyed_failures"] == 0
    assert rf["streaks"] == 2 and rf["jobs"] == 7 and rf["unresolved_streaks"] == 1
    rows = {x["user"]: x for x in rf["rows"]}
    assert rows["alice"]["failures"] == 3 and rows["alice"]["success_followed"] is True
    assert rows["bob"]["failures"] == 4 and rows["bob"]["key"] == "user"
    assert rows["bob"]["name"] is None and rows["bob"]["group"] is None
    text, page = terminal_and_html(db)
    assert "Repeat failures (by user alone: this log has no job names or groups): 2 run(s)" in text
    assert "(any job)" in text
    assert "by user alone: this log has no job names or groups" in page and "by the same user alone" in page


def test_in_a_log_with_names_a_job_with_neither_name_nor_group_is_left_out_and_counted(
    tmp_path: Path,
) -> None:
    named = [job(f"n{i}", State.COMPLETED, submit=T0 + i * HOUR) for i in range(2)]
    nameless = [job(f"x{i}", State.FAILED, name=None, group=None, submit=T0 + i * HOUR) for i in range(3)]
    db = store_with(tmp_path, named + nameless)
    rf = report_of(db)["repeat_failures"]
    assert rf["key"] == "user+name" and rf["key_label"] is None  # per log: this log has names
    assert rf["streaks"] == 0 and rf["unkeyed_failures"] == 3
    text, _ = terminal_and_html(db)
    assert "no user+name failed 3+ times in a row; 3 failures left out (no user, or neither name nor" in text


def test_a_log_without_users_says_repeat_failures_cannot_be_seen_not_none(tmp_path: Path) -> None:
    jobs = [job(str(i), State.FAILED, user=None, submit=T0 + i * HOUR) for i in range(4)]
    db = store_with(tmp_path, jobs)
    r = report_of(db)
    rf = r["repeat_failures"]
    assert rf["key"] is None and rf["unkeyed_failures"] == 4 and rf["streaks"] == 0
    assert rf["key_label"] == "cannot be seen: no failed job names its user"
    assert compare(r, r)["metrics"][9]["metric"] == "repeat_failure_gpu_hours"
    assert compare(r, r)["metrics"][9]["period"] is None  # unknown, not 0
    text, page = terminal_and_html(db)
    assert "Repeat failures cannot be seen: no failed job names its user." in text
    assert "no user+name failed" not in text
    assert "Cannot be seen: no failed job names its user." in page


def test_a_store_where_one_log_lacks_names_and_groups_labels_that_log_alone(tmp_path: Path) -> None:
    db = tmp_path / "audit.duckdb"
    named = [job(f"n{i}", State.FAILED, submit=T0 + i * HOUR) for i in range(3)]
    bare = [
        dataclasses.replace(
            job(f"b{i}", State.FAILED, name=None, group=None, submit=T0 + i * HOUR), source="old"
        )
        for i in range(3)
    ]
    with JobStore(db) as s:
        s.upsert(records_to_table(named + bare))
    rf = report_of(db)["repeat_failures"]
    assert rf["key"] == "mixed" and rf["keyed_jobs"] == {"user+name": 3, "user+group": 0, "user": 3}
    assert rf["key_label"] == "by user alone in old: no job names or groups there"
    assert sorted(x["key"] for x in rf["rows"]) == ["user", "user+name"]  # two streaks, never one of six
    only = report_of(db, source="test")["repeat_failures"]
    assert only["key"] == "user+name" and only["key_label"] is None
