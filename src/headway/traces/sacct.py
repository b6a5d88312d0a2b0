"""Slurm `sacct -a -X -P -o ...` output (pipe-separated, header line first), `sacct --json` output
(headway.traces.sacct_json), and running sacct itself.

Columns are found by the header, in any order and any case; see docs/sacct.md for the fields to ask for.
Naive times are in the machine's local time zone (where sacct ran) unless `--tz` says otherwise; where
headway runs sacct itself (`ingest --from-slurm`, `slurm sync`) it runs it with TZ=UTC and reads UTC, so
no zone is guessed and no hour repeats.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import State
from headway.traces import tabular as tb
from headway.traces.base import BadInputError, ReadOptions, ReadResult
from headway.traces.sacct_json import looks_like_sacct_json, read_sacct_json

# The fields `headway ingest --from-slurm` asks for, and docs/sacct.md recommends.
SACCT_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobName",
    "User",
    "Account",
    "Partition",
    "QOS",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "TimelimitRaw",
    "AllocTRES",
    "ReqTRES",
    "NNodes",
    "AllocCPUS",
    "ReqMem",
)

TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")

# The field separator headway asks its own sacct runs for (`--delimiter`): ASCII's unit separator, which
# no job name, account or comment holds. sacct -P does not escape "|", so a job named `x|y` (or an account
# `a|b`) gives its row a field too many: such a row in a `|` file is a bad row, named as one, since which
# column holds the extra "|" cannot be told (joining it into JobName put `-A 'x|carol'` under user x).
SACCT_DELIMITER = "\x1f"

# The environment headway runs sacct with: its times (printed, and -S) in UTC, read back as "UTC".
SACCT_ENV = {"TZ": "UTC"}
SACCT_TZ = "UTC"

# sacct's long state names (first word of the State column) and squeue-style short codes.
STATE_MAP: dict[str, State] = {
    "COMPLETED": State.COMPLETED,
    "CD": State.COMPLETED,
    "FAILED": State.FAILED,
    "F": State.FAILED,
    "SPECIAL_EXIT": State.FAILED,
    "SE": State.FAILED,
    "TIMEOUT": State.TIMEOUT,
    "TO": State.TIMEOUT,
    "DEADLINE": State.TIMEOUT,
    "DL": State.TIMEOUT,
    "CANCELLED": State.CANCELLED,
    "CANCELLED+": State.CANCELLED,
    "CA": State.CANCELLED,
    "REVOKED": State.CANCELLED,
    "RV": State.CANCELLED,
    "OUT_OF_MEMORY": State.OUT_OF_MEMORY,
    "OUT_OF_ME+": State.OUT_OF_MEMORY,
    "OOM": State.OUT_OF_MEMORY,
    "NODE_FAIL": State.NODE_FAIL,
    "NF": State.NODE_FAIL,
    "BOOT_FAIL": State.NODE_FAIL,
    "BF": State.NODE_FAIL,
    "PREEMPTED": State.PREEMPTED,
    "PR": State.PREEMPTED,
    "RUNNING": State.RUNNING,
    "R": State.RUNNING,
    "COMPLETING": State.RUNNING,
    "CG": State.RUNNING,
    "SUSPENDED": State.RUNNING,
    "S": State.RUNNING,
    "STOPPED": State.RUNNING,
    "ST": State.RUNNING,
    "RESIZING": State.RUNNING,
    "SIGNALING": State.RUNNING,
    "STAGE_OUT": State.RUNNING,
    "PENDING": State.PENDING,
    "PD": State.PENDING,
    "REQUEUED": State.PENDING,
    "RQ": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "REQUEUE_HOLD": State.PENDING,
}


def _requeued_runs(
    job_id: pa.Array, words: pa.Array, start: pa.Array | None, skip: npt.NDArray[np.bool_]
) -> tuple[pa.Array, pa.Array] | None:
    """`sacct -D` lists each run of a requeued job: the earlier ones as REQUEUED lines with their own start,
    end and GPUs, then the job's current record (absent while it waits again). Under one id only the last
    line survived and the runs' GPU-hours were lost. Each REQUEUED line becomes `ID@START` (its start in
    UTC, `100@20261130T100000Z`): a name that stays the same whichever window of sacct lists it, so an
    incremental read replaces a run instead of renumbering it. (new ids, which rows), or None."""
    hit = pc.fill_null(pc.equal(words, "REQUEUED"), False)
    if not pc.any(hit).as_py():  # the usual case, without a pass over a million strings in Python
        return None
    mask = np.asarray(hit.to_numpy(zero_copy_only=False), dtype=bool) & ~skip
    if not mask.any():
        return None
    ids = np.asarray(job_id.to_pylist(), dtype=object)
    starts = start.to_pylist() if start is not None else [None] * len(ids)
    seen: dict[object, int] = {}
    for i in np.flatnonzero(mask).tolist():
        t = starts[i]
        if t is not None:
            ids[i] = f"{ids[i]}@{t.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}"
        else:  # a run without a start (never seen): its place among the file's runs of this job
            k = seen[ids[i]] = seen.get(ids[i], 0) + 1
            ids[i] = f"{ids[i]}@{k}"
    return pa.array(ids.tolist(), pa.string()), pa.array(mask)


def _settle_repeated_hour(
    f: tb.Frame, raw: tb.RawColumns, tz: str, start: pa.Array, end: pa.Array, elapsed: pa.Array
) -> tuple[pa.Array, pa.Array]:
    """Start and End in the hour that repeats when clocks go back could be either occurrence: sacct's
    local times do not say, its Elapsed does. Each job keeps the first reading (both earliest) unless
    another one matches Elapsed to the second and it does not (before, a 20-minute job that ended in
    the repeated hour ended "before it started" and was skipped, and a 2-hour one lost an hour)."""

    def us(a: pa.Array) -> npt.NDArray[np.float64]:
        return np.asarray(a.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.float64)

    s0, e0 = us(start), us(end)
    want = np.asarray(elapsed.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64) * 1e6
    off = np.abs(e0 - s0 - want)
    if not (off >= 1e6).any():  # NaN (no end yet) compares false: every job agrees with its Elapsed
        return start, end
    late_s = f.timestamp(raw.get("Start"), "Start", TIME_FORMATS, tz, ambiguous="latest", check=False)
    late_e = f.timestamp(raw.get("End"), "End", TIME_FORMATS, tz, ambiguous="latest", check=False)
    s1, e1 = us(late_s), us(late_e)
    out_s, out_e = s0.copy(), e0.copy()
    settled = ~(off >= 1e6)
    for cs, ce in ((s0, e1), (s1, e1), (s1, e0)):
        hit = ~settled & (np.abs(ce - cs - want) < 1e6)
        out_s[hit], out_e[hit] = cs[hit], ce[hit]
        settled |= hit

    def ts(x: npt.NDArray[np.float64]) -> pa.Array:
        return pa.array(x, pa.float64(), from_pandas=True).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))

    return ts(out_s), ts(out_e)


MAX_MEM_MB = 1e12  # an exabyte: no job's memory is more (a bigger figure is a broken row)


class SacctReader:
    name = "sacct"

    def sniff(self, path: Path, head: bytes) -> bool:
        if looks_like_sacct_json(head):
            return True
        fields = tb.head_fields(head, _delimiter(head))
        return len(fields) >= 2 and ("jobid" in fields or "jobidraw" in fields)

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError as e:
            raise BadInputError(f"{path}: cannot read: {e.strerror}") from e
        if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
            return read_sacct_json(path, options, STATE_MAP, self.name)
        tz = tb.check_tz(options.tz) if options.tz else tb.local_tz_name()
        raw = tb.read_delimited(path, _delimiter(head), quoting=False, progress=options.progress)
        job_id_raw = raw.get("JobID", "JobIDRaw")
        state_raw = raw.get("State")
        if job_id_raw is None or state_raw is None:
            lacking = "JobID" if job_id_raw is None else "State"
            raise BadInputError(
                f"{path}: not sacct -P output: the header has no {lacking} column "
                f"(found {', '.join(raw.header[:8]) or 'nothing'})"
            )
        f = tb.Frame(raw, trim=False)  # sacct -P never pads its fields
        provided: set[str] = {"job_id", "state"}
        job_id = f.text(job_id_raw)
        f.skip = pc.fill_null(tb.is_step_id(job_id), False).to_numpy(zero_copy_only=False).copy()
        steps = int(f.skip.sum())
        f.flag(pc.is_null(job_id), "JobID: empty")

        words = tb.first_word_upper(f.text(state_raw))
        f.flag(pc.is_null(words), "State: empty")
        state = f.states(words, STATE_MAP, "State")
        cols: dict[str, pa.Array] = {"job_id": job_id, "state": state}

        for field_name, names in (
            ("name", ("JobName",)),
            ("user", ("User",)),
            ("group", ("Account",)),
            ("partition", ("Partition",)),
            ("priority_class", ("QOS",)),
        ):
            v = raw.get(*names)
            if v is not None:
                cols[field_name] = f.text(v)
                provided.add(field_name)

        for field_name, col in (("submit_time", "Submit"), ("start_time", "Start"), ("end_time", "End")):
            v = raw.get(col)
            if v is not None:
                cols[field_name] = f.timestamp(v, col, TIME_FORMATS, tz, required=col == "Submit")
                provided.add(field_name)

        elapsed = self._elapsed(f, raw)
        if elapsed is not None and tz != "UTC" and "start_time" in cols and "end_time" in cols:
            cols["start_time"], cols["end_time"] = _settle_repeated_hour(
                f, raw, tz, cols["start_time"], cols["end_time"], elapsed
            )
        if "end_time" not in cols and "start_time" in cols and elapsed is not None:
            # No End column: a job that ended did so Elapsed after it started.
            ended = pc.is_in(state, value_set=pa.array([s.value for s in _ENDED]))
            end_us = pc.add(cols["start_time"].cast(pa.int64()), pc.multiply(elapsed, 1_000_000))
            cols["end_time"] = pc.if_else(ended, end_us, pa.scalar(None, pa.int64())).cast(
                pa.timestamp("us", tz="UTC")
            )
            provided.add("end_time")

        limit = self._time_limit(f, raw)
        if limit is not None:
            cols["time_limit"] = limit
            provided.add("time_limit")

        exit_raw = raw.get("ExitCode")
        if exit_raw is not None:
            cols["exit_code"] = self._exit_code(f, exit_raw)
            provided.add("exit_code")

        alloc = raw.get("AllocTRES")
        req = raw.get("ReqTRES")
        alloc_kv = tb.explode_pairs(f.text(alloc)) if alloc is not None else None
        req_kv = tb.explode_pairs(f.text(req)) if req is not None else None
        if alloc_kv is not None or req_kv is not None:
            cols["gpus"] = self._gpus(f.n, alloc_kv, req_kv)
            for kv, name, values in ((alloc_kv, "AllocTRES", alloc), (req_kv, "ReqTRES", req)):
                if kv is not None:  # a GPU job must not turn into a CPU job on an unreadable count
                    f.flag(kv.unreadable("gres/gpu"), f"{name}: a gres/gpu count is not a number", values)
            provided.add("gpus")

        nodes = self._first_positive(
            f,
            [("NNodes", raw.get("NNodes", "AllocNodes")), ("ReqNodes", raw.get("ReqNodes"))],
            [alloc_kv, req_kv],
            "node",
        )
        if nodes is not None:
            cols["nodes"] = nodes
            provided.add("nodes")
        cpus = self._first_positive(
            f,
            [("AllocCPUS", raw.get("AllocCPUS", "NCPUS")), ("ReqCPUS", raw.get("ReqCPUS"))],
            [alloc_kv, req_kv],
            "cpu",
        )
        if cpus is not None:
            cols["cpus"] = cpus
            provided.add("cpus")
        mem = self._mem(f, raw.get("ReqMem"), cpus, nodes, req_kv, alloc_kv)
        if mem is not None:
            cols["mem_mb"] = mem
            provided.add("mem_mb")

        runs = _requeued_runs(cols["job_id"], words, cols.get("start_time"), f.skip)
        if runs is not None:
            renamed, mask = runs
            cols["job_id"] = renamed
            cols["state"] = pc.if_else(mask, State.PREEMPTED.value, cols["state"])
        table, sink = f.finish(cols, options, self.name)
        notes = []
        if runs is not None:
            k = int(pc.sum(runs[1]).as_py() or 0)
            notes.append(
                f"{k:,} requeued runs (`sacct -D`) kept as jobs of their own, ID@START in state PREEMPTED, "
                "so that their GPU-hours count; the job's last record keeps its id"
            )
        if steps:
            notes.append(f"skipped {steps} job-step lines (N.batch, N.0, ...); use `sacct -X` to omit them")
        return tb.result(table, self.name, f, sink, provided, notes)

    @staticmethod
    def _elapsed(f: tb.Frame, raw: tb.RawColumns) -> pa.Array | None:
        v = raw.get("ElapsedRaw")
        if v is not None:
            return f.integer(v, "ElapsedRaw")
        v = raw.get("Elapsed")
        return tb.duration_seconds(f, v, "Elapsed") if v is not None else None

    @staticmethod
    def _time_limit(f: tb.Frame, raw: tb.RawColumns) -> pa.Array | None:
        v = raw.get("TimelimitRaw")
        if v is not None:
            minutes = f.integer(v, "TimelimitRaw", nulls=(*tb.NULL_WORDS, "UNLIMITED", "Partition_Limit"))
            return pc.multiply(minutes, 60)
        v = raw.get("Timelimit")
        return tb.duration_seconds(f, v, "Timelimit") if v is not None else None

    @staticmethod
    def _exit_code(f: tb.Frame, values: pa.Array) -> pa.Array:
        """ExitCode `CODE:SIGNAL` -> CODE; jobs killed by a signal are counted in a note."""
        s = f.text(values)
        enc = pc.dictionary_encode(s)
        parts = pc.extract_regex(enc.dictionary, r"^(?P<code>[0-9]{1,9})(?::(?P<sig>[0-9]{1,9}))?$")
        bad_d = pc.and_(pc.is_valid(enc.dictionary), pc.is_null(parts))
        f.soft(pc.take(bad_d, enc.indices), "ExitCode: expected CODE:SIGNAL", values)
        code = pc.take(pc.struct_field(parts, "code").cast(pa.int32()), enc.indices)
        sig = pc.struct_field(parts, "sig")
        sig_d = pc.fill_null(pc.and_(pc.not_equal(sig, ""), pc.not_equal(sig, "0")), False)
        signalled = pc.fill_null(pc.take(sig_d, enc.indices), False).to_numpy(zero_copy_only=False)
        n_sig = int((signalled & ~f.skip).sum())
        if n_sig:
            f.notes.append(
                f"{n_sig} jobs ended by a signal (ExitCode CODE:SIGNAL with SIGNAL > 0); exit_code keeps CODE"
            )
        return code

    @staticmethod
    def _gpus(n: int, alloc: tb.KeyValues | None, req: tb.KeyValues | None) -> pa.Array:
        """GPUs from AllocTRES, else ReqTRES (pending jobs); untyped gres/gpu wins over typed ones."""

        def count(kv: tb.KeyValues) -> tuple[np.ndarray, np.ndarray]:
            untyped, has_untyped = tb.sum_where(kv, pc.equal(kv.key, "gres/gpu"))
            typed, has_typed = tb.sum_where(kv, pc.starts_with(kv.key, "gres/gpu:"))
            return np.where(has_untyped, untyped, typed), has_untyped | has_typed

        gpus = np.zeros(n, dtype=np.float64)
        found = np.zeros(n, dtype=bool)
        for kv in (alloc, req):
            if kv is None:
                continue
            g, hit = count(kv)
            take = hit & ~found
            gpus[take] = g[take]
            found |= hit
        # A TRES string without any GPU means the job asked for none: 0, not unknown.
        return pa.array(gpus, pa.float64())

    @staticmethod
    def _first_positive(
        f: tb.Frame,
        columns: list[tuple[str, pa.Array | None]],
        tres: list[tb.KeyValues | None],
        key: str,
    ) -> pa.Array | None:
        """The first positive value among sacct columns, then AllocTRES/ReqTRES `key=`; None if no source."""
        out = np.zeros(f.n, dtype=np.float64)
        found = np.zeros(f.n, dtype=bool)
        any_source = False
        for label, v in columns:
            if v is None:
                continue
            any_source = True
            vals = f.integer(v, label)
            arr = pc.fill_null(vals, 0).to_numpy(zero_copy_only=False)
            take = (arr > 0) & ~found
            out[take] = arr[take]
            found |= arr > 0
        for kv in tres:
            if kv is None:
                continue
            any_source = True
            vals, hit = tb.sum_where(kv, pc.equal(kv.key, key))
            take = hit & (vals > 0) & ~found
            out[take] = vals[take]
            found |= take
        if not any_source:
            return None
        return tb.masked(out, found, pa.int64())

    @staticmethod
    def _mem(
        f: tb.Frame,
        req_mem: pa.Array | None,
        cpus: pa.Array | None,
        nodes: pa.Array | None,
        req_kv: tb.KeyValues | None,
        alloc_kv: tb.KeyValues | None,
    ) -> pa.Array | None:
        """Memory in MB: ReqMem (`62.50G`; old `4000Mc` per CPU, `4000Mn` per node), else TRES mem."""
        out = np.zeros(f.n, dtype=np.float64)
        found = np.zeros(f.n, dtype=bool)
        any_source = False
        if req_mem is not None:
            any_source = True
            enc = pc.dictionary_encode(f.text(req_mem))
            d = enc.dictionary
            parts = pc.extract_regex(d, r"^(?P<v>[0-9]+(?:\.[0-9]+)?)(?P<u>[KMGTP]?)(?P<per>[cn]?)$")
            bad_d = pc.and_(pc.is_valid(d), pc.is_null(parts))
            f.soft(pc.take(bad_d, enc.indices), "ReqMem: expected a size like 4000M", req_mem)
            mb_d = pc.multiply(
                pc.struct_field(parts, "v").cast(pa.float64()), tb.unit_scale(pc.struct_field(parts, "u"))
            )
            mb = pc.fill_null(pc.take(mb_d, enc.indices), 0.0).to_numpy(zero_copy_only=False)
            per = pc.fill_null(pc.take(pc.struct_field(parts, "per"), enc.indices), "").to_numpy(
                zero_copy_only=False
            )
            if cpus is not None:
                c = pc.fill_null(cpus, 0).to_numpy(zero_copy_only=False).astype(np.float64)
                mb = np.where(per == "c", mb * c, mb)
            if nodes is not None:
                nn = pc.fill_null(nodes, 0).to_numpy(zero_copy_only=False).astype(np.float64)
                mb = np.where(per == "n", mb * nn, mb)
            ok = mb > 0
            out[ok] = mb[ok]
            found |= ok
        for kv in (req_kv, alloc_kv):
            if kv is None:
                continue
            any_source = True
            vals, hit = tb.sum_where(kv, pc.equal(kv.key, "mem"))
            take = hit & (vals > 0) & ~found
            out[take] = vals[take]
            found |= take
        if not any_source:
            return None
        # past int64 it could not even be stored (MAX_MEM_MB)
        huge = found & (out > MAX_MEM_MB)
        f.soft(huge, f"memory: over {MAX_MEM_MB:,.0f} MB", req_mem)
        return tb.masked(np.round(out), found & ~huge, pa.int64())


_ENDED = (
    State.COMPLETED,
    State.FAILED,
    State.TIMEOUT,
    State.CANCELLED,
    State.OUT_OF_MEMORY,
    State.NODE_FAIL,
    State.PREEMPTED,
)

READER = SacctReader()


# ---------------------------------------------------------------------------------------------- from Slurm

_SINCE_RE = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(since: str, now: dt.datetime | None = None) -> dt.datetime:
    """`30d`, `12h`, `90m`, `2w` before `now`, or an ISO date/time; a naive result is local time."""
    now = now or dt.datetime.now()
    m = _SINCE_RE.match(since)
    if m:
        return now - dt.timedelta(seconds=int(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()])
    try:
        return dt.datetime.fromisoformat(since.strip())
    except ValueError:
        raise BadInputError(
            f"--since {since!r}: expected a span like 30d, 12h, 90m, 2w or a date like 2026-01-01"
        ) from None


def sacct_command(start: dt.datetime, sacct: str = "sacct") -> list[str]:
    """The argv `fetch_from_slurm` runs (all users, allocations only, parsable, requeued runs, our fields);
    `-S` is in UTC, for a sacct run with SACCT_ENV (a naive `start` is local time)."""
    return [
        sacct,
        "-a",
        "-X",
        "-P",
        f"--delimiter={SACCT_DELIMITER}",  # names may hold "|" (SACCT_DELIMITER)
        "-D",  # every run of a requeued job (see _requeued_runs)
        "-o",
        ",".join(SACCT_FIELDS),
        "-S",
        start.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"),
        "-E",
        "now",
    ]


def _delimiter(head: bytes) -> str:
    """`SACCT_DELIMITER` when the header line uses it (headway's own runs), else sacct -P's `|`."""
    first = head.split(b"\n", 1)[0]
    return SACCT_DELIMITER if SACCT_DELIMITER.encode() in first else "|"


def sacct_label(start: dt.datetime) -> str:
    """How bad rows and errors name a sacct run headway made: its window, not the temp file it went to."""
    return f"sacct -S {start.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S} (UTC)"


def fetch_from_slurm(since: str, timeout_s: float = 600.0) -> tuple[Path, str]:
    """Run sacct on this machine and save its output to a temporary file (for `ingest --from-slurm`);
    returns the file and the name to show for it (`sacct_label`)."""
    start = parse_since(since)
    exe = shutil.which("sacct")
    if exe is None:
        raise BadInputError(
            "sacct not found on PATH: run this on a Slurm login node, or save `sacct -a -X -P -D -o "
            + ",".join(SACCT_FIELDS)
            + "` output to a file and ingest that"
        )
    argv = sacct_command(start, exe)
    try:
        proc = subprocess.run(
            argv, capture_output=True, timeout=timeout_s, check=False, env={**os.environ, **SACCT_ENV}
        )
    except subprocess.TimeoutExpired:
        raise BadInputError(f"sacct did not answer within {timeout_s:.0f} s; try a shorter --since") from None
    except OSError as e:
        raise BadInputError(f"cannot run sacct: {e.strerror}") from e
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
        first = msg[0] if msg else f"exit status {proc.returncode}"
        hint = ""
        if re.search(r"permi|not allowed|denied|authoriz", first, re.IGNORECASE):
            hint = " (you may not be allowed to read all users' jobs; ask an admin or drop to your own)"
        raise BadInputError(f"sacct failed: {first}{hint}")
    if not proc.stdout.strip():
        raise BadInputError("sacct printed nothing (is accounting storage enabled on this cluster?)")
    with tempfile.NamedTemporaryFile(prefix="headway-sacct-", suffix=".txt", delete=False) as fh:
        fh.write(proc.stdout)
    return Path(fh.name), sacct_label(start)
