"""The one module that feeds every policy (policy/inputs.py): Slurm's decayed usage, shares among the users
seen, failure streaks, and the rows both live adapters build their snapshot columns from.

The ledger is checked against Slurm's definition integrated numerically (every GPU-second decays by half
each half-life after it was used, running jobs accrue while they run); the local queue and the Slurm sync
and the simulator are checked to give the same usage, shares and streaks for the same history
(`ADAPTERS`)."""

from __future__ import annotations

import copy
import datetime as dt
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.integrate import simpson

from headway.local.core import JobState, LocalJob, QueueView
from headway.local.db import StateDB
from headway.local.ordering import LocalPlanner, add_end, load_book
from headway.local.paths import STATE_DB
from headway.policy.inputs import (
    HALF_LIFE_S,
    STREAK_FAILURES,
    STREAK_SUCCESS,
    FailureStreaks,
    UsageLedger,
    streak_key,
)
from headway.policy.snapshot import Allocation, Decision, Snapshot, Start
from headway.predict.api import Predictions
from headway.schema import JobRecord, State
from headway.sim.cluster import Cluster, ClusterSpec
from headway.sim.events import End
from headway.sim.state import JobArrays, SimState, Truth
from headway.slurm.queue import NodeGpus, QueueJob
from headway.slurm.sync import build_snapshot

DAY = 86400.0
H = HALF_LIFE_S
LN2 = math.log(2)


# ---------- the ledger against Slurm's definition ----------


def integral(runs: Sequence[tuple[int, float, float, float]], now: float) -> dict[int, float]:
    """Per user: the integral over each run's GPU-seconds used before `now` of 2^(-(now - t)/h)."""
    out: dict[int, float] = {}
    for u, g, s, e in runs:
        hi = min(e, now)
        out.setdefault(u, 0.0)
        if hi > s:
            t = np.linspace(s, hi, 4001)
            out[u] += float(simpson(g * np.exp2(-(now - t) / H), x=t))
    return out


run_st = st.tuples(
    st.integers(0, 3),
    st.floats(0.25, 16.0),
    st.floats(0.0, 60 * DAY),
    st.floats(0.0, 20 * DAY),
).map(lambda r: (r[0], r[1], r[2], r[2] + r[3]))


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(run_st, min_size=1, max_size=12), queries=st.lists(st.floats(0, 90 * DAY), min_size=1))
def test_usage_from_start_and_stop_is_the_integral_of_decayed_gpu_seconds(
    runs: list[tuple[int, float, float, float]], queries: list[float]
) -> None:
    """The simulator's way: start and stop as they happen, usage read at any time between events."""
    ledger = UsageLedger(users=[f"u{i}" for i in range(4)])
    events = sorted(
        [(s, 1, i) for i, (_, _, s, _) in enumerate(runs)]
        + [(e, 0, i) for i, (_, _, _, e) in enumerate(runs)]
    )
    k = 0
    for q in sorted(queries):
        while k < len(events) and events[k][0] <= q:
            t, is_start, i = events[k]
            u, g, s, _ = runs[i]
            ledger.start(u, g, t) if is_start else ledger.stop(u, g, s, t)
            k += 1
        want = integral(runs, q)
        got = ledger.usage(q)
        for u, v in want.items():
            assert got[u] == pytest.approx(v, rel=1e-3, abs=1e-3)


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(run_st, min_size=1, max_size=12), now=st.floats(0, 90 * DAY))
def test_usage_of_ended_runs_plus_running_jobs_read_afresh_is_the_same_integral(
    runs: list[tuple[int, float, float, float]], now: float
) -> None:
    """The adapters' way: runs over by `now` added once (`add_run`), the rest running since their start
    and added per snapshot (`usage_with_running`)."""
    ledger = UsageLedger(users=[f"u{i}" for i in range(4)])
    ended = [r for r in runs if r[3] <= now]
    running = [r for r in runs if r[2] <= now < r[3]]
    for u, g, s, e in ended:
        ledger.add_run(u, g, s, e)
    got = ledger.usage_with_running(
        now,
        np.array([r[0] for r in running], dtype=np.int64),
        np.array([r[1] for r in running]),
        np.array([r[2] for r in running]),
    )
    for u, v in integral(ended + running, now).items():
        assert got[u] == pytest.approx(v, rel=1e-3, abs=1e-3)


def test_one_users_8_gpu_7_day_job_has_used_3_49e6_decayed_gpu_seconds_at_its_end_not_4_84e6() -> None:
    """The issue's example: with a 7-day half-life the first GPU-seconds have halved by the job's end, so
    its usage is 8 * 7 d * (1 - 2^-1) / ln 2, not the 8 * 7 d = 4.84e6 the local queue used to count."""
    want = 8 * 7 * DAY * (1 - 2**-1) / LN2
    assert want == pytest.approx(3.49e6, rel=1e-3)
    ledger = UsageLedger(users=["ann"])
    ledger.add_run(0, 8.0, 0.0, 7 * DAY)
    assert ledger.usage(7 * DAY)[0] == pytest.approx(want, abs=1e-3)
    # The local planner, while it runs (at its last second) and once it has ended.
    planner = LocalPlanner("fifo")
    job = local_job(1, "ann", "train", 8, 0.0, state=JobState.RUNNING, start=0.0, gpu_ids=tuple(range(8)))
    snap = planner.snapshot(QueueView(7 * DAY, tuple(range(8)), (), (), (job,)))
    assert usage_of(snap)["ann"] == pytest.approx(want, abs=1e-3)
    add_end(planner.book, "ann", "train", "COMPLETED", 8.0, 0.0, 7 * DAY)
    snap = planner.snapshot(QueueView(7 * DAY, tuple(range(8)), tuple(range(8)), (), ()))
    assert usage_of(snap)["ann"] == pytest.approx(want, abs=1e-3)


@settings(max_examples=80, deadline=None)
@given(
    runs=st.lists(run_st, min_size=2, max_size=15),
    seed=st.integers(0, 2**32 - 1),
    later=st.floats(0, 90 * DAY),
)
def test_the_order_runs_are_added_in_leaves_no_trace_in_usage(
    runs: list[tuple[int, float, float, float]], seed: int, later: float
) -> None:
    """Ended runs (history), read after the last of them ended, in any order."""
    now = max(e for *_, e in runs) + later

    def usage(order: list[tuple[int, float, float, float]]) -> dict[str, float]:
        ledger = UsageLedger()
        for u, g, s, e in order:
            ledger.add_run(ledger.user(f"u{u}"), g, s, e)
        return dict(zip(ledger.users, ledger.usage(now).tolist(), strict=True))

    shuffled = list(runs)
    random.Random(seed).shuffle(shuffled)
    assert usage(runs) == usage(shuffled)


def test_decades_of_history_re_anchor_the_sums_and_keep_usage_exact() -> None:
    """Forty years of weekly one-day runs: 2^(t/h) would overflow a float after ~20 years (1023 half-lives)
    without re-anchoring; usage at the end is what the closed form gives over the last runs."""
    ledger = UsageLedger(users=["ann", "bob"])  # ann's runs from history, bob's as they happen
    runs = [(w * 7 * DAY, w * 7 * DAY + DAY) for w in range(52 * 40)]
    for s, e in runs:
        ledger.add_run(0, 2.0, s, e)
        ledger.start(1, 2.0, s)
        ledger.stop(1, 2.0, s, e)
    now = runs[-1][1] + 3 * DAY
    want = sum(2.0 * (math.exp2(-(now - e) / H) - math.exp2(-(now - s) / H)) * H / LN2 for s, e in runs)
    assert ledger.t0 > 0 and np.isfinite(ledger.usage(now)).all()
    assert ledger.usage(now).tolist() == pytest.approx([want, want], rel=1e-9, abs=1e-3)
    # a job started decades after the anchor, running now, read afresh: the same as start() then usage()
    start = 30 * 365 * DAY
    fresh = UsageLedger(users=["bob"])
    got = fresh.usage_with_running(start + DAY, np.array([0]), np.array([4.0]), np.array([start]))
    fresh.start(0, 4.0, start)
    assert got[0] == fresh.usage(start + DAY)[0] == pytest.approx(4 * (1 - 2 ** (-DAY / H)) * H / LN2)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ended=st.lists(run_st, max_size=10),
    running=st.lists(st.tuples(st.integers(0, 3), st.floats(0.25, 16.0), st.floats(0, 800 * 365 * DAY))),
)
def test_running_jobs_read_afresh_give_the_same_bits_as_start_and_change_nothing(
    ended: list[tuple[int, float, float, float]], running: list[tuple[int, float, float]]
) -> None:
    ledger = UsageLedger(users=[f"u{i}" for i in range(4)])
    for u, g, s, e in ended:
        ledger.add_run(u, g, s, e)
    now = max([s for _, _, s in running] + [e for *_, e in ended] + [0.0]) + DAY
    before = ledger.usage(now).copy()
    told = copy.deepcopy(ledger)
    for u, g, s in running:
        told.start(u, g, s)
    cols = [np.array([r[i] for r in running], dtype=np.int64 if i == 0 else np.float64) for i in range(3)]
    got = ledger.usage_with_running(now, *cols)
    assert np.array_equal(got, told.usage(now))
    assert np.array_equal(ledger.usage(now), before)  # the ledger itself is as it was
    assert not got.flags.writeable


def test_shares_are_equal_among_the_users_seen_and_nil_for_the_others() -> None:
    ledger = UsageLedger(users=["ann", "bob", "cy"])
    assert ledger.shares().tolist() == [0.0, 0.0, 0.0]
    ledger.see(0)
    ledger.see(2)
    ledger.see(2)  # seen twice counts once
    assert ledger.shares().tolist() == [0.5, 0.0, 0.5]
    ledger.see(ledger.user("dee"))
    assert ledger.shares().tolist() == pytest.approx([1 / 3, 0.0, 1 / 3, 1 / 3])


# ---------- failure streaks ----------


@pytest.mark.parametrize(
    ("user", "name", "group", "has_names", "key"),
    [
        ("ann", "train", "lab", True, ("ann", "name", "train")),
        ("ann", "train", None, False, ("ann", "name", "train")),
        ("ann", None, "lab", True, ("ann", "group", "lab")),
        ("ann", "", "lab", True, ("ann", "group", "lab")),  # an empty name is no name
        ("ann", None, None, False, ("ann", "user", "")),  # a log with neither: the user alone
        ("ann", None, None, True, None),  # a log with names: never lumped with the user's other jobs
        (None, "train", "lab", True, None),
        ("", "train", "lab", True, None),
    ],
)
def test_a_streak_is_keyed_by_user_and_name_else_group_else_user_alone_in_a_log_without_both(
    user: str | None, name: str | None, group: str | None, has_names: bool, key: object
) -> None:
    assert streak_key(user, name, group, log_has_names=has_names) == key


@pytest.mark.parametrize(
    ("states", "streak"),
    [
        (["FAILED", "TIMEOUT", "OUT_OF_MEMORY"], 3),
        (["FAILED", "NODE_FAIL", "FAILED", "CANCELLED", "PREEMPTED", "FAILED"], 3),
        (["FAILED", "FAILED", "COMPLETED"], 0),
        (["FAILED", "COMPLETED", "NODE_FAIL", "TIMEOUT"], 1),
        (["NODE_FAIL"] * 4 + ["CANCELLED"] * 2, 0),
    ],
)
def test_only_own_failures_extend_a_streak_and_only_a_success_ends_it(states: list[str], streak: int) -> None:
    streaks = FailureStreaks()
    k = streaks.key(("carol", "name", "sweep"))
    for s in states:
        streaks.observe(k, s)
    assert streaks.count(("carol", "name", "sweep")) == streak
    assert streaks.of(np.array([k, -1])).tolist() == [streak, 0]  # a job without a key is never held
    assert {"FAILED", "TIMEOUT", "OUT_OF_MEMORY"} == STREAK_FAILURES and STREAK_SUCCESS == "COMPLETED"


# ---------- one history, every adapter ----------


@dataclass(frozen=True)
class Ended:
    user: str
    name: str
    state: str
    gpus: int
    start: float | None
    end: float


@dataclass(frozen=True)
class Running:
    user: str
    name: str
    gpus: int
    start: float


@dataclass(frozen=True)
class Pending:
    user: str
    name: str
    gpus: int
    submit: float


@dataclass(frozen=True)
class Scenario:
    """Ended jobs in end order (distinct ends), jobs running and pending at `now` (whole seconds)."""

    ended: tuple[Ended, ...]
    running: tuple[Running, ...]
    pending: tuple[Pending, ...]
    now: float


@dataclass(frozen=True)
class Inputs:
    """What a policy is fed besides the jobs, by user name, and each pending job's streak in order."""

    usage: dict[str, float]
    shares: dict[str, float]
    fail_streak: list[int]


def inputs_of(snap: Snapshot) -> Inputs:
    users = list(snap.users)
    return Inputs(
        usage=usage_of(snap),
        shares=dict(zip(users, snap.shares.tolist(), strict=True)),
        fail_streak=snap.pending.fail_streak.tolist(),
    )


def usage_of(snap: Snapshot) -> dict[str, float]:
    return dict(zip(list(snap.users), snap.usage.tolist(), strict=True))


def local_job(
    i: int,
    user: str,
    name: str,
    gpus: int,
    submit: float,
    *,
    state: JobState = JobState.PENDING,
    start: float | None = None,
    gpu_ids: tuple[int, ...] = (),
) -> LocalJob:
    return LocalJob(
        i, user, 1000, name, gpus, submit, time_limit=3600.0, state=state, start_time=start, gpu_ids=gpu_ids
    )


def local_view(sc: Scenario) -> QueueView:
    """A server with just the GPUs its running jobs hold, plus one free."""
    run, g = [], 0
    for i, r in enumerate(sc.running):
        ids = tuple(range(g, g + r.gpus))
        g += r.gpus
        run.append(
            local_job(
                100 + i, r.user, r.name, r.gpus, r.start, state=JobState.RUNNING, start=r.start, gpu_ids=ids
            )
        )
    pend = [local_job(1000 + i, p.user, p.name, p.gpus, p.submit) for i, p in enumerate(sc.pending)]
    return QueueView(sc.now, tuple(range(g + 1)), (g,), tuple(pend), tuple(run))


def local_daemon_inputs(sc: Scenario) -> Inputs:
    """The running daemon's way: every ended job into the planner's book as it ends (`Daemon._observe`)."""
    planner = LocalPlanner("fifo")
    for e in sc.ended:
        add_end(planner.book, e.user, e.name, e.state, float(e.gpus), e.start, e.end)
    planner.snapshot(local_view(sc))  # a snapshot taken before must change nothing in the next one
    return inputs_of(planner.snapshot(local_view(sc)))


def local_restart_inputs(sc: Scenario, state_dir: Path) -> Inputs:
    """A restarted daemon's way: the book read back from its state database (`load_book`)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    db = StateDB(state_dir / STATE_DB)
    for e in sc.ended:
        db.insert_job(
            {
                "user": e.user,
                "uid": 1000,
                "gid": 1000,
                "name": e.name,
                "argv": "[]",
                "cwd": "/",
                "env": "{}",
                "gpus": e.gpus,
                "priority": "normal",
                "submit_time": e.start or e.end,
                "state": e.state,
                "start_time": e.start,
                "end_time": e.end,
            }
        )
    db.close()
    return inputs_of(LocalPlanner("fifo", load_book(state_dir)).snapshot(local_view(sc)))


def _utc(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)


def predictions(n: int) -> Predictions:
    """The same predictions for `n` jobs (what is compared here is not what the predictor says)."""
    ones = np.ones(n)
    return Predictions(ones, ones * 3600, ones * 3600, ones * 600)


def slurm_queue_job(
    i: int, state: str, user: str, name: str, gpus: float, submit: float, start: float | None = None
) -> QueueJob:
    return QueueJob(f"{i}", state, user, None, name, None, None, submit, start, gpus, 1, 3600.0, None)


def slurm_inputs(sc: Scenario) -> Inputs:
    """The Slurm sync's way: sacct's history and squeue's jobs through `build_snapshot`."""
    history = [
        JobRecord(
            f"{i}",
            State(e.state),
            "sacct",
            user=e.user,
            name=e.name,
            gpus=float(e.gpus),
            start_time=_utc(e.start),
            end_time=_utc(e.end),
        )
        for i, e in enumerate(sc.ended)
    ]
    running = [
        slurm_queue_job(10**6 + i, "RUNNING", r.user, r.name, r.gpus, r.start, r.start)
        for i, r in enumerate(sc.running)
    ]
    pending = [
        slurm_queue_job(2 * 10**6 + i, "PENDING", p.user, p.name, p.gpus, p.submit)
        for i, p in enumerate(sc.pending)
    ]
    used = sum(r.gpus for r in sc.running)
    nodes = [NodeGpus("n0", used + 1, used, "mixed")]
    snap = build_snapshot(
        pending, running, nodes, predictions(len(pending)), predictions(len(running)), history, sc.now, 1
    )
    return inputs_of(snap)


def simulator_inputs(sc: Scenario) -> Inputs | None:
    """The simulator's way: the same jobs arrive, start and end through its state's transitions, one node
    each, in time order (None when a job ended without starting: a replay leaves such jobs out)."""
    if any(e.start is None for e in sc.ended):
        return None
    jobs: list[tuple[float, str, str, str, int, float, float, str]] = []  # submit, id, user, name, gpus, ...
    for i, e in enumerate(sc.ended):
        assert e.start is not None
        jobs.append((e.start, f"e{i}", e.user, e.name, e.gpus, e.start, e.end - e.start, e.state))
    for i, r in enumerate(sc.running):
        jobs.append((r.start, f"r{i}", r.user, r.name, r.gpus, r.start, math.inf, "COMPLETED"))
    for i, p in enumerate(sc.pending):
        jobs.append((p.submit, f"p{i}", p.user, p.name, p.gpus, math.nan, 1.0, "COMPLETED"))
    jobs.sort(key=lambda j: j[0])
    users = sorted({j[2] for j in jobs})
    book = FailureStreaks()
    keys = [book.key(streak_key(j[2], j[3], None, log_has_names=True)) for j in jobs]
    n = len(jobs)
    arrays = JobArrays(
        job_id=np.array([j[1] for j in jobs], dtype=object), user=np.array([users.index(j[2]) for j in jobs]),
        group=np.full(n, None, dtype=object), name=np.array([j[3] for j in jobs], dtype=object),
        streak_key=np.array(keys, dtype=np.int64), klass=np.zeros(n, dtype=np.int64),
        partition=np.full(n, None, dtype=object), submit=np.array([j[0] for j in jobs], dtype=np.float64),
        gpus=np.array([float(j[4]) for j in jobs]), nodes=np.ones(n, dtype=np.int64),
        time_limit=np.full(n, 3600.0), users=users, classes=["normal"], epoch0=0.0,
        streak_keys=list(book.index),
    )  # fmt: skip
    truth = Truth(np.array([j[6] for j in jobs]), np.array([j[7] for j in jobs], dtype=object))
    spec = ClusterSpec.from_flags(max(n, 1), 8)
    state = SimState(arrays, truth, Cluster(spec))
    steps: list[tuple[float, int, int]] = []  # (time, ends first, key)
    for k, j in enumerate(jobs):
        steps.append((j[0], 1, k))
        if not math.isnan(j[5]):
            steps.append((j[5], 2, k))
    steps.sort()
    ends: list[tuple[float, End]] = []
    for t, what, k in steps:
        while ends and ends[0][0] <= t:  # ends first at one instant, as the engine orders them
            t_end, end = ends.pop(0)
            state.on_end(end, t_end)
        if what == 1:
            state.on_arrival(k)
        else:
            dec = Decision("x", t, start=(Start(k, str(jobs[k][1]), Allocation((k,), (jobs[k][4],))),))
            ends.extend(e for e in state.apply(dec, t) if e[0] <= sc.now)
            ends.sort(key=lambda e: e[0])
        state.validate()
    for t_end, end in ends:
        state.on_end(end, t_end)
    snap = state.snapshot(sc.now, 0)
    got = inputs_of(snap)
    order = {str(j): i for i, j in enumerate(snap.pending.job_id.tolist())}
    streaks = [got.fail_streak[order[f"p{i}"]] for i in range(len(sc.pending))]
    return Inputs(got.usage, got.shares, streaks)


# The adapters compared on one scenario: a function from a Scenario to the Inputs of its snapshot at `now`
# (None: the adapter cannot replay this scenario).
ADAPTERS: dict[str, Callable[[Scenario, Path], Inputs | None]] = {
    "local daemon": lambda sc, _: local_daemon_inputs(sc),
    "local restart": local_restart_inputs,
    "slurm sync": lambda sc, _: slurm_inputs(sc),
    "simulator": lambda sc, _: simulator_inputs(sc),
}


def assert_same_inputs(sc: Scenario, tmp: Path) -> Inputs:
    """Every adapter gives the same usage (to the bit), shares and streaks; returns them."""
    got = {name: f(sc, tmp / f"{k}") for k, (name, f) in enumerate(ADAPTERS.items())}
    first = got["local daemon"]
    assert first is not None
    for name, inputs in got.items():
        assert inputs is None or inputs == first, (name, inputs, first)
    return first


USERS, NAMES = ("ann", "bob", "cy"), ("train", "eval")
LOCAL_STATES = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY")


@st.composite
def scenarios(draw: st.DrawFn, all_ran: bool = False) -> Scenario:
    """`all_ran`: every ended job ran (the simulator replays only such jobs)."""
    now = 60 * DAY
    ends = sorted(draw(st.sets(st.integers(1, int(now) - 1), max_size=15)))
    ended = []
    for end in ends:
        ran = all_ran or draw(st.booleans())
        start = float(draw(st.integers(0, end))) if ran else None
        user, name, state = (draw(st.sampled_from(v)) for v in (USERS, NAMES, LOCAL_STATES))
        ended.append(Ended(user, name, state, draw(st.integers(1, 8)), start, float(end)))
    job = st.tuples(
        st.sampled_from(USERS), st.sampled_from(NAMES), st.integers(1, 8), st.integers(0, int(now))
    )
    running = tuple(Running(u, n, g, float(s)) for u, n, g, s in draw(st.lists(job, max_size=4)))
    pending = tuple(Pending(u, n, g, float(s)) for u, n, g, s in draw(st.lists(job, max_size=4)))
    return Scenario(tuple(ended), running, pending, now)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=scenarios())
def test_the_local_queue_and_the_slurm_sync_feed_a_policy_the_same_usage_shares_and_streaks(
    sc: Scenario, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert_same_inputs(sc, tmp_path_factory.mktemp("sc"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sc=scenarios(all_ran=True))
def test_the_simulator_the_local_queue_and_the_slurm_sync_build_the_same_snapshot_inputs(
    sc: Scenario, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert simulator_inputs(sc) is not None
    assert_same_inputs(sc, tmp_path_factory.mktemp("sc"))


def test_a_worked_history_gives_every_adapter_the_decayed_usage_and_the_held_streak(tmp_path: Path) -> None:
    """ann: a 2-GPU day ended a week ago and 4 GPUs running for a day; bob: three failures of `sweep`
    with a node failure among them, which neither extends nor breaks the streak; cy only waits."""
    now = 30 * DAY
    ended = (
        Ended("ann", "train", "COMPLETED", 2, now - 8 * DAY, now - 7 * DAY),
        Ended("bob", "sweep", "FAILED", 1, now - 5 * DAY, now - 5 * DAY + 60),
        Ended("bob", "sweep", "NODE_FAIL", 1, now - 4 * DAY, now - 4 * DAY + 60),
        Ended("bob", "sweep", "TIMEOUT", 1, now - 3 * DAY, now - 3 * DAY + 60),
        Ended("bob", "sweep", "FAILED", 1, now - 2 * DAY, now - 2 * DAY + 60),
        Ended("bob", "eval", "CANCELLED", 1, None, now - DAY),
    )
    sc = Scenario(
        ended,
        (Running("ann", "train", 4, now - DAY),),
        (
            Pending("bob", "sweep", 1, now - 60),
            Pending("cy", "train", 1, now - 30),
            Pending("bob", "eval", 1, now),
        ),
        now,
    )
    got = assert_same_inputs(sc, tmp_path)
    ann = 2 * (2 ** (-7 * DAY / H) - 2 ** (-8 * DAY / H)) * H / LN2 + 4 * (1 - 2 ** (-DAY / H)) * H / LN2
    assert got.usage["ann"] == pytest.approx(ann, abs=1e-3)
    assert got.usage["cy"] == 0.0 and set(got.shares.values()) == {1 / 3}
    assert got.fail_streak == [3, 0, 0]
