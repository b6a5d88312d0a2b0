"""The daemon's I/O layer: socket, SQLite, supervisors, job store. All state changes go through QueueCore.

`Daemon` keeps the loop, the state, start-up (`open`, `recover`), committing a core step (`_apply`) and the
dispatch of requests to the verbs; its parts live in modules of their own, which it owns and calls:
launch.py (starting and signalling jobs' supervisors), store_flush.py (ended jobs into the DuckDB job
store), predictor_host.py (building, feeding and retraining the predictor in a thread), server.py (the
connection caps, peer credentials and the bad-request log), verbs/ (one module per request).

One thread runs an asyncio loop. Each request is handled to the end (core event, SQLite commit, reply)
without awaiting in between, so requests never interleave. A watcher task polls the run directories of
launched jobs, feeds what it finds to the core, runs a scheduling pass and carries out the instructions.
The order is always: commit the new state, then act (start a supervisor or signal one). A crash between
the two is repaired on restart by `recover`, which reads the run directories (see runs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headway.local import devicelock, runs, statedir
from headway.local.classes import CLASSES_FILE, ClassPolicyFile
from headway.local.core import (
    Abandoned,
    Claimed,
    Event,
    Finished,
    JobState,
    Launch,
    LocalJob,
    LogDecision,
    Lost,
    Planner,
    Preempt,
    Preempted,
    QueueCore,
    Record,
    Requeued,
    Step,
    Terminate,
    Tick,
)
from headway.local.db import DatabaseRefused, StateDB, check_file
from headway.local.launch import Launcher
from headway.local.paths import (
    DAEMON_LOCK,
    DAEMON_LOG,
    JOB_STORE,
    MODEL_FILE,
    SOCKET,
    STATE_DB,
    register_shared,
    socket_address,
    socket_path,
)
from headway.local.predictor_host import PredictorHost
from headway.local.protocol import (
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    BadRequest,
    Request,
    RequestError,
    decode_request,
    encode_reply,
    parse_request,
    wire,
)
from headway.local.server import Caller, ConnectionGate, PeerLog, peer, raise_fd_limit
from headway.local.store_flush import StoreFlush
from headway.local.verbs import answer
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

# What a root daemon asks of its state dir and --db (statedir.py), after the component that fails it.
UNSAFE_RULE = (
    "a daemon running as root uses files only where no other user can change any part of the path "
    "(each part owned by root and not writable by group or others; a sticky bit allowed above): "
    "chown root and chmod go-w it"
)

PREEMPTED = "PREEMPTED"  # a supervisor's status for a run it stopped because the daemon preempted it
REPLY_TIMEOUT_S = 10.0  # a client that does not read its reply (at most a page) is cut off after this
# Connections the kernel holds before the daemon accepts them: they cost the daemon nothing, and a full
# queue makes other users' clients wait (client.py), so as many as the kernel allows (net.core.somaxconn).
LISTEN_BACKLOG = socket.SOMAXCONN


class DaemonError(RuntimeError):
    """Start-up problems worth one line: state dir not writable, another daemon running, and so on."""


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
    preempt_grace: float = 30.0  # the same when a job is preempted: its time to write a checkpoint
    poll: float = 0.05  # seconds between looks at running jobs' run directories
    min_pass: float = 0.2  # seconds between scheduling passes while things keep changing
    gpu_note: str = ""
    gpu_names: tuple[str, ...] = ()  # NVML's model names, one per id ("logical"/"listed" otherwise)
    device_uuids: tuple[str, ...] = ()  # NVML's UUID of each device by index: locked machine-wide

    @property
    def store(self) -> Path:
        return self.store_path or (self.state_dir / JOB_STORE)


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
        # The predictor is built in a thread after the socket is up; until it is ready, nothing is
        # started, so the order never misses predictions (predictor_host.py).
        self.predictors = PredictorHost(predictor, predictor_factory, cfg.state_dir / MODEL_FILE, time.time())
        self.db: StateDB | None = None
        self.views: JobViews | None = None
        self.launcher = Launcher(cfg.state_dir, cfg.grace, cfg.preempt_grace)  # jobs' supervisors (launch.py)
        self.store_flush = StoreFlush(cfg.store, self._db)  # ended jobs into the store (store_flush.py)
        self.wake = asyncio.Event()
        self.dirty = True
        self.last_tick = 0.0
        self.stopping = False
        self._lock_fd: int | None = None
        self._gpu_locks: devicelock.GpuLocks | None = None  # held for the daemon's life (devicelock.py)
        self.my_uid = os.getuid()
        self.job_umask = 0o022  # the umask jobs run with: the one the daemon was started with (`open`)
        # The request path (server.py, verbs/): connection caps, the bad-request log, the class policy.
        self.gate = ConnectionGate()
        self._connections: set[asyncio.Task[None]] = set()
        self.peer_log = PeerLog(log)
        self.classes = ClassPolicyFile(cfg.state_dir / CLASSES_FILE, self.my_uid)

    # The predictor's state (predictor_host.py), read and set on the daemon by tests.

    @property
    def predictor(self) -> Any:
        return self.predictors.predictor

    @property
    def _loading(self) -> asyncio.Future[Any] | None:
        return self.predictors.loading

    @_loading.setter
    def _loading(self, fut: asyncio.Future[Any] | None) -> None:
        self.predictors.loading = fut

    @property
    def _loading_kind(self) -> str:
        return self.predictors.loading_kind

    @_loading_kind.setter
    def _loading_kind(self, kind: str) -> None:
        self.predictors.loading_kind = kind

    @property
    def _loading_since(self) -> float:
        return self.predictors.loading_since

    @_loading_since.setter
    def _loading_since(self, since: float) -> None:
        self.predictors.loading_since = since

    # ---------- start-up ----------

    def open(self, log_to_stderr: bool = False) -> None:
        """Take the state dir (one daemon per dir; as root, only one no other user can change), lock its
        GPUs machine-wide, open SQLite (refusing a lost or damaged database) and recover what a crash
        left behind."""
        sd = self.state_dir
        root = self.my_uid == 0
        try:
            if root:
                statedir.check_path(sd, self.my_uid)  # before anything is made in it
            sd.mkdir(parents=True, exist_ok=True, mode=0o755 if root else 0o700)
            for sub in ("runs", "logs"):
                (sd / sub).mkdir(exist_ok=True, mode=0o700 if sub == "runs" else 0o711)
            if root:
                for sub in ("runs", "logs"):
                    statedir.check_path(sd / sub, self.my_uid)
                for name in (*PRIVATE_FILES, DAEMON_LOCK, SOCKET, MODEL_FILE):
                    statedir.check_own_file(sd / name, self.my_uid)
            fd = os.open(sd / DAEMON_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except statedir.UnsafePath as e:
            raise DaemonError(f"{e}; {UNSAFE_RULE}, or choose another --state-dir") from None
        except OSError as e:
            raise DaemonError(f"{sd}: cannot use it as the state directory: {e.strerror or e}") from None
        if root and self.cfg.store_path is not None:
            try:
                statedir.check_path(self.cfg.store_path, self.my_uid)
            except statedir.UnsafePath as e:
                os.close(fd)
                raise DaemonError(
                    f"--db {self.cfg.store_path}: {e}; {UNSAFE_RULE}, or choose another --db"
                ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(f"{sd}: another headway daemon is already running on this state dir") from None
        self._lock_fd = fd
        no_lock_dir = self._lock_gpus()
        # The daemon's own files are private whatever umask it was started with: the job database holds
        # each job's argv, working directory and whole environment (tokens included), the log the same
        # commands. Jobs get the umask back (the supervisor sets it before it starts the command).
        self.job_umask = os.umask(0o077)
        for name in PRIVATE_FILES:  # left readable by a version that did not do this
            with contextlib.suppress(FileNotFoundError):
                os.chmod(sd / name, 0o600)
        setup_logging(sd, log_to_stderr)
        if no_lock_dir:
            log.warning("%s: no such directory; this daemon's GPUs are not locked machine-wide", no_lock_dir)
        self.db = self._open_db()
        self.views = JobViews(self.db, self.core)
        if root and statedir.reachable_by_others(sd):
            try:
                if register_shared(sd):
                    log.info("registered as this machine's shared queue (users without one are told)")
            except OSError as e:
                log.warning("cannot register %s as this machine's shared queue: %s", sd, e)
        self.recover()

    def _lock_gpus(self) -> str:
        """Take the machine-wide lock of every GPU this daemon hands out (devicelock.py), or refuse to
        start naming the daemon that has one. Returns the lock dir when the default one is missing (then
        nothing is locked), else ""."""
        directory, explicit = devicelock.lock_dir()
        keys = devicelock.lock_keys(self.cfg.gpu_ids, self.cfg.device_uuids, logical=explicit)
        if not keys:
            return ""
        label = {"pid": os.getpid(), "uid": self.my_uid, "state_dir": str(self.state_dir)}
        try:
            self._gpu_locks = devicelock.acquire(keys, directory, label)
        except devicelock.GpuLockError as e:
            raise DaemonError(str(e)) from None
        except FileNotFoundError:
            if not explicit:
                return str(directory)
            raise DaemonError(
                f"{directory}: no such directory (${devicelock.LOCK_DIR_VAR}) to lock the GPUs in"
            ) from None
        except OSError as e:
            raise DaemonError(f"{directory}: cannot lock the GPUs there: {e.strerror or e}") from None
        return ""

    def _open_db(self) -> StateDB:
        """Open the queue's database after checking it (db.check_file) against the job ids the state dir
        and the job store show, and make its next id go on after all of them: an id is never given twice,
        so a job's logs and its row in the job store are never another job's."""
        path = self.state_dir / STATE_DB
        earlier, where, note = statedir.earlier_jobs(self.state_dir, self.cfg.store)
        if note:
            log.warning("%s", note)
        try:
            check_file(path, earlier, where)
            db = StateDB(path)
        except DatabaseRefused as e:
            raise DaemonError(str(e)) from None
        except sqlite3.Error as e:
            raise DaemonError(f"{path}: cannot open the queue's database: {e}") from None
        if db.ids_after(earlier):
            log.warning(
                "job ids go on after %d (%s), which the queue's database did not know", earlier, where
            )
        return db

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
        resend: list[Terminate | Preempt] = []
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
            elif view.kind == "running" and job.preempt_requested:  # asked before a crash: ask again
                resend.append(Preempt(job.id, job.attempt))
        n_adopted = sum(1 for j in active if j.state is not JobState.PENDING)
        if events:
            self._apply(self.core.handle(*events))
        for t in resend:
            if isinstance(t, Preempt):
                self._preempt(t)
            else:
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
        if view.kind == "ended" and view.status is not None and view.status.get("state") == PREEMPTED:
            st = view.status
            end = float(st.get("end_time") or time.time())
            out.append(Preempted(job.id, job.attempt, st.get("exit_code"), st.get("start_time"), end))
        elif view.kind == "ended" and view.status is not None:
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
            self.launcher.kill_orphans(job)
            out.append(Lost(job.id, job.attempt, time.time()))
        return out

    def _db(self) -> StateDB:
        assert self.db is not None, "Daemon.open() first"
        return self.db

    # ---------- applying a core step ----------

    def _apply(self, step: Step, now: float | None = None, pass_s: float | None = None) -> None:
        """Persist the step in one transaction, then carry out its instructions. `pass_s`: how long the
        scheduling pass that made the step took (kept in the decision log)."""
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
                        started = {jid for jid, _ in ins.plan.starts}
                        others = [j for j in self.core.jobs.values() if j.id not in started]
                        running = [j for j in others if j.state is not JobState.PENDING]
                        pending = len(others) - len(running) + len(started)
                        db.log_decision(
                            ins.plan, ins.now, running=running, pending=pending, duration_s=pass_s
                        )
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
            elif isinstance(ins, Preempt):
                self._preempt(ins)
            elif isinstance(ins, Requeued):
                self._requeued(ins)
            elif isinstance(ins, Record):
                self._observe(ins.job)
                self.launcher.forget_runs(ins.job.id)

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
        row = self._db().row(ins.job_id)
        assert row is not None
        self.launcher.launch(ins, row, self.job_umask)

    def _terminate(self, ins: Terminate) -> None:
        if self.launcher.terminate(ins):  # claimed before its supervisor did: it never started
            self._apply(self.core.handle(Abandoned(ins.job_id, ins.attempt)))

    def _preempt(self, ins: Preempt) -> None:
        if self.launcher.preempt(ins):  # claimed before its supervisor did: it never started
            self._apply(self.core.handle(Abandoned(ins.job_id, ins.attempt)))

    def _requeued(self, ins: Requeued) -> None:
        """A preempted run is over: its GPU time counts for its user's fair share (as a preemption, which
        no failure streak counts), and its run directory goes (the end is committed)."""
        job = ins.job
        log.info("job %d preempted (attempt %d); requeued as attempt %d", job.id, ins.attempt, job.attempt)
        book = getattr(self.core.planner, "book", None)
        if book is not None and ins.start_time is not None:
            from headway.local.ordering import add_end

            add_end(book, job.user, job.name, PREEMPTED, float(job.gpus), ins.start_time, ins.end_time)
        shutil.rmtree(runs.run_dir(self.state_dir, job.id, ins.attempt), ignore_errors=True)

    def _observe(self, job: LocalJob) -> None:
        log.info("job %d ended %s (exit %s)", job.id, job.state, job.exit_code)
        book = getattr(self.core.planner, "book", None)
        if book is not None and job.end_time is not None:
            from headway.local.ordering import add_end

            add_end(book, job.user, job.name, job.state.value, float(job.gpus), job.start_time, job.end_time)
        self.predictors.observe_end(job)

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
                if self.launcher.supervisor_gone(key):  # its supervisor never came up
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
        self.launcher.reap()
        if events:
            self._apply(self.core.handle(*events))

    def predict_new(self, now: float, refresh: bool = False) -> None:
        """Predictions for pending jobs that have none yet, or all of them after a retrain (one call)."""
        events = self.predictors.predictions(self.core.jobs.values(), now, refresh)
        if events:
            self._apply(self.core.handle(*events))

    def retrain(self, now: float) -> None:
        """Let the predictor retrain in a thread (predictor_host.py); nothing starts until it is done."""
        self.predictors.retrain(now)

    def schedule(self, now: float) -> None:
        self.predict_new(now)
        self.dirty = False
        self.last_tick = now
        began = time.perf_counter()
        step = self.core.handle(Tick(now))
        self._apply(step, now, pass_s=time.perf_counter() - began)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=self.cfg.poll)
        self.wake.clear()

    def _predictor_ready(self, now: float) -> bool:
        """Whether scheduling may go on: the predictor's thread is done (then the pending jobs'
        predictions are refreshed), or it has been busy for too long."""
        settled = self.predictors.settle(now)
        if settled == "done":
            self.predict_new(now, refresh=True)
            self.dirty = True
        return settled != "busy"

    _pass_failures = 0
    _pass_logged = 0.0

    async def watch(self) -> None:
        while not self.stopping:
            try:
                self.poll_runs()
                now = time.time()
                if self.predictors.loading is not None and not self._predictor_ready(now):
                    await self._pause()
                    continue
                plan = self.core.last_plan
                wake = plan is not None and plan.wake_at is not None and now >= plan.wake_at
                probe_end = self.core.next_probe_end()  # a fail-fast probe is stopped on time
                wake = wake or (probe_end is not None and now >= probe_end)
                # A pass ranks the whole queue: at most one per `min_pass` seconds, so a burst of
                # submissions is ranked once, not once per job.
                due = now - self.last_tick >= self.cfg.min_pass
                if (self.dirty and due) or wake or now - self.last_tick > 5.0:
                    self.schedule(now)
                self.flush_store_soon()
                if self.predictors.retrain_due(now):
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

    def flush_store_soon(self) -> None:
        """Write ended jobs into the job store in a thread (store_flush.py), but not while the predictor's
        thread reads the store: after it."""
        if not self.predictors.reading_store:
            self.store_flush.soon()

    def flush_store_now(self) -> None:
        self.store_flush.now()

    # ---------- the socket ----------

    async def serve(self) -> None:
        path = socket_path(self.state_dir)
        raise_fd_limit()  # up to the hard limit (LimitNOFILE); server.total_cap keeps half of it free
        try:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket of a dead daemon (we hold the state dir's lock)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with socket_address(path) as address:  # a deep state dir's path is too long to bind as is
                    listener.bind(address)
                listener.listen(LISTEN_BACKLOG)
                listener.setblocking(False)
            except OSError:
                listener.close()
                raise
        except OSError as e:
            raise DaemonError(f"{path}: cannot create the clients' socket: {e.strerror or e}") from None
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
        self.predictors.start_loading(loop, time.time())
        watcher = loop.create_task(self.watch())
        acceptor = loop.create_task(self._accept(listener))
        while not self.stopping:
            await asyncio.sleep(0.2)
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor
        listener.close()
        await watcher
        await self.store_flush.wait()
        with contextlib.suppress(Exception):
            self.flush_store_now()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        log.info("headway daemon stopped; running jobs keep running under their supervisors")

    def _stop(self) -> None:
        self.stopping = True
        self.wake.set()

    async def _accept(self, listener: socket.socket) -> None:
        """The accept loop. A connection's uid is known (SO_PEERCRED) before any of its bytes are read, so
        one over a cap (server.ConnectionGate) is refused at once with one line and closed: it holds a
        descriptor for a moment, never a task or a buffer, and a flood of them cannot take the
        descriptors the watcher needs to record job ends."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as e:  # out of descriptors all the same (another process's fault?): wait
                self.peer_log.trouble(f"cannot accept a connection: {e}")
                await asyncio.sleep(0.1)
                continue
            try:
                caller = peer(conn)
            except OSError:
                conn.close()
                continue
            refusal = self.gate.admit(caller.uid)
            if refusal is not None:
                self.peer_log.note("connection refused", caller.uid, caller.pid, refusal)
                with contextlib.suppress(OSError):
                    conn.send(encode_reply({"ok": False, "error": refusal, "busy": True}))
                conn.close()
                continue
            task = loop.create_task(self._connection(conn, caller))
            self._connections.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._connections.discard)

    async def _connection(self, conn: socket.socket, caller: Caller) -> None:
        """One admitted connection: one request within REQUEST_TIMEOUT_S, one reply, closed."""
        try:
            try:
                reader, writer = await asyncio.open_unix_connection(sock=conn, limit=MAX_REQUEST_BYTES)
            except OSError:
                conn.close()
                return
            await self._client(reader, writer, caller)
        finally:
            self.gate.release(caller.uid)

    async def _client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, caller: Caller
    ) -> None:
        """Read one request line (in time, within the size limit), answer it, close. Nothing a client
        sends or holds back keeps its connection open for long."""
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT_S)
            except TimeoutError:
                error = f"no request within {REQUEST_TIMEOUT_S:.0f} s; closing the connection"
                self.peer_log.note("connection closed", caller.uid, caller.pid, error)
                reply = encode_reply({"ok": False, "error": error})
            except (ValueError, asyncio.LimitOverrunError):
                error = f"request larger than {MAX_REQUEST_BYTES // 1024 // 1024} MiB"
                self.peer_log.bad_request(caller.uid, caller.pid, error)
                reply = encode_reply({"ok": False, "error": error})
            else:
                if not line:
                    return  # the client went away without a word
                reply = self.answer(caller, line)
            writer.write(reply)
            await asyncio.wait_for(writer.drain(), REPLY_TIMEOUT_S)
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), REPLY_TIMEOUT_S)
            except Exception:  # a client that reads nothing: drop what it did not take
                writer.transport.abort()

    # ---------- requests ----------

    broken = False  # the core could not be reloaded from the database (_resync): serve nothing more

    def answer(self, caller: Caller, line: bytes) -> bytes:
        """The reply line to one request line. A bad request is one line back, and one line in the log
        (a few a minute per user: server.PeerLog), never a traceback."""
        try:
            reply = {"ok": True, **self.handle(caller, decode_request(line))}
        except BadRequest as e:
            self.peer_log.bad_request(caller.uid, caller.pid, str(e))
            reply = {"ok": False, "error": str(e)}
        except RequestError as e:
            reply = {"ok": False, "error": str(e)}
        except Exception as e:
            self.peer_log.failed(caller.uid, caller.pid, e)
            reply = {"ok": False, "error": f"internal error: {type(e).__name__}: {str(e)[:200]}"}
        return encode_reply(reply)

    def handle(self, caller: Caller, msg: Request | Mapping[str, Any]) -> dict[str, Any]:
        """Answer one request, typed or in its wire form (checked first); raises RequestError. The verbs
        live in headway.local.verbs, one module each."""
        if self.broken:
            raise RequestError("the daemon cannot read its job database and is stopping; start it again")
        req = parse_request(dict(msg)) if isinstance(msg, Mapping) else msg
        reply: dict[str, Any] = wire(answer(self, caller, req))
        return reply

    def op_submit(self, caller: Caller, msg: Mapping[str, Any]) -> dict[str, Any]:
        """`submit` from a request's wire form (in-process callers); see verbs/submit.py."""
        return self.handle(caller, {**msg, "op": "submit"})


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
    try:
        d.open(log_to_stderr)
    except (OSError, sqlite3.Error) as e:  # whatever `open` does not put in words itself: one line too
        raise DaemonError(f"{cfg.state_dir}: cannot start the daemon: {e}") from None
    asyncio.run(d.serve())
