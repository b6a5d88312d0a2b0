"""The audit as one self-contained offline HTML file: plotly.js inlined, charts plus the tables.

Built from the report dict only (never the store), so its size and cost do not grow with the number of
jobs. Every chart sits in a `<section class="chart" id=...>` that the browser test looks into.
"""

from __future__ import annotations

import datetime as dt
import html as _html
from pathlib import Path
from typing import Any

from headway.atomic import replaced_atomically
from headway.audit.compute import BY_TITLES, CANCEL_BUCKETS
from headway.audit.render import WEEKS_SHOWN, _change, _fmt, dur, gh, pct, repeat_job, repeat_keyed_by, usd
from headway.console import count
from headway.schema import OUTCOME_OF, Outcome, State

CHART_IDS: tuple[str, ...] = (
    "chart-outcome",
    "chart-weekly-rate",
    "chart-weekly-hours",
    "chart-top",
    "chart-early",
    "chart-waiting",
)
# Charts drawn only when there is something to draw (a log without cancelled jobs has no cancelled charts).
CANCELLED_CHART_IDS: tuple[str, ...] = ("chart-cancelled", "chart-cancelled-users")
# Cancelled buckets from "saved GPUs" (green) to "spent most of the limit" (red); grey: not known.
CANCEL_COLORS: dict[str, str] = {
    "never_started": "#b0bec5",
    "within_10_min": "#66bb6a",
    "rest": "#f9a825",
    "near_time_limit": "#c62828",
    "no_time_limit": "#78909c",
}
COLORS = {
    Outcome.SUCCESS.value: "#2e7d32",
    Outcome.WASTE.value: "#c62828",
    Outcome.CANCELLED.value: "#f9a825",
    Outcome.PREEMPTED.value: "#6a1b9a",
    Outcome.UNFINISHED.value: "#78909c",
}

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;padding:0 1rem}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
.kpis{display:flex;flex-wrap:wrap;gap:1rem;margin:1rem 0}
.kpi{background:#f5f5f5;border-radius:6px;padding:.6rem 1rem;min-width:150px}
.kpi b{display:block;font-size:1.4rem}.note{color:#8a6d00}.muted{color:#777}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{padding:.25rem .6rem;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#fafafa}
.chart{margin:1rem 0}
"""


def _e(x: object) -> str:
    return _html.escape(str(x))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


MAX_FILLED_GAP = 8  # weeks: a longer stretch without jobs is one mark on the axis, not weeks of zeros


def _empty_week(label: str, start: str) -> dict[str, Any]:
    return {
        "week": label,
        "week_start": start,
        "completion_rate": {"by_count": None, "by_gpu_hours": None},
        "goodput_gpu_hours": 0.0,
        "wasted_gpu_hours": 0.0,
        "median_wait_s": None,
    }


def _every_week(weekly: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The weeks with jobs, and the quiet weeks between them: on the charts' axis of week names a quiet
    week (a holiday, an outage) would otherwise vanish and its neighbours join up. A longer stretch
    without jobs (a store holding a 2017 trace and this year's cluster) is one mark that says how long:
    filling it week by week pushed every week with data off the charts."""
    out: list[dict[str, Any]] = []
    prev: dt.date | None = None
    for w in weekly:
        day = dt.date.fromisoformat(w["week_start"])
        if prev is not None:
            gap = (day - prev).days // 7 - 1
            if gap > MAX_FILLED_GAP:
                out.append(
                    _empty_week(f"({gap:,} weeks without jobs)", (prev + dt.timedelta(days=7)).isoformat())
                )
            else:
                for k in range(1, gap + 1):
                    d = prev + dt.timedelta(days=7 * k)
                    iso = d.isocalendar()
                    out.append(_empty_week(f"{iso.year}-W{iso.week:02d}", d.isoformat()))
        out.append(w)
        prev = day
    return out


def figures(r: dict[str, Any]) -> dict[str, Any]:
    """One plotly figure per chart id (this report and the dashboard's overview draw the same ones);
    plotly is imported lazily so `headway --help` stays fast."""
    import plotly.graph_objects as go

    layout = {"template": "plotly_white", "height": 380, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}
    figs: dict[str, Any] = {}

    states = sorted(
        r["by_state"], key=lambda s: [x.value for x in State].index(s) if s in State.__members__ else 99
    )
    cls = [OUTCOME_OF[State(s)].value if s in State.__members__ else "unfinished" for s in states]
    figs["chart-outcome"] = go.Figure(
        go.Bar(
            x=states,
            y=[r["by_state"][s]["gpu_hours"] for s in states],
            marker_color=[COLORS[c] for c in cls],
            text=[pct(r["by_state"][s]["share_gpu_hours"]) for s in states],
            customdata=cls,
            hovertemplate="%{x} (%{customdata}): %{y:,.2~f} GPU-hours<extra></extra>",
        ),
        layout={
            **layout,
            "title": "GPU-hours by final state (green success, red waste)",
            "yaxis": {"title": "GPU-hours"},
        },
    )

    every = _every_week(r["weekly"])
    weeks = every[-WEEKS_SHOWN * 4 :]
    labels = [w["week"] for w in weeks]
    cut = f" (the last {len(weeks)} of {len(every)} weeks)" if len(weeks) < len(every) else ""
    figs["chart-weekly-rate"] = go.Figure(
        [
            go.Scatter(
                x=labels,
                y=[w["completion_rate"]["by_count"] for w in weeks],
                mode="lines+markers",
                name="completion rate (jobs)",
            ),
            go.Scatter(
                x=labels,
                y=[w["completion_rate"]["by_gpu_hours"] for w in weeks],
                mode="lines+markers",
                name="completion rate (GPU-hours)",
            ),
        ],
        layout={
            **layout,
            "title": f"Weekly completion rate (by submit week){cut}",
            "yaxis": {"title": "share of ended jobs", "tickformat": ".0%", "range": [0, 1.05]},
        },
    )
    figs["chart-weekly-hours"] = go.Figure(
        [
            go.Bar(
                x=labels,
                y=[w["goodput_gpu_hours"] for w in weeks],
                name="goodput",
                marker_color=COLORS["success"],
            ),
            go.Bar(
                x=labels,
                y=[w["wasted_gpu_hours"] for w in weeks],
                name="wasted",
                marker_color=COLORS["waste"],
            ),
            go.Scatter(
                x=labels,
                y=[None if w["median_wait_s"] is None else w["median_wait_s"] / 3600 for w in weeks],
                name="median wait (h)",
                mode="lines+markers",
                yaxis="y2",
                line={"color": "#455a64", "dash": "dot"},
            ),
        ],
        layout={
            **layout,
            "title": f"Weekly goodput, waste and median queueing delay{cut}",
            "barmode": "stack",
            "yaxis": {"title": "GPU-hours"},
            "yaxis2": {
                "title": "median wait (h)",
                "overlaying": "y",
                "side": "right",
                "showgrid": False,
                "rangemode": "tozero",
            },
            "legend": {"orientation": "h", "y": -0.2},
        },
    )

    by = r["top"]["by"]
    top = list(reversed(r["top"][by]))
    figs["chart-top"] = go.Figure(
        go.Bar(
            # plotly reads a small set of HTML tags in labels (a link, a line break): names are text
            y=[_html.escape(str(t["key"]), quote=False) for t in top],
            x=[t["wasted_gpu_hours"] for t in top],
            orientation="h",
            marker_color=COLORS["waste"],
            text=[f"done {pct(t['completion_rate']['by_count'])}" for t in top],
            hovertemplate="%{y}: %{x:,.2~f} wasted GPU-hours, %{text}<extra></extra>",
        ),
        layout={
            **layout,
            "title": f"Top {BY_TITLES.get(by, by)} by wasted GPU-hours",
            "xaxis": {"title": "wasted GPU-hours"},
            "yaxis": {"type": "category", "automargin": True},
        },
    )

    cdf = r["early_failures"]["cdf"]
    figs["chart-early"] = go.Figure(
        [
            go.Scatter(
                x=cdf["minutes"],
                y=cdf["waste"],
                mode="lines+markers",
                name="failed jobs",
                line={"color": COLORS["waste"]},
            ),
            go.Scatter(
                x=cdf["minutes"],
                y=cdf["success"],
                mode="lines+markers",
                name="successful jobs",
                line={"color": COLORS["success"]},
            ),
        ],
        layout={
            **layout,
            "title": "Runtime CDF: how soon jobs end (failed against successful)",
            "xaxis": {"title": "runtime (minutes, log scale)", "type": "log"},
            "yaxis": {"title": "share of jobs ending within", "tickformat": ".0%", "range": [0, 1.05]},
        },
    )

    c = r.get("cancelled")
    if c and c["jobs"]:
        figs.update(_cancelled_figures(c, layout))

    sizes = r["waiting"]["by_size"]
    short = {b["gpus"]: b for b in r["waiting"]["short_jobs"]["by_size"]}
    xs = [b["gpus"] for b in sizes]
    figs["chart-waiting"] = go.Figure(
        [
            go.Bar(x=xs, y=[(b["median_s"] or 0) / 3600 for b in sizes], name="median, all jobs"),
            go.Bar(x=xs, y=[(b["p90_s"] or 0) / 3600 for b in sizes], name="p90, all jobs"),
            go.Bar(
                x=xs,
                y=[((short.get(x) or {}).get("median_s") or 0) / 3600 for x in xs],
                name="median, jobs < 1 h",
            ),
        ],
        layout={
            **layout,
            "title": "Queueing delay by job size (GPUs)",
            "barmode": "group",
            "xaxis": {"title": "GPUs requested", "type": "category"},
            "yaxis": {"title": "hours"},
        },
    )
    return figs


def _cancelled_figures(c: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """Cancelled GPU-hours by when the jobs were cancelled, and the top users' GPU-hours split the same way
    (a job cancelled before it started held no GPU: its bucket has jobs, never GPU-hours, so only the
    first chart's label shows it)."""
    import plotly.graph_objects as go

    buckets = c["by_bucket"]
    figs: dict[str, Any] = {}
    figs["chart-cancelled"] = go.Figure(
        go.Bar(
            x=[b["label"] for b in buckets.values()],
            y=[b["gpu_hours"] for b in buckets.values()],
            marker_color=[CANCEL_COLORS[k] for k in buckets],
            text=[f"{b['jobs']:,} jobs" for b in buckets.values()],
            textposition="outside",  # above the bar: 0 GPU-hours (never started) still shows its jobs
            cliponaxis=False,
            hovertemplate="%{x}: %{y:,.2~f} GPU-hours, %{text}<extra></extra>",
        ),
        layout={
            **layout,
            "title": "Cancelled GPU-hours by when the job was cancelled (green saved GPUs, red spent them)",
            "yaxis": {"title": "GPU-hours"},
            "xaxis": {"type": "category"},
        },
    )
    users = list(reversed(c["by_user"]))
    names = [_html.escape(str(u["user"]), quote=False) for u in users]  # text, not markup (see chart-top)
    figs["chart-cancelled-users"] = go.Figure(
        [
            go.Bar(
                y=names,
                x=[u["by_bucket"][k]["gpu_hours"] for u in users],
                orientation="h",
                name=CANCEL_BUCKETS[k],
                marker_color=CANCEL_COLORS[k],
                customdata=[u["by_bucket"][k]["jobs"] for u in users],
                hovertemplate="%{y}: %{x:,.2~f} GPU-hours, %{customdata:,} jobs<extra></extra>",
            )
            for k in CANCEL_BUCKETS
            if k != "never_started"
        ],
        layout={
            **layout,
            "title": "Top users by cancelled GPU-hours",
            "barmode": "stack",
            "xaxis": {"title": "cancelled GPU-hours"},
            "yaxis": {"type": "category", "automargin": True},
            "legend": {"orientation": "h", "y": -0.2, "traceorder": "normal"},
        },
    )
    return figs


def _cancelled_section(c: dict[str, Any] | None, figs: dict[str, Any]) -> str:
    """The cancelled-jobs section: what the buckets mean, both charts, and their tables."""
    if not c:
        return ""
    out = ["<h2>Cancelled jobs</h2>"]
    if not c["jobs"]:
        return out[0] + "<p>No cancelled jobs.</p>"
    out.append(
        f"<p>{count(c['jobs'], 'cancelled job')}: {_e(gh(c['gpu_hours']))} GPU-hours "
        f"({_e(pct(c['share_of_gpu_hours']))} of the GPU-hours audited). A job cancelled within "
        f"{c['early_s'] / 60:.0f} min of starting saved the GPUs it would have held; one cancelled after "
        f"{c['near_limit_share'] * 100:.0f}% or more of its time limit had spent most of them.</p>"
    )
    out.append(_chart(figs["chart-cancelled"], "chart-cancelled"))
    out.append(
        _table(
            ["when cancelled", "jobs", "% jobs", "GPU-hours", "% GPU-hours"],
            [
                [
                    b["label"],
                    f"{b['jobs']:,}",
                    pct(b["share_jobs"]),
                    gh(b["gpu_hours"]),
                    pct(b["share_gpu_hours"]),
                ]
                for b in c["by_bucket"].values()
            ],
        )
    )
    out.append(_chart(figs["chart-cancelled-users"], "chart-cancelled-users"))
    out.append(
        _table(
            [
                "user",
                "jobs",
                "GPU-hours",
                "% of cancelled",
                *(f"{v} ({'jobs' if k == 'never_started' else 'GPU-h'})" for k, v in CANCEL_BUCKETS.items()),
            ],
            [
                [
                    str(u["user"]),
                    f"{u['jobs']:,}",
                    gh(u["gpu_hours"]),
                    pct(u["share_of_cancelled_gpu_hours"]),
                    *(
                        f"{u['by_bucket'][k]['jobs']:,}"
                        if k == "never_started"
                        else gh(u["by_bucket"][k]["gpu_hours"])
                        for k in CANCEL_BUCKETS
                    ),
                ]
                for u in c["by_user"]
            ],
        )
    )
    return "".join(out)


def _chart(fig: Any, div_id: str) -> str:
    div = fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=f"{div_id}-plot",
        config={"displaylogo": False, "responsive": True},
    )
    return f'<section class="chart" id="{div_id}">{div}</section>'


def _repeat_summary(rf: dict[str, Any]) -> str:
    """The repeat-failure heading and its sentence, which says how streaks were keyed (by user alone in a log
    without job names or groups) and that they cannot be seen in a log without users, never a bare 0."""
    label = rf.get("key_label")
    if rf.get("key") is None and label:
        return f"<h2>Repeat failures</h2><p>{_e(label[:1].upper() + label[1:])}.</p>"
    unkeyed = rf.get("unkeyed_failures") or 0
    left_out = (
        f" {count(unkeyed, 'failure')} left out (no user, or neither name nor group)." if unkeyed else ""
    )
    head = f"<h2>Repeat failures</h2>{f'<p><b>{_e(label)}</b></p>' if label else ''}"
    return (
        f"{head}<p>{rf['streaks']:,} runs of {rf['min_run']}+ failures in a row "
        f"by the same {_e(repeat_keyed_by(rf))}: {rf['jobs']:,} jobs, "
        f"{_e(gh(rf['gpu_hours']))} GPU-hours "
        f"({_e(pct(rf['share_of_wasted_gpu_hours']))} of the waste); {rf['unresolved_streaks']:,} never "
        f"followed by a success.{left_out}</p>"
    )


def render_html(r: dict[str, Any]) -> str:
    """The whole page as a string (plotly.js inlined once, so the file works offline)."""
    from plotly.offline import get_plotlyjs

    figs = figures(r) if r["totals"]["audited_jobs"] else {}
    t, cr, w = r["totals"], r["completion_rate"], r["window"]
    parts: list[str] = []
    span = (
        f"{(w['since'] or '…')[:16]} .. {(w['until'] or '…')[:16]}"
        if (w["since"] or w["until"])
        else "all time"
    )
    parts.append("<h1>headway audit: where the GPU-hours went</h1>")
    parts.append(
        f"<p class='muted'>jobs submitted {_e(span)} · auditing "
        f"{'GPU jobs' if r['scope'] == 'gpu_jobs' else 'all jobs'} · store {_e(r.get('db', ''))}</p>"
    )
    for n in r["notes"]:
        parts.append(f"<p class='note'>note: {_e(n)}</p>")
    kpis = [
        ("jobs", f"{t['jobs']:,}"),
        ("GPU jobs", f"{t['gpu_jobs']:,}"),
        ("GPU-hours", gh(t["gpu_hours"])),
        ("completion rate (jobs)", pct(cr["by_count"])),
        ("completion rate (GPU-hours)", pct(cr["by_gpu_hours"])),
        ("goodput GPU-hours", gh(r["goodput_gpu_hours"])),
        ("wasted GPU-hours", gh(r["wasted_gpu_hours"])),
        (f"wasted cost at ${r['wasted_cost']['usd_per_gpu_hour']:.2f}/GPU-h", usd(r["wasted_cost"]["usd"])),
    ]
    parts.append(
        "<div class='kpis'>"
        + "".join(f"<div class='kpi'>{_e(k)}<b>{_e(v)}</b></div>" for k, v in kpis)
        + "</div>"
    )
    if not figs:
        parts.append("<p>Nothing to audit in this window.</p>")
    else:
        parts.append("<h2>Outcomes</h2>" + _chart(figs["chart-outcome"], "chart-outcome"))
        parts.append(
            _table(
                ["state", "class", "jobs", "% jobs", "GPU-hours", "% GPU-hours"],
                [
                    [
                        s,
                        OUTCOME_OF[State(s)].value if s in State.__members__ else "unfinished",
                        f"{v['jobs']:,}",
                        pct(v["share_jobs"]),
                        gh(v["gpu_hours"]),
                        pct(v["share_gpu_hours"]),
                    ]
                    for s, v in r["by_state"].items()
                ],
            )
        )
        parts.append(
            "<h2>Week by week</h2>"
            + _chart(figs["chart-weekly-rate"], "chart-weekly-rate")
            + _chart(figs["chart-weekly-hours"], "chart-weekly-hours")
        )
        parts.append(
            _table(
                ["week", "jobs", "done (jobs)", "done (GPU-h)", "goodput", "wasted", "median wait"],
                [
                    [
                        wk["week"],
                        f"{wk['jobs']:,}",
                        pct(wk["completion_rate"]["by_count"]),
                        pct(wk["completion_rate"]["by_gpu_hours"]),
                        gh(wk["goodput_gpu_hours"]),
                        gh(wk["wasted_gpu_hours"]),
                        dur(wk["median_wait_s"]),
                    ]
                    for wk in r["weekly"]
                ],
            )
        )
        by = r["top"]["by"]
        title = f"Top {_e(BY_TITLES.get(by, by))} by wasted GPU-hours"
        parts.append(f"<h2>{title}</h2>" + _chart(figs["chart-top"], "chart-top"))
        parts.append(
            _table(
                [by, "jobs", "GPU-hours", "wasted", "done (jobs)", "done (GPU-h)"],
                [
                    [
                        str(x["key"]),
                        f"{x['jobs']:,}",
                        gh(x["gpu_hours"]),
                        gh(x["wasted_gpu_hours"]),
                        pct(x["completion_rate"]["by_count"]),
                        pct(x["completion_rate"]["by_gpu_hours"]),
                    ]
                    for x in r["top"][by]
                ],
            )
        )
        rf = r["repeat_failures"]
        parts.append(_repeat_summary(rf))
        if rf["rows"]:
            parts.append(
                _table(
                    ["user", "name or group", "failures", "GPU-hours", "first", "last", "success followed"],
                    [
                        [
                            str(x["user"]),
                            repeat_job(x),
                            f"{x['failures']:,}",
                            gh(x["gpu_hours"]),
                            (x["first"] or "–")[:16],
                            (x["last"] or "–")[:16],
                            "yes" if x["success_followed"] else "no",
                        ]
                        for x in rf["rows"]
                    ],
                )
            )
        ef = r["early_failures"]
        parts.append("<h2>Early failures</h2>" + _chart(figs["chart-early"], "chart-early"))
        parts.append(
            _table(
                ["failed within", "jobs", "% of failed jobs", "GPU-hours", "% of their GPU-hours"],
                [
                    [
                        f"{e['minutes']} min",
                        f"{e['jobs']:,}",
                        pct(e["share_jobs"]),
                        gh(e["gpu_hours"]),
                        pct(e["share_gpu_hours"]),
                    ]
                    for e in ef["within"]
                ],
            )
        )
        to = r["timeouts"]
        oa = to["over_asking"]
        parts.append("<h2>Timeouts and over-asking</h2>")
        if not to["time_limits_known"] and to["jobs"] == 0:  # as the terminal says it
            parts.append("<p>No time limits in this data, so neither can be measured.</p>")
        else:
            parts.append(
                f"<p>{count(to['jobs'], 'job')} hit {'its' if to['jobs'] == 1 else 'their'} time limit: "
                f"{_e(gh(to['gpu_hours']))} GPU-hours.</p>"
            )
            if oa is None:
                parts.append("<p>No time limits in this data, so over-asking cannot be measured.</p>")
        if oa is not None:
            parts.append(
                f"<p>{oa['jobs']:,} of {oa['completed_jobs_with_limit']:,} completed jobs "
                f"({_e(pct(oa['share_jobs']))}) used less than "
                f"{oa['threshold_share'] * 100:.0f}% of their limit.</p>"
            )
            parts.append(
                _table(
                    ["user", "jobs", "over-asking", "median use", "advice"],
                    [
                        [
                            str(a["user"]),
                            f"{a['jobs']:,}",
                            f"{a['over_asking_jobs']:,}",
                            pct(a["median_used_share"]),
                            a["advice"],
                        ]
                        for a in oa["by_user"]
                    ],
                )
            )
        parts.append(_cancelled_section(r.get("cancelled"), figs))
        wt = r["waiting"]
        parts.append("<h2>Waiting</h2>" + _chart(figs["chart-waiting"], "chart-waiting"))
        parts.append(
            _table(
                ["user", "jobs", "median", "p90", "max"],
                [
                    [str(u["user"]), f"{u['jobs']:,}", dur(u["median_s"]), dur(u["p90_s"]), dur(u["max_s"])]
                    for u in wt["by_user"]
                ],
            )
        )
    c = r.get("comparison")
    if c:
        parts.append("<h2>Before and after</h2>")
        parts.append(
            _table(
                ["figure", "period", "vs", "change", "relative"],
                [
                    [
                        m["label"],
                        _fmt(m["kind"], m["period"]),
                        _fmt(m["kind"], m["vs"]),
                        _change(m["kind"], m["change"]),
                        "–" if m["change_rel"] is None else f"{m['change_rel'] * 100:+.1f}%",
                    ]
                    for m in c["metrics"]
                ],
            )
        )
    parts.append(
        "<p class='muted'>Outcome classes: success = COMPLETED; waste = FAILED, TIMEOUT, "
        "OUT_OF_MEMORY, NODE_FAIL; CANCELLED and PREEMPTED are shown apart. Completion rate = successful / "
        "ended jobs. Made by headway.</p>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>headway audit</title>"
        f"<style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )


def write_html(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report atomically (temp file + rename), so a failed write never leaves half a file; a
    FIFO or /dev/stdout is written through, a symlink's target replaced, the umask followed."""
    path = Path(path)
    text = render_html(report)
    with replaced_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
