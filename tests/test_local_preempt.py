"""Preemption in the local queue: the pure core's rules, the database migration, and a real daemon
stopping real processes (SIGTERM, the grace, SIGKILL) and requeuing them under the same id."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from headway.local.client import ClientError
from headway.local.core import (
    CancelRequested,
    Claimed,
    Finished,
    JobState,
    Launch,
    LocalJob,
    Lost,
    Plan,
    Preempt,
    Preempted,
    QueueCore,
    QueueView,
    Record,
    Requeued,
    Submitted,
    Tick,
)
from headway.local.db import StateDB
from headway.local.protocol import RequestError, Submit
from test_local_support import DaemonProc, cli, start_daemon, wait_until

__all__ = ["start_daemon"]


# ---------- the core (no I/O) ----------


def _job(i: int, **kw: Any) -> LocalJob:
    return LocalJob(id=i, user="ann", uid=1000, name=f"j{i}", gpus=1, submit_time=float(i), **kw)


def _preempting_planner(victim: int, for_job: int) -> Callable[[QueueView], Plan]:
    """A plan that asks to preempt `victim` for `for_job` while the victim runs, and otherwise starts the
    waiting job on the first free GPU, `for_job` first (the policy side is tested with the policies)."""

    def plan(view: QueueView) -> Plan:
        running = {j.id for j in view.running}
        pending = sorted(view.pending, key=lambda j: j.id != for_job)
        if victim in running and pending[0].id == for_job:
            return Plan("test", (), (), preempt=(victim,), waits_for_preempted={for_job: (victim,)})
        starts = ((pending[0].id, (view.free_gpu_ids[0],)),) if view.free_gpu_ids else ()
        return Plan("test", starts, ())

    return plan


def _running_core(victim: LocalJob, planner: Callable[[QueueView], Plan]) -> QueueCore:
    core = QueueCore(range(1), planner)
    core.handle(Submitted(victim))
    core.handle(Tick(10.0), Claimed(victim.id, 0, 10.0))
    assert core.jobs[victim.id].state is JobState.RUNNING
    return core


def test_a_preempted_job_is_requeued_with_the_same_id_and_its_next_attempt_and_is_not_an_end() -> None:
    core = _running_core(_job(1, preemptible=True, checkpoint_every=100.0), _preempting_planner(1, 2))
    core.handle(Submitted(_job(2, priority="high")))
    step = core.handle(Tick(20.0))
    core.validate()
    assert Preempt(1, 0) in step.instructions
    assert not [i for i in step.instructions if isinstance(i, Launch)]  # its GPU is not free yet
    assert core.jobs[1].preempt_requested and core.jobs[1].gpu_ids == (0,)
    step = core.handle(Preempted(1, 0, 143, 10.0, 260.0))
    core.validate()
    job = core.jobs[1]
    assert (job.state, job.attempt, job.preemptions, job.last_preempted) == (JobState.PENDING, 1, 1, 260.0)
    assert job.exit_code is None and job.start_time is None and job.gpu_ids == ()
    assert job.attained == 250.0 and job.progress == 200.0  # 250 s run, checkpoints every 100 s
    assert not [i for i in step.instructions if isinstance(i, Record)]  # nothing ended: no store row
    assert [type(i) for i in step.instructions] == [Requeued]
    assert core.state_of(1) is JobState.PENDING and 1 not in core.ended
    launches = [i for i in core.handle(Tick(261.0)).instructions if isinstance(i, Launch)]
    assert launches == [Launch(2, 0, (0,))]


def test_the_core_never_preempts_a_job_its_user_did_not_make_preemptible() -> None:
    core = _running_core(_job(1), _preempting_planner(1, 2))  # a policy such as las asks all the same
    core.handle(Submitted(_job(2, priority="urgent")))
    step = core.handle(Tick(20.0))
    assert not [i for i in step.instructions if isinstance(i, Preempt)]
    assert not core.jobs[1].preempt_requested


def test_a_start_whose_victims_are_not_all_preemptible_stops_none_of_them() -> None:
    def planner(view: QueueView) -> Plan:
        if len(view.running) == 2:
            return Plan("test", (), (), preempt=(1, 2), waits_for_preempted={3: (1, 2)})
        pairs = zip(view.pending, view.free_gpu_ids, strict=False)
        return Plan("test", tuple((j.id, (g,)) for j, g in pairs), ())

    core = QueueCore(range(2), planner)
    core.handle(Submitted(_job(1, preemptible=True)), Submitted(_job(2)))
    core.handle(Tick(1.0), Claimed(1, 0, 1.0), Claimed(2, 0, 1.0))
    core.handle(Submitted(LocalJob(3, "bob", 1001, "big", 2, 2.0, priority="urgent")))
    step = core.handle(Tick(3.0))
    assert not [i for i in step.instructions if isinstance(i, Preempt)]  # job 1 alone frees too little


def test_one_preemption_at_a_time_and_a_cancel_during_it_ends_the_job_cancelled() -> None:
    core = _running_core(_job(1, preemptible=True), _preempting_planner(1, 2))
    core.handle(Submitted(_job(2, priority="high")))
    assert Preempt(1, 0) in core.handle(Tick(20.0)).instructions
    # While job 1 is still stopping, the next pass asks again: nothing more is stopped.
    assert not [i for i in core.handle(Tick(21.0)).instructions if isinstance(i, Preempt)]
    core.handle(CancelRequested(1, 22.0))
    step = core.handle(Preempted(1, 0, 143, 10.0, 23.0))
    assert core.state_of(1) is JobState.CANCELLED
    assert [i.job.state for i in step.instructions if isinstance(i, Record)] == [JobState.CANCELLED]


def test_a_supervisor_lost_while_preempting_requeues_the_job_instead_of_failing_it() -> None:
    core = _running_core(_job(1, preemptible=True), _preempting_planner(1, 2))
    core.handle(Submitted(_job(2, priority="high")))
    core.handle(Tick(20.0))
    core.handle(Lost(1, 0, 30.0))
    assert core.jobs[1].state is JobState.PENDING and core.jobs[1].preemptions == 1
    assert core.free_gpu_ids() == (0,)


def test_a_probe_run_is_stopped_at_its_length_and_requeued_preemptible() -> None:
    def planner(view: QueueView) -> Plan:
        if not view.free_gpu_ids:
            return Plan("test", (), ())
        jid = view.pending[0].id
        return Plan("test", ((jid, (view.free_gpu_ids[0],)),), (), probes={jid: 60.0})

    core = QueueCore(range(1), planner)
    core.handle(Submitted(_job(1)))
    core.handle(Tick(0.0), Claimed(1, 0, 5.0))
    assert core.jobs[1].probe_s == 60.0 and core.next_probe_end() == 65.0
    assert not [i for i in core.handle(Tick(64.0)).instructions if isinstance(i, Preempt)]
    assert Preempt(1, 0) in core.handle(Tick(65.0)).instructions
    core.handle(Preempted(1, 0, 143, 5.0, 66.0))
    job = core.jobs[1]
    assert job.state is JobState.PENDING and job.preemptible and job.probe_s == 0.0
    # A run that ends on its own within its probe ends as any other.
    core.handle(Tick(70.0), Claimed(1, 1, 70.0), Finished(1, 1, JobState.COMPLETED, 0, 70.0, 80.0))
    assert core.state_of(1) is JobState.COMPLETED


# ---------- the request and the database ----------


def _submit(**kw: Any) -> dict[str, Any]:
    return {"argv": ["true"], "cwd": "/", **kw}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checkpoint_every", -5),
        ("checkpoint_every", 0),
        ("checkpoint_every", math.nan),
        ("checkpoint_every", math.inf),
        ("checkpoint_every", 1e30),
        ("checkpoint_every", "600"),
        ("checkpoint_every", True),
        ("preemptible", "yes"),
        ("preemptible", 1),
    ],
)
def test_hostile_preemption_fields_are_refused_at_the_edge(field: str, value: object) -> None:
    with pytest.raises(RequestError, match=field):
        Submit.from_wire(_submit(**{field: value}))


def test_a_submit_names_no_job_but_its_own() -> None:
    """Preemptibility is set once, by the job's own submit: no field names another job to mark."""
    with pytest.raises(RequestError, match="unknown field 'id'"):
        Submit.from_wire(_submit(preemptible=True, id=7))
    req = Submit.from_wire(_submit(preemptible=True, checkpoint_every=600))
    assert (req.preemptible, req.checkpoint_every) == (True, 600.0)


def test_an_older_queue_database_gains_the_preemption_columns_and_its_jobs_load_as_before(
    tmp_path: Path,
) -> None:
    from headway.local import db as dbmod

    path = tmp_path / "queue.sqlite"
    con = sqlite3.connect(path)
    con.executescript(dbmod._SCHEMA)  # the jobs table as the first release made it
    con.execute(
        "INSERT INTO jobs (user, uid, gid, name, argv, cwd, env, gpus, priority, submit_time, state) "
        "VALUES ('ann', 1000, 1000, 'old', '[\"true\"]', '/', '{}', 1, 'normal', 1.0, 'PENDING')"
    )
    con.commit()
    assert "preemptible" not in {r[1] for r in con.execute("PRAGMA table_info(jobs)")}
    con.close()
    db = StateDB(path)
    try:
        (job,) = db.load_active()
        assert (job.preemptible, job.checkpoint_every, job.preemptions, job.attained) == (False, None, 0, 0.0)
        job.preemptions, job.last_preempted = 2, 5.0
        with db.transaction():
            db.save([job])
        assert (db.load_active()[0].preemptions, db.load_active()[0].last_preempted) == (2, 5.0)
    finally:
        db.close()


# ---------- a real daemon, real processes ----------

# A job that checkpoints on SIGTERM: it writes a marker and exits; run again, it finds the marker and
# finishes (resumes). `ready` says its handler is in place.
TRAPS_TERM = textwrap.dedent(
    """
    import os, signal, sys, time
    mark, ready = sys.argv[1], sys.argv[2]
    if os.path.exists(mark):
        print("resumed from", open(mark).read())
        sys.exit(0)
    def term(signum, frame):
        with open(mark, "w") as f:
            f.write(f"TERM {time.time()} attempt of job {os.environ['HEADWAY_JOB_ID']}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    open(ready, "w").close()
    while True:
        time.sleep(0.05)
    """
)

# A job that ignores SIGTERM: the grace passes and SIGKILL ends it. Run again, it finishes.
IGNORES_TERM = textwrap.dedent(
    """
    import os, signal, sys, time
    pids = sys.argv[1]
    first = not os.path.exists(pids)
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
    if not first:
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)
    """
)


def _jobs(d: DaemonProc) -> dict[int, dict[str, Any]]:
    listed = d.ask({"op": "queue", "all": True})["jobs"]
    return {int(j["id"]): j for j in listed}


def _state(d: DaemonProc, jid: int) -> str:
    return str(_jobs(d).get(jid, {}).get("state"))


def _events(d: DaemonProc, jid: int) -> list[tuple[float, str, str]]:
    con = sqlite3.connect(f"file:{d.state_dir / 'queue.sqlite'}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT time, kind, detail FROM events WHERE job_id = ? ORDER BY seq", (jid,))
        return [(float(t), str(k), str(x)) for t, k, x in rows]
    finally:
        con.close()


def test_a_high_class_job_preempts_a_preemptible_low_one_which_gets_sigterm_and_runs_again_as_attempt_2(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon("--policy", "multifactor-preempt", "--preempt-grace", "5", gpus="1")
    mark, ready = tmp_path / "checkpoint", tmp_path / "ready"
    sub = cli(
        "submit", "--json", "--gpus", "1", "--priority", "low", "--preemptible", "--checkpoint-every",
        "600", "--name", "victim", "--", sys.executable, "-c", TRAPS_TERM, str(mark), str(ready),
        state_dir=d.state_dir,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    low = json.loads(sub.stdout)["id"]
    wait_until(ready.exists, 20, "the low job to run with its SIGTERM handler")
    # The job's process may be up before its supervisor's report of the start reaches the daemon.
    wait_until(lambda: _jobs(d)[low].get("start_time") is not None, 20, "the daemon to record the start")
    shown = _jobs(d)[low]
    assert (shown["preemptible"], shown["checkpoint_every"], shown["attempt"]) == (True, 600, 1)
    why = d.ask({"op": "why", "id": low})
    said = why["explanation"]
    assert any(line.startswith("has run ") for line in said), said
    assert any(line.startswith("P(complete | ran ") and "expected remaining" in line for line in said), said
    assert any(line.startswith("preemptible: ") for line in said), said

    high = d.submit([sys.executable, "-c", "import time; time.sleep(0.3)"], priority="high", name="urgent")
    wait_until(lambda: _state(d, high) == "COMPLETED", 30, "the high job to preempt and complete")
    wait_until(lambda: _state(d, low) == "COMPLETED", 30, "the preempted job to run again and complete")

    assert mark.read_text().startswith("TERM ")  # the first run got SIGTERM (and checkpointed)
    jobs = _jobs(d)
    assert (jobs[low]["attempt"], jobs[low]["preemptions"], jobs[low]["exit_code"]) == (2, 1, 0)
    assert jobs[low]["last_preempted"] is not None and jobs[high]["attempt"] == 1
    out = cli("logs", str(low), state_dir=d.state_dir)
    assert "resumed from TERM" in out.stdout  # the second run found the first run's checkpoint
    # The high job started only once the low job's first run was gone (its GPU was free), and the low
    # job's second run after the high job ended: never two jobs on the one GPU.
    kinds = [(k, x) for _, k, x in _events(d, low)]
    assert ("preempt", f"for job {high}") in kinds and any(k == "requeued" for k, _ in kinds)
    requeued_at = next(t for t, k, _ in _events(d, low) if k == "requeued")
    assert jobs[high]["start_ts"] >= requeued_at - 0.5  # the supervisor's clock vs the daemon's
    assert jobs[low]["start_ts"] >= jobs[high]["end_ts"]
    # A preemption is no failure: one row in history, COMPLETED; the job store gets it once.
    history = d.ask({"op": "history", "limit": 100})["jobs"]
    assert [(j["id"], j["state"]) for j in history if j["id"] == low] == [(low, "COMPLETED")]
    table = cli("history", state_dir=d.state_dir)
    assert "PREEMPT" in table.stdout and "yes, run 2" in table.stdout


def test_a_job_that_ignores_sigterm_is_killed_after_the_preemption_grace_and_requeued(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    grace = 1.0
    d = start_daemon("--policy", "multifactor-preempt", "--preempt-grace", str(grace), gpus="1")
    pids = tmp_path / "pids"
    low = d.submit(
        [sys.executable, "-c", IGNORES_TERM, str(pids)], priority="low", preemptible=True, name="stubborn"
    )
    wait_until(lambda: pids.exists() and _state(d, low) == "RUNNING", 20, "the stubborn job to run")
    time.sleep(0.3)  # its SIG_IGN is in place
    first = int(pids.read_text().split()[0])
    high = d.submit(["true"], priority="urgent", name="urgent")
    wait_until(lambda: _state(d, high) == "COMPLETED", 30, "the urgent job to complete")
    wait_until(lambda: _state(d, low) == "COMPLETED", 30, "the stubborn job to run again")
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    events = _events(d, low)
    asked = next(t for t, k, _ in events if k == "preempt")
    requeued = next((t, x) for t, k, x in events if k == "requeued")
    assert requeued[0] - asked >= grace - 0.05, events  # it was given the whole grace
    assert "(exit 137)" in requeued[1]  # SIGKILL: 128 + 9, kept in the event log, not as the job's end
    jobs = _jobs(d)
    assert (jobs[low]["attempt"], jobs[low]["state"], jobs[low]["exit_code"]) == (2, "COMPLETED", 0)
    assert len(pids.read_text().split()) == 2


def test_submit_refuses_a_bad_checkpoint_hint_and_the_daemon_refuses_one_sent_raw(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="1")
    for bad in ("-5", "nan", "1e400", "0", "400d"):
        out = cli("submit", "--checkpoint-every", bad, "--", "true", state_dir=d.state_dir)
        assert out.returncode != 0 and "checkpoint" in out.stderr, (bad, out.stderr)
    for value in (-1.0, 1e300, "nan"):
        with pytest.raises(ClientError, match="checkpoint_every"):
            d.submit(["true"], checkpoint_every=value)
    with pytest.raises(ClientError, match="NaN"):  # not even JSON's NaN gets through
        d.submit(["true"], checkpoint_every=math.nan)
    with pytest.raises(ClientError, match="preemptible"):
        d.submit(["true"], preemptible="true")
    ok = d.submit(["true"], preemptible=True, checkpoint_every=90)
    wait_until(lambda: _state(d, ok) == "COMPLETED", 20, "the job")
    row = _jobs(d)[ok]
    assert (row["preemptible"], row["checkpoint_every"], row["attempt"]) == (True, 90, 1)
    assert os.path.exists(d.state_dir / "queue.sqlite")
