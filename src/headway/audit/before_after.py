"""Before and after a date: completion rate, goodput per GPU-hour and waits, with bootstrap intervals and
the offered load of each period, so that a lighter week is not read as a scheduling win.

The two periods have the same length (the shorter of the two sides of the date, or `days`), and their jobs
are the audit's (`compute._Q`: jobs submitted in the window, GPU jobs unless `include_cpu`), so the point
estimates equal `audit_report` of the same windows. Intervals are a Poisson bootstrap: each resample
weighs every job by a Poisson(1) count, which resamples jobs with replacement without index arrays;
quantiles come from the weighted cumulative sum over the sorted waits.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb
import numpy as np

from headway.audit.compute import _Q, _ratio
from headway.audit.periods import Window

SAMPLES = 200  # bootstrap resamples: the 2.5/97.5% ends move by well under their width past this
LEVEL = 0.95
LOAD_WARN = 0.2  # offered loads this far apart (relative) make the comparison a different week's
GROUPS = 4096  # past this many jobs a ratio's bootstrap resamples random groups of jobs (`_ratio_boot`)
DISTINCT = 50_000  # past this many distinct waits a quantile's bootstrap rounds them (`_quantile_boot`)


def submit_span(
    con: duckdb.DuckDBPyConnection, source: str | None = None
) -> tuple[dt.datetime, dt.datetime] | None:
    """The first and last submit time in the store (of `source`), UTC; None without jobs."""
    cond, params = ("WHERE source = ?", [source]) if source is not None else ("", [])
    row = con.execute(f"SELECT min(submit_time), max(submit_time) FROM jobs_v {cond}", params).fetchone()
    lo, hi = row if row else (None, None)
    if lo is None or hi is None:
        return None
    return lo.astimezone(dt.UTC), hi.astimezone(dt.UTC)


def peak_gpus_in_use(con: duckdb.DuckDBPyConnection, source: str | None = None) -> float | None:
    """The most GPUs the log shows running at once: the cluster's size as far as the log can tell."""
    cond, params = ("AND source = ?", [source]) if source is not None else ("", [])
    row = con.execute(
        "SELECT max(busy) FROM (SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS busy FROM ("
        "SELECT start_time AS t, gpus AS d FROM jobs_v WHERE start_time IS NOT NULL "
        f"AND end_time IS NOT NULL AND gpus > 0 {cond} UNION ALL "
        "SELECT end_time, -gpus FROM jobs_v WHERE start_time IS NOT NULL "
        f"AND end_time IS NOT NULL AND gpus > 0 {cond}))",
        params * 2,
    ).fetchone()
    return float(row[0]) if row and row[0] is not None and row[0] > 0 else None


def _interval(values: np.ndarray) -> list[float] | None:
    v = values[np.isfinite(values)]
    if len(v) < 10:
        return None
    lo, hi = np.quantile(v, [(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2])
    return [float(lo), float(hi)]


def _ratio_boot(num: np.ndarray, den: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """sum(num) / sum(den) over resampled jobs. Past `GROUPS` jobs they are dealt at random into that many
    groups and the groups are resampled: each group is itself a random sample of jobs, so the spread of
    the ratio is the same, for a fraction of the draws."""
    if len(num) > GROUPS:
        g = rng.integers(0, GROUPS, size=len(num))
        num, den = np.bincount(g, num, GROUPS), np.bincount(g, den, GROUPS)
    w = rng.poisson(1.0, size=(samples, len(num))).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = (w @ num) / (w @ den)
    return out


def _quantile_boot(x: np.ndarray, q: float, samples: int, rng: np.random.Generator) -> np.ndarray:
    """The q-quantile of resampled values. A value seen k times is drawn Poisson(k) times in a resample
    (the sum of k Poisson(1) weights), so only distinct values are drawn; past `DISTINCT` of them, values
    are rounded to 3 significant digits first (a 0.1% step in the interval's ends)."""
    values, counts = np.unique(x, return_counts=True)
    if len(values) > DISTINCT:
        mag = 10.0 ** (np.floor(np.log10(np.maximum(np.abs(x), 1e-9))) - 2)
        values, counts = np.unique(np.round(x / mag) * mag, return_counts=True)
    w = rng.poisson(counts.astype(np.float64), size=(samples, len(values))).astype(np.float64)
    cw = np.cumsum(w, axis=1)
    idx = np.array([np.searchsorted(row, q * row[-1], side="left") for row in cw])
    out: np.ndarray = np.where(cw[:, -1] > 0, values[np.minimum(idx, len(values) - 1)], np.nan)
    return out


def _period(
    q: _Q, days: float, samples: int, rng: np.random.Generator, capacity: float | None
) -> dict[str, Any]:
    cols = q.arrays("SELECT outcome, coalesce(gpu_hours, 0) AS gh, wait FROM a")
    outcome = cols["outcome"].astype(str) if len(cols["outcome"]) else np.array([], dtype=str)
    gh = np.asarray(cols["gh"], dtype=np.float64)
    ended = outcome != "unfinished"
    success = (outcome == "success").astype(np.float64)
    wait_raw = cols["wait"]
    wait_mask = (
        ~np.ma.getmaskarray(wait_raw)
        if np.ma.isMaskedArray(wait_raw)
        else np.isfinite(np.asarray(wait_raw, dtype=np.float64))
    )
    waits = np.sort(np.maximum(np.asarray(np.ma.filled(wait_raw, 0.0), dtype=np.float64)[wait_mask], 0.0))
    n_ended = int(ended.sum())
    ended_gh = float(gh[ended].sum())
    succ_gh = float((gh * success)[ended].sum())
    submitted_gh = float(gh.sum())
    out: dict[str, Any] = {
        "jobs": len(outcome),
        "ended_jobs": n_ended,
        "gpu_hours": submitted_gh,
        "completion_rate": _ratio(int(success[ended].sum()), n_ended),
        "goodput_per_gpu_hour": _ratio(succ_gh, ended_gh),
        "goodput_gpu_hours": succ_gh,
        "median_wait_s": float(np.quantile(waits, 0.5)) if len(waits) else None,
        "p90_wait_s": float(np.quantile(waits, 0.9)) if len(waits) else None,
        "started_jobs": len(waits),
        "offered": {
            "jobs_per_day": len(outcome) / days if days > 0 else None,
            "gpu_hours_per_day": submitted_gh / days if days > 0 else None,
            # GPU-hours asked per hour over the GPUs the log shows in use at its peak
            "load": submitted_gh / (days * 24.0 * capacity) if capacity and days > 0 else None,
        },
        "interval": {},
    }
    if samples <= 0:
        return out
    iv: dict[str, list[float] | None] = {}
    if n_ended:
        s_e, g_e = success[ended], gh[ended]
        iv["completion_rate"] = _interval(_ratio_boot(s_e, np.ones(n_ended), samples, rng))
        iv["goodput_per_gpu_hour"] = _interval(_ratio_boot(g_e * s_e, g_e, samples, rng))
    if len(waits):
        iv["median_wait_s"] = _interval(_quantile_boot(waits, 0.5, samples, rng))
        iv["p90_wait_s"] = _interval(_quantile_boot(waits, 0.9, samples, rng))
    out["interval"] = iv
    return out


METRICS: tuple[tuple[str, str, str, bool], ...] = (
    # key, label, kind, higher is better
    ("completion_rate", "completion rate (jobs)", "rate", True),
    ("goodput_per_gpu_hour", "goodput per GPU-hour used", "rate", True),
    ("median_wait_s", "median queueing delay", "seconds", False),
    ("p90_wait_s", "p90 queueing delay", "seconds", False),
)


def _verdict(before: dict[str, Any], after: dict[str, Any], key: str, higher: bool) -> str:
    """`better`/`worse` when the intervals do not overlap, else `within noise` (or `unknown`)."""
    a, b = after["interval"].get(key), before["interval"].get(key)
    if a is None or b is None:
        return "unknown"
    if a[0] > b[1]:
        return "better" if higher else "worse"
    if a[1] < b[0]:
        return "worse" if higher else "better"
    return "within noise"


def before_after(
    con: duckdb.DuckDBPyConnection,
    at: dt.datetime,
    *,
    days: float | None = None,
    source: str | None = None,
    include_cpu: bool = False,
    samples: int = SAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Jobs submitted in the `days` before `at` against those in the `days` from it (default: as many
    days as the shorter side has), as one JSON-ready dict."""
    at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)
    bounds = submit_span(con, source)
    out: dict[str, Any] = {"at": at.isoformat(), "samples": samples, "level": LEVEL, "notes": []}
    if bounds is None:
        out.update(before=None, after=None, metrics=[], days=None)
        out["notes"].append("no jobs in the store")
        return out
    first, last = bounds
    if days is None:
        days = min((at - first).total_seconds(), (last - at).total_seconds() + 1.0) / 86400.0
    if days <= 0:
        out.update(before=None, after=None, metrics=[], days=None)
        out["notes"].append(
            f"{at.date()} is outside the jobs' submit times ({first.date()} .. {last.date()}): pick a date "
            "inside them"
        )
        return out
    span = dt.timedelta(days=days)
    capacity = peak_gpus_in_use(con, source)
    rng = np.random.default_rng(seed)
    wb, wa = Window(at - span, at), Window(at, at + span)
    before = _period(_Q(con, wb, include_cpu, source), days, samples, rng, capacity)
    after = _period(_Q(con, wa, include_cpu, source), days, samples, rng, capacity)
    before["window"], after["window"] = wb.to_json(), wa.to_json()
    out.update(days=days, capacity_gpus=capacity, before=before, after=after)
    out["metrics"] = [
        {
            "metric": key,
            "label": label,
            "kind": kind,
            "before": before[key],
            "after": after[key],
            "before_interval": before["interval"].get(key),
            "after_interval": after["interval"].get(key),
            "verdict": _verdict(before, after, key, higher),
        }
        for key, label, kind, higher in METRICS
    ]
    lb, la = before["offered"]["gpu_hours_per_day"], after["offered"]["gpu_hours_per_day"]
    if lb and la and abs(la - lb) / lb > LOAD_WARN:
        word = "more" if la > lb else "less"
        out["notes"].append(
            f"the period after had {abs(la - lb) / lb:.0%} {word} offered load (GPU-hours submitted per day) "
            "than the period before: shorter waits or a higher completion rate may come from that, not from "
            "the scheduling"
        )
    return out
