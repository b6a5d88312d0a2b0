"""Where a queue lives: the state directory and the files in it, shared by the daemon and its clients."""

from __future__ import annotations

import os
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
