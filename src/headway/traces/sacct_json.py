"""Slurm `sacct --json` output (read by the `sacct` format when the file is JSON).

Two shapes of the same document, `{"meta": ..., "jobs": [...]}`, are read:
- Slurm 22.05 (data_parser v0.0.38): times, limits and exit codes are plain numbers, `state.current` a string;
- Slurm 23.02 and later (v0.0.39+): numbers are `{"set", "infinite", "number"}` objects and `state.current`
  a list of flags.
Times are epoch seconds, so no time zone is needed. Job steps live inside each job and are not read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from headway.schema import JOB_SCHEMA, MAX_GPUS, TS, State, conform
from headway.traces.base import (
    SELDOM_FIELDS,
    STORED_NULL,
    BadInputError,
    BadRowSink,
    ReadOptions,
    ReadResult,
    split_reason,
)

# The schema columns a record fills: every one but `source` and the preemption fields, which sacct does not
# report (a job's QOS, its priority class here, is what makes it preemptable on Slurm: slurm.conf's, not
# the job's).
_COLUMNS = tuple(n for n in JOB_SCHEMA.names if n != "source" and n not in SELDOM_FIELDS)
_NO_LIMIT = 4294967294  # Slurm's INFINITE / NO_VAL for 32-bit fields (and above)


class _Bad(Exception):
    pass


def looks_like_sacct_json(head: bytes) -> bool:
    """The first bytes of `sacct --json`: a `jobs` list whose jobs have sacct's `time` and `state`
    objects (`squeue --json` has `job_state` and `submit_time` instead; `read_sacct_json` names it)."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not (text.startswith(b"{") and b'"jobs"' in text):
        return False
    return b'"job_state"' in text or (b'"job_id"' in text and b'"submission"' in text)


def unwrap(v: object) -> object:
    """Slurm 23.02+ wraps numbers as `{"set", "infinite", "number"}`: the number, or None when unset or
    infinite; anything else as it is (22.05's plain numbers). `squeue --json` is read with it too."""
    if isinstance(v, dict):
        if v.get("infinite") or v.get("set") is False:
            return None
        return v.get("number")
    return v


def _number(v: object, what: str) -> float | None:
    """A plain or wrapped number (`unwrap`); None when unset or infinite."""
    v = unwrap(v)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _Bad(f"{what}: expected a number, got {type(v).__name__}")
    n = float(v)
    if not math.isfinite(n):  # Python's json reads NaN and Infinity, and 1e999 as inf
        raise _Bad(f"{what}: {v} is not a finite number")
    return n


def _epoch(v: object, what: str) -> dt.datetime | None:
    n = _number(v, what)
    # 0: not yet (a pending job's start, a running job's end); NO_VAL / INFINITE, 32- or 64-bit: unset
    if n is None or n <= 0 or n in (_NO_LIMIT, _NO_LIMIT + 1) or n >= 2.0**63:
        return None
    if n > _NO_LIMIT:
        raise _Bad(f"{what}: {n:.0f} is not a time in epoch seconds (milliseconds?)")
    try:
        return dt.datetime.fromtimestamp(n, dt.UTC)
    except (OverflowError, OSError, ValueError):
        raise _Bad(f"{what}: {n} is not a time") from None


def _text(obj: Mapping[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, dict):  # e.g. 23.02's {"name": ...} wrappers
        v = v.get("name")
        if v is None:
            return None
    if isinstance(v, str | int) and not isinstance(v, bool):
        s = str(v).strip()
        return s or None
    raise _Bad(f"{key}: expected a string, got {type(v).__name__}")


def _first_flag(v: object, what: str) -> str | None:
    """`state.current` / `exit_code.status`: a string (22.05) or a list of flags (23.02+)."""
    if isinstance(v, list):
        v = v[0] if v else None
    if v is None:
        return None
    if not isinstance(v, str):
        raise _Bad(f"{what}: expected a string, got {type(v).__name__}")
    return v.strip().upper() or None


def _tres(job: Mapping[str, Any], kind: str) -> list[Mapping[str, Any]]:
    tres = job.get("tres")
    if tres is None:
        return []
    if not isinstance(tres, dict):
        raise _Bad("tres: expected an object")
    items = tres.get(kind) or []
    if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
        raise _Bad(f"tres.{kind}: expected a list of objects")
    return items


def _tres_count(items: list[Mapping[str, Any]], type_: str) -> float | None:
    for t in items:
        if t.get("type") == type_ and t.get("name") in (None, ""):
            return _number(t.get("count"), f"tres {type_} count")
    return None


def _gpus(items: list[Mapping[str, Any]]) -> float | None:
    """GPUs in one TRES list: the untyped `gres/gpu` count wins over the typed `gpu:a100` ones (Slurm lists
    both); None when the list names no GPU at all."""
    untyped: float | None = None
    typed = 0.0
    any_typed = False
    for t in items:
        if t.get("type") != "gres":
            continue
        name = t.get("name")
        if not isinstance(name, str):
            continue
        count = _number(t.get("count"), f"tres gres/{name} count") or 0.0
        if name == "gpu":
            untyped = count
        elif name.startswith("gpu:"):
            typed += count
            any_typed = True
    if untyped is not None:
        return untyped
    return typed if any_typed else None


def _job_id(job: Mapping[str, Any]) -> str:
    """`123`, an array task `123_4` or a heterogeneous component `123+1`, as `sacct -P` prints them."""
    jid = _number(job.get("job_id"), "job_id")
    if jid is None:
        raise _Bad("no job_id")
    if jid != int(jid) or jid < 0:
        raise _Bad(f"job_id: {jid:g} is not a job id")
    for part, key, sep in (("array", "task_id", "_"), ("het", "job_offset", "+")):
        obj = job.get(part)
        if isinstance(obj, dict):
            parent = _number(obj.get("job_id"), f"{part}.job_id")
            index = _number(obj.get(key), f"{part}.{key}")
            if parent and index is not None:
                return f"{int(parent)}{sep}{int(index)}"
            if part == "array" and parent and (tasks := _task_list(obj)) is not None:
                return f"{int(parent)}_[{tasks}]"  # tasks that never started, as one record
    return str(int(jid))


def _task_list(array: Mapping[str, Any]) -> str | None:
    """The task list of an array's record for its tasks that never started, as `sacct -P` prints it
    (`3,7`, `1-3%1`). Slurm 22.05's JSON gives the tasks as a hex bitmap (`0x88`), and the throttle
    (`%1`) under limits.max.running.tasks; a later text form is kept as it is."""
    task = unwrap(array.get("task"))
    if not isinstance(task, str) or not task.strip():
        return None
    task = task.strip()
    if task.lower().startswith("0x"):
        try:
            bits = int(task, 16)
        except ValueError:
            return None
        ids = [i for i in range(bits.bit_length()) if bits >> i & 1]
        if not ids:
            return None
        runs: list[str] = []
        lo = prev = ids[0]
        for i in [*ids[1:], -1]:
            if i == prev + 1:
                prev = i
                continue
            runs.append(str(lo) if lo == prev else f"{lo}-{prev}")
            lo = prev = i
        task = ",".join(runs)
    limits = array.get("limits")
    throttle = None
    with contextlib.suppress(AttributeError, TypeError):
        throttle = unwrap(limits["max"]["running"]["tasks"])  # type: ignore[index]
    if isinstance(throttle, int) and not isinstance(throttle, bool) and throttle > 0 and "%" not in task:
        task += f"%{throttle}"
    return task


def _optional(read: Callable[[], Any], soft: list[str]) -> Any:
    """A value the job record can do without: None (noted in `soft`) when it cannot be read, so the job
    is kept rather than skipped."""
    try:
        return read()
    except _Bad as e:
        soft.append(str(e))
        return None


def _row(
    job: object, state_map: Mapping[str, State], unknown: dict[str, int], soft: list[str]
) -> dict[str, Any]:
    if not isinstance(job, dict):
        raise _Bad(f"expected a job object, got {type(job).__name__}")
    state_obj = job.get("state")
    raw_state = _first_flag(state_obj.get("current") if isinstance(state_obj, dict) else state_obj, "state")
    if raw_state is None:
        raise _Bad("state: empty")
    state = state_map.get(raw_state.split()[0])
    if state is None:
        state = State.UNKNOWN  # counted below, once the row is known to be stored
    time = job.get("time") or {}
    if not isinstance(time, dict):
        raise _Bad("time: expected an object")
    assoc = job.get("association")
    assoc = assoc if isinstance(assoc, dict) else {}
    alloc, req = _tres(job, "allocated"), _tres(job, "requested")
    gpus = _gpus(alloc)
    if gpus is None:
        gpus = _gpus(req)
    if gpus is not None and gpus < 0:
        raise _Bad(f"gpus: negative ({gpus:g})")
    if gpus is not None and gpus > MAX_GPUS:
        raise _Bad(f"gpus: over {MAX_GPUS:,} ({gpus:g})")
    nodes = _optional(lambda: _number(job.get("allocation_nodes"), "allocation_nodes"), soft)
    nodes = nodes or _tres_count(alloc, "node")
    nodes = nodes or _tres_count(req, "node")
    cpus = _tres_count(alloc, "cpu") or _tres_count(req, "cpu")
    mem = _tres_count(req, "mem") or _tres_count(alloc, "mem")
    limit = _optional(lambda: _number(time.get("limit"), "time.limit"), soft)
    exit_obj = job.get("exit_code")
    code = None
    if isinstance(exit_obj, dict):
        code = _optional(lambda: _number(exit_obj.get("return_code"), "exit_code.return_code"), soft)
    start = _optional(lambda: _epoch(time.get("start"), "time.start"), soft)
    end = _optional(lambda: _epoch(time.get("end"), "time.end"), soft)
    if start is not None and end is not None and end < start:
        raise _Bad(f"time.end {end:%Y-%m-%dT%H:%M:%S} is before time.start {start:%Y-%m-%dT%H:%M:%S}")
    job_id = _job_id(job)
    if state is State.UNKNOWN:
        unknown[raw_state] = unknown.get(raw_state, 0) + 1
    return {
        "job_id": job_id,
        "user": _text(job, "user") or _text(assoc, "user"),
        "group": _text(job, "account") or _text(assoc, "account"),
        "name": _text(job, "name"),
        "partition": _text(job, "partition"),
        "priority_class": _text(job, "qos"),
        "submit_time": _epoch(time.get("submission"), "time.submission"),
        "start_time": start,
        "end_time": end,
        "gpus": gpus or 0.0,  # a job whose TRES name no GPU asked for none
        "nodes": int(nodes) if nodes and nodes < 2**31 else None,
        "cpus": int(cpus) if cpus and cpus > 0 else None,
        "mem_mb": int(mem) if mem and mem > 0 else None,
        "time_limit": int(limit * 60) if limit is not None and 0 < limit < _NO_LIMIT else None,
        "state": state.value,
        "exit_code": int(code) if code is not None and abs(code) < 2**31 else None,
        "_unix_group": _text(job, "group"),
    }


def _slurm_release(doc: Mapping[str, Any]) -> str | None:
    meta = doc.get("meta")
    slurm = (meta.get("Slurm") or meta.get("slurm")) if isinstance(meta, dict) else None
    if isinstance(slurm, dict):
        rel = slurm.get("release")
        if isinstance(rel, str):
            return rel
    return None


def read_sacct_json(
    path: Path, options: ReadOptions, state_map: Mapping[str, State], name: str
) -> ReadResult:
    """The jobs of one `sacct --json` document, in the job schema."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInputError(f"{path}: cannot read: {e.strerror}") from e
    try:
        doc = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise BadInputError(f"{path}: not sacct --json output: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"{path}: not sacct --json output: invalid JSON at line {e.lineno} ({e.msg})"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise BadInputError(f"{path}: not sacct --json output: no `jobs` list")
    first = next((j for j in doc["jobs"] if isinstance(j, dict)), {})
    if "job_state" in first and "time" not in first:
        raise BadInputError(
            f"{path}: this is `squeue --json` output (the queue as it is now), not accounting: ingest reads "
            "ended jobs from `sacct -a -X --json` or `sacct -a -X -P -o ...` (docs/sacct.md)"
        )
    sink = BadRowSink(options.strict)
    label = str(path)
    cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    unknown: dict[str, int] = {}
    no_user = with_unix_group = 0
    jobs = doc["jobs"]
    for n, job in enumerate(jobs, start=1):
        soft: list[str] = []
        try:
            row = _row(job, state_map, unknown, soft)
        except _Bad as e:
            sink.add(label, n, "; ".join([str(e), *soft]))
            continue
        for reason in soft:
            column, why = split_reason(reason)
            sink.problem(column, why, STORED_NULL, 1, [(label, n, None)])
        if row["user"] is None:
            no_user += 1
            with_unix_group += row["_unix_group"] is not None
        for k in _COLUMNS:
            cols[k].append(row[k])
        if options.progress is not None and n % 5000 == 0:
            options.progress(int(len(raw) * n / len(jobs)))
    if options.progress is not None:
        options.progress(len(raw))
    release = _slurm_release(doc)
    bad_codes = bool(release and release.startswith("22.05"))
    if bad_codes:  # its exit codes are 0 for jobs that exited 1 or 2: unknown, not 0
        done = State.COMPLETED.value
        pairs = zip(cols["exit_code"], cols["state"], strict=True)
        cols["exit_code"] = [c if s == done else None for c, s in pairs]
    types = {f.name: f.type for f in JOB_SCHEMA}
    arrays = {k: pa.array(v, type=TS if k.endswith("_time") else types[k]) for k, v in cols.items()}
    table = pa.table(arrays)
    table = table.append_column("source", pa.array([options.source or name] * table.num_rows, pa.string()))
    notes = [
        f"read as sacct --json{f' of Slurm {release}' if release else ''}; times are epoch seconds (UTC)."
    ]
    if no_user:
        hint = " (its `group` field holds the Unix group, not stored as the user)" if with_unix_group else ""
        notes.append(
            f"{no_user:,} jobs have no user in the JSON{hint}: Slurm 22.05's sacct --json leaves `user` null "
            "for jobs without an association; `sacct -a -X -P -o ...` (docs/sacct.md) names them."
        )
    if bad_codes:
        notes.append(
            "Slurm 22.05's sacct --json reports exit code 0 for jobs that failed: their exit codes are "
            "stored as unknown (states are right; `sacct -P` has both)."
        )
    for state, count in sorted(unknown.items()):
        notes.append(f"{count:,} jobs with unknown state {state!r} stored as UNKNOWN.")
    missing = [c for c in ("user", "group") if table.num_rows and table[c].null_count == table.num_rows]
    return ReadResult(
        table=conform(table),
        format=name,
        rows_read=len(jobs),
        bad_rows=sink.rows,
        bad_row_count=sink.count,
        missing_fields=missing,
        notes=notes,
        problems=sink.problems,
    )
