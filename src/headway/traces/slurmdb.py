"""A CSV (or tab-separated) export of slurmdbd's `<cluster>_job_table`, as sites dump it for analysis.

Numbers are Slurm's raw database values: `state` is the job_states enum (base state = value & 0xff),
`timelimit` is minutes (4294967295 = none), times are epoch seconds (0 = unset), `exit_code` is the raw
wait status (exit code = status >> 8), `tres_alloc`/`tres_req` are `id=count` with tres_table ids.
Unknown columns are ignored; schema fields the export lacks are listed in `missing_fields`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import State
from headway.traces import tabular as tb
from headway.traces.base import BadInputError, ReadOptions, ReadResult

# slurm.h job_states, base state (value & JOB_STATE_BASE)
STATE_BY_CODE: dict[int, State] = {
    0: State.PENDING,
    1: State.RUNNING,
    2: State.RUNNING,  # SUSPENDED: still holds its allocation
    3: State.COMPLETED,
    4: State.CANCELLED,
    5: State.FAILED,
    6: State.TIMEOUT,
    7: State.NODE_FAIL,
    8: State.PREEMPTED,
    9: State.NODE_FAIL,  # BOOT_FAIL
    10: State.TIMEOUT,  # DEADLINE
    11: State.OUT_OF_MEMORY,
}
INFINITE32 = 4294967295  # slurm INFINITE: no limit
NO_VAL32 = 4294967294  # slurm NO_VAL: not set
TRES_CPU, TRES_MEM, TRES_NODE = 1, 2, 4
DEFAULT_GPU_TRES_MIN = 1001

# schema field -> job_table columns that can fill it (first present wins)
_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "user": ("user", "user_name", "id_user"),
    "group": ("account", "id_group"),
    "name": ("job_name",),
    "partition": ("partition",),
    "priority_class": ("qos", "qos_name", "id_qos"),
}


class SlurmdbReader:
    name = "slurmdb"

    def sniff(self, path: Path, head: bytes) -> bool:
        for sep in (",", "\t"):
            fields = tb.head_fields(head, sep)
            if "id_job" in fields and ("state" in fields or "time_submit" in fields):
                return True
        return False

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        raw = tb.read_delimited(path, None, quoting=True, progress=options.progress)
        if not raw.has("id_job") or not raw.has("state"):
            lacking = "id_job" if not raw.has("id_job") else "state"
            raise BadInputError(
                f"{path}: not a slurmdb job_table export: no {lacking} column "
                f"(found {', '.join(raw.names[:8]) or 'nothing'})"
            )
        f = tb.Frame(raw)
        provided: set[str] = {"job_id", "state"}
        notes: list[str] = []
        cols: dict[str, pa.Array] = {"job_id": self._job_id(f, raw)}
        f.flag(pc.is_null(cols["job_id"]), "id_job: empty")

        state_raw = raw.get("state")
        code = f.integer(state_raw, "state", required=True)
        f.flag(pc.is_null(f.clean(state_raw)), "state: empty")
        base = pc.bit_wise_and(pc.fill_null(code, 0), 0xFF)
        keys = pa.array(list(STATE_BY_CODE), pa.int64())
        vals = pa.array([s.value for s in STATE_BY_CODE.values()], pa.string())
        idx = pc.index_in(base, value_set=keys)
        unknown = pc.and_(pc.is_valid(code), pc.is_null(idx)).to_numpy(zero_copy_only=False)
        if unknown.any():
            notes.append(f"{int(unknown.sum())} rows with an unknown numeric state stored as UNKNOWN")
        cols["state"] = pc.fill_null(pc.take(vals, idx), State.UNKNOWN.value)

        for field_name, names in _TEXT_FIELDS.items():
            v = raw.get(*names)
            if v is not None:
                cols[field_name] = f.text(v)
                provided.add(field_name)
        if raw.get("account") is None and raw.get("id_group") is not None:
            notes.append("group is the numeric id_group (the export has no account column)")

        for field_name, col in (
            ("submit_time", "time_submit"),
            ("start_time", "time_start"),
            ("end_time", "time_end"),
        ):
            v = raw.get(col)
            if v is not None:
                cols[field_name] = f.epoch(v, col, "s", zero_is_null=True, required=col == "time_submit")
                provided.add(field_name)

        limit_raw = raw.get("timelimit")
        if limit_raw is not None:
            minutes = f.integer(limit_raw, "timelimit")  # INFINITE (no limit) and NO_VAL are null
            cols["time_limit"] = pc.multiply(minutes, 60)
            provided.add("time_limit")

        exit_raw = raw.get("exit_code")
        if exit_raw is not None:
            status = f.integer(exit_raw, "exit_code")
            # Raw wait status: WEXITSTATUS in bits 8-15, the terminating signal in bits 0-6.
            cols["exit_code"] = pc.bit_wise_and(pc.shift_right(status, 8), 0xFF).cast(pa.int32())
            signalled = pc.fill_null(pc.not_equal(pc.bit_wise_and(status, 0x7F), 0), False)
            n_sig = int(signalled.to_numpy(zero_copy_only=False).sum())
            if n_sig:
                notes.append(
                    f"{n_sig} jobs ended by a signal (low bits of exit_code); exit_code keeps the exit status"
                )
            provided.add("exit_code")

        alloc_raw, req_raw = raw.get("tres_alloc"), raw.get("tres_req")
        alloc = tb.explode_pairs(f.text(alloc_raw)) if alloc_raw is not None else None
        req = tb.explode_pairs(f.text(req_raw)) if req_raw is not None else None
        for kv, name, v in ((alloc, "tres_alloc", alloc_raw), (req, "tres_req", req_raw)):
            if kv is not None:  # a GPU count that is no number would read as no GPUs
                f.flag(_gpu_unreadable(kv, options.gpu_tres_ids), f"{name}: a GPU count is not a number", v)
        if alloc is not None or req is not None:
            cols["gpus"], note = self._gpus(f.n, alloc, req, options.gpu_tres_ids)
            notes.append(note)
            provided.add("gpus")

        nodes = self._positive(f, raw.get("nodes_alloc"), "nodes_alloc", (alloc, req), TRES_NODE)
        if nodes is not None:
            cols["nodes"] = nodes
            provided.add("nodes")
        cpus = self._positive(f, raw.get("cpus_req", "cpus_alloc"), "cpus_req", (alloc, req), TRES_CPU)
        if cpus is not None:
            cols["cpus"] = cpus
            provided.add("cpus")
        mem = self._mem(f, raw.get("mem_req"), cpus, (req, alloc))
        if mem is not None:
            cols["mem_mb"] = mem
            provided.add("mem_mb")

        table, sink = f.finish(cols, options, self.name)
        return tb.result(table, self.name, f, sink, provided, notes)

    @staticmethod
    def _job_id(f: tb.Frame, raw: tb.RawColumns) -> pa.Array:
        """id_job, or `arrayjob_task` (as sacct shows it) for array tasks, when the export says so. id_job is
        read as the integer slurmdbd stores (`1003.0` after pandas is job 1003, not a job named so)."""
        job = f.integer(raw.get("id_job"), "id_job", required=True, sentinels=False).cast(pa.string())
        arr_job, arr_task = raw.get("id_array_job"), raw.get("id_array_task")
        if arr_job is None or arr_task is None:
            return job
        aj = pc.fill_null(f.integer(arr_job, "id_array_job"), 0)
        at = f.integer(arr_task, "id_array_task")
        is_task = pc.fill_null(
            pc.and_(pc.greater(aj, 0), pc.and_(pc.is_valid(at), pc.less(at, NO_VAL32))), False
        )
        task_id = pc.binary_join_element_wise(aj.cast(pa.string()), at.cast(pa.string()), "_")
        return pc.if_else(is_task, task_id, job)

    @staticmethod
    def _gpus(
        n: int, alloc: tb.KeyValues | None, req: tb.KeyValues | None, ids: tuple[int, ...] | None
    ) -> tuple[pa.Array, str]:
        """GPUs from tres_alloc (else tres_req). Explicit ids are summed; by default the largest count
        among ids >= 1001 is taken, since Slurm records a GPU both untyped (gres/gpu) and typed."""
        gpus = np.zeros(n, dtype=np.float64)
        found = np.zeros(n, dtype=bool)
        for kv in (alloc, req):
            if kv is None:
                continue
            key_num = _tres_ids(kv)
            if ids:
                g, hit = tb.sum_where(kv, pc.is_in(key_num, value_set=pa.array(list(ids), pa.int64())))
            else:
                g, hit = _max_where(kv, pc.greater_equal(key_num, DEFAULT_GPU_TRES_MIN))
            take = hit & ~found
            gpus[take] = g[take]
            found |= hit
        if ids:
            note = f"GPUs: sum of tres ids {', '.join(map(str, ids))}"
        else:
            note = (
                f"GPUs: the largest count among tres ids >= {DEFAULT_GPU_TRES_MIN} (gres/gpu and its typed "
                "twins); pass --gpu-tres-ids to name them exactly"
            )
        return pa.array(gpus, pa.float64()), note

    @staticmethod
    def _positive(
        f: tb.Frame, values: pa.Array | None, what: str, tres: tuple[tb.KeyValues | None, ...], tres_id: int
    ) -> pa.Array | None:
        out = np.zeros(f.n, dtype=np.float64)
        found = np.zeros(f.n, dtype=bool)
        any_source = values is not None
        if values is not None:
            v = pc.fill_null(f.integer(values, what), 0).to_numpy(zero_copy_only=False).astype(np.float64)
            ok = (v > 0) & (v < NO_VAL32)
            out[ok] = v[ok]
            found |= ok
        any_source |= _fill_from_tres(out, found, tres, tres_id)
        return tb.masked(out, found, pa.int64()) if any_source else None

    @staticmethod
    def _mem(
        f: tb.Frame, values: pa.Array | None, cpus: pa.Array | None, tres: tuple[tb.KeyValues | None, ...]
    ) -> pa.Array | None:
        """mem_req in MB; the MEM_PER_CPU flag (bit 63) means per CPU. Else tres mem (id 2)."""
        out = np.zeros(f.n, dtype=np.float64)
        found = np.zeros(f.n, dtype=bool)
        any_source = values is not None
        if values is not None:
            # An unsigned 64-bit value whose top bit flags "per CPU": 19-20 digit integers are read exactly
            # as uint64 here; everything else (small integers, their float forms, sentinels) by Frame.
            sv = f.clean(values)
            big = pc.fill_null(pc.match_substring_regex(sv, r"^(?:[0-9]{19}|1[0-8][0-9]{18})$"), False)
            u = pc.if_else(big, sv, pa.scalar("0")).cast(pa.uint64())
            none = pc.is_in(u, value_set=pa.array([v for v in tb.SLURM_SENTINELS if v >= 2**62], pa.uint64()))
            flag_bit = pa.scalar(2**63, pa.uint64())
            per_cpu = pc.and_(pc.and_(big, pc.invert(none)), pc.greater_equal(u, flag_bit))
            low = pc.bit_wise_and(u, pa.scalar(2**63 - 1, pa.uint64())).to_numpy(zero_copy_only=False)
            mb = np.where(big.to_numpy(zero_copy_only=False), low.astype(np.float64), np.nan)
            big_none = pc.and_(big, none)
            if pc.any(big_none).as_py():
                f.note_sentinels(big_none, "mem_req", values)
                mb[big_none.to_numpy(zero_copy_only=False)] = np.nan
            # A float at 2**53 or beyond has lost its low bits: the flag and the MB cannot be recovered.
            floaty = pc.and_(
                pc.fill_null(pc.match_substring_regex(sv, tb.FLOAT_RE), False),
                pc.invert(pc.fill_null(pc.match_substring_regex(sv, tb.INT_RE), False)),
            )
            fnum = pc.if_else(floaty, sv, pa.scalar(None, pa.string())).cast(pa.float64())
            rounded = pc.fill_null(pc.greater_equal(pc.abs(fnum), 2.0**53), False)
            f.soft(
                rounded,
                "mem_req: a float-rounded 64-bit value (the MEM_PER_CPU flag and the MB in its low bits are "
                "lost)",
                values,
            )
            rest = pc.if_else(pc.or_(big, rounded), pa.scalar(None, pa.string()), values)
            small = f.integer(rest, "mem_req").to_numpy(zero_copy_only=False).astype(np.float64)
            mb = np.where(np.isnan(mb), small, mb)
            if cpus is not None:
                c = pc.fill_null(cpus, 0).to_numpy(zero_copy_only=False).astype(np.float64)
                mb = np.where(per_cpu.to_numpy(zero_copy_only=False), mb * c, mb)
            ok = (mb > 0) & (mb < 2.0**62)
            out[ok] = mb[ok]
            found |= ok
        any_source |= _fill_from_tres(out, found, tres, TRES_MEM)
        return tb.masked(np.round(out), found, pa.int64()) if any_source else None


def _tres_ids(kv: tb.KeyValues) -> pa.Array:
    """The numeric tres id of each pair (null for a key that is no id)."""
    return pc.cast(
        pc.if_else(pc.match_substring_regex(kv.key, r"^[0-9]{1,9}$"), kv.key, pa.scalar(None, pa.string())),
        pa.int64(),
    )


def _gpu_unreadable(kv: tb.KeyValues, ids: tuple[int, ...] | None) -> np.ndarray:
    """Per row: a GPU pair (`1001=x`) whose count is not a number."""
    if kv.text is None:
        return np.zeros(len(kv.rows_of), dtype=bool)
    key = pc.cast(
        pc.if_else(
            pc.match_substring_regex(kv.text, r"^[0-9]{1,9}="),
            pc.replace_substring_regex(kv.text, r"=.*$", ""),
            pa.scalar(None, pa.string()),
        ),
        pa.int64(),
    )
    gpu = pc.is_in(key, value_set=pa.array(list(ids), pa.int64())) if ids else pc.greater_equal(key, 1001)
    bad = pc.fill_null(pc.and_(gpu, pc.is_null(kv.value)), False).to_numpy(zero_copy_only=False)
    hit = np.bincount(kv.row[bad], minlength=kv.distinct) > 0
    out: np.ndarray = hit[kv.rows_of]
    return out


def _max_where(kv: tb.KeyValues, mask: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    m = pc.fill_null(pc.and_(mask, pc.is_valid(kv.value)), False).to_numpy(zero_copy_only=False)
    vals = pc.fill_null(kv.value, 0.0).to_numpy(zero_copy_only=False)
    best = np.zeros(kv.distinct, dtype=np.float64)
    np.maximum.at(best, kv.row[m], vals[m])
    hit = np.bincount(kv.row[m], minlength=kv.distinct) > 0
    return best[kv.rows_of], hit[kv.rows_of]


READER = SlurmdbReader()


def _fill_from_tres(
    out: np.ndarray, found: np.ndarray, tres: tuple[tb.KeyValues | None, ...], tres_id: int
) -> bool:
    """Fill rows not yet found from the first TRES column with `tres_id`; True if any TRES column exists."""
    seen = False
    for kv in tres:
        if kv is None:
            continue
        seen = True
        vals, hit = tb.sum_where(kv, pc.equal(kv.key, str(tres_id)))
        take = hit & (vals > 0) & ~found
        out[take] = vals[take]
        found |= take
    return seen
