"""Ended local jobs into the DuckDB job store, so `headway audit` and `headway predict` see them.

The store is opened for each batch and closed at once: DuckDB locks its file while a writer has it open,
and a daemon that held it for good would lock every reader out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from headway.schema import JOB_SCHEMA

SOURCE = "local"


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
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)


def write_ended(store_path: Path, rows: Sequence[Mapping[str, Any]]) -> int:
    """Upsert the rows (idempotent: keyed by source and job id) and close the store again."""
    from headway.store import JobStore

    with JobStore(store_path) as store:
        return store.upsert(to_table(rows))
