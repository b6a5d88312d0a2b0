"""The simulator's shortcuts change its speed, never its results.

A pass over a short queue runs on plain lists, a queue of one job is ranked without scores, the
engine keeps rack totals and read-only column views alive between passes, and a single arrival is
predicted with scalar arithmetic. These tests replay a mixed trace (fractional, multi-node, time
limits, classes, repeat failures, preemption under las) both ways and with golden digests recorded
from the engine before the shortcuts existed.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from headway.policy import POLICIES, get_policy
from headway.policy import passes as passes_mod
from headway.policy import policies as policies_mod
from headway.policy.placement import PLACEMENTS
from headway.policy.snapshot import FULL_SHARE, ClusterView, PendingJobs, RunningJobs, Snapshot
from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.result import SimResult
from headway.sim.run import run_simulation
from test_engine_helpers import make_jobs


@dataclass
class UserMean:
    """Per-user rolling means; every retrain shifts runtimes so re-predicting the queue matters."""

    n: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ok: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rt_ok: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    rt_bad: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    retrains: int = 0

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
# be (tests/test_engine.py and tests/test_placement_topology.py have each case).
# Regenerate only deliberately, when a policy's definition changes: `python tests/test_engine_equivalence.py`.
GOLDEN: dict[str, str] = {
    "fifo/first-fit": "d6c6c15cb905ccb3fa85",
    "fifo/topology": "40614ccf64d5a961a9a8",
    "fifo-skip/first-fit": "911c7cb89edaa72468c7",
    "fifo-skip/topology": "9a5141852d54a4fe85a0",
    "sjf-oracle/first-fit": "50a15d598b0d402b70c4",
    "sjf-oracle/topology": "5e7d02ce1bb2e53bafb5",
    "qssf/first-fit": "f21758664aa5349519d3",
    "qssf/topology": "293c7d7d7aaf1ecb4022",
    "las/first-fit": "0dfaa19e3d61c3ada224",
    "las/topology": "c89050a3ffdba653ed16",
    "multifactor/first-fit": "d4baa50ad291b89a8362",
    "multifactor/topology": "629d33f72bf5f5055d0a",
    "impact/first-fit": "c3ebcaa4cefb3c9f62b4",  # re-recorded: R is now the expected runtime (below)
    "impact/topology": "184cd0e82d8d9a8d6b45",
    "impact-oracle/first-fit": "22e082620892dbab0402",
    "impact-oracle/topology": "5774c66b2ef6bdf50984",
}


def digest(res: SimResult) -> str:
    """Per job: start, end, nodes and racks used, preemptions, restarts, first predictions; the timeline."""
    cols = ("job_id", "start", "end", "nodes_used", "racks_used", "preemptions", "restarts", "p_success")
    jobs = [res.jobs.column(c).to_pylist() for c in (*cols, "pred_runtime")]
    tl = [res.timeline.column(c).to_pylist() for c in res.timeline.column_names]
    return hashlib.sha256(repr((jobs, tl)).encode()).hexdigest()[:20]


def _options(reference: bool) -> EngineOptions:
    opts = EngineOptions(validate=True)
    if reference:  # set only when asked, so this module also runs on an engine without the flag
        opts.reference = True
    return opts


def replay(
    policy: str,
    placement: str,
    reference: bool = False,
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
        engine_options=_options(reference),
        policy_options=options,
    )


# impact's digests before its R became the expected runtime (runtime_estimate="mean"): the point estimate
# must still replay exactly as it did (topology re-recorded with the multi-rack change above).
IMPACT_POINT = {"first-fit": "4003eafa3a1027076516", "topology": "cf5d8bb8888459531782"}


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


@pytest.mark.parametrize(("policy", "placement"), CASES)
def test_fast_paths_give_the_same_replay_as_the_reference_path(
    policy: str, placement: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = replay(policy, placement)
    _queue_limit(monkeypatch, 0)  # every pass on the vector path
    slow = replay(policy, placement, reference=True)
    assert fast.jobs.equals(slow.jobs) and fast.timeline.equals(slow.timeline)
    assert fast.passes == slow.passes


def _queue_limit(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Where the short-queue forms apply: the pass (passes.py) and impact's ranking (policies.py)."""
    monkeypatch.setattr(policies_mod, "SMALL_QUEUE", n)
    monkeypatch.setattr(passes_mod, "SMALL_QUEUE", n)


def _snapshot(rng: np.random.Generator, n_pending: int) -> Snapshot:
    nodes, gpn = 12, 8
    share = np.full((nodes, gpn), FULL_SHARE, dtype=np.int64)
    owner = np.full((nodes, gpn), -1, dtype=np.int64)
    rows: list[float] = []
    for nd in range(nodes):
        g = 0
        while g < gpn and rng.random() < 0.7:
            if rng.random() < 0.15:  # a shared GPU
                share[nd, g] = int(rng.integers(1, FULL_SHARE))
                owner[nd, g] = -2
                g += 1
                continue
            k = int(min(gpn - g, rng.choice([1, 2, 4])))
            share[nd, g : g + k] = 0
            owner[nd, g : g + k] = len(rows)
            rows.append(float(k))
            g += k
    now = 40 * 86400.0
    gpus = rng.choice([0.25, 0.5, 1, 1, 2, 4, 8, 16], size=n_pending).astype(np.float64)
    rt = rng.lognormal(8, 1.5, n_pending)
    pending = PendingJobs(
        key=np.arange(n_pending, dtype=np.int64),
        job_id=np.array([f"p{i}" for i in range(n_pending)], dtype=object),
        user=rng.integers(0, 5, n_pending),
        klass=rng.integers(0, 2, n_pending),
        submit=now - rng.exponential(20 * 86400, n_pending),  # some past max_wait: a starved head
        gpus=gpus,
        max_nodes=np.maximum(1, np.ceil(gpus / gpn)).astype(np.int64),
        time_limit=np.where(rng.random(n_pending) < 0.5, rt * 3, np.nan),
        p_success=rng.random(n_pending),
        runtime=rt,
        runtime_p90=np.where(rng.random(n_pending) < 0.2, np.nan, rt * rng.choice([0.5, 2.0], n_pending)),
        time_to_failure=rt / 4,
        attained=np.where(rng.random(n_pending) < 0.3, rng.exponential(20000, n_pending), 0.0),
        last_stop=now - rng.exponential(3600, n_pending),
        fail_streak=rng.integers(0, 4, n_pending),
        oracle_runtime=rt * rng.random(n_pending),
        oracle_success=np.random.default_rng(n_pending).random(n_pending) < 0.6,  # own stream
    )
    r_n = len(rows)
    rrt = rng.lognormal(8, 1.5, r_n)
    running = RunningJobs(
        key=np.arange(1000, 1000 + r_n, dtype=np.int64),
        job_id=np.array([f"r{i}" for i in range(r_n)], dtype=object),
        user=rng.integers(0, 5, r_n),
        klass=np.zeros(r_n, dtype=np.int64),
        gpus=np.array(rows),
        start=now - rng.exponential(3600, r_n),
        time_limit=np.where(rng.random(r_n) < 0.5, rrt * 3, np.nan),
        runtime=rrt,
        runtime_p90=rrt * 2,
        attained=rng.exponential(20000, r_n),
        preemptible=np.ones(r_n, dtype=bool),
    )
    free = (share == FULL_SHARE).sum(axis=1).astype(np.int64)
    rack = np.arange(nodes, dtype=np.int64) // 3
    rack_free = np.bincount(rack, weights=free, minlength=4).astype(np.int64)
    for a in (share, owner, free, rack_free):
        a.setflags(write=False)  # a policy must never write the caller's arrays
    view = ClusterView(share, free, owner, np.full(nodes, gpn, dtype=np.int64), rack, 4, rack_free)
    return Snapshot(
        now,
        7,
        pending,
        running,
        view,
        [f"u{i}" for i in range(5)],
        ["high", "normal"],
        rng.exponential(1e5, 5),
        np.full(5, 0.2),
    )


def _same(a: Any, b: Any) -> None:
    assert a.start == b.start and a.preempt == b.preempt
    assert a.reservation == b.reservation and a.wake_at == b.wake_at
    assert np.array_equal(a.ranking.order, b.ranking.order)
    assert np.array_equal(a.ranking.tier, b.ranking.tier)
    assert np.array_equal(a.ranking.score, b.ranking.score, equal_nan=True)
    fa, fb = a.ranking.factors, b.ranking.factors
    assert fa.keys() == fb.keys()
    for k in fa:
        assert np.array_equal(np.asarray(fa[k], dtype=float), np.asarray(fb[k], dtype=float), equal_nan=True)


@pytest.mark.parametrize("seed", range(12))
def test_a_short_queue_decides_as_the_vector_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    for n_pending in (1, 2, 3, 5, 9, 16):
        snap = _snapshot(rng, n_pending)
        no_totals = Snapshot(
            **{f: getattr(snap, f) for f in snap.__dataclass_fields__ if f != "cluster"},
            cluster=ClusterView(
                *[
                    getattr(snap.cluster, f)
                    for f in ("share", "free", "owner", "node_gpus", "rack", "n_racks")
                ]
            ),
        )
        one_class = Snapshot(
            **{f: getattr(snap, f) for f in snap.__dataclass_fields__ if f != "classes"}, classes=["normal"]
        )
        for name in POLICIES:
            for placement in PLACEMENTS:
                pol = get_policy(name, placement)
                for s in (snap, one_class):
                    _queue_limit(monkeypatch, 10**9)
                    small = pol.decide(s)
                    _queue_limit(monkeypatch, 0)
                    vector = pol.decide(s if s is one_class else no_totals)
                    _same(small, vector)


@pytest.mark.parametrize("name", ["impact", "impact-oracle"])
def test_wake_queue_asks_for_the_wake_up_wake_at_gives(name: str) -> None:
    """The simulator asks `wake_queue` between passes instead of building a snapshot for `wake_at`."""
    rng = np.random.default_rng(7)
    pol = get_policy(name)
    seen = set()
    for n_pending in (0, 1, 2, 5, 16, 17, 40):
        snap = _snapshot(rng, n_pending)
        p = snap.pending
        for classes in (snap.classes, ["normal"]):
            one = Snapshot(
                **{f: getattr(snap, f) for f in snap.__dataclass_fields__ if f != "classes"}, classes=classes
            )
            want = pol.wake_at(one)
            assert pol.wake_queue(one.now, p.submit, p.klass, classes) == want
            seen.add(want is None)
    assert seen == {True, False}  # both answers came up


def test_a_queue_of_one_is_ranked_without_scores_until_they_are_read() -> None:
    snap = _snapshot(np.random.default_rng(3), 1)
    calls: list[int] = []

    class Counting(policies_mod.Fifo):
        def scores(self, s: Snapshot) -> Any:
            calls.append(1)
            return super().scores(s)

    rk = Counting().rank(snap)
    assert calls == [] and rk.order.tolist() == [0]
    assert rk.reason(0).startswith("queued; score") and calls == [1]
    assert math.isclose(float(rk.score[0]), -float(snap.pending.submit[0]))


if __name__ == "__main__":  # print the golden digests (run with the engine you trust)
    for policy, placement in CASES:
        print(f'    "{policy}/{placement}": "{digest(replay(policy, placement))}",', file=sys.stdout)
