"""The repeat-failure hold counts failures the user can act on, in every place it is kept: the simulator,
the local queue's book, the Slurm sync's history, and the audit's repeat-failure view. A node failure is
waste, but one bad node must not hold back a user's sweep: it neither extends nor ends a streak."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from headway.audit.compute import audit_report
from headway.local.ordering import LocalPlanner, add_end, fail_streak
from headway.schema import JobRecord, State, records_to_table
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.run import run_simulation
from headway.slurm.queue import NodeGpus, QueueJob
from headway.slurm.sync import build_snapshot
from headway.store import JobStore
from test_engine_helpers import FixedPredictor, make_jobs
from test_policy_inputs import predictions

T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
SEQUENCES = [
    ([State.NODE_FAIL] * 3, 0),
    ([State.FAILED, State.NODE_FAIL, State.FAILED, State.NODE_FAIL, State.TIMEOUT], 3),
    ([State.FAILED, State.FAILED, State.COMPLETED, State.NODE_FAIL], 0),
    ([State.OUT_OF_MEMORY, State.CANCELLED, State.FAILED], 2),
    ([State.FAILED, State.PREEMPTED, State.OUT_OF_MEMORY, State.NODE_FAIL, State.TIMEOUT, State.FAILED], 4),
]


def record(i: int, state: State, name: str = "sweep") -> JobRecord:
    start = T0 + dt.timedelta(minutes=10 * i)
    end = start + dt.timedelta(minutes=5)
    return JobRecord(
        str(i),
        state,
        "sacct",
        user="carol",
        name=name,
        submit_time=start,
        start_time=start,
        end_time=end,
        gpus=1.0,
    )


def slurm_streak(history: list[JobRecord]) -> int:
    """The streak the Slurm sync's snapshot gives carol's next `sweep`."""
    now = T0.timestamp() + 86400
    nxt = QueueJob("next", "PENDING", "carol", None, "sweep", None, None, now, None, 1.0, 1, None, None)
    snap = build_snapshot(
        [nxt], [], [NodeGpus("n0", 1, 0, "idle")], predictions(1), predictions(0), history, now, 1
    )
    return int(snap.pending.fail_streak[0])


@pytest.mark.parametrize(("states", "streak"), SEQUENCES)
def test_slurm_sync_counts_only_the_users_own_failures(states: list[State], streak: int) -> None:
    assert slurm_streak([record(i, s) for i, s in enumerate(states)]) == streak


@pytest.mark.parametrize(("states", "streak"), SEQUENCES)
def test_local_queue_book_counts_only_the_users_own_failures(states: list[State], streak: int) -> None:
    planner = LocalPlanner("fifo")
    for i, s in enumerate(states):
        add_end(planner.book, "carol", "sweep", s.value, 1.0, 10.0 * i, 10.0 * i + 5)
    assert fail_streak(planner.book, "carol", "sweep") == streak
    assert fail_streak(planner.book, "carol", "other") == 0


@pytest.mark.parametrize(("states", "streak"), SEQUENCES)
def test_the_audit_counts_the_same_run_of_failures_as_the_hold(
    tmp_path: Path, states: list[State], streak: int
) -> None:
    """The audit's open run (no success after it) is the hold's streak, when it is long enough to show."""
    db = tmp_path / "a.duckdb"
    recs = [record(i, s) for i, s in enumerate(states)]
    with JobStore(db) as store:
        store.upsert(records_to_table(recs))
    with JobStore(db, read_only=True) as store:
        rf = audit_report(store.con)["repeat_failures"]
    open_runs = [r["failures"] for r in rf["rows"] if not r["success_followed"]]
    assert open_runs == ([streak] if streak >= rf["min_run"] else [])
    assert all(set(r["states"]) <= {"FAILED", "TIMEOUT", "OUT_OF_MEMORY"} for r in rf["rows"])
    assert np.isfinite(rf["gpu_hours"])


@pytest.mark.parametrize(("state", "held"), [("NODE_FAIL", False), ("FAILED", True)])
def test_the_simulator_holds_after_own_failures_not_node_failures(state: str, held: bool) -> None:
    """Three ended runs of user+name, then a fourth that has to wait behind a blocker: held (tier 2)
    after three failures, normal after three node failures."""
    rows: list[dict[str, object]] = [
        {"submit": 20 * i, "runtime": 10, "gpus": 1, "user": "carol", "name": "sweep", "state": state}
        for i in range(3)
    ]
    rows += [
        {"submit": 100, "runtime": 1000, "gpus": 1, "user": "dan", "name": "blocker", "job_id": "blocker"},
        {"submit": 101, "runtime": 10, "gpus": 1, "user": "carol", "name": "sweep", "job_id": "next"},
    ]
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(1, 1),
        policy="impact",
        predictor_factory=lambda: FixedPredictor({}),
        engine_options=EngineOptions(log_decisions=True),
    )
    tiers = [
        int(d.ranking.tier[list(d.ranking.job_id).index("next")])
        for d in res.decisions
        if d.ranking is not None and "next" in list(d.ranking.job_id)
    ]
    assert tiers and all(t == (2 if held else 1) for t in tiers)
