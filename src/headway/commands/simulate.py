"""`headway simulate`, `headway sweep`, `headway synth`: replay a trace under policies and compare them.

Heavy libraries (plotly, dask, the engine) are imported inside the commands so `headway --help` stays fast.
"""

from __future__ import annotations

import csv
import importlib.resources
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from headway.console import (
    check_output_file,
    count,
    err,
    fail,
    fail_unknown_source,
    out,
    plain,
    print_json,
    print_skipped,
    print_table,
    printable,
    replaced_atomically,
    safe_escape,
)
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP
from headway.traces.base import BadInputError

if TYPE_CHECKING:
    import pyarrow as pa

    from headway.sim.cluster import ClusterSpec
    from headway.sim.log_cluster import LogCluster
    from headway.sim.result import SimResult, WaitRecord
    from headway.sim.sizing import LoadCheck

ALL_POLICIES: tuple[str, ...] = (
    "fifo",
    "multifactor",
    "qssf",
    "las",
    "impact",
    "sjf-oracle",
    "fifo-skip",
    "impact-oracle",
)
DEFAULT_POLICIES = "fifo,multifactor,qssf,las,impact"
PLACEMENTS: tuple[str, ...] = ("first-fit", "topology")
BASELINE = "multifactor"
# Peer figures print only when asked for by name: which trace a user replays is theirs to say, so no
# trace (not even one with the Philly sample's 5,910 jobs on 512 GPUs) switches them on by itself.
REFERENCES: tuple[str, ...] = ("none", "helios-philly")
MAX_COPIES = 100

# ---------------------------------------------------------------------------------------------- options

TraceArg = Annotated[
    Path | None,
    typer.Argument(
        help="A job log to simulate (any format `headway ingest` reads, or a Parquet file in the job "
        "schema such as `headway synth` writes). Without it, jobs come from the store (--db).",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="Format of TRACE (auto sniffs it; parquet for the job schema).")
]
SourceOpt = Annotated[
    str | None,
    typer.Option(
        help="With --db: only the jobs of this source (one cluster of a store that holds several).",
        show_default=False,
    ),
]
MappingOpt = Annotated[
    Path | None,
    typer.Option(
        help="TOML column mapping for a CSV TRACE (as `headway ingest --format csv --mapping`).",
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        help="Seed of the predictor's training (LightGBM's row and feature sampling). The replay itself "
        "is deterministic: policies that read no predictions give the same result for every seed.",
        min=0,
        max=2**31 - 1,
    ),
]
DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db",
        help="DuckDB job store to read jobs from (default ./headway.duckdb, or $HEADWAY_DB).",
        show_default=False,
    ),
]
WaitOpt = Annotated[
    float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
]
# The cluster flags default to None so that `build_cluster` can tell them from a --cluster file's nodes.
DEFAULT_NODES, DEFAULT_GPUS_PER_NODE, DEFAULT_NODES_PER_RACK = 64, 8, 8
NodesOpt = Annotated[
    int | None,
    typer.Option(help=f"Nodes in a uniform cluster (default {DEFAULT_NODES}).", min=1, show_default=False),
]
GpnOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node", help=f"GPUs per node (default {DEFAULT_GPUS_PER_NODE}).", min=1, show_default=False
    ),
]
NprOpt = Annotated[
    int | None,
    typer.Option(
        "--nodes-per-rack",
        help=f"Nodes per rack (one switch each; default {DEFAULT_NODES_PER_RACK}).",
        min=1,
        show_default=False,
    ),
]
ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        "--cluster",
        help="Cluster from a TOML file (its format: docs/policies.md), or `from-log`: the nodes TRACE's "
        "jobs ran on (sacct NodeList, the slurmdbd job table's nodelist, Philly's detail), each with the "
        "most GPUs seen in use on it at once.",
        show_default=False,
    ),
]
NodesFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--nodes-file",
        help="Cluster from a node list CSV (Alibaba's openb_node_list_*.csv).",
        show_default=False,
    ),
]
PlacementOpt = Annotated[
    str | None,
    typer.Option(help="first-fit or topology (default: topology for impact, first-fit for the others)."),
]
IncludeCpuOpt = Annotated[
    bool, typer.Option("--include-cpu", help="Also simulate jobs that ask for no GPU (left out by default).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON only (no table, no progress bars).")]
CopiesOpt = Annotated[
    int,
    typer.Option(
        help="Replay every job this many times (copy k's id ends in #k; same submit times, then --load "
        "rescales them all): loads a cluster that the log alone never fills, as Alibaba's pods on "
        "their own node list.",
        min=1,
        max=MAX_COPIES,
    ),
]


def _parse_policies(value: str) -> list[str]:
    names = [p.strip().lower() for p in value.split(",") if p.strip()]
    if not names:
        fail("--policy: give at least one policy")
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad:
        fail(f"--policy: unknown {', '.join(bad)}; choose from {', '.join(ALL_POLICIES)}")
    return list(dict.fromkeys(names))


def _parse_loads(value: str) -> list[float | None]:
    loads: list[float | None] = []
    for v in value.split(","):
        v = v.strip().lower()
        if not v:
            continue
        if v == "natural":
            loads.append(None)
            continue
        try:
            x = float(v)
        except ValueError:
            fail(f"--load: {v!r} is not a number (or `natural`)")
        if not 0 < x <= 10:
            fail(f"--load: {x:g} is out of range; offered load must be in (0, 10]")
        loads.append(x)
    if not loads:
        fail("--load: give at least one load")
    return list(dict.fromkeys(loads))  # a load given twice is the same replay


def _parse_seeds(value: str) -> list[int]:
    try:
        seeds = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        fail(f"--seeds: expected comma-separated integers, got {value!r}")
    if not seeds:
        fail("--seeds: give at least one seed")
    if any(not 0 <= x < 2**31 for x in seeds):
        fail(f"--seeds: seeds are whole numbers from 0 to {2**31 - 1}, got {value!r}")
    return list(dict.fromkeys(seeds))  # a seed given twice is the same replay


# ------------------------------------------------------------------------------------------------ input


@dataclass(frozen=True, slots=True)
class TraceInfo:
    label: str
    format: str
    jobs: int
    sources: list[str]
    bad_rows: int = 0  # rows the reader skipped (as `headway ingest` reports them)
    bad_row_examples: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    name: str = ""  # what titles show: the file's name, or the store's with its source

    @property
    def short(self) -> str:
        """The label for a title: not `Path(label).name`, which cut `store (source lab/east)` to
        `east)`."""
        return self.name or Path(self.label).name

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "format": self.format,
            "jobs": self.jobs,
            "sources": self.sources,
            "bad_rows": self.bad_rows,
            "bad_row_examples": list(self.bad_row_examples),
            "notes": list(self.notes),
        }

    def report(self) -> None:
        """What the reader skipped or wants known, on stderr (as `headway ingest` shows it)."""
        print_skipped(self.label, list(self.bad_row_examples), self.bad_rows)
        for n in self.notes:
            err.print(f"note ({safe_escape(self.label)}): {safe_escape(n)}", highlight=False)


SHOWN_BAD_ROWS = 5


def load_jobs(
    trace: Path | None,
    fmt: str,
    db: Path | None,
    tz: str | None = None,
    mapping: Path | None = None,
    source: str | None = None,
    wait: float = DEFAULT_WAIT,
) -> tuple[pa.Table, TraceInfo]:
    """Jobs in JOB_SCHEMA from a trace file (any reader, or Parquet) or from the store (of `source`);
    one line on error."""
    import pyarrow.compute as pc

    from headway.store import JobStore, StoreError
    from headway.traces.base import ReadOptions
    from headway.traces.compressed import plain_file
    from headway.traces.registry import FORMATS, read, sniff

    if trace is not None and db is not None:
        fail("give either a TRACE file or --db, not both")
    bad: tuple[int, tuple[str, ...], tuple[str, ...]] = (0, (), ())
    if source is not None and trace is not None:
        fail("--source picks one cluster of a job store (--db); a TRACE file is replayed whole")
    if trace is None:
        try:
            with JobStore(db, read_only=True, wait=wait) as store:
                table = store.table("source = ?", [source]) if source else store.table()
                label = str(store.path) + (f" (source {source})" if source else "")
                name = Path(store.path).name + (f" (source {source})" if source else "")
                if source and table.num_rows == 0:
                    fail_unknown_source(source, store.path, store.sources())
        except StoreError as e:
            fail(str(e))
        chosen = "store"
    else:
        if not trace.exists():
            fail(f"{trace}: no such file")
        if trace.is_dir():
            fail(f"{trace}: is a directory; give the job log inside it")
        label, name = str(trace), trace.name
        if fmt not in FORMATS:
            fail(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if mapping is not None and fmt not in ("csv", "auto"):
            fail("--mapping is for --format csv")
        try:
            with plain_file(trace) as plain:
                # As `ingest` sniffs: a mapping means CSV, except for a Parquet or JSON file, which
                # has its own columns (forcing CSV read a Parquet file's bytes as a header).
                chosen = fmt if fmt != "auto" else sniff(plain, has_mapping=mapping is not None)
                res = read(chosen, plain, ReadOptions(tz=tz, mapping=mapping))
        except BadInputError as e:
            fail(str(e))
        except (OSError, UnicodeError) as e:
            fail(f"{trace}: cannot read: {e}")
        table = res.table
        shown = tuple(str(b) for b in res.bad_rows[:SHOWN_BAD_ROWS])
        bad = (res.bad_row_count, shown, tuple(res.notes))
    if table.num_rows == 0:
        fail(f"{label}: no jobs to simulate")
    sources = sorted(str(s) for s in pc.unique(table.column("source")).to_pylist())
    if trace is None and len(sources) > 1:  # their jobs interleave on one model cluster: rarely meant
        bad = (
            bad[0],
            bad[1],
            (
                *bad[2],
                f"the store holds {len(sources)} sources ({', '.join(sources)}), replayed here as one "
                "cluster's jobs; --source NAME replays one",
            ),
        )
    return table, TraceInfo(label, chosen, table.num_rows, sources, *bad, name=name)


def build_cluster(
    nodes: int | None,
    gpus_per_node: int | None,
    nodes_per_rack: int | None,
    cluster_file: Path | None,
    nodes_file: Path | None,
) -> ClusterSpec:
    """The cluster model of sim/cluster.py from flags (None: the default), a TOML file or a node list."""
    from headway.sim import cluster as cl

    if cluster_file is not None and nodes_file is not None:
        fail("give --cluster or --nodes-file, not both")
    given = [f for f, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)) if v is not None]
    if cluster_file is not None and nodes_per_rack is not None:
        given.append("--nodes-per-rack")
    if given and (cluster_file is not None or nodes_file is not None):
        what = "--cluster" if cluster_file is not None else "--nodes-file"
        fail(f"{', '.join(given)}: not used with {what}, which lists the nodes itself")
    nodes = DEFAULT_NODES if nodes is None else nodes
    gpus_per_node = DEFAULT_GPUS_PER_NODE if gpus_per_node is None else gpus_per_node
    nodes_per_rack = DEFAULT_NODES_PER_RACK if nodes_per_rack is None else nodes_per_rack
    try:
        if cluster_file is not None:
            if not cluster_file.is_file():
                fail(f"{cluster_file}: no such file")
            return cl.ClusterSpec.from_toml(cluster_file)
        if nodes_file is not None:
            if not nodes_file.is_file():
                fail(f"{nodes_file}: no such file")
            return cl.ClusterSpec.from_alibaba(nodes_file, nodes_per_rack)
        return cl.ClusterSpec.from_flags(nodes, gpus_per_node, nodes_per_rack)
    except (ValueError, KeyError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)


def wants_log_cluster(cluster_file: Path | None) -> bool:
    """`--cluster from-log`: the nodes the log names, not a file (a file named so: give its full path)."""
    from headway.sim.log_cluster import FROM_LOG

    return cluster_file is not None and str(cluster_file) == FROM_LOG


def log_cluster(
    trace: Path | None, info: TraceInfo, jobs: pa.Table, nodes_per_rack: int | None
) -> tuple[ClusterSpec, LogCluster]:
    """The cluster of `--cluster from-log`: the log file is read again for its node lists (the job
    record and the store keep none), joined to `jobs` by job id; one line on error."""
    from headway.sim.cluster import ClusterSpecError
    from headway.sim.log_cluster import NodeListError, cluster_from_log, read_node_lists
    from headway.traces.compressed import plain_file

    if trace is None:
        fail(
            "--cluster from-log: the job store keeps no node names; give the job log file itself "
            "(headway simulate FILE --cluster from-log)"
        )
    npr = DEFAULT_NODES_PER_RACK if nodes_per_rack is None else nodes_per_rack
    try:
        with plain_file(trace) as plain:
            try:
                lists = read_node_lists(plain, info.format)
            except NodeListError as e:  # as BadInputError, plain_file names the log, not its gunzipped copy
                raise BadInputError(str(e)) from None
        found = cluster_from_log(jobs, lists, npr, label=str(trace))
    except (BadInputError, ClusterSpecError) as e:
        fail(str(e))
    except (OSError, UnicodeError) as e:
        fail(f"{trace}: cannot read: {e}")
    return found.spec, found


def report_log_cluster(found: LogCluster | None) -> None:
    """What `--cluster from-log` found, on stderr before the replay (the JSON has it under cluster)."""
    if found is None:
        return
    err.print(plain(f"cluster from the log's nodes: {found.summary()} (GPUs per node: {found.rule})"))
    if found.jobs_without_nodes:
        err.print(
            plain(
                f"note: {count(found.jobs_without_nodes, 'GPU job')} name no node; they are replayed but "
                "did not size the nodes"
            )
        )
    if found.unreadable:
        err.print(
            plain(f"note: {count(found.unreadable, 'node list')} could not be read; their jobs name no node")
        )
    if found.cpu_only_nodes:
        err.print(plain(f"note: left out {count(len(found.cpu_only_nodes), 'node')} seen only with CPU jobs"))


def refuse_overwriting_inputs(path: Path, option: str, inputs: Mapping[str, Path | None]) -> None:
    """Fail when the output `path` is one of this command's input files: `--html trace.json` (a slip of
    the tab key) replaced the job log with the report, silently; a report is written again in seconds,
    a trace may be the only copy."""
    if not path.exists():
        return
    for what, given in inputs.items():
        if given is not None and given.exists() and path.samefile(given):
            fail(f"{option} {path}: is the {what} file this command reads; give another file name")


def cluster_info(spec: ClusterSpec, found: LogCluster | None = None) -> dict[str, Any]:
    """What the JSON output says about the cluster (`from_log`: what `--cluster from-log` read)."""
    sizes: dict[int, int] = {}
    for n in spec.nodes:
        sizes[n.gpus] = sizes.get(n.gpus, 0) + 1
    return {
        "nodes": len(spec.nodes),
        "racks": spec.n_racks,
        "capacity_gpus": spec.capacity_gpus,
        "gpus_per_node": {str(k): v for k, v in sorted(sizes.items())},
        "description": spec.describe(),
        "from_log": found.as_dict() if found is not None else None,
    }


# ------------------------------------------------------------------------------------------- reference


@dataclass(frozen=True, slots=True)
class RefFigure:
    policy: str
    load: str
    metric: str
    value: float


def helios_reference() -> list[RefFigure]:
    """The Helios simulator's figures on the Philly sample (package data, with its source in the file)."""
    text = importlib.resources.files("headway.data").joinpath("helios_philly_reference.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    return [RefFigure(r["policy"], r["load"], r["metric"], float(r["value"])) for r in rows]


def reference_for(load: float | None) -> list[RefFigure]:
    label = "natural" if load is None else f"{load:g}"
    if label != "natural":
        label = f"{float(label):.1f}"
    return [f for f in helios_reference() if f.load == label]


def _with_copies(jobs: pa.Table, copies: int) -> pa.Table:
    from headway.sim.run import copies_of

    return copies_of(jobs, copies)


def _copies_text(copies: int) -> str:
    return f", each replayed {copies} times" if copies > 1 else ""


# ------------------------------------------------------------------------------------------- formatting


def fmt_seconds(s: float | None) -> str:
    """Compact durations for narrow tables: 45s, 12.5m, 3.2h, 5.10d."""
    if s is None:
        return "-"
    a = abs(s)
    if a < 120:
        return f"{s:.0f}s"
    if a < 7200:
        return f"{s / 60:.1f}m"
    if a < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.2f}d"


def fmt_metric(name: str, v: float | int | None) -> str:
    if v is None:
        return "-"
    if name.startswith(("time_to_success", "queue_delay", "jct", "starvation", "span")):
        return fmt_seconds(float(v))
    if name in ("utilisation", "completion_rate", "completion_rate_gpu_hours"):
        return f"{100 * float(v):.1f}%"
    if name.startswith("bounded_slowdown") or name == "jain_fairness":
        return f"{float(v):.2f}" if abs(float(v)) < 100 else f"{float(v):,.0f}"
    if name.endswith("gpu_hours"):
        x = float(v)
        return f"{x:,.0f}" if abs(x) >= 100 or x == 0 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{float(v):.3f}" if abs(float(v)) < 100 else f"{float(v):,.0f}"


# The table's columns (every metric is in --json); short headers keep it readable at 80 columns.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("time_to_success_mean", "TTS\nmean"),
    ("time_to_success_p95", "TTS\np95"),
    ("queue_delay_mean", "wait\nmean"),
    ("queue_delay_p99", "wait\np99"),
    ("utilisation", "util"),
    ("fragmented_gpu_hours", "frag\nGPU-h"),
    ("jain_fairness", "Jain"),
)


def table_baseline(metrics: Mapping[str, Any], baseline: str = BASELINE) -> str:
    """What the comparison's ratios are to: `baseline` when it ran, else the first policy."""
    return baseline if baseline in metrics or not metrics else next(iter(metrics))


def comparison_table(metrics: Mapping[str, Mapping[str, Any]], title: str, baseline: str = BASELINE) -> Table:
    """One row per policy; each cell shows the value and, under it, the ratio to the baseline (without
    multifactor in the run, the first policy: `impact,impact-oracle` then reads as the oracle's gain)."""
    from headway.sim.metrics import LOWER_IS_BETTER

    baseline = table_baseline(metrics, baseline)
    t = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_lines=True,
        caption=f"TTS: time to success; below each value: ratio to {baseline}",
        caption_justify="left",
    )
    t.add_column("policy", style="bold", no_wrap=True)
    for _, label in COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    base = metrics.get(baseline)
    for pol, m in metrics.items():
        cells = []
        for key, _ in COLUMNS:
            v, b = m.get(key), base.get(key) if base else None
            cell = fmt_metric(key, v)
            if base is not None and pol != baseline and v is not None and b not in (None, 0):
                r = float(v) / float(b)
                better = r < 1 if LOWER_IS_BETTER.get(key, True) else r > 1
                colour = "green" if better and abs(r - 1) > 0.005 else "red" if abs(r - 1) > 0.005 else "dim"
                cell += f"\n[{colour}]{r:.2f}x[/]"
            cells.append(cell)
        t.add_row(pol, *cells)
    return t


def reference_rows(
    figs: Sequence[RefFigure], metrics: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Helios figures beside ours: the same policy, and impact beside Helios QSSF, with impact's ratio to
    it (a figure to read, not a verdict: what counts as good enough is the user's call)."""
    rows: list[dict[str, Any]] = []
    for f in figs:
        ours = metrics.get(f.policy, {}).get(f.metric)
        imp = metrics.get("impact", {}).get(f.metric)
        row = {"policy": f.policy, "metric": f.metric, "load": f.load, "helios": f.value, "headway": ours}
        if f.policy == "qssf":
            row["headway_impact"] = imp
            row["impact_ratio"] = None if imp is None or not f.value else float(imp) / f.value
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------- running


def _progress(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=quiet,
    )


def _progress_callback(progress: Progress, task: Any) -> Callable[..., None]:
    """Accepts (done, total) or a fraction in [0, 1], whichever the engine reports."""

    def cb(done: float, total: float | None = None) -> None:
        if total is None:
            progress.update(task, completed=done * 1000, total=1000)
        else:
            progress.update(task, completed=done, total=total)

    return cb


def run_policies(
    jobs: pa.Table,
    spec: ClusterSpec,
    policies: Sequence[str],
    *,
    placement: str | None,
    load: float | None,
    seed: int,
    explain: Sequence[str],
    include_cpu: bool,
    quiet: bool,
    workers: int = 1,
) -> list[SimResult]:
    """One replay per policy: side by side in `workers` processes when there are several (0: as many as
    the CPUs and memory allow), else one after another in this process."""
    from headway.sim.fanout import OUT_OF_MEMORY, PolicyError, RunArgs, auto_workers, run_parallel
    from headway.sim.run import run_simulation

    n_workers = auto_workers(len(policies), jobs.num_rows) if workers == 0 else workers
    n_workers = min(n_workers, len(policies))
    results: list[SimResult] = []
    with _progress(quiet) as progress:
        # In parallel, a policy's clock starts with its first progress report, not while it queues.
        parallel = n_workers > 1
        tasks = {pol: progress.add_task(pol, total=jobs.num_rows, start=not parallel) for pol in policies}
        if parallel:
            args = RunArgs(jobs, spec, placement, load, seed, frozenset(explain), include_cpu)

            def on_progress(pol: str, done: int, total: int) -> None:
                task = tasks[pol]
                if progress.tasks[task].start_time is None:
                    progress.start_task(task)
                progress.update(task, completed=done, total=total)

            try:
                results = run_parallel(args, policies, n_workers, on_progress)
            except PolicyError as e:
                fail(f"{e.policy}: {e}")
            for pol in policies:
                progress.update(tasks[pol], completed=progress.tasks[tasks[pol]].total)
            return results
        for pol in policies:
            task = tasks[pol]
            t0 = time.perf_counter()
            try:
                res = run_simulation(
                    jobs,
                    spec,
                    policy=pol,
                    placement=placement,
                    load=load,
                    seed=seed,
                    explain=frozenset(explain),
                    include_cpu=include_cpu,
                    progress=_progress_callback(progress, task),
                )
            except (ValueError, BadInputError, RuntimeError) as e:
                fail(f"{pol}: {e}")
            except MemoryError:
                fail(f"{pol}: {OUT_OF_MEMORY}")
            if not res.wall_seconds:
                res.wall_seconds = time.perf_counter() - t0
            progress.update(task, completed=progress.tasks[task].total)
            results.append(res)
    return results


def _wait_segments(recs: Sequence[WaitRecord]) -> list[list[WaitRecord]]:
    """Consecutive passes with the same tier and the same reservation state, as one stretch each: the
    factors in a reason change at every pass (waited time, fair share), so a row per pass would bury
    the few changes that matter."""
    segs: list[list[WaitRecord]] = []
    key = None
    for w in recs:
        k = (w.reason.split(";", 1)[0], w.reservation_start is not None)
        if segs and k == key:
            segs[-1].append(w)
        else:
            segs.append([w])
            key = k
    return segs


def _stretch_rows(recs: Sequence[WaitRecord], most: int = 40) -> list[tuple[str, ...]]:
    """The explain table's rows: from, to, passes, rank, reservation, reason; past `most` stretches the
    first and the last ones (how the wait began, and what ended it) around a `...` row."""
    segs: list[list[WaitRecord]] = _wait_segments(recs)
    cut = 0
    if len(segs) > most:
        head = most * 3 // 8
        cut = len(segs) - most
        segs = [*segs[:head], [], *segs[head + cut :]]
    rows: list[tuple[str, ...]] = []
    for seg in segs:
        if not seg:
            rows.append(("...", "", "", "", "", f"{cut} more stretches"))
            continue
        a, b = seg[0], seg[-1]
        rows.append(
            (
                fmt_seconds(a.t),
                fmt_seconds(b.t),
                str(len(seg)),
                f"{a.rank}/{a.of}" if len(seg) == 1 else f"{a.rank}/{a.of}->{b.rank}/{b.of}",
                fmt_seconds(b.reservation_start) if b.reservation_start is not None else "-",
                b.reason,
            )
        )
    return rows


def _check_explain(jobs: pa.Table, job_id: str, label: str) -> None:
    """Fail unless `job_id` names one job: the replay records waits by job id, so the same id in two
    sources of a store (two clusters both have a job 17) gave one table of both jobs' passes."""
    import pyarrow.compute as pc

    rows = jobs.filter(pc.equal(jobs.column("job_id"), job_id))
    if rows.num_rows == 0:
        fail(f"--explain: no job {job_id!r} in {label}")
    sources = sorted({str(s) for s in rows.column("source").to_pylist()})
    if len(sources) > 1:
        fail(
            f"--explain: job {job_id!r} is in {len(sources)} sources of {label} ({', '.join(sources)}), "
            "each a different job; --source NAME picks one"
        )


def _left_out(jobs: pa.Table, results: Sequence[SimResult], job_id: str) -> str | None:
    """Why `job_id` is not in the replay (None when it is)."""
    import pyarrow.compute as pc

    from headway.sim.run import CPU_ONLY, NEVER_RAN, NO_GPUS, NO_SUBMIT

    if not results or pc.any(pc.equal(results[0].jobs.column("job_id"), job_id)).as_py():
        return None
    for line in results[0].excluded:
        if line.startswith(f"{job_id}: "):
            return line[len(job_id) + 2 :]
    # The last listing: a job listed again is replayed from its last listing (as the store keeps it), so
    # that one is what was left out, not an earlier listing that may have run.
    row = jobs.filter(pc.equal(jobs.column("job_id"), job_id)).to_pylist()[-1]
    if row["submit_time"] is None:
        return NO_SUBMIT
    if row["gpus"] is None:
        return NO_GPUS
    if row["start_time"] is None or row["end_time"] is None:
        return NEVER_RAN
    return CPU_ONLY + " (--include-cpu adds such jobs)"


def _left_out_text(counts: Mapping[str, int]) -> str:
    """`897 never started or never ended in the trace, 1,052 CPU-only (0 GPUs)`."""
    return ", ".join(f"{n:,} {reason}" for reason, n in counts.items())


def _cpu_hint(counts: Mapping[str, int], include_cpu: bool) -> str:
    from headway.sim.run import CPU_ONLY

    return "; --include-cpu replays CPU-only jobs too" if counts.get(CPU_ONLY) and not include_cpu else ""


def _print_left_out(counts: Mapping[str, int], excluded: Sequence[str], to: Console | None = None) -> None:
    """The footer that says which jobs were not replayed, and why (on stdout unless `to` says otherwise:
    with --json, stdout holds the JSON alone)."""
    if not counts:
        return
    con = to or out
    con.print(f"[yellow]left out of the simulation:[/] {_left_out_text(counts)}", markup=True)
    for line in excluded[:5]:
        con.print(f"  {printable(line)}", markup=False)
    if len(excluded) > 5:
        con.print(f"  ... and {len(excluded) - 5:,} more larger than the cluster (all in --json)")


def _explain_tables(results: Sequence[SimResult], job_id: str) -> tuple[list[Table], dict[str, Any]]:
    import pyarrow.compute as pc

    tables: list[Table] = []
    data: dict[str, Any] = {}
    for r in results:
        recs = r.explain.get(job_id, [])
        row = r.jobs.filter(pc.equal(r.jobs.column("job_id"), job_id)).to_pylist()
        job = row[0] if row else {}
        wait = None
        if job.get("start") is not None and job.get("submit") is not None:
            wait = float(job["start"]) - float(job["submit"])
        data[r.policy] = {
            "job": job,
            "queue_delay": wait,
            "passes": [
                {
                    "t": w.t,
                    "rank": w.rank,
                    "of": w.of,
                    "score": w.score,
                    "reason": w.reason,
                    "reservation_start": w.reservation_start,
                }
                for w in recs
            ],
        }
        preempted = int(job.get("preemptions") or 0)
        held_back = None  # submit to end, less its own runtime: every wait, and restart penalties
        if job.get("end") is not None and job.get("runtime") is not None and wait is not None:
            held_back = float(job["end"]) - float(job["submit"]) - float(job["runtime"])
        data[r.policy]["preemptions"] = preempted
        data[r.policy]["waited_in_all"] = held_back
        started = f"started after {fmt_seconds(wait)}"
        if preempted:
            started = (
                f"first started after {fmt_seconds(wait)}, preempted {preempted} time(s), "
                f"{fmt_seconds(held_back)} waiting or restarting in all"
            )
        title = (
            f"{r.policy}: job {job_id} submitted at {fmt_seconds(job.get('submit'))}, "
            f"{started} ({count(len(recs), 'scheduling pass', 'scheduling passes')} while it waited)"
        )
        t = Table(  # the job id as given to --explain, never as markup
            title=safe_escape(title),
            caption="one row per stretch of passes in the same tier and reservation state",
        )
        for c in ("from", "to", "passes", "rank", "resv. at"):
            t.add_column(c, justify="right", no_wrap=True)
        t.add_column("why (its last pass)", justify="left", ratio=1, min_width=20)
        for row in _stretch_rows(recs):
            t.add_row(*row[:-1], plain(row[-1]))
        tables.append(t)
    return tables, data


def simulate(
    trace: TraceArg = None,
    fmt: FormatOpt = "auto",
    db: DbOpt = None,
    wait: WaitOpt = DEFAULT_WAIT,
    nodes: NodesOpt = None,
    gpus_per_node: GpnOpt = None,
    nodes_per_rack: NprOpt = None,
    cluster: ClusterOpt = None,
    nodes_file: NodesFileOpt = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Comma-separated: " + ", ".join(ALL_POLICIES) + ".")
    ] = DEFAULT_POLICIES,
    placement: PlacementOpt = None,
    load: Annotated[
        float | None,
        typer.Option(
            help="Rescale inter-arrival times so offered GPU-hours / capacity = X "
            "(default: the trace's own arrivals).",
            show_default=False,
        ),
    ] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
    html_out: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write a self-contained HTML report (charts) here.", show_default=False
        ),
    ] = None,
    explain: Annotated[
        str | None,
        typer.Option(
            help="Show why this job waited under each policy (rank, reasons, reservation).",
            show_default=False,
        ),
    ] = None,
    include_cpu: IncludeCpuOpt = False,
    copies: CopiesOpt = 1,
    reference: Annotated[
        str,
        typer.Option(
            help="Print a peer simulator's figures beside ours: helios-philly (the Helios artifact's "
            "figures for the Philly sample, at the natural load and at load 1.0), or none."
        ),
    ] = "none",
    tz: Annotated[str | None, typer.Option(help="Timezone of naive timestamps in TRACE.")] = None,
    mapping: MappingOpt = None,
    source: SourceOpt = None,
    workers: Annotated[
        int,
        typer.Option(
            help="Replay the policies side by side in this many processes; 0 (default): one per "
            "policy, up to the usable CPUs and what memory allows; 1: one after another.",
            min=0,
        ),
    ] = 0,
) -> None:
    """Replay a job log under each policy on a model cluster and compare time-to-success, waiting,
    utilisation, fragmentation and fairness (one row per policy, ratios to multifactor)."""
    from headway.sim.metrics import compute

    policies = _parse_policies(policy)
    if placement is not None and placement not in PLACEMENTS:
        fail(f"--placement: choose one of {', '.join(PLACEMENTS)}")
    if reference not in REFERENCES:
        fail(f"--reference: choose one of {', '.join(REFERENCES)}")
    if load is not None and not 0 < load <= 10:
        fail(f"--load: {load:g} is out of range; offered load must be in (0, 10]")
    if html_out is not None:
        check_output_file(html_out, "--html")
        refuse_overwriting_inputs(
            html_out,
            "--html",
            {"TRACE": trace, "--mapping": mapping, "--cluster": cluster, "--nodes-file": nodes_file},
        )
    jobs, info = load_jobs(trace, fmt, db, tz, mapping, source, wait)
    spec, found = _cluster_for(trace, info, jobs, nodes, gpus_per_node, nodes_per_rack, cluster, nodes_file)
    jobs = _with_copies(jobs, copies)
    if explain is not None:
        _check_explain(jobs, explain, info.label)
    if not as_json:
        info.report()
        report_log_cluster(found)
        err.print(
            plain(
                f"{info.label}: {count(info.jobs, 'job')} ({info.format}){_copies_text(copies)}; "
                f"simulating {', '.join(policies)}"
            )
        )
    results = run_policies(
        jobs,
        spec,
        policies,
        placement=placement,
        load=load,
        seed=seed,
        explain=[explain] if explain else [],
        include_cpu=include_cpu,
        quiet=as_json,
        workers=workers,
    )
    if results and results[0].jobs.num_rows == 0:
        _print_left_out(results[0].excluded_counts, results[0].excluded, err if as_json else out)
        fail(
            f"{info.label}: every job was left out of the simulation (see above); nothing to compare"
            + _cpu_hint(results[0].excluded_counts, include_cpu)
        )
    metrics = {r.policy: compute(r) for r in results}
    capacity = results[0].capacity_gpus if results else float(spec.capacity_gpus)
    figs = reference_for(load) if reference == "helios-philly" else []
    if reference == "helios-philly" and not figs and not as_json:
        err.print("note: the Helios reference has figures at the natural load and at load 1.0 only")
    excluded = results[0].excluded if results else []
    sizing = _load_check(jobs, spec, include_cpu)
    load_note = sizing.note(_cluster_option(cluster, nodes_file)) if load is None else None
    doc: dict[str, Any] = {
        "policies": metrics,
        "ratios_to_multifactor": _ratios(metrics),
        # What the table's second lines show: ratios to multifactor, or without it to the first policy
        # (`--policy impact,impact-oracle`: the oracle's gain over impact).
        "ratios": _table_ratios(metrics),
        "cluster": cluster_info(spec, found),
        # The replayed jobs' offered load on this cluster at their own arrivals, whatever --load says,
        # and (outside 0.5-1.5) a node count for a load near 0.9; `note` is the line the table prints.
        "load_check": {**sizing.as_dict(), "note": load_note},
        "trace": {
            **info.as_dict(),
            "load": load if load is not None else "natural",
            "offered_load": results[0].load if results else None,
            "copies": copies,
        },
        "placement": {r.policy: r.placement for r in results},
        "excluded": excluded,
        "excluded_counts": results[0].excluded_counts if results else {},
        "reference": {"name": "helios-philly", "rows": reference_rows(figs, metrics)} if figs else None,
    }
    explain_tables: list[Table] = []
    left_out = _left_out(jobs, results, explain) if explain else None
    if left_out is not None:
        doc["explain"] = {"job_id": explain, "left_out": left_out}
    elif explain:
        explain_tables, doc["explain"] = _explain_tables(results, explain)
    if as_json:
        print_json(doc)
        if html_out is not None:
            _write_html(html_out, results, metrics, info, capacity, load, figs, load_note)
        return
    load_txt = "natural arrivals" if load is None else f"load {load:g}"
    offered = results[0].load if results else float("nan")
    print_table(
        comparison_table(
            metrics,
            safe_escape(  # the trace's file name as written, never as markup
                f"{info.short}: {count(info.jobs, 'job')}, {capacity:g} GPUs, {load_txt} "
                + _offered_text(offered, sizing)
            ),
        )
    )
    _print_left_out(doc["excluded_counts"], excluded)
    if load_note:
        out.print(f"[yellow]note:[/] {safe_escape(load_note)}", markup=True)
    if figs:
        print_table(_reference_table(doc["reference"]["rows"], load_txt))
    if left_out is not None:
        why = safe_escape(f"job {explain} was left out of the simulation: {left_out}")
        out.print(f"[yellow]--explain:[/] {why}")
    for t in explain_tables:
        print_table(t)
    if html_out is not None:  # last: a write that fails still leaves the results on the screen
        _write_html(html_out, results, metrics, info, capacity, load, figs, load_note)
        out.print(plain(f"wrote {html_out}"))


def _ratios(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    from headway.sim.metrics import ratios

    return ratios(metrics, BASELINE) if BASELINE in metrics else {}


def _table_ratios(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    from headway.sim.metrics import ratios

    base = table_baseline(metrics) if metrics else None
    return {"baseline": base, "policies": ratios(metrics, base) if base is not None else {}}


def _reference_table(rows: Sequence[Mapping[str, Any]], load_txt: str) -> Table:
    t = Table(title=f"Beside a peer: the Helios artifact's simulator on the Philly sample, {load_txt}")
    for c in ("policy", "metric", "Helios", "headway (same policy)", "headway impact", "impact / Helios"):
        t.add_column(c, justify="left" if c in ("policy", "metric") else "right")
    for r in rows:
        ratio = r.get("impact_ratio")
        t.add_row(
            r["policy"],
            r["metric"],
            fmt_seconds(r["helios"]),
            fmt_seconds(r["headway"]),
            fmt_seconds(r.get("headway_impact")) if "headway_impact" in r else "",
            "" if ratio is None else f"{ratio:.2f}x",
        )
    return t


def _cluster_for(
    trace: Path | None,
    info: TraceInfo,
    jobs: pa.Table,
    nodes: int | None,
    gpus_per_node: int | None,
    nodes_per_rack: int | None,
    cluster: Path | None,
    nodes_file: Path | None,
) -> tuple[ClusterSpec, LogCluster | None]:
    """The replay's cluster from the flags, a file, or (`--cluster from-log`) the log's own nodes."""
    if not wants_log_cluster(cluster):
        return build_cluster(nodes, gpus_per_node, nodes_per_rack, cluster, nodes_file), None
    if nodes_file is not None:
        fail("give --cluster or --nodes-file, not both")
    given = [f for f, v in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node)) if v is not None]
    if given:
        fail(f"{', '.join(given)}: not used with --cluster from-log, which takes the nodes from the log")
    return log_cluster(trace, info, jobs, nodes_per_rack)


def _cluster_option(cluster: Path | None, nodes_file: Path | None) -> str | None:
    """The option that gave the cluster, which a suggested `--nodes` replaces (None: the flags)."""
    if wants_log_cluster(cluster):
        return "--cluster from-log"
    if cluster is not None:
        return "--cluster"
    return "--nodes-file" if nodes_file is not None else None


def _load_check(jobs: pa.Table, spec: ClusterSpec, include_cpu: bool) -> LoadCheck:
    from headway.sim.sizing import check_load

    return check_load(jobs, spec, include_cpu=include_cpu)


def _offered_text(offered: float, sizing: LoadCheck) -> str:
    """The title's offered load: over the arrivals (what --load sets), or, for jobs that all arrived in
    the same second, over the log's first submission to its last end."""
    from headway.sim.sizing import LOG_SPAN

    if math.isfinite(offered):
        return f"(offered {offered:.3g})"
    if sizing.offered_load is not None and sizing.window == LOG_SPAN:
        return f"(offered {sizing.offered_load:.3g} from {LOG_SPAN}: all submitted at once)"
    return "(no offered load: no arrival rate, or no GPU-hours)"


def _write_html(
    path: Path,
    results: Sequence[SimResult],
    metrics: Mapping[str, Mapping[str, Any]],
    info: TraceInfo,
    capacity: float,
    load: float | None,
    figs: Sequence[RefFigure],
    load_note: str | None = None,
) -> None:
    from headway.sim.report_html import render

    notes = [f"Helios {f.policy} {f.metric} at load {f.load}: {f.value:,.0f} s" for f in figs]
    if load_note:
        notes.append(load_note[0].upper() + load_note[1:])
    replayed = results[0].jobs.num_rows if results else 0
    if results and results[0].excluded_counts:
        notes.append(f"Left out of the simulation: {_left_out_text(results[0].excluded_counts)}.")
    offered = results[0].load if results else float("nan")
    arrivals = "natural arrivals" if load is None else f"load {load:g}"
    if math.isfinite(offered):
        arrivals += f" (offered {offered:.3g})"
    text = render(
        results,
        metrics,
        title=f"headway simulate: {info.short}",
        subtitle=f"{count(replayed, 'job')} replayed"
        + (f" of the {info.jobs:,} read" if replayed != info.jobs else "")
        + f", {capacity:,g} GPUs, {arrivals}",
        notes=notes,
    )
    try:
        with replaced_atomically(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{path}: cannot write: {e.strerror}")


# ---------------------------------------------------------------------------------------------- sweep

SWEEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("time_to_success_mean", "TTS\nmean"),
    ("time_to_success_p95", "TTS\np95"),
    ("queue_delay_p99", "wait\np99"),
    ("bounded_slowdown_mean", "BSLD\nmean"),
    ("utilisation", "util"),
    ("jain_fairness", "Jain"),
)
SWEEP_METRICS: tuple[str, ...] = tuple(m for m, _ in SWEEP_COLUMNS)


def sweep(
    trace: TraceArg = None,
    fmt: FormatOpt = "auto",
    db: DbOpt = None,
    wait: WaitOpt = DEFAULT_WAIT,
    nodes: NodesOpt = None,
    gpus_per_node: GpnOpt = None,
    nodes_per_rack: NprOpt = None,
    cluster: ClusterOpt = None,
    nodes_file: NodesFileOpt = None,
    policy: Annotated[
        str, typer.Option("--policy", "-p", help="Comma-separated: " + ", ".join(ALL_POLICIES) + ".")
    ] = DEFAULT_POLICIES,
    load: Annotated[
        str, typer.Option(help="Comma-separated offered loads; `natural` keeps the trace's arrivals.")
    ] = "0.6,0.8,1.0",
    seeds: Annotated[
        str,
        typer.Option(
            help="Comma-separated seeds of the predictor's training; each policy that reads predictions "
            "runs once per seed, the others once per load (their replay does not depend on it)."
        ),
    ] = "0,1,2",
    placement: PlacementOpt = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            help="Address of a running Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: a local "
            "cluster of --workers processes).",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Worker processes of the local Dask cluster.", min=1)] = 2,
    include_cpu: IncludeCpuOpt = False,
    copies: CopiesOpt = 1,
    as_json: JsonOpt = False,
    tz: Annotated[str | None, typer.Option(help="Timezone of naive timestamps in TRACE.")] = None,
    mapping: MappingOpt = None,
    source: SourceOpt = None,
) -> None:
    """Run a policy x load x seed grid on Dask and print the median over seeds per policy and load,
    with the min-max spread."""
    from headway.sim.sweep import SweepError, grid, iter_rows, run_grid, summarise

    policies = _parse_policies(policy)
    loads = _parse_loads(load)
    seed_list = _parse_seeds(seeds)
    if placement is not None and placement not in PLACEMENTS:
        fail(f"--placement: choose one of {', '.join(PLACEMENTS)}")
    if scheduler is not None and not scheduler.startswith(("tcp://", "tls://", "ucx://", "inproc://")):
        fail(f"--scheduler: expected an address like tcp://HOST:PORT, got {scheduler!r}")
    jobs, info = load_jobs(trace, fmt, db, tz, mapping, source, wait)
    spec, found = _cluster_for(trace, info, jobs, nodes, gpus_per_node, nodes_per_rack, cluster, nodes_file)
    jobs = _with_copies(jobs, copies)
    cells = grid(policies, loads, seed_list)
    if not as_json:
        info.report()
        report_log_cluster(found)
        where = scheduler or f"a local Dask cluster of {count(workers, 'process', 'processes')}"
        err.print(
            plain(
                f"{info.label}: {count(info.jobs, 'job')}{_copies_text(copies)}; "
                f"{count(len(cells), 'simulation')} on {where}"
            )
        )
    t0 = time.perf_counter()
    with _progress(as_json) as progress:
        task = progress.add_task("sweep", total=len(cells))
        try:
            results = run_grid(
                jobs,
                spec,
                cells,
                placement=placement,
                include_cpu=include_cpu,
                scheduler=scheduler,
                workers=workers,
                on_done=lambda _r: progress.advance(task),
            )
        except (OSError, TimeoutError) as e:
            progress.stop()
            fail(f"dask: {e}")
        except SweepError as e:
            progress.stop()
            fail(str(e))
        except KeyboardInterrupt:
            progress.stop()
            err.print("stopped: the sweep's simulations were cancelled")
            raise typer.Exit(130) from None
    wall = time.perf_counter() - t0
    summary = summarise(results, SWEEP_METRICS)
    excluded = list(results[0].excluded) if results else []  # the same in every cell
    counts = dict(results[0].excluded_counts) if results else {}
    if results and all(not r.metrics.get("jobs") for r in results):
        fail(
            f"{info.label}: every job was left out of the simulation ({_left_out_text(counts)}); "
            "nothing to compare" + _cpu_hint(counts, include_cpu)
        )
    if as_json:
        print_json(
            {
                "trace": info.as_dict(),
                "cluster": cluster_info(spec, found),
                "excluded": excluded,
                "excluded_counts": counts,
                "grid": {
                    "policies": policies,
                    "loads": [c if c is not None else "natural" for c in loads],
                    "seeds": seed_list,
                    "copies": copies,
                },
                "rows": list(iter_rows(summary)),
                "wall_seconds": wall,
            }
        )
        return
    t = Table(
        title=safe_escape(f"{info.short}: median over {len(seed_list)} seeds"),
        caption="below each median: half the min-max range over seeds, as % of the median (the seed "
        "reaches only the predictor's training: a policy that reads no predictions runs once)",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_lines=True,
    )
    t.add_column("load", no_wrap=True)
    t.add_column("policy", style="bold", no_wrap=True)
    for _, label in SWEEP_COLUMNS:
        t.add_column(label, justify="right", no_wrap=True)
    for (pol, ld), row in summary.items():
        cells_txt = []
        for m, _ in SWEEP_COLUMNS:
            s = row[m]
            txt = fmt_metric(m, s.median)
            if s.n > 1 and s.low is not None and s.high is not None and s.median:
                txt += f"\n[dim]±{50 * (s.high - s.low) / abs(s.median):.0f}%[/]"
            elif s.n == 1 and len(seed_list) > 1:
                txt += "\n[dim]one run[/]"
            cells_txt.append(txt)
        t.add_row(ld, pol, *cells_txt)
    print_table(t)
    _print_left_out(counts, excluded)
    out.print(f"{len(cells)} simulations in {wall:.1f} s")


# ---------------------------------------------------------------------------------------------- synth

SYNTH_FORMATS: tuple[str, ...] = ("parquet", "csv", "sacct")
SYNTH_BYTES_PER_JOB = 400  # peak memory of `synth` per job (measured: 1M jobs, 0.4 GB above the start)


def synth(
    jobs: Annotated[int, typer.Option("--jobs", "-n", help="How many jobs to generate.", min=1)],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="File to write.")],
    seed: Annotated[
        int, typer.Option(help="Random seed: the same seed gives the same trace.", min=0, max=2**32 - 1)
    ] = 0,
    users: Annotated[int, typer.Option(help="How many users submit jobs.", min=1)] = 160,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="parquet (job schema; `headway simulate FILE` reads it), csv (plus FILE.mapping.toml for "
            "`headway ingest --format csv --mapping`), or sacct (`headway ingest --format sacct --tz UTC`).",
        ),
    ] = "parquet",
    profile: Annotated[
        str, typer.Option(help="Calibration: philly (Philly sample statistics) or alibaba (early failures).")
    ] = "philly",
    as_json: JsonOpt = False,
) -> None:
    """Generate a synthetic job log: heavy-tailed runtimes, per-user failure propensities, early
    failures and submission bursts, calibrated to the public Philly and Alibaba traces."""
    from headway.sim.synth import PROFILES, generate, write_sacct

    if fmt not in SYNTH_FORMATS:
        fail(f"--format: choose one of {', '.join(SYNTH_FORMATS)}")
    if profile not in PROFILES:
        fail(f"--profile: choose one of {', '.join(PROFILES)}")
    if fmt == "sacct" and PROFILES[profile].fractional_share > 0:
        # Up front, not after generating: whether a trace drew a GPU share depended on --seed and --jobs
        # (`-n 2 --seed 0` passed, `--seed 1` failed), and a million jobs took their time to fail.
        fail(
            f"--format sacct: --profile {profile} gives jobs shares of a GPU, which sacct cannot express; "
            "write parquet or csv instead"
        )
    check_output_file(out_path, "--out")
    if fmt == "csv":
        check_output_file(mapping_path(out_path), "--out's mapping file")
    t0 = time.perf_counter()
    try:
        with err.status(f"generating {jobs:,} jobs", spinner="dots") if not as_json else _Null():
            table = generate(jobs, seed, users=users, profile=profile)
    except MemoryError:  # numpy refuses the arrays up front: one line, not a traceback
        fail(
            f"--jobs {jobs:,}: not enough memory to generate that many jobs (a million take about "
            f"{SYNTH_BYTES_PER_JOB * 10**6 / 2**30:.1f} GiB, so these need about "
            f"{SYNTH_BYTES_PER_JOB * jobs / 2**30:,.0f} GiB); generate fewer"
        )
    gen_s = time.perf_counter() - t0
    try:
        with replaced_atomically(out_path) as tmp:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                pq.write_table(table, tmp, compression="zstd")
            elif fmt == "csv":
                with replaced_atomically(mapping_path(out_path)) as tmp_mapping:
                    write_csv_with_mapping(table, tmp, tmp_mapping)
            else:
                write_sacct(table, str(tmp))
    except ValueError as e:
        fail(f"{out_path}: {e}")
    except OSError as e:
        fail(f"{out_path}: cannot write: {e.strerror}")
    import pyarrow.compute as pc

    states = {str(k): int(v) for k, v in zip(*_value_counts(pc, table.column("state")), strict=True)}
    summary = {
        "out": str(out_path),
        "format": fmt,
        "jobs": table.num_rows,
        "seed": seed,
        "users": users,
        "profile": profile,
        "states": states,
        "generate_seconds": gen_s,
        "ingest": _ingest_hint(fmt, out_path),
    }
    if as_json:
        print_json(summary)
        return
    wrote = f"wrote {count(table.num_rows, 'job')} to {out_path} ({fmt})"
    out.print(plain(f"{wrote} in {gen_s:.2f} s to generate"))
    out.print("states: " + ", ".join(f"{k} {v:,}" for k, v in sorted(states.items())))
    out.print(plain(summary["ingest"]))


def _value_counts(pc: Any, col: Any) -> tuple[list[Any], list[Any]]:
    vc = pc.value_counts(col)
    return vc.field("values").to_pylist(), vc.field("counts").to_pylist()


def _ingest_hint(fmt: str, path: Path) -> str:
    if fmt == "parquet":
        return f"simulate it directly: headway simulate {path}"
    if fmt == "sacct":
        return f"ingest it: headway ingest --format sacct --tz UTC {path}"
    return f"ingest it: headway ingest --format csv --mapping {mapping_path(path)} {path}"


def mapping_path(csv_path: Path) -> Path:
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


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
