"""Ended local jobs into the DuckDB job store, so `headway audit` and `headway predict` see them.

The store is opened for each batch and closed at once: DuckDB locks its file while a writer has it open,
and a daemon that held it for good would lock every reader out.

A job is keyed by (source 'local', job id). The queue never gives an id twice (db.StateDB.ids_after), and
a row never replaces a stored job of the same id with another submit time: that would be another job (a
queue whose database was lost and started again at 1, or two servers' queues writing one store), and the
earlier one would be gone without a word.

The passes that started jobs (the queue's `decisions` table) go into the store's decision log in the same
open (decision_log.py), each once: keyed by its id in the queue's database and its time.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from headway.decision_log import DecisionRecord
from headway.policy.snapshot import tier_of_reason
from headway.schema import JOB_SCHEMA

if TYPE_CHECKING:
    from headway.store import JobStore

SOURCE = "local"

log = logging.getLogger("headway.daemon")


def _ts(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(float(t), dt.UTC)


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """SQLite job rows as JOB_SCHEMA rows (source 'local', job_id the queue's id)."""
    cols: dict[str, list[Any]] = {name: [] for name in JOB_SCHEMA.names}
    for r in rows:
        limit = r["time_limit"]
        cols["job_id"].append(str(r["id"]))
        cols["user"].append(r["user"])
        cols["group"].append(None)
        cols["name"].append(r["name"])
        cols["partition"].append(None)
        cols["priority_class"].append(r["priority"])
        cols["submit_time"].append(_ts(r["submit_time"]))
        cols["start_time"].append(_ts(r["start_time"]))
        cols["end_time"].append(_ts(r["end_time"]))
        cols["gpus"].append(float(r["gpus"]))
        cols["nodes"].append(1)
        cols["cpus"].append(None)
        cols["mem_mb"].append(None)
        cols["time_limit"].append(None if limit is None else max(1, round(float(limit))))
        cols["state"].append(r["state"])
        cols["exit_code"].append(r["exit_code"])
        cols["source"].append(SOURCE)
        if "preemptible" in cols:  # what `headway submit --preemptible` said (the job store's columns)
            have = r.keys()  # a row of an older queue database has neither
            every = r["checkpoint_every"] if "checkpoint_every" in have else None
            cols["preemptible"].append(bool(r["preemptible"]) if "preemptible" in have else False)
            cols["checkpoint_every"].append(None if every is None else max(1, round(float(every))))
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)


def _iso(t: Any, floor: float) -> str | None:
    """An estimated start as ISO text (never before the pass that made it); None when unknown."""
    if not isinstance(t, int | float) or not math.isfinite(t):
        return None
    return dt.datetime.fromtimestamp(max(float(t), floor), dt.UTC).isoformat()


def to_decision(row: Mapping[str, Any], jobs: Mapping[int, Mapping[str, Any]]) -> DecisionRecord:
    """A logged pass of the queue's database (its `decisions` row) as the store's decision log keeps it;
    `jobs` gives the queue's rows of the jobs it names (user, name, GPUs, predictions). Raises ValueError
    (or KeyError) on a row that cannot be read."""
    when = float(row["time"])
    ranking = []
    for e in json.loads(row["ranking"]):
        jid = int(e["job_id"])
        job = jobs.get(jid, {})
        f = e.get("factors") or {}
        reason = str(e.get("reason") or "")
        runtime = f["R_h"] * 3600.0 if "R_h" in f else job.get("pred_runtime")
        ranking.append(
            {
                "job_id": str(jid),
                "rank": e.get("rank"),
                "tier": tier_of_reason(reason),
                "score": e.get("score"),
                "p_success": f.get("p", job.get("p_success")),
                "runtime_s": runtime,
                "reason": reason or None,
                "estimated_start": _iso(e.get("estimated_start"), when),
                "user": job.get("user"),
                "name": job.get("name"),
                "gpus": job.get("gpus"),
            }
        )
    running = [
        {
            "job_id": str(r["job_id"]),
            "user": r.get("user"),
            "name": r.get("name"),
            "gpus": r.get("gpus"),
            "where": "GPU " + ",".join(str(g) for g in r.get("gpu_ids") or []) if r.get("gpu_ids") else None,
        }
        for r in json.loads(row["running"] or "[]")
    ]
    return DecisionRecord(
        at=dt.datetime.fromtimestamp(when, dt.UTC),
        source=SOURCE,
        adapter="local",
        policy=str(row["policy"]),
        ok=True,  # the queue logs only the passes that started jobs
        applied=True,
        duration_s=row["duration_s"],
        started=tuple(str(int(jid)) for jid, _ in json.loads(row["starts"])),
        ranking=tuple(ranking),
        running=tuple(running),
        pending=row["pending"],
    )


def write_ended(
    store_path: Path,
    rows: Sequence[Mapping[str, Any]],
    decisions: Sequence[tuple[int, DecisionRecord]] = (),
) -> int:
    """Upsert the rows (idempotent: keyed by source and job id), add the passes (queue decision id,
    record) not yet in the decision log, and close the store again. A row whose id the store already
    holds for a job with another submit time is left out (and logged): it is another job, and the stored
    one stays."""
    from headway import decision_log
    from headway.store import JobStore

    with JobStore(store_path) as store:
        n = _upsert_ended(store, store_path, rows) if rows else 0
        for did, rec in decisions:
            decision_log.record(store.con, rec, origin_id=did)
    return n


def _upsert_ended(store: JobStore, store_path: Path, rows: Sequence[Mapping[str, Any]]) -> int:
    table = to_table(rows)
    store.con.register("_local_incoming", table)
    try:
        clash = {
            str(r[0])
            for r in store.con.execute(
                "SELECT n.job_id FROM _local_incoming n JOIN jobs j "
                "ON j.source = n.source AND j.job_id = n.job_id "
                "WHERE j.submit_time IS DISTINCT FROM n.submit_time"
            ).fetchall()
        }
    finally:
        store.con.unregister("_local_incoming")
    if clash:
        log.error(
            "job store %s already holds other jobs under local job id(s) %s: they are kept, and "
            "these ended jobs stay in the queue's database only",
            store_path,
            ", ".join(sorted(clash, key=lambda x: (len(x), x))[:10]),
        )
        keep = pa.array([jid not in clash for jid in table.column("job_id").to_pylist()])
        table = table.filter(keep)
    return store.upsert(table)


def max_local_id(store_path: Path) -> int:
    """The largest local job id in the job store (0 if none), so that a queue whose database was lost or
    restored from a backup goes on after it. Raises headway.store.StoreError when it cannot be read."""
    from headway.store import JobStore

    with JobStore(store_path, read_only=True) as store:
        row = store.con.execute(
            "SELECT max(TRY_CAST(job_id AS BIGINT)) FROM jobs WHERE source = ?", [SOURCE]
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0
