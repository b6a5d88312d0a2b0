"""The simulator's state changes only through its transitions, and `validate()` sees any broken invariant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headway.policy.inputs import UsageLedger
from headway.policy.snapshot import Allocation, Decision, Start
from headway.sim.cluster import Cluster, ClusterSpec
from headway.sim.events import End
from headway.sim.run import prepare
from headway.sim.state import SimState
from test_engine_helpers import make_jobs

SPEC = ClusterSpec.from_flags(2, 4, 1)


def state_of(rows: list[dict[str, object]]) -> SimState:
    jobs, truth, *_ = prepare(make_jobs(rows), SPEC)
    st = SimState(jobs, truth, Cluster(SPEC))
    n = len(jobs)
    st.set_predictions(
        list(range(n)), np.full(n, 0.9), np.full(n, 60.0), np.full(n, 90.0), np.full(n, 30.0), True
    )
    return st


def start(st: SimState, key: int, node: int, gpus: int, now: float) -> tuple[float, End]:
    dec = Decision("t", now, start=(Start(key, f"j{key}", Allocation((node,), (gpus,))),))
    (end,) = st.apply(dec, now)
    st.validate()
    return end


def test_a_job_goes_from_pending_to_running_to_ended_with_its_gpus_taken_and_given_back() -> None:
    st = state_of([{"submit": 0, "runtime": 100, "gpus": 2}])
    st.on_arrival(0)
    st.validate()
    assert st.pending.n == 1 and st.can_place_any()
    t, end = start(st, 0, 1, 2, 0.0)
    assert t == 100.0 and st.pending.n == 0 and st.running.n == 1
    assert st.cluster.free.tolist() == [4, 2] and st.index.total == 6
    assert st.on_end(end, t) == "COMPLETED"
    st.validate()
    assert (
        st.cluster.free.tolist() == [4, 4] and st.completed == 1 and st.goodput == pytest.approx(200 / 3600)
    )


def test_a_preempted_runs_end_is_stale_and_the_job_waits_again_with_what_it_attained() -> None:
    st = state_of([{"submit": 0, "runtime": 100, "gpus": 1}])
    st.on_arrival(0)
    _, end = start(st, 0, 0, 1, 0.0)
    st.apply(Decision("p", 40.0, preempt=(0,)), 40.0)
    st.validate()
    assert st.on_end(end, 100.0) is None  # the first run's end: preempted at 40
    assert st.pending.n == 1 and st.attained[0] == 40.0 and st.preemptions[0] == 1
    assert math.isnan(st.end[0]) and st.last_stop[0] == 40.0


def test_usage_in_a_snapshot_is_the_ledgers_decayed_usage_of_the_runs_so_far() -> None:
    st = state_of([{"submit": 0, "runtime": 7 * 86400, "gpus": 4, "user": "a"}, {"submit": 1, "user": "b"}])
    st.on_arrival(0)
    t, end = start(st, 0, 0, 4, 0.0)
    st.on_arrival(1)
    want = UsageLedger()
    want.add_run(want.user("a"), 4.0, 0.0, 86400.0)
    snap = st.snapshot(86400.0, 0)
    assert snap.usage[snap.users.index("a")] == want.usage(86400.0)[0]
    assert snap.shares.tolist() == [0.5, 0.5]
    st.on_end(end, t)
    want2 = UsageLedger()
    want2.add_run(want2.user("a"), 4.0, 0.0, t)
    assert st.snapshot(t, 1).usage[0] == want2.usage(t)[0]


def test_a_fail_streak_counts_the_keys_own_failures_and_a_success_ends_it() -> None:
    rows: list[dict[str, object]] = [
        {"submit": i, "runtime": 1, "name": "sweep", "state": s}
        for i, s in enumerate(["FAILED", "NODE_FAIL", "TIMEOUT", "COMPLETED", "FAILED"])
    ]
    rows.append({"submit": 10, "name": "sweep"})
    st = state_of(rows)
    streaks = []
    for k in range(5):
        st.on_arrival(k)
        t, end = start(st, k, 0, 1, float(k))
        st.on_end(end, t)
        streaks.append(int(st.book.streaks.of(np.array([st.streak_key[5]]))[0]))
    assert streaks == [1, 1, 2, 0, 1]
    st.on_arrival(5)
    assert st.snapshot(6.0, 0).pending.fail_streak.tolist() == [1]


@pytest.mark.parametrize("damage", ["free", "index", "pending"])
def test_validate_catches_a_state_changed_behind_its_back(damage: str) -> None:
    st = state_of([{"submit": 0, "gpus": 1}, {"submit": 0, "gpus": 1}])
    st.on_arrival(0)
    st.on_arrival(1)
    start(st, 0, 0, 1, 0.0)
    if damage == "free":
        st.cluster.free[1] -= 1
    elif damage == "index":
        st.index.set_free(1, 3)
    else:
        st.pend_sizes[(1, 1)] += 1
    with pytest.raises(AssertionError):
        st.validate()
