"""The event engine: ordering of same-instant events, truth hidden from policies, load, exclusions."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from headway.policy import POLICIES, get_policy
from headway.policy.policies import Fifo
from headway.policy.snapshot import Decision, PendingJobs, RunningJobs, Snapshot
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.metrics import compute
from headway.sim.result import JOB_COLUMNS, TIMELINE_COLUMNS
from headway.sim.run import CPU_ONLY, NEVER_RAN, TOO_BIG, run_simulation
from test_engine_helpers import FixedPredictor, MeanPredictor, make_jobs


def rows_random(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(300))
        out.append(
            {
                "submit": t,
                "runtime": float(rng.lognormal(7, 1.5)),
                "gpus": float(rng.choice([1, 1, 2, 4, 8, 16])),
                "user": f"u{rng.integers(4)}",
                "name": f"n{rng.integers(6)}",
                "state": str(rng.choice(["COMPLETED", "FAILED", "CANCELLED"])),
                "time_limit": None if i % 3 else 10**6,
            }
        )
    return out


SPEC = ClusterSpec.from_flags(4, 8, 2)


def by_id(res: Any) -> dict[str, dict[str, Any]]:
    return {r["job_id"]: r for r in res.jobs.to_pylist()}


def replay_small(
    rows: list[dict[str, Any]], spec: ClusterSpec, policy: str, **kw: Any
) -> dict[str, dict[str, Any]]:
    """A hand-made trace under one policy, every step validated; the jobs by id."""
    res = run_simulation(
        make_jobs(rows),
        spec,
        policy=policy,
        predictor_factory=MeanPredictor,
        engine_options=EngineOptions(validate=True),
        **kw,
    )
    return by_id(res)


def test_result_has_the_contract_columns_and_every_job_ends_in_its_recorded_state() -> None:
    t = make_jobs(rows_random(200, 1))
    for name in POLICIES:
        res = run_simulation(t, SPEC, policy=name, predictor_factory=MeanPredictor)
        assert tuple(res.jobs.column_names) == JOB_COLUMNS
        assert tuple(res.timeline.column_names) == TIMELINE_COLUMNS
        assert res.jobs.num_rows == 200 and res.policy == name
        j = res.jobs.to_pandas()
        assert j["start"].notna().all() and (j["start"] >= j["submit"] - 1e-9).all()
        assert j["state"].tolist() == t.column("state").to_pylist()
        served = j["end"] - j["start"]
        if name != "las":  # no preemption: a job runs exactly its recorded runtime
            assert np.allclose(served, j["runtime"])
        else:
            assert (served >= j["runtime"] - 1e-6).all()
        tl = res.timeline.to_pandas()
        assert (tl["busy_gpus"] <= SPEC.capacity_gpus + 1e-9).all()
        assert (np.diff(tl["t"]) >= 0).all()
        assert tl["completed_total"].iloc[-1] == (j["state"] == "COMPLETED").sum()


def test_same_seed_gives_the_same_result() -> None:
    t = make_jobs(rows_random(300, 2))
    for name in ("impact", "las", "multifactor"):
        a = run_simulation(t, SPEC, policy=name, seed=3, predictor_factory=MeanPredictor)
        b = run_simulation(t, SPEC, policy=name, seed=3, predictor_factory=MeanPredictor)
        assert a.jobs.equals(b.jobs) and a.timeline.equals(b.timeline)


def test_an_end_frees_its_gpus_for_an_arrival_at_the_same_instant() -> None:
    t = make_jobs([{"submit": 0, "runtime": 100, "gpus": 8}, {"submit": 100, "runtime": 10, "gpus": 8}])
    res = run_simulation(t, ClusterSpec.from_flags(1, 8), policy="fifo", predictor_factory=MeanPredictor)
    assert by_id(res)["j1"]["start"] == 100.0


def test_time_moves_by_events_not_ticks() -> None:
    # Two jobs a year apart cost a handful of events, not 31 million ticks.
    t = make_jobs([{"submit": 0, "runtime": 10}, {"submit": 365 * 86400, "runtime": 10}])
    res = run_simulation(t, SPEC, policy="fifo", predictor_factory=MeanPredictor)
    assert res.events <= 6 and by_id(res)["j1"]["start"] == 365 * 86400


def test_policies_never_see_true_runtime_or_outcome() -> None:
    seen: list[Snapshot] = []

    @dataclasses.dataclass(frozen=True)
    class Spy(Fifo):
        def decide(self, snap: Snapshot) -> Decision:
            seen.append(snap)
            return super().decide(snap)

    rows = rows_random(50, 3)
    t = make_jobs(rows)
    table = {f"j{i}": (0.5, 111.0, 22.0) for i in range(50)}
    import headway.sim.run as run_mod

    orig = run_mod.get_policy
    run_mod.get_policy = lambda *a, **k: Spy()  # type: ignore[assignment]
    try:
        run_simulation(t, SPEC, policy="fifo", predictor_factory=lambda: FixedPredictor(table))
    finally:
        run_mod.get_policy = orig
    assert seen
    truth = {round(r["runtime"], 6) for r in rows}
    for s in seen:
        assert s.pending.oracle_runtime is None
        for arr in (s.pending.runtime, s.pending.runtime_p90, s.running.runtime):
            assert not {round(float(x), 6) for x in arr} & truth
    names = {f.name for f in dataclasses.fields(PendingJobs)} | {
        f.name for f in dataclasses.fields(RunningJobs)
    }
    assert not names & {"state", "outcome", "end", "true_runtime", "exit_code"}


def test_oracle_policy_gets_the_true_runtimes() -> None:
    rows = [
        {"submit": 0, "runtime": 1000, "gpus": 8},
        {"submit": 1, "runtime": 500, "gpus": 8},
        {"submit": 2, "runtime": 10, "gpus": 8},
    ]
    res = run_simulation(
        make_jobs(rows), ClusterSpec.from_flags(1, 8), policy="sjf-oracle", predictor_factory=MeanPredictor
    )
    j = by_id(res)
    assert j["j2"]["start"] == 1000 and j["j1"]["start"] == 1010


def test_predictor_is_fed_causally_and_retrains_on_its_own_daily_clock() -> None:
    made: list[MeanPredictor] = []

    def factory() -> MeanPredictor:
        made.append(MeanPredictor())
        return made[-1]

    rows = [
        {"submit": i * 3600, "runtime": 1800, "state": "COMPLETED" if i % 2 else "FAILED"} for i in range(72)
    ]
    res = run_simulation(make_jobs(rows), SPEC, policy="impact", predictor_factory=factory)
    pred = made[0]
    assert len(pred.ended) == 72
    assert pred.retrains in (2, 3)  # simulated days 1 and 2 (and the end of day 3)
    p = res.jobs.column("p_success").to_numpy()
    assert p[0] == pytest.approx(0.5) and not np.isnan(p).any()
    assert p[-1] == pytest.approx((35 + 1) / (71 + 2))  # from the 71 jobs ended before it


def test_load_rescales_interarrival_times() -> None:
    rows = [{"submit": i * 1000, "runtime": 2000, "gpus": 4} for i in range(50)]
    t = make_jobs(rows)
    spec = ClusterSpec.from_flags(1, 8)
    res = run_simulation(t, spec, policy="fifo", predictor_factory=MeanPredictor)
    nat = res.natural_load
    assert nat == pytest.approx(50 * 4 * 2000 / (8 * 49 * 1000))
    res2 = run_simulation(t, spec, policy="fifo", load=2 * nat, predictor_factory=MeanPredictor)
    sub = res2.jobs.column("submit").to_numpy()
    assert res2.load == pytest.approx(2 * nat) and sub[-1] == pytest.approx(49 * 1000 / 2)
    with pytest.raises(ValueError, match="load"):
        run_simulation(t, spec, policy="fifo", load=-1, predictor_factory=MeanPredictor)


def test_too_big_never_ran_and_cpu_only_jobs_are_reported_not_dropped_silently() -> None:
    rows = [
        {"submit": 0, "gpus": 64, "job_id": "huge"},
        {"submit": 1, "gpus": 0, "job_id": "cpu"},
        {"submit": 2, "gpus": 1, "job_id": "ok"},
    ]
    recs = make_jobs(rows).to_pylist()
    recs.append({**recs[2], "job_id": "never", "start_time": None})
    t = pa.Table.from_pylist(recs, schema=make_jobs(rows).schema)
    res = run_simulation(t, SPEC, policy="fifo", predictor_factory=MeanPredictor)
    assert res.jobs.column("job_id").to_pylist() == ["ok"]
    assert res.excluded_counts == {TOO_BIG: 1, CPU_ONLY: 1, NEVER_RAN: 1}
    assert res.excluded[0].startswith("huge: needs 64 GPUs")
    res2 = run_simulation(t, SPEC, policy="fifo", include_cpu=True, predictor_factory=MeanPredictor)
    assert sorted(res2.jobs.column("job_id").to_pylist()) == ["cpu", "ok"]
    assert by_id(res2)["cpu"]["start"] == by_id(res2)["cpu"]["submit"]


def test_explain_records_each_pass_for_the_jobs_asked_about() -> None:
    rows = [
        {"submit": 0, "runtime": 1000, "gpus": 8},
        {"submit": 1, "runtime": 10, "gpus": 8},
        {"submit": 2, "runtime": 10, "gpus": 8},
    ]
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(1, 8),
        policy="multifactor",
        explain={"j2"},
        predictor_factory=MeanPredictor,
    )
    recs = res.explain["j2"]
    assert set(res.explain) == {"j2"} and recs
    assert recs[0].t == 2 and recs[0].of == 2 and recs[0].rank == 2
    assert "age=" in recs[0].reason and recs[-1].reason.endswith("started")


def test_fragmentation_counts_free_gpus_only_while_a_fitting_job_cannot_be_placed() -> None:
    # Two 4-GPU nodes reach free = [4, 3]; a 1-GPU job then goes to node 0 under first-fit (leaving
    # [3, 3]: a 4-GPU job fits the count but no node) and to node 1 under topology (leaving [4, 2]).
    rows = [
        {"submit": 0, "runtime": 10, "gpus": 4, "job_id": "a"},
        {"submit": 0, "runtime": 10_000, "gpus": 1, "job_id": "b"},
        {"submit": 30, "runtime": 10_000, "gpus": 1, "job_id": "d"},
        {"submit": 40, "runtime": 10, "gpus": 4, "job_id": "e"},
    ]
    spec = ClusterSpec.from_flags(2, 4)
    ff = run_simulation(
        make_jobs(rows), spec, policy="fifo", placement="first-fit", predictor_factory=MeanPredictor
    )
    topo = run_simulation(
        make_jobs(rows), spec, policy="fifo", placement="topology", predictor_factory=MeanPredictor
    )
    assert by_id(topo)["e"]["start"] == 40 and topo.timeline.column("frag_free_gpus").to_numpy().max() == 0
    assert by_id(ff)["e"]["start"] == 10_000
    tl = ff.timeline.to_pandas()
    waiting = tl[(tl["t"] >= 40) & (tl["t"] < 10_000)]
    assert len(waiting) and (waiting["frag_free_gpus"] == 6).all()


def test_las_preempts_and_restarts_with_a_penalty() -> None:
    rows = [
        {"submit": 0, "runtime": 100_000, "gpus": 8, "job_id": "hog"},
        {"submit": 50_000, "runtime": 100, "gpus": 8, "job_id": "small"},
    ]
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(1, 8),
        policy="las",
        predictor_factory=MeanPredictor,
        engine_options=EngineOptions(validate=True),
    )
    j = by_id(res)
    assert j["small"]["start"] == 50_000 and j["small"]["end"] == 50_100
    assert j["hog"]["preemptions"] == 1 and j["hog"]["restarts"] == 1
    assert j["hog"]["end"] == pytest.approx(100_000 + 100 + get_policy("las").restart_penalty_s)


def test_easy_backfill_never_delays_the_reservation_with_exact_time_limits() -> None:
    rng = np.random.default_rng(5)
    rows = []
    t = 0.0
    for _ in range(300):
        t += float(rng.exponential(120))
        rt = float(rng.integers(60, 5000))
        rows.append(
            {
                "submit": t,
                "runtime": rt,
                "time_limit": math.ceil(rt),
                "gpus": float(rng.choice([1, 2, 4, 8, 16, 24])),
                "user": "u",
            }
        )
    # One user, one partition: multifactor orders by age (+size), so the reservation holder is stable.
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(4, 8, 2),
        policy="multifactor",
        predictor_factory=MeanPredictor,
        engine_options=EngineOptions(log_decisions=True, validate=True),
    )
    start = {r["job_id"]: r["start"] for r in res.jobs.to_pylist()}
    first_promise: dict[str, float] = {}
    backfilled = 0
    for d in res.decisions:
        backfilled += sum(s.backfill for s in d.start)
        r = d.reservation
        if r is not None and math.isfinite(r.start):
            first_promise.setdefault(r.job_id, r.start)
            assert r.start <= first_promise[r.job_id] + 1e-6
    assert backfilled > 0 and first_promise
    for jid, promised in first_promise.items():
        assert start[jid] <= promised + 1e-6


def test_a_head_waiting_on_a_shared_gpu_gets_a_reservation_at_its_sharers_end() -> None:
    """A GPU shared by fractional jobs frees when its last sharer ends: the head's reservation is then,
    and a job that would run past it is not backfilled (the reservation was at infinity, so every job
    with a time limit backfilled past the head)."""
    rows = [
        {"submit": 0, "runtime": 1000, "gpus": 0.5, "time_limit": 1000, "job_id": "share"},
        {"submit": 1, "runtime": 100, "gpus": 2, "time_limit": 1000, "job_id": "head"},
        {"submit": 2, "runtime": 5000, "gpus": 1, "time_limit": 5000, "job_id": "long"},
    ]
    res = run_simulation(
        make_jobs(rows),
        ClusterSpec.from_flags(1, 2),
        policy="multifactor",
        predictor_factory=MeanPredictor,
        engine_options=EngineOptions(log_decisions=True, validate=True),
    )
    j = by_id(res)
    promised = [
        d.reservation.start for d in res.decisions if d.reservation and d.reservation.job_id == "head"
    ]
    assert promised and promised[0] == 1000
    assert j["head"]["start"] == 1000 and j["long"]["start"] == 1100


def test_a_starved_head_is_not_kept_waiting_by_a_stream_of_gpu_shares() -> None:
    """Fractional jobs keep arriving onto the head's node; once the head is past max_wait they may only
    use a GPU the head's plan does not count on, so it starts when the sharers then running end."""
    W = 1000.0
    rows = [{"submit": 1000.0 * i, "runtime": 2000, "gpus": 0.5, "job_id": f"s{i}"} for i in range(60)]
    rows.append({"submit": 1, "runtime": 100, "gpus": 2, "job_id": "head"})
    for placement in ("first-fit", "topology"):
        res = run_simulation(
            make_jobs(rows),
            ClusterSpec.from_flags(1, 2),
            policy="impact",
            placement=placement,
            predictor_factory=MeanPredictor,
            engine_options=EngineOptions(validate=True),
            policy_options={"max_wait_s": {"normal": W}},
        )
        wait = by_id(res)["head"]["start"] - 1
        assert wait <= W + 2000 + 1000, (placement, wait)  # max_wait + the sharers' runtime + one arrival gap


def test_las_never_puts_a_whole_gpu_job_on_a_gpu_a_share_was_planned_on() -> None:
    """The engine applies a preemption right before the start it makes room for: it preempted first,
    so a whole-GPU start planned before the preemption took the freed GPU that a share named."""
    rows = [
        {"submit": 0, "runtime": 100_000, "gpus": 1, "job_id": "V"},
        {"submit": 4000, "runtime": 100_000, "gpus": 1, "job_id": "W1"},
        {"submit": 4000, "runtime": 100_000, "gpus": 0.5, "job_id": "W2"},
    ]
    j = replay_small(rows, ClusterSpec.from_flags(1, 2), "las")
    assert j["V"]["preemptions"] == 1 and j["W1"]["start"] == 4000 and j["W2"]["start"] == 4000


def test_las_passes_when_a_job_started_in_the_pass_crosses_into_a_lower_queue() -> None:
    """W starts at 100 (A ended) and reaches 3,600 GPU-seconds at 550: X, waiting in the top queue,
    preempts it then, not when W ends."""
    rows = [
        {"submit": 0, "runtime": 100, "gpus": 8, "job_id": "A"},
        {"submit": 0, "runtime": 10_000, "gpus": 8, "job_id": "W"},
        {"submit": 0, "runtime": 100, "gpus": 8, "job_id": "X"},
    ]
    j = replay_small(rows, ClusterSpec.from_flags(1, 8), "las")
    assert j["X"]["start"] == 550 and j["X"]["end"] == 650
    assert j["W"]["end"] == pytest.approx(100 + 10_000 + 100 + get_policy("las").restart_penalty_s)


def test_las_a_promoted_job_does_not_stop_a_top_queue_job_behind_it_from_preempting() -> None:
    """P, waiting long enough, is promoted to the top of the order but cannot preempt (its own queue is
    low); F, fresh, comes after it in the order and may still preempt Q."""
    rows = [
        {"submit": 0, "runtime": 10_000, "gpus": 8, "job_id": "P"},
        {"submit": 460, "runtime": 100_000, "gpus": 8, "job_id": "Q"},
        {"submit": 4500, "runtime": 100, "gpus": 8, "job_id": "F"},
    ]
    j = replay_small(rows, ClusterSpec.from_flags(1, 8), "las")
    assert j["F"]["start"] == 4500 and j["F"]["end"] == 4600


def test_las_preempts_only_the_jobs_the_preemptor_needs() -> None:
    """Victims are taken lowest queue first until the job fits; one on another node that did not help
    (V1) is kept running."""
    rows = [
        {"submit": 0, "runtime": 100_000, "gpus": 1, "job_id": "X"},
        {"submit": 0, "runtime": 100_000, "gpus": 4, "job_id": "V2"},
        {"submit": 10, "runtime": 100_000, "gpus": 2, "job_id": "V1"},
        {"submit": 2000, "runtime": 1000, "gpus": 4, "job_id": "P"},
    ]
    j = replay_small(rows, ClusterSpec.from_flags(2, 4), "las")
    assert j["P"]["start"] == 2000
    assert j["V2"]["preemptions"] == 1 and j["V1"]["preemptions"] == 0 and j["X"]["preemptions"] == 0


def test_jobs_without_a_user_are_null_in_the_result_and_left_out_of_jain_fairness() -> None:
    """They share one fair-share account inside the run, but one known user beside them is not two
    users to compare (they were pooled as a user named "(unknown)", and Jain's index scored 0.86)."""
    rows = [
        {"submit": 0, "runtime": 100, "gpus": 8, "user": "alice", "job_id": "a"},
        {"submit": 0, "runtime": 100, "gpus": 8, "user": None, "job_id": "b"},
        {"submit": 0, "runtime": 100, "gpus": 8, "user": None, "job_id": "c"},
    ]
    res = run_simulation(
        make_jobs(rows), ClusterSpec.from_flags(1, 8), policy="fifo", predictor_factory=MeanPredictor
    )
    assert {r["job_id"]: r["user"] for r in res.jobs.to_pylist()} == {"a": "alice", "b": None, "c": None}
    assert compute(res)["jain_fairness"] is None


def test_las_demotes_a_job_whose_crossing_lands_a_rounding_error_short_of_the_threshold() -> None:
    """A (7 GPUs) crosses 1 GPU-hour at 99,991 + 3,600 / 7 s; recomputed at that instant its attained
    service is 3,599.99999999997 GPU-s. It still counted as queue 0, the next crossing rounded to now and
    no pass was asked for again: B waited for A's end, 2M s later."""
    rows = [
        {"submit": 0, "runtime": 1, "gpus": 1, "job_id": "Z"},
        {"submit": 99_991, "runtime": 2_000_000, "gpus": 7, "job_id": "A"},
        {"submit": 99_992, "runtime": 10, "gpus": 7, "job_id": "B"},
    ]
    j = replay_small(rows, ClusterSpec.from_counts([7, 1]), "las")
    assert j["B"]["start"] == pytest.approx(99_991 + 3600 / 7)


def test_a_share_on_a_node_the_reservation_does_not_need_is_backfilled() -> None:
    """H (4 GPUs) is planned on node 0 at 1,000 s; D (half a GPU, limit 5,000 s) fits beside C on node 1,
    which H never uses. Counting node 1's shared GPU against its whole free GPUs (none) refused D until
    C ended."""
    rows = [
        {"submit": 0, "runtime": 1000, "gpus": 4, "time_limit": 1000, "job_id": "A"},
        {"submit": 0, "runtime": 10_000, "gpus": 1, "time_limit": 10_000, "job_id": "B"},
        {"submit": 0, "runtime": 500, "gpus": 0.5, "time_limit": 500, "job_id": "C"},
        {"submit": 1, "runtime": 1000, "gpus": 4, "time_limit": 1000, "job_id": "H"},
        {"submit": 2, "runtime": 5000, "gpus": 0.5, "time_limit": 5000, "job_id": "D"},
    ]
    j = replay_small(rows, ClusterSpec.from_counts([4, 2]), "multifactor", placement="first-fit")
    assert j["D"]["start"] == 2 and j["H"]["start"] == 1000


@pytest.mark.parametrize("split", ["zero_length_job", "two_half_jobs"])
def test_users_with_the_same_usage_tie_on_fair_share_and_submit_order_decides(split: str) -> None:
    """Users a and b each use one GPU for the first 1000 s, a's hour cut at 500 s (a job that ends as it
    starts, or two back-to-back jobs); at 1000 s each asks for all 3 GPUs. Their fair share is equal,
    so the earlier key goes first, whatever the arithmetic path of each user's usage was."""
    if split == "zero_length_job":
        a = [
            {"job_id": "a1", "user": "a", "submit": 0, "runtime": 1000},
            {"job_id": "a2", "user": "a", "submit": 500, "runtime": 0, "state": "FAILED"},
        ]
    else:
        a = [
            {"job_id": "a1", "user": "a", "submit": 0, "runtime": 500},
            {"job_id": "a2", "user": "a", "submit": 500, "runtime": 500},
        ]
    rows = [
        *a,
        {"job_id": "b1", "user": "b", "submit": 0, "runtime": 1000},
        {"job_id": "x_a", "user": "a", "submit": 1000, "runtime": 100, "gpus": 3},
        {"job_id": "x_b", "user": "b", "submit": 1000, "runtime": 100, "gpus": 3},
    ]
    rows.sort(key=lambda r: float(r["submit"]))
    for policy in ("multifactor", "impact"):
        jobs = replay_small(rows, ClusterSpec.from_flags(1, 3, 1), policy)
        assert (jobs["x_a"]["start"], jobs["x_b"]["start"]) == (1000.0, 1100.0), policy
