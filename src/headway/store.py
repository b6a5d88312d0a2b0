"""The job store: one DuckDB file holding every ingested job, keyed by (source, job_id)."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import duckdb
import pyarrow as pa

from headway import decision_log
from headway.atomic import replaced_atomically
from headway.schema import ENDED_STATES, FIELD_NAMES, JOB_SCHEMA, State, conform
from headway.store_lock import Holder, StillLocked, connect_waiting

DEFAULT_DB = "headway.duckdb"

_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
    pa.float64(): "DOUBLE",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
}
_DESCRIBED = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE"}  # how DESCRIBE names a type
# Columns JOB_SCHEMA gained after its first layout, in the order they were added, each at the end (issue 27:
# preemption). A store of an earlier headway lacks a tail of them: opened writable, it gets them added in
# place (null for the jobs already stored); opened read-only, it is read as if they were null.
ADDED_COLUMNS: tuple[str, ...] = ("preemptible", "checkpoint_every")
assert FIELD_NAMES[-len(ADDED_COLUMNS) :] == ADDED_COLUMNS, "added columns go at the end of JOB_SCHEMA"

# Derived fields of DESIGN.md, as SQL over the stored columns (seconds, and GPU-hours).
DERIVED_SQL = """
    epoch(end_time) - epoch(start_time) AS runtime,
    epoch(start_time) - epoch(submit_time) AS wait,
    coalesce(gpus, 0) * greatest(coalesce(epoch(end_time) - epoch(start_time), 0), 0) / 3600.0 AS gpu_hours
"""


class StoreError(RuntimeError):
    """A store problem worth one clear line to the user (bad path, locked file, not a DuckDB file)."""


class StoreBusyError(StoreError):
    """Another process held the store (an ingest writing it, or readers an ingest waits for) for the
    whole wait; `pid` is the holder DuckDB named (None if it named none)."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


class ReusedIdError(StoreError):
    """Stored job ids that the incoming rows give to different jobs: another cluster's ids under the same
    source (every Slurm cluster counts from 1), or ids restarted by a controller reset. Replacing them
    would lose the stored jobs without a word, so nothing of the batch is stored."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during an upsert. DuckDB raises it as RuntimeError('Query interrupted'), even after a COMMIT
    that went through; `stored` says which: all of the batch was stored, or none of it."""

    def __init__(self, stored: bool) -> None:
        super().__init__("stored" if stored else "not stored")
        self.stored = stored


def _is_interrupt(e: BaseException) -> bool:
    return isinstance(e, KeyboardInterrupt) or (
        isinstance(e, RuntimeError | duckdb.Error) and "interrupt" in str(e).lower()
    )


# A stored row and an incoming row of one (source, job_id) that are not the same job. Another user (both
# known) always says so. Another submit time alone does not: Slurm resets Submit when it requeues a job,
# so two snapshots of one cluster differ there for each requeued job, in either order of ingesting them.
# What marks another cluster (or the same log read with another --tz) is that most ids moved: see
# `_mostly_moved`.
_OTHER_USER = """(j."user" IS NOT NULL AND n."user" IS NOT NULL AND j."user" <> n."user")"""
_MOVED = """(j.submit_time IS NOT NULL AND n.submit_time IS NOT NULL AND j.submit_time <> n.submit_time)"""
MOVED_AT_LEAST = 10  # ids whose submit time moved before a batch counts as another cluster's


def _mostly_moved(moved: int, matched: int) -> bool:
    """Whether a batch's moved submit times mark other jobs: at least MOVED_AT_LEAST ids, and most of the
    ids it shares with the store. A requeued job here and there is an update; a second cluster whose
    users and job names happen to match, or a --tz change, moves nearly all of them. (A batch sharing
    fewer ids than that with the store cannot be told apart from requeues.)"""
    return moved >= MOVED_AT_LEAST and 2 * moved > matched


_ENDED = ", ".join(f"'{st.value}'" for st in ENDED_STATES)
# A stored job that has ended and an incoming row of the same job that has not: an older snapshot (an
# earlier sacct file ingested again) would turn it back into RUNNING or PENDING, so the stored row stays.
# A later incoming submit time is a requeue (Slurm resets Submit): then the job really waits again.
_KEEP_STORED = f"""(
    j.state IN ({_ENDED}) AND n.state NOT IN ({_ENDED})
    AND NOT coalesce(n.submit_time > j.submit_time, false) AND NOT {_OTHER_USER}
)"""


# Re-ingest never forgets: a field the incoming row leaves null keeps the stored value, because a poorer
# format of the same jobs (sacct --json after sacct -P: no user, no failed exit codes) says "not known
# here", not "none". Only for the same job (not another user's, not a row _KEEP_STORED keeps whole); the
# run's own fields also need the same run (a requeued job's new run starts with no start, end or exit code)
# and an incoming state that has them (a pending job has no start; an unended one no end or exit code).
_SAME_RUN = f"NOT {_MOVED}"
_STARTED = f"n.state <> '{State.PENDING.value}'"
_HAS_ENDED = f"n.state IN ({_ENDED})"
_RUN_FIELD_WHEN: dict[str, str] = {
    "start_time": f"{_SAME_RUN} AND {_STARTED}",
    "end_time": f"{_SAME_RUN} AND {_HAS_ENDED}",
    "exit_code": f"{_SAME_RUN} AND {_HAS_ENDED}",
}
# Every field but the key (source, job_id) and state, which no reader leaves null.
MERGED_FIELDS: tuple[str, ...] = tuple(f for f in FIELD_NAMES if f not in ("job_id", "source", "state"))


def _kept_when(field: str, same_job: str) -> str:
    """When the stored value of `field` is kept: the incoming row has none, the stored row has one, and
    the two rows are the same job (and run, for a run's fields)."""
    cond = f"n.{_q(field)} IS NULL AND j.{_q(field)} IS NOT NULL AND {same_job}"
    extra = _RUN_FIELD_WHEN.get(field)
    return f"{cond} AND {extra}" if extra else cond


def default_db_path() -> Path:
    return Path(os.environ.get("HEADWAY_DB") or DEFAULT_DB)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class JobStore:
    """A thin owner of the DuckDB connection; every part reads jobs through `jobs_v` (with derived fields)."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        read_only: bool = False,
        wait: float = 0.0,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        """Open the store; while another process holds it (DuckDB allows one writer or many readers,
        never both), retry for up to `wait` seconds (0: fail at once, inf: until it is free), calling
        `on_wait` once with `waiting for the store (being written by PID N)...` (default: a line on
        stderr). Raises StoreBusyError when the wait runs out. The commands pass their --wait (60 s by
        default); library callers with their own retry (the local daemon's flush) keep failing at once."""
        self.path = Path(path) if path is not None else default_db_path()
        if read_only and not self.path.exists():
            raise StoreError(f"{self.path}: no job store here yet (run `headway ingest` first, or pass --db)")
        _check_is_store(self.path)
        self.con = self._connect(read_only, wait, on_wait or _say_on_stderr)
        # The columns this store lacks, of an earlier headway's layout (ADDED_COLUMNS): added now when
        # writable, read as nulls when read-only; `upgraded` names those added by this open.
        self.lacks: tuple[str, ...] = self._check_schema()
        self.upgraded: tuple[str, ...] = ()
        if not read_only:
            if self.lacks:
                self._upgrade()
            self._ensure_schema()
        elif self.lacks:
            self._read_as_current()
        self.last_repeats = 0  # rows of the last `upsert` that repeated an earlier row's (source, job_id)
        self.last_added = 0  # jobs the last `upsert` added to the store
        self.last_updated = 0  # stored jobs the last `upsert` replaced by a newer row of the same job
        self.last_kept_ended = 0  # ended stored jobs kept against a not-ended row (_KEEP_STORED)
        self.last_kept_values = 0  # known stored values the last `upsert` kept against an incoming null
        self.last_kept_by_field: dict[str, int] = {}  # the same per field (fields with none left out)

    def _connect(
        self, read_only: bool, wait: float, on_wait: Callable[[str], None]
    ) -> duckdb.DuckDBPyConnection:
        """DuckDB's connection, waited for (store_lock.connect_waiting); one line for every failure."""

        def told(holder: Holder) -> None:
            until = f", up to {wait:g} s" if math.isfinite(wait) else ""
            on_wait(f"waiting for the store ({holder.doing()}){until}")

        try:
            return connect_waiting(
                lambda: duckdb.connect(str(self.path), read_only=read_only), wait=wait, on_wait=told
            )
        except StillLocked as e:
            h, doing = e.holder, e.holder.doing()
            if e.waited > 0:
                what = (
                    f"still {doing} after waiting {e.waited:g} s; try again once it is done, or give a "
                    "longer --wait"
                )
            else:
                what = f"{doing}; try again once it is done, or give --wait SECONDS to wait for it"
            raise StoreBusyError(f"{self.path}: the job store is {what}", h.pid) from None
        except duckdb.Error as e:
            raise StoreError(f"{self.path}: cannot open the job store: {str(e).splitlines()[0]}") from e

    def _check_schema(self) -> tuple[str, ...]:
        """Refuse a database that is not a headway job store, before writing to it or reading it: an
        unrelated DuckDB file got headway's tables added, and a store of another layout (another program,
        another headway version) failed later with a traceback, or converted types silently. An earlier
        headway's layout (this one less a tail of ADDED_COLUMNS) is no other layout: the columns it lacks
        are returned."""
        objects = {
            (str(r[0]), str(r[1]), str(r[2]))
            for r in self.con.execute(
                "SELECT table_schema, table_name, table_type FROM information_schema.tables "
                "WHERE table_catalog = current_database()"
            ).fetchall()
        }
        if not objects:
            return ()  # a new store
        tables = {
            (name if schema == "main" else f"{schema}.{name}") + (" (a view)" if kind == "VIEW" else "")
            for schema, name, kind in objects
        }
        if ("main", "jobs", "BASE TABLE") not in objects:
            self.con.close()
            raise StoreError(
                f"{self.path}: a DuckDB database without a jobs table ({', '.join(sorted(tables)[:3])}"
                f"{', ...' if len(tables) > 3 else ''}): not a headway job store; give another --db"
            )
        have = [(str(r[0]), str(r[1])) for r in self.con.execute("DESCRIBE jobs").fetchall()]
        want = [(f.name, _DESCRIBED.get(_DUCK_TYPES[f.type], _DUCK_TYPES[f.type])) for f in JOB_SCHEMA]
        earliest = len(want) - len(ADDED_COLUMNS)
        if earliest <= len(have) < len(want) and have == want[: len(have)]:
            return FIELD_NAMES[len(have) :]
        if have != want:
            diff = next(
                (
                    f"{h[0]} {h[1]} where headway has {w[0]} {w[1]}"
                    for h, w in zip(have, want, strict=False)
                    if h != w
                ),
                f"{len(have)} columns where headway has {len(want)}",
            )
            self.con.close()
            raise StoreError(
                f"{self.path}: its jobs table is not the layout of this headway ({diff}): a store of another "
                "program or another headway version; ingest the logs into a new store"
            )
        return ()

    def _upgrade(self) -> None:
        """Add the columns an earlier headway's store lacks, in place and in one transaction (the stored
        jobs keep every value; the new fields are null: not known), and the view over them."""
        try:
            self.con.execute("BEGIN")
            for name in self.lacks:
                f = JOB_SCHEMA.field(name)
                self.con.execute(f"ALTER TABLE jobs ADD COLUMN {_q(name)} {_DUCK_TYPES[f.type]}")
            self.con.execute(f"CREATE OR REPLACE VIEW jobs_v AS SELECT *, {DERIVED_SQL} FROM jobs")
            self.con.execute("COMMIT")
        except duckdb.Error as e:
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
            self.con.close()
            raise StoreError(
                f"{self.path}: cannot add {', '.join(self.lacks)} to the job store of an earlier headway: "
                f"{str(e).splitlines()[0]}"
            ) from e
        self.upgraded, self.lacks = self.lacks, ()

    def _read_as_current(self) -> None:
        """A read-only open of an earlier headway's store: this connection's own (temporary) `jobs` and
        `jobs_v` views stand in front of the stored table, with nulls for the columns it lacks, so every
        reader of either name reads this layout; the file is not touched (the next writable open, e.g.
        `headway ingest`, adds the columns)."""
        row = self.con.execute("SELECT current_database()").fetchone()
        assert row is not None
        nulls = ", ".join(f"NULL::{_DUCK_TYPES[JOB_SCHEMA.field(c).type]} AS {_q(c)}" for c in self.lacks)
        self.con.execute(f"CREATE TEMP VIEW jobs AS SELECT *, {nulls} FROM {_q(str(row[0]))}.main.jobs")
        self.con.execute(f"CREATE TEMP VIEW jobs_v AS SELECT *, {DERIVED_SQL} FROM temp.main.jobs")

    def _ensure_schema(self) -> None:
        cols = ", ".join(f"{_q(f.name)} {_DUCK_TYPES[f.type]}" for f in JOB_SCHEMA)
        self.con.execute(f"CREATE TABLE IF NOT EXISTS jobs ({cols})")
        self.con.execute(f"CREATE OR REPLACE VIEW jobs_v AS SELECT *, {DERIVED_SQL} FROM jobs")
        self.con.execute(
            "CREATE TABLE IF NOT EXISTS ingests (ingested_at TIMESTAMPTZ DEFAULT now(), path VARCHAR, "
            "format VARCHAR, source VARCHAR, rows_read BIGINT, jobs BIGINT, bad_rows BIGINT)"
        )
        decision_log.ensure(self.con)  # the live adapters' passes (decision_log.py)

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def upsert(self, table: pa.Table, *, refuse_reused_ids: bool = False) -> int:
        """Insert jobs, replacing any stored job with the same (source, job_id), except an ended one by a
        row that has not ended (_KEEP_STORED); one transaction. A field the incoming row leaves null keeps
        the stored job's known value (`_kept_when`); `last_kept_values` and `last_kept_by_field` count them.

        With `refuse_reused_ids`, raise ReusedIdError (storing nothing) when a stored id would be replaced
        by a different job (_OTHER_USER, or `_mostly_moved`) instead of replacing it."""
        table = conform(table)
        self.last_repeats = self.last_added = self.last_updated = self.last_kept_ended = 0
        self.last_kept_values = 0
        self.last_kept_by_field = {}
        self.last_other_source: tuple[str, int] | None = None
        if table.num_rows == 0:
            return 0
        committing = False
        try:
            self.con.register("_incoming", table)
            self.con.execute("BEGIN")
            # Last row wins inside one batch too, so a file listing a job twice stores it once. The window
            # (a sort) is only paid when the batch has duplicates: about 40% of a 1M-row ingest otherwise.
            dup_sql = "SELECT count(*) - count(DISTINCT (source, job_id)) FROM _incoming"
            dup = self.con.execute(dup_sql).fetchone()
            self.last_repeats = int(dup[0]) if dup and dup[0] else 0
            src = "_incoming"
            if dup and dup[0]:
                self.con.execute(
                    "CREATE OR REPLACE TEMP TABLE _new AS SELECT * EXCLUDE (_rn, rowid_) FROM ("
                    "SELECT *, row_number() OVER (PARTITION BY source, job_id ORDER BY rowid_ DESC) AS _rn "
                    "FROM (SELECT *, row_number() OVER () AS rowid_ FROM _incoming)) WHERE _rn = 1"
                )
                src = "_new"
            row = self.con.execute(f"SELECT count(*) FROM {src}").fetchone()
            n_new = int(row[0]) if row else 0
            # Replacing needs a join against the stored jobs; an empty store (a first ingest) skips it.
            if self.con.execute("SELECT 1 FROM jobs LIMIT 1").fetchone():
                # The same jobs (id and submit time) under another source: the file was ingested before
                # with another --source (or none), and the store is about to hold them twice.
                other = self.con.execute(
                    f"SELECT j.source, count(*) FROM jobs j JOIN {src} n ON j.job_id = n.job_id "
                    "AND j.submit_time = n.submit_time AND j.source <> n.source "
                    "GROUP BY j.source ORDER BY count(*) DESC, j.source LIMIT 1"
                ).fetchone()
                # A job or two sharing an id and a submit second by chance is no re-ingest: a tenth of
                # the batch is.
                if other and int(other[1]) >= max(2, n_new // 10):
                    self.last_other_source = (str(other[0]), int(other[1]))
                on = f"FROM jobs j JOIN {src} n ON j.source = n.source AND j.job_id = n.job_id"
                # With --replace (no refusing), a moved submit time is another job replaced whole too.
                same_job = f"NOT {_OTHER_USER} AND NOT {_KEEP_STORED}" + (
                    "" if refuse_reused_ids else f" AND NOT {_MOVED}"
                )
                # The known values to keep, counted in the join that counts the rest (no pass of its own),
                # for the fields the batch leaves null somewhere (Arrow knows that for free).
                keeps = {f: _kept_when(f, same_job) for f in MERGED_FIELDS if table.column(f).null_count}
                got = self.con.execute(
                    f"SELECT count(*), count(*) FILTER (WHERE {_OTHER_USER}), "
                    f"count(*) FILTER (WHERE {_KEEP_STORED}), "
                    + ", ".join(f"count(*) FILTER (WHERE {c})" for c in keeps.values())
                    + f" {on}"
                ).fetchone()
                counts = [int(x) for x in got] if got else [0] * (3 + len(keeps))
                matched, other_user, kept = counts[:3]
                by_field = {f: k for f, k in zip(keeps, counts[3:], strict=True) if k}
                moved = self._moved(src, on) if refuse_reused_ids else 0
                if refuse_reused_ids and (other_user or _mostly_moved(moved, matched)):
                    cond = _OTHER_USER if other_user else _MOVED
                    reused = other_user + (moved if _mostly_moved(moved, matched) else 0)
                    raise ReusedIdError(self._reused_message(on, reused, cond))
                if by_field:
                    # The rows to store, each field merged where a known value is kept (the join only
                    # when there is one to keep: a re-ingest of the same file skips it). Rows
                    # _KEEP_STORED keeps whole are left out, as _fresh leaves them out below.
                    merged = ", ".join(
                        f"CASE WHEN {keeps[c]} THEN j.{_q(c)} ELSE n.{_q(c)} END AS {_q(c)}"
                        if c in by_field
                        else f"n.{_q(c)}"
                        for c in FIELD_NAMES
                    )
                    self.con.execute(
                        f"CREATE OR REPLACE TEMP TABLE _merged AS SELECT {merged} FROM {src} n "
                        "LEFT JOIN jobs j ON j.source = n.source AND j.job_id = n.job_id "
                        f"WHERE NOT coalesce({_KEEP_STORED}, false)"
                    )
                    src = "_merged"
                elif kept:
                    self.con.execute(
                        f"CREATE OR REPLACE TEMP TABLE _fresh AS SELECT * FROM {src} n WHERE NOT EXISTS ("
                        "SELECT 1 FROM jobs j WHERE j.source = n.source AND j.job_id = n.job_id "
                        f"AND {_KEEP_STORED})"
                    )
                    src = "_fresh"
                self.last_kept_ended = kept
                self.last_kept_by_field = by_field
                self.last_kept_values = sum(by_field.values())
                self.last_updated = matched - kept
                n_new -= kept
                self.con.execute(
                    f"DELETE FROM jobs USING {src} AS n "
                    "WHERE jobs.source = n.source AND jobs.job_id = n.job_id"
                )
            cols = ", ".join(_q(c) for c in FIELD_NAMES)
            self.con.execute(f"INSERT INTO jobs ({cols}) SELECT {cols} FROM {src}")
            self.con.execute("DROP TABLE IF EXISTS _new")
            self.con.execute("DROP TABLE IF EXISTS _fresh")
            self.con.execute("DROP TABLE IF EXISTS _merged")
            committing = True
            self.con.execute("COMMIT")
        except BaseException as e:
            # Best effort: a COMMIT that failed (a full disk) has ended the transaction already, and
            # ROLLBACK's own "no transaction is active" would hide why.
            rolled_back = False
            with contextlib.suppress(duckdb.Error):
                self.con.execute("ROLLBACK")
                rolled_back = True
            if _is_interrupt(e):  # no transaction left after COMMIT began: the COMMIT went through
                raise Interrupted(stored=committing and not rolled_back) from e
            raise
        finally:
            with contextlib.suppress(duckdb.Error):
                self.con.unregister("_incoming")
        self.last_added = n_new - self.last_updated
        return n_new

    def _moved(self, src: str, on: str) -> int:
        """Shared ids whose submit time moved, less those a requeued run proves the same job: `sacct -D`
        keeps a requeued job's earlier runs as ID@START (traces/sacct.py), so a run of ID with the other
        side's submit time, in the store or in the batch, is the job before Slurm reset its Submit (a
        mass requeue before maintenance moves most of a day's ids at once)."""
        row = self.con.execute(
            "WITH proof AS ("
            "SELECT source, split_part(job_id, '@', 1) AS base, submit_time FROM jobs "
            "WHERE contains(job_id, '@') UNION ALL "
            f"SELECT source, split_part(job_id, '@', 1), submit_time FROM {src} WHERE contains(job_id, '@')) "
            f"SELECT count(*) {on} WHERE {_MOVED} AND NOT {_OTHER_USER} AND NOT EXISTS ("
            "SELECT 1 FROM proof p WHERE p.source = j.source AND p.base = j.job_id "
            "AND (p.submit_time = j.submit_time OR p.submit_time = n.submit_time))"
        ).fetchone()
        return int(row[0]) if row else 0

    def _reused_message(self, on: str, reused: int, cond: str) -> str:
        """One line: how many stored ids the batch gives to other jobs, with the first as an example."""
        ex = self.con.execute(
            f'SELECT j.source, j.job_id, j.submit_time, j."user", n.submit_time, n."user" {on} '
            f"WHERE {cond} ORDER BY j.job_id LIMIT 1"
        ).fetchone()
        assert ex is not None

        def who(submit: dt.datetime | None, user: str | None) -> str:
            when = submit.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ") if submit else "?"
            return f"submitted {when} by {user if user is not None else '?'}"

        ids, belong = (
            ("job id", "belongs to a different job")
            if reused == 1
            else ("job ids", "belong to different jobs")
        )
        return (
            f"{reused:,} {ids} of source '{ex[0]}' already stored {belong} in this "
            f"input (job {ex[1]}: stored {who(ex[2], ex[3])}, incoming {who(ex[4], ex[5])})"
        )

    def record_ingest(
        self, path: str, fmt: str, source: str, rows_read: int, jobs: int, bad_rows: int
    ) -> None:
        self.con.execute(
            "INSERT INTO ingests (path, format, source, rows_read, jobs, bad_rows) VALUES (?, ?, ?, ?, ?, ?)",
            [path, fmt, source, rows_read, jobs, bad_rows],
        )

    def sources(self) -> list[str]:
        """The sources in the store (one per ingested cluster or format), sorted."""
        return [str(r[0]) for r in self.con.execute("SELECT DISTINCT source FROM jobs ORDER BY 1").fetchall()]

    def count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM jobs").fetchone()
        return int(row[0]) if row else 0

    def table(self, where: str = "", params: list[object] | None = None) -> pa.Table:
        """Stored jobs as an Arrow table in JOB_SCHEMA, optionally filtered by a SQL condition (over the
        stored columns: a read-only earlier store's are those it has; conform adds the rest as nulls)."""
        cols = ", ".join(_q(c) for c in FIELD_NAMES if c not in self.lacks)
        sql = f"SELECT {cols} FROM jobs" + (f" WHERE {where}" if where else "")
        # A cursor of its own: a caller's unfinished execute() result on `con` must not block this read.
        cur = self.con.cursor()
        try:
            return conform(cur.sql(sql, params=params or None).to_arrow_table())
        finally:
            cur.close()

    def export_parquet(self, out: str | Path) -> int:
        """Write every job with its derived fields to `out` through a temp file beside it, renamed over
        `out` once complete: an export killed or failing midway leaves the old file whole, not half one."""
        out = Path(out)
        if not self.con.execute("SELECT 1 FROM duckdb_views() WHERE view_name = 'jobs_v'").fetchone():
            raise StoreError(
                f"{self.path}: not a headway job store, or one made by a headway too old to export (it has "
                "no jobs_v view)"
            )
        copy = (
            "COPY (SELECT * FROM jobs_v ORDER BY submit_time, source, job_id) TO '{}' "
            "(FORMAT PARQUET, COMPRESSION ZSTD)"
        )

        try:
            # A FIFO or /dev/stdout is written through, a symlink's target replaced (see the helper).
            with replaced_atomically(out) as tmp:
                self.con.execute(copy.format(_sql_str(str(tmp))))
        except duckdb.Error as e:
            raise StoreError(f"{out}: cannot write the Parquet file: {str(e).splitlines()[0]}") from e
        except OSError as e:
            raise StoreError(f"{out}: cannot write the Parquet file: {e.strerror or e}") from e
        return self.count()


def _say_on_stderr(message: str) -> None:
    """The default `on_wait`: one line on stderr (looked up now, so a Rich live display's proxy takes it)."""
    print(message, file=sys.stderr, flush=True)


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


_DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of every DuckDB database file


def is_duckdb_file(path: Path) -> bool:
    """Whether `path` is a DuckDB database, such as a job store. Only a regular file is read: opening a
    FIFO or /dev/stdout to look would wait for a writer for ever."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            return f.read(12)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return False


def _check_is_store(path: Path) -> None:
    """Refuse an existing file that is not a DuckDB database before DuckDB opens it: given a CSV, JSON or
    Parquet file, it opens an in-memory database over it instead, and every job written is lost. (An
    empty file, or one that cannot be read, is left to DuckDB, whose own error names it.)"""
    try:
        empty = path.stat().st_size == 0
    except OSError:
        return
    if path.is_file() and not empty and os.access(path, os.R_OK) and not is_duckdb_file(path):
        raise StoreError(
            f"{path}: not a headway job store (a DuckDB file); to read a job log, give it to "
            "`headway ingest` and name the store with --db, e.g. --db headway.duckdb"
        )
