"""The daemon's I/O layer: socket, SQLite, supervisors, job store. All state changes go through QueueCore.

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
import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
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
    QueueCore,
    Record,
    Step,
    Terminate,
    Tick,
)
from headway.local.db import DatabaseRefused, StateDB, check_file, path_of
from headway.local.paths import (
    DAEMON_LOCK,
    DAEMON_LOG,
    JOB_STORE,
    MODEL_FILE,
    SOCKET,
    STATE_DB,
    log_paths,
    register_shared,
    socket_address,
    socket_path,
)
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

REPLY_TIMEOUT_S = 10.0  # a client that does not read its reply (at most a page) is cut off after this
# Connections the kernel holds before the daemon accepts them: they cost the daemon nothing, and a full
# queue makes other users' clients wait (client.py), so as many as the kernel allows (net.core.somaxconn).
LISTEN_BACKLOG = socket.SOMAXCONN
# Writing ended jobs into the DuckDB store while another process holds it: retry after 1, 2, 4 ... 60 s,
# and warn once per 10 minutes of failing.
STORE_RETRY_MIN_S = 1.0
STORE_RETRY_MAX_S = 60.0
STORE_WARN_EVERY_S = 600.0


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
    poll: float = 0.05  # seconds between looks at running jobs' run directories
    min_pass: float = 0.2  # seconds between scheduling passes while things keep changing
    gpu_note: str = ""
    gpu_names: tuple[str, ...] = ()  # NVML's model names, one per id ("logical"/"listed" otherwise)
    device_uuids: tuple[str, ...] = ()  # NVML's UUID of each device by index: locked machine-wide

    @property
    def store(self) -> Path:
        return self.store_path or (self.state_dir / JOB_STORE)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def write_storable(store: Path, rows: list[dict[str, Any]]) -> dict[int, str]:
    """Write the ended jobs to the job store, all but those that cannot be converted to its schema
    (returned, with why): one row with an infinite time limit failed every batch, forever, and 17 of 23
    ended jobs never reached the store. Runs in a thread (pyarrow, DuckDB)."""
    from headway.local.store_sync import to_table, write_ended

    bad: dict[int, str] = {}
    try:
        to_table(rows)
        good = rows
    except Exception:
        good = []
        for r in rows:
            try:
                to_table([r])
                good.append(r)
            except Exception as e:
                bad[int(r["id"])] = f"{type(e).__name__}: {e}"
    if good:
        write_ended(store, good)
    return bad


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
        self._gpu_locks: devicelock.GpuLocks | None = None  # held for the daemon's life (devicelock.py)
        self.my_uid = os.getuid()
        self.job_umask = 0o022  # the umask jobs run with: the one the daemon was started with (`open`)
        # The request path (server.py, verbs/): connection caps, the bad-request log, the class policy.
        self.gate = ConnectionGate()
        self._connections: set[asyncio.Task[None]] = set()
        self.peer_log = PeerLog(log)
        self.classes = ClassPolicyFile(cfg.state_dir / CLASSES_FILE, self.my_uid)

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
        try:
            bad = await asyncio.to_thread(write_storable, self.cfg.store, rows)
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
        self._mark_flushed(rows, bad)
        if self._flush_failing_since is not None:
            log.info(
                "job store %s written again after %.0f s",
                self.cfg.store,
                time.time() - self._flush_failing_since,
            )
        self._flush_delay, self._flush_failing_since, self._flush_warned = STORE_RETRY_MIN_S, None, 0.0

    def flush_store_now(self) -> None:
        rows = [dict(r) for r in self._db().unstored(limit=100_000)]
        if rows:
            self._mark_flushed(rows, write_storable(self.cfg.store, rows))

    def _mark_flushed(self, rows: list[dict[str, Any]], bad: dict[int, str]) -> None:
        """Mark the written rows stored, and the rows that cannot be (`bad`) as such (`stored = -1`),
        each with one log line: they stay in the queue's database and history, and are not retried."""
        for jid, why in bad.items():
            log.error("job %d cannot be written to the job store (%s); skipped, not retried", jid, why)
        with self._db().transaction() as con:
            self._db().mark_stored([int(r["id"]) for r in rows if int(r["id"]) not in bad])
            con.executemany("UPDATE jobs SET stored = -1 WHERE id = ?", [(jid,) for jid in bad])

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
        if self.predictor_factory is not None:
            self._loading_since = time.time()
            self._loading_kind = "load"
            self._loading = loop.run_in_executor(None, self.predictor_factory)
        watcher = loop.create_task(self.watch())
        acceptor = loop.create_task(self._accept(listener))
        while not self.stopping:
            await asyncio.sleep(0.2)
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor
        listener.close()
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
