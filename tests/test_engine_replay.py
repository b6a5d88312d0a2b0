"""Every policy replays a mixed trace as recorded, with every state invariant checked after every event.

The trace has fractional, multi-node and time-limited jobs, classes, repeat failures and, under las,
preemption; a change to any policy's definition or to the simulator shows here as a changed digest.
"""

from __future__ import annotations

import hashlib
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from headway.policy import POLICIES
from headway.policy.placement import PLACEMENTS
from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.result import SimResult
from headway.sim.run import run_simulation
from test_engine_helpers import Daily, make_jobs


@dataclass
class UserMean:
    """Per-user rolling means; every retrain shifts runtimes so re-predicting the queue matters."""

    n: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ok: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rt_ok: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    rt_bad: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    retrains: int = 0
    daily: Daily = field(default_factory=Daily)

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        k = len(jobs)
        p, r, f = np.empty(k), np.empty(k), np.empty(k)
        for i, j in enumerate(jobs):
            u = j.user or ""
            n, ok = self.n[u], self.ok[u]
            p[i] = (ok + 1) / (n + 2)
            r[i] = (self.rt_ok[u] / ok if ok else 3600.0) * (1 + 0.25 * (self.retrains % 3))
            f[i] = self.rt_bad[u] / (n - ok) if n > ok else 600.0
        return Predictions(p, r, 2 * r, f)

    def observe_end(self, ended: EndedJob) -> None:
        u = ended.job.user or ""
        self.n[u] += 1
        if ended.state == "COMPLETED":
            self.ok[u] += 1
            self.rt_ok[u] += ended.runtime
        else:
            self.rt_bad[u] += ended.runtime

    def maybe_retrain(self, now: float) -> bool:
        if not self.daily.due(now):
            return False
        self.retrains += 1
        return True


class UserMeanScalar(UserMean):
    """The same predictor with the scalar path for one arrival (`api.ScalarPredictor`)."""

    def predict_one(self, job: SubmittedJob, now: float) -> tuple[float, float, float, float]:
        pr = self.predict([job], now)
        return (
            float(pr.p_success[0]),
            float(pr.runtime[0]),
            float(pr.runtime_p90[0]),
            float(pr.time_to_failure[0]),
        )


def mixed_rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(240)) if rng.random() < 0.8 else 0.0  # bursts: same-instant arrivals
        gpus = float(rng.choice([0.25, 0.5, 1, 1, 1, 2, 4, 8, 16]))
        rows.append(
            {
                "submit": t,
                "runtime": float(rng.lognormal(7.5, 1.5)),
                "gpus": gpus,
                "nodes": 2 if gpus > 8 else 1,
                "user": f"u{rng.integers(7)}",
                "name": f"n{rng.integers(4)}",
                "priority_class": str(rng.choice(["normal", "normal", "high", "low"])),
                "state": str(rng.choice(["COMPLETED", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"])),
                "time_limit": None if i % 3 else float(rng.lognormal(9, 1)),
            }
        )
    return rows


SPEC = ClusterSpec.from_flags(6, 8, 2)
TRACE_JOBS, TRACE_SEED, LOAD = 400, 11, 1.3
# Recorded with the engine before the shortcuts (las, multifactor, and fifo-skip, which is the old
# `fifo`: the same digests); fifo, sjf-oracle and qssf were re-recorded when they became strict (as
# the Helios simulator's) and impact when it settled on reservations for starved heads only;
# impact-oracle when it dropped the repeat-failure hold (told the truth, it has no use for one);
# las when its preemptions were applied in planning order, it passed when a job it had just started
# changed queue, a promoted job no longer ended its preemption loop and it kept victims it did not need,
# and again when a crossing a rounding error short of its threshold counted as made;
# multifactor when a GPU shared by fractional jobs got its sharers' end in reservations (it was never),
# and again when a share was charged to its node's slack, not to its whole free GPUs;
# the topology rows of fifo, fifo-skip and sjf-oracle when a gang no rack holds took as few racks as may
# be (tests/test_engine.py and tests/test_placement_topology.py have each case);
# las when a restart stopped during its restart penalty paid the whole penalty again at its next start
# (it used to carry the unpaid rest on top of a new one); impact and impact-oracle when high and urgent
# jobs got a tier of their own with strict reservations (this trace has `high` jobs) and running jobs'
# ends became survival-aware; las when the simulator began to pass again at the instant of a pass that
# preempted (its victims wait again, beside GPUs the preempting starts did not need, as on the local
# queue and Slurm).
# Regenerate only deliberately, when a policy's definition changes: `python tests/test_engine_replay.py`.
GOLDEN: dict[str, str] = {
    "fifo/first-fit": "d6c6c15cb905ccb3fa85",
    "fifo/topology": "40614ccf64d5a961a9a8",
    "fifo-skip/first-fit": "911c7cb89edaa72468c7",
    "fifo-skip/topology": "9a5141852d54a4fe85a0",
    "sjf-oracle/first-fit": "50a15d598b0d402b70c4",
    "sjf-oracle/topology": "5e7d02ce1bb2e53bafb5",
    "qssf/first-fit": "f21758664aa5349519d3",
    "qssf/topology": "293c7d7d7aaf1ecb4022",
    "las/first-fit": "83cc73c5be01fb2666bf",
    "las/topology": "4a64b07b8f011da894b5",
    "multifactor/first-fit": "d4baa50ad291b89a8362",
    "multifactor/topology": "629d33f72bf5f5055d0a",
    "impact/first-fit": "521922a32089ef796426",  # re-recorded: R is now the expected runtime (below)
    "impact/topology": "b6855880d9fce41e8fe5",
    "impact-oracle/first-fit": "a2502c4e1447d6913745",
    "impact-oracle/topology": "e7a5e99880fc6bfabcd9",
}


def digest(res: SimResult) -> str:
    """Per job: start, end, nodes and racks used, preemptions, restarts, first predictions; the timeline."""
    cols = ("job_id", "start", "end", "nodes_used", "racks_used", "preemptions", "restarts", "p_success")
    jobs = [res.jobs.column(c).to_pylist() for c in (*cols, "pred_runtime")]
    tl = [res.timeline.column(c).to_pylist() for c in res.timeline.column_names]
    return hashlib.sha256(repr((jobs, tl)).encode()).hexdigest()[:20]


def replay(
    policy: str,
    placement: str,
    options: dict[str, Any] | None = None,
    factory: type = UserMean,
) -> SimResult:
    return run_simulation(
        make_jobs(mixed_rows(TRACE_JOBS, TRACE_SEED)),
        SPEC,
        policy=policy,
        placement=placement,
        load=LOAD,
        predictor_factory=factory,
        engine_options=EngineOptions(validate=True),  # every invariant after every event
        policy_options=options,
    )


# impact's digests before its R became the expected runtime (runtime_estimate="mean"): the point estimate
# must still replay exactly as it did (topology re-recorded with the multi-rack change above; both with
# the urgent tier above).
IMPACT_POINT = {"first-fit": "6bfbc30b85911c84326d", "topology": "8f63c082a8c116b965fa"}


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_impact_on_the_point_runtime_replays_as_before(placement: str) -> None:
    res = replay("impact", placement, options={"runtime_estimate": "point"})
    assert digest(res) == IMPACT_POINT[placement]


CASES = [(p, pl) for p in POLICIES for pl in PLACEMENTS]


@pytest.mark.parametrize(("policy", "placement"), [c for c in CASES if f"{c[0]}/{c[1]}" in GOLDEN])
def test_replay_matches_the_digest_recorded_before_the_shortcuts(policy: str, placement: str) -> None:
    assert digest(replay(policy, placement)) == GOLDEN[f"{policy}/{placement}"]


@pytest.mark.parametrize("policy", ["impact", "qssf", "las"])
def test_a_predictors_scalar_path_gives_the_same_replay(policy: str) -> None:
    want = GOLDEN[f"{policy}/topology"]
    assert digest(replay(policy, "topology", factory=UserMeanScalar)) == want


if __name__ == "__main__":  # print the golden digests (run with the engine you trust)
    for policy, placement in CASES:
        print(f'    "{policy}/{placement}": "{digest(replay(policy, placement))}",', file=sys.stdout)
