"""The local queue end to end: a real daemon, real supervisors, real jobs, the real CLI."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from test_local_support import DaemonProc, cli, start_daemon, wait_until

__all__ = ["start_daemon"]

JOB_FIELDS = {
    "id",
    "name",
    "user",
    "state",
    "exit_code",
    "gpus",
    "gpu_ids",
    "submit_time",
    "start_time",
    "end_time",
}


def _history(d: DaemonProc) -> dict[int, dict[str, object]]:
    return {j["id"]: j for j in d.ask({"op": "history", "limit": 10_000})["jobs"]}


def _ended(d: DaemonProc, ids: list[int]) -> Callable[[], bool]:
    return lambda: set(ids) <= set(_history(d))


def _stored(d: DaemonProc) -> int:
    """Local jobs in the daemon's DuckDB job store (-1 while another process holds it)."""
    try:
        con = duckdb.connect(str(d.state_dir / "jobs.duckdb"), read_only=True)
    except duckdb.Error:
        return -1
    try:
        row = con.execute("SELECT count(*) FROM jobs WHERE source = 'local'").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()


def test_jobs_end_completed_failed_or_timeout_with_their_gpus_cwd_and_env(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon(gpus="2")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, HW_TEST_VAR="from-submitter")
    script = 'echo "$CUDA_VISIBLE_DEVICES|$HW_TEST_VAR|$(pwd)"'
    ok = d.submit(["sh", "-c", script], cwd=str(work), env=env, gpus=2, name="ok")
    bad = d.submit(["sh", "-c", "exit 3"], name="bad")
    slow = d.submit(["sleep", "30"], time_limit=0.5, name="slow")
    cpu = d.submit(["true"], gpus=0, name="cpu")
    wait_until(_ended(d, [ok, bad, slow, cpu]), 30, "four jobs to end")
    h = _history(d)
    assert (h[ok]["state"], h[ok]["exit_code"]) == ("COMPLETED", 0)
    assert (h[bad]["state"], h[bad]["exit_code"]) == ("FAILED", 3)
    assert h[slow]["state"] == "TIMEOUT"
    assert h[cpu]["state"] == "COMPLETED" and h[cpu]["gpu_ids"] == []
    assert sorted(h[ok]["gpu_ids"]) == [0, 1]  # type: ignore[call-overload]
    assert set(h[ok]) >= JOB_FIELDS
    out = cli("logs", str(ok), state_dir=d.state_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"0,1|from-submitter|{work}"

    # Every ended job reaches the DuckDB job store (source 'local'), which the daemon does not keep locked.
    wait_until(lambda: _stored(d) == 4, 20, "ended jobs in the job store")


def test_cli_json_lists_pending_and_running_then_history_lists_ended(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="1")
    sub = cli(
        "submit", "--json", "--name", "long", "--time", "10m", "--", "sleep", "30", state_dir=d.state_dir
    )
    assert sub.returncode == 0, sub.stderr
    long_id = json.loads(sub.stdout)["id"]
    waiting = d.submit(["true"], name="waiting")

    def ranked() -> bool:
        """The long job runs and a pass has ranked the one that waits (it came after the pass that
        started the long job)."""
        jobs = d.ask({"op": "queue"})["jobs"]
        return jobs[0]["state"] == "RUNNING" and len(jobs) == 2 and jobs[1].get("rank") == 1

    wait_until(ranked, 20, "the long job to run and the waiting one to be ranked")
    q = cli("queue", "--json", state_dir=d.state_dir)
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert [(r["id"], r["state"]) for r in rows] == [(long_id, "RUNNING"), (waiting, "PENDING")]
    assert all(set(r) >= JOB_FIELDS for r in rows)
    assert rows[0]["time_limit"] == 600 and rows[1]["rank"] == 1
    table = cli("queue", state_dir=d.state_dir)
    assert "JOBID" in table.stdout and "long" in table.stdout and "PD" in table.stdout
    why = cli("why", str(waiting), "--json", state_dir=d.state_dir)
    assert why.returncode == 0, why.stderr
    w = json.loads(why.stdout)
    assert w["rank"] == 1 and w["factors"] and w["estimated_start"] is not None
    assert any("waits for GPUs" in line for line in w["explanation"])
    words = cli("why", str(waiting), state_dir=d.state_dir)
    assert "rank 1 of 1" in words.stdout and "estimated start" in words.stdout
    c = cli("cancel", str(long_id), "--json", state_dir=d.state_dir)
    assert c.returncode == 0, c.stderr
    wait_until(_ended(d, [long_id, waiting]), 30, "both jobs to end")
    hist = json.loads(cli("history", "--json", state_dir=d.state_dir).stdout)
    states = {j["id"]: j["state"] for j in hist}
    assert states == {long_id: "CANCELLED", waiting: "COMPLETED"}
    assert json.loads(cli("queue", "--json", state_dir=d.state_dir).stdout) == []


def _log(d: DaemonProc, jid: int) -> str:
    r = d.ask({"op": "logs", "id": jid, "stream": "out", "offset": 0})
    return base64.b64decode(r["data"]).decode()


def test_logs_follow_streams_until_the_job_ends(start_daemon: Callable[..., DaemonProc]) -> None:
    d = start_daemon(gpus="1")
    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.4)"
    jid = d.submit([sys.executable, "-c", code])
    r = cli("logs", str(jid), "-f", state_dir=d.state_dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "1", "2"]
    assert _history(d)[jid]["state"] == "COMPLETED"


def test_dependent_job_starts_after_its_dependency_completes(start_daemon: Callable[..., DaemonProc]) -> None:
    d = start_daemon(gpus="2")
    first = d.submit(["sleep", "0.5"])
    then = d.submit(["true"], after=first)
    wait_until(_ended(d, [first, then]), 30, "both jobs")
    h = _history(d)
    assert h[then]["state"] == "COMPLETED"
    assert str(h[then]["start_time"]) >= str(h[first]["end_time"])


def test_a_restarted_daemon_adopts_the_job_that_kept_running(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon(gpus="1")
    marker = tmp_path / "runs.txt"
    go = tmp_path / "go"
    script = f"echo run >> {marker}; while [ ! -e {go} ]; do sleep 0.05; done; echo done >> {marker}"
    jid = d.submit(["sh", "-c", script])
    wait_until(lambda: marker.exists(), 20, "the job to start")
    d.kill(signal.SIGKILL)
    time.sleep(0.3)
    d.start()
    q = d.ask({"op": "queue"})["jobs"]
    assert [(j["id"], j["state"]) for j in q] == [(jid, "RUNNING")]
    go.touch()  # the job finishes while the new daemon watches
    wait_until(_ended(d, [jid]), 20, "the adopted job to end")
    assert _history(d)[jid]["state"] == "COMPLETED"
    assert marker.read_text().split() == ["run", "done"]


def test_logs_follow_carries_on_across_a_daemon_restart(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon(gpus="1")
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; echo after"
    jid = d.submit(["sh", "-c", script])
    cmd = [sys.executable, "-m", "headway.cli", "logs", str(jid), "-f", "--state-dir", str(d.state_dir)]
    follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # the follower has reached the daemon and printed a line
        d.kill(signal.SIGKILL)
        time.sleep(2.0)  # the follower finds no daemon for a while
        assert follower.poll() is None, follower.communicate()
        d.start()
        go.touch()
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert (first + out).split() == ["before", "after"]
    assert "waiting for it to come back" in err and "the daemon is back" in err


def test_a_store_held_by_another_process_is_retried_with_one_warning(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="1")
    store = d.state_dir / "jobs.duckdb"

    def stored() -> int:
        return _stored(d)

    first = d.submit(["true"])
    wait_until(_ended(d, [first]), 20, "the first job")
    wait_until(lambda: stored() == 1, 20, "the first job in the store")
    reader = duckdb.connect(str(store), read_only=True)  # an analyst's session: the daemon cannot write
    try:
        for _ in range(3):
            jid = d.submit(["true"])
            wait_until(_ended(d, [jid]), 20, "a job")
            time.sleep(2.0)
    finally:
        reader.close()
    wait_until(lambda: stored() == 4, 90, "every job in the store once it is free")
    log = (d.state_dir / "daemon.log").read_text()
    assert log.count("not written yet") == 1, log
    assert "written again" in log


ESCAPER = """
import os, sys, time
if os.fork() == 0:
    os.setsid()  # leaves the job's process group and session
    if os.fork() == 0:  # orphaned at once: what a daemonised helper does
        open(sys.argv[1], "w").write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
os.wait()
print("leader done", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_that_left_the_jobs_group_dies_with_the_job(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    d = start_daemon(gpus="1")
    pidfile = tmp_path / "escaped.pid"
    jid = d.submit([sys.executable, "-c", ESCAPER, str(pidfile)])
    wait_until(_ended(d, [jid]), 30, "the job")
    assert _history(d)[jid]["state"] == "COMPLETED"
    escaped = int(pidfile.read_text())
    try:
        wait_until(lambda: not _alive(escaped), 10, "the escaped process to be killed")
    finally:
        if _alive(escaped):
            os.kill(escaped, signal.SIGKILL)


def test_orphans_that_end_while_the_job_runs_leave_no_zombies(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    from headway.local import runs

    d = start_daemon(gpus="1")
    script = "for i in $(seq 200); do sh -c 'sleep 0.01 &'; done; echo spawned; sleep 4"
    jid = d.submit(["sh", "-c", script])
    rdir = d.state_dir / "runs" / f"{jid}.0"
    wait_until(lambda: _log(d, jid) == "spawned\n", 30, "the orphans to be spawned")
    time.sleep(0.5)
    supervisor = psutil.Process(int(json.loads((rdir / runs.CLAIM).read_text())["pid"]))
    zombies = [c for c in supervisor.children() if c.status() == psutil.STATUS_ZOMBIE]
    assert len(zombies) < 10, len(zombies)  # its subreaper collects them as they end
    wait_until(_ended(d, [jid]), 30, "the job")
    assert _history(d)[jid]["state"] == "COMPLETED"


def test_client_errors_are_one_clear_line(start_daemon: Callable[..., DaemonProc], tmp_path: Path) -> None:
    nobody = cli("queue", state_dir=tmp_path / "nowhere")
    assert (
        nobody.returncode == 1 and "no headway daemon" in nobody.stderr and "Traceback" not in nobody.stderr
    )
    follow = cli("logs", "1", "-f", state_dir=tmp_path / "nowhere")  # no daemon ever: no 5-minute wait
    assert follow.returncode == 1 and "no headway daemon" in follow.stderr
    d = start_daemon(gpus="2")
    big = cli("submit", "--gpus", "3", "--", "true", state_dir=d.state_dir)
    assert big.returncode == 1 and "this server has 2" in big.stderr
    bad_time = cli("submit", "--time", "soon", "--", "true", state_dir=d.state_dir)
    assert bad_time.returncode == 1 and "time 'soon'" in bad_time.stderr
    missing = cli("cancel", "999", state_dir=d.state_dir)
    assert missing.returncode == 1 and "no job 999" in missing.stderr
    tab = cli("submit", "--name", "a\tb", "--", "true", state_dir=d.state_dir)
    assert tab.returncode == 1 and "no tabs, newlines or other control characters" in tab.stderr
    huge = cli("why", "99999999999999999999", state_dir=d.state_dir)
    assert huge.returncode == 1 and "no job 99999999999999999999" in huge.stderr
    gone = tmp_path / "gone"
    gone.mkdir()
    lost = subprocess.run(
        [
            "sh",
            "-c",
            f'cd {gone} && rmdir {gone} && exec "$@"',
            "sh",
            *_cli_argv("submit", d.state_dir, "true"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lost.returncode == 1 and "the current directory no longer exists" in lost.stderr, lost.stderr
    second = DaemonProc(d.state_dir)
    try:
        second.start(timeout=10)
        raise AssertionError("a second daemon started on the same state dir")
    except RuntimeError as e:
        assert "already running" in str(e)
    finally:
        second.kill()


def test_a_command_that_does_not_exist_fails_with_exit_127(start_daemon: Callable[..., DaemonProc]) -> None:
    d = start_daemon(gpus="1")
    jid = d.submit(["/nonexistent/cmd"])
    wait_until(_ended(d, [jid]), 20, "the job")
    h = _history(d)[jid]
    assert (h["state"], h["exit_code"]) == ("FAILED", 127)
    err = cli("logs", str(jid), "--stderr", state_dir=d.state_dir)
    assert "cannot start" in err.stdout


def test_a_supervisor_never_runs_an_attempt_the_daemon_already_gave_up(tmp_path: Path) -> None:
    import subprocess

    from headway.local import runs

    rdir = tmp_path / "runs" / "1.0"
    rdir.mkdir(parents=True)
    marker = tmp_path / "ran"
    spec = {
        "argv": ["touch", str(marker)],
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
        "uid": os.getuid(),
        "gid": os.getgid(),
        "stdout": str(tmp_path / "out"),
        "stderr": str(tmp_path / "err"),
    }
    runs.write_atomic(rdir / runs.SPEC, spec)
    assert runs.try_claim(rdir, {"by": "daemon"})  # a restarted daemon abandons the launch first
    subprocess.run([sys.executable, "-m", "headway.local.supervisor", str(rdir)], check=True, timeout=30)
    assert not marker.exists() and runs.inspect(rdir).kind == "abandoned"
    # A fresh attempt is claimed by its supervisor, runs once, and records its end.
    rdir2 = tmp_path / "runs" / "1.1"
    rdir2.mkdir()
    runs.write_atomic(rdir2 / runs.SPEC, spec)
    subprocess.run([sys.executable, "-m", "headway.local.supervisor", str(rdir2)], check=True, timeout=30)
    view = runs.inspect(rdir2)
    assert marker.exists() and view.kind == "ended" and view.status is not None
    assert view.status["state"] == "COMPLETED" and not runs.try_claim(rdir2, {"by": "daemon"})


def test_a_job_whose_supervisor_is_killed_fails_and_its_processes_are_killed(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    from headway.local import runs

    d = start_daemon(gpus="1")
    jid = d.submit(["sleep", "60"])
    rdir = d.state_dir / "runs" / f"{jid}.0"
    wait_until(lambda: (rdir / runs.JOB).exists(), 20, "the job to start")
    supervisor = int(json.loads((rdir / runs.CLAIM).read_text())["pid"])
    pgid = int(json.loads((rdir / runs.JOB).read_text())["pgid"])
    os.kill(supervisor, signal.SIGKILL)
    wait_until(_ended(d, [jid]), 20, "the daemon to notice")
    h = _history(d)[jid]
    assert h["state"] == "FAILED" and "supervisor" in str(h["reason"])

    def group_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, 10, "the orphaned job to be killed")
    nxt = d.submit(["true"])  # and its GPU is free again
    wait_until(_ended(d, [nxt]), 20, "the next job")


def test_the_daemons_files_are_private_and_jobs_keep_the_umask_it_was_started_with(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    old = os.umask(0o022)  # what a service manager usually starts a daemon with
    try:
        d = start_daemon()
    finally:
        os.umask(old)
    made = tmp_path / "made-by-the-job"
    jid = d.submit(["sh", "-c", f"touch {made}"], env={"PATH": os.environ["PATH"], "API_TOKEN": "secret"})
    wait_until(_ended(d, [jid]), 30, "the job")
    assert _history(d)[jid]["state"] == "COMPLETED"
    for name in ("queue.sqlite", "queue.sqlite-wal", "daemon.log", "jobs.duckdb"):
        path = d.state_dir / name
        if path.exists():  # (the WAL may have been checkpointed away)
            assert path.stat().st_mode & 0o777 == 0o600, name
    assert (d.state_dir / "queue.sqlite").exists() and (d.state_dir / "daemon.log").exists()
    assert made.stat().st_mode & 0o777 == 0o644  # the job's own files: the daemon's umask, not 077


class _FailingCommit:
    """A SQLite connection whose next COMMITs fail as on a full disk (the rest passes through)."""

    def __init__(self, con: sqlite3.Connection, failures: int) -> None:
        self._con, self.failures = con, failures

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[Any]:
    """A Daemon object in this process (no event loop: the tests call its steps), for faults a real
    daemon cannot be made to meet on cue. What `open` changes in this process is put back."""
    import logging

    from headway.local.daemon import Daemon, DaemonConfig
    from headway.local.ordering import LocalPlanner

    d = Daemon(DaemonConfig(state_dir=tmp_path / "state", gpu_ids=(0, 1)), LocalPlanner("fifo"))
    log = logging.getLogger("headway")
    umask, handlers, level = os.umask(0o022), list(log.handlers), log.level
    os.umask(umask)
    try:
        d.open()  # sets the umask to 077, replaces the log handlers, takes the state dir's lock
        yield d
    finally:
        os.umask(umask)
        for h in list(log.handlers):
            log.removeHandler(h)
            if h not in handlers:
                h.close()
        for h in handlers:
            log.addHandler(h)
        log.setLevel(level)
        if d.db is not None:
            d.db.con.close()
        if d._lock_fd is not None:
            os.close(d._lock_fd)


def _job(tmp_path: Path) -> dict[str, Any]:
    return {"op": "submit", "argv": ["true"], "cwd": str(tmp_path), "env": {}, "gpus": 1}


def _me() -> Any:
    from headway.local.daemon import Caller

    return Caller(os.getpid(), os.getuid(), os.getgid())


def test_a_failed_database_write_refuses_the_submit_and_the_queue_carries_on(
    inproc: Any, tmp_path: Path
) -> None:
    """A full disk at one submit left the job in the daemon's memory but not in its database: every later
    submit failed ("job 3 submitted twice") and the watcher logged a traceback every 50 ms."""
    from headway.local.daemon import RequestError

    d = inproc
    first = d.op_submit(_me(), _job(tmp_path))["id"]
    real = d.db.con
    d.db.con = _FailingCommit(real, failures=1)
    with pytest.raises(RequestError, match="the job was not queued: the queue's database cannot be written"):
        d.op_submit(_me(), _job(tmp_path))
    d.db.con = real
    second = d.op_submit(_me(), _job(tmp_path))["id"]
    assert set(d.core.jobs) == {first, second} == {j.id for j in d.db.load_active()}
    d.core.validate()
    d.db.con = _FailingCommit(real, failures=1)
    with pytest.raises(sqlite3.OperationalError):
        d.schedule(time.time())  # a pass that would launch both jobs: nothing of it is kept or done
    d.db.con = real
    assert all(j.state.value == "PENDING" for j in d.core.jobs.values())
    assert {j.id: j.state for j in d.db.load_active()} == {j.id: j.state for j in d.core.jobs.values()}


def test_a_daemon_that_cannot_reload_its_database_stops_instead_of_giving_gpus_twice(
    inproc: Any, tmp_path: Path
) -> None:
    """With the reload after a failed write failing too, the core stayed empty and the next submit got
    the GPU a running job held."""
    from headway.local.daemon import RequestError

    d = inproc
    d.op_submit(_me(), _job(tmp_path))
    d.db.con = _FailingCommit(d.db.con, failures=1)

    def unreadable() -> None:
        raise sqlite3.DatabaseError("disk I/O error")

    d.db.load_active = unreadable
    with pytest.raises(RequestError):
        d.op_submit(_me(), _job(tmp_path))
    assert d.broken and d.stopping
    with pytest.raises(RequestError, match="cannot read its job database"):
        d.handle(_me(), _job(tmp_path))


def test_a_launch_that_fails_on_a_full_disk_is_requeued_and_the_others_start(
    inproc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first launch's spec.json failing (ENOSPC) skipped the second launch, and every later pass
    failed on the run directory that was never made, until a restart."""
    import errno

    from headway.local import runs

    d = inproc
    ids = [d.op_submit(_me(), _job(tmp_path))["id"] for _ in range(2)]
    real_write = runs.write_atomic
    failures = [1]

    def full_disk(path: Path, data: dict[str, Any], **kw: Any) -> None:
        if path.name == runs.SPEC and failures[0]:
            failures[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data, **kw)

    monkeypatch.setattr(runs, "write_atomic", full_disk)
    d.schedule(time.time())  # both launch; the first cannot write its spec
    deadline = time.time() + 30
    while time.time() < deadline:
        d.poll_runs()
        d.schedule(time.time())
        if all(d.core.state_of(j) is not None and not d.core.state_of(j).active for j in ids):
            break
        time.sleep(0.1)
    states = {j: d.core.state_of(j) for j in ids}
    assert {s.value for s in states.values() if s is not None} == {"COMPLETED"}, states


def test_a_restart_with_fewer_gpus_keeps_running_jobs_and_parks_jobs_that_no_longer_fit(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """It was a CoreError traceback at start-up ("job 2 holds unknown GPU 1"); a pending 3-GPU job on a
    1-GPU server held up, under fifo, every job behind it. It now waits aside (BadConstraints), not
    cancelled: NVML not up yet at boot also makes a daemon see fewer GPUs, and the job runs again under
    one that has them."""
    d = start_daemon(gpus="0,1,2")
    one = d.submit(["sleep", "8"], gpus=1)
    two = d.submit(["sleep", "8"], gpus=2)
    wait_until(
        lambda: all(d.ask({"op": "why", "id": j})["job"]["state"] == "RUNNING" for j in (one, two)),
        20,
        "both to start",
    )
    too_big = d.submit(["true"], gpus=3)
    d.kill(signal.SIGKILL)
    small = DaemonProc(d.state_dir, "--policy", "fifo", gpus="0,")  # GPU 0 alone
    small.start()  # adopts the jobs on GPUs 1 and 2, which it no longer hands out
    try:
        assert {small.ask({"op": "why", "id": j})["job"]["state"] for j in (one, two)} == {"RUNNING"}
        cpu = small.submit(["true"], gpus=0)  # behind the 3-GPU job in fifo order
        wait_until(_ended(small, [cpu]), 20, "the job behind it to run")
        why = small.ask({"op": "why", "id": too_big})
        assert why["job"]["state"] == "PENDING" and why["job"]["reason"] == "BadConstraints", why
        assert "this daemon hands out 1" in " ".join(why["explanation"])
    finally:
        small.kill(signal.SIGKILL)
    d.start()  # three GPUs again: it runs once the two sleeps end
    wait_until(_ended(d, [too_big]), 40, "the 3-GPU job to run")
    assert _history(d)[too_big]["state"] == "COMPLETED"


def test_processes_that_left_the_group_die_even_when_the_supervisor_is_killed(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """The supervisor is the subreaper of its job; with it killed (OOM killer, an admin), a setsid child
    re-parented to init and kept running on a GPU the queue gave out again."""
    from headway.local import runs

    d = start_daemon(gpus="1")
    pidfile = tmp_path / "escaped.pid"
    jid = d.submit(["sh", "-c", f"setsid sleep 307 & echo $! > {pidfile}; sleep 60"])
    rdir = d.state_dir / "runs" / f"{jid}.0"
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 20, "the job to start")
    escaped = int(pidfile.read_text())
    assert _alive(escaped)
    supervisor = int(json.loads((rdir / runs.CLAIM).read_text())["pid"])
    os.kill(supervisor, signal.SIGKILL)
    wait_until(_ended(d, [jid]), 20, "the daemon to notice")
    wait_until(lambda: not _alive(escaped), 10, "the escaped process to be killed")


def _cli_argv(verb: str, state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "headway.cli", verb, "--state-dir", str(state_dir), "--", *args]


def test_cancel_tries_every_id_and_reports_each(start_daemon: Callable[..., DaemonProc]) -> None:
    """`cancel 5 999 6` stopped at 999: job 5 was cancelled without a word, job 6 not at all, and with
    --json nothing was printed."""
    d = start_daemon(gpus="1")
    d.submit(["sleep", "30"])  # holds the GPU
    a, b = d.submit(["true"]), d.submit(["true"])
    res = cli("cancel", str(a), "999", str(b), "--json", state_dir=d.state_dir)
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert [(r["id"], r["state"], r["error"]) for r in doc] == [
        (a, "CANCELLED", None),
        (999, None, "no job 999"),
        (b, "CANCELLED", None),
    ]
    c = d.submit(["true"])
    res = cli("cancel", "998", str(c), state_dir=d.state_dir)
    assert res.returncode == 1 and "no job 998" in res.stderr and f"job {c}: cancel requested" in res.stdout


def test_a_job_told_to_stop_shows_cg_through_its_grace_period(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """It showed R until the kill, so a cancel looked ignored."""
    d = start_daemon(gpus="1", grace=20.0)
    jid = d.submit(["sh", "-c", "trap '' TERM; sleep 30"])
    wait_until(lambda: d.ask({"op": "why", "id": jid})["job"]["state"] == "RUNNING", 20, "the job to start")
    d.ask({"op": "cancel", "id": jid})

    def row() -> dict[str, Any]:
        return next(j for j in d.ask({"op": "queue"})["jobs"] if j["id"] == jid)

    wait_until(lambda: row()["st"] == "CG", 10, "the job to show CG")
    assert row()["state"] == "RUNNING"


def test_a_job_that_ends_while_the_predictor_loads_is_booked_and_logged_once(inproc: Any) -> None:
    """Its end was replayed through the whole observer once the predictor was ready: logged twice and
    added twice to the usage book, which counts failure streaks for the repeat-failure hold."""
    import asyncio

    from headway.local.core import JobState, LocalJob

    class Seen:
        def __init__(self) -> None:
            self.ends: list[str] = []

        def observe_end(self, ended: Any) -> None:
            self.ends.append(ended.job.job_id)

        def predict(self, jobs: Any, now: float) -> Any:
            raise AssertionError("no pending jobs here")

    d = inproc
    loop = asyncio.new_event_loop()
    try:
        d._loading = loop.create_future()
        d._loading_kind, d._loading_since = "load", time.time()
        job = LocalJob(
            id=7,
            user="ann",
            uid=os.getuid(),
            name="train",
            gpus=1,
            submit_time=1.0,
            time_limit=None,
            priority="normal",
            after=None,
        )
        job.state, job.start_time, job.end_time = JobState.FAILED, 2.0, 3.0
        d._observe(job)
        seen = Seen()
        d._loading.set_result(seen)
        assert d._predictor_ready(time.time())
    finally:
        loop.close()
    assert len(seen.ends) == 1
    assert d.core.planner.book.fail_streak("ann", "train") == 1


def test_logs_json_streams_a_log_larger_than_a_chunk_with_characters_split_between_chunks(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """`logs --json` gathered the whole log, then decoded and encoded it (1.6 GB for 300 MB). It now
    streams; a character cut by a chunk boundary must come out whole, bad bytes as U+FFFD."""
    d = start_daemon(gpus="1")
    body = "é" * 300_000  # 600,000 bytes: 256 KiB chunks end inside a character
    src = tmp_path / "out.bin"
    src.write_bytes(body.encode() + b"\xff end")
    jid = d.submit(["cat", str(src)])
    wait_until(_ended(d, [jid]), 20, "the job to end")
    res = cli("logs", str(jid), "--json", state_dir=d.state_dir)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["id"] == jid and doc["stream"] == "out" and doc["state"] == "COMPLETED"
    assert doc["text"] == body + "\ufffd end"


# Signals 32 and 33 are the C library's own (its threads' cancellation and set-id calls): no program can
# change their disposition, so one ignored by whatever started the test run stays ignored in every job.
_LIBC_SIGNALS = (1 << 31) | (1 << 32)


def _ignored_mask(status_line: str) -> int:
    """The ignored-signal bits of a `SigIgn:` line of /proc/PID/status, less the C library's own."""
    return int(status_line.split()[1], 16) & ~_LIBC_SIGNALS


def test_jobs_start_with_default_signal_dispositions(start_daemon: Callable[..., DaemonProc]) -> None:
    """The supervisor ignores SIGINT and SIGHUP (and a daemon started in the background by a shell
    ignores SIGINT and SIGQUIT); jobs inherited those ignored signals, so a Python job never saw a
    KeyboardInterrupt and `kill -INT` or `kill -HUP` of a job did nothing. Jobs start with none ignored."""
    script = "grep SigIgn /proc/self/status; sleep 30"
    # The daemon ignores SIGQUIT here, as one started with `&` from a script does.
    old = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        d = start_daemon(gpus="1")
    finally:
        signal.signal(signal.SIGQUIT, old)
    jid = d.submit(["sh", "-c", script], name="sigs")
    wait_until(lambda: _log(d, jid).startswith("SigIgn"), 30, "the job to report its signals")
    assert _ignored_mask(_log(d, jid)) == 0, _log(d, jid)
    job = next(j for j in d.ask({"op": "queue"})["jobs"] if j["id"] == jid)
    assert job["state"] == "RUNNING"
    rdir = d.state_dir / "runs" / f"{jid}.0"
    from headway.local import runs

    pgid = int(json.loads((rdir / runs.JOB).read_text())["pgid"])
    os.killpg(pgid, signal.SIGINT)
    wait_until(_ended(d, [jid]), 20, "the interrupted job to end")
    h = _history(d)[jid]
    assert (h["state"], h["exit_code"]) == ("FAILED", 128 + signal.SIGINT)


def test_a_job_submitted_from_a_directory_whose_name_is_not_utf8_runs_there(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """A directory named in Latin-1 (caf\\xe9) reached SQLite as a str with a lone surrogate, and the
    submit failed with 'internal error: ... surrogates not allowed' (and a traceback in the log)."""
    d = start_daemon(gpus="1")
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(raw)
    res = cli("submit", "--json", "--", "sh", "-c", "pwd -P", state_dir=d.state_dir, cwd=os.fsdecode(raw))
    assert res.returncode == 0, res.stderr
    jid = json.loads(res.stdout)["id"]
    wait_until(_ended(d, [jid]), 20, "the job")
    h = _history(d)[jid]
    assert h["state"] == "COMPLETED" and h["cwd"] == os.fsdecode(raw)
    r = d.ask({"op": "logs", "id": jid, "stream": "out", "offset": 0})
    assert base64.b64decode(r["data"]) == raw + b"\n"
    for verb in (["queue", "--all"], ["history", "--json"], ["why", str(jid), "--json"]):
        shown = cli(*verb, state_dir=d.state_dir)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert json.loads(cli("history", "--json", state_dir=d.state_dir).stdout)[0]["cwd"] == os.fsdecode(raw)


def test_a_state_dir_too_deep_for_a_unix_socket_path_still_works(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """A socket's path holds at most 107 bytes: a daemon whose state dir was deeper died at start with a
    traceback ('OSError: AF_UNIX path too long') and clients said 'talking to the daemon ...: AF_UNIX
    path too long'."""
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "state"
    assert len(str(deep / "headway.sock")) > 108
    d = start_daemon(gpus="1", state_dir=deep)
    res = cli("submit", "--json", "--", "echo", "deep", state_dir=deep)
    assert res.returncode == 0, res.stderr
    jid = json.loads(res.stdout)["id"]
    wait_until(_ended(d, [jid]), 20, "the job")
    assert _log(d, jid) == "deep\n"
    q = cli("queue", state_dir=deep)
    assert q.returncode == 0 and "0 running" in q.stdout, q.stderr
    d.kill(signal.SIGTERM)
    gone = cli("queue", state_dir=deep)
    assert gone.returncode == 1 and "no headway daemon" in gone.stderr, gone.stderr
    nowhere = cli("queue", state_dir=tmp_path / ("x" * 120))  # no such directory at all
    assert nowhere.returncode == 1 and "no headway daemon" in nowhere.stderr, nowhere.stderr


def test_why_names_a_running_jobs_gpus_as_queue_and_history_do(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """`why` of a running job printed its GPUs as a Python list ('on GPUs [0, 1]'), where queue, history
    and the daemon's log write 0,1; a CPU-only job read 'on GPUs []'."""
    d = start_daemon(gpus="2")
    two = d.submit(["sleep", "30"], gpus=2)
    cpu = d.submit(["sleep", "30"], gpus=0)
    running = lambda: {j["id"] for j in d.ask({"op": "queue"})["jobs"] if j["state"] == "RUNNING"}  # noqa: E731
    wait_until(lambda: running() == {two, cpu}, 20, "both jobs to run")
    assert "on GPUs 0,1" in cli("why", str(two), state_dir=d.state_dir).stdout
    assert "on no GPU" in cli("why", str(cpu), state_dir=d.state_dir).stdout


def test_jobs_start_with_no_signal_ignored_whatever_the_daemon_was_started_ignoring(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """Only SIGINT, SIGHUP and SIGQUIT were given back to jobs: a daemon started ignoring another signal
    (`trap '' USR1` in its start script, say) passed it down ignored, though jobs start with none."""
    old = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        d = start_daemon(gpus="1")
    finally:
        signal.signal(signal.SIGUSR1, old)
    jid = d.submit(["sh", "-c", "grep SigIgn /proc/self/status"], name="sigs")
    wait_until(_ended(d, [jid]), 20, "the job")
    assert _ignored_mask(_log(d, jid)) == 0, _log(d, jid)
