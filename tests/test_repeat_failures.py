"""The repeat-failure hold counts failures the user can act on, in all three places it is kept: the
simulator, the local queue's usage book and the Slurm sync's history. A node failure is waste, but one
bad node must not hold back a user's sweep: it neither extends nor ends a streak."""

from __future__ import annotations

import datetime as dt

import pytest

from headway.local.ordering import UsageBook
from headway.schema import JobRecord, State
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.run import run_simulation
from headway.slurm.sync import fail_streaks
from test_engine_helpers import FixedPredictor, make_jobs

T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)


def record(i: int, state: State, name: str = "sweep") -> JobRecord:
    end = T0 + dt.timedelta(minutes=i)
    return JobRecord(str(i), state, "sacct", user="carol", name=name, end_time=end, gpus=1.0)


@pytest.mark.parametrize(
    ("states", "streak"),
    [
        ([State.NODE_FAIL] * 3, 0),
        ([State.FAILED, State.NODE_FAIL, State.FAILED, State.NODE_FAIL, State.TIMEOUT], 3),
        ([State.FAILED, State.FAILED, State.COMPLETED, State.NODE_FAIL], 0),
        ([State.OUT_OF_MEMORY, State.CANCELLED, State.FAILED], 2),
    ],
)
def test_slurm_sync_counts_only_the_users_own_failures(states: list[State], streak: int) -> None:
    got = fail_streaks([record(i, s) for i, s in enumerate(states)])
    assert got.get(("carol", "sweep"), 0) == streak


def test_local_queue_usage_book_does_not_count_node_failures() -> None:
    book = UsageBook()
    for i in range(3):
        book.add("carol", "sweep", "NODE_FAIL", 1.0, 10.0 * i, 10.0 * i + 5)
    assert book.streak.get(("carol", "sweep"), 0) == 0
    for i in range(3, 6):
        book.add("carol", "sweep", "FAILED", 1.0, 10.0 * i, 10.0 * i + 5)
    book.add("carol", "sweep", "NODE_FAIL", 1.0, 70.0, 75.0)
    assert book.streak[("carol", "sweep")] == 3


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
