"""The daemon's durable state: one SQLite file in WAL mode (jobs, an event log, the decision log).

Only the daemon writes it, from one thread. WAL with synchronous=NORMAL survives a crash of the daemon
process (the case the queue must handle); a power cut may lose the last few transactions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headway.local.core import JobState, LocalJob, Plan

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    groups TEXT NOT NULL DEFAULT '[]',
    name TEXT NOT NULL,
    argv TEXT NOT NULL,
    cwd TEXT NOT NULL,
    env TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    time_limit REAL,
    priority TEXT NOT NULL,
    after INTEGER,
    submit_time REAL NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    gpu_ids TEXT NOT NULL DEFAULT '',
    start_time REAL,
    end_time REAL,
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    p_success REAL,
    pred_runtime REAL,
    pred_runtime_p90 REAL,
    pred_ttf REAL,
    decision_id INTEGER,
    stored INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_unstored ON jobs (stored) WHERE stored = 0;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job_id INTEGER NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    policy TEXT NOT NULL,
    decision TEXT NOT NULL DEFAULT '',
    starts TEXT NOT NULL,
    ranking TEXT NOT NULL,
    reservation TEXT
);
"""

# Columns of `decisions` added after its first release: added to an older database when it is opened.
# `stored`: copied into the DuckDB job store's decision log (1; -1: cannot be, skipped), as for jobs.
_DECISION_COLUMNS = {
    "duration_s": "REAL",  # how long the scheduling pass took
    "pending": "INTEGER",  # pending jobs the pass saw
    "running": "TEXT",  # JSON: the jobs running as it ran (job_id, user, name, gpus, where)
    "stored": "INTEGER NOT NULL DEFAULT 0",
}

# Columns of `jobs` added after its first release (preemption, docs/local-queue.md): added to an older
# database when it is opened, with defaults that mean what its jobs were (not preemptible, never stopped).
_JOB_COLUMNS = {
    "preemptible": "INTEGER NOT NULL DEFAULT 0",
    "checkpoint_every": "REAL",  # seconds; NULL: the documented default
    "preemptions": "INTEGER NOT NULL DEFAULT 0",  # times it was stopped and requeued
    "last_preempted": "REAL",
    "attained": "REAL NOT NULL DEFAULT 0",  # GPU-seconds its earlier runs served
    "progress": "REAL NOT NULL DEFAULT 0",  # seconds of earlier runs its checkpoints kept
    "preempt_requested": "INTEGER NOT NULL DEFAULT 0",
    "probe_s": "REAL NOT NULL DEFAULT 0",
}

ACTIVE = tuple(s.value for s in JobState if s.active)

# Columns the core may change; written back after every step.
_MUTABLE = (
    "state",
    "attempt",
    "gpu_ids",
    "start_time",
    "end_time",
    "exit_code",
    "reason",
    "cancel_requested",
    "p_success",
    "pred_runtime",
    "pred_runtime_p90",
    "pred_ttf",
    "preemptible",
    "preemptions",
    "last_preempted",
    "attained",
    "progress",
    "preempt_requested",
    "probe_s",
)


class DatabaseRefused(RuntimeError):
    """A queue database the daemon must not start on (lost, damaged, not headway's); the message is one
    line that says how to recover."""


def check_file(path: Path, earlier: int, evidence: str) -> None:
    """Refuse a lost or damaged queue database before SQLite touches it.

    `earlier` is the highest job id the state dir shows elsewhere (logs, run dirs, the job store; 0 for
    none) and `evidence` says where. A zero-length file is checked before connecting: SQLite deletes the
    WAL of a zero-length database on open, and an empty file where jobs ran means the queue was lost,
    which must not silently start job ids at 1 again."""
    wal = path.with_name(path.name + "-wal")
    size = path.stat().st_size if path.exists() else None
    wal_size = wal.stat().st_size if wal.exists() else 0
    after = f"to start an empty queue whose job ids go on after {earlier}" if earlier else "to start anew"
    if (size == 0 and (earlier or wal_size)) or (size is None and wal_size):
        what = "is empty" if size == 0 else "is missing"
        why = f"this queue ran jobs before (up to job {earlier}: {evidence})" if earlier else f"{wal} is not"
        raise DatabaseRefused(
            f"{path} {what}, but {why}: the queue's database was lost. Restore it from a backup, or "
            f"remove it and its WAL (rm {path} {wal}) {after}"
        )
    if not size:
        return
    try:
        con = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    except sqlite3.Error as e:
        raise DatabaseRefused(f"{path}: cannot open the queue's database: {e}") from None
    try:
        problems = [str(r[0]) for r in con.execute("PRAGMA quick_check(5)")]
        tables = sorted(str(r[0]) for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        version = None
        if "meta" in tables:
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = row[0] if row else None
    except sqlite3.DatabaseError as e:
        problems, tables, version = [str(e)], [], None
    finally:
        con.close()
    if problems != ["ok"]:
        raise DatabaseRefused(
            f"{path} is damaged ({'; '.join(problems)[:200]}): restore it from a backup, or move it aside "
            f"(mv {path} {path}.damaged, with its -wal and -shm files) {after}"
        )
    ours = {"meta", "jobs", "events", "decisions"}
    if tables and not ours <= set(tables):
        raise DatabaseRefused(
            f"{path} is not a headway queue database (tables: {', '.join(tables[:5])}): give another "
            "--state-dir, or move the file aside"
        )
    if version is not None and str(version).isdigit() and int(version) > SCHEMA_VERSION:
        raise DatabaseRefused(
            f"{path} was written by a newer headway (schema {version}; this one reads {SCHEMA_VERSION}): "
            "run that version"
        )
    if not tables and earlier:
        raise DatabaseRefused(
            f"{path} holds no jobs table, but this queue ran jobs before (up to job {earlier}: {evidence}): "
            f"the queue's database was lost. Restore it from a backup, or remove it (rm {path}) {after}"
        )


class StateDB:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        self.con.row_factory = sqlite3.Row
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=NORMAL")
        self.con.execute("PRAGMA foreign_keys=ON")
        self.con.executescript(_SCHEMA)
        for table, columns in (("decisions", _DECISION_COLUMNS), ("jobs", _JOB_COLUMNS)):
            have = {str(r[1]) for r in self.con.execute(f"PRAGMA table_info({table})")}
            for col, decl in columns.items():
                if col not in have:
                    self.con.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")
        self.con.execute(
            "CREATE INDEX IF NOT EXISTS decisions_unstored ON decisions (stored) WHERE stored = 0"
        )
        self.con.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )

    def close(self) -> None:
        self.con.close()

    def ids_after(self, earlier: int) -> bool:
        """Make the next job id greater than `earlier` (the highest the logs, run dirs and job store
        show), so that an id is never given twice over the queue's life, even after its database was
        lost or restored from a backup; True if the ids moved. AUTOINCREMENT alone never reuses an id
        within one database (sqlite_sequence holds its high-water mark)."""
        row = self.con.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        top = self.con.execute("SELECT max(id) FROM jobs").fetchone()
        current = max(int(row[0]) if row else 0, int(top[0]) if top and top[0] is not None else 0)
        if earlier <= current:
            return False
        with self.transaction():
            if row:
                self.con.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'", (earlier,))
            else:
                self.con.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?)", (earlier,))
        return True

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.con.execute("BEGIN IMMEDIATE")
        try:
            yield self.con
            self.con.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (a full disk) leaves the transaction open, and every later BEGIN failed;
            # SQLite may also have rolled back already, so a failing ROLLBACK is not the error to show.
            with contextlib.suppress(sqlite3.Error):
                self.con.execute("ROLLBACK")
            raise

    # -- writes (call inside `transaction`) --

    def insert_job(self, fields: dict[str, Any]) -> int:
        cols = list(fields)
        cur = self.con.execute(
            f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
            [fields[c] for c in cols],
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def save(self, jobs: Iterable[LocalJob]) -> None:
        rows = [_mutable_row(j) for j in jobs]
        if rows:
            sets = ", ".join(f"{c} = ?" for c in _MUTABLE)
            self.con.executemany(f"UPDATE jobs SET {sets} WHERE id = ?", rows)

    def log_events(self, now: float, lines: Sequence[tuple[int, str, str]]) -> None:
        if lines:
            self.con.executemany(
                "INSERT INTO events (time, job_id, kind, detail) VALUES (?, ?, ?, ?)",
                [(now, jid, kind, detail) for jid, kind, detail in lines],
            )

    def log_decision(
        self,
        plan: Plan,
        now: float,
        *,
        running: Sequence[LocalJob] = (),
        pending: int | None = None,
        duration_s: float | None = None,
    ) -> int:
        """Log a pass that started jobs, with the jobs running as it ran, the pending jobs it saw and how
        long it took (for the job store's decision log, which store_flush.py copies it into)."""
        ranking = [
            {
                "job_id": e.job_id,
                "rank": e.rank,
                "score": e.score,
                "factors": dict(e.factors),
                "reason": e.reason,
                "estimated_start": plan.estimated_start.get(e.job_id),
            }
            for e in plan.ranking
        ]
        ran = [
            {"job_id": j.id, "user": j.user, "name": j.name, "gpus": j.gpus, "gpu_ids": list(j.gpu_ids)}
            for j in running
        ]
        cur = self.con.execute(
            "INSERT INTO decisions (time, policy, decision, starts, ranking, reservation, duration_s, "
            "pending, running) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                now,
                plan.policy,
                plan.decision,
                json.dumps([[jid, list(g)] for jid, g in plan.starts]),
                json.dumps(ranking),
                json.dumps(plan.reservation) if plan.reservation else None,
                duration_s,
                pending,
                json.dumps(ran),
            ),
        )
        assert cur.lastrowid is not None
        did = int(cur.lastrowid)
        self.con.executemany(
            "UPDATE jobs SET decision_id = ? WHERE id = ?", [(did, jid) for jid, _ in plan.starts]
        )
        return did

    def mark_stored(self, ids: Sequence[int]) -> None:
        self.con.executemany("UPDATE jobs SET stored = 1 WHERE id = ?", [(i,) for i in ids])

    def mark_decisions_stored(self, ids: Sequence[int], value: int = 1) -> None:
        self.con.executemany("UPDATE decisions SET stored = ? WHERE id = ?", [(value, i) for i in ids])

    # -- reads --

    def load_active(self) -> list[LocalJob]:
        q = f"SELECT * FROM jobs WHERE state IN ({', '.join('?' for _ in ACTIVE)}) ORDER BY id"
        return [job_from_row(r) for r in self.con.execute(q, ACTIVE)]

    def ended_states(self) -> dict[int, JobState]:
        q = f"SELECT id, state FROM jobs WHERE state NOT IN ({', '.join('?' for _ in ACTIVE)})"
        return {int(r[0]): JobState(r[1]) for r in self.con.execute(q, ACTIVE)}

    def row(self, job_id: int) -> sqlite3.Row | None:
        cur = self.con.execute("SELECT * FROM jobs WHERE id = ?", (job_id,))
        row: sqlite3.Row | None = cur.fetchone()
        return row

    def rows(
        self, where: str = "", params: Sequence[Any] = (), order: str = "id", limit: int = 0
    ) -> list[sqlite3.Row]:
        q = "SELECT * FROM jobs" + (f" WHERE {where}" if where else "") + f" ORDER BY {order}"
        if limit:
            q += f" LIMIT {int(limit)}"
        return list(self.con.execute(q, params))

    def unstored(self, limit: int = 500) -> list[sqlite3.Row]:
        return self.rows("stored = 0 AND state NOT IN ('PENDING', 'LAUNCHING', 'RUNNING')", limit=limit)

    def unstored_decisions(self, limit: int = 200) -> list[sqlite3.Row]:
        """Logged passes not yet in the job store's decision log, oldest first."""
        return list(
            self.con.execute("SELECT * FROM decisions WHERE stored = 0 ORDER BY id LIMIT ?", (limit,))
        )

    def decision(self, decision_id: int) -> sqlite3.Row | None:
        cur = self.con.execute("SELECT * FROM decisions WHERE id = ?", (decision_id,))
        row: sqlite3.Row | None = cur.fetchone()
        return row

    def events(self, job_id: int) -> list[sqlite3.Row]:
        return list(self.con.execute("SELECT * FROM events WHERE job_id = ? ORDER BY seq", (job_id,)))


def _mutable_row(j: LocalJob) -> tuple[Any, ...]:
    return (
        j.state.value,
        j.attempt,
        ",".join(str(g) for g in j.gpu_ids),
        j.start_time,
        j.end_time,
        j.exit_code,
        j.reason,
        int(j.cancel_requested),
        j.p_success,
        j.pred_runtime,
        j.pred_runtime_p90,
        j.pred_ttf,
        int(j.preemptible),
        j.preemptions,
        j.last_preempted,
        j.attained,
        j.progress,
        int(j.preempt_requested),
        j.probe_s,
        j.id,
    )


def path_value(path: str) -> str | bytes:
    """A path as SQLite can store it: text, or its bytes (a BLOB) when its name is not UTF-8 (a directory
    named in Latin-1 arrives as a str with lone surrogates, which SQLite's text cannot hold)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def path_of(value: str | bytes) -> str:
    """The path `path_value` stored, as Python names it (undecodable bytes as surrogates)."""
    return os.fsdecode(value) if isinstance(value, bytes) else value


def parse_ids(text: str) -> tuple[int, ...]:
    return tuple(int(g) for g in text.split(",") if g != "")


def job_from_row(r: sqlite3.Row) -> LocalJob:
    return LocalJob(
        id=int(r["id"]),
        user=r["user"],
        uid=int(r["uid"]),
        name=r["name"],
        gpus=int(r["gpus"]),
        submit_time=float(r["submit_time"]),
        time_limit=r["time_limit"],
        priority=r["priority"],
        after=r["after"],
        state=JobState(r["state"]),
        attempt=int(r["attempt"]),
        gpu_ids=parse_ids(r["gpu_ids"]),
        start_time=r["start_time"],
        end_time=r["end_time"],
        exit_code=r["exit_code"],
        reason=r["reason"],
        cancel_requested=bool(r["cancel_requested"]),
        p_success=r["p_success"],
        pred_runtime=r["pred_runtime"],
        pred_runtime_p90=r["pred_runtime_p90"],
        pred_ttf=r["pred_ttf"],
        preemptible=bool(r["preemptible"]),
        checkpoint_every=r["checkpoint_every"],
        preemptions=int(r["preemptions"]),
        last_preempted=r["last_preempted"],
        attained=float(r["attained"]),
        progress=float(r["progress"]),
        preempt_requested=bool(r["preempt_requested"]),
        probe_s=float(r["probe_s"]),
    )
