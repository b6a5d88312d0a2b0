"""Damaged copies of a real slurmdbd job-table export, made the way sites' tools damage them.

Each variant keeps every job and what it means (state, times, GPUs); only how values are written changes,
so a reader must give the clean table's jobs, states and GPU-hours from each. The truth comes from the
clean file itself (`truth`), read here with the csv module alone, not through headway.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd

DATA = Path(__file__).parent / "data"
JOB_TABLE = DATA / "slurmdb_job_table_22.05.csv"
# slurm.h job_states (base state), as the job table stores them
STATE_NAMES = {3: "COMPLETED", 4: "CANCELLED", 5: "FAILED", 6: "TIMEOUT", 7: "NODE_FAIL", 11: "OUT_OF_MEMORY"}
# Columns that hold no value the job record needs; a tool that leaves gaps leaves them here.
GAP_COLUMNS = ("id_array_job", "mem_req", "cpus_req", "kill_requid", "nodes_alloc", "priority")


def truth(path: Path = JOB_TABLE) -> dict[str, object]:
    """Jobs, jobs per state and GPU-hours per state of the clean table: GPUs are the largest count among
    tres ids >= 1001 of tres_alloc (Slurm lists a GPU typed and untyped), runtime end - start."""
    jobs: Counter[str] = Counter()
    hours: defaultdict[str, float] = defaultdict(float)
    ids = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            state = STATE_NAMES.get(int(row["state"]) & 0xFF, "OTHER")
            ids.append(row["id_job"])
            jobs[state] += 1
            gpus = 0.0
            for pair in (row["tres_alloc"] or row["tres_req"]).split(","):
                if "=" in pair:
                    k, v = pair.split("=", 1)
                    if k.isdigit() and int(k) >= 1001:
                        gpus = max(gpus, float(v))
            start, end = int(row["time_start"]), int(row["time_end"])
            if start and end:
                hours[state] += gpus * (end - start) / 3600
    return {"ids": sorted(ids), "jobs": dict(jobs), "gpu_hours": {k: round(v, 6) for k, v in hours.items()}}


def _frame() -> pd.DataFrame:
    """The clean table as pandas reads it by default: empty cells are NaN, which makes their columns float."""
    return pd.read_csv(JOB_TABLE)


def _with_gaps(df: pd.DataFrame) -> pd.DataFrame:
    """Every seventh row loses the values of GAP_COLUMNS (as a join or a filtered export leaves them)."""
    df = df.copy()
    rows = df.index[::7]
    for col in GAP_COLUMNS:
        df[col] = df[col].astype("float64")
        df.loc[rows, col] = float("nan")
    return df


def pandas_gaps(out: Path) -> Path:
    """Through pandas with gaps: integer columns with a gap are written as floats (`1003.0`,
    `4294967294.0`)."""
    _with_gaps(_frame()).to_csv(out, index=False)
    return out


def pandas_astype_float(out: Path) -> Path:
    """`df.astype(float)` on every numeric column, as an analysis notebook does before writing it back:
    ids, states and epoch times as `1.0`, `3.0`, `1796150637.0`."""
    df = _frame()
    num = df.select_dtypes("number").columns
    df[num] = df[num].astype("float64")
    df.to_csv(out, index=False)
    return out


def spreadsheet(out: Path) -> Path:
    """A spreadsheet's CSV: numbers beyond ten digits in six significant digits (`4.29497E+09`,
    `1.84467E+19` inside nothing but plain cells), integers with a gap as `0.0`, gaps as `NULL`, `None`."""
    df = _with_gaps(_frame())
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(df.columns)
    for k, row in enumerate(df.itertuples(index=False)):
        cells = []
        for v in row:
            if isinstance(v, float) and v != v:
                cells.append(("NULL", "None", "")[k % 3])
            elif isinstance(v, int | float) and not isinstance(v, bool) and abs(v) >= 4294967294:
                cells.append(f"{v:.6G}")
            elif isinstance(v, float):
                cells.append(repr(v))
            else:
                cells.append(str(v))
        writer.writerow(cells)
    out.write_text(buf.getvalue())
    return out


VARIANTS = {
    "pandas-gaps": pandas_gaps,
    "pandas-astype-float": pandas_astype_float,
    "spreadsheet": spreadsheet,
}
