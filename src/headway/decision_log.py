"""The decision log: one row per live scheduling pass, kept in the job store (its `decisions` table).

Both live adapters write it: the local queue's daemon copies the passes that started jobs from its own
SQLite log (local/store_flush.py), and `headway slurm sync --apply` records every pass it runs, ok or not
(slurm/sync.py). The dashboard reads it to show what each pass started or wrote and why, the Slurm
adapter's last queue, pass durations and errors, and the first day headway's ranking was applied.

`decisions` holds one narrow row per pass; its lists (jobs started, SiteFactors written, the ranking, the
running jobs) are rows of `decision_jobs` (decision_id, source, job_id, role, pos, data: the entry as
JSON text), one per job and role. So the passes of one job are found by its id without reading any JSON,
and a pass is read without decompressing its neighbours: the ranking of a pass as one JSON value of
~50 KB made DuckDB (which compresses such strings by the 2048-row vector) decompress a hundred MB to
read one pass. Readers never create anything: on a store without the tables (or a read-only one) they
return nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
from dataclasses import dataclass
from typing import Any

import duckdb

TABLE = "decisions"
JOBS_TABLE = "decision_jobs"
# Roles of a job in a pass; `running` (the jobs running as it ran) is not a part the pass played in the
# job's story, so `for_job` leaves it out.
ROLES = ("started", "written", "ranked", "running")
_STORY = ("started", "written", "ranked")
# The rankings and running lists of passes older than this are dropped (the passes themselves, what they
# started and wrote, stay): at a pass a minute with 200 jobs ranked they are 100M rows a year.
KEEP_RANKINGS_DAYS = 90.0
PRUNE_EVERY = 500  # passes recorded between two prunings

_SCHEMA = f"""
CREATE SEQUENCE IF NOT EXISTS {TABLE}_id_seq START 1;
CREATE TABLE IF NOT EXISTS {TABLE} (
    id BIGINT NOT NULL DEFAULT nextval('{TABLE}_id_seq'),
    ran_at TIMESTAMPTZ NOT NULL,
    source VARCHAR NOT NULL,
    adapter VARCHAR NOT NULL,
    policy VARCHAR NOT NULL,
    ok BOOLEAN NOT NULL,
    applied BOOLEAN NOT NULL,
    duration_s DOUBLE,
    error VARCHAR,
    pending INTEGER,
    origin_id BIGINT
);
CREATE TABLE IF NOT EXISTS {JOBS_TABLE} (
    decision_id BIGINT NOT NULL,
    source VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    role VARCHAR NOT NULL,
    pos INTEGER NOT NULL,
    data VARCHAR
);
"""

_COLUMNS = "id, epoch_us(ran_at), source, adapter, policy, ok, applied, duration_s, error, pending"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One live pass. `ranking` rows: job_id, rank, tier, score, p_success, runtime_s, reason,
    estimated_start (ISO text or None), user, name, gpus; `running` rows: job_id, user, name, gpus, where
    (GPU ids or nodes, as text); `written` rows (Slurm): job_id, old, new. Missing values are None."""

    at: dt.datetime  # UTC, when the pass ran (tz-aware)
    source: str  # the store's source of these jobs: 'local', or the Slurm source name ('sacct')
    adapter: str  # 'local' or 'slurm'
    policy: str
    ok: bool  # False: the pass failed (`error` says why)
    applied: bool  # the pass acted (local: started jobs; slurm: --apply, not a dry run)
    duration_s: float | None
    error: str | None = None
    started: tuple[str, ...] = ()
    written: tuple[dict[str, Any], ...] = ()
    ranking: tuple[dict[str, Any], ...] = ()
    running: tuple[dict[str, Any], ...] = ()
    pending: int | None = None
    id: int | None = None  # assigned by the store


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    """Create the tables in a writable store (a no-op when they are there)."""
    con.execute(_SCHEMA)


def has_log(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this store holds the decision log (a store written before it existed does not)."""
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_name IN (?, ?)",
        [TABLE, JOBS_TABLE],
    ).fetchall()
    return len(rows) == 2


def _clean(v: Any) -> Any:
    """JSON-ready: NaN and infinities are None (strict JSON has neither), numpy scalars plain numbers."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, str | int | bool):
        return v
    item = getattr(v, "item", None)  # a numpy scalar
    if callable(item):
        return _clean(item())
    return str(v)


def _dumps(v: Any) -> str:
    return json.dumps(_clean(v), separators=(",", ":"), allow_nan=False)


def _us(t: dt.datetime) -> int:
    if t.tzinfo is None:
        raise ValueError(f"DecisionRecord.at must be tz-aware (UTC), not {t!r}")
    return (t - _EPOCH) // dt.timedelta(microseconds=1)


def _at(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=int(us))


def record(con: duckdb.DuckDBPyConnection, rec: DecisionRecord, *, origin_id: int | None = None) -> int:
    """Insert one pass and its jobs in one transaction; its new id. `origin_id` is the pass's id in the
    writer's own log (the local queue's SQLite): a pass already copied (same adapter, source, origin id
    and time) is not copied again, and its stored id is returned."""
    at_us = _us(rec.at)
    if origin_id is not None:
        row = con.execute(
            f"SELECT id FROM {TABLE} WHERE origin_id = ? AND adapter = ? AND source = ? "
            "AND epoch_us(ran_at) = ? LIMIT 1",
            [origin_id, rec.adapter, rec.source, at_us],
        ).fetchone()
        if row is not None:
            return int(row[0])
    jobs: list[tuple[str, str, int, str | None]] = [
        (str(j), "started", i, None) for i, j in enumerate(rec.started)
    ]
    for role, rows in (("written", rec.written), ("ranked", rec.ranking), ("running", rec.running)):
        jobs += [(str(r.get("job_id")), role, i, _dumps(r)) for i, r in enumerate(rows)]
    con.execute("BEGIN TRANSACTION")
    try:
        got = con.execute(
            f"INSERT INTO {TABLE} (ran_at, source, adapter, policy, ok, applied, duration_s, error, pending, "
            "origin_id) VALUES (make_timestamptz(?::BIGINT), ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [
                at_us,
                rec.source,
                rec.adapter,
                rec.policy,
                bool(rec.ok),
                bool(rec.applied),
                _clean(rec.duration_s),
                rec.error,
                rec.pending,
                origin_id,
            ],
        ).fetchone()
        assert got is not None
        did = int(got[0])
        if jobs:
            con.execute(
                f"INSERT INTO {JOBS_TABLE} SELECT ?, ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
                "unnest(?::INTEGER[]), unnest(?::VARCHAR[])",
                [did, rec.source, *([j[k] for j in jobs] for k in range(4))],
            )
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    if did % PRUNE_EVERY == 0:
        prune(con, rec.at - dt.timedelta(days=KEEP_RANKINGS_DAYS))
    return did


def prune(con: duckdb.DuckDBPyConnection, before: dt.datetime) -> int:
    """Drop the ranked and running rows of the passes that ran before `before`; how many went."""
    got = con.execute(
        f"DELETE FROM {JOBS_TABLE} WHERE role IN ('ranked', 'running') AND decision_id IN "
        f"(SELECT id FROM {TABLE} WHERE epoch_us(ran_at) < ?)",
        [_us(before)],
    ).fetchone()
    return int(got[0]) if got else 0


def _loads(text: str | None) -> list[Any]:
    try:
        v = json.loads(text) if text else []
    except ValueError:  # never written so; a damaged row reads as an empty list
        return []
    return v if isinstance(v, list) else []


def _select(
    con: duckdb.DuckDBPyConnection, where: str, params: list[Any], limit: int
) -> list[DecisionRecord]:
    """The passes matching `where`, newest first, each with its lists (one query for all of them)."""
    if limit <= 0 or not has_log(con):
        return []
    sql = f"SELECT {_COLUMNS} FROM {TABLE}" + (f" WHERE {where}" if where else "")
    heads = con.execute(sql + f" ORDER BY id DESC LIMIT {int(limit)}", params).fetchall()
    if not heads:
        return []
    ids = [int(h[0]) for h in heads]
    # Each list of each pass as one JSON array (one parse per list, not per job), and the started ids.
    # Between the lowest and highest id first: ids rise as passes are written, so the zone maps of
    # decision_id skip the row groups of other passes before the list is matched.
    lists: dict[tuple[int, str], tuple[str | None, list[str]]] = {
        (int(did), str(role)): (text, ids_)
        for did, role, text, ids_ in con.execute(
            f"SELECT decision_id, role, '[' || string_agg(data, ',' ORDER BY pos) || ']', "
            f"list(job_id ORDER BY pos) FROM {JOBS_TABLE} WHERE decision_id BETWEEN ? AND ? "
            "AND list_contains(?, decision_id) GROUP BY decision_id, role",
            [min(ids), max(ids), ids],
        ).fetchall()
    }

    def entries(did: int, role: str) -> tuple[dict[str, Any], ...]:
        text = lists.get((did, role), (None, []))[0]
        return tuple(e for e in _loads(text) if isinstance(e, dict))

    out = []
    for h in heads:
        did = int(h[0])
        out.append(
            DecisionRecord(
                at=_at(h[1]),
                source=str(h[2]),
                adapter=str(h[3]),
                policy=str(h[4]),
                ok=bool(h[5]),
                applied=bool(h[6]),
                duration_s=None if h[7] is None else float(h[7]),
                error=h[8],
                pending=None if h[9] is None else int(h[9]),
                started=tuple(str(j) for j in lists.get((did, "started"), (None, []))[1]),
                written=entries(did, "written"),
                ranking=entries(did, "ranked"),
                running=entries(did, "running"),
                id=did,
            )
        )
    return out


def passes(
    con: duckdb.DuckDBPyConnection,
    *,
    source: str | None = None,
    limit: int = 100,
    before_id: int | None = None,
) -> list[DecisionRecord]:
    """Logged passes, newest (highest id) first; `before_id` pages on from an earlier answer's last id."""
    where: list[str] = []
    params: list[Any] = []
    if source is not None:
        where.append("source = ?")
        params.append(source)
    if before_id is not None:
        where.append("id < ?")
        params.append(int(before_id))
    return _select(con, " AND ".join(where), params, limit)


def get(con: duckdb.DuckDBPyConnection, decision_id: int) -> DecisionRecord | None:
    found = _select(con, "id = ?", [int(decision_id)], 1)
    return found[0] if found else None


def for_job(
    con: duckdb.DuckDBPyConnection, source: str, job_id: str, limit: int = 50
) -> list[DecisionRecord]:
    """The passes that started the job, wrote its priority or ranked it; newest first."""
    if limit <= 0 or not has_log(con):
        return []
    ids = [
        int(r[0])
        for r in con.execute(
            f"SELECT DISTINCT decision_id FROM {JOBS_TABLE} WHERE source = ? AND job_id = ? AND role IN "
            f"({', '.join('?' for _ in _STORY)}) ORDER BY decision_id DESC LIMIT {int(limit)}",
            [source, str(job_id), *_STORY],
        ).fetchall()
    ]
    if not ids:
        return []
    return _select(con, "id BETWEEN ? AND ? AND list_contains(?, id)", [min(ids), max(ids), ids], limit)


def latest(
    con: duckdb.DuckDBPyConnection, source: str | None = None, adapter: str | None = None
) -> DecisionRecord | None:
    """The newest logged pass (of that source and adapter)."""
    where: list[str] = []
    params: list[Any] = []
    if source is not None:
        where.append("source = ?")
        params.append(source)
    if adapter is not None:
        where.append("adapter = ?")
        params.append(adapter)
    found = _select(con, " AND ".join(where), params, 1)
    return found[0] if found else None


def first_applied(con: duckdb.DuckDBPyConnection, policy: str | None = "impact") -> dt.datetime | None:
    """When headway's ranking was first applied: the earliest ok pass that acted (of that policy)."""
    if not has_log(con):
        return None
    sql = f"SELECT min(epoch_us(ran_at)) FROM {TABLE} WHERE ok AND applied"
    row = con.execute(sql + " AND policy = ?", [policy]).fetchone() if policy else con.execute(sql).fetchone()
    return None if row is None or row[0] is None else _at(row[0])


def pass_stats(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per (adapter, source): passes, errors (failed passes), last_at (UTC datetime), last_duration_s,
    mean_duration_s; for /metrics."""
    if not has_log(con):
        return []
    rows = con.execute(
        f"SELECT adapter, source, count(*), count(*) FILTER (WHERE NOT ok), max(epoch_us(ran_at)), "
        f"arg_max(duration_s, id), avg(duration_s) FROM {TABLE} GROUP BY adapter, source "
        "ORDER BY adapter, source"
    ).fetchall()
    return [
        {
            "adapter": str(a),
            "source": str(s),
            "passes": int(n),
            "errors": int(e),
            "last_at": _at(last),
            "last_duration_s": None if ld is None else float(ld),
            "mean_duration_s": None if md is None else float(md),
        }
        for a, s, n, e, last, ld, md in rows
    ]


__all__ = [
    "DecisionRecord",
    "ensure",
    "first_applied",
    "for_job",
    "get",
    "has_log",
    "latest",
    "pass_stats",
    "passes",
    "record",
]
