"""A policy that never reads predictions replays without the predictor, and decides exactly the same."""

from __future__ import annotations

import pytest

from headway.policy import POLICIES
from headway.policy.placement import PLACEMENTS
from headway.sim.cluster import ClusterSpec
from headway.sim.result import SimResult
from headway.sim.run import NoPredictor, run_simulation
from headway.sim.synth import generate
from test_engine_replay import UserMean
from test_engine_replay import replay as equivalence_replay

SCHEDULE = ("job_id", "start", "end", "nodes_used", "racks_used", "preemptions", "restarts")
BLIND = sorted(name for name, cls in POLICIES.items() if not cls.uses_predictions)


def schedule(res: SimResult) -> tuple[list[list[object]], list[list[object]]]:
    jobs = [res.jobs.column(c).to_pylist() for c in SCHEDULE]
    tl = [res.timeline.column(c).to_pylist() for c in res.timeline.column_names]
    return jobs, tl


def replay(policy: str, placement: str, factory: type) -> SimResult:
    """The equivalence tests' mixed 400-job replay (with their engine checks on) under `factory`."""
    return equivalence_replay(policy, placement, factory=factory)


def test_the_prediction_blind_policies_are_the_baselines() -> None:
    assert BLIND == [
        "fairshare",
        "fifo",
        "fifo-skip",
        "las",
        "multifactor",
        "multifactor-preempt",
        "sjf-oracle",
    ]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("policy", BLIND)
def test_a_blind_policy_schedules_the_same_with_or_without_predictions(policy: str, placement: str) -> None:
    assert schedule(replay(policy, placement, UserMean)) == schedule(replay(policy, placement, NoPredictor))


@pytest.mark.parametrize("policy", ["qssf", "impact"])
def test_the_same_trace_does_tell_apart_policies_that_read_predictions(policy: str) -> None:
    """So the comparison above could have failed: here the predictions change the schedule."""
    assert schedule(replay(policy, "first-fit", UserMean)) != schedule(
        replay(policy, "first-fit", NoPredictor)
    )


def test_by_default_only_policies_that_read_predictions_train_the_predictor() -> None:
    jobs = generate(400, seed=3)
    spec = ClusterSpec.from_flags(4, 8, 2)
    blind = run_simulation(jobs, spec, policy="multifactor", load=1.0)
    same = run_simulation(jobs, spec, policy="multifactor", load=1.0, predictor_factory=UserMean)
    assert schedule(blind) == schedule(same)
    assert blind.jobs.column("p_success").null_count == blind.jobs.num_rows  # it saw no predictions
    impact = run_simulation(jobs, spec, policy="impact", load=1.0)
    assert all(0.0 <= p <= 1.0 for p in impact.jobs.column("p_success").to_pylist())
