"""Reader for Alibaba's GPU-sharing cluster trace (cluster-trace-gpu-v2023, Weng et al., USENIX ATC '23).

`openb_pod_list_*.csv` holds the pods (the jobs); `openb_node_list_*.csv` holds the cluster's nodes, which
are not jobs: `read_alibaba_nodes` turns them into a cluster description for the simulator, and ingesting one
gives a clear error. Pod times are seconds from the (unpublished) trace start; they are placed on a
documented epoch so they become real UTC timestamps (docs/formats.md).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from headway.schema import JOB_SCHEMA, TS, State, conform
from headway.traces.base import BadInputError, BadRowSink, ReadOptions, ReadResult

NAME = "alibaba"
# The trace gives times relative to its start and does not say when that was; this is the stored origin.
DEFAULT_EPOCH = dt.datetime(2023, 1, 1, tzinfo=dt.UTC)

POD_COLUMNS: tuple[str, ...] = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
# Without these a pod cannot become a job record at all.
REQUIRED_POD_COLUMNS: tuple[str, ...] = ("name", "pod_phase")
NODE_COLUMNS: tuple[str, ...] = ("sn", "cpu_milli", "memory_mib", "gpu", "model")

# `Running` in this trace means the pod was deleted while it was still running: it ended, but nobody knows
# whether it would have succeeded. UNKNOWN keeps its GPU-hours in the totals without calling it success or
# waste; RUNNING would contradict its end time, CANCELLED would blame a user (docs/formats.md).
STATE_OF: dict[str, State] = {
    "Succeeded": State.COMPLETED,
    "Failed": State.FAILED,
    "Running": State.UNKNOWN,
    "Pending": State.PENDING,
    "Unknown": State.UNKNOWN,
}

# Schema fields a pod list never provides.
MISSING_FIELDS: list[str] = ["user", "group", "name", "partition", "time_limit", "exit_code"]

# The schema columns a pod fills, in the order `_row` returns them.
_COLUMNS: tuple[str, ...] = (
    "job_id",
    "priority_class",
    "submit_time",
    "start_time",
    "end_time",
    "gpus",
    "nodes",
    "cpus",
    "mem_mb",
    "state",
)
_MAX_INT = 2**53  # larger counts are corrupt data, and would overflow the schema's integer columns
NODE_LIST_MESSAGE = "this is a node list, not jobs; pass it to simulate --nodes-file"


@dataclass(frozen=True, slots=True)
class AlibabaNode:
    """One machine of the traced cluster: what the simulator needs to rebuild its GPUs."""

    name: str
    gpus: int
    model: str | None  # GPU model (e.g. V100M16, T4); None for CPU-only nodes
    cpu_milli: int
    memory_mib: int


def _header(head: bytes) -> list[str] | None:
    text = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].strip()
    if not text or b"," not in text:
        return None
    try:
        return [c.strip().lower() for c in text.decode("utf-8").split(",")]
    except UnicodeDecodeError:
        return None


def _is_pod_header(cols: list[str]) -> bool:
    return {"name", "pod_phase", "num_gpu", "creation_time"} <= set(cols)


def _is_node_header(cols: list[str]) -> bool:
    return {"sn", "gpu", "model"} <= set(cols) and "pod_phase" not in cols


class _Bad(Exception):
    """One row cannot be used; the message is the reason."""


def _int(value: str, column: str, *, blank_ok: bool = True) -> int | None:
    """A non-negative integer cell ("12", "12.0"); blank means unknown."""
    v = value.strip()
    if not v:
        if blank_ok:
            return None
        raise _Bad(f"{column}: empty")
    try:
        n = int(v)
    except ValueError:
        try:
            f = float(v)
        except ValueError:
            raise _Bad(f"{column}: expected a number, got {value!r}") from None
        if not math.isfinite(f) or f != int(f):
            raise _Bad(f"{column}: expected a whole number, got {value!r}") from None
        n = int(f)
    if n < 0:
        raise _Bad(f"{column}: negative ({value!r})")
    if n > _MAX_INT:
        raise _Bad(f"{column}: out of range ({value!r})")
    return n


def _lines(text: str, progress: Callable[[int], None] | None) -> Iterator[str]:
    done = 0
    for i, line in enumerate(io.StringIO(text, newline="")):
        done += len(line)
        if progress is not None and i % 20000 == 0:
            progress(done)
        yield line


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BadInputError(f"{path}: cannot read: {e.strerror}") from e
    if b"\x00" in data[:65536]:
        raise BadInputError(f"{path}: binary data, not an Alibaba CSV")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not UTF-8 text (byte {e.start}); not an Alibaba CSV") from e


class AlibabaReader:
    name = NAME

    def __init__(self, epoch: dt.datetime = DEFAULT_EPOCH) -> None:
        if epoch.tzinfo is None:
            raise ValueError("epoch must be timezone-aware")
        self.epoch = epoch.astimezone(dt.UTC)

    def sniff(self, path: Path, head: bytes) -> bool:
        """Both the pod list and the node list answer yes, so `read` can explain what a node list is for."""
        cols = _header(head)
        return cols is not None and (_is_pod_header(cols) or _is_node_header(cols))

    def _time(self, value: str, column: str) -> dt.datetime | None:
        v = value.strip()
        if not v:
            return None
        try:
            sec = float(v)
        except ValueError:
            raise _Bad(f"{column}: expected seconds from the trace start, got {value!r}") from None
        if not math.isfinite(sec) or sec < 0 or sec > 1e10:
            raise _Bad(f"{column}: out of range ({value!r})")
        return self.epoch + dt.timedelta(seconds=sec)

    def _row(self, cell: Callable[[str], str]) -> dict[str, Any]:
        job_id = cell("name").strip()
        if not job_id:
            raise _Bad("name: empty")
        phase = cell("pod_phase").strip()
        if phase not in STATE_OF:
            raise _Bad(f"pod_phase: expected one of {', '.join(STATE_OF)}, got {phase!r}")
        state = STATE_OF[phase]
        num_gpu = _int(cell("num_gpu"), "num_gpu")
        gpu_milli = _int(cell("gpu_milli"), "gpu_milli")
        if gpu_milli is not None and gpu_milli > 1000:
            raise _Bad(f"gpu_milli: over 1000 (a whole GPU), got {gpu_milli}")
        gpus: float | None
        if num_gpu == 0:
            gpus = 0.0
        elif num_gpu is None:
            gpus = None
        elif gpu_milli is None:
            raise _Bad("gpu_milli: empty while num_gpu > 0")
        else:
            gpus = num_gpu * gpu_milli / 1000.0
        cpu_milli = _int(cell("cpu_milli"), "cpu_milli")
        submit = self._time(cell("creation_time"), "creation_time")
        start = self._time(cell("scheduled_time"), "scheduled_time")
        end = self._time(cell("deletion_time"), "deletion_time")
        if start is not None and end is not None and end < start:
            raise _Bad("deletion_time is before scheduled_time")
        if submit is not None and start is not None and start < submit:
            raise _Bad("scheduled_time is before creation_time")
        qos = cell("qos").strip() or None
        return {
            "job_id": job_id,
            "priority_class": qos,
            "submit_time": submit,
            "start_time": start,
            "end_time": end,
            "gpus": gpus,
            "nodes": 1,  # a pod runs on one node
            # The schema counts whole CPUs; a pod asking for 3.152 cores needs 4 to be placed.
            "cpus": None if cpu_milli is None else -(-cpu_milli // 1000),
            "mem_mb": _int(cell("memory_mib"), "memory_mib"),
            "state": state.value,
        }

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        text = _read_text(path)
        label = str(path)
        reader = csv.reader(_lines(text, options.progress))
        try:
            header = [c.strip().lower() for c in next(reader)]
        except StopIteration:
            raise BadInputError(f"{path}: empty file") from None
        except csv.Error as e:
            raise BadInputError(f"{path}:1: unreadable CSV header ({e})") from e
        if _is_node_header(header):
            raise BadInputError(f"{path}: {NODE_LIST_MESSAGE}")
        lacking = [c for c in REQUIRED_POD_COLUMNS if c not in header]
        if lacking:
            raise BadInputError(
                f"{path}:1: not an Alibaba pod list: no column {', '.join(lacking)} "
                f"(expected {', '.join(POD_COLUMNS)})"
            )
        index = {c: i for i, c in enumerate(header)}
        absent = [c for c in POD_COLUMNS if c not in index]
        sink = BadRowSink(options.strict)
        cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        rows_read = 0
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                rows_read += 1
                sink.add(label, reader.line_num, f"unreadable CSV ({e})")
                continue
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            rows_read += 1
            if len(fields) != len(header):
                sink.add(label, reader.line_num, f"{len(fields)} fields, header has {len(header)}")
                continue

            def cell(c: str, fields: list[str] = fields) -> str:
                i = index.get(c)
                return "" if i is None else fields[i]

            try:
                row = self._row(cell)
            except _Bad as e:
                sink.add(label, reader.line_num, str(e))
                continue
            for k, v in row.items():
                cols[k].append(v)
        if options.progress is not None:
            options.progress(path.stat().st_size)
        types = {f.name: f.type for f in JOB_SCHEMA}
        table = pa.table(
            {k: pa.array(v, type=TS if k.endswith("_time") else types[k]) for k, v in cols.items()}
        )
        source = options.source or NAME
        table = table.append_column("source", pa.array([source] * table.num_rows, pa.string()))
        notes = [
            f"times are seconds from the trace start, stored from {self.epoch.isoformat()} "
            "(the trace does not date its start).",
            "pod_phase Running (deleted while running) is stored as UNKNOWN: its GPU-hours count, "
            "but as neither success nor waste; Pending pods never started (start null).",
            "gpus = num_gpu x gpu_milli / 1000 (fractions are shared GPUs); no users or job names here.",
        ]
        if absent:
            notes.append(f"columns absent from this file (left null): {', '.join(absent)}")
        missing = list(MISSING_FIELDS)
        for col, field in (
            ("qos", "priority_class"),
            ("cpu_milli", "cpus"),
            ("memory_mib", "mem_mb"),
            ("creation_time", "submit_time"),
            ("scheduled_time", "start_time"),
            ("deletion_time", "end_time"),
        ):
            if col in absent:
                missing.append(field)
        if "num_gpu" in absent:
            missing.append("gpus")
        return ReadResult(
            table=conform(table),
            format=NAME,
            rows_read=rows_read,
            bad_rows=sink.rows,
            bad_row_count=sink.count,
            missing_fields=missing,
            notes=notes,
        )


def read_alibaba_nodes(path: str | Path) -> list[AlibabaNode]:
    """The cluster's nodes from an `openb_node_list_*.csv`; any bad row is fatal (a cluster must be whole)."""
    path = Path(path)
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [c.strip().lower() for c in next(reader)]
    except StopIteration:
        raise BadInputError(f"{path}: empty file") from None
    except csv.Error as e:
        raise BadInputError(f"{path}:1: unreadable CSV header ({e})") from e
    if _is_pod_header(header):
        raise BadInputError(
            f"{path}: this is a pod list (jobs), not a node list; ingest it with `headway ingest`"
        )
    lacking = [c for c in ("sn", "gpu") if c not in header]
    if lacking:
        raise BadInputError(
            f"{path}:1: not an Alibaba node list: no column {', '.join(lacking)} "
            f"(expected {', '.join(NODE_COLUMNS)})"
        )
    index = {c: i for i, c in enumerate(header)}
    nodes: list[AlibabaNode] = []
    seen: set[str] = set()
    try:
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            where = f"{path}:{reader.line_num}"
            if len(fields) != len(header):
                raise BadInputError(f"{where}: {len(fields)} fields, header has {len(header)}")

            def cell(c: str, fields: list[str] = fields) -> str:
                i = index.get(c)
                return "" if i is None else fields[i]

            try:
                name = cell("sn").strip()
                if not name:
                    raise _Bad("sn: empty")
                if name in seen:
                    raise _Bad(f"sn: node {name!r} listed twice")
                gpus = _int(cell("gpu"), "gpu", blank_ok=False) or 0
                cpu = _int(cell("cpu_milli"), "cpu_milli") or 0
                mem = _int(cell("memory_mib"), "memory_mib") or 0
            except _Bad as e:
                raise BadInputError(f"{where}: {e}") from None
            seen.add(name)
            nodes.append(AlibabaNode(name, gpus, cell("model").strip() or None, cpu, mem))
    except csv.Error as e:
        raise BadInputError(f"{path}:{reader.line_num}: unreadable CSV ({e})") from e
    if not nodes:
        raise BadInputError(f"{path}: no nodes in this node list")
    return nodes


READER = AlibabaReader()
