"""`fairshare`: the queue in order of the users' decayed usage over their share, then submit order.

It is the example that adding a policy is one module, one registry entry and these tests.
"""

from __future__ import annotations

from headway.policy import LIVE_POLICIES, POLICIES
from headway.policy.fairshare import FairShare
from headway.sim.engine import EngineOptions
from headway.sim.run import run_simulation
from test_engine_helpers import MeanPredictor, make_jobs
from test_engine_replay import SPEC, mixed_rows
from test_policy import order_ids, pending, snapshot


def test_the_user_who_used_least_goes_first_whatever_was_submitted_first_or_asks_for_more() -> None:
    rows = [
        {"id": "heavy-early", "user": 0, "submit": 0, "gpus": 1},
        {"id": "light-late-big", "user": 1, "submit": 500, "gpus": 8},
    ]
    s = snapshot(pending(rows), usage=[100.0, 0.0, 0.0])
    assert order_ids("fairshare", s) == ["light-late-big", "heavy-early"]
    assert order_ids("multifactor", s) == ["light-late-big", "heavy-early"]  # fair share dominates both
    assert order_ids("fifo", s) == ["heavy-early", "light-late-big"]


def test_equal_usage_goes_in_submit_order_with_no_weight_for_age_or_size() -> None:
    rows = [{"id": "b", "user": 0, "submit": 20, "gpus": 8}, {"id": "a", "user": 1, "submit": 10, "gpus": 1}]
    s = snapshot(pending(rows), usage=[5.0, 5.0, 0.0])
    assert order_ids("fairshare", s) == ["a", "b"]
    _tier, score, _f = FairShare().scores(s)
    assert score[0] == score[1]


def test_it_is_registered_for_replays_and_live_queues_and_replays_with_every_invariant_checked() -> None:
    assert POLICIES["fairshare"] is FairShare and "fairshare" in LIVE_POLICIES
    res = run_simulation(
        make_jobs(mixed_rows(200, 3)),
        SPEC,
        policy="fairshare",
        load=1.3,
        predictor_factory=MeanPredictor,
        engine_options=EngineOptions(validate=True),
    )
    assert res.jobs.num_rows == 200 and res.passes > 0
