"""The one job record every reader produces and every part consumes (DESIGN.md, "The job record")."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa


class State(StrEnum):
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    RUNNING = "RUNNING"
    PENDING = "PENDING"
    UNKNOWN = "UNKNOWN"


class Outcome(StrEnum):
    """Outcome classes of DESIGN.md: what a report counts a state as."""

    SUCCESS = "success"
    WASTE = "waste"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    UNFINISHED = "unfinished"  # running, pending or unknown: not ended, or not known how


OUTCOME_OF: dict[State, Outcome] = {
    State.COMPLETED: Outcome.SUCCESS,
    State.FAILED: Outcome.WASTE,
    State.TIMEOUT: Outcome.WASTE,
    State.OUT_OF_MEMORY: Outcome.WASTE,
    State.NODE_FAIL: Outcome.WASTE,
    State.CANCELLED: Outcome.CANCELLED,
    State.PREEMPTED: Outcome.PREEMPTED,
    State.RUNNING: Outcome.UNFINISHED,
    State.PENDING: Outcome.UNFINISHED,
    State.UNKNOWN: Outcome.UNFINISHED,
}

WASTE_STATES: tuple[State, ...] = tuple(s for s, o in OUTCOME_OF.items() if o is Outcome.WASTE)
# Failures the job's owner can act on (the code, the memory or the time asked for): what the repeat-failure
# hold counts. A node failure is waste too, but not the user's doing: it neither extends nor ends a
# streak, so one bad node cannot hold back a user's sweep.
OWN_FAILURE_STATES: frozenset[str] = frozenset(
    {State.FAILED.value, State.TIMEOUT.value, State.OUT_OF_MEMORY.value}
)
ENDED_STATES: tuple[State, ...] = tuple(s for s, o in OUTCOME_OF.items() if o is not Outcome.UNFINISHED)

TS = pa.timestamp("us", tz="UTC")

# Column order is the storage order; readers must return exactly this schema (see `conform`).
JOB_SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("user", pa.string()),
        pa.field("group", pa.string()),
        pa.field("name", pa.string()),
        pa.field("partition", pa.string()),
        pa.field("priority_class", pa.string()),
        pa.field("submit_time", TS),
        pa.field("start_time", TS),
        pa.field("end_time", TS),
        pa.field("gpus", pa.float64()),
        pa.field("nodes", pa.int32()),
        pa.field("cpus", pa.int64()),
        pa.field("mem_mb", pa.int64()),
        pa.field("time_limit", pa.int64()),  # seconds
        pa.field("state", pa.string(), nullable=False),
        pa.field("exit_code", pa.int32()),
        pa.field("source", pa.string(), nullable=False),
        # Whether a higher class may stop the job and requeue it (Beaker's flag; a preemptable Slurm QOS;
        # `headway submit --preemptible`); null: not said. How often it saves its progress (seconds): a
        # preempted job resumes from its last checkpoint (null: the policies' documented default).
        pa.field("preemptible", pa.bool_()),
        pa.field("checkpoint_every", pa.int64()),
    ]
)

FIELD_NAMES: tuple[str, ...] = tuple(JOB_SCHEMA.names)
# Fields every reader must fill; the rest may be null when the log lacks them.
# No job asks for more GPUs than this (the largest clusters have about 100k); a reader takes a bigger
# count for a broken row (1e19 GPUs was stored, and every audit of that store then failed).
MAX_GPUS = 1_000_000
REQUIRED_FIELDS: tuple[str, ...] = ("job_id", "state", "source")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as a Python object; the Arrow table is the bulk form of the same thing."""

    job_id: str
    state: State
    source: str
    user: str | None = None
    group: str | None = None
    name: str | None = None
    partition: str | None = None
    priority_class: str | None = None
    submit_time: dt.datetime | None = None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    gpus: float = 0.0
    nodes: int = 1
    cpus: int | None = None
    mem_mb: int | None = None
    time_limit: int | None = None
    exit_code: int | None = None
    preemptible: bool | None = None
    checkpoint_every: int | None = None  # seconds

    @property
    def runtime(self) -> float | None:
        """Seconds from start to end, or None while either is unknown."""
        if self.start_time is None or self.end_time is None:
            return None
        return (self.end_time - self.start_time).total_seconds()

    @property
    def wait(self) -> float | None:
        """Queueing delay in seconds (start - submit)."""
        if self.start_time is None or self.submit_time is None:
            return None
        return (self.start_time - self.submit_time).total_seconds()

    @property
    def gpu_hours(self) -> float:
        rt = self.runtime
        return 0.0 if rt is None else self.gpus * max(rt, 0.0) / 3600.0

    @property
    def outcome(self) -> Outcome:
        return OUTCOME_OF[self.state]

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["state"] = self.state.value
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> JobRecord:
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in row.items() if k in names}
        kw["state"] = State(kw["state"])
        if kw.get("gpus") is None:
            kw["gpus"] = 0.0
        if kw.get("nodes") is None:
            kw["nodes"] = 1
        return cls(**kw)


def records_to_table(records: Iterable[JobRecord]) -> pa.Table:
    rows = [r.to_row() for r in records]
    cols = {name: [row[name] for row in rows] for name in FIELD_NAMES}
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)


def table_to_records(table: pa.Table) -> list[JobRecord]:
    return [JobRecord.from_row(r) for r in conform(table).to_pylist()]


def empty_table() -> pa.Table:
    return JOB_SCHEMA.empty_table()


def conform(table: pa.Table) -> pa.Table:
    """Cast a reader's table to JOB_SCHEMA, adding missing optional columns as nulls."""
    n = table.num_rows
    cols = []
    for f in JOB_SCHEMA:
        if f.name in table.column_names:
            col = table.column(f.name)
            if col.type != f.type:
                col = col.cast(f.type)
            cols.append(col)
        elif f.name in REQUIRED_FIELDS:
            raise ValueError(f"reader output lacks required column {f.name!r}")
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=JOB_SCHEMA)


def with_derived(table: pa.Table) -> pa.Table:
    """Add runtime, wait (seconds) and gpu_hours columns, computed as DESIGN.md defines them."""
    import pyarrow.compute as pc

    def seconds(a: str, b: str) -> pa.Array:
        d = pc.subtract(table.column(b), table.column(a))
        return pc.divide(d.cast(pa.int64()), 1_000_000.0)

    runtime = seconds("start_time", "end_time")
    wait = seconds("submit_time", "start_time")
    gpus = pc.fill_null(table.column("gpus"), 0.0)
    gpu_hours = pc.fill_null(pc.divide(pc.multiply(gpus, pc.max_element_wise(runtime, 0.0)), 3600.0), 0.0)
    return (
        table.append_column("runtime", runtime)
        .append_column("wait", wait)
        .append_column("gpu_hours", gpu_hours)
    )


_DIGITS = re.compile(r"(\d+)")


def natural_key(job_id: str) -> tuple[str | int, ...]:
    """`application_1506638472019_9999` before `..._10000`: digit runs compare as numbers, so the order
    is the scheduler's own numbering (Slurm ids, YARN application sequence numbers)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(_DIGITS.split(job_id)))


def submit_order(submit: npt.NDArray[np.float64], jobs: pa.Table) -> npt.NDArray[np.intp]:
    """Positions of `jobs` by submit time (seconds, one per row), then source, then job id in natural
    order: jobs submitted in the same second come in one order whatever order the rows came in (a log
    file, the store, an exported Parquet file). A log's own row order decided it before, and moved
    replay results by a few per cent."""
    o = np.argsort(submit, kind="stable")
    s = submit[o]
    tied = np.zeros(len(s), dtype=bool)
    eq = s[1:] == s[:-1]
    tied[1:] |= eq
    tied[:-1] |= eq
    if not tied.any():
        return o
    pos = np.flatnonzero(tied)  # positions (in submit order) of jobs that share their submit time
    rows = pa.array(o[pos])
    src = jobs.column("source").take(rows).to_pylist() if "source" in jobs.column_names else [""] * len(pos)
    keys = list(zip(src, map(natural_key, jobs.column("job_id").take(rows).to_pylist()), strict=True))
    group = np.cumsum(np.r_[True, s[pos[1:]] != s[pos[:-1]]])  # runs of one submit time
    perm = sorted(range(len(pos)), key=lambda i: (group[i], keys[i]))
    o[pos] = o[pos[perm]]
    return o
