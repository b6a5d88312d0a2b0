"""Machine-wide GPU locks, so that no two headway daemons on one machine hand out the same device.

Each daemon takes an exclusive `flock` on one file per GPU it hands out, `headway-gpu-<key>.lock` in the
lock directory, and holds it for its whole life (the kernel drops it when the daemon exits, however it
exits). A second daemon that wants a GPU that is taken refuses to start, naming the holder's PID and state
dir (written into the file by the holder). It does not skip the GPU: a queue that quietly had fewer GPUs
than it was told would park jobs that ask for them.

- A GPU NVML knows is keyed by its UUID (`GPU-8c1f...`), whatever index or `--gpus` form gave it.
- A logical GPU (an index no device has: `--gpus 4` on a machine without GPUs) is no device two queues
  could fight over, so it is locked (`logical-<index>`) only when HEADWAY_GPU_LOCK_DIR names the lock dir
  explicitly; the test suite's many daemons with `--gpus N` then never collide unless a test wants them to.

The default lock dir is /dev/shm: every Linux has it, any user's daemon can create files there (a personal
daemon must lock a GPU as much as the root one), and its sticky bit stops users from removing each other's
files. The files are opened without following links and must be plain files with one link, so a root
daemon never writes through a trap a user set there; they are made mode 0666 so whichever daemon holds one
can label it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

LOCK_DIR_VAR = "HEADWAY_GPU_LOCK_DIR"
DEFAULT_LOCK_DIR = Path("/dev/shm")


class GpuLockError(RuntimeError):
    """A GPU another daemon hands out, or a lock file that cannot be trusted; one line for the operator."""


def lock_dir() -> tuple[Path, bool]:
    """The lock directory, and whether it was named explicitly (HEADWAY_GPU_LOCK_DIR)."""
    env = os.environ.get(LOCK_DIR_VAR)
    return (Path(env), True) if env else (DEFAULT_LOCK_DIR, False)


def lock_keys(gpu_ids: tuple[int, ...], device_uuids: tuple[str, ...], logical: bool) -> dict[int, str]:
    """The lock key of each GPU to hand out: NVML's UUID for an index a device has; `logical-<i>` for the
    others when `logical` (an explicit lock dir), else none."""
    keys: dict[int, str] = {}
    for i in gpu_ids:
        if 0 <= i < len(device_uuids) and device_uuids[i]:
            keys[i] = re.sub(r"[^A-Za-z0-9._-]", "_", device_uuids[i])
        elif logical:
            keys[i] = f"logical-{i}"
    return keys


def _open(path: Path) -> int:
    """Open (creating it if need be) a lock file without following a link; read-only where another
    user's daemon made it and this one may not write it."""
    base = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO put there must not hang us
    while True:
        try:
            return os.open(path, os.O_RDWR | base)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | base, 0o666)
            except FileExistsError:
                continue  # another daemon made it just now
            os.fchmod(fd, 0o666)
            return fd
        except PermissionError:
            return os.open(path, os.O_RDONLY | base)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise GpuLockError(f"{path}: a symbolic link where a GPU lock file belongs") from None
            raise


def _holder(fd: int) -> str:
    """`the headway daemon of PID N (state dir D)` from the file's label, or a vaguer phrase."""
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        if isinstance(info, dict) and isinstance(info.get("pid"), int) and _alive(info["pid"]):
            return f"the headway daemon of PID {info['pid']} (state dir {info.get('state_dir')})"
    return "another headway daemon"


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists (a label left by an earlier holder names a dead one)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True  # another user's process
    return True


@dataclass(slots=True)
class GpuLocks:
    """The lock files a daemon holds; closing them (or exiting) lets another daemon have the GPUs."""

    fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def __del__(self) -> None:  # a Daemon object dropped without close (tests) must not keep GPUs
        self.close()


def acquire(keys: dict[int, str], directory: Path, label: dict[str, object]) -> GpuLocks:
    """Lock every GPU of `keys` in `directory` and label each file with `label` (pid, state dir), or
    raise GpuLockError naming the first GPU that is taken and by whom (holding none of them then)."""
    held = GpuLocks()
    data = json.dumps(label).encode()
    try:
        for gpu, key in sorted(keys.items()):
            path = directory / f"headway-gpu-{key}.lock"
            while True:
                fd = _open(path)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                        raise GpuLockError(f"{path}: not a plain lock file (a device, a FIFO or a hard link)")
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        named = f"GPU {gpu}" + (f" ({key})" if not key.startswith("logical-") else "")
                        raise GpuLockError(
                            f"{named} is already handed out by {_holder(fd)}: two queues on one GPU would "
                            "run two jobs on it at once; submit to that queue, or give this daemon other "
                            "GPUs with --gpus"
                        ) from None
                    try:
                        same = os.stat(path, follow_symlinks=False).st_ino == st.st_ino
                    except FileNotFoundError:
                        same = False
                    if not same:  # its owner removed it between our open and our lock: take the new one
                        os.close(fd)
                        continue
                except BaseException:
                    os.close(fd)
                    raise
                held.fds.append(fd)
                with contextlib.suppress(OSError):  # read-only (another user's file): unlabelled
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, data, 0)
                break
    except BaseException:
        held.close()
        raise
    return held
