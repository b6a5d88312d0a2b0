"""`simulate --html`: one self-contained, offline HTML file comparing policies (plotly.js inlined once)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from headway.sim.metrics import HEADLINE, JobTimes, MetricValue, cdf, series
from headway.sim.result import SimResult

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _fmt(name: str, v: MetricValue) -> str:
    if v is None:
        return "-"
    if name.startswith(("time_to_success", "queue_delay", "jct")):
        s = float(v)
        if s >= 3600:
            return f"{s / 3600:,.1f} h"
        return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"
    if name == "utilisation":
        return f"{100 * float(v):.1f}%"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"


def _figure(traces: list[dict[str, Any]], title: str, xaxis: dict[str, Any], yaxis: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for tr in traces:
        fig.add_trace(go.Scatter(**tr))
    if xaxis.get("type") == "log":  # plotly's log autorange can stop short of the data; set it from the data
        xs = np.concatenate([np.asarray(tr["x"], dtype=np.float64) for tr in traces] or [np.zeros(0)])
        xs = xs[np.isfinite(xs) & (xs > 0)]
        if len(xs):
            lo, hi = float(np.log10(xs.min())), float(np.log10(xs.max()))
            if hi - lo < 0.5:  # one value (a one-job trace): a decade around it, not an empty axis
                lo, hi = lo - 0.5, hi + 0.5
            xaxis = {**xaxis, "range": [lo, hi]}
    fig.update_layout(
        title=title,
        xaxis=xaxis,
        yaxis=yaxis,
        template="plotly_white",
        height=380,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _figures(results: Sequence[SimResult]) -> list[Any]:
    """The six charts: two CDFs over jobs, four series over time, one line per policy."""
    cdf_tts, cdf_qd, util, pend, done, good = [], [], [], [], [], []
    for i, r in enumerate(results):
        colour = _COLOURS[i % len(_COLOURS)]
        line = {"color": colour}
        jt = JobTimes.of(r.jobs)
        x, y = cdf(jt.jct[jt.success] / 3600.0)
        cdf_tts.append({"x": x, "y": y, "name": r.policy, "line": line, "mode": "lines"})
        x, y = cdf(jt.queue_delay[~np.isnan(jt.start)] / 3600.0)
        cdf_qd.append({"x": np.maximum(x, 1e-3), "y": y, "name": r.policy, "line": line, "mode": "lines"})
        s = series(r)
        days = s.t / 86400.0
        common = {"x": days, "name": r.policy, "line": line, "mode": "lines"}
        util.append({**common, "y": s.utilisation * 100})
        pend.append({**common, "y": s.pending})
        done.append({**common, "y": s.completed_total})
        good.append({**common, "y": s.goodput_gpu_hours_total})
    return [
        _figure(
            cdf_tts,
            "Time to success (CDF of successful jobs' JCT)",
            {"title": "hours", "type": "log"},
            {"title": "fraction of jobs"},
        ),
        _figure(
            cdf_qd,
            "Queueing delay (CDF, all started jobs)",
            {"title": "hours", "type": "log"},
            {"title": "fraction of jobs"},
        ),
        _figure(
            util,
            "GPU utilisation over time",
            {"title": "days from first arrival"},
            {"title": "% of GPUs busy"},
        ),
        _figure(pend, "Pending jobs over time", {"title": "days from first arrival"}, {"title": "jobs"}),
        _figure(
            done,
            "Successful completions over time",
            {"title": "days from first arrival"},
            {"title": "jobs completed"},
        ),
        _figure(
            good,
            "Goodput over time",
            {"title": "days from first arrival"},
            {"title": "GPU-hours of successful jobs"},
        ),
    ]


def render(
    results: Sequence[SimResult],
    metrics: Mapping[str, Mapping[str, MetricValue]],
    *,
    title: str,
    subtitle: str = "",
    notes: Sequence[str] = (),
) -> str:
    """The whole report as one HTML string; it loads nothing from the network."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    figs = _figures(results)
    # Empty cells first, drawn by one script at the end: a chart drawn while its grid cell is the only one
    # takes the page's whole width, and the cell it ends up in then cuts it off.
    figure_json = ",".join(pio.to_json(f, validate=False) for f in figs).replace("</", "<\\/")
    draw = (
        f"var figs = [{figure_json}];\n"
        "figs.forEach(function (f, i) {\n"
        '  Plotly.newPlot("sim-chart-" + i, f.data, f.layout, {responsive: true, displaylogo: false});\n'
        "});"
    )
    cells = "".join(f'<div class="chart" id="sim-chart-{i}"></div>' for i in range(len(figs)))
    head = "".join(f"<th>{html.escape(k.replace('_', ' '))}</th>" for k in ("policy", *HEADLINE))
    rows = "".join(
        "<tr><td>"
        + html.escape(p)
        + "</td>"
        + "".join(f"<td>{_fmt(k, m.get(k))}</td>" for k in HEADLINE)
        + "</tr>"
        for p, m in metrics.items()
    )
    note_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ddd; padding: 4px 8px; text-align: right; }}
th {{ max-width: 110px; font-weight: 600; vertical-align: bottom; }}
.wide {{ overflow-x: auto; }}
th:first-child, td:first-child {{ text-align: left; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 12px; }}
.grid > div {{ min-width: 0; overflow: hidden; }}
</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(subtitle)}</p>
<p>Times in the table in s, min or h as marked, on the charts in hours;
definitions in docs/simulate.md. Generated {stamp}.</p>
<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>
<ul>{note_html}</ul>
<div class="grid">{cells}</div>
<script type="text/javascript">{draw}</script>
</body></html>
"""
