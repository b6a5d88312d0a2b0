"""Each policy's ordering on tiny hand-made snapshots, and the shared decide loop's contract."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from headway.policy import POLICIES, get_policy
from headway.policy.policies import Impact, Las, Multifactor, fairshare, lognormal_mean
from headway.policy.snapshot import ClusterView, PendingJobs, RunningJobs, Snapshot

HOUR = 3600.0


def pending(rows: Sequence[dict[str, Any]], oracle: bool = False) -> PendingJobs:
    def col(name: str, default: Any, dtype: Any = np.float64) -> np.ndarray:
        return np.array([r.get(name, default) for r in rows], dtype=dtype)

    n = len(rows)
    return PendingJobs(
        key=np.arange(n, dtype=np.int64),
        job_id=np.array([r.get("id", f"j{i}") for i, r in enumerate(rows)], dtype=object),
        user=col("user", 0, np.int64),
        klass=col("klass", 0, np.int64),
        submit=col("submit", 0.0),
        gpus=col("gpus", 1.0),
        max_nodes=col("max_nodes", 1, np.int64),
        time_limit=col("time_limit", math.nan),
        p_success=col("p", 0.5),
        runtime=col("R", HOUR),
        runtime_p90=col("R", HOUR) * 2,
        time_to_failure=col("F", 600.0),
        attained=col("attained", 0.0),
        last_stop=col("last_stop", 0.0) if rows and "last_stop" in rows[0] else col("submit", 0.0),
        fail_streak=col("streak", 0, np.int64),
        oracle_runtime=col("true", HOUR) if oracle else None,
        oracle_success=col("ok", True, np.bool_) if oracle else None,
    )


def running(rows: Sequence[dict[str, Any]]) -> RunningJobs:
    def col(name: str, default: Any, dtype: Any = np.float64) -> np.ndarray:
        return np.array([r.get(name, default) for r in rows], dtype=dtype)

    n = len(rows)
    return RunningJobs(
        key=np.arange(100, 100 + n, dtype=np.int64),
        job_id=np.array([f"r{i}" for i in range(n)], dtype=object),
        user=col("user", 0, np.int64),
        klass=col("klass", 0, np.int64),
        gpus=col("gpus", 1.0),
        start=col("start", 0.0),
        time_limit=col("time_limit", math.nan),
        runtime=col("R", HOUR),
        runtime_p90=col("R", HOUR) * 2,
        attained=col("attained", 0.0),
        preemptible=col("preemptible", True, np.bool_),
        p_success=col("p", math.nan),
        time_to_failure=col("F", math.nan),
        last_preempted=col("last_preempted", math.nan),
        checkpoint_every=col("checkpoint_every", math.nan),
        probe=col("probe", False, np.bool_),
    )


def cluster(
    free: Sequence[int], gpn: int = 8, owners: dict[tuple[int, int], int] | None = None
) -> ClusterView:
    f = np.array(free, dtype=np.int64)
    share = np.where(np.arange(gpn)[None, :] < f[:, None], 1000, 0).astype(np.int64)
    owner = np.where(share == 1000, -1, -2).astype(np.int64)
    for (nd, gi), pos in (owners or {}).items():
        owner[nd, gi] = pos
    return ClusterView(share, f, owner, np.full(len(f), gpn, dtype=np.int64), np.zeros(len(f), np.int64), 1)


def snapshot(
    p: PendingJobs,
    free: Sequence[int] = (0,),
    *,
    now: float = 10 * HOUR,
    r: RunningJobs | None = None,
    usage: Sequence[float] = (0.0, 0.0, 0.0),
    classes: Sequence[str] = ("normal",),
    view: ClusterView | None = None,
) -> Snapshot:
    n_users = len(usage)
    return Snapshot(
        now=now,
        seq=7,
        pending=p,
        running=r if r is not None else running([]),
        cluster=view if view is not None else cluster(free),
        users=[f"u{i}" for i in range(n_users)],
        classes=list(classes),
        usage_or_fn=np.array(usage, dtype=np.float64),
        shares=np.full(n_users, 1.0 / n_users),
    )


def order_ids(policy: str, snap: Snapshot, **kw: Any) -> list[str]:
    rk = get_policy(policy, **kw).rank(snap)
    return [str(snap.pending.job_id[i]) for i in rk.order]


def test_fifo_orders_by_submit_time() -> None:
    s = snapshot(pending([{"id": "b", "submit": 20}, {"id": "a", "submit": 10}, {"id": "c", "submit": 30}]))
    assert order_ids("fifo", s) == ["a", "b", "c"]


def test_sjf_oracle_orders_by_true_runtime_and_needs_the_truth() -> None:
    rows = [{"id": "long", "true": 9 * HOUR, "R": 1}, {"id": "short", "true": 60, "R": 99 * HOUR}]
    assert order_ids("sjf-oracle", snapshot(pending(rows, oracle=True))) == ["short", "long"]
    with pytest.raises(ValueError, match="true runtimes"):
        get_policy("sjf-oracle").rank(snapshot(pending(rows)))
    assert "oracle" in POLICIES["sjf-oracle"].name and POLICIES["sjf-oracle"].oracle
    assert not any(c.oracle for n, c in POLICIES.items() if "oracle" not in n)


def test_qssf_orders_by_predicted_gpu_time() -> None:
    rows = [
        {"id": "big", "gpus": 8, "R": 1 * HOUR, "F": 1 * HOUR},  # 8 GPU-h
        {"id": "long", "gpus": 1, "R": 4 * HOUR, "F": 4 * HOUR},  # 4 GPU-h
        {"id": "tiny", "gpus": 2, "R": 0.5 * HOUR, "F": 0.5 * HOUR},  # 1 GPU-h
    ]
    assert order_ids("qssf", snapshot(pending(rows))) == ["tiny", "long", "big"]


def test_las_puts_less_attained_service_first_and_fifo_within_a_queue() -> None:
    rows = [
        {"id": "served", "attained": 5 * HOUR, "submit": 0, "last_stop": 9.9 * HOUR},
        {"id": "new2", "submit": 200},
        {"id": "new1", "submit": 100},
        {"id": "heavy", "attained": 50 * HOUR, "submit": 0, "last_stop": 9.9 * HOUR},
    ]
    assert order_ids("las", snapshot(pending(rows))) == ["new1", "new2", "served", "heavy"]


def test_las_promotes_a_job_that_waited_long_against_its_executed_time() -> None:
    rows = [
        {"id": "old", "attained": 2 * HOUR, "gpus": 1, "submit": 0, "last_stop": 0},
        {"id": "new", "submit": 5},
    ]
    # waited 10 h >= 8 x 2 h executed? no (16 h needed): stays in queue 1
    assert order_ids("las", snapshot(pending(rows), now=10 * HOUR)) == ["new", "old"]
    assert order_ids("las", snapshot(pending(rows), now=17 * HOUR)) == ["old", "new"]


def test_multifactor_weights_age_fairshare_and_size_like_slurm() -> None:
    mf = Multifactor()
    rows = [
        {"id": "heavy-user", "user": 0, "submit": 0},
        {"id": "light-user", "user": 1, "submit": 0},
    ]
    s = snapshot(pending(rows), usage=[100.0, 0.0, 0.0])
    assert order_ids("multifactor", s) == ["light-user", "heavy-user"]
    _tier, score, f = mf.scores(s)
    fs = fairshare(s)
    assert score[1] == pytest.approx(
        mf.w_age * f["age"][1] + mf.w_fairshare * fs[1] + mf.w_size * f["size"][1]
    )
    # Same user: the older job first (age), then the larger one (PriorityFavorSmall=NO).
    rows2 = [{"id": "young", "submit": 9 * HOUR}, {"id": "old", "submit": 0}]
    assert order_ids("multifactor", snapshot(pending(rows2))) == ["old", "young"]
    rows3 = [{"id": "small", "gpus": 1}, {"id": "big", "gpus": 8}]
    assert order_ids("multifactor", snapshot(pending(rows3), free=[8, 8])) == ["big", "small"]


def test_impact_is_smiths_rule_on_expected_successful_work() -> None:
    rows = [
        {"id": "likely-fail", "p": 0.1, "R": 1 * HOUR, "F": 0.5 * HOUR},
        {"id": "sure-short", "p": 0.9, "R": 1 * HOUR, "F": 0.5 * HOUR},
        {"id": "sure-long", "p": 0.9, "R": 10 * HOUR, "F": 0.5 * HOUR},
        {"id": "sure-short-8gpu", "p": 0.9, "R": 1 * HOUR, "F": 0.5 * HOUR, "gpus": 8},
    ]
    s = snapshot(pending(rows))
    # p / c: 0.9/0.95, 0.1/0.55, 0.9/(8 x 0.95), 0.9/9.05 (a likely failure is cheap, so it is not last)
    assert order_ids("impact", s) == ["sure-short", "likely-fail", "sure-short-8gpu", "sure-long"]
    _tier, score, f = Impact(runtime_estimate="point").scores(s)
    c = 1 * (0.9 * 1 + 0.1 * 0.5)
    assert score[1] == pytest.approx(0.9 / c) and f["c_gpu_h"][1] == pytest.approx(c)
    # "mean": R is the expected runtime: here p90 = 2 R, so R x exp(sigma^2 / 2), sigma = ln 2 / z90
    _tier, score, f = Impact(runtime_estimate="mean").scores(s)
    r_mean = math.exp(0.5 * (math.log(2) / 1.2815515655446004) ** 2)
    c = 1 * (0.9 * r_mean + 0.1 * 0.5)
    assert f["R_h"][1] == pytest.approx(r_mean) and score[1] == pytest.approx(0.9 / c)


def test_lognormal_mean_is_the_mean_of_the_runtimes_with_that_median_and_p90() -> None:
    rng = np.random.default_rng(0)
    draws = np.exp(rng.normal(np.log(600.0), 1.1, 2_000_000))
    med, p90 = np.quantile(draws, [0.5, 0.9])
    est = lognormal_mean(np.array([med]), np.array([p90]))[0]
    assert est == pytest.approx(draws.mean(), rel=0.01)
    # no spread (or p90 missing / below the median): the median itself; NaN stays NaN
    out = lognormal_mean(np.array([600.0, 600.0, 600.0, np.nan]), np.array([600.0, np.nan, 300.0, 900.0]))
    assert out[:3].tolist() == [600.0, 600.0, 600.0] and math.isnan(out[3])


def test_impact_puts_the_uncertain_job_behind_the_sure_one_of_the_same_typical_runtime() -> None:
    rows = [
        {"id": "wide", "p": 0.9, "R": HOUR, "F": 0.5 * HOUR},
        {"id": "narrow", "p": 0.9, "R": HOUR, "F": 0.5 * HOUR},
    ]
    pj = pending(rows)
    pj.runtime_p90[0] = 20 * HOUR  # same median, a long tail: a higher expected cost
    pj.runtime_p90[1] = 1.2 * HOUR
    assert order_ids("impact", snapshot(pj), runtime_estimate="mean") == ["narrow", "wide"]
    assert Impact(runtime_estimate="point").scores(snapshot(pj))[1].tolist() == [0.9 / 0.95] * 2


def test_impact_fairshare_and_class_weight_shift_the_order() -> None:
    rows = [{"id": "heavy", "user": 0}, {"id": "light", "user": 1}]
    assert order_ids("impact", snapshot(pending(rows), usage=[50.0, 1.0, 0.0])) == ["light", "heavy"]
    rows2 = [{"id": "normal", "klass": 0, "R": 1 * HOUR}, {"id": "urgent", "klass": 1, "R": 3 * HOUR}]
    s = snapshot(pending(rows2), classes=("normal", "urgent"))
    assert order_ids("impact", s) == ["urgent", "normal"]


def test_impact_starved_jobs_go_first_oldest_deadline_first_and_held_jobs_last() -> None:
    rows = [
        {"id": "great", "p": 0.99, "R": 60, "submit": 9 * HOUR},
        {"id": "starved-late", "p": 0.01, "R": 99 * HOUR, "submit": 0.5 * HOUR},
        {"id": "starved-early", "p": 0.01, "R": 99 * HOUR, "submit": 0},
        {"id": "repeat-failer", "p": 0.99, "R": 60, "submit": 9 * HOUR, "streak": 3},
        {"id": "ok", "p": 0.5, "R": HOUR, "submit": 9 * HOUR},
    ]
    s = snapshot(pending(rows), now=30 * HOUR)
    day = {"max_wait_s": {"normal": 24 * HOUR}}
    assert order_ids("impact", s, **day) == ["starved-early", "starved-late", "great", "ok", "repeat-failer"]
    rk = get_policy("impact", **day).rank(s)
    assert "starved" in rk.reason(2) and "held" in rk.reason(3)
    assert len(rk.reasons()) == 5


def test_held_job_still_runs_when_nothing_else_wants_the_gpus() -> None:
    rows = [{"id": "repeat-failer", "streak": 5}, {"id": "big", "gpus": 8, "p": 0.9}]
    dec = get_policy("impact").decide(snapshot(pending(rows), free=[8, 1]))
    assert sorted(s.job_id for s in dec.start) == ["big", "repeat-failer"]


def test_decide_returns_a_deterministic_id_and_places_gangs() -> None:
    rows = [{"id": "a", "gpus": 4}, {"id": "b", "gpus": 4}, {"id": "c", "gpus": 8, "submit": 5}]
    s = snapshot(pending(rows), free=[8, 4])
    d1 = get_policy("fifo").decide(s)
    d2 = get_policy("fifo").decide(s)
    assert d1.id == d2.id == "fifo-7" and d1 == d2
    assert [x.job_id for x in d1.start] == ["a", "b"]  # c (8 GPUs) cannot fit on what is left
    used = {}
    for st in d1.start:
        for nd, c in zip(st.alloc.nodes, st.alloc.counts, strict=True):
            used[nd] = used.get(nd, 0) + c
    assert all(used[n] <= [8, 4][n] for n in used)


def test_decide_does_not_mutate_the_snapshot() -> None:
    s = snapshot(pending([{"gpus": 2}, {"gpus": 3}]), free=[8])
    before = s.cluster.free.copy(), s.cluster.share.copy()
    for name in POLICIES:
        if POLICIES[name].oracle:
            continue
        get_policy(name).decide(s)
    assert (s.cluster.free == before[0]).all() and (s.cluster.share == before[1]).all()


def test_multifactor_reserves_for_the_head_and_backfills_only_what_ends_before() -> None:
    # Node 0 busy until t=now+1h (running job, limit 1 h); node 1 has 4 free GPUs.
    r = running([{"gpus": 8, "start": 10 * HOUR, "time_limit": HOUR}])
    view = cluster([0, 4], owners={(0, g): 0 for g in range(8)})
    rows = [
        {"id": "head", "gpus": 8, "submit": 0, "time_limit": 2 * HOUR},
        {"id": "short", "gpus": 4, "submit": 1, "time_limit": 0.5 * HOUR},
        {"id": "long", "gpus": 4, "submit": 2, "time_limit": 5 * HOUR},
    ]
    d = get_policy("multifactor").decide(snapshot(pending(rows), view=view, r=r))
    assert d.reservation is not None and d.reservation.job_id == "head"
    assert d.reservation.start == pytest.approx(11 * HOUR)
    assert [s.job_id for s in d.start] == ["short"] and d.start[0].backfill
    # A long job may still backfill where the reservation will not need the GPUs (node 1).
    rows2 = [rows[0], rows[2]]
    d2 = get_policy("multifactor").decide(snapshot(pending(rows2), view=view, r=r))
    assert [s.job_id for s in d2.start] == ["long"] and d2.start[0].alloc.nodes == (1,)


def test_impact_replans_the_reservation_when_a_running_job_slips() -> None:
    r = running([{"gpus": 8, "start": 0.0, "R": 2 * HOUR}])  # predicted end 2 h, p90 4 h
    view = cluster([0], owners={(0, g): 0 for g in range(8)})
    rows = [{"id": "head", "gpus": 8}]
    pol = get_policy("impact", reserve="head")  # classic EASY: a normal head holds a reservation too
    d1 = pol.decide(snapshot(pending(rows), view=view, r=r, now=1 * HOUR))
    d2 = pol.decide(snapshot(pending(rows), view=view, r=r, now=3 * HOUR))
    d3 = pol.decide(snapshot(pending(rows), view=view, r=r, now=5 * HOUR))
    assert d1.reservation and d1.reservation.start == pytest.approx(2 * HOUR)
    assert d2.reservation and d2.reservation.start == pytest.approx(4 * HOUR)
    assert d3.reservation and d3.reservation.start > 5 * HOUR


def test_a_starved_head_lets_only_jobs_whose_time_limit_ends_before_its_start_backfill() -> None:
    # One node, busy for 2 more hours (predicted); a starved 8-GPU head reserves it. Another node is
    # not there: every free GPU is one the head could use, so only hard-bounded short jobs may pass.
    r = running([{"gpus": 4, "start": 9 * HOUR, "R": 3 * HOUR}])
    view = cluster([4], owners={(0, g): 0 for g in range(4, 8)})
    rows = [
        {"id": "starved", "gpus": 8, "submit": 0},
        {"id": "short-limit", "gpus": 2, "submit": 9 * HOUR, "p": 0.99, "R": 60, "time_limit": 0.5 * HOUR},
        {"id": "no-limit", "gpus": 2, "submit": 9 * HOUR, "p": 0.99, "R": 60},
        {"id": "long-limit", "gpus": 2, "submit": 9 * HOUR, "p": 0.99, "R": 60, "time_limit": 9 * HOUR},
    ]
    day = {"max_wait_s": {"normal": 5 * HOUR}}
    d = get_policy("impact", **day).decide(snapshot(pending(rows), view=view, r=r))
    assert d.reservation is not None and d.reservation.job_id == "starved"
    assert d.reservation.start == pytest.approx(12 * HOUR)
    # A short predicted runtime is not enough: only the job bounded by its limit starts.
    assert [s.job_id for s in d.start] == ["short-limit"] and d.start[0].backfill


def test_las_preempts_a_lower_queue_job_for_a_new_one() -> None:
    r = running([{"gpus": 8, "start": 0.0, "attained": 20 * HOUR}])
    view = cluster([0], owners={(0, g): 0 for g in range(8)})
    d = Las().decide(snapshot(pending([{"id": "new", "gpus": 4}]), view=view, r=r, now=HOUR))
    assert d.preempt == (100,) and [s.job_id for s in d.start] == ["new"]
    # A job in the same queue is not preempted.
    r2 = running([{"gpus": 8, "start": 10 * HOUR - 60, "attained": 0.0}])
    d2 = Las().decide(snapshot(pending([{"id": "new", "gpus": 4}]), view=view, r=r2))
    assert d2.preempt == () and d2.start == ()


def test_every_policy_works_with_either_placement() -> None:
    s = snapshot(pending([{"gpus": 2}, {"gpus": 6}]), free=[8, 2])
    for name in POLICIES:
        if POLICIES[name].oracle:
            s2 = dataclasses.replace(s, pending=pending([{"gpus": 2}, {"gpus": 6}], oracle=True))
        else:
            s2 = s
        for how in ("first-fit", "topology"):
            d = get_policy(name, how).decide(s2)
            assert len(d.start) == 2
    assert get_policy("impact").placement == "topology"
    with pytest.raises(ValueError, match="placement"):
        get_policy("fifo", "scatter")
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("random")


def test_fifo_waits_for_its_head_and_fifo_skip_does_not() -> None:
    # 4 GPUs free: the 6-GPU head does not fit; a 2-GPU job behind it does.
    rows = [{"id": "big", "gpus": 6, "submit": 0}, {"id": "small", "gpus": 2, "submit": 1}]
    s = snapshot(pending(rows), free=[4])
    assert get_policy("fifo").decide(s).start == ()
    assert [x.job_id for x in get_policy("fifo-skip").decide(s).start] == ["small"]


def test_impact_reserves_only_for_a_starved_head_by_default() -> None:
    # One node, 4 GPUs free, 4 busy for 2 more hours. The best-ranked job needs 8 GPUs and has not
    # starved: by default it is skipped and the long job behind it starts; with classic EASY
    # (reserve="head") it holds a reservation and the long job, which would delay it, may not start.
    r = running([{"gpus": 4, "start": 0.0, "R": 3 * HOUR}])
    view = cluster([4], owners={(0, g): 0 for g in range(4, 8)})
    rows = [
        {"id": "head", "gpus": 8, "submit": 0, "p": 0.99, "R": 60},
        {"id": "long", "gpus": 4, "submit": 1, "p": 0.5, "R": 10 * HOUR},
    ]
    s = snapshot(pending(rows), view=view, r=r, now=HOUR)
    d = get_policy("impact").decide(s)
    assert d.reservation is None and [x.job_id for x in d.start] == ["long"]
    d2 = get_policy("impact", reserve="head").decide(s)
    assert d2.reservation is not None and d2.reservation.job_id == "head" and d2.start == ()
    with pytest.raises(ValueError, match="reserve"):
        get_policy("impact", reserve="sometimes")


def test_impact_oracle_ranks_by_the_true_outcome_and_runtime() -> None:
    # Predictions say "bad" is the better bet; the truth says it fails and "good" succeeds quickly.
    rows = [
        {"id": "bad", "p": 0.99, "R": 60, "true": 5 * HOUR, "ok": False},
        {"id": "good", "p": 0.1, "R": 10 * HOUR, "true": 60, "ok": True},
    ]
    assert order_ids("impact", snapshot(pending(rows, oracle=True))) == ["bad", "good"]
    assert order_ids("impact-oracle", snapshot(pending(rows, oracle=True))) == ["good", "bad"]
    with pytest.raises(ValueError, match="true runtimes"):
        get_policy("impact-oracle").rank(snapshot(pending(rows)))


def test_live_queues_refuse_oracle_policies_with_a_reason() -> None:
    from headway.policy import LIVE_POLICIES, live_policy_error

    assert live_policy_error("impact") is None and live_policy_error("fifo-skip") is None
    assert "oracle" in (live_policy_error("impact-oracle") or "")
    assert "unknown" in (live_policy_error("nope") or "")
    assert not any(POLICIES[n].oracle for n in LIVE_POLICIES)


def test_the_registry_is_the_one_list_the_commands_offer() -> None:
    """`simulate --policy` offers what policy/registry.py registers, in its order; an entry's name is its
    class's, and only an oracle says `oracle` in its name."""
    from headway.commands.simulate import ALL_POLICIES, DEFAULT_POLICIES
    from headway.policy import DEFAULT_COMPARISON, REGISTRY

    assert ALL_POLICIES == tuple(r.name for r in REGISTRY) == tuple(POLICIES)
    assert (
        DEFAULT_POLICIES.split(",")
        == list(DEFAULT_COMPARISON)
        == ["fifo", "multifactor", "qssf", "las", "impact"]
    )
    assert all(POLICIES[r.name] is r.cls and r.oracle == ("oracle" in r.name) for r in REGISTRY)
    assert not any(r.oracle for r in REGISTRY if r.compared_by_default)


def test_preemptive_and_wakes_say_what_each_registered_policy_does() -> None:
    """The engine reads `preemptive` (every pass may stop jobs) and `wakes` (wake_at may ask for a pass):
    a class says so exactly when it defines the hook."""
    from headway.policy import Policy

    for name, cls in POLICIES.items():
        assert get_policy(name).preemptive == (cls.preemptions is not Policy.preemptions), name
        assert cls.wakes == (cls.wake_at is not Policy.wake_at), name
    preemptive = [n for n in POLICIES if get_policy(n).preemptive]
    assert preemptive == ["las", "impact", "impact-oracle", "multifactor-preempt"]
    assert not get_policy("impact", preemption=False).preemptive  # --no-preemption
    assert [n for n, c in POLICIES.items() if c.wakes] == ["las", "impact", "impact-oracle"]
    s = snapshot(pending([{"gpus": 2}]), free=[8])
    for name in ("fifo", "fifo-skip", "multifactor", "qssf"):
        assert get_policy(name).wake_at(s) is None and get_policy(name).decide(s).wake_at is None


def test_a_new_policy_is_one_class() -> None:
    """What docs/policies.md asks of a new policy: a Policy subclass with `scores` (and its class
    variables); the pass, reservation and backfill come with the base class."""
    from headway.policy import Policy

    @dataclasses.dataclass(frozen=True)
    class Lifo(Policy):
        name = "lifo"
        mode = "easy"

        def scores(self, snap: Snapshot) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
            p = snap.pending
            return np.zeros(len(p), np.int64), p.submit, {}

    rows = [
        {"id": "old", "submit": 0, "gpus": 2},
        {"id": "big", "submit": 5, "gpus": 8},
        {"id": "new", "submit": 9},
    ]
    d = Lifo().decide(snapshot(pending(rows), free=[4]))
    assert d.ranking is not None and d.ranking.order.tolist() == [2, 1, 0]  # new, big, old
    # big does not fit and reserves (no known time: the other GPUs have no holder); old backfills
    assert d.reservation is not None and d.reservation.job_id == "big"
    assert [(s.job_id, s.backfill) for s in d.start] == [("new", False), ("old", True)]


def test_with_no_gpu_left_a_job_of_no_gpus_and_the_starved_head_are_still_found() -> None:
    rows = [{"id": "a", "gpus": 4}, {"id": "b", "gpus": 1}, {"id": "c", "gpus": 2}, {"id": "none", "gpus": 0}]
    d = get_policy("fifo-skip").decide(snapshot(pending(rows), free=[4]))
    assert [s.job_id for s in d.start] == ["a", "none"]
    # impact: the cluster fills, and the starved job behind the skipped ones holds the reservation
    r = running([{"gpus": 4, "start": 9 * HOUR, "R": 2 * HOUR}])
    view = cluster([4], owners={(0, g): 0 for g in range(4, 8)})
    rows2 = [
        {"id": "fits", "gpus": 4, "p": 0.99, "R": 60, "submit": 9 * HOUR},
        {"id": "skipped", "gpus": 2, "p": 0.9, "R": 60, "submit": 9 * HOUR},
        {"id": "starved", "gpus": 8, "p": 0.01, "R": 99 * HOUR, "submit": 0},
    ]
    d2 = get_policy("impact", max_wait_s={"normal": 5 * HOUR}).decide(
        snapshot(pending(rows2), view=view, r=r)
    )
    assert d2.reservation is not None and d2.reservation.job_id == "starved"
    assert [s.job_id for s in d2.start] == []  # the starved head ranks first: nothing passes it


def test_a_share_on_a_gpu_the_reservation_counts_on_takes_no_free_gpu_of_other_nodes() -> None:
    """A long-running share placed on a GPU that is partly shared now and free by the reservation costs
    that node one GPU of slack. It once also took one from the node's free GPUs it did not have (-1),
    which lowered the free total other long jobs could backfill on and made topology placement fail."""
    day = 86400.0
    now = 3 * day
    r = running(
        [
            {"gpus": 0.5, "start": now - HOUR, "time_limit": 2 * HOUR},  # shares node 0's GPU 0 for 1 h more
            {"gpus": 3, "start": now - HOUR, "time_limit": 2 * HOUR},  # holds node 0's GPUs 1-3 as long
        ]
    )
    share = np.array([[500, 0, 0, 0], [1000, -1, -1, -1], [1000, -1, -1, -1], [1000, -1, -1, -1]])
    owner = np.array([[-2, 1, 1, 1], [-1, -2, -2, -2], [-1, -2, -2, -2], [-1, -2, -2, -2]])
    view = ClusterView(
        share,
        np.array([0, 1, 1, 1]),
        owner,
        np.array([4, 1, 1, 1]),
        np.zeros(4, np.int64),
        1,
        frac_at={100: (0, 0)},
    )
    rows = [
        {"id": "head", "gpus": 3, "submit": 0.0},  # node 0, in an hour
        {"id": "share", "gpus": 0.5, "submit": 0.5 * day, "time_limit": 5 * HOUR},
        {"id": "pair", "gpus": 2, "max_nodes": 2, "submit": 2.5 * day, "time_limit": 5 * HOUR},
    ]
    for how in ("first-fit", "topology"):
        d = get_policy("multifactor", how).decide(snapshot(pending(rows), view=view, r=r, now=now))
        assert d.reservation is not None and d.reservation.nodes == (0,)
        assert [(s.job_id, s.alloc.nodes) for s in d.start] == [("share", (0,)), ("pair", (1, 2))]


def test_the_former_module_still_names_the_policies() -> None:
    from headway.policy import base, impact, policies

    assert policies.Impact is impact.Impact is POLICIES["impact"] and policies.Policy is base.Policy
