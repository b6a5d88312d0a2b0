"""Helpers for the local-queue tests that start a real daemon (plus a check that the helper itself works)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

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
                if request(self.state_dir, {"op": "ping"}, timeout=5)["pid"] == self.proc.pid:
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


def cli(
    *args: str, state_dir: Path, user: str | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `headway ARGS` as a separate process (optionally as another Unix user via runuser)."""
    cmd = (
        [sys.executable, "-m", "headway.cli", *args, "--state-dir", str(state_dir)]
        if args[0] != "submit"
        else [
            sys.executable,
            "-m",
            "headway.cli",
            "submit",
            "--state-dir",
            str(state_dir),
            *args[1:],
        ]
    )
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    env = {k: v for k, v in os.environ.items() if k != "HEADWAY_STATE_DIR"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


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
