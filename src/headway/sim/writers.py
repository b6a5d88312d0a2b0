"""Files the simulator's commands write: a synthetic trace as CSV with its column mapping, and the HTML
report of a comparison. The commands pick the paths and write atomically; these say what goes in."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from headway.sim.compare import RefFigure
    from headway.sim.result import SimResult


def mapping_path(csv_path: Path) -> Path:
    """The `--mapping` TOML written next to a CSV trace: `jobs.csv` -> `jobs.mapping.toml`."""
    return csv_path.with_name(csv_path.stem + ".mapping.toml")


def write_csv_with_mapping(table: pa.Table, csv_path: Path, toml_path: Path) -> None:
    """The job schema as CSV (times as epoch microseconds) plus the `--mapping` TOML that reads it back."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from headway.schema import TS

    cols = [c.cast(pa.int64()) if c.type == TS else c for c in table.columns]
    pacsv.write_csv(pa.Table.from_arrays(cols, names=table.column_names), csv_path)
    fields = "\n".join(f'{name} = "{name}"' for name in table.column_names if name != "source")
    toml_path.write_text(
        "# Written by `headway synth`: reads the CSV next to it with `headway ingest --format csv`.\n"
        '[format]\ndelimiter = ","\ntime_format = "epoch"\nepoch_unit = "us"\ntimezone = "UTC"\n'
        'time_limit_unit = "s"\nmem_unit = "mb"\n\n[fields]\n' + fields + "\n",
        encoding="utf-8",
    )


def ingest_hint(fmt: str, path: Path) -> str:
    """The command that reads a trace `headway synth` wrote in `fmt`."""
    if fmt == "parquet":
        return f"simulate it directly: headway simulate {path}"
    if fmt == "sacct":
        return f"ingest it: headway ingest --format sacct --tz UTC {path}"
    return f"ingest it: headway ingest --format csv --mapping {mapping_path(path)} {path}"


def html_report(
    results: Sequence[SimResult],
    metrics: Mapping[str, Mapping[str, Any]],
    *,
    trace_name: str,
    jobs_read: int,
    capacity: float,
    load: float | None,
    figs: Sequence[RefFigure],
    load_note: str | None = None,
) -> str:
    """The self-contained HTML report of `headway simulate --html`, with its notes (peer figures, the
    load check, the jobs left out) and a subtitle that counts the jobs replayed of those read."""
    from headway.sim.left_out import left_out_text
    from headway.sim.report_html import render

    notes = [f"Helios {f.policy} {f.metric} at load {f.load}: {f.value:,.0f} s" for f in figs]
    if load_note:
        notes.append(load_note[0].upper() + load_note[1:])
    replayed = results[0].jobs.num_rows if results else 0
    if results and results[0].excluded_counts:
        notes.append(f"Left out of the simulation: {left_out_text(results[0].excluded_counts)}.")
    offered = results[0].load if results else float("nan")
    arrivals = "natural arrivals" if load is None else f"load {load:g}"
    if math.isfinite(offered):
        arrivals += f" (offered {offered:.3g})"
    jobs = f"{replayed:,} {'job' if replayed == 1 else 'jobs'}"
    return render(
        results,
        metrics,
        title=f"headway simulate: {trace_name}",
        subtitle=f"{jobs} replayed"
        + (f" of the {jobs_read:,} read" if replayed != jobs_read else "")
        + f", {capacity:,g} GPUs, {arrivals}",
        notes=notes,
    )
