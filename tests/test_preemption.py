"""Preemption in the scheduling core: which running jobs impact and multifactor-preempt stop for a waiting
high or urgent gang, and what a stopped job keeps when the simulator resumes it."""

from __future__ import annotations

from typing import Any

import pytest

from headway.policy import get_policy
from headway.policy.impact import CLASS_MIN_RUNTIME, CLASS_PREEMPT_WINDOW, Impact
from headway.policy.multifactor_preempt import MultifactorPreempt
from headway.policy.preempt import DEFAULT_RESTART_S
from headway.policy.snapshot import Decision
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.run import run_simulation
from test_engine_helpers import FixedPredictor, make_jobs
from test_policy import cluster, pending, running, snapshot

HOUR = 3600.0
NOW = 10 * HOUR
CLASSES = ("low", "normal", "urgent")
LOW, NORMAL, URGENT = 0, 1, 2


def full_nodes(*jobs_per_node: list[int], gpn: int = 8) -> Any:
    """A cluster with no free GPU: node n's GPUs held, in order, by running positions of jobs_per_node[n]
    (each listed once per GPU)."""
    owners = {(n, g): pos for n, held in enumerate(jobs_per_node) for g, pos in enumerate(held)}
    assert all(len(h) == gpn for h in jobs_per_node)
    return cluster([0] * len(jobs_per_node), gpn=gpn, owners=owners)


def urgent_gang(gpus: float = 8, **kw: Any) -> Any:
    return pending([{"id": "urgent", "gpus": gpus, "klass": URGENT, "submit": NOW - 60, **kw}])


def decide(policy: Any, rows: list[dict[str, Any]], view: Any, p: Any | None = None) -> Decision:
    snap = snapshot(
        p if p is not None else urgent_gang(), view=view, r=running(rows), now=NOW, classes=CLASSES
    )
    dec: Decision = policy.decide(snap)
    return dec


def started(dec: Decision) -> list[str]:
    return [s.job_id for s in dec.start]


# --- impact: which victims -------------------------------------------------------------------------------


def two_low_jobs(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    base = {"gpus": 8, "klass": LOW, "preemptible": True, "checkpoint_every": 600.0}
    return [{**base, **a}, {**base, **b}]


@pytest.mark.parametrize("cheap_first", [True, False])
def test_impact_stops_the_job_that_just_checkpointed_rather_than_one_about_to(cheap_first: bool) -> None:
    """Both have run past their minimum runtime; one saved 5 s ago, the other 590 s ago: stopping the
    first loses 5 s of work, the second 590 s."""
    just_saved = {"start": NOW - 1205}
    about_to_save = {"start": NOW - 1790}
    rows = two_low_jobs(just_saved, about_to_save) if cheap_first else two_low_jobs(about_to_save, just_saved)
    view = full_nodes([0] * 8, [1] * 8)
    dec = decide(Impact(), rows, view)
    cheap_key = 100 if cheap_first else 101
    assert dec.preempt == (cheap_key,)
    assert started(dec) == ["urgent"] and dec.start[0].preempts == (cheap_key,)


@pytest.mark.parametrize("likely_first", [True, False])
def test_impact_stops_the_job_least_likely_to_complete_given_how_long_it_ran(likely_first: bool) -> None:
    """The same chance at submit (0.5) and the same work since the last checkpoint; one completes in
    about a minute when it succeeds and fails after hours, so still running after 20 minutes it is
    probably failing; the other fails early, so surviving 20 minutes says it will likely complete."""
    failing = {"start": NOW - 1205, "p": 0.5, "R": 60.0, "F": 10 * HOUR}
    healthy = {"start": NOW - 1205, "p": 0.5, "R": 3 * HOUR, "F": 60.0}
    rows = two_low_jobs(healthy, failing) if likely_first else two_low_jobs(failing, healthy)
    dec = decide(Impact(), rows, full_nodes([0] * 8, [1] * 8))
    assert dec.preempt == ((101,) if likely_first else (100,))


@pytest.mark.parametrize(("klass", "name"), [(LOW, "low"), (NORMAL, "normal")])
def test_impact_never_stops_a_job_younger_than_its_class_minimum_runtime(klass: int, name: str) -> None:
    min_rt = CLASS_MIN_RUNTIME[name]
    row = {"gpus": 8, "klass": klass, "preemptible": True, "checkpoint_every": 60.0}
    young = decide(Impact(), [{**row, "start": NOW - (min_rt - 1)}], full_nodes([0] * 8))
    assert young.preempt == () and young.start == ()
    old = decide(Impact(), [{**row, "start": NOW - (min_rt + 1)}], full_nodes([0] * 8))
    assert old.preempt == (100,) and started(old) == ["urgent"]


def test_impact_does_not_stop_a_job_again_within_its_class_preemption_window() -> None:
    window = CLASS_PREEMPT_WINDOW["low"]
    row = {"gpus": 8, "klass": LOW, "preemptible": True, "start": NOW - 2 * HOUR}
    recent = decide(Impact(), [{**row, "last_preempted": NOW - (window - 1)}], full_nodes([0] * 8))
    assert recent.preempt == () and recent.start == ()
    long_ago = decide(Impact(), [{**row, "last_preempted": NOW - (window + 1)}], full_nodes([0] * 8))
    assert long_ago.preempt == (100,)


@pytest.mark.parametrize("policy", [Impact(), MultifactorPreempt()], ids=["impact", "multifactor-preempt"])
def test_a_job_that_is_not_preemptible_is_never_a_victim(policy: Any) -> None:
    """The cheapest job to stop is not preemptible: the gang takes the costlier preemptible one, and with
    no preemptible job at all it waits."""
    rows = two_low_jobs({"start": NOW - 1205, "preemptible": False}, {"start": NOW - 1790})
    view = full_nodes([0] * 8, [1] * 8)
    dec = decide(policy, rows, view)
    assert dec.preempt == (101,)
    none_ok = two_low_jobs({"start": NOW - 1205, "preemptible": False}, {"start": NOW, "preemptible": False})
    dec2 = decide(policy, none_ok, view)
    assert dec2.preempt == () and dec2.start == ()


def test_impact_without_preemption_stops_nothing() -> None:
    rows = two_low_jobs({"start": NOW - 1205}, {"start": NOW - 1790})
    dec = decide(Impact(preemption=False), rows, full_nodes([0] * 8, [1] * 8))
    assert dec.preempt == () and dec.start == ()
    assert dec.reservation is not None and dec.reservation.job_id == "urgent"


def test_only_a_preempting_class_preempts_and_only_lower_classes() -> None:
    """A normal job waits behind preemptible low jobs; an urgent one never stops another urgent job."""
    rows = two_low_jobs({"start": NOW - 1205}, {"start": NOW - 1790})
    normal = pending([{"id": "normal", "gpus": 8, "klass": NORMAL, "submit": NOW - 60}])
    for pol in (Impact(), MultifactorPreempt()):
        dec = decide(pol, rows, full_nodes([0] * 8, [1] * 8), p=normal)
        assert dec.preempt == () and dec.start == ()
        peers = [{**r, "klass": URGENT} for r in rows]
        dec2 = decide(pol, peers, full_nodes([0] * 8, [1] * 8))
        assert dec2.preempt == () and dec2.start == ()


# --- multifactor-preempt -------------------------------------------------------------------------------


def test_multifactor_preempt_stops_the_newest_lower_class_jobs_until_the_gang_fits() -> None:
    """Four 2-GPU jobs on one node, started one hour apart (positions 0 = oldest .. 3 = newest; the
    newest is urgent, a peer): a 4-GPU urgent gang stops the two newest lower-class ones, with no
    minimum runtime (Slurm's PreemptExemptTime is unset by default)."""
    rows = [
        {"gpus": 2, "klass": LOW, "preemptible": True, "start": NOW - 4 * HOUR},
        {"gpus": 2, "klass": NORMAL, "preemptible": True, "start": NOW - 3 * HOUR},
        {"gpus": 2, "klass": LOW, "preemptible": True, "start": NOW - 10},
        {"gpus": 2, "klass": URGENT, "preemptible": True, "start": NOW - 5},
    ]
    view = full_nodes([0, 0, 1, 1, 2, 2, 3, 3])
    dec = decide(MultifactorPreempt(), rows, view, p=urgent_gang(4))
    assert sorted(dec.preempt) == [101, 102]
    assert started(dec) == ["urgent"] and sorted(dec.start[0].preempts) == [101, 102]
    # Impact would keep the 10-second-old one (under the low class's minimum runtime) and stop the oldest.
    dec2 = decide(Impact(), rows, view, p=urgent_gang(4))
    assert sorted(dec2.preempt) == [100, 101]


def test_multifactor_preempt_ranks_a_higher_class_first() -> None:
    rows = [{"id": "low", "klass": LOW, "submit": 0.0}, {"id": "urgent", "klass": URGENT, "submit": NOW}]
    snap = snapshot(pending(rows), now=NOW, classes=CLASSES)
    rk = get_policy("multifactor-preempt").rank(snap)
    assert [str(snap.pending.job_id[i]) for i in rk.order] == ["urgent", "low"]


# --- in the simulator ----------------------------------------------------------------------------------

SPEC = ClusterSpec.from_flags(4, 8, 2)  # 4 nodes of 8 GPUs, 2 nodes a rack


def replay(rows: list[dict[str, Any]], policy: str, spec: ClusterSpec = SPEC, **opts: Any) -> dict[str, Any]:
    res = run_simulation(
        make_jobs(rows),
        spec,
        policy=policy,
        predictor_factory=lambda: FixedPredictor({}),
        engine_options=EngineOptions(validate=True),
        policy_options=opts or None,
    )
    return {r["job_id"]: r for r in res.jobs.to_pylist()}


def full_of_low_jobs() -> list[dict[str, Any]]:
    """32 preemptible 1-GPU low jobs fill the 4x8 cluster at t=0; a 16-GPU urgent gang comes at t=1000."""
    rows: list[dict[str, Any]] = [
        {
            "job_id": f"low{i}",
            "submit": 0,
            "runtime": 20_000,
            "gpus": 1.0,
            "priority_class": "low",
            "preemptible": True,
            "checkpoint_every": 600.0,
        }
        for i in range(32)
    ]
    rows.append(
        {"job_id": "urgent", "submit": 1000, "runtime": 3600, "gpus": 16.0, "priority_class": "urgent"}
    )
    return rows


def test_an_urgent_gang_on_a_full_cluster_starts_at_once_on_two_nodes_of_one_rack() -> None:
    jobs = replay(full_of_low_jobs(), "impact")
    u = jobs["urgent"]
    assert u["start"] == 1000.0
    assert u["nodes_used"] == 2 and u["racks_used"] == 1
    victims = [j for j in jobs.values() if j["preemptions"]]
    assert len(victims) == 16 and all(j["preemptions"] == 1 for j in victims)
    # Each victim had saved at 600 s: it redoes 400 s and pays the restart penalty once.
    assert all(j["lost_s"] == pytest.approx(400 + DEFAULT_RESTART_S) for j in victims)


def test_without_preemption_the_urgent_gang_waits_for_the_low_jobs_to_end() -> None:
    jobs = replay(full_of_low_jobs(), "impact", preemption=False)
    assert jobs["urgent"]["start"] == 20_000.0
    assert all(j["preemptions"] == 0 and j["lost_s"] == 0 for j in jobs.values())


def test_multifactor_preempt_also_starts_the_gang_at_once() -> None:
    jobs = replay(full_of_low_jobs(), "multifactor-preempt")
    assert jobs["urgent"]["start"] == 1000.0
    assert sum(j["preemptions"] for j in jobs.values()) == 16


def test_a_preempted_job_resumes_from_its_last_checkpoint() -> None:
    """Runtime 3600 s, a checkpoint every 600 s, stopped at 1000 s by an urgent job that runs 500 s: it
    keeps 600 s, redoes 400 s, pays the restart penalty, and ends exactly at 1500 + 30 + 3000."""
    rows: list[dict[str, Any]] = [
        {
            "job_id": "low",
            "submit": 0,
            "runtime": 3600,
            "gpus": 8.0,
            "priority_class": "low",
            "preemptible": True,
            "checkpoint_every": 600.0,
        },
        {"job_id": "urgent", "submit": 1000, "runtime": 500, "gpus": 8.0, "priority_class": "urgent"},
    ]
    jobs = replay(rows, "impact", ClusterSpec.from_flags(1, 8, 1))
    low, urgent = jobs["low"], jobs["urgent"]
    assert urgent["start"] == 1000.0 and urgent["end"] == 1500.0
    assert low["preemptions"] == 1 and low["restarts"] == 1
    assert low["start"] == 0.0  # the first start
    assert low["end"] == 1500.0 + DEFAULT_RESTART_S + (3600 - 600)
    assert low["lost_s"] == 400.0 + DEFAULT_RESTART_S
    assert low["held_s"] == 3600.0 + low["lost_s"]


# --- found by tests/test_preempt_properties.py ---------------------------------------------


def test_a_preemption_pass_never_starts_a_job_that_stops_nothing_past_a_starved_head() -> None:
    """Two 1-GPU nodes: node 0 free, node 1 held by a preemptible low job past its minimum runtime. A
    starved low job needs both GPUs (it has the head and the reservation); a high 1-GPU job behind it may
    only start by stopping something: never on the free GPU the starved head is waiting for."""
    r = running([{"gpus": 1, "klass": LOW, "preemptible": True, "start": NOW - 700}])
    view = cluster([1, 0], gpn=1, owners={(1, 0): 0})
    p = pending(
        [
            {"id": "starved", "gpus": 2, "max_nodes": 2, "klass": LOW, "submit": 0.0},
            {"id": "high", "gpus": 1, "klass": 3, "submit": NOW - 60},
        ]
    )
    classes = ("low", "normal", "urgent", "high")
    snap = snapshot(p, view=view, r=r, now=NOW, classes=classes)
    dec = Impact(max_wait_s={"low": HOUR, "high": 7 * 86400.0}).decide(snap)
    assert dec.reservation is not None and dec.reservation.job_id == "starved"
    assert all(s.preempts for s in dec.start), dec.start


def test_an_urgent_gang_starts_as_soon_as_a_victim_has_run_its_minimum_runtime() -> None:
    """A low job fills the node at t=0 for 20000 s; an urgent gang comes at t=100, when the low job is
    still under its 600 s minimum runtime: it should start at 600, not at 20000 when the low job ends."""
    rows: list[dict[str, Any]] = [
        {"job_id": "low", "submit": 0, "runtime": 20_000, "gpus": 8.0, "priority_class": "low"}
        | {"preemptible": True},
        {"job_id": "urgent", "submit": 100, "runtime": 100, "gpus": 8.0, "priority_class": "urgent"},
    ]
    jobs = replay(rows, "impact", ClusterSpec.from_flags(1, 8, 1))
    assert jobs["urgent"]["start"] == CLASS_MIN_RUNTIME["low"]


@pytest.mark.parametrize("policy", ["impact", "multifactor-preempt"])
def test_gpus_a_preempting_start_does_not_need_go_to_the_queue_at_the_same_instant(policy: str) -> None:
    """A low 16-GPU gang holds both nodes; a normal 8-GPU job waits; an urgent 8-GPU job stops the gang
    at t=1000 and takes one node. The other node goes to the waiting job then, not when the next event
    (the urgent job's end at 1100) comes: the simulator passes again after a pass that preempted."""
    rows: list[dict[str, Any]] = [
        {"job_id": "low", "submit": 0, "runtime": 20_000, "gpus": 16.0, "priority_class": "low"}
        | {"preemptible": True},
        {"job_id": "waiting", "submit": 10, "runtime": 100, "gpus": 8.0, "priority_class": "normal"},
        {"job_id": "urgent", "submit": 1000, "runtime": 100, "gpus": 8.0, "priority_class": "urgent"},
    ]
    jobs = replay(rows, policy, ClusterSpec.from_flags(2, 8, 1))
    assert jobs["urgent"]["start"] == 1000.0 and jobs["low"]["preemptions"] == 1
    assert jobs["waiting"]["start"] == 1000.0
