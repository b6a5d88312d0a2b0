"""Starting, signalling and cleaning up after jobs' supervisors (supervisor.py), for the daemon.

The daemon commits a step first and then calls these (daemon.py): a `Launch` becomes a spec.json in the
job's run directory and a detached supervisor process, a `Terminate` a claim or a SIGTERM, a `Preempt` a
claim or a SIGUSR1. Nothing here changes the queue's state; what happened is read back from the run
directories (runs.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from headway.local import runs
from headway.local.core import Launch, LocalJob, Preempt, Terminate
from headway.local.db import path_of
from headway.local.paths import log_paths
from headway.local.supervisor import PREEMPT_SIGNAL

log = logging.getLogger("headway.daemon")


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


class Launcher:
    """The supervisors this daemon started, and how it starts and stops them. Holding the `Popen` of each
    lets the watcher tell a supervisor that is still coming up from one that died before claiming."""

    def __init__(self, state_dir: Path, grace: float, preempt_grace: float = 30.0) -> None:
        self.state_dir = state_dir
        self.grace = grace  # seconds between SIGTERM and SIGKILL, handed to each supervisor
        self.preempt_grace = preempt_grace  # the same when the job is preempted (time to checkpoint)
        self.children: dict[tuple[int, int], subprocess.Popen[bytes]] = {}

    def launch(self, ins: Launch, row: sqlite3.Row, umask: int) -> None:
        """Write the attempt's spec and start its supervisor. Raises OSError when the spec cannot be
        written; a supervisor that cannot be started is logged, and the watcher requeues the job."""
        rdir = runs.run_dir(self.state_dir, ins.job_id, ins.attempt)
        rdir.mkdir(parents=True, exist_ok=True)
        out, err = log_paths(self.state_dir, ins.job_id)
        env = json.loads(row["env"])
        cuda = ",".join(str(g) for g in ins.gpu_ids)
        env.update(
            CUDA_VISIBLE_DEVICES=cuda,
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
            HEADWAY_JOB_ID=str(ins.job_id),
            HEADWAY_GPU_IDS=cuda,
        )
        env[runs.RUN_TOKEN_VAR] = uuid.uuid4().hex
        spec = {
            "job_id": ins.job_id,
            "attempt": ins.attempt,
            "argv": json.loads(row["argv"]),
            "cwd": path_of(row["cwd"]),
            "env": env,
            "uid": row["uid"],
            "gid": row["gid"],
            "groups": json.loads(row["groups"]),
            "time_limit": row["time_limit"],
            "grace": self.grace,
            "preempt_grace": self.preempt_grace,  # also tells the daemon this supervisor takes SIGUSR1
            "umask": umask,
            "stdout": str(out),
            "stderr": str(err),
            "run_dir": str(rdir),
        }
        runs.write_atomic(rdir / runs.SPEC, spec, fsync=False)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "headway.local.supervisor", str(rdir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            log.error("job %d: cannot start its supervisor: %s", ins.job_id, e)
            return  # the watcher sees an unclaimed run with no live child and requeues it
        self.children[(ins.job_id, ins.attempt)] = proc
        log.info("job %d: launched attempt %d on GPUs %s", ins.job_id, ins.attempt, cuda or "none")

    def supervisor_gone(self, key: tuple[int, int]) -> bool:
        """Whether the attempt's supervisor is not (or no longer) a live child of this daemon."""
        child = self.children.get(key)
        return child is None or child.poll() is not None

    def reap(self) -> None:
        """Forget the supervisors that exited (and collect their exit status: no zombies)."""
        for key, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[key]

    def terminate(self, ins: Terminate) -> bool:
        """Stop the attempt: claim it if its supervisor has not yet (then True: it never started, and the
        caller records it abandoned), else ask the supervisor to cancel it (SIGTERM)."""
        rdir = runs.run_dir(self.state_dir, ins.job_id, ins.attempt)
        rdir.mkdir(parents=True, exist_ok=True)
        if runs.try_claim(rdir, {"by": "daemon", "time": time.time(), "why": "cancelled"}):
            return True
        view = runs.inspect(rdir)
        if view.kind == "running" and view.claim:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(view.claim["pid"]), signal.SIGTERM)
                log.info("job %d: asked its supervisor to cancel it", ins.job_id)
        return False

    def preempt(self, ins: Preempt) -> bool:
        """Ask the attempt's supervisor to preempt the job (SIGUSR1: SIGTERM to the job, the preemption
        grace, SIGKILL, then status PREEMPTED). True when the attempt was claimed here before its
        supervisor did: it never started, and the caller records it abandoned (requeued)."""
        rdir = runs.run_dir(self.state_dir, ins.job_id, ins.attempt)
        rdir.mkdir(parents=True, exist_ok=True)
        if runs.try_claim(rdir, {"by": "daemon", "time": time.time(), "why": "preempted"}):
            return True
        view = runs.inspect(rdir)
        if view.kind != "running" or not view.claim:
            return False  # it ended meanwhile: the watcher reads its status
        if "preempt_grace" not in (runs.read_json(rdir / runs.SPEC) or {}):
            # launched by a headway without preemption: SIGUSR1 would kill its supervisor, not the job
            log.warning("job %d: its supervisor predates preemption; it runs to its end", ins.job_id)
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(view.claim["pid"]), PREEMPT_SIGNAL)
            log.info("job %d: asked its supervisor to preempt it", ins.job_id)
        return False

    def kill_orphans(self, job: LocalJob) -> None:
        """A lost supervisor may leave its job running: kill the job's process group before its GPUs
        go to another job."""
        rdir = runs.run_dir(self.state_dir, job.id, job.attempt)
        info = runs.read_json(rdir / runs.JOB)
        token = ((runs.read_json(rdir / runs.SPEC) or {}).get("env") or {}).get(runs.RUN_TOKEN_VAR)
        pids = runs.tagged_pids(token) if isinstance(token, str) and token else None
        if info and info.get("pgid"):
            pgid = int(info["pgid"])
            # After a reboot the number may be another group's: with a token, kill the group only if
            # one of the job's own processes is in it.
            if pids is None or any(_pgid(p) == pgid for p in pids):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
                    log.warning("job %d: its supervisor was lost; killed its process group", job.id)
        # Processes that left the group (setsid, a double fork) lost their subreaper with the supervisor:
        # they are found by the token in their environment.
        if pids:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            log.warning("job %d: killed %d of its processes that outlived its supervisor", job.id, len(pids))

    def forget_runs(self, job_id: int) -> None:
        """An ended job's run directories are no longer needed: its end is committed to SQLite."""
        for rdir in (self.state_dir / "runs").glob(f"{job_id}.*"):
            shutil.rmtree(rdir, ignore_errors=True)
