"""Reader for the Microsoft Philly job log (Jeon et al., USENIX ATC '19), plain or gzipped JSON.

Two shapes are accepted, both a JSON list with one object per job:
- the re-published subset (DRE `sampled_jobs.json`): `start_time`, `end_time` and `detail` at the top level,
  describing the job's last attempt;
- the original `cluster_job_log`: an `attempts` list, each with its own `start_time`, `end_time`, `detail`.
  Like the subset, headway keeps the last attempt (see docs/formats.md).
Times are naive US Pacific wall-clock times (the cluster's), converted to UTC with DST applied.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa

from headway.schema import JOB_SCHEMA, TS, State, conform
from headway.traces.base import BadInputError, BadRowSink, ReadOptions, ReadResult
from headway.traces.compressed import GZIP_MAGIC

NAME = "philly"
DEFAULT_TZ = "America/Los_Angeles"

STATE_OF: dict[str, State] = {
    "Pass": State.COMPLETED,
    "Failed": State.FAILED,
    "Killed": State.CANCELLED,
}

# The schema fields a Philly log never provides.
MISSING_FIELDS: list[str] = [
    "name",
    "partition",
    "priority_class",
    "cpus",
    "mem_mb",
    "time_limit",
    "exit_code",
]

# The schema columns a Philly record fills, in the order `_row` returns them.
_COLUMNS = ("job_id", "user", "group", "submit_time", "start_time", "end_time", "gpus", "nodes", "state")
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")
# A job object in the first bytes: `"jobid"` next to another Philly key is enough to tell it apart.
_SNIFF_KEYS = (b'"jobid"', b'"vc"', b'"submitted_time"')
_WS = re.compile(r"[ \t\r\n]*")


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def open_text(path: Path) -> str:
    """The file's text; gzip is recognised by its magic bytes, so a renamed .gz still reads."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise BadInputError(f"{path}: not a readable gzip file ({e})") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInputError(f"{path}: not UTF-8 text (byte {e.start}); is this a Philly JSON log?") from e


def _head_text(path: Path, head: bytes) -> bytes:
    if head[:2] != GZIP_MAGIC:
        return head
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(64 * 1024)
    except (OSError, EOFError, zlib.error):
        return b""


def _zone(options: ReadOptions) -> dt.tzinfo:
    name = options.tz or DEFAULT_TZ
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise BadInputError(f"unknown timezone {name!r} (use an IANA name such as {DEFAULT_TZ})") from e


class _Bad(Exception):
    """One record cannot be used; the message is the reason."""


def _time(obj: Mapping[str, Any], key: str, tz: dt.tzinfo) -> dt.datetime | None:
    """A naive local time string as UTC; `None`, "None", "" or an absent key mean unknown."""
    value = obj.get(key)
    if value is None or value in ("None", "", "null"):
        return None
    if not isinstance(value, str) or not _TIME_RE.fullmatch(value.strip()):
        raise _Bad(f"{key}: expected 'YYYY-MM-DD HH:MM:SS', got {value!r}")
    try:
        local = dt.datetime.fromisoformat(value.strip())
    except ValueError as e:
        raise _Bad(f"{key}: {e} ({value!r})") from e
    # fold=0: an ambiguous time in the autumn DST repeat is read as its first occurrence (daylight time).
    try:
        return local.replace(tzinfo=tz).astimezone(dt.UTC)
    except OverflowError:
        raise _Bad(f"{key}: out of range ({value!r})") from None


def _placement(detail: object) -> tuple[float | None, int]:
    """GPUs (total length of the `gpus` lists) and node count (detail entries, at least 1)."""
    if detail is None:
        return None, 1
    if not isinstance(detail, list):
        raise _Bad(f"detail: expected a list, got {type(detail).__name__}")
    gpus = 0
    for i, node in enumerate(detail):
        if not isinstance(node, dict):
            raise _Bad(f"detail[{i}]: expected an object, got {type(node).__name__}")
        g = node.get("gpus", [])
        if not isinstance(g, list):
            raise _Bad(f"detail[{i}].gpus: expected a list, got {type(g).__name__}")
        gpus += len(g)
    if not detail:
        return None, 1
    return float(gpus), len(detail)


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is None or v == "":
        return None
    if isinstance(v, str | int) and not isinstance(v, bool):
        return str(v)
    raise _Bad(f"{key}: expected a string, got {type(v).__name__}")


def _row(obj: object, tz: dt.tzinfo, unknown_status: dict[str, int]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _Bad(f"expected a job object, got {type(obj).__name__}")
    job_id = _opt_str(obj, "jobid")
    if job_id is None:
        raise _Bad("no jobid")
    status = obj.get("status")
    if not isinstance(status, str) or not status:
        raise _Bad(f"status: expected Pass, Failed or Killed, got {status!r}")
    state = STATE_OF.get(status)
    if state is None:
        state = State.UNKNOWN  # counted below, once the row is known to be stored
    run: Mapping[str, Any] = obj
    if "attempts" in obj:
        attempts = obj["attempts"]
        if attempts is None:
            attempts = []
        if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
            raise _Bad("attempts: expected a list of objects")
        run = attempts[-1] if attempts else {}
    gpus, nodes = _placement(run.get("detail"))
    start = _time(run, "start_time", tz)
    end = _time(run, "end_time", tz)
    if start is not None and end is not None and end < start:
        raise _Bad(f"end_time {run.get('end_time')} is before start_time {run.get('start_time')}")
    if state is State.UNKNOWN:
        unknown_status[status] = unknown_status.get(status, 0) + 1
    return {
        "job_id": job_id,
        "user": _opt_str(obj, "user"),
        "group": _opt_str(obj, "vc"),
        "submit_time": _time(obj, "submitted_time", tz),
        "start_time": start,
        "end_time": end,
        "gpus": gpus,
        "nodes": nodes,
        "state": state.value,
    }


def iter_records(
    text: str, path: Path, on_bad: Callable[[int, str], None], progress: Callable[[int], None] | None
) -> Iterator[tuple[int, object]]:
    """(record number, parsed value) for each element of the top-level JSON list, decoded lazily.

    Elements are decoded one at a time, so a truncated or corrupt file still yields every record before the
    damage; the damaged record is reported and the rest of the file cannot be resynchronised.
    """
    dec = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text.startswith("\ufeff", pos):
        pos += 1
    if not text.startswith("[", pos):
        raise BadInputError(f"{path}: not a Philly job log: expected a JSON list of jobs, starting with '['")
    pos += 1
    n = 0
    total = len(text)
    while True:
        pos = _skip_ws(text, pos)
        if text.startswith("]", pos):
            return
        n += 1
        try:
            value, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            where = "file ends inside it" if pos >= total or e.pos >= total else f"line {e.lineno}: {e.msg}"
            on_bad(n, f"invalid JSON ({where}); the rest of the file is skipped")
            return
        yield n, value
        if progress is not None and n % 2000 == 0:
            progress(pos)
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos += 1
        elif text.startswith("]", pos):
            return
        else:
            on_bad(n + 1, "invalid JSON (expected ',' or ']' between jobs); the rest of the file is skipped")
            return


class PhillyReader:
    name = NAME

    def sniff(self, path: Path, head: bytes) -> bool:
        text = _head_text(path, head).lstrip(b"\xef\xbb\xbf \t\r\n")
        if not text.startswith(b"["):
            return False
        return _SNIFF_KEYS[0] in text and any(k in text for k in _SNIFF_KEYS[1:])

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        tz = _zone(options)
        source = options.source or NAME
        text = open_text(path)
        sink = BadRowSink(options.strict)
        label = str(path)
        size = path.stat().st_size
        scale = size / max(len(text), 1)

        unparsed = 0

        def on_bad(n: int, reason: str) -> None:
            nonlocal unparsed
            unparsed += 1
            sink.add(label, n, reason)

        def progress(pos: int) -> None:
            if options.progress is not None:
                options.progress(int(pos * scale))

        records = iter_records(text, path, on_bad, progress if options.progress else None)
        cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        parsed = 0
        unknown_status: dict[str, int] = {}
        attempts_shape = False
        for n, obj in records:
            parsed += 1
            try:
                row = _row(obj, tz, unknown_status)
            except _Bad as e:
                sink.add(label, n, str(e))
                continue
            attempts_shape = attempts_shape or (isinstance(obj, dict) and "attempts" in obj)
            for k, v in row.items():
                cols[k].append(v)
        if options.progress is not None:
            options.progress(size)
        types = {f.name: f.type for f in JOB_SCHEMA}
        arrays = {k: pa.array(v, type=TS if k.endswith("_time") else types[k]) for k, v in cols.items()}
        table = pa.table(arrays)
        table = table.append_column("source", pa.array([source] * table.num_rows, pa.string()))
        notes = [
            "Philly has no job names: name is null, so repeats are recognised by user + virtual cluster.",
            f"times read as {options.tz or DEFAULT_TZ} local time and stored in UTC.",
            "start/end are those of the job's last attempt.",
        ]
        if attempts_shape:
            notes.append("original cluster_job_log shape: earlier attempts are not counted in GPU-hours.")
        for status, count in sorted(unknown_status.items()):
            notes.append(f"{count:,} jobs with unknown status {status!r} stored as UNKNOWN.")
        return ReadResult(
            table=conform(table),
            format=NAME,
            rows_read=parsed + unparsed,
            bad_rows=sink.rows,
            bad_row_count=sink.count,
            missing_fields=list(MISSING_FIELDS),
            notes=notes,
        )


READER = PhillyReader()
