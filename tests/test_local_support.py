"""Helpers for the local-queue tests that start a real daemon (plus a check that the helper itself works)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# imported before a fork drops to a user who cannot read the interpreter's own files
from headway.local import store_sync  # noqa: F401
from headway.local.client import ClientError, request

REPO = Path(__file__).resolve().parent.parent


class DaemonProc:
    """`headway daemon` as a child process, restartable (crash tests kill it with SIGKILL)."""

    def __init__(self, state_dir: Path, *args: str, gpus: str = "4", grace: float = 0.3) -> None:
        self.state_dir = state_dir
        self.args = ["--gpus", gpus, "--grace", str(grace), "--quiet", *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "headway.cli", "daemon", "--state-dir", str(self.state_dir), *self.args]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {err}")
            with contextlib.suppress(ClientError):
                pong = request(self.state_dir, {"op": "ping"}, timeout=5)
                if pong["pid"] == self.proc.pid and pong["ready"]:
                    return
            time.sleep(0.05)
        raise RuntimeError("daemon did not come up")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        return request(self.state_dir, msg)

    def submit(self, argv: list[str], **kw: Any) -> int:
        msg = {
            "op": "submit",
            "argv": argv,
            "cwd": kw.pop("cwd", os.getcwd()),
            "env": kw.pop("env", dict(os.environ)),
        }
        msg.update(kw)
        return int(self.ask(msg)["id"])

    def cleanup(self) -> None:
        """Stop the daemon and every supervisor and job this test started (found by its state dir)."""
        self.kill(signal.SIGKILL)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        marker = str(self.state_dir)
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "headway.local.supervisor" in cmd and marker in cmd:
                with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)  # the supervisor's own session and group
                for child in _children(p):
                    with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                        os.killpg(child.pid, signal.SIGKILL)  # the job's process group


def _children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return list(p.children(recursive=True))
    except psutil.Error:
        return []


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def cli(*args: str, state_dir: Path, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `headway VERB --state-dir DIR ARGS...` as a separate process, as a user would."""
    cmd = [sys.executable, "-m", "headway.cli", args[0], "--state-dir", str(state_dir), *args[1:]]
    env = {k: v for k, v in os.environ.items() if k != "HEADWAY_STATE_DIR"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


USERS = ("hw-alice", "hw-bob")


def need_users() -> tuple[pwd.struct_passwd, pwd.struct_passwd]:
    required = os.environ.get("HEADWAY_REQUIRE_SERVICES") == "1"
    why = ""
    if os.getuid() != 0:
        why = "needs root (a daemon that runs jobs as other users)"
    else:
        try:
            return pwd.getpwnam(USERS[0]), pwd.getpwnam(USERS[1])
        except KeyError:
            why = f"test users {', '.join(USERS)} missing (run: bash tests/setup/users.sh)"
    if required:
        pytest.fail(f"isolation test {why}, and HEADWAY_REQUIRE_SERVICES=1")
    pytest.skip(f"isolation test {why}")


def as_user(pw: pwd.struct_passwd, state_dir: Path, msg: dict[str, Any]) -> dict[str, Any]:
    """Send one request from a child process running as `pw` (its uid is what SO_PEERCRED reports)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to the user, then talk to the daemon
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            try:
                out: dict[str, Any] = {"reply": request(state_dir, msg)}
            except ClientError as e:
                out = {"error": str(e)}
            os.write(w, json.dumps(out).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    result: dict[str, Any] = json.loads(b"".join(chunks))
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A state dir that other users can reach (pytest's tmp dirs are private to root). Request it before
    start_daemon, so that it is removed after the daemon has been stopped."""
    base = Path(tempfile.mkdtemp(prefix="headway-shared-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProc]]:
    started: list[DaemonProc] = []

    def make(*args: str, state_dir: Path | None = None, **kw: Any) -> DaemonProc:
        d = DaemonProc(state_dir or tmp_path / "state", *args, **kw)
        d.start()
        started.append(d)
        return d

    yield make
    for d in started:
        d.cleanup()


def test_the_daemon_helper_starts_a_daemon_that_answers_with_its_gpus(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="0,1,3")
    reply = d.ask({"op": "ping"})
    assert reply["gpu_ids"] == [0, 1, 3]
    assert reply["you"] == os.getuid()
    assert (d.state_dir / "queue.sqlite").exists() and (d.state_dir / "daemon.log").exists()
