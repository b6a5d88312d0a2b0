"""A queue of one job that fits skips the snapshot and the pass, and decides exactly as the pass would.

The engine places such a job through the policy's own placement (`Policy.place_one`, the index and
call `decide` uses) and asks `Policy.wake_one` for the wake-up `wake_at` would give; a job arriving
into an empty queue is not even queued when it starts at once. These tests replay seeded traces with
the shortcut on and off (`EngineOptions.single_fast`) and compare single passes directly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import pytest

from headway.policy import POLICIES, get_policy
from headway.policy import policies as policies_mod
from headway.policy.placement import PLACEMENTS, LiveIndex
from headway.policy.snapshot import ClusterView, Snapshot
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions, _single_fast
from headway.sim.result import SimResult
from headway.sim.run import run_simulation
from test_engine_equivalence import UserMean, _snapshot, mixed_rows
from test_engine_helpers import make_jobs

CASES = [(p, pl) for p in POLICIES for pl in PLACEMENTS]
# (jobs, seed, nodes, load, kind): a light load where most arrivals start at once, and queues that
# build; with classes; with one class and some CPU-only jobs (impact's wake-ups take another branch; a
# job without GPUs holds none); with many gangs over 2 and 3 nodes (a pass where nothing can be placed
# is skipped, and whether a gang can be spread decides it)
TRACES = [
    (300, 5, 12, 0.6, "mixed"),
    (300, 17, 6, 1.3, "mixed"),
    (300, 23, 8, 0.9, "one-class"),
    (300, 29, 9, 1.2, "gangs"),
]
Trace = tuple[int, int, int, float, str]


def _replay(policy: str, placement: str, trace: Trace, fast: bool) -> SimResult:
    n_jobs, seed, nodes, load, kind = trace
    rows = mixed_rows(n_jobs, seed)
    if kind == "one-class":
        rows = [
            {**r, "priority_class": "normal", "gpus": 0.0 if i % 17 == 0 else r["gpus"]}
            for i, r in enumerate(rows)
        ]
    elif kind == "gangs":
        size = [1.0, 4.0, 12.0, 16.0, 20.0, 24.0]
        rows = [
            {**r, "gpus": size[i % 6], "nodes": 1 if size[i % 6] <= 8 else (2 if size[i % 6] <= 16 else 3)}
            for i, r in enumerate(rows)
        ]
    return run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(nodes, 8, 3),
        policy=policy,
        placement=placement,
        load=load,
        predictor_factory=UserMean,
        engine_options=EngineOptions(validate=True, single_fast=fast),
        include_cpu=True,
    )


@pytest.mark.parametrize("trace", TRACES)
@pytest.mark.parametrize(("policy", "placement"), CASES)
def test_the_shortcut_replays_exactly_as_the_full_pass(policy: str, placement: str, trace: Trace) -> None:
    fast = _replay(policy, placement, trace, fast=True)
    full = _replay(policy, placement, trace, fast=False)
    assert fast.jobs.equals(full.jobs)
    assert fast.timeline.equals(full.timeline)
    assert (fast.passes, fast.events) == (full.passes, full.events)


def test_the_shortcut_is_taken_for_most_passes_at_light_load(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    decide = policies_mod.Policy.decide

    def counting(self: policies_mod.Policy, snap: Snapshot) -> Any:
        calls.append(len(snap.pending))
        return decide(self, snap)

    monkeypatch.setattr(policies_mod.Policy, "decide", counting)
    fast = _replay("impact", "topology", TRACES[0], fast=True)
    n_fast = len(calls)
    calls.clear()
    full = _replay("impact", "topology", TRACES[0], fast=False)
    assert len(calls) == full.passes == fast.passes
    assert n_fast < full.passes // 2  # most passes never built a snapshot


@pytest.mark.parametrize("seed", range(8))
def test_place_one_and_wake_one_are_what_decide_gives_a_queue_of_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(6):
        snap = _snapshot(rng, 1)
        v = snap.cluster
        live = LiveIndex(v.free, v.rack, v.n_racks)
        view = ClusterView(v.share, v.free, v.owner, v.node_gpus, v.rack, v.n_racks, v.rack_free, live)
        snap = Snapshot(
            **{f: getattr(snap, f) for f in snap.__dataclass_fields__ if f != "cluster"}, cluster=view
        )
        if rng.random() < 0.5:  # one priority class (impact's wake-ups take another branch)
            one = replace(snap.pending, klass=np.zeros(1, dtype=np.int64))
            snap = replace(snap, pending=one, classes=["normal"])
        p = snap.pending
        for name, cls in POLICIES.items():
            if not cls.single_fast:
                continue
            for placement in PLACEMENTS:
                pol = get_policy(name, placement)
                dec = pol.decide(snap)
                alloc = pol.place_one(view, float(p.gpus[0]), int(p.max_nodes[0]))
                if alloc is None:
                    assert not dec.start  # the engine runs the full pass then
                    continue
                assert [s.alloc for s in dec.start] == [alloc] and not dec.preempt
                wake = pol.wake_one(snap.now, float(p.submit[0]), int(p.klass[0]), snap.classes)
                assert wake == dec.wake_at


def test_a_preemptive_policy_or_an_unpaired_wake_at_keeps_the_full_pass() -> None:
    assert not _single_fast(get_policy("las"))
    assert all(_single_fast(get_policy(n)) for n, c in POLICIES.items() if c.single_fast)

    @dataclass(frozen=True)
    class Later(policies_mod.Impact):
        name: ClassVar[str] = "later"

        def wake_at(self, snap: Snapshot) -> float | None:
            return None

    assert not _single_fast(Later())
