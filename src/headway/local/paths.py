"""Where a queue lives: the state directory and the files in it, shared by the daemon and its clients."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_VAR = "HEADWAY_STATE_DIR"
SOCKET = "headway.sock"
STATE_DB = "queue.sqlite"
DAEMON_LOG = "daemon.log"
DAEMON_LOCK = "daemon.lock"
JOB_STORE = "jobs.duckdb"
MODEL_FILE = "predictor.json"  # the predictor's latest model, so a restart need not retrain


def default_state_dir() -> Path:
    """$HEADWAY_STATE_DIR, else ~/.local/state/headway (a personal queue)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path.home() / ".local" / "state" / "headway"


def resolve_state_dir(given: Path | None) -> Path:
    return (given if given is not None else default_state_dir()).expanduser().absolute()


def socket_path(state_dir: Path) -> Path:
    return state_dir / SOCKET


def log_paths(state_dir: Path, job_id: int) -> tuple[Path, Path]:
    """The job's stdout and stderr files."""
    d = state_dir / "logs"
    return d / f"{job_id}.out", d / f"{job_id}.err"


SUN_PATH_MAX = 107  # bytes a Unix socket's path may have (sockaddr_un.sun_path, less its NUL)


@contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """A name for binding or connecting to the socket at `path`: the path itself, or, when it is too long
    for a socket address (a deep state dir), the same file reached through a descriptor of its directory
    (`/proc/self/fd/N/headway.sock`, Linux). Raises OSError when the directory cannot be opened."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
