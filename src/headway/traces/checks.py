"""Rules every format shares, applied after its reader: values no scheduler means literally are read as
what they mean, and the user is told how many rows that touched."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA
from headway.traces.base import SELDOM_FIELDS, ReadResult


def _count(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.sum(pc.fill_null(mask, False)).as_py() or 0)


def tidy(res: ReadResult) -> ReadResult:
    """- A time limit of 0 or less is no limit: Slurm reads `--time=0` so, and a negative one cannot be
      meant (before, the simulator's backfill and impact's cost took it at face value: a 0-GPU-hour job).
    - A node count of 0 or less is unknown.
    - A GPU column with empty cells: the jobs keep an unknown GPU count, and the user learns how many.
    - A column empty on every row is listed among the missing fields (but for SELDOM_FIELDS)."""
    t = res.table
    if t.num_rows == 0:
        return res
    for name, what in (
        ("time_limit", "a time limit of 0 or less: read as no time limit (as Slurm reads --time=0)"),
        ("nodes", "a node count of 0 or less: read as unknown"),
    ):
        col = t.column(name)
        bad = pc.less_equal(col, pa.scalar(0, col.type))
        k = _count(bad)
        if k:
            fixed = pc.if_else(pc.fill_null(bad, False), pa.scalar(None, col.type), col)
            t = t.set_column(t.schema.get_field_index(name), name, fixed)
            res.notes.append(f"{k:,} row(s) with {what}")
    # A field the log has but leaves empty on every row (sacct's Account on a cluster without accounts, a
    # Parquet export of a log without names) is as missing as one it does not have.
    empty = {
        f
        for f in t.column_names
        if f != "source" and f not in SELDOM_FIELDS and t.column(f).null_count == t.num_rows
    }
    if empty - set(res.missing_fields):
        res.missing_fields = [f for f in JOB_SCHEMA.names if f in empty or f in res.missing_fields]
    if "gpus" not in res.missing_fields:
        k = t.column("gpus").null_count
        if k:
            res.notes.append(
                f"{k:,} row(s) without a GPU count: left unknown (the audit counts them as CPU-only, "
                "simulate leaves them out)"
            )
    t = _control_characters(t, res)
    res.table = t
    return res


# C0 controls (NUL, tab, line breaks, ESC...) and DEL: never stored in a name a terminal, a CSV or a browser
# shows (an ESC in a job name redrew the audit's terminal; a NUL cut a C string short).
_CONTROL = r"[\x00-\x1f\x7f]"
REPLACEMENT = "\ufffd"


def _control_characters(t: pa.Table, res: ReadResult) -> pa.Table:
    """Text fields with control characters get U+FFFD in their place, counted per field in a note."""
    told = []
    for f in JOB_SCHEMA:
        if f.type != pa.string() or f.name == "source" or f.name not in t.column_names:
            continue
        col = t.column(f.name)
        hit = pc.match_substring_regex(col, _CONTROL)
        k = _count(hit)
        if not k:
            continue
        fixed = pc.replace_substring_regex(col, _CONTROL, REPLACEMENT)
        t = t.set_column(t.schema.get_field_index(f.name), f.name, fixed)
        told.append(f"{f.name} {k:,}")
    if told:
        res.notes.append(
            "values with control characters (NUL, line breaks, escapes), stored with U+FFFD in their place: "
            + ", ".join(told)
        )
    return t
