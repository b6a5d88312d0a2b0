"""The audit in the terminal: rich tables that stay readable on 100 columns, read from the report dict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from headway.audit.compute import BY_TITLES, REPEAT_KEYS
from headway.console import count, plain, print_table, safe_escape
from headway.humanize import dur
from headway.schema import OUTCOME_OF, State

WEEKS_SHOWN = 26


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def gh(x: float | None) -> str:
    """GPU-hours: whole numbers with separators, one decimal below 100."""
    if x is None:
        return "–"
    if abs(x) < 1:
        return f"{x:,.2f}"
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def usd(x: float | None) -> str:
    """Whole dollars, except below $100, where cents matter (a small lab's week is not "$0")."""
    if x is None:
        return "–"
    return f"${x:,.0f}" if abs(x) >= 100 or x == 0 else f"${x:,.2f}"


def _fmt(kind: str, x: float | None) -> str:
    if x is None:
        return "–"
    if kind == "rate":
        return pct(x)
    if kind == "hours":
        return gh(x)
    if kind == "usd":
        return usd(x)
    if kind == "seconds":
        return dur(x)
    return f"{x:,.0f}"


def _change(kind: str, x: float | None) -> str:
    if x is None:
        return "–"
    if kind == "rate":
        return f"{x * 100:+.1f} pts"
    if kind == "seconds":
        return ("+" if x >= 0 else "") + dur(x)
    if kind == "hours":  # the rounding of gh(), which shows the two figures compared
        return ("+" if x >= 0 else "-") + gh(abs(x))
    if kind == "usd":
        return ("+" if x >= 0 else "-") + usd(abs(x))
    return f"{x:+,.0f}"


def _table(title: str, *cols: str, right: tuple[int, ...] = ()) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", header_style="bold")
    for i, c in enumerate(cols):
        t.add_column(c, justify="right" if i in right else "left", overflow="fold")
    return t


def _state_order(s: str) -> int:
    names = [x.value for x in State]
    return names.index(s) if s in names else len(names)


def render_terminal(report: dict[str, Any], console: Console) -> None:
    """Print every section of the audit; sections with nothing to show say so in one line."""
    t = report["totals"]
    w = report["window"]
    scope = "GPU jobs" if report["scope"] == "gpu_jobs" else "all jobs"
    span = (
        f"{(w['since'] or '…')[:16]} .. {(w['until'] or '…')[:16]}"
        if (w["since"] or w["until"])
        else "all time"
    )
    of = f" of source {safe_escape(report['source'])}" if report.get("source") else ""
    console.print(f"[bold]headway audit[/]: jobs{of} submitted {span}, auditing {scope}")
    console.print(f"{t['jobs']:,} jobs, {t['gpu_jobs']:,} GPU jobs, {gh(t['gpu_hours'])} GPU-hours", end="")
    if t["first_submit"]:
        console.print(f" · submitted {t['first_submit'][:10]} .. {t['last_submit'][:10]}", end="")
        if t["users"] is not None:
            console.print(f" · {t['users']:,} users", end="")
    console.print()
    for n in report["notes"]:
        console.print(f"[yellow]note:[/] {safe_escape(n)}")  # notes name sources: plain text
    if t["audited_jobs"] == 0:
        windowed = bool(w["since"] or w["until"])
        if not t["jobs"]:  # (jobs without a GPU: the notes above already say --include-cpu)
            console.print(
                "Nothing to audit in this window: widen --since/--until."
                if windowed
                else "Nothing to audit: ingest jobs with `headway ingest` first."
            )
        _comparison(report, console)
        return
    _outcomes(report, console)
    _top(report, console)
    _repeats(report, console)
    _early(report, console)
    _timeouts(report, console)
    _cancelled(report, console)
    _waiting(report, console)
    _weekly(report, console)
    _comparison(report, console)


def _outcomes(r: dict[str, Any], console: Console) -> None:
    tab = _table(
        "Jobs and GPU-hours by state",
        "state",
        "class",
        "jobs",
        "% jobs",
        "GPU-hours",
        "% GPU-hours",
        right=(2, 3, 4, 5),
    )
    for s in sorted(r["by_state"], key=_state_order):
        v = r["by_state"][s]
        cls = OUTCOME_OF[State(s)].value if s in State.__members__ else "unfinished"
        tab.add_row(
            s, cls, f"{v['jobs']:,}", pct(v["share_jobs"]), gh(v["gpu_hours"]), pct(v["share_gpu_hours"])
        )
    print_table(tab, console)
    cr = r["completion_rate"]
    cost = r["wasted_cost"]
    console.print(
        f"completion rate: [bold]{pct(cr['by_count'])}[/] of ended jobs, "
        f"[bold]{pct(cr['by_gpu_hours'])}[/] of their GPU-hours  ·  "
        f"goodput {gh(r['goodput_gpu_hours'])} GPU-hours"
    )
    console.print(
        "wasted (failed, timeout, out of memory, node fail): "
        f"[bold red]{gh(r['wasted_gpu_hours'])} GPU-hours[/], about {usd(cost['usd'])} "
        f"at ${cost['usd_per_gpu_hour']:.2f}/GPU-hour (--gpu-hour-price)"
    )


def _top(r: dict[str, Any], console: Console) -> None:
    by = r["top"]["by"]
    rows = r["top"][by]
    wasted = r["wasted_gpu_hours"] or 0.0
    tab = _table(
        f"Top {BY_TITLES.get(by, by)} by wasted GPU-hours",
        by,
        "jobs",
        "GPU-hours",
        "wasted",
        "% of waste",
        "done (jobs)",
        "done (GPU-h)",
        right=(1, 2, 3, 4, 5, 6),
    )
    for row in rows:
        cr = row["completion_rate"]
        tab.add_row(
            plain(str(row["key"])[:28]),  # a user, name or group as written, never markup
            f"{row['jobs']:,}",
            gh(row["gpu_hours"]),
            gh(row["wasted_gpu_hours"]),
            pct(row["wasted_gpu_hours"] / wasted if wasted else None),
            pct(cr["by_count"]),
            pct(cr["by_gpu_hours"]),
        )
    print_table(tab, console)


def repeat_keyed_by(rf: dict[str, Any]) -> str:
    """What a repeat-failure streak is a streak of, in words: "user+name", "user alone", or the rules used
    in turn ("user+name, else user+group"); a report from before `keyed_jobs` keyed user+name, else group."""
    keyed = rf.get("keyed_jobs")
    if keyed is None:
        return "user+name, else user+group"
    used = [k for k in REPEAT_KEYS if keyed.get(k)] or ["user+name"]
    return ", else ".join("user alone" if k == "user" else k for k in used)


def repeat_job(row: dict[str, Any]) -> str:
    """The job a streak's row is about: its name, its group, or every job of its user."""
    if row.get("key") == "user":
        return "(any job)"
    return str(row["name"]) if row["name"] is not None else f"group {row['group']}"


def _repeats(r: dict[str, Any], console: Console) -> None:
    rf = r["repeat_failures"]
    label = rf.get("key_label")
    if rf.get("key") is None and label:  # failures, none of them keyed: unknown, not "none"
        console.print(f"Repeat failures {safe_escape(label)}.")
        return
    head = f"Repeat failures ({safe_escape(label)})" if label else "Repeat failures"
    unkeyed = rf.get("unkeyed_failures") or 0
    left_out = (
        f"; {count(unkeyed, 'failure')} left out (no user, or neither name nor group)" if unkeyed else ""
    )
    if rf["streaks"] == 0:
        console.print(f"{head}: no {repeat_keyed_by(rf)} failed {rf['min_run']}+ times in a row{left_out}.")
        return
    console.print(
        f"{head}: [bold]{rf['streaks']:,}[/] run(s) of {rf['min_run']}+ failures in a row "
        f"({rf['jobs']:,} jobs, {gh(rf['gpu_hours'])} GPU-hours, {pct(rf['share_of_wasted_gpu_hours'])} of "
        f"the waste); {rf['unresolved_streaks']:,} never followed by a success{left_out}"
    )
    tab = _table(
        "Longest-burning repeat failures",
        "user",
        "job (name or group)",
        "fails",
        "GPU-hours",
        "last failure",
        "then ok?",
        right=(2, 3),
    )
    for row in rf["rows"]:
        tab.add_row(
            plain(str(row["user"])[:16]),
            plain(repeat_job(row)[:30]),
            f"{row['failures']:,}",
            gh(row["gpu_hours"]),
            (row["last"] or "–")[:16].replace("T", " "),
            "yes" if row["success_followed"] else "[red]no[/]",
        )
    print_table(tab, console)


def _cancelled(r: dict[str, Any], console: Console) -> None:
    """Cancelled jobs by when they were cancelled, then the users with the most cancelled GPU-hours: the
    jobs they withdrew or stopped early (GPUs saved) beside the GPU-hours they stopped near the limit."""
    c = r.get("cancelled")  # absent in a report written before the section existed
    if not c:
        return
    if c["jobs"] == 0:
        console.print("Cancelled: no cancelled jobs.")
        return
    console.print(
        f"Cancelled: {count(c['jobs'], 'job')}, [bold]{gh(c['gpu_hours'])} GPU-hours[/] "
        f"({pct(c['share_of_gpu_hours'])} of the GPU-hours audited)"
    )
    tab = _table(
        "Cancelled jobs by when they were cancelled",
        "when cancelled",
        "jobs",
        "% jobs",
        "GPU-hours",
        "% GPU-hours",
        right=(1, 2, 3, 4),
    )
    for b in c["by_bucket"].values():
        tab.add_row(
            b["label"], f"{b['jobs']:,}", pct(b["share_jobs"]), gh(b["gpu_hours"]), pct(b["share_gpu_hours"])
        )
    print_table(tab, console)
    tab = _table(
        "Top users by cancelled GPU-hours",
        "user",
        "jobs",
        "GPU-hours",
        "% of cancelled",
        "never started",
        "<= 10 min",
        "near limit GPU-h",
        right=(1, 2, 3, 4, 5, 6),
    )
    for u in c["by_user"]:
        bb = u["by_bucket"]
        tab.add_row(
            plain(str(u["user"])[:20]),
            f"{u['jobs']:,}",
            gh(u["gpu_hours"]),
            pct(u["share_of_cancelled_gpu_hours"]),
            f"{bb['never_started']['jobs']:,}",
            f"{bb['within_10_min']['jobs']:,}",
            gh(bb["near_time_limit"]["gpu_hours"]),
        )
    print_table(tab, console)


def _early(r: dict[str, Any], console: Console) -> None:
    ef = r["early_failures"]
    if ef["failed_jobs"] == 0:
        console.print("Early failures: no failed jobs with a known runtime.")
        return
    tab = _table(
        f"Early failures ({ef['failed_jobs']:,} failed jobs)",
        "ended within",
        "failed jobs",
        "% of failed",
        "GPU-hours",
        "% of their GPU-hours",
        right=(1, 2, 3, 4),
    )
    for e in ef["within"]:
        tab.add_row(
            f"{e['minutes']} min",
            f"{e['jobs']:,}",
            pct(e["share_jobs"]),
            gh(e["gpu_hours"]),
            pct(e["share_gpu_hours"]),
        )
    print_table(tab, console)
    med = ef["median_runtime_s"]
    console.print(f"median runtime: failed {dur(med['waste'])}, successful {dur(med['success'])}")


def _timeouts(r: dict[str, Any], console: Console) -> None:
    to = r["timeouts"]
    if not to["time_limits_known"] and to["jobs"] == 0:
        console.print("Timeouts and over-asking: no time limits in this data, so neither can be measured.")
        return
    its = "its" if to["jobs"] == 1 else "their"
    console.print(
        f"Timeouts: {count(to['jobs'], 'job')} hit {its} time limit, {gh(to['gpu_hours'])} GPU-hours "
        f"({pct(to['share_of_wasted_gpu_hours'])} of the waste)"
    )
    oa = to["over_asking"]
    if oa is None:
        console.print("Over-asking: no time limits in this data, so it cannot be measured.")
        return
    console.print(
        f"Over-asking: {oa['jobs']:,} of {oa['completed_jobs_with_limit']:,} completed jobs "
        f"({pct(oa['share_jobs'])}) used less than {oa['threshold_share'] * 100:.0f}% of their time limit; "
        f"median use {pct(oa['median_used_share'])}"
    )
    for a in oa["by_user"]:
        console.print(f"  [bold]{safe_escape(a['user'])}[/]: {safe_escape(a['advice'])}")


def _wait_row(v: dict[str, Any]) -> list[str]:
    return [f"{v['jobs']:,}", dur(v["median_s"]), dur(v["p90_s"]), dur(v["max_s"])]


def _waiting(r: dict[str, Any], console: Console) -> None:
    wt = r["waiting"]
    if wt["overall"]["jobs"] == 0:
        console.print("Waiting: no started jobs with a submit time.")
        return
    o, s = wt["overall"], wt["short_jobs"]["overall"]
    console.print(
        f"Queueing delay: median {dur(o['median_s'])}, p90 {dur(o['p90_s'])}, max {dur(o['max_s'])}  ·  "
        f"jobs under 1 h: median {dur(s['median_s'])}, p90 {dur(s['p90_s'])}"
    )
    short = {b["gpus"]: b for b in wt["short_jobs"]["by_size"]}
    tab = _table(
        "Queueing delay by job size",
        "GPUs",
        "jobs",
        "median",
        "p90",
        "max",
        "short jobs",
        "short median",
        "short p90",
        right=(1, 2, 3, 4, 5, 6, 7),
    )
    for b in wt["by_size"]:
        sb = short.get(b["gpus"])
        tab.add_row(
            b["gpus"],
            *_wait_row(b),
            f"{sb['jobs']:,}" if sb else "0",
            dur(sb["median_s"]) if sb else "–",
            dur(sb["p90_s"]) if sb else "–",
        )
    print_table(tab, console)
    tab = _table("Queueing delay by user", "user", "jobs", "median", "p90", "max", right=(1, 2, 3, 4))
    for u in wt["by_user"]:
        tab.add_row(plain(str(u["user"])[:28]), *_wait_row(u))
    print_table(tab, console)


def _weekly(r: dict[str, Any], console: Console) -> None:
    weeks = r["weekly"]
    if not weeks:
        return
    shown = weeks[-WEEKS_SHOWN:]
    title = "Weekly (by submit week)" + (
        f", last {len(shown)} of {len(weeks)}" if len(shown) < len(weeks) else ""
    )
    tab = _table(
        title,
        "week",
        "jobs",
        "done (jobs)",
        "done (GPU-h)",
        "goodput",
        "wasted",
        "median wait",
        right=(1, 2, 3, 4, 5, 6),
    )
    for wk in shown:
        cr = wk["completion_rate"]
        tab.add_row(
            wk["week"],
            f"{wk['jobs']:,}",
            pct(cr["by_count"]),
            pct(cr["by_gpu_hours"]),
            gh(wk["goodput_gpu_hours"]),
            gh(wk["wasted_gpu_hours"]),
            dur(wk["median_wait_s"]),
        )
    print_table(tab, console)


def _comparison(r: dict[str, Any], console: Console) -> None:
    c = r.get("comparison")
    if not c:
        return

    def lab(w: dict[str, Any]) -> str:
        return f"{(w['since'] or '…')[:10]}..{(w['until'] or '…')[:10]}"

    tab = _table(
        f"Change: {lab(c['period'])} against {lab(c['vs'])}",
        "figure",
        "period",
        "vs",
        "change",
        "relative",
        right=(1, 2, 3, 4),
    )
    for m in c["metrics"]:
        k = m["kind"]
        rel = m["change_rel"]
        tab.add_row(
            m["label"],
            _fmt(k, m["period"]),
            _fmt(k, m["vs"]),
            _change(k, m["change"]),
            "–" if rel is None else f"{rel * 100:+.1f}%",
        )
    print_table(tab, console)
