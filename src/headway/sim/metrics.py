"""Scheduling metrics of one simulation run, exactly as DESIGN.md "Metrics" defines them.

Conventions (also in docs/simulate.md):
- **span** = from the first arrival (min submit) to the last end (max end) of the simulated jobs;
  utilisation and fragmentation are averages over that window.
- Percentiles use linear interpolation between order statistics (numpy's default).
- Jobs that never ended in the run (null start or end) are left out of time statistics and counted in
  `jobs_unfinished`.
- `jain_fairness` is Jain's index over users' mean bounded slowdown: (sum x)^2 / (n * sum x^2), 1 = even;
  null without two users to compare.
- `bounded_slowdown` is max(1, JCT / max(runtime, 10 s)).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headway.policy.preempt import URGENT_CLASSES
from headway.schema import ENDED_STATES, WASTE_STATES, State
from headway.sim.result import SimResult

Arr = npt.NDArray[np.float64]
MetricValue = float | int | None

BSLD_FLOOR_S = 10.0  # bounded slowdown = JCT / max(runtime, 10 s)

# Metric names in the order tables and JSON show them; `HEADLINE` is what the comparison table prints.
HEADLINE: tuple[str, ...] = (
    "time_to_success_mean",
    "time_to_success_p95",
    "queue_delay_mean",
    "queue_delay_p99",
    "bounded_slowdown_mean",
    "utilisation",
    "fragmented_gpu_hours",
    "jain_fairness",
    "goodput_gpu_hours",
    "wasted_gpu_hours",
)
# For each metric: True when lower is better (the table colours ratios with it).
LOWER_IS_BETTER: dict[str, bool] = {
    "utilisation": False,
    "jain_fairness": False,
    "goodput_gpu_hours": False,
    "completion_rate": False,
    "completion_rate_gpu_hours": False,
}


def _pct(x: Arr, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def _mean(x: Arr) -> float | None:
    return float(x.mean()) if len(x) else None


def _col(table: pa.Table, name: str) -> Arr:
    """A numeric column as float64 with nulls as NaN."""
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def _str_col(table: pa.Table, name: str) -> npt.NDArray[np.object_]:
    return np.asarray(table.column(name).to_pylist(), dtype=object)


def step_integral(t: Arr, v: Arr, at: Arr) -> Arr:
    """Integral from t[0] of the step function v (v[i] holds on [t[i], t[i+1])) evaluated at `at`.

    Exact: the integral of a step function is piecewise linear between breakpoints, so interpolating the
    cumulative integral at the breakpoints is exact. Before t[0] the function is taken as 0; after the last
    breakpoint it keeps its last value.
    """
    if len(t) == 0:
        return np.zeros_like(at)
    cum = np.concatenate([[0.0], np.cumsum(v[:-1] * np.diff(t))])
    inside = np.interp(at, t, cum)
    after = np.where(at > t[-1], (at - t[-1]) * v[-1], 0.0)
    return np.where(at < t[0], 0.0, inside + after)


@dataclass(frozen=True, slots=True)
class JobTimes:
    """Per-job derived times of one run (seconds), for metrics and CDF charts."""

    submit: Arr
    start: Arr
    end: Arr
    runtime: Arr
    gpus: Arr
    state: npt.NDArray[np.object_]
    user: npt.NDArray[np.object_]

    @classmethod
    def of(cls, jobs: pa.Table) -> JobTimes:
        return cls(
            submit=_col(jobs, "submit"),
            start=_col(jobs, "start"),
            end=_col(jobs, "end"),
            runtime=_col(jobs, "runtime"),
            gpus=_col(jobs, "gpus"),
            state=_str_col(jobs, "state"),
            user=np.asarray(jobs.column("user").to_pylist(), dtype=object),  # None: no user
        )

    @property
    def ended(self) -> npt.NDArray[np.bool_]:
        return ~np.isnan(self.start) & ~np.isnan(self.end)

    @property
    def success(self) -> npt.NDArray[np.bool_]:
        return self.ended & (self.state == State.COMPLETED.value)

    @property
    def jct(self) -> Arr:
        return self.end - self.submit

    @property
    def queue_delay(self) -> Arr:
        return self.start - self.submit

    @property
    def bounded_slowdown(self) -> Arr:
        """JCT / max(runtime, 10 s), and at least 1 (Feitelson's definition; DESIGN.md leaves the floor
        out, but then a 2-second job that starts at once scores 0.2, "faster than running alone", and
        pulls every mean below what it means)."""
        return np.maximum(self.jct / np.maximum(self.runtime, BSLD_FLOOR_S), 1.0)


def jain_index(x: Arr) -> float | None:
    """Jain's fairness index of non-negative values: 1 when all equal, 1/n when one takes everything."""
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return None
    sq = float(np.dot(x, x))
    return 1.0 if sq == 0 else float(x.sum() ** 2 / (len(x) * sq))


def users_mean_slowdown(jt: JobTimes) -> Arr:
    """Each user's mean bounded slowdown over their ended jobs (one value per user). Jobs without a user
    are left out, and fewer than two users give nothing to compare: a trace without users (Alibaba's)
    would otherwise pool every job under one user and score a perfect 1."""
    ok = jt.ended & np.array([u is not None for u in jt.user], dtype=bool)
    users, inv = np.unique(jt.user[ok].astype(str), return_inverse=True)
    sums = np.bincount(inv, weights=jt.bounded_slowdown[ok], minlength=len(users))
    counts = np.bincount(inv, minlength=len(users))
    out: Arr = sums / np.maximum(counts, 1)
    return out if len(users) >= 2 else np.zeros(0)


def span(jt: JobTimes) -> tuple[float, float]:
    """(first arrival, last end) of the run; the window utilisation and fragmentation average over."""
    if len(jt.submit) == 0:
        return 0.0, 0.0
    first = float(np.nanmin(jt.submit))
    ends = jt.end[~np.isnan(jt.end)]
    last = float(ends.max()) if len(ends) else first
    return first, max(last, first)


def compute(result: SimResult) -> dict[str, MetricValue]:
    """Every DESIGN.md metric of one run, keyed by its JSON name."""
    jt = JobTimes.of(result.jobs)
    ended, success = jt.ended, jt.success
    waste = ended & np.isin(jt.state, [s.value for s in WASTE_STATES])
    tts = jt.jct[success]
    qd = jt.queue_delay[~np.isnan(jt.start)]
    bsld = jt.bounded_slowdown[ended]
    bsld_s = jt.bounded_slowdown[success]
    gpu_h = jt.gpus * np.nan_to_num(np.maximum(jt.runtime, 0.0)) / 3600.0
    t0, t1 = span(jt)
    length = t1 - t0
    cap = float(result.capacity_gpus)

    tl = result.timeline
    busy_gpu_s: float
    frag_gpu_s = 0.0
    if tl.num_rows and length > 0:
        t = _col(tl, "t")
        window = np.array([t0, t1])
        busy_gpu_s = float(np.diff(step_integral(t, _col(tl, "busy_gpus"), window))[0])
        frag_gpu_s = float(np.diff(step_integral(t, _col(tl, "frag_free_gpus"), window))[0])
    else:  # no timeline: busy time from the jobs themselves (no preemption overhead counted)
        busy_gpu_s = float((jt.gpus * np.nan_to_num(np.maximum(jt.end - jt.start, 0.0)))[ended].sum())

    # The completion rate's denominator, as in the audit: jobs that ended with a known outcome (a pod of
    # unknown fate, Alibaba's UNKNOWN, is replayed but counts neither as a success nor as a miss).
    known = ended & np.isin(jt.state, [s.value for s in ENDED_STATES])
    known_gpu_h = float(gpu_h[known].sum())
    good = float(gpu_h[success].sum())
    m: dict[str, MetricValue] = {
        "jobs": len(jt.submit),
        "jobs_ended": int(ended.sum()),
        "jobs_successful": int(success.sum()),
        "jobs_unfinished": int((~ended).sum()),
        # every job of the trace left out, whatever the reason (excluded_counts has them by reason)
        "excluded": sum(result.excluded_counts.values()) if result.excluded_counts else len(result.excluded),
        "time_to_success_mean": _mean(tts),
        "time_to_success_p50": _pct(tts, 50),
        "time_to_success_p95": _pct(tts, 95),
        "time_to_success_p99": _pct(tts, 99),
        "jct_mean": _mean(jt.jct[ended]),
        "jct_p50": _pct(jt.jct[ended], 50),
        "jct_p95": _pct(jt.jct[ended], 95),
        "jct_p99": _pct(jt.jct[ended], 99),
        "queue_delay_mean": _mean(qd),
        "queue_delay_p50": _pct(qd, 50),
        "queue_delay_p95": _pct(qd, 95),
        "queue_delay_p99": _pct(qd, 99),
        "queue_delay_max": float(qd.max()) if len(qd) else None,
        "bounded_slowdown_mean": _mean(bsld),
        "bounded_slowdown_median": _pct(bsld, 50),
        "bounded_slowdown_p95": _pct(bsld, 95),
        "bounded_slowdown_p99": _pct(bsld, 99),
        "bounded_slowdown_success_mean": _mean(bsld_s),
        "bounded_slowdown_success_median": _pct(bsld_s, 50),
        "bounded_slowdown_success_p95": _pct(bsld_s, 95),
        "bounded_slowdown_success_p99": _pct(bsld_s, 99),
        "utilisation": busy_gpu_s / (cap * length) if cap > 0 and length > 0 else None,
        "fragmentation": frag_gpu_s / length if length > 0 else None,
        "fragmented_gpu_hours": frag_gpu_s / 3600.0,
        "jain_fairness": jain_index(users_mean_slowdown(jt)),
        "starvation_s": float(qd.max()) if len(qd) else None,
        "goodput_gpu_hours": good,
        "wasted_gpu_hours": float(gpu_h[waste].sum()),
        "completion_rate": float(success.sum() / known.sum()) if known.any() else None,
        "completion_rate_gpu_hours": good / known_gpu_h if known_gpu_h > 0 else None,
        "span_s": length,
        "busy_gpu_hours": busy_gpu_s / 3600.0,
        "preemptions": int(np.nansum(_col(result.jobs, "preemptions"))),
        "restarts": int(np.nansum(_col(result.jobs, "restarts"))),
        "load": float(result.load),
        "capacity_gpus": cap,
        "sim_wall_seconds": float(result.wall_seconds),
        "sim_events": int(result.events),
    }
    m.update(_preemption_metrics(result, jt, waste))
    return m


def _preemption_metrics(
    result: SimResult, jt: JobTimes, waste: npt.NDArray[np.bool_]
) -> dict[str, MetricValue]:
    """High and urgent jobs' time to start and slowdown, the others' time to success, GPU-hours lost to
    preemption and to fail-fast probes, fragmentation when an urgent gang arrives, and how soon a job
    that fails tells its user (submit to its failure)."""
    names = result.jobs.column_names
    n = len(jt.submit)

    def col(name: str, fill: float = 0.0) -> Arr:
        return _col(result.jobs, name) if name in names else np.full(n, fill)

    klass = result.jobs.column("priority_class").to_pylist() if "priority_class" in names else [None] * n
    urgent = np.array([c in URGENT_CLASSES for c in klass], dtype=bool)
    started = ~np.isnan(jt.start)
    qd_u = jt.queue_delay[urgent & started]
    tts_o = jt.jct[jt.success & ~urgent]
    frag = col("frag_at_submit", np.nan)[urgent]
    frag = frag[~np.isnan(frag)]
    fail_delay = jt.jct[waste]
    return {
        "jobs_urgent": int(urgent.sum()),
        "urgent_queue_delay_mean": _mean(qd_u),
        "urgent_queue_delay_p95": _pct(qd_u, 95),
        "urgent_bounded_slowdown_mean": _mean(jt.bounded_slowdown[urgent & jt.ended]),
        "others_time_to_success_mean": _mean(tts_o),
        "preempted_gpu_hours": float((jt.gpus * col("lost_s")).sum() / 3600.0),
        "probe_gpu_hours": float((jt.gpus * col("probe_lost_s")).sum() / 3600.0),
        "urgent_fragmented_arrivals": float((frag > 0).mean()) if len(frag) else None,
        "urgent_fragmented_gpus_mean": _mean(frag),
        "failure_signal_delay_mean": _mean(fail_delay),
        "failure_signal_delay_p50": _pct(fail_delay, 50),
    }


def ratios(
    by_policy: Mapping[str, Mapping[str, MetricValue]], baseline: str, names: Sequence[str] = HEADLINE
) -> dict[str, dict[str, float | None]]:
    """Each policy's metrics divided by the baseline policy's (None where either is missing or 0)."""
    base = by_policy.get(baseline)
    out: dict[str, dict[str, float | None]] = {}
    for pol, m in by_policy.items():
        row: dict[str, float | None] = {}
        for k in names:
            a, b = m.get(k), base.get(k) if base else None
            row[k] = float(a) / float(b) if a is not None and b not in (None, 0) else None
        out[pol] = row
    return out


@dataclass(frozen=True, slots=True)
class Series:
    """Binned time series of one run for charts: bin ends (s from first arrival) and per-bin values."""

    t: Arr
    utilisation: Arr  # mean busy / capacity over the bin
    pending: Arr  # mean pending jobs over the bin
    running: Arr
    completed_total: Arr  # cumulative successful completions at the bin end
    goodput_gpu_hours_total: Arr  # cumulative goodput at the bin end


def series(result: SimResult, bins: int = 200) -> Series:
    """Bin the timeline over the span: averages for levels, values at bin ends for running totals."""
    jt = JobTimes.of(result.jobs)
    t0, t1 = span(jt)
    tl = result.timeline
    if tl.num_rows == 0 or t1 <= t0:
        z = np.zeros(0)
        return Series(z, z, z, z, z, z)
    grid = np.linspace(t0, t1, bins + 1)
    t = _col(tl, "t")
    width = np.diff(grid)

    def avg(col: str) -> Arr:
        out: Arr = np.diff(step_integral(t, _col(tl, col), grid)) / width
        return out

    def at_end(col: str) -> Arr:
        v = _col(tl, col)
        idx = np.searchsorted(t, grid[1:], side="right") - 1
        out: Arr = np.where(idx >= 0, v[np.maximum(idx, 0)], 0.0)
        return out

    cap = float(result.capacity_gpus) or 1.0
    return Series(
        t=grid[1:] - t0,
        utilisation=avg("busy_gpus") / cap,
        pending=avg("pending"),
        running=avg("running"),
        completed_total=at_end("completed_total"),
        goodput_gpu_hours_total=at_end("goodput_gpu_hours_total"),
    )


def cdf(values: Arr, points: int = 200) -> tuple[Arr, Arr]:
    """(x, fraction <= x) at up to `points` of the sorted values: the empirical CDF, enough for a chart
    and small for an HTML file. The smallest value is at 1/n, not 0 (one job was a point at 0%)."""
    v = np.sort(values[~np.isnan(values)])
    n = len(v)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    idx = np.unique(np.round(np.linspace(0, n - 1, min(points, n))).astype(np.int64))
    return v[idx], (idx + 1) / n
