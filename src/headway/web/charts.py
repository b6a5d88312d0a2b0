"""The dashboard's charts as plotly figures (drawn in the page by the bundled plotly.js). The overview and
a user's page draw the audit report's own charts (`audit.html.figures`)."""

from __future__ import annotations

from typing import Any

from headway.web.queue import QueueView

_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 360,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
}
OVERVIEW_CHARTS = ("chart-outcome", "chart-weekly-rate", "chart-weekly-hours", "chart-waiting")


def to_json(figs: dict[str, Any]) -> dict[str, str]:
    """Chart id -> the figure's JSON, safe inside a <script> element."""
    import plotly.io as pio

    return {k: pio.to_json(f, validate=False).replace("</", "<\\/") for k, f in figs.items()}


def overview_figures(r: dict[str, Any]) -> dict[str, Any]:
    from headway.audit.html import figures

    if not r["totals"]["audited_jobs"]:
        return {}
    figs = figures(r)
    return {k: figs[k] for k in OVERVIEW_CHARTS if k in figs}


def user_figures(r: dict[str, Any]) -> dict[str, Any]:
    from headway.audit.html import figures

    if not r["totals"]["audited_jobs"]:
        return {}
    figs = figures(r)
    return {k: figs[k] for k in ("chart-outcome", "chart-weekly-rate") if k in figs}


def users_figures(r: dict[str, Any]) -> dict[str, Any]:
    import plotly.graph_objects as go

    rows = r["top"]["user"][:20]
    if not rows:
        return {}
    return {
        "chart-users": go.Figure(
            go.Bar(
                x=[x["key"] for x in rows], y=[x["wasted_gpu_hours"] for x in rows], marker_color="#c62828"
            ),
            layout={**_LAYOUT, "title": "Wasted GPU-hours by user (top 20)", "yaxis": {"title": "GPU-hours"}},
        )
    }


def compare_figures(c: dict[str, Any]) -> dict[str, Any]:
    import plotly.graph_objects as go

    if not c.get("metrics"):
        return {}
    out = {}
    for cid, kinds, title, scale, unit in (
        ("chart-compare-rates", {"rate"}, "Completion rate and goodput per GPU-hour", 100.0, "%"),
        ("chart-compare-waits", {"seconds"}, "Queueing delay", 1 / 3600.0, "hours"),
    ):
        ms = [m for m in c["metrics"] if m["kind"] in kinds]
        fig = go.Figure()
        for side, colour in (("before", "#90a4ae"), ("after", "#1565c0")):
            ys = [None if m[side] is None else m[side] * scale for m in ms]
            ivs = [m[f"{side}_interval"] for m in ms]
            plus = [
                None if iv is None or y is None else iv[1] * scale - y for iv, y in zip(ivs, ys, strict=True)
            ]
            minus = [
                None if iv is None or y is None else y - iv[0] * scale for iv, y in zip(ivs, ys, strict=True)
            ]
            fig.add_trace(
                go.Bar(
                    name=side,
                    x=[m["label"] for m in ms],
                    y=ys,
                    marker_color=colour,
                    error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
                )
            )
        fig.update_layout(**_LAYOUT, title=f"{title} (bars: 95% bootstrap interval)", yaxis={"title": unit})
        out[cid] = fig
    return out


def queue_figures(q: QueueView) -> dict[str, Any]:
    import plotly.graph_objects as go

    tiers: dict[str, float] = {}
    for j in q.pending:
        tiers[j.tier or "(none)"] = tiers.get(j.tier or "(none)", 0.0) + float(j.gpus or 0)
    running = sum(float(j.gpus or 0) for j in q.running)
    xs = ["running", *(f"pending: {t}" for t in tiers)]
    ys = [running, *tiers.values()]
    return {
        "chart-queue": go.Figure(
            go.Bar(x=xs, y=ys, marker_color=["#2e7d32", *["#f9a825"] * len(tiers)]),
            layout={
                **_LAYOUT,
                "title": "GPUs asked: running, and pending by tier",
                "yaxis": {"title": "GPUs"},
            },
        )
    }


SIM_METRICS: tuple[tuple[str, str], ...] = (
    ("time_to_success_mean", "mean time to success (s)"),
    ("time_to_success_p95", "p95 time to success (s)"),
    ("queue_delay_mean", "mean wait (s)"),
    ("queue_delay_p95", "p95 wait (s)"),
    ("bounded_slowdown_mean", "mean bounded slowdown"),
    ("utilisation", "utilisation"),
    ("goodput_gpu_hours", "goodput GPU-hours"),
    ("wasted_gpu_hours", "wasted GPU-hours"),
    ("jain_fairness", "Jain fairness"),
)


def simulation_table(d: dict[str, Any]) -> dict[str, Any]:
    """The comparison table of a `headway simulate --json` output: one row per policy, with the ratios
    to the baseline the simulation itself chose."""
    ratios = (d.get("ratios") or {}).get("policies") or {}
    rows = []
    for name, m in d["policies"].items():
        if not isinstance(m, dict):
            continue
        rows.append(
            {
                "policy": str(name),
                "values": {k: m.get(k) for k, _ in SIM_METRICS},
                "ratios": {k: (ratios.get(name) or {}).get(k) for k, _ in SIM_METRICS},
            }
        )
    cluster = d.get("cluster") or {}
    trace = d.get("trace") or {}
    return {
        "baseline": (d.get("ratios") or {}).get("baseline"),
        "metrics": [{"key": k, "label": label} for k, label in SIM_METRICS],
        "rows": rows,
        "cluster": cluster.get("description"),
        "trace": trace.get("label"),
        "jobs": trace.get("jobs"),
    }


def simulation_figures(d: dict[str, Any]) -> dict[str, Any]:
    import plotly.graph_objects as go

    t = simulation_table(d)
    names = [r["policy"] for r in t["rows"]]
    out = {}
    for cid, key, title, scale in (
        ("chart-sim-tts", "time_to_success_mean", "Mean time to success (hours)", 1 / 3600.0),
        ("chart-sim-wait", "queue_delay_p95", "p95 queueing delay (hours)", 1 / 3600.0),
        ("chart-sim-goodput", "goodput_gpu_hours", "Goodput GPU-hours", 1.0),
    ):
        ys = [None if r["values"][key] is None else float(r["values"][key]) * scale for r in t["rows"]]
        out[cid] = go.Figure(
            go.Bar(x=names, y=ys, marker_color="#1565c0"), layout={**_LAYOUT, "title": title}
        )
    return out
