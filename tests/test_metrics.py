"""Metrics of DESIGN.md computed on hand-built simulation results."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pytest

from headway.sim.metrics import (
    JobTimes,
    compute,
    jain_index,
    ratios,
    series,
    span,
    step_integral,
)
from headway.sim.result import JOB_COLUMNS, TIMELINE_COLUMNS, SimResult


def make_jobs(rows: Sequence[Mapping[str, object]]) -> pa.Table:
    defaults: dict[str, object] = {
        "group": None,
        "name": None,
        "nodes_used": 1,
        "racks_used": 1,
        "preemptions": 0,
        "restarts": 0,
        "time_limit": None,
        "p_success": 0.5,
        "pred_runtime": 100.0,
        "priority_class": "normal",
        "preemptible": False,
        "lost_s": 0.0,
        "probe_lost_s": 0.0,
        "held_s": 0.0,
        "probed": False,
        "frag_at_submit": None,
    }
    full = [{**defaults, **r} for r in rows]
    schema = pa.schema(
        [
            ("job_id", pa.string()),
            ("user", pa.string()),
            ("group", pa.string()),
            ("name", pa.string()),
            ("gpus", pa.float64()),
            ("nodes_used", pa.int64()),
            ("racks_used", pa.int64()),
            ("submit", pa.float64()),
            ("start", pa.float64()),
            ("end", pa.float64()),
            ("runtime", pa.float64()),
            ("state", pa.string()),
            ("preemptions", pa.int64()),
            ("restarts", pa.int64()),
            ("time_limit", pa.float64()),
            ("p_success", pa.float64()),
            ("pred_runtime", pa.float64()),
            ("priority_class", pa.string()),
            ("preemptible", pa.bool_()),
            ("lost_s", pa.float64()),
            ("probe_lost_s", pa.float64()),
            ("held_s", pa.float64()),
            ("probed", pa.bool_()),
            ("frag_at_submit", pa.float64()),
        ]
    )
    assert tuple(schema.names) == JOB_COLUMNS
    return pa.Table.from_pylist(full, schema=schema)


def make_timeline(rows: Sequence[Sequence[float]]) -> pa.Table:
    cols: list[Sequence[float]] = list(zip(*rows, strict=True)) if rows else [[] for _ in TIMELINE_COLUMNS]
    return pa.table({name: pa.array(c, pa.float64()) for name, c in zip(TIMELINE_COLUMNS, cols, strict=True)})


# Two 4-GPU jobs on an 8-GPU cluster: a succeeds (0..100), b waits 50 s and fails (50..150).
JOBS: list[dict[str, object]] = [
    dict(job_id="a", user="u1", gpus=4.0, submit=0.0, start=0.0, end=100.0, runtime=100.0, state="COMPLETED"),
    dict(job_id="b", user="u2", gpus=4.0, submit=0.0, start=50.0, end=150.0, runtime=100.0, state="FAILED"),
]
#           t, busy, free, pending, running, frag_free, completed_total, goodput_total
TIMELINE: list[tuple[float, ...]] = [
    (0.0, 4.0, 4.0, 1, 1, 4.0, 0, 0.0),
    (50.0, 8.0, 0.0, 0, 2, 0.0, 0, 0.0),
    (100.0, 4.0, 4.0, 0, 1, 0.0, 1, 4 * 100 / 3600),
    (150.0, 0.0, 8.0, 0, 0, 0.0, 1, 4 * 100 / 3600),
]


def result(
    jobs: Sequence[Mapping[str, object]] = JOBS, timeline: Sequence[Sequence[float]] = TIMELINE
) -> SimResult:
    return SimResult(
        policy="fifo",
        placement="first-fit",
        jobs=make_jobs(jobs),
        timeline=make_timeline(timeline),
        capacity_gpus=8.0,
        load=1.0,
    )


def test_time_to_success_counts_only_completed_jobs() -> None:
    m = compute(result())
    assert m["time_to_success_mean"] == 100.0
    assert m["time_to_success_p95"] == 100.0
    assert m["jobs_successful"] == 1
    assert m["jct_mean"] == 125.0


def test_queue_delay_and_starvation_are_start_minus_submit() -> None:
    m = compute(result())
    assert m["queue_delay_mean"] == 25.0
    assert m["queue_delay_max"] == 50.0
    assert m["starvation_s"] == 50.0
    assert m["queue_delay_p99"] == pytest.approx(49.5)


def test_bounded_slowdown_uses_a_ten_second_floor() -> None:
    jobs = [
        dict(
            job_id="s", user="u", gpus=1.0, submit=0.0, start=20.0, end=21.0, runtime=1.0, state="COMPLETED"
        ),
        dict(
            job_id="l", user="u", gpus=1.0, submit=0.0, start=0.0, end=100.0, runtime=100.0, state="COMPLETED"
        ),
    ]
    m = compute(result(jobs, [(0.0, 1, 7, 0, 1, 0, 0, 0), (100.0, 0, 8, 0, 0, 0, 2, 0)]))
    # 21 / max(1, 10) = 2.1 and 100 / 100 = 1.0
    assert m["bounded_slowdown_mean"] == pytest.approx((2.1 + 1.0) / 2)
    assert m["bounded_slowdown_success_median"] == pytest.approx((2.1 + 1.0) / 2)


def test_utilisation_is_busy_gpu_seconds_over_capacity_times_span() -> None:
    m = compute(result())
    # busy: 4*50 + 8*50 + 4*50 = 800 GPU-s over 8 GPUs x 150 s
    assert m["span_s"] == 150.0
    assert m["utilisation"] == pytest.approx(800 / (8 * 150))


def test_fragmentation_time_averages_frag_free_gpus_over_the_span() -> None:
    m = compute(result())
    assert m["fragmentation"] == pytest.approx(4.0 * 50 / 150)
    assert m["fragmented_gpu_hours"] == pytest.approx(4.0 * 50 / 3600)


def test_goodput_and_waste_split_by_outcome_class() -> None:
    jobs = [
        *JOBS,
        dict(
            job_id="c", user="u1", gpus=2.0, submit=0.0, start=0.0, end=36.0, runtime=36.0, state="CANCELLED"
        ),
    ]
    m = compute(result(jobs))
    assert m["goodput_gpu_hours"] == pytest.approx(400 / 3600)
    assert m["wasted_gpu_hours"] == pytest.approx(400 / 3600)  # cancelled is neither
    assert m["completion_rate"] == pytest.approx(1 / 3)


def test_jain_index_is_one_when_even_and_one_over_n_when_one_user_suffers() -> None:
    assert jain_index(np.array([2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert jain_index(np.array([5.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)
    assert jain_index(np.array([])) is None


def test_fairness_is_over_users_mean_slowdown() -> None:
    m = compute(result())
    # u1: 100/100 = 1, u2: 150/100 = 1.5
    assert m["jain_fairness"] == pytest.approx((2.5**2) / (2 * (1 + 2.25)))


def test_unfinished_jobs_are_counted_not_timed() -> None:
    jobs: list[dict[str, object]] = [
        *JOBS,
        dict(
            job_id="n", user="u3", gpus=1.0, submit=10.0, start=None, end=None, runtime=5.0, state="COMPLETED"
        ),
    ]
    m = compute(result(jobs))
    assert m["jobs_unfinished"] == 1
    assert m["time_to_success_mean"] == 100.0
    assert m["queue_delay_max"] == 50.0


def test_empty_result_gives_nulls_not_errors() -> None:
    m = compute(result([], []))
    assert m["jobs"] == 0
    assert m["time_to_success_mean"] is None
    assert m["utilisation"] is None


def test_step_integral_is_exact_between_breakpoints() -> None:
    t = np.array([0.0, 10.0, 20.0])
    v = np.array([1.0, 3.0, 0.0])
    got = step_integral(t, v, np.array([-5.0, 0.0, 5.0, 10.0, 15.0, 20.0, 30.0]))
    assert got.tolist() == [0.0, 0.0, 5.0, 10.0, 25.0, 40.0, 40.0]


def test_series_bins_average_levels_and_keep_running_totals() -> None:
    s = series(result(), bins=3)
    assert s.t.tolist() == [50.0, 100.0, 150.0]
    assert s.utilisation.tolist() == pytest.approx([0.5, 1.0, 0.5])
    assert s.completed_total.tolist() == [0.0, 1.0, 1.0]
    assert s.pending.tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_ratios_divide_by_the_baseline_and_skip_zeros() -> None:
    r = ratios({"a": {"x": 2.0, "y": 1.0}, "mf": {"x": 4.0, "y": 0.0}}, "mf", ["x", "y"])
    assert r["a"]["x"] == 0.5
    assert r["a"]["y"] is None
    assert r["mf"]["x"] == 1.0


def test_span_runs_from_first_arrival_to_last_end() -> None:
    jt = JobTimes.of(make_jobs(JOBS))
    assert span(jt) == (0.0, 150.0)
    assert not math.isnan(jt.bounded_slowdown[0])


def test_a_job_of_unknown_outcome_counts_in_neither_side_of_the_completion_rate() -> None:
    """As in the audit: Alibaba's UNKNOWN pods (deleted while running) replay, but whether they would
    have finished is not known."""
    unknown = dict(
        job_id="u", user="u1", gpus=2.0, submit=0.0, start=0.0, end=36.0, runtime=36.0, state="UNKNOWN"
    )
    cancelled = {**unknown, "job_id": "c", "state": "CANCELLED"}
    with_unknown = compute(result([*JOBS, cancelled, unknown]))
    assert with_unknown["completion_rate"] == pytest.approx(1 / 3)
    assert with_unknown["completion_rate"] == compute(result([*JOBS, cancelled]))["completion_rate"]
    assert with_unknown["jobs"] == 4  # replayed all the same


def test_the_cdf_of_one_value_is_a_point_at_one_and_the_smallest_of_n_is_at_one_over_n() -> None:
    """The CDF put the smallest value at 0%: a one-job trace's chart was a single point at 0."""
    from headway.sim.metrics import cdf

    x, y = cdf(np.array([40.0]))
    assert list(x) == [40.0] and list(y) == [1.0]
    x, y = cdf(np.array([3.0, 1.0, np.nan, 2.0, 4.0]))
    assert list(x) == [1.0, 2.0, 3.0, 4.0] and list(y) == [0.25, 0.5, 0.75, 1.0]
    x, y = cdf(np.arange(1000.0), points=11)
    assert len(x) == 11 and y[0] == 1 / 1000 and y[-1] == 1.0 and (np.diff(y) > 0).all()
