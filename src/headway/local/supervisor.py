"""One job's keeper: `python -m headway.local.supervisor RUN_DIR`.

The daemon starts one supervisor per job in a new session, so it outlives a daemon crash. The supervisor
claims the attempt (see runs.py), runs the job's argv in its own process group as the submitting user,
enforces the time limit (SIGTERM, grace, SIGKILL), turns SIGTERM sent to itself into a cancellation and
SIGUSR1 into a preemption (SIGTERM to the job, the preemption grace, SIGKILL; state PREEMPTED), and records
the end in `status.json` before it exits. Standard library only, so it starts fast.

It is the job's child subreaper (Linux): a process that leaves the job's group with setsid() and is
orphaned (a daemonised data loader, `nohup ... &` under setsid) is re-parented to the supervisor, not to
init, so it stays in the supervisor's process tree and dies with the job instead of keeping its GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from headway.local import runs

_cancel = False
_preempt = False
# The daemon's request to preempt the job (stop it, to be requeued): a signal of its own, so that a
# SIGTERM still means cancel. Sent only once the supervisor has claimed its attempt, after this handler
# is in place (its default action would kill the supervisor).
PREEMPT_SIGNAL = signal.SIGUSR1


def _on_term(signum: int, frame: FrameType | None) -> None:
    global _cancel
    _cancel = True


def _on_preempt(signum: int, frame: FrameType | None) -> None:
    global _preempt
    _preempt = True


def _ignored(signum: int, frame: FrameType | None) -> None:
    """Stands in for SIG_IGN in the supervisor: a handler, unlike SIG_IGN, is reset to the default when
    the job's command is exec'd, so the job does not inherit the supervisor's indifference."""


# Signals the supervisor must survive, and that a daemon started in the background by a shell (or under
# nohup) passes down ignored. Jobs get them at their defaults, as from a login shell: a Python job's
# Ctrl-C handling works and `kill -INT`/`-HUP`/`-QUIT` stops a job.
IGNORED_HERE = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _unignore_signals() -> None:
    """The signals above, and any other that this process was started ignoring (inherited from whatever
    started the daemon, `trap '' USR1` say), go to `_ignored`: survived here, at their default in the job."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
            continue
        try:
            if sig in IGNORED_HERE or signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, _ignored)
        except (OSError, ValueError):  # a signal Python may not handle (the C library's own)
            continue


def _open_log(path: str, uid: int, gid: int) -> int:
    """Open a job's log for appending, as root on its user's behalf: relative to a descriptor of the log
    directory, never through a link, and only a plain file with one link that is new or already the
    user's (or root's), before it is given to the user. A log opened through a link a user planted gave
    them the root file at its end."""
    directory, name = os.path.split(path)
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst = os.fstat(dfd)
        if os.getuid() == 0 and (dst.st_uid != 0 or dst.st_mode & 0o022):  # checked at start; and now
            raise OSError(errno.EPERM, "a log directory others may write; not used", directory)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dfd)  # NONBLOCK: a FIFO there must not hang us
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in (uid, os.getuid()):
        os.close(fd)
        raise OSError(errno.EPERM, "not a plain log file of the job's user; not used", path)
    os.set_blocking(fd, True)  # the job's stdout shares the flag
    if os.getuid() == 0 and uid != 0:
        os.fchown(fd, uid, gid)
    return fd


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Orphans of the job's processes come back to us (Linux >= 3.4); False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _descendants(root: int) -> set[int]:
    """Every live process below `root` in the process tree (from /proc; zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited meanwhile
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _signal_tree(sig: int, skip: int) -> int:
    """Send `sig` to every process below this supervisor but `skip` (the job's leader, still unreaped);
    how many there were."""
    pids = _descendants(os.getpid()) - {skip}
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
    return len(pids)


def _reap_orphans() -> None:
    """Collect re-parented orphans' exit statuses (after the leader's), so that none lingers as a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _exited(pid: int) -> bool:
    """True once the job's leader has exited; it stays a zombie (holding its process group) until reaped."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid != 0


def _reap_others_while_running(leader: int) -> None:
    """Collect orphans that ended while the job runs (they are ours to reap as its subreaper: a job that
    spawns short-lived daemons would otherwise pile up zombies against its pid limit), never the leader,
    whose status is read at the end."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in (0, leader):
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def _wait_until(pid: int, deadline: float | None, stop_on_cancel: bool) -> bool:
    """Poll for the leader's exit; False at the deadline, or at a cancellation when asked to stop on one."""
    while True:
        _reap_others_while_running(pid)
        if _exited(pid):
            return True
        if stop_on_cancel and (_cancel or _preempt):
            return False
        if deadline is not None and time.time() >= deadline:
            return False
        time.sleep(0.02)


def _enter(cwd: str) -> None:
    """In the child, as the job's user: enter its working directory, or say why not on the job's stderr
    and exit 126 (an exception here reaches the parent only as "Exception occurred in preexec_fn")."""
    try:
        os.chdir(cwd)
    except OSError as e:
        os.write(2, f"headway: cannot enter the working directory {cwd!r}: {e.strerror}\n".encode())
        os._exit(126)


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    uid, gid = int(spec["uid"]), int(spec["gid"])
    out = _open_log(spec["stdout"], uid, gid)
    err = _open_log(spec["stderr"], uid, gid)
    kw: dict[str, Any] = {"cwd": spec["cwd"]}
    if os.getuid() == 0 and uid != 0:
        kw.update(user=uid, group=gid, extra_groups=list(spec.get("groups") or [gid]))
        # Enter the working directory only after dropping to the user (Popen's cwd= would enter it as
        # root), so a job can never start inside a directory its user could not reach.
        kw.update(cwd=None, preexec_fn=functools.partial(_enter, spec["cwd"]))
    os.umask(int(spec.get("umask", 0o022)))  # the daemon keeps its own files private with 077; not the job's
    start = time.time()
    if _preempt or _cancel:  # told to stop before the job started: it never runs
        os.close(out)
        os.close(err)
        told = "CANCELLED" if _cancel else "PREEMPTED"
        return {"state": told, "exit_code": None, "start_time": None, "end_time": time.time()}
    try:
        proc = subprocess.Popen(
            list(spec["argv"]),
            env=dict(spec["env"]),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            process_group=0,
            close_fds=True,
            **kw,
        )
    except (OSError, subprocess.SubprocessError) as e:
        cwd_failed = isinstance(e, subprocess.SubprocessError) or (
            isinstance(e, OSError) and e.filename == spec["cwd"] and kw.get("cwd") is not None
        )
        if cwd_failed:
            why = e.strerror if isinstance(e, OSError) else str(e)
            msg = f"cannot enter the working directory {spec['cwd']!r}: {why}"
        else:
            msg = f"cannot start {spec['argv'][0]!r}: {e}"
        os.write(err, f"headway: {msg}\n".encode())
        code = 127 if isinstance(e, FileNotFoundError) and not cwd_failed else 126
        return {"state": "FAILED", "exit_code": code, "start_time": start, "end_time": time.time()}
    finally:
        os.close(out)
        os.close(err)
    pid = proc.pid
    if spec.get("run_dir"):
        # Only for cleaning up after a lost supervisor: a full disk here must not fail a running job.
        with contextlib.suppress(OSError):
            runs.write_atomic(Path(spec["run_dir"]) / runs.JOB, {"pgid": pid}, fsync=False)
    limit = spec.get("time_limit")
    deadline = start + float(limit) if limit else None
    grace = float(spec.get("grace", 10.0))
    state: str | None = None
    if not _wait_until(pid, deadline, stop_on_cancel=True):
        state = "CANCELLED" if _cancel else "PREEMPTED" if _preempt else "TIMEOUT"
        if state == "PREEMPTED":  # its own grace: time to write a checkpoint
            grace = float(spec.get("preempt_grace", grace))
        _killpg(pid, signal.SIGTERM)
        _signal_tree(signal.SIGTERM, skip=pid)
        if not _wait_until(pid, time.time() + grace, stop_on_cancel=False):
            _killpg(pid, signal.SIGKILL)
            _wait_until(pid, None, stop_on_cancel=False)
    # Leftover processes of the job's group die with it, while the zombie leader still holds the group id;
    # so do those that left the group (setsid), found below us in the tree. A few rounds catch forks
    # made while the first were being killed.
    _killpg(pid, signal.SIGKILL)
    for _ in range(50):
        if not _signal_tree(signal.SIGKILL, skip=pid):
            break
        time.sleep(0.02)
    _, status = os.waitpid(pid, 0)
    _reap_orphans()
    proc.returncode = os.waitstatus_to_exitcode(status)
    end = time.time()
    rc = proc.returncode
    exit_code = rc if rc >= 0 else 128 - rc
    if state is None:
        # it ended on its own, even if a cancel or a preemption came late
        state = "COMPLETED" if rc == 0 else "FAILED"
    return {"state": state, "exit_code": exit_code, "start_time": start, "end_time": end}


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    _unignore_signals()  # not SIG_IGN: that would be inherited by the job
    signal.signal(PREEMPT_SIGNAL, _on_preempt)  # a handler: reset to the default in the job
    rdir = Path(argv[1])
    spec = runs.read_json(rdir / runs.SPEC)
    if spec is None:
        return 2
    _become_subreaper()
    lock = os.open(rdir / runs.LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held until exit: tells the daemon this supervisor is alive
    if not runs.try_claim(rdir, {"by": "supervisor", "pid": os.getpid(), "start_time": time.time()}):
        return 0  # a restarted daemon gave this attempt up before we started: never run it
    try:
        result = _run(spec)
    except Exception as e:  # record something rather than leave the job unexplained
        result = {"state": "FAILED", "exit_code": None, "start_time": None, "end_time": time.time()}
        result["error"] = repr(e)
    _record(rdir, result)
    return 0


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
RECORD_RETRY_MAX_S = 5.0


def _record(rdir: Path, result: dict[str, Any]) -> None:
    """Write the job's end to status.json. While the disk is full (or the quota spent) keep trying, with
    backoff, and stay alive holding the lock: the daemon then sees a live supervisor, not one that
    vanished, and the true exit status arrives once there is room (it was recorded FAILED)."""
    delay = 0.05
    while True:
        try:
            runs.write_atomic(rdir / runs.STATUS, result)
            return
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
        time.sleep(delay)
        delay = min(delay * 2.0, RECORD_RETRY_MAX_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
