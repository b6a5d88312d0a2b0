"""The daemon's I/O layer: socket, SQLite, supervisors, job store. All state changes go through QueueCore.

One thread runs an asyncio loop. Each request is handled to the end (core event, SQLite commit, reply)
without awaiting in between, so requests never interleave. A watcher task polls the run directories of
launched jobs, feeds what it finds to the core, runs a scheduling pass and carries out the instructions.
The order is always: commit the new state, then act (start a supervisor or signal one). A crash between
the two is repaired on restart by `recover`, which reads the run directories (see runs.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headway.local import runs
from headway.local.core import (
    PRIORITIES,
    Abandoned,
    CancelRequested,
    Claimed,
    Event,
    Finished,
    JobState,
    Launch,
    LocalJob,
    LogDecision,
    Lost,
    Planner,
    QueueCore,
    Record,
    Step,
    Submitted,
    Terminate,
    Tick,
)
from headway.local.db import StateDB, path_of, path_value
from headway.local.paths import (
    DAEMON_LOCK,
    DAEMON_LOG,
    JOB_STORE,
    MODEL_FILE,
    STATE_DB,
    log_paths,
    socket_address,
    socket_path,
)
from headway.local.views import JobViews

# Files of the state dir only the daemon's owner may read (see `Daemon.open`).
PRIVATE_FILES = (
    STATE_DB,
    f"{STATE_DB}-wal",
    f"{STATE_DB}-shm",
    f"{STATE_DB}-journal",
    DAEMON_LOG,
    JOB_STORE,
    f"{JOB_STORE}.wal",
)

log = logging.getLogger("headway.daemon")

MAX_REQUEST = 16 * 1024 * 1024
LOG_CHUNK = 256 * 1024
# Writing ended jobs into the DuckDB store while another process holds it: retry after 1, 2, 4 ... 60 s,
# and warn once per 10 minutes of failing.
STORE_RETRY_MIN_S = 1.0
STORE_RETRY_MAX_S = 60.0
STORE_WARN_EVERY_S = 600.0


class DaemonError(RuntimeError):
    """Start-up problems worth one line: state dir not writable, another daemon running, and so on."""


class RequestError(ValueError):
    """A refused request; the message goes back to the client."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is on the other end of the socket, from SO_PEERCRED (never from the request)."""

    pid: int
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def _gpu_list(ids: tuple[int, ...], names: tuple[str, ...]) -> str:
    """`0,1` or, for GPUs NVML named, `0,1 (2x NVIDIA H200)`: what an operator checks in the log."""
    if not ids:
        return "-"
    text = ",".join(map(str, ids))
    real = sorted({n for n in names if n not in ("logical", "listed")})
    if real:
        text += " (" + ", ".join(f"{names.count(n)}x {n}" for n in real) + ")"
    return text


@dataclass(slots=True)
class DaemonConfig:
    state_dir: Path
    gpu_ids: tuple[int, ...]
    policy: str = "impact"
    store_path: Path | None = None  # DuckDB job store; default <state dir>/jobs.duckdb
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL at a time limit or cancellation
    poll: float = 0.05  # seconds between looks at running jobs' run directories
    min_pass: float = 0.2  # seconds between scheduling passes while things keep changing
    gpu_note: str = ""
    gpu_names: tuple[str, ...] = ()  # NVML's model names, one per id ("logical"/"listed" otherwise)

    @property
    def store(self) -> Path:
        return self.store_path or (self.state_dir / JOB_STORE)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _peer(sock: socket.socket) -> Caller:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(pid, uid, gid)


class Daemon:
    def __init__(
        self,
        cfg: DaemonConfig,
        planner: Planner,
        predictor: Any = None,
        predictor_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_dir
        self.core = QueueCore(cfg.gpu_ids, planner)
        self.predictor = predictor  # headway.predict.api.OnlinePredictor, or None
        # Building the predictor (imports, reading the store, training) runs in a thread after the
        # socket is up; until it is ready, nothing is started, so the order never misses predictions.
        self.predictor_factory = predictor_factory
        self._loading: asyncio.Future[Any] | None = None
        self._loading_since = 0.0
        self._loading_kind = "load"
        self._ended_while_loading: list[LocalJob] = []
        self._gave_up_waiting = False
        self.db: StateDB | None = None
        self.views: JobViews | None = None
        self.children: dict[tuple[int, int], subprocess.Popen[bytes]] = {}
        self.wake = asyncio.Event()
        self._last_retrain = time.time()
        self.dirty = True
        self.last_tick = 0.0
        self.stopping = False
        self._lock_fd: int | None = None
        self.my_uid = os.getuid()
        self.job_umask = 0o022  # the umask jobs run with: the one the daemon was started with (`open`)

    # ---------- start-up ----------

    def open(self, log_to_stderr: bool = False) -> None:
        """Take the state dir (one daemon per dir), open SQLite and recover what a crash left behind."""
        sd = self.state_dir
        try:
            sd.mkdir(parents=True, exist_ok=True, mode=0o755 if self.my_uid == 0 else 0o700)
            for sub in ("runs", "logs"):
                (sd / sub).mkdir(exist_ok=True, mode=0o700 if sub == "runs" else 0o711)
            fd = os.open(sd / DAEMON_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise DaemonError(f"{sd}: cannot use it as the state directory: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(f"{sd}: another headway daemon is already running on this state dir") from None
        self._lock_fd = fd
        # The daemon's own files are private whatever umask it was started with: the job database holds
        # each job's argv, working directory and whole environment (tokens included), the log the same
        # commands. Jobs get the umask back (the supervisor sets it before it starts the command).
        self.job_umask = os.umask(0o077)
        for name in PRIVATE_FILES:  # left readable by a version that did not do this
            with contextlib.suppress(FileNotFoundError):
                os.chmod(sd / name, 0o600)
        setup_logging(sd, log_to_stderr)
        self.db = StateDB(sd / STATE_DB)
        self.views = JobViews(self.db, self.core)
        self.recover()

    def recover(self) -> None:
        """Adopt jobs whose supervisors outlived the last daemon; collect the ones that ended meanwhile."""
        db = self._db()
        active = db.load_active()
        self.core.load(active, db.ended_states())
        for g in sorted(self.core.retired):
            holder = next(j.id for j in active if g in j.gpu_ids)
            log.warning(
                "job %d holds GPU %d, which this daemon no longer hands out: it keeps it until it ends",
                holder,
                g,
            )
        events: list[Event] = []
        resend: list[Terminate] = []
        n_gpus = len(self.cfg.gpu_ids)
        for job in active:
            if job.state is JobState.PENDING:
                if job.gpus > n_gpus:  # queued before a restart with fewer GPUs (or NVML not up yet)
                    log.warning(
                        "job %d asks for %d GPUs and this daemon hands out %d: it waits (BadConstraints) "
                        "until a daemon with enough GPUs runs, or is cancelled",
                        job.id,
                        job.gpus,
                        n_gpus,
                    )
                continue
            rdir = runs.run_dir(self.state_dir, job.id, job.attempt)
            rdir.mkdir(parents=True, exist_ok=True)
            view = runs.inspect(rdir)
            if view.kind == "unclaimed":
                if runs.try_claim(rdir, {"by": "daemon", "time": time.time()}):
                    events.append(Abandoned(job.id, job.attempt))
                    continue
                view = runs.inspect(rdir)
            events.extend(self._events_for(job, view))
            if view.kind == "running" and job.cancel_requested:
                resend.append(Terminate(job.id, job.attempt))
        n_adopted = sum(1 for j in active if j.state is not JobState.PENDING)
        if events:
            self._apply(self.core.handle(*events))
        for t in resend:
            self._terminate(t)
        log.info(
            "recovered: %d pending, %d launched before the restart, %d events collected",
            sum(1 for j in active if j.state is JobState.PENDING),
            n_adopted,
            len(events),
        )

    def _events_for(self, job: LocalJob, view: runs.RunView) -> list[Event]:
        """Core events for what the run directory of a launched job shows."""
        out: list[Event] = []
        if view.kind == "abandoned":
            out.append(Abandoned(job.id, job.attempt))
        elif view.kind in ("running", "ended") and job.state is JobState.LAUNCHING and view.claim:
            out.append(Claimed(job.id, job.attempt, float(view.claim.get("start_time") or time.time())))
        if view.kind == "ended" and view.status is not None:
            st = view.status
            out.append(
                Finished(
                    job.id,
                    job.attempt,
                    JobState(st["state"]),
                    st.get("exit_code"),
                    st.get("start_time"),
                    float(st.get("end_time") or time.time()),
                )
            )
        elif view.kind == "lost":
            self._kill_orphans(job)
            out.append(Lost(job.id, job.attempt, time.time()))
        return out

    def _kill_orphans(self, job: LocalJob) -> None:
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

    def _db(self) -> StateDB:
        assert self.db is not None, "Daemon.open() first"
        return self.db

    # ---------- applying a core step ----------

    def _apply(self, step: Step, now: float | None = None) -> None:
        """Persist the step in one transaction, then carry out its instructions."""
        db = self._db()
        now = time.time() if now is None else now
        ended = self.core.take_ended()
        try:
            with db.transaction():
                jobs = [j for jid in step.changed if (j := self.core.jobs.get(jid) or ended.get(jid))]
                db.save(jobs)
                db.log_events(now, step.log)
                for ins in step.instructions:
                    if isinstance(ins, LogDecision):
                        db.log_decision(ins.plan, ins.now)
        except Exception:
            self._resync()  # nothing of the step was carried out; the core follows the database again
            raise
        if step.changed:
            self.dirty = True
        for ins in step.instructions:
            if isinstance(ins, Launch):
                try:
                    self._launch(ins)
                except OSError as e:  # a full disk at spec.json: this launch only; poll_runs requeues it
                    log.error("job %d: cannot prepare its launch: %s", ins.job_id, e)
            elif isinstance(ins, Terminate):
                self._terminate(ins)
            elif isinstance(ins, Record):
                self._observe(ins.job)
                self._forget_runs(ins.job.id)

    def _resync(self) -> None:
        """After a failed commit (a full disk, a locked file) the core is ahead of the database: load it
        again from the database, as at a restart. The run directories tell the rest (poll_runs)."""
        db = self._db()
        self.core.reset()
        try:
            self.core.load(db.load_active(), db.ended_states())
        except Exception:
            # An empty core would hand out GPUs that running jobs hold. Stop instead: the jobs run on
            # under their supervisors, and a restarted daemon recovers them from the database.
            log.critical("cannot read the job database again after a failed write: stopping", exc_info=True)
            self.broken = True
            self._stop()
        self.dirty = True

    def _launch(self, ins: Launch) -> None:
        db = self._db()
        row = db.row(ins.job_id)
        assert row is not None
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
            "grace": self.cfg.grace,
            "umask": self.job_umask,
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

    def _terminate(self, ins: Terminate) -> None:
        rdir = runs.run_dir(self.state_dir, ins.job_id, ins.attempt)
        rdir.mkdir(parents=True, exist_ok=True)
        if runs.try_claim(rdir, {"by": "daemon", "time": time.time(), "why": "cancelled"}):
            self._apply(self.core.handle(Abandoned(ins.job_id, ins.attempt)))  # never started
            return
        view = runs.inspect(rdir)
        if view.kind == "running" and view.claim:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(view.claim["pid"]), signal.SIGTERM)
                log.info("job %d: asked its supervisor to cancel it", ins.job_id)

    def _forget_runs(self, job_id: int) -> None:
        """An ended job's run directories are no longer needed: its end is committed to SQLite."""
        for rdir in (self.state_dir / "runs").glob(f"{job_id}.*"):
            shutil.rmtree(rdir, ignore_errors=True)

    def _observe(self, job: LocalJob) -> None:
        log.info("job %d ended %s (exit %s)", job.id, job.state, job.exit_code)
        book = getattr(self.core.planner, "book", None)
        if book is not None and job.end_time is not None:
            book.add(job.user, job.name, job.state.value, float(job.gpus), job.start_time, job.end_time)
        if self._loading is not None:
            self._ended_while_loading.append(job)
            return
        self._feed_predictor(job)

    def _feed_predictor(self, job: LocalJob) -> None:
        if self.predictor is None or job.start_time is None:
            return
        from headway.local.ordering import ended_for_predictor

        try:
            self.predictor.observe_end(ended_for_predictor(job))
        except Exception:  # the predictor must never take the queue down
            log.exception("predictor.observe_end failed")

    # ---------- the watcher ----------

    def poll_runs(self) -> None:
        """Look at every launched job's run directory and feed what changed to the core."""
        events: list[Event] = []
        for job in list(self.core.jobs.values()):
            if job.state is JobState.PENDING:
                continue
            key = (job.id, job.attempt)
            rdir = runs.run_dir(self.state_dir, *key)
            view = runs.inspect(rdir)
            if view.kind == "unclaimed":
                child = self.children.get(key)
                if child is None or child.poll() is not None:  # its supervisor never came up
                    rdir.mkdir(parents=True, exist_ok=True)  # a launch that failed before writing it
                    if runs.try_claim(rdir, {"by": "daemon", "time": time.time()}):
                        events.append(Abandoned(*key))
                        continue
                    view = runs.inspect(rdir)
                else:
                    continue
            if view.kind == "running" and job.state is JobState.RUNNING:
                continue
            events.extend(self._events_for(job, view))
        for key, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[key]
        if events:
            self._apply(self.core.handle(*events))

    def predict_new(self, now: float, refresh: bool = False) -> None:
        """Predictions for pending jobs that have none yet, or all of them after a retrain (one call)."""
        if self.predictor is None:
            return
        todo = [
            j
            for j in self.core.jobs.values()
            if j.state is JobState.PENDING and (refresh or j.p_success is None)
        ]
        if not todo:
            return
        from headway.local.ordering import predicted_events

        try:
            events = predicted_events(self.predictor, todo, now)
        except Exception:
            log.exception("prediction failed; ranking without it")
            return
        self._apply(self.core.handle(*events))

    def retrain(self, now: float) -> None:
        """Let the predictor retrain (in a thread) when it is due; the new model is saved in the state dir.

        While the predictor is busy, requests are served but nothing is started, so no job is ordered
        without its prediction; ends seen meanwhile are fed to it afterwards."""
        self._last_retrain = now
        if self.predictor is None or self._loading is not None:
            return
        self._loading_kind = "retrain"
        self._loading_since = now
        self._loading = asyncio.get_running_loop().run_in_executor(None, self._retrain_job, now)

    def _retrain_job(self, now: float) -> bool:
        if not self.predictor.maybe_retrain(now):
            return False
        model = getattr(self.predictor, "model", None)
        if model is not None and hasattr(model, "save"):
            model.save(self.state_dir / MODEL_FILE)
        return True

    def schedule(self, now: float) -> None:
        self.predict_new(now)
        self.dirty = False
        self.last_tick = now
        self._apply(self.core.handle(Tick(now)), now)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=self.cfg.poll)
        self.wake.clear()

    def _predictor_ready(self, now: float) -> bool:
        """Swap in the predictor once its thread is done (or give up waiting after a minute)."""
        fut = self._loading
        assert fut is not None
        if not fut.done():
            if now - self._loading_since < 60.0:
                return False
            if not self._gave_up_waiting:
                log.warning("the predictor is still loading after 60 s; scheduling without it meanwhile")
                self._gave_up_waiting = True
            return True
        self._loading = None
        try:
            result = fut.result()
        except Exception:
            log.exception("predictor %s failed; carrying on without it", self._loading_kind)
            result = None
        if self._loading_kind == "load":
            self.predictor = result
            log.info("predictor ready (%.1f s)", now - self._loading_since)
        elif result:
            log.info(
                "predictor retrained (%.1f s); refreshing pending jobs' predictions",
                now - self._loading_since,
            )
        for job in self._ended_while_loading:  # logged and booked when they ended: only the predictor
            self._feed_predictor(job)
        self._ended_while_loading.clear()
        self.predict_new(now, refresh=True)
        self.dirty = True
        return True

    _pass_failures = 0
    _pass_logged = 0.0

    async def watch(self) -> None:
        while not self.stopping:
            try:
                self.poll_runs()
                now = time.time()
                if self._loading is not None and not self._predictor_ready(now):
                    await self._pause()
                    continue
                plan = self.core.last_plan
                wake = plan is not None and plan.wake_at is not None and now >= plan.wake_at
                # A pass ranks the whole queue: at most one per `min_pass` seconds, so a burst of
                # submissions is ranked once, not once per job.
                due = now - self.last_tick >= self.cfg.min_pass
                if (self.dirty and due) or wake or now - self.last_tick > 5.0:
                    self.schedule(now)
                self.flush_store_soon()
                if now - self._last_retrain > 60.0:
                    self.retrain(now)
                self._pass_failures = 0
            except Exception:
                # A full disk or a locked database fails every pass until it is fixed: log the first
                # failure and then one a minute, and wait longer between tries (up to 30 s), so the
                # daemon's log does not fill the disk it needs back.
                self._pass_failures += 1
                if self._pass_failures == 1 or time.time() - self._pass_logged >= 60.0:
                    log.exception("watcher pass failed (%d in a row)", self._pass_failures)
                    self._pass_logged = time.time()
                await asyncio.sleep(min(30.0, 0.5 * 2 ** min(self._pass_failures - 1, 6)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.cfg.poll)
            self.wake.clear()

    # ---------- the job store (DuckDB) ----------

    _flush_task: asyncio.Task[None] | None = None
    _last_flush: float = 0.0
    _flush_delay: float = STORE_RETRY_MIN_S  # doubles while the store cannot be written
    _flush_failing_since: float | None = None
    _flush_warned: float = 0.0

    def flush_store_soon(self) -> None:
        if self._flush_task is not None and not self._flush_task.done():
            return
        if self._loading is not None and self._loading_kind == "load":
            return  # the predictor's thread is reading the store; write after it
        if time.time() - self._last_flush < self._flush_delay:
            return
        rows = self._db().unstored()
        if not rows:
            return
        self._last_flush = time.time()
        self._flush_task = asyncio.get_running_loop().create_task(self._flush([dict(r) for r in rows]))

    async def _flush(self, rows: list[dict[str, Any]]) -> None:
        from headway.local.store_sync import write_ended

        try:
            await asyncio.to_thread(write_ended, self.cfg.store, rows)
        except Exception as e:  # locked by a reader, disk full: keep them unstored and retry later
            # Backing off, and one warning per STORE_WARN_EVERY_S: a reader holding the store for an hour
            # wrote a line a second before.
            now = time.time()
            self._flush_delay = min(self._flush_delay * 2.0, STORE_RETRY_MAX_S)
            if self._flush_failing_since is None:
                self._flush_failing_since = now
            if now - self._flush_warned >= STORE_WARN_EVERY_S:
                self._flush_warned = now
                log.warning(
                    "job store %s not written yet (%s); %d ended job(s) stay in the queue's database, "
                    "retrying every %.0f s or less",
                    self.cfg.store,
                    e,
                    len(rows),
                    STORE_RETRY_MAX_S,
                )
            return
        with self._db().transaction():
            self._db().mark_stored([int(r["id"]) for r in rows])
        if self._flush_failing_since is not None:
            log.info(
                "job store %s written again after %.0f s",
                self.cfg.store,
                time.time() - self._flush_failing_since,
            )
        self._flush_delay, self._flush_failing_since, self._flush_warned = STORE_RETRY_MIN_S, None, 0.0

    def flush_store_now(self) -> None:
        from headway.local.store_sync import write_ended

        rows = [dict(r) for r in self._db().unstored(limit=100_000)]
        if rows:
            write_ended(self.cfg.store, rows)
            with self._db().transaction():
                self._db().mark_stored([int(r["id"]) for r in rows])

    # ---------- the socket ----------

    async def serve(self) -> None:
        path = socket_path(self.state_dir)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a dead daemon (we hold the state dir's lock)
        with socket_address(path) as address:  # a deep state dir's path is too long to bind as it is
            server = await asyncio.start_unix_server(self._client, path=address, limit=MAX_REQUEST)
        os.chmod(path, 0o666)  # anyone may connect; SO_PEERCRED decides what they may do
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop)
        log.info(
            "headway daemon up: %d GPU(s) %s, policy %s, socket %s",
            len(self.cfg.gpu_ids),
            _gpu_list(self.cfg.gpu_ids, self.cfg.gpu_names),
            self.cfg.policy,
            path,
        )
        if self.predictor_factory is not None:
            self._loading_since = time.time()
            self._loading_kind = "load"
            self._loading = loop.run_in_executor(None, self.predictor_factory)
        watcher = loop.create_task(self.watch())
        async with server:
            while not self.stopping:
                await asyncio.sleep(0.2)
        server.close()
        await watcher
        if self._flush_task is not None:
            await self._flush_task
        with contextlib.suppress(Exception):
            self.flush_store_now()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        log.info("headway daemon stopped; running jobs keep running under their supervisors")

    def _stop(self) -> None:
        self.stopping = True
        self.wake.set()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            caller = _peer(sock)
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                line = b""
            try:
                msg = json.loads(line) if line else None
                if not isinstance(msg, dict):
                    raise RequestError("malformed request")
                reply = {"ok": True, **self.handle(caller, msg)}
            except RequestError as e:
                reply = {"ok": False, "error": str(e)}
            except Exception as e:
                log.exception("request failed")
                reply = {"ok": False, "error": f"internal error: {e}"}
            writer.write(json.dumps(reply, default=str).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # ---------- requests ----------

    broken = False  # the core could not be reloaded from the database (_resync): serve nothing more

    def handle(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        if self.broken:
            raise RequestError("the daemon cannot read its job database and is stopping; start it again")
        op = msg.get("op")
        fn: Callable[[Caller, dict[str, Any]], dict[str, Any]] | None = getattr(self, f"op_{op}", None)
        if not isinstance(op, str) or fn is None:
            raise RequestError(f"unknown request {op!r}")
        return fn(caller, msg)

    def op_ping(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        from headway import __version__

        return {
            "version": __version__,
            "pid": os.getpid(),
            "gpu_ids": list(self.cfg.gpu_ids),
            "gpu_names": list(self.cfg.gpu_names),
            "policy": self.cfg.policy,
            "store": str(self.cfg.store),
            "note": self.cfg.gpu_note,
            "you": caller.uid,
            # False while the predictor loads at start-up: requests are served, nothing starts yet
            "ready": not (self._loading is not None and self._loading_kind == "load"),
        }

    def op_submit(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        if self.my_uid != 0 and caller.uid != self.my_uid:
            raise RequestError(
                f"this daemon runs as uid {self.my_uid} and cannot run jobs as uid {caller.uid} "
                "(a shared queue needs a daemon started as root)"
            )
        try:
            pw = pwd.getpwuid(caller.uid)
        except KeyError:
            raise RequestError(f"uid {caller.uid} has no passwd entry") from None
        argv = msg.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise RequestError("submit needs a command: headway submit -- CMD ARGS...")
        cwd = msg.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise RequestError("submit needs an absolute working directory")
        env = msg.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise RequestError("env must map strings to strings")
        gpus = msg.get("gpus", 1)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise RequestError(f"--gpus must be a whole number >= 0, got {gpus!r}")
        if gpus > len(self.cfg.gpu_ids):
            raise RequestError(f"the job asks for {gpus} GPUs; this server has {len(self.cfg.gpu_ids)}")
        limit = msg.get("time_limit")
        if limit is not None and (not isinstance(limit, int | float) or limit <= 0):
            raise RequestError(f"time limit must be a positive number of seconds, got {limit!r}")
        prio = msg.get("priority") or "normal"
        if prio not in PRIORITIES:
            raise RequestError(f"--priority must be one of {', '.join(PRIORITIES)}, got {prio!r}")
        after = msg.get("after")
        if after is not None and (not isinstance(after, int) or self.core.state_of(after) is None):
            raise RequestError(f"--after {after}: no such job")
        name = msg.get("name") or os.path.basename(argv[0])
        if not isinstance(name, str) or len(name) > 200:
            raise RequestError("--name must be a string of at most 200 characters")
        if not name.isprintable():  # a tab or newline broke every table that lists the job
            if msg.get("name"):
                raise RequestError(f"--name {name!r}: no tabs, newlines or other control characters")
            name = "".join(c if c.isprintable() else "?" for c in name)
        groups = sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))
        now = time.time()
        db = self._db()
        try:
            with db.transaction():
                jid = db.insert_job(
                    {
                        "user": pw.pw_name,
                        "uid": caller.uid,
                        "gid": pw.pw_gid,
                        "groups": json.dumps(groups),
                        "name": name,
                        "argv": json.dumps(argv),
                        "cwd": path_value(cwd),
                        "env": json.dumps(env),
                        "gpus": gpus,
                        "time_limit": float(limit) if limit is not None else None,
                        "priority": prio,
                        "after": after,
                        "submit_time": now,
                        "state": JobState.PENDING.value,
                    }
                )
                job = LocalJob(
                    id=jid,
                    user=pw.pw_name,
                    uid=caller.uid,
                    name=name,
                    gpus=gpus,
                    submit_time=now,
                    time_limit=float(limit) if limit is not None else None,
                    priority=prio,
                    after=after,
                )
                step = self.core.handle(Submitted(job))
                db.log_events(now, step.log)
        except sqlite3.Error as e:
            self._resync()  # the core heard of the job inside the transaction that failed
            log.error("submit of %r by %s not stored: %s", name, pw.pw_name, e)
            raise RequestError(
                f"the job was not queued: the queue's database cannot be written ({e})"
            ) from None
        self.dirty = True
        self.wake.set()
        return {"id": jid, "name": name, "user": pw.pw_name}

    def _owned(self, caller: Caller, job_id: Any, verb: str) -> dict[str, Any]:
        if not isinstance(job_id, int):
            raise RequestError(f"{verb}: job id must be a number")
        if not 0 < job_id < 2**63:  # SQLite's integers end there
            raise RequestError(f"no job {job_id}")
        row = self._db().row(job_id)
        if row is None:
            raise RequestError(f"no job {job_id}")
        if not caller.is_root and row["uid"] != caller.uid:
            raise RequestError(f"job {job_id} belongs to {row['user']}; you may only {verb} your own jobs")
        return dict(row)

    def op_cancel(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        jid = msg.get("id")
        row = self._owned(caller, jid, "cancel")
        assert isinstance(jid, int)
        state = JobState(row["state"])
        if not state.active:
            return {"id": jid, "state": state.value, "note": f"job {jid} already ended ({state})"}
        self._apply(self.core.handle(CancelRequested(jid, time.time())))
        self.wake.set()
        job = self.core.job(jid)
        now_state = job.state.value if job else self._db().row(jid)["state"]  # type: ignore[index]
        return {"id": jid, "state": now_state}

    def op_logs(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        jid = msg.get("id")
        row = self._owned(caller, jid, "read the logs of")
        assert isinstance(jid, int)
        stream = msg.get("stream", "out")
        if stream not in ("out", "err"):
            raise RequestError("stream must be out or err")
        offset = msg.get("offset", 0)
        if not isinstance(offset, int) or offset < 0:
            raise RequestError("offset must be a byte offset >= 0")
        path = log_paths(self.state_dir, jid)[0 if stream == "out" else 1]
        data = b""
        size = 0
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(LOG_CHUNK)
        return {
            "id": jid,
            "data": base64.b64encode(data).decode(),
            "offset": offset + len(data),
            "size": size,
            "ended": not JobState(row["state"]).active,
            "state": row["state"],
        }

    def op_queue(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.views is not None
        return {
            "jobs": self.views.queue(include_ended=bool(msg.get("all"))),
            "gpu_ids": list(self.cfg.gpu_ids),
        }

    def op_history(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.views is not None
        limit = msg.get("limit", 100)
        if not isinstance(limit, int) or limit < 0:
            raise RequestError("limit must be a number >= 0")
        user = msg.get("user")
        if user is not None and not isinstance(user, str):
            raise RequestError("user must be a name")
        return {"jobs": self.views.history(limit=limit, user=user)}

    def op_why(self, caller: Caller, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.views is not None
        jid = msg.get("id")
        if not isinstance(jid, int):
            raise RequestError("why: job id must be a number")
        if not 0 < jid < 2**63:  # SQLite's integers end there
            raise RequestError(f"no job {jid}")
        return self.views.why(jid, time.time())


def setup_logging(state_dir: Path, to_stderr: bool) -> None:
    root = logging.getLogger("headway")
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    fh = logging.FileHandler(state_dir / DAEMON_LOG)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if to_stderr:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        root.addHandler(sh)


def run_daemon(
    cfg: DaemonConfig,
    planner: Planner,
    predictor: Any = None,
    log_to_stderr: bool = True,
    predictor_factory: Callable[[], Any] | None = None,
) -> None:
    """Run in the foreground until SIGTERM/SIGINT (ready for a systemd unit)."""
    d = Daemon(cfg, planner, predictor, predictor_factory)
    d.open(log_to_stderr)
    asyncio.run(d.serve())
