"""Policies side by side: the comparison and sweep tables, ratios to the baseline, peer figures.

Shared by `headway simulate` and `headway sweep` (and anything else that compares replays), so a metric
reads the same in every table. Light to import: the metrics module loads only when a table is built.
"""

from __future__ import annotations

import csv
import importlib.resources
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from headway.policy.registry import BASELINE

if TYPE_CHECKING:
    from headway.sim.sweep import Summary


@dataclass(frozen=True, slots=True)
class RefFigure:
    policy: str
    load: str
    metric: str
    value: float


def helios_reference() -> list[RefFigure]:
    """The Helios simulator's figures on the Philly sample (package data, with its source in the file)."""
    text = importlib.resources.files("headway.data").joinpath("helios_philly_reference.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    return [RefFigure(r["policy"], r["load"], r["metric"], float(r["value"])) for r in rows]


def reference_for(load: float | None) -> list[RefFigure]:
    label = "natural" if load is None else f"{load:g}"
    if label != "natural":
        label = f"{float(label):.1f}"
    return [f for f in helios_reference() if f.load == label]


def fmt_seconds(s: float | None) -> str:
    """Compact durations for narrow tables: 45s, 12.5m, 3.2h, 5.10d."""
    if s is None:
        return "-"
    a = abs(s)
    if a < 120:
        return f"{s:.0f}s"
    if a < 7200:
        return f"{s / 60:.1f}m"
    if a < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.2f}d"


def fmt_metric(name: str, v: float | int | None) -> str:
    if v is None:
        return "-"
    if name.startswith(("time_to_success", "queue_delay", "jct", "starvation", "span")):
        return fmt_seconds(float(v))
    if name in ("utilisation", "completion_rate", "completion_rate_gpu_hours"):
        return f"{100 * float(v):.1f}%"
    if name.startswith("bounded_slowdown") or name == "jain_fairness":
        return f"{float(v):.2f}" if abs(float(v)) < 100 else f"{float(v):,.0f}"
    if name.endswith("gpu_hours"):
        x = float(v)
        return f"{x:,.0f}" if abs(x) >= 100 or x == 0 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{float(v):.3f}" if abs(float(v)) < 100 else f"{float(v):,.0f}"


# The table's columns (every metric is in --json); short headers keep it readable at 80 columns.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("time_to_success_mean", "TTS\nmean"),
    ("time_to_success_p95", "TTS\np95"),
    ("queue_delay_mean", "wait\nmean"),
    ("queue_delay_p99", "wait\np99"),
    ("utilisation", "util"),
    ("fragmented_gpu_hours", "frag\nGPU-h"),
    ("jain_fairness", "Jain"),
)


def table_baseline(metrics: Mapping[str, Any], baseline: str = BASELINE) -> str:
    """What the comparison's ratios are to: `baseline` when it ran, else the first policy."""
    return baseline if baseline in metrics or not metrics else next(iter(metrics))


def comparison_table(metrics: Mapping[str, Mapping[str, Any]], title: str, baseline: str = BASELINE) -> Table:
    """One row per policy; each cell shows the value and, under it, the ratio to the baseline (without
    multifactor in the run, the first policy: `impact,impact-oracle` then reads as the oracle's gain)."""
    from headway.sim.metrics import LOWER_IS_BETTER

    baseline = table_baseline(metrics, baseline)
    t = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_lines=True,
        caption=f"TTS: time to success; below each value: ratio to {baseline}",
        caption_justify="left",
    )
    t.add_column("policy", style="bold", no_wrap=True)
    for _, label in COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    base = metrics.get(baseline)
    for pol, m in metrics.items():
        cells = []
        for key, _ in COLUMNS:
            v, b = m.get(key), base.get(key) if base else None
            cell = fmt_metric(key, v)
            if base is not None and pol != baseline and v is not None and b not in (None, 0):
                r = float(v) / float(b)
                better = r < 1 if LOWER_IS_BETTER.get(key, True) else r > 1
                colour = "green" if better and abs(r - 1) > 0.005 else "red" if abs(r - 1) > 0.005 else "dim"
                cell += f"\n[{colour}]{r:.2f}x[/]"
            cells.append(cell)
        t.add_row(pol, *cells)
    return t


def reference_rows(
    figs: Sequence[RefFigure], metrics: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Helios figures beside ours: the same policy, and impact beside Helios QSSF, with impact's ratio to
    it (a figure to read, not a verdict: what counts as good enough is the user's call)."""
    rows: list[dict[str, Any]] = []
    for f in figs:
        ours = metrics.get(f.policy, {}).get(f.metric)
        imp = metrics.get("impact", {}).get(f.metric)
        row = {"policy": f.policy, "metric": f.metric, "load": f.load, "helios": f.value, "headway": ours}
        if f.policy == "qssf":
            row["headway_impact"] = imp
            row["impact_ratio"] = None if imp is None or not f.value else float(imp) / f.value
        rows.append(row)
    return rows


def ratios_to_baseline(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    from headway.sim.metrics import ratios

    return ratios(metrics, BASELINE) if BASELINE in metrics else {}


def table_ratios(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    from headway.sim.metrics import ratios

    base = table_baseline(metrics) if metrics else None
    return {"baseline": base, "policies": ratios(metrics, base) if base is not None else {}}


def reference_table(rows: Sequence[Mapping[str, Any]], load_txt: str) -> Table:
    t = Table(title=f"Beside a peer: the Helios artifact's simulator on the Philly sample, {load_txt}")
    for c in ("policy", "metric", "Helios", "headway (same policy)", "headway impact", "impact / Helios"):
        t.add_column(c, justify="left" if c in ("policy", "metric") else "right")
    for r in rows:
        ratio = r.get("impact_ratio")
        t.add_row(
            r["policy"],
            r["metric"],
            fmt_seconds(r["helios"]),
            fmt_seconds(r["headway"]),
            fmt_seconds(r.get("headway_impact")) if "headway_impact" in r else "",
            "" if ratio is None else f"{ratio:.2f}x",
        )
    return t


SWEEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("time_to_success_mean", "TTS\nmean"),
    ("time_to_success_p95", "TTS\np95"),
    ("queue_delay_p99", "wait\np99"),
    ("bounded_slowdown_mean", "BSLD\nmean"),
    ("utilisation", "util"),
    ("jain_fairness", "Jain"),
)


SWEEP_METRICS: tuple[str, ...] = tuple(m for m, _ in SWEEP_COLUMNS)


def sweep_table(summary: Mapping[tuple[str, str], Mapping[str, Summary]], title: str, n_seeds: int) -> Table:
    """One row per policy and load: the median over seeds, and under it half the min-max range as a
    percentage of the median (how much the predictor's training seed moves the figure)."""
    t = Table(
        title=title,
        caption="below each median: half the min-max range over seeds, as % of the median (the seed "
        "reaches only the predictor's training: a policy that reads no predictions runs once)",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_lines=True,
    )
    t.add_column("load", no_wrap=True)
    t.add_column("policy", style="bold", no_wrap=True)
    for _, label in SWEEP_COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    for (pol, ld), row in summary.items():
        cells_txt = []
        for m, _ in SWEEP_COLUMNS:
            s = row[m]
            txt = fmt_metric(m, s.median)
            if s.n > 1 and s.low is not None and s.high is not None and s.median:
                txt += f"\n[dim]±{50 * (s.high - s.low) / abs(s.median):.0f}%[/]"
            elif s.n == 1 and n_seeds > 1:
                txt += "\n[dim]one run[/]"
            cells_txt.append(txt)
        t.add_row(ld, pol, *cells_txt)
    return t
