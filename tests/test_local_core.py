"""The local queue's pure state machine: events in, instructions out, invariants after every event."""

from __future__ import annotations

import random

import pytest

from headway.local.core import (
    Abandoned,
    CancelRequested,
    Claimed,
    Finished,
    JobState,
    Launch,
    LocalJob,
    Lost,
    Plan,
    QueueCore,
    QueueView,
    RankEntry,
    Record,
    Submitted,
    Terminate,
    Tick,
)
from headway.local.durations import format_elapsed, parse_duration
from headway.local.ordering import LocalPlanner


def _job(i: int, gpus: int = 1, t: float = 0.0, **kw: object) -> LocalJob:
    return LocalJob(
        id=i, user=str(kw.pop("user", "ann")), uid=1000, name=f"j{i}", gpus=gpus, submit_time=t, **kw
    )  # type: ignore[arg-type]


def _core(n_gpus: int = 2, policy: str = "fifo") -> QueueCore:
    return QueueCore(range(n_gpus), LocalPlanner(policy))


def _launches(step_instructions: list[object]) -> list[Launch]:
    return [i for i in step_instructions if isinstance(i, Launch)]


def test_a_tick_starts_jobs_in_submit_order_under_fifo_on_free_gpus_only() -> None:
    core = _core(2)
    core.handle(*(Submitted(_job(i, t=float(i))) for i in range(1, 5)))
    step = core.handle(Tick(10.0))
    core.validate()
    launches = _launches(step.instructions)
    assert [x.job_id for x in launches] == [1, 2]
    assert sorted(g for x in launches for g in x.gpu_ids) == [0, 1]
    assert core.jobs[3].state is JobState.PENDING and core.jobs[3].reason in ("Resources", "Priority")
    # Nothing frees up: another pass starts nothing.
    assert _launches(core.handle(Tick(11.0)).instructions) == []


def test_a_pending_job_the_policy_holds_shows_reason_held() -> None:
    def planner(view: QueueView) -> Plan:  # job 1 runs; 2 is next in line; 3 is held (repeat failures)
        ranking = (
            RankEntry(2, 1, 1.0, {}, "normal; score 1"),
            RankEntry(3, 2, 0.5, {}, "held (repeat failures); score 0.5"),
        )
        starts = ((1, (0,)),) if any(j.id == 1 for j in view.pending) else ()
        return Plan("impact", starts, ranking)

    core = QueueCore(range(1), planner)
    core.handle(*(Submitted(_job(i, t=float(i))) for i in range(1, 4)))
    core.handle(Tick(10.0))
    assert (core.jobs[2].reason, core.jobs[3].reason) == ("Resources", "Held")


def test_a_finished_job_frees_its_gpus_and_is_recorded_once() -> None:
    core = _core(1)
    core.handle(Submitted(_job(1)), Submitted(_job(2, t=1.0)))
    core.handle(Tick(2.0))
    core.handle(Claimed(1, 0, 2.5))
    assert core.jobs[1].state is JobState.RUNNING
    step = core.handle(Finished(1, 0, JobState.FAILED, 3, 2.5, 9.0))
    records = [i for i in step.instructions if isinstance(i, Record)]
    assert len(records) == 1 and records[0].job.state is JobState.FAILED and records[0].job.exit_code == 3
    assert core.state_of(1) is JobState.FAILED
    # The same end reported again (e.g. seen by a restarted daemon) changes nothing.
    again = core.handle(Finished(1, 0, JobState.FAILED, 3, 2.5, 9.0))
    assert again.instructions == [] and not again.changed
    assert [x.job_id for x in _launches(core.handle(Tick(10.0)).instructions)] == [2]
    core.validate()


def test_cancel_ends_a_pending_job_at_once_and_asks_a_running_one_to_stop() -> None:
    core = _core(1)
    core.handle(Submitted(_job(1)), Submitted(_job(2, t=1.0)))
    core.handle(Tick(2.0))
    step = core.handle(CancelRequested(2, 3.0))
    assert core.state_of(2) is JobState.CANCELLED
    assert any(isinstance(i, Record) for i in step.instructions)
    step = core.handle(CancelRequested(1, 3.0))
    assert step.instructions == [Terminate(1, 0)]
    assert core.jobs[1].cancel_requested
    core.handle(Finished(1, 0, JobState.CANCELLED, 143, 2.1, 3.5))
    assert core.state_of(1) is JobState.CANCELLED


def test_an_interrupted_launch_goes_back_to_the_queue_under_a_new_attempt() -> None:
    core = _core(1)
    core.handle(Submitted(_job(1)))
    core.handle(Tick(1.0))
    core.handle(Abandoned(1, 0))
    job = core.jobs[1]
    assert job.state is JobState.PENDING and job.attempt == 1 and job.gpu_ids == ()
    # A late report about attempt 0 is stale and ignored.
    core.handle(Claimed(1, 0, 1.5))
    assert core.jobs[1].state is JobState.PENDING
    launches = _launches(core.handle(Tick(2.0)).instructions)
    assert launches == [Launch(1, 1, (0,))]


def test_a_job_whose_supervisor_vanished_fails_instead_of_holding_gpus_forever() -> None:
    core = _core(1)
    core.handle(Submitted(_job(1)))
    core.handle(Tick(1.0), Claimed(1, 0, 1.0))
    core.handle(Lost(1, 0, 50.0))
    assert core.state_of(1) is JobState.FAILED
    assert core.free_gpu_ids() == (0,)


def test_after_waits_for_success_and_cancels_when_the_dependency_fails() -> None:
    core = _core(2)
    core.handle(Submitted(_job(1)), Submitted(_job(2, after=1)), Submitted(_job(3, after=1)))
    step = core.handle(Tick(1.0))
    assert [x.job_id for x in _launches(step.instructions)] == [1]
    assert core.jobs[2].reason == "Dependency"
    core.handle(Claimed(1, 0, 1.0), Finished(1, 0, JobState.COMPLETED, 0, 1.0, 2.0))
    assert {x.job_id for x in _launches(core.handle(Tick(3.0)).instructions)} == {2, 3}
    core2 = _core(2)
    core2.handle(Submitted(_job(1)), Submitted(_job(2, after=1)))
    core2.handle(Tick(1.0), Claimed(1, 0, 1.0), Finished(1, 0, JobState.TIMEOUT, 143, 1.0, 2.0))
    core2.handle(Tick(3.0))
    assert core2.state_of(2) is JobState.CANCELLED


def test_gang_jobs_get_all_their_gpus_at_once() -> None:
    core = _core(4, policy="fifo-skip")
    core.handle(
        Submitted(_job(1, gpus=3)), Submitted(_job(2, gpus=2, t=1.0)), Submitted(_job(3, gpus=1, t=2.0))
    )
    launches = _launches(core.handle(Tick(5.0)).instructions)
    got = {x.job_id: x.gpu_ids for x in launches}
    assert len(got[1]) == 3 and 2 not in got  # job 2 cannot fit on the one GPU left
    assert got.get(3) is not None and len(got[3]) == 1
    core.validate()


@pytest.mark.parametrize("policy", ["fifo", "impact"])
def test_random_event_streams_never_give_a_gpu_to_two_jobs_or_end_a_job_twice(policy: str) -> None:
    rng = random.Random(7)
    core = _core(4, policy)
    ended: dict[int, int] = {}
    next_id = 1
    now = 0.0
    for _ in range(1500):
        now += rng.random()
        r = rng.random()
        step = None
        if r < 0.25:
            core.handle(
                Submitted(_job(next_id, gpus=rng.choice([0, 1, 1, 2, 4]), t=now, user=rng.choice("ab")))
            )
            next_id += 1
        elif r < 0.45:
            step = core.handle(Tick(now))
        else:
            launched = [j for j in core.jobs.values() if j.state is not JobState.PENDING]
            if launched:
                j = rng.choice(launched)
                ev = rng.choice(
                    [
                        Claimed(j.id, j.attempt, now),
                        Finished(j.id, j.attempt, rng.choice(list(JobState)[3:]), 0, now - 1, now),
                        Abandoned(j.id, j.attempt),
                        Lost(j.id, j.attempt, now),
                        CancelRequested(j.id, now),
                        Finished(j.id, j.attempt - 1, JobState.COMPLETED, 0, now - 1, now),  # stale
                    ]
                )
                step = core.handle(ev)
            elif next_id > 1:
                step = core.handle(CancelRequested(rng.randrange(1, next_id), now))
        if step is not None:
            for ins in step.instructions:
                if isinstance(ins, Record):
                    ended[ins.job.id] = ended.get(ins.job.id, 0) + 1
        core.take_ended()
        core.validate()
    assert ended and all(n == 1 for n in ended.values())
    assert set(ended) == set(core.ended)


def test_time_limits_parse_the_way_slurm_users_write_them() -> None:
    assert parse_duration("2h") == 7200
    assert parse_duration("90m") == 5400
    assert parse_duration("30s") == 30
    assert parse_duration("01:30:00") == 5400
    assert parse_duration("1-12:00:00") == 36 * 3600
    assert parse_duration("45") == 45 * 60  # a bare number is minutes, as in sbatch --time
    assert parse_duration("5:30") == 330
    assert parse_duration("90:00") == 5400  # the first field may run over
    assert parse_duration("1-02") == 26 * 3600 and parse_duration("1-02:30") == 26 * 3600 + 1800
    for bad in ("", "abc", "1:2:3:4", "0", "-5", "1:99", "1:60:00", "1-2:75", "1-25:00:00", "1-24"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert format_elapsed(65) == "1:05"
    assert format_elapsed(3725) == "1:02:05"
    assert format_elapsed(90061) == "1-01:01:01"


def test_gpu_specs_give_logical_listed_or_detected_gpus() -> None:
    from headway.local.gpus import GpuSpecError, resolve_gpus

    assert resolve_gpus("4").ids == (0, 1, 2, 3)
    assert resolve_gpus("3,0,1").ids == (0, 1, 3)
    assert resolve_gpus("0").ids == ()
    assert resolve_gpus("3,").ids == (3,)  # one index alone
    for bad in ("two", "1,1", "-1,2", "", "1000000", "5,1000000"):
        with pytest.raises(GpuSpecError):
            resolve_gpus(bad)
    # Characters Python calls digits that int() refuses (a superscript two) were a traceback at start.
    for odd in ("\u00b2", "1,\u00b2"):
        with pytest.raises(GpuSpecError):
            resolve_gpus(odd)
    auto = resolve_gpus("auto")  # NVML where present; on a machine without a driver, none and a note why
    assert auto.source == "nvml" and (auto.ids or auto.note)


def test_the_daemon_log_names_the_gpus_nvml_found() -> None:
    from headway.local.daemon import _gpu_list

    assert _gpu_list((), ()) == "-"
    assert _gpu_list((0, 1), ("logical", "logical")) == "0,1"
    assert _gpu_list((0, 2, 3), ("NVIDIA H200", "NVIDIA H200", "NVIDIA A100")) == (
        "0,2,3 (1x NVIDIA A100, 2x NVIDIA H200)"
    )


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_history_says_which_zone_its_submit_times_are_in(berlin) -> None:  # type: ignore[no-untyped-def]
    from headway.commands.queue import local_stamps

    winter = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    header, cells = local_stamps([winter, winter + 60])
    assert header == "SUBMIT (CET)" and cells == ["11-14 23:13:20", "11-14 23:14:20"]
    summer = 1_690_000_000.0  # 2023-07-22 04:26:40 UTC: summer time, another zone name
    header, cells = local_stamps([winter, summer])
    assert header == "SUBMIT" and cells == ["11-14 23:13:20 CET", "07-22 06:26:40 CEST"]
    assert local_stamps([])[0].startswith("SUBMIT (")
