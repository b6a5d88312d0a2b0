"""The impact policy's starvation bound, as a property over adversarial traces.

The invariant, precisely. Let W be the class's max_wait and d_j = submit_j + W the job's deadline.
Starved jobs are served in deadline order (ties: submit order). Let A_j be the jobs ahead of j in that
order and t_j = max(d_j, the latest start among A_j). From t_j on, j is the head of the starved queue;
then (1) no job outside A_j and j itself starts in [t_j, start_j), except a backfill whose *time limit*
ends before j's planned start (the traces here carry no limits, so none may), and (2) j starts at the
first instant >= t_j at which the running jobs leave enough GPUs for it. So a job that fits the cluster
waits at most W + the time until the jobs running at t_j free enough GPUs (+ the longest such time
limit): no prediction (however wrong, however adversarial), no repeat-failure hold and no backfill on a
prediction can push it further. Checked on clusters of
1-GPU nodes, where "enough GPUs" is a count, so the check needs no knowledge of placements.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from headway.policy import get_policy
from headway.sim.cluster import ClusterSpec
from headway.sim.run import run_simulation
from test_engine_helpers import FixedPredictor, make_jobs
from test_policy import pending, snapshot

W = 1000.0


@st.composite
def traces(draw: st.DrawFn) -> tuple[int, list[dict[str, object]], dict[str, tuple[float, float, float]]]:
    cap = draw(st.integers(1, 6))
    n = draw(st.integers(2, 24))
    rows: list[dict[str, object]] = []
    preds: dict[str, tuple[float, float, float]] = {}
    t = 0
    for i in range(n):
        t += draw(st.integers(0, 1500))
        jid = f"j{i}"
        rows.append(
            {
                "job_id": jid,
                "submit": t,
                "runtime": draw(st.integers(1, 6000)),
                "gpus": float(draw(st.integers(1, cap))),
                "user": draw(st.sampled_from(["a", "b", "c"])),
                "name": draw(st.sampled_from(["x", "y"])),
                "state": draw(st.sampled_from(["COMPLETED", "FAILED", "FAILED"])),
            }
        )
        # Adversarial predictions: some look hopeless, some look perfect; runtimes badly wrong.
        preds[jid] = (
            draw(st.sampled_from([0.001, 0.5, 0.999])),
            float(draw(st.sampled_from([1, 60, 10**6]))),
            float(draw(st.sampled_from([1, 10**6]))),
        )
    return cap, rows, preds


def check_bound(cap: int, jobs: list[dict[str, object]]) -> None:
    jobs = sorted(jobs, key=lambda r: (r["submit"], int(str(r["job_id"])[1:])))  # type: ignore[arg-type]
    for i, j in enumerate(jobs):
        d = float(j["submit"]) + W  # type: ignore[arg-type]
        start_j = float(j["start"])  # type: ignore[arg-type]
        if start_j <= d:
            continue
        ahead = jobs[:i]
        t_j = max([d] + [float(k["start"]) for k in ahead])  # type: ignore[arg-type]
        assert t_j <= start_j + 1e-9
        for k in jobs[i + 1 :]:  # (1) nobody behind it starts while it is the starved head
            sk = float(k["start"])  # type: ignore[arg-type]
            assert not (t_j - 1e-9 <= sk < start_j - 1e-9), (j["job_id"], k["job_id"], t_j, sk, start_j)
        # (2) it starts as soon as enough GPUs are free: check t_j and every end in [t_j, start_j)
        ends = [float(k["end"]) for k in jobs if t_j <= float(k["end"]) < start_j]  # type: ignore[arg-type]
        for tau in [t for t in [t_j, *ends] if t < start_j]:
            busy = sum(
                float(k["gpus"])  # type: ignore[arg-type]
                for k in jobs
                if k is not j and float(k["start"]) <= tau < float(k["end"])  # type: ignore[arg-type]
            )
            assert cap - busy < float(j["gpus"]), (j["job_id"], tau, cap - busy)  # type: ignore[arg-type]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_no_job_waits_past_max_wait_plus_the_time_for_gpus_to_free(
    case: tuple[int, list[dict[str, object]], dict[str, tuple[float, float, float]]],
) -> None:
    cap, rows, preds = case
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(cap, 1, 2),
        policy="impact",
        predictor_factory=lambda: FixedPredictor(preds),
        policy_options={"max_wait_s": {"normal": W}, "hold_after": 1},
    )
    jobs = res.jobs.to_pylist()
    assert all(r["start"] is not None for r in jobs)
    check_bound(cap, jobs)


def test_a_hopeless_big_job_is_not_starved_by_a_stream_of_attractive_small_ones() -> None:
    rows: list[dict[str, object]] = [{"job_id": "j0", "submit": 0, "runtime": 500, "gpus": 1.0}]
    rows.append({"job_id": "j1", "submit": 1, "runtime": 100, "gpus": 4.0})
    rows += [{"job_id": f"j{i}", "submit": 2 + 50 * i, "runtime": 400, "gpus": 1.0} for i in range(2, 200)]
    preds = {f"j{i}": (0.99, 60.0, 60.0) for i in range(200)}
    preds["j1"] = (0.001, 10**6, 10**6)
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(4, 1),
        policy="impact",
        predictor_factory=lambda: FixedPredictor(preds),
        policy_options={"max_wait_s": {"normal": W}},
    )
    big = next(r for r in res.jobs.to_pylist() if r["job_id"] == "j1")
    # Starved at 1001 behind 4 running 400 s jobs: it waits for them, never for the newcomers.
    assert W < big["start"] - big["submit"] <= W + 400
    check_bound(4, res.jobs.to_pylist())


@settings(max_examples=200, deadline=None)
@given(
    submits=st.lists(st.sampled_from([0.0, 500.0, 999.0, 1000.0, 1000.5, 4000.0, math.nan]), max_size=40),
    classes=st.sampled_from([("normal",), ("normal", "high"), ("low", "normal", "urgent", "other")]),
    now=st.sampled_from([1000.0, 2000.0, 1e9]),
)
def test_wake_at_is_the_earliest_starvation_deadline_still_ahead(
    submits: list[float], classes: tuple[str, ...], now: float
) -> None:
    """Impact asks for a pass when the next job starves (its submit + its class's max_wait), so that the
    starved tier takes effect then and not at some unrelated event; a deadline at or before now has
    passed (the job is starved already)."""
    max_wait = {"low": 3000.0, "normal": W, "high": 10.0, "urgent": 1.5}  # "other": normal's
    rows = [{"submit": t, "klass": i % len(classes)} for i, t in enumerate(submits)]
    snap = snapshot(pending(rows), now=now, classes=classes)
    deadlines = [
        t + max_wait.get(classes[i % len(classes)], max_wait["normal"]) for i, t in enumerate(submits)
    ]
    ahead = [d for d in deadlines if d > now]
    want = min(ahead) if ahead else None
    pol = get_policy("impact", max_wait_s=max_wait)
    assert pol.wake_at(snap) == want
    assert pol.decide(snap).wake_at == want
