"""Isolation on a shared server: two real Unix users (tests/setup/users.sh) and a daemon running as root.

The daemon knows callers only from SO_PEERCRED, so each client here is a real process that has dropped
to the user's uid (fork + setgid/setuid) before it connects, exactly as that user's own `headway` would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from headway.local.daemon import DaemonConfig, run_daemon
from headway.local.ordering import LocalPlanner
from test_local_support import DaemonProc, as_user, need_users, shared_dir, start_daemon, wait_until

__all__ = ["shared_dir", "start_daemon"]


def test_user_b_cannot_cancel_or_read_user_a_job_and_jobs_run_as_their_submitter(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    alice, bob = need_users()
    work = shared_dir / "alice-work"
    work.mkdir()
    os.chown(work, alice.pw_uid, alice.pw_gid)
    d = start_daemon(gpus="2", state_dir=shared_dir / "state")
    assert (d.state_dir / "headway.sock").stat().st_mode & 0o777 == 0o666
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work)}
    script = 'echo "uid=$(id -u) groups=$(id -G) cwd=$(pwd)"; echo alice-secret; sleep 30'
    sub = as_user(
        alice, d.state_dir, {"op": "submit", "argv": ["sh", "-c", script], "cwd": str(work), "env": env}
    )
    jid = sub["reply"]["id"]
    assert sub["reply"]["user"] == "hw-alice"  # from the socket, not from anything the client said

    def alice_log() -> str:
        got = as_user(alice, d.state_dir, {"op": "logs", "id": jid})
        import base64

        return base64.b64decode(got["reply"]["data"]).decode()

    wait_until(lambda: "alice-secret" in alice_log(), 20, "alice's job to start")
    assert f"uid={alice.pw_uid} groups={alice.pw_gid} cwd={work}" in alice_log()

    # Bob can neither read nor cancel it, through the daemon or around it.
    denied = as_user(bob, d.state_dir, {"op": "logs", "id": jid})
    assert "belongs to hw-alice" in denied["error"]
    denied = as_user(bob, d.state_dir, {"op": "cancel", "id": jid})
    assert "belongs to hw-alice" in denied["error"]
    log_file = d.state_dir / "logs" / f"{jid}.out"
    peek = subprocess.run(
        ["runuser", "-u", bob.pw_name, "--", "cat", str(log_file)], capture_output=True, text=True
    )
    assert peek.returncode != 0 and "alice-secret" not in peek.stdout
    time.sleep(0.3)
    q = {j["id"]: j for j in d.ask({"op": "queue"})["jobs"]}
    assert q[jid]["state"] == "RUNNING"
    # Bob sees the queue (names and users, like squeue) and may act on his own jobs.
    bobs = as_user(bob, d.state_dir, {"op": "submit", "argv": ["sleep", "30"], "cwd": "/", "env": env})
    bob_id = bobs["reply"]["id"]
    assert "reply" in as_user(bob, d.state_dir, {"op": "cancel", "id": bob_id})

    # Alice may cancel her own job; root may cancel anyone's.
    assert "reply" in as_user(alice, d.state_dir, {"op": "cancel", "id": jid})
    other = as_user(
        alice, d.state_dir, {"op": "submit", "argv": ["sleep", "30"], "cwd": str(work), "env": env}
    )
    d.ask({"op": "cancel", "id": other["reply"]["id"]})  # this test process is root

    def states() -> dict[int, str]:
        return {j["id"]: j["state"] for j in d.ask({"op": "history", "limit": 100})["jobs"]}

    wait_until(lambda: len(states()) == 3, 20, "all three jobs to end")
    assert states() == {jid: "CANCELLED", bob_id: "CANCELLED", other["reply"]["id"]: "CANCELLED"}
    hist = {j["id"]: j for j in d.ask({"op": "history", "limit": 100})["jobs"]}
    assert hist[jid]["user"] == "hw-alice" and hist[bob_id]["user"] == "hw-bob"


def test_a_job_cannot_start_in_a_directory_its_user_cannot_enter(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    alice, _ = need_users()
    private = shared_dir / "root-only"
    private.mkdir(mode=0o700)
    inner = private / "inner"
    inner.mkdir(mode=0o755)
    (inner / "secret.txt").write_text("root-secret\n")
    d = start_daemon(gpus="1", state_dir=shared_dir / "state")
    env = {"PATH": "/usr/bin:/bin"}
    sub = as_user(
        alice, d.state_dir, {"op": "submit", "argv": ["cat", "secret.txt"], "cwd": str(inner), "env": env}
    )
    jid = sub["reply"]["id"]
    wait_until(lambda: bool(d.ask({"op": "history"})["jobs"]), 20, "the job to end")
    job = d.ask({"op": "history"})["jobs"][0]
    assert (job["id"], job["state"], job["exit_code"]) == (jid, "FAILED", 126)
    import base64

    out = base64.b64decode(d.ask({"op": "logs", "id": jid})["data"]).decode()
    err = base64.b64decode(d.ask({"op": "logs", "id": jid, "stream": "err"})["data"]).decode()
    assert "root-secret" not in out
    assert f"cannot enter the working directory {str(inner)!r}: Permission denied" in err, err


def test_a_daemon_not_running_as_root_refuses_jobs_from_other_users(
    shared_dir: Path, start_daemon: Callable[..., DaemonProc]
) -> None:
    alice, bob = need_users()
    state = shared_dir / "alice-state"
    state.mkdir(mode=0o755)
    os.chown(state, alice.pw_uid, alice.pw_gid)
    # Alice's own daemon (a personal queue), started from a child that dropped to her uid.
    pid = os.fork()
    if pid == 0:
        try:
            err = os.open(shared_dir / "alice-daemon.err", os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(err, 2)
            os.setgroups([])
            os.setgid(alice.pw_gid)
            os.setuid(alice.pw_uid)
            os.environ["HOME"] = str(state)
            run_daemon(DaemonConfig(state_dir=state, gpu_ids=(0,)), LocalPlanner("fifo"), log_to_stderr=False)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(0)
    try:
        err_file = shared_dir / "alice-daemon.err"
        wait_until(lambda: (state / "headway.sock").exists(), 20, f"alice's daemon ({err_file})")
        time.sleep(0.2)
        env = {"PATH": "/usr/bin:/bin"}
        refused = as_user(bob, state, {"op": "submit", "argv": ["true"], "cwd": "/", "env": env})
        assert "cannot run jobs as uid" in refused["error"]
        ok = as_user(alice, state, {"op": "submit", "argv": ["true"], "cwd": "/", "env": env})
        assert ok["reply"]["user"] == "hw-alice"
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
