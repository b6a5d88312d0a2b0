"""`headway simulate`, `headway sweep`, `headway synth`: replay a trace under policies and compare them.

Heavy libraries (plotly, dask, the engine) are imported inside the commands so `headway --help` stays fast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
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
from headway.policy.placement import PLACEMENTS
from headway.policy.registry import DEFAULT_COMPARISON, POLICIES, knobs_for
from headway.sim.compare import (
    SWEEP_METRICS,
    RefFigure,
    comparison_table,
    ratios_to_baseline,
    reference_for,
    reference_rows,
    reference_table,
    sweep_table,
    table_ratios,
)
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP
from headway.traces.base import BadInputError

if TYPE_CHECKING:
    import pyarrow as pa

    from headway.sim.cluster import ClusterSpec
    from headway.sim.log_cluster import LogCluster
    from headway.sim.result import SimResult
    from headway.sim.sizing import LoadCheck

# What --policy offers, in the registry's order (policy/registry.py), and what it compares by default.
ALL_POLICIES: tuple[str, ...] = tuple(POLICIES)
DEFAULT_POLICIES = ",".join(DEFAULT_COMPARISON)
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


def _with_copies(jobs: pa.Table, copies: int) -> pa.Table:
    from headway.sim.run import copies_of

    return copies_of(jobs, copies)


def _copies_text(copies: int) -> str:
    return f", each replayed {copies} times" if copies > 1 else ""


# ------------------------------------------------------------------------------------------- formatting


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
    policy_options: dict[str, object] | None = None,
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
            args = RunArgs(
                jobs, spec, placement, load, seed, frozenset(explain), include_cpu, dict(policy_options or {})
            )

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
                    policy_options=knobs_for(pol, dict(policy_options or {})),
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


def _print_left_out(counts: Mapping[str, int], excluded: Sequence[str], to: Console | None = None) -> None:
    """The footer that says which jobs were not replayed, and why (on stdout unless `to` says otherwise:
    with --json, stdout holds the JSON alone)."""
    if not counts:
        return
    con = to or out
    from headway.sim.left_out import left_out_text

    con.print(f"[yellow]left out of the simulation:[/] {left_out_text(counts)}", markup=True)
    for line in excluded[:5]:
        con.print(f"  {printable(line)}", markup=False)
    if len(excluded) > 5:
        con.print(f"  ... and {len(excluded) - 5:,} more larger than the cluster (all in --json)")


def _explain_tables(results: Sequence[SimResult], job_id: str) -> tuple[list[Table], dict[str, Any]]:
    """The --explain tables (one per policy) and their JSON, from sim/explain.py's stories."""
    from headway.sim.explain import explain_job

    tables: list[Table] = []
    data: dict[str, Any] = {}
    for story in explain_job(results, job_id):
        data[story.policy] = story.data
        t = Table(  # the job id as given to --explain, never as markup
            title=safe_escape(story.title),
            caption="one row per stretch of passes in the same tier and reservation state",
        )
        for c in ("from", "to", "passes", "rank", "resv. at"):
            t.add_column(c, justify="right", no_wrap=True)
        t.add_column("why (its last pass)", justify="left", ratio=1, min_width=20)
        for row in story.rows:
            t.add_row(*row[:-1], plain(row[-1]))
        tables.append(t)
    return tables, data


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
    """The --html report, written atomically; one line on error."""
    from headway.sim.writers import html_report

    text = html_report(
        results,
        metrics,
        trace_name=info.short,
        jobs_read=info.jobs,
        capacity=capacity,
        load=load,
        figs=figs,
        load_note=load_note,
    )
    try:
        with replaced_atomically(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
    except OSError as e:
        fail(f"{path}: cannot write: {e.strerror}")


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
    class_mix: Annotated[
        str | None,
        typer.Option(
            help="Draw priority classes and preemptible flags onto the jobs, seeded by --seed: "
            "`default` (5% urgent gangs of 16-64 GPUs, 20% preemptible low jobs) or "
            "CLASS=PCT%\\[@MIN-MAX]\\[:preemptible],... (docs/simulate.md). Default: the trace's own.",
            show_default=False,
            metavar="SPEC",
        ),
    ] = None,
    no_preemption: Annotated[
        bool,
        typer.Option(
            "--no-preemption", help="Replay impact without preempting: what its preemption is worth."
        ),
    ] = False,
    fail_fast: Annotated[
        bool,
        typer.Option(
            "--fail-fast/--no-fail-fast",
            help="impact's fail-fast lane: jobs likely to fail early get a short probe first "
            "(docs/policies.md).",
        ),
    ] = False,
) -> None:
    """Replay a job log under each policy on a model cluster and compare time-to-success, waiting,
    utilisation, fragmentation and fairness (one row per policy, ratios to multifactor)."""
    from headway.sim.explain import explain_problem
    from headway.sim.left_out import cpu_hint, why_left_out
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
    mix = None
    if class_mix is not None:
        from headway.sim.classmix import apply_mix

        try:
            jobs, mix = apply_mix(jobs, class_mix, seed)
        except ValueError as e:
            fail(str(e))
    if explain is not None and (problem := explain_problem(jobs, explain, info.label)) is not None:
        fail(problem)
    if not as_json:
        info.report()
        report_log_cluster(found)
        err.print(
            plain(
                f"{info.label}: {count(info.jobs, 'job')} ({info.format}){_copies_text(copies)}; "
                f"simulating {', '.join(policies)}"
            )
        )
        if mix is not None:
            got = ", ".join(f"{k} {v:,}" for k, v in sorted(mix.counts.items()))
            short = "".join(f"; {k} got {v:,} (fewer jobs fit its range)" for k, v in mix.short.items())
            pre = f"{mix.preemptible:,} preemptible"
            err.print(plain(f"class mix {mix.spec}, seed {mix.seed}: {got}; {pre}{short}"))
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
        policy_options={"preemption": not no_preemption, "fail_fast": fail_fast},
    )
    if results and results[0].jobs.num_rows == 0:
        _print_left_out(results[0].excluded_counts, results[0].excluded, err if as_json else out)
        fail(
            f"{info.label}: every job was left out of the simulation (see above); nothing to compare"
            + cpu_hint(results[0].excluded_counts, include_cpu)
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
        "ratios_to_multifactor": ratios_to_baseline(metrics),
        # What the table's second lines show: ratios to multifactor, or without it to the first policy
        # (`--policy impact,impact-oracle`: the oracle's gain over impact).
        "ratios": table_ratios(metrics),
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
        "class_mix": mix.as_dict() if mix is not None else None,
        "preemption": not no_preemption,
        "fail_fast": fail_fast,
    }
    explain_tables: list[Table] = []
    left_out = why_left_out(jobs, results, explain) if explain else None
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
        print_table(reference_table(doc["reference"]["rows"], load_txt))
    if left_out is not None:
        why = safe_escape(f"job {explain} was left out of the simulation: {left_out}")
        out.print(f"[yellow]--explain:[/] {why}")
    for t in explain_tables:
        print_table(t)
    if html_out is not None:  # last: a write that fails still leaves the results on the screen
        _write_html(html_out, results, metrics, info, capacity, load, figs, load_note)
        out.print(plain(f"wrote {html_out}"))


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


# ---------------------------------------------------------------------------------------------- sweep


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
    from headway.sim.left_out import cpu_hint, left_out_text
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
            f"{info.label}: every job was left out of the simulation ({left_out_text(counts)}); "
            "nothing to compare" + cpu_hint(counts, include_cpu)
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
    print_table(
        sweep_table(summary, safe_escape(f"{info.short}: median over {len(seed_list)} seeds"), len(seed_list))
    )
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
    from headway.sim import writers
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
        check_output_file(writers.mapping_path(out_path), "--out's mapping file")
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
                with replaced_atomically(writers.mapping_path(out_path)) as tmp_mapping:
                    writers.write_csv_with_mapping(table, tmp, tmp_mapping)
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
        "ingest": writers.ingest_hint(fmt, out_path),
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


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
