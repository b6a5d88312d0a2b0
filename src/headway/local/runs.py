"""The run directory: the only channel between the daemon and a job's supervisor, durable across crashes.

One directory per launch attempt (`runs/<job>.<attempt>/`) holds:

- `spec.json`: what to run (written by the daemon before it starts the supervisor),
- `lock`: flock-ed by the supervisor for its whole life, so anyone can tell whether it is alive,
- `claim`: created exactly once with `link()` (atomic, fails if present). The supervisor claims before it
  starts the job; a restarted daemon that finds an unclaimed launch claims it as "abandoned", which makes a
  late supervisor give up. So an attempt runs at most once, whoever crashes when.
- `job.json`: the job's process group id, written once it has started,
- `status.json`: the job's end, written by the supervisor with temp file + rename before it exits.

Only the standard library here: the supervisor imports this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPEC = "spec.json"
LOCK = "lock"
CLAIM = "claim"
STATUS = "status.json"
JOB = "job.json"  # the job's process group id, for cleanup if its supervisor is ever lost


def run_dir(state_dir: Path, job_id: int, attempt: int) -> Path:
    return state_dir / "runs" / f"{job_id}.{attempt}"


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_new(tmp: Path, data: dict[str, Any], fsync: bool) -> None:
    """Write JSON to `tmp`, never through a link; on failure (a full disk) remove what was written, so
    that a retry has the room back."""
    try:
        with os.fdopen(os.open(tmp, _CREATE, 0o600), "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: dict[str, Any], *, fsync: bool = True) -> None:
    """Write JSON so a reader sees the old file or the whole new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write_new(tmp, data, fsync)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, OSError):
        return None
    return data if isinstance(data, dict) else None


def try_claim(rdir: Path, data: dict[str, Any]) -> bool:
    """Create `claim` with `data` atomically; False if someone claimed this attempt first."""
    tmp = rdir / f".claim.{os.getpid()}.tmp"
    _write_new(tmp, data, fsync=True)
    try:
        os.link(tmp, rdir / CLAIM)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@dataclass(frozen=True, slots=True)
class RunView:
    """What a daemon can learn of one launch attempt from its run directory."""

    kind: str  # "unclaimed" | "abandoned" | "running" | "ended" | "lost"
    claim: dict[str, Any] | None = None
    status: dict[str, Any] | None = None


def inspect(rdir: Path) -> RunView:
    """Classify an attempt. Never blocks; the lock tells a live supervisor from a dead one."""
    status = read_json(rdir / STATUS)
    # Test for the claim first and read it after: a claim never disappears, and it is created whole
    # (link), so reading it once it exists cannot see a claim that is "not yet there" any more.
    if not (rdir / CLAIM).exists():
        return RunView("unclaimed")
    claim = read_json(rdir / CLAIM)
    if status is not None:
        return RunView("ended", claim, status)
    if claim is not None and claim.get("by") == "daemon":
        return RunView("abandoned", claim)
    try:
        fd = os.open(rdir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except FileNotFoundError:
        return RunView("lost", claim)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return RunView("running", claim)
        # The supervisor writes its status before it releases the lock (by exiting): look once more.
        status = read_json(rdir / STATUS)
        if status is not None:
            return RunView("ended", claim, status)
        return RunView("lost", claim)
    finally:
        os.close(fd)


RUN_TOKEN_VAR = "HEADWAY_RUN_TOKEN"  # in every job's environment: one value per launch (`tagged_pids`)


def tagged_pids(token: str) -> list[int]:
    """Live processes whose environment carries this launch's token: a job's processes that outlived
    its supervisor (killed by the OOM killer or an admin), whatever session or parent they now have.
    Processes that cleared their environment, or of other users for a daemon that is not root, are not
    seen."""
    want = f"{RUN_TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue  # gone, or not ours to read
        if want in env.split(b"\0"):
            found.append(int(entry))
    return found
