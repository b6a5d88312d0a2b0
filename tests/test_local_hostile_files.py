"""A shared server's queue against what its users (and its disk) can do to its files (issue 23).

Real users (tests/setup/users.sh), a real root daemon, real files: a state dir a user prepared with a link
to a root file, a private daemon beside the shared one on the same GPUs, a lost or damaged queue database,
a disk that fills up while a job ends.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from headway.local.daemon import Daemon, DaemonConfig, DaemonError
from headway.local.ordering import LocalPlanner
from test_local_support import DaemonProc, as_user, need_users, shared_dir, start_daemon, wait_until

__all__ = ["shared_dir", "start_daemon"]

ENV = {"PATH": "/usr/bin:/bin"}


def _refused(state_dir: Path, *args: str, gpus: str = "1") -> str:
    """Start `headway daemon` and expect it to refuse: exit 1 with one line on stderr, no traceback."""
    cmd = [sys.executable, "-m", "headway.cli", "daemon", "--state-dir", str(state_dir), "--gpus", gpus]
    proc = subprocess.Popen([*cmd, "--quiet", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the daemon started on {state_dir} instead of refusing it") from None
    text = err.decode()
    assert proc.returncode == 1, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    return " ".join(text.split())  # the console may wrap a long line; the words are what matter


def _as_shell(user: str, script: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", "sh", "-c", script], check=True, timeout=30)


def _history(d: DaemonProc) -> dict[int, dict[str, Any]]:
    return {j["id"]: j for j in d.ask({"op": "history", "limit": 1000})["jobs"]}


def test_a_root_daemon_refuses_a_state_dir_a_user_could_change_and_never_follows_a_link_to_a_log(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    """A user made logs/ and runs/ world-writable and linked logs/1.out to a root file; the first job's
    supervisor opened the log as root through the link and gave the root file to the user."""
    alice, _ = need_users()
    target = shared_dir / "root-file"
    target.write_text("root's own\n")
    target.chmod(0o600)
    pub = shared_dir / "pub"  # world-writable with the sticky bit, as /tmp
    pub.mkdir()
    pub.chmod(0o1777)
    state = pub / "state"
    _as_shell(
        alice.pw_name,
        f"mkdir -p {state}/logs {state}/runs && chmod 777 {state} {state}/logs {state}/runs "
        f"&& ln -s {target} {state}/logs/1.out",
    )
    said = _refused(state)
    assert said.startswith(f"error: {state}: owned by hw-alice"), said
    assert "--state-dir" in said
    # A part above it that she owns is refused too: she could move the state dir away and put hers there.
    hers = shared_dir / "hers"
    hers.mkdir()
    os.chown(hers, alice.pw_uid, alice.pw_gid)
    (hers / "state").mkdir()
    said = _refused(hers / "state")
    assert said.startswith(f"error: {hers}: owned by hw-alice"), said
    # So is one that root owns and anyone may write (no sticky bit).
    open_dir = shared_dir / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    said = _refused(open_dir / "state")
    assert said.startswith(f"error: {open_dir}: writable by group and others (mode 0777"), said
    # A --db in a directory a user owns is refused the same way: the daemon writes it as root.
    said = _refused(shared_dir / "fine", "--db", str(state / "jobs.duckdb"))
    assert f"{state}: owned by hw-alice" in said and "--db" in said, said
    assert target.stat().st_uid == 0 and target.read_text() == "root's own\n"

    # In a safe state dir a link that is there anyway (left before it was made safe) is never followed:
    # the job fails and the root file stays root's.
    d = start_daemon(gpus="1", state_dir=shared_dir / "state")
    (d.state_dir / "logs" / "1.out").symlink_to(target)
    sub = as_user(alice, d.state_dir, {"op": "submit", "argv": ["echo", "hi"], "cwd": "/", "env": ENV})
    jid = sub["reply"]["id"]
    assert jid == 1
    wait_until(lambda: jid in _history(d), 20, "the job to end")
    assert _history(d)[jid]["state"] == "FAILED"
    assert target.stat().st_uid == 0 and target.read_text() == "root's own\n"
    assert (d.state_dir / "logs" / "1.out").is_symlink()
    # The next job's logs are opened as usual (and belong to its user).
    nxt = as_user(alice, d.state_dir, {"op": "submit", "argv": ["echo", "hi"], "cwd": "/", "env": ENV})
    wait_until(lambda: nxt["reply"]["id"] in _history(d), 20, "the next job to end")
    assert _history(d)[nxt["reply"]["id"]]["state"] == "COMPLETED"
    assert (d.state_dir / "logs" / f"{nxt['reply']['id']}.out").stat().st_uid == alice.pw_uid


@pytest.fixture
def machine_dirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """This test's own GPU lock dir (world-writable and sticky, as /dev/shm) and run dir (root's, as
    /run/headway), so it locks no GPU and registers no shared daemon of the machine it runs on."""
    locks = Path(tempfile.mkdtemp(prefix="headway-locks-"))
    locks.chmod(0o1777)
    base = Path(tempfile.mkdtemp(prefix="headway-run-"))
    base.chmod(0o755)
    rund = base / "headway"  # made by the daemon, as /run/headway
    monkeypatch.setenv("HEADWAY_GPU_LOCK_DIR", str(locks))
    monkeypatch.setenv("HEADWAY_RUN_DIR", str(rund))
    yield locks, rund
    shutil.rmtree(locks, ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def _in_child_as(pw: Any, fn: Callable[[], str]) -> str:
    """Run `fn` in a child process that dropped to the user `pw`; what it returns (or the error it
    raised, as "error: ...")."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            try:
                out = fn()
            except Exception as e:
                out = f"error: {e}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def _open_private_daemon(state_dir: Path, gpu_ids: tuple[int, ...]) -> Callable[[], str]:
    def start() -> str:
        d = Daemon(DaemonConfig(state_dir=state_dir, gpu_ids=gpu_ids), LocalPlanner("fifo"))
        try:
            d.open()
        except DaemonError as e:
            return f"refused: {e}"
        return "started"

    return start


def _two_daemons_on_one_device(base: Path) -> Callable[[], str]:
    """Two daemons in one process, on a machine whose NVML names two GPUs: the first hands out GPU 1 alone
    (`--gpus 1,`), the second both (`--gpus auto`)."""
    uuids = ("GPU-test-a", "GPU-test-b")

    def start() -> str:
        dirs = [base / f"device-{i}" for i in (1, 2)]
        for d in dirs:
            d.mkdir(mode=0o700)
        one = Daemon(DaemonConfig(state_dir=dirs[0], gpu_ids=(1,), device_uuids=uuids), LocalPlanner("fifo"))
        one.open()
        both = Daemon(
            DaemonConfig(state_dir=dirs[1], gpu_ids=(0, 1), device_uuids=uuids), LocalPlanner("fifo")
        )
        try:
            both.open()
        except DaemonError as e:
            return f"refused: {e}"
        return "started"

    return start


def test_no_two_daemons_hand_out_the_same_gpu_and_a_user_without_one_is_told_of_the_shared_one(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc], machine_dirs: tuple[Path, Path]
) -> None:
    """A user started a private daemon beside the shared one and both ran jobs on the same GPUs."""
    alice, _ = need_users()
    shared = start_daemon(gpus="2", state_dir=shared_dir / "state")
    assert shared.proc is not None
    mine = shared_dir / "alice-state"
    mine.mkdir()
    os.chown(mine, alice.pw_uid, alice.pw_gid)
    said = _in_child_as(alice, _open_private_daemon(mine, (0, 1)))
    assert said.startswith("refused: GPU "), said
    assert f"PID {shared.proc.pid}" in said and f"state dir {shared.state_dir}" in said, said
    # Another root daemon too, in one line; one on other GPUs starts beside it.
    said = _refused(shared_dir / "other", gpus="1,")
    assert f"GPU 1 is already handed out by the headway daemon of PID {shared.proc.pid}" in said, said
    start_daemon(gpus="2,3", state_dir=shared_dir / "third")
    # Alice, whose own daemon is not running, is told where the shared one is.
    from headway.local.paths import shared_daemon_hint

    hint = _in_child_as(alice, lambda: shared_daemon_hint(mine))
    assert hint == (
        f"a shared daemon runs at {shared.state_dir}: use --state-dir {shared.state_dir} "
        f"or export HEADWAY_STATE_DIR={shared.state_dir}"
    ), hint
    # A GPU NVML knows is locked by its UUID, whichever index or --gpus form names it.
    said = _in_child_as(alice, _two_daemons_on_one_device(mine))
    assert said.startswith("refused: GPU 1 (GPU-test-b) is already handed out by the headway daemon"), said
    # The locks go with the daemon that held them.
    shared.kill(signal.SIGKILL)
    assert _in_child_as(alice, _open_private_daemon(mine, (0, 1))) == "started"
    assert _in_child_as(alice, lambda: shared_daemon_hint(mine)) == ""  # nothing answers there now


def _stored(store: Path) -> dict[str, tuple[str, str]]:
    """The job store's local jobs: id -> (name, state)."""
    try:
        con = duckdb.connect(str(store), read_only=True)
    except duckdb.Error:
        return {}
    try:
        rows = con.execute("SELECT job_id, name, state FROM jobs WHERE source = 'local'").fetchall()
        return {str(a): (str(b), str(c)) for a, b, c in rows}
    finally:
        con.close()


def test_a_lost_or_damaged_queue_database_is_refused_and_job_ids_are_never_used_twice(
    tmp_path: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    """A zero-length queue.sqlite started an empty queue: the next job was job 1 again, appended to the
    old job 1's logs and replaced it in the job store. A damaged one gave a raw sqlite traceback."""
    state = tmp_path / "state"
    d = start_daemon(gpus="1", state_dir=state)
    first = d.submit(["echo", "the first job"], name="first")
    assert first == 1
    wait_until(lambda: _stored(state / "jobs.duckdb").get("1") == ("first", "COMPLETED"), 30, "the store")
    d.kill(signal.SIGTERM)
    db = state / "queue.sqlite"
    db.write_bytes(b"")
    for extra in ("queue.sqlite-wal", "queue.sqlite-shm"):
        (state / extra).unlink(missing_ok=True)
    said = _refused(state)
    assert f"{db} is empty, but" in said and "job 1" in said and f"rm {db}" in said, said
    # Doing what it says starts an empty queue whose ids go on after the old ones.
    db.unlink()
    d.start()
    second = d.submit(["echo", "the second job"], name="second")
    assert second == 2
    wait_until(lambda: "2" in _stored(state / "jobs.duckdb"), 30, "the second job in the store")
    assert _stored(state / "jobs.duckdb")["1"] == ("first", "COMPLETED")
    assert (state / "logs" / "1.out").read_text() == "the first job\n"
    log = base64.b64decode(d.ask({"op": "logs", "id": second})["data"]).decode()
    assert log == "the second job\n"
    d.kill(signal.SIGTERM)
    # A backup of the database from before job 2 (ids restart at 2) is caught up by the job store.
    con = sqlite3.connect(db)
    con.execute("DELETE FROM jobs WHERE id = 2")
    con.execute("UPDATE sqlite_sequence SET seq = 1 WHERE name = 'jobs'")
    con.commit()
    con.close()
    shutil.rmtree(state / "logs")
    d.start()
    assert d.submit(["true"], name="third") == 3
    d.kill(signal.SIGTERM)
    # Damage is refused in one line that says what to do.
    good = db.read_bytes()
    db.write_bytes(good[:100] + b"\xff" * 4000 + good[4100:])
    for extra in ("queue.sqlite-wal", "queue.sqlite-shm"):
        (state / extra).unlink(missing_ok=True)
    said = _refused(state)
    assert f"{db} is damaged" in said and "backup" in said and f"mv {db}" in said, said
    db.write_bytes(b"this is not a database at all" * 100)
    said = _refused(state)
    assert f"{db} is damaged" in said, said
    other = sqlite3.connect(db.with_name("other.sqlite"))
    other.execute("CREATE TABLE t (x)")
    other.commit()
    other.close()
    db.unlink()
    db.with_name("other.sqlite").rename(db)
    said = _refused(state)
    assert f"{db} is not a headway queue database" in said, said
    # And the job store never lets a later job replace an earlier one of the same id.
    from headway.local.store_sync import write_ended

    row = {
        "id": 1,
        "user": "root",
        "name": "impostor",
        "priority": "normal",
        "submit_time": time.time(),
        "start_time": None,
        "end_time": time.time(),
        "gpus": 1,
        "time_limit": None,
        "state": "FAILED",
        "exit_code": 1,
    }
    write_ended(state / "jobs.duckdb", [row])
    assert _stored(state / "jobs.duckdb")["1"] == ("first", "COMPLETED")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs (the tests run as root); skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        ok = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m,mode=755", "tmpfs", str(mnt)], capture_output=True
        )
    except OSError:
        pytest.skip("no mount command")
    if ok.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + ok.stderr.decode(errors="replace").strip())
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_job_that_ends_while_the_disk_is_full_keeps_its_true_exit_status(
    tmp_path: Path, small_disk: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    """A job that exited 0 on a full disk was recorded FAILED ("its supervisor vanished"): the supervisor
    died on ENOSPC writing status.json."""
    d = start_daemon("--db", str(tmp_path / "jobs.duckdb"), gpus="1", state_dir=small_disk / "state")
    go, filler, filled = tmp_path / "go", small_disk / "filler", tmp_path / "filled"
    job = (
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        f"head -c 64M /dev/zero > {filler} 2>/dev/null; touch {filled}; exit 0"
    )
    jid = d.submit(["sh", "-c", job], env=ENV)
    wait_until(lambda: d.ask({"op": "queue"})["jobs"][0]["state"] == "RUNNING", 20, "the job to start")
    go.touch()
    wait_until(filled.exists, 30, "the job to fill the disk")
    time.sleep(3.0)  # the job has exited; its supervisor cannot write its end
    with pytest.raises(OSError):
        (small_disk / "probe").write_bytes(b"x" * 65536)
    running = {j["id"]: j["state"] for j in d.ask({"op": "queue"})["jobs"]}
    assert running.get(jid) == "RUNNING", running
    filler.unlink()
    (small_disk / "probe").unlink(missing_ok=True)
    wait_until(lambda: jid in _history(d), 30, "the job's end once the disk has room")
    h = _history(d)[jid]
    assert (h["state"], h["exit_code"]) == ("COMPLETED", 0), h
    runs = json.dumps(h)
    assert "vanished" not in runs
