"""Impact's short-queue ranking on plain floats (`passes.impact_order`) against its numpy form.

The compiled build ranks queues of 2 to SMALL_QUEUE jobs with `impact_order`: the same float operations
in the same order as `Impact.scores` and the lexsort in `Policy.rank`, so order, tier and score must agree
to the last bit, also with NaN predictions and limits, zero usage, ties and starved or held jobs. The
function runs as plain Python here too, so both builds check it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.policy import policies as policies_mod
from headway.policy.policies import DAY, Impact
from headway.policy.snapshot import FULL_SHARE, ClusterView, PendingJobs, RunningJobs, Snapshot

NOW = 40 * DAY
# Values that stress the float rules: NaN (no prediction, no limit), zeros, infinities, exact ties.
RUNTIMES = st.sampled_from([math.nan, 0.0, 1.0, 59.5, 3600.0, 86400.0, 1e7, math.inf])
PROBS = st.sampled_from([math.nan, 0.0, 0.25, 0.5, 0.999, 1.0])
GPUS = st.sampled_from([0.0, 0.25, 1.0, 2.0, 8.0, 32.0])
SUBMITS = st.sampled_from([NOW, NOW - 3600.0, NOW - 8 * DAY, NOW - 31 * DAY, NOW - 90 * DAY])

JOB = st.tuples(
    PROBS, RUNTIMES, RUNTIMES, RUNTIMES, RUNTIMES, GPUS, SUBMITS, st.integers(0, 4), st.integers(0, 2)
)


def _snapshot(jobs: list[tuple], usage: list[float], classes: list[str]) -> Snapshot:
    n = len(jobs)
    cols = list(zip(*jobs, strict=True))
    ps, rt, p90, ttf, limit, gpus, submit, streak, user = (np.array(c) for c in cols)
    pending = PendingJobs(
        key=np.arange(n, dtype=np.int64)[::-1].copy(),  # keys break the last ties, not positions
        job_id=np.array([f"j{i}" for i in range(n)], dtype=object),
        user=user.astype(np.int64),
        klass=(np.arange(n) % len(classes)).astype(np.int64),
        submit=submit.astype(np.float64),
        gpus=gpus.astype(np.float64),
        max_nodes=np.ones(n, dtype=np.int64),
        time_limit=limit.astype(np.float64),
        p_success=ps.astype(np.float64),
        runtime=rt.astype(np.float64),
        runtime_p90=p90.astype(np.float64),
        time_to_failure=ttf.astype(np.float64),
        attained=np.zeros(n),
        last_stop=submit.astype(np.float64),
        fail_streak=streak.astype(np.int64),
    )
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    running = RunningJobs(
        empty_i,
        np.zeros(0, dtype=object),
        empty_i,
        empty_i,
        empty_f,
        empty_f,
        empty_f,
        empty_f,
        empty_f,
        empty_f,
        np.zeros(0, dtype=bool),
    )
    share = np.full((1, 8), FULL_SHARE, dtype=np.int64)
    view = ClusterView(
        share, np.array([8]), np.full((1, 8), -1), np.array([8]), np.zeros(1, dtype=np.int64), 1
    )
    u = np.array(usage, dtype=np.float64)
    return Snapshot(NOW, 1, pending, running, view, ["u0", "u1", "u2"], classes, u, np.full(3, 1 / 3))


@settings(max_examples=300, deadline=None)
# Zero and infinite runtimes are fed on purpose (no reader or predictor makes them: time limits are
# positive): numpy's divide-by-zero warnings there are the case under test, not a finding.
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@given(
    jobs=st.lists(JOB, min_size=2, max_size=16),
    usage=st.sampled_from([[0.0, 0.0, 0.0], [1.0, 0.0, 5e6], [3.3, 3.3, 3.3], [1e-9, 7.0, 2.5e5]]),
    classes=st.sampled_from([["normal"], ["normal", "high"], ["low", "normal", "urgent"]]),
    estimate=st.sampled_from(["mean", "point"]),
)
def test_impact_order_is_the_vector_ranking_to_the_last_bit(
    jobs: list[tuple], usage: list[float], classes: list[str], estimate: str
) -> None:
    pol = Impact(runtime_estimate=estimate)
    snap = _snapshot(jobs, usage, classes)
    order, tier, score = pol.order_on_floats(snap)
    want_tier, want_score, _ = pol.scores(snap)
    p = snap.pending
    want_order = np.lexsort((p.key, p.submit, -want_score, want_tier))
    assert np.array_equal(tier, want_tier)
    assert np.array_equal(score, want_score, equal_nan=True)
    # Every bit of every number (-0.0 too). Not a NaN's sign: C may commute `a + b` of two NaNs, and
    # x86 keeps the first operand's; a NaN score ranks last in its tier whatever its sign.
    num = ~np.isnan(want_score)
    assert np.array_equal(score[num].view(np.int64), want_score[num].view(np.int64))
    assert np.array_equal(order, want_order)


def test_the_ranking_of_a_short_queue_keeps_the_factors_the_vector_form_gives(monkeypatch) -> None:
    """The compiled build's ranking of a short queue computes the factors (read only to explain) from
    `scores` when asked; forced on here so that the plain-Python build checks it too."""
    monkeypatch.setattr(policies_mod, "_COMPILED", True)
    jobs = [(0.5, 3600.0, 7200.0, 60.0, math.nan, 1.0, NOW - 3600.0, 0, 0)] * 3
    jobs += [(0.9, 600.0, math.nan, 60.0, 900.0, 2.0, NOW - 31 * DAY, 3, 1)]
    snap = _snapshot(jobs, [1.0, 2.0, 0.0], ["normal", "high"])
    pol = Impact()
    ranking = pol.rank(snap)
    assert ranking._factors is None  # not computed until read
    tier, score, factors = pol.scores(snap)
    assert np.array_equal(ranking.tier, tier) and np.array_equal(ranking.score, score)
    assert ranking.factors.keys() == factors.keys()
    # the starved job; the class "high" one (positions alternate classes); the two left by key
    assert ranking.order.tolist() == [3, 1, 2, 0]
    monkeypatch.setattr(policies_mod, "_COMPILED", False)
    assert pol.short_order(snap) is None and pol.rank(snap).order.tolist() == ranking.order.tolist()
