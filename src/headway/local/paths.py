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


RUN_DIR_VAR = "HEADWAY_RUN_DIR"
DEFAULT_RUN_DIR = Path("/run/headway")
SHARED_FILE = "shared"  # in the run dir: the state dir of the machine's shared (root) daemon


def run_dir() -> Path:
    """Machine-wide runtime files of headway (root's): $HEADWAY_RUN_DIR, else /run/headway."""
    env = os.environ.get(RUN_DIR_VAR)
    return Path(env) if env else DEFAULT_RUN_DIR


def register_shared(state_dir: Path) -> bool:
    """Name `state_dir` as this machine's shared queue (a root daemon does, at start), so that a user
    whose own daemon is not running is told where the shared one is; False when another registered
    daemon still answers (the first one stays the shared one). Raises OSError when the run dir cannot be
    made or is not root's alone (a user who could write it could point others at a daemon of theirs,
    which would read their jobs' commands and environments)."""
    import stat

    current = shared_state_dir()
    if current is not None and current != state_dir and _answers(current):
        return False
    d = run_dir()
    d.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise OSError(f"{d}: not a directory that root alone may write")
    if stat.S_IMODE(st.st_mode) != 0o755:
        os.chmod(d, 0o755)  # made under the daemon's umask 077: every user must read it
    tmp = d / f".{SHARED_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, os.fsencode(state_dir) + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, d / SHARED_FILE)
    return True


def shared_state_dir() -> Path | None:
    """The state dir the shared daemon registered, if root wrote it (file and directory root's, and no
    link): anything else is ignored, as a user could have written it."""
    import stat

    d = run_dir()
    try:
        dst = os.lstat(d)
        fd = os.open(d / SHARED_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if dst.st_uid != 0 or dst.st_mode & 0o022 or st.st_uid != 0 or not stat.S_ISREG(st.st_mode):
            return None
        raw = os.read(fd, 4096).strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return Path(os.fsdecode(raw)) if raw.startswith(b"/") else None


def shared_daemon_hint(asked: Path) -> str:
    """For a client that found no daemon at `asked`: `a shared daemon runs at D: use --state-dir D or
    export HEADWAY_STATE_DIR=D` when the registered shared daemon answers there, else ""."""
    shared = shared_state_dir()
    if shared is None or shared == Path(asked).absolute() or not _answers(shared):
        return ""  # none, the one asked for, or a registration left by a daemon that is gone
    return f"a shared daemon runs at {shared}: use --state-dir {shared} or export {ENV_VAR}={shared}"


def _answers(state_dir: Path) -> bool:
    """Whether a daemon listens on the socket of `state_dir` (a connect, no request)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        with socket_address(socket_path(state_dir)) as address:
            s.connect(address)
    except OSError:
        return False
    finally:
        s.close()
    return True
