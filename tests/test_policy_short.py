"""Queues of every length go through the one pass, and its length-dependent steps change no decision.

`Policy.decide` walks every queue the same way. Only how it gets there depends on the queue's length: a
queue of one defers its scores until something reads them, and a queue longer than `FILTER_AFTER` sizes
its requests once per distinct value and drops, in one vector step, the jobs the walk would skip. Forcing
those steps on for every queue, or off for every queue, must give the same Decision, also with NaN
predictions and limits, zero usage, ties, fractional, multi-node, starved and held jobs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy import POLICIES, get_policy
from headway.policy import base as base_mod
from headway.policy.base import gang_size_columns
from headway.policy.factors import DAY
from headway.policy.placement import gang_size
from headway.policy.snapshot import FULL_SHARE, ClusterView, Decision, PendingJobs, RunningJobs, Snapshot

NOW = 40 * DAY
# Values that stress the float rules: NaN (no prediction, no limit), zeros, infinities, exact ties.
RUNTIMES = st.sampled_from([math.nan, 0.0, 1.0, 59.5, 3600.0, 86400.0, 1e7, math.inf])
PROBS = st.sampled_from([math.nan, 0.0, 0.25, 0.5, 0.999, 1.0])
GPUS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 8.0, 12.0])
SUBMITS = st.sampled_from([NOW, NOW - 3600.0, NOW - 8 * DAY, NOW - 31 * DAY, NOW - 90 * DAY])

JOB = st.tuples(
    PROBS, RUNTIMES, RUNTIMES, RUNTIMES, RUNTIMES, GPUS, SUBMITS, st.integers(0, 4), st.integers(0, 2)
)


def _snapshot(jobs: list[tuple], usage: list[float], classes: list[str], busy: list[int]) -> Snapshot:
    """Pending `jobs` on nodes of 8 GPUs, node i with its first busy[i] GPUs held by running job i (a
    predicted hour left, so a reservation has a time)."""
    n = len(jobs)
    cols = list(zip(*jobs, strict=True))
    ps, rt, p90, ttf, limit, gpus, submit, streak, user = (np.array(c) for c in cols)
    gpus = gpus.astype(np.float64)
    pending = PendingJobs(
        key=np.arange(n, dtype=np.int64)[::-1].copy(),  # keys break the last ties, not positions
        job_id=np.array([f"j{i}" for i in range(n)], dtype=object),
        user=user.astype(np.int64),
        klass=(np.arange(n) % len(classes)).astype(np.int64),
        submit=submit.astype(np.float64),
        gpus=gpus,
        max_nodes=np.where(gpus > 8, 2, 1).astype(np.int64),
        time_limit=limit.astype(np.float64),
        p_success=ps.astype(np.float64),
        runtime=rt.astype(np.float64),
        runtime_p90=p90.astype(np.float64),
        time_to_failure=ttf.astype(np.float64),
        attained=np.zeros(n),
        last_stop=submit.astype(np.float64),
        fail_streak=streak.astype(np.int64),
        oracle_runtime=rt.astype(np.float64),
        oracle_success=ps > 0.5,
    )
    nodes = len(busy)
    share = np.full((nodes, 8), FULL_SHARE, dtype=np.int64)
    owner = np.full((nodes, 8), -1, dtype=np.int64)
    for nd, b in enumerate(busy):
        share[nd, :b], owner[nd, :b] = 0, nd
    r = nodes
    running = RunningJobs(
        key=np.arange(1000, 1000 + r, dtype=np.int64),
        job_id=np.array([f"r{i}" for i in range(r)], dtype=object),
        user=np.zeros(r, dtype=np.int64),
        klass=np.zeros(r, dtype=np.int64),
        gpus=np.array(busy, dtype=np.float64),
        start=np.full(r, NOW - 600.0),
        time_limit=np.full(r, math.nan),
        runtime=np.full(r, 3600.0),
        runtime_p90=np.full(r, 7200.0),
        attained=np.zeros(r),
        preemptible=np.ones(r, dtype=bool),
        p_success=np.full(r, math.nan),
        time_to_failure=np.full(r, math.nan),
        last_preempted=np.full(r, math.nan),
        checkpoint_every=np.full(r, math.nan),
        probe=np.zeros(r, dtype=bool),
    )
    free = (share == FULL_SHARE).sum(axis=1).astype(np.int64)
    view = ClusterView(share, free, owner, np.full(nodes, 8), np.arange(nodes, dtype=np.int64) // 2, 2)
    u = np.array(usage, dtype=np.float64)
    return Snapshot(NOW, 1, pending, running, view, ["u0", "u1", "u2"], classes, u, np.full(3, 1 / 3))


def _same(a: Decision, b: Decision) -> None:
    assert a == b  # starts with their GPUs, preemptions, reservation, wake-up
    assert a.ranking is not None and b.ranking is not None
    assert a.ranking.order.tolist() == b.ranking.order.tolist()


@settings(max_examples=150, deadline=None)
# Zero and infinite runtimes are fed on purpose (no reader or predictor makes them: time limits are
# positive): numpy's divide-by-zero warnings there are the case under test, not a finding.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@given(
    jobs=st.lists(JOB, min_size=1, max_size=40),
    usage=st.sampled_from([[0.0, 0.0, 0.0], [1.0, 0.0, 5e6], [3.3, 3.3, 3.3], [1e-9, 7.0, 2.5e5]]),
    classes=st.sampled_from([["normal"], ["normal", "high"], ["low", "normal", "urgent"]]),
    busy=st.lists(st.sampled_from([0, 2, 5, 8]), min_size=1, max_size=4),
)
def test_the_vector_steps_of_a_long_queue_decide_as_the_walk_alone(
    jobs: list[tuple], usage: list[float], classes: list[str], busy: list[int]
) -> None:
    snap = _snapshot(jobs, usage, classes, busy)
    for name in POLICIES:
        for knobs in [{}, {"reserve": "head"}] if name == "impact" else [{}]:
            pol = get_policy(name, **knobs)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(base_mod, "FILTER_AFTER", 0)
                vector = pol.decide(snap)
                mp.setattr(base_mod, "FILTER_AFTER", 10**9)
                _same(vector, pol.decide(snap))


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(JOB, min_size=2, max_size=16),
    usage=st.sampled_from([[0.0, 0.0, 0.0], [1.0, 0.0, 5e6], [1e-9, 7.0, 2.5e5]]),
    classes=st.sampled_from([["normal"], ["normal", "high"], ["low", "normal", "urgent"]]),
    estimate=st.sampled_from(["mean", "point"]),
)
def test_impact_ranks_by_tier_then_score_with_nan_scores_last_in_their_tier(
    jobs: list[tuple], usage: list[float], classes: list[str], estimate: str
) -> None:
    snap = _snapshot(jobs, usage, classes, [0])
    pol = get_policy("impact", runtime_estimate=estimate)
    ranking = pol.rank(snap)
    tier, score, p = ranking.tier.tolist(), ranking.score.tolist(), snap.pending
    submit, key = p.submit.tolist(), p.key.tolist()
    rank_of_tier = [0, 3, 4, 2, 1]  # starved, urgent (tier 4), probe (3), normal (1), held (2)
    want = sorted(
        range(len(p)),
        key=lambda i: (
            rank_of_tier[tier[i]],
            score[i] != score[i],
            0.0 if score[i] != score[i] else -score[i],
            submit[i],
            key[i],
        ),
    )
    assert ranking.order.tolist() == want
    deadline = p.submit + np.array([pol.max_wait_s[classes[k]] for k in p.klass.tolist()])
    assert [t == 0 for t in tier] == (deadline <= NOW).tolist()  # starved: past its class's max_wait
    urgent = np.array([classes[k] in ("high", "urgent") for k in p.klass.tolist()])
    held = (p.fail_streak >= pol.hold_after) & (deadline > NOW) & ~urgent  # a high/urgent job is never held
    assert [t == 2 for t in tier] == held.tolist()
    assert [t == 4 for t in tier] == ((deadline > NOW) & urgent).tolist()


def test_a_queue_of_one_computes_its_scores_only_when_read() -> None:
    snap = _snapshot(
        [(0.9, 600.0, math.nan, 60.0, 900.0, 2.0, NOW - 31 * DAY, 3, 1)], [1.0, 2.0, 0.0], ["normal"], [0]
    )
    pol = get_policy("qssf")
    dec = pol.decide(snap)
    assert [s.job_id for s in dec.start] == ["j0"]
    assert dec.ranking is not None and dec.ranking._factors is None  # not computed: nobody read them
    tier, score, factors = pol.scores(snap)
    assert dec.ranking.tier.tolist() == tier.tolist() and dec.ranking.score.tolist() == score.tolist()
    assert dec.ranking.factors.keys() == factors.keys()


def test_gang_sizes_of_a_column_are_gang_size_of_each_request() -> None:
    gpus = np.array(
        [0.0, math.nan, 1e-4, 0.0005, 0.25, 0.9995, 1.0, 1.0 + 1e-10, 1.5, 8.0, 16.0, -1.0, 0.25, 8.0]
    )
    whole, milli = gang_size_columns(gpus)
    assert list(zip(whole.tolist(), milli.tolist(), strict=True)) == [gang_size(g) for g in gpus.tolist()]
