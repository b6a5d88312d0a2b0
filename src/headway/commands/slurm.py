"""`headway slurm sync` and `headway slurm why`: impact ranking fed into a real Slurm's SiteFactor."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.columns import Columns
from rich.table import Table
from rich.text import Text

from headway.console import err, fail, out, plain, print_json, print_table, printable, safe_escape

if TYPE_CHECKING:
    from headway.slurm.queue import SprioLine
    from headway.slurm.sync import PassReport

app = typer.Typer(
    help="Run headway next to Slurm: rank pending jobs by impact and write it into Slurm's own priority "
    "(SiteFactor), so backfill, QOS and reservations keep working and `sprio` shows headway's part.",
    no_args_is_help=True,
)

DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="Job store holding this cluster's history (default ./headway.duckdb or $HEADWAY_DB)."
    ),
]

PreemptibleQosOpt = Annotated[
    str,
    typer.Option(
        "--preemptible-qos",
        help="QOS names (comma-separated) whose running jobs a higher class may preempt: what the ranking "
        "reads as preemptable (Slurm's own PreemptType=preempt/qos stops them; docs/slurm.md). '' for none.",
    ),
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
MIN_INTERVAL_S = 1.0  # each pass asks slurmctld (squeue, sinfo, sprio) and slurmdbd (sacct)
MAX_INTERVAL_S = 86400.0  # a day: beyond it the history and the queue are too old to rank with


def parse_interval(text: str) -> float:
    """`30s`, `2m`, `1h`, `1500ms` or plain seconds, as seconds; under a second would hammer Slurm."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"--interval {text!r}: expected e.g. 30s, 2m, 1h")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[m.group(2)]
    if value < MIN_INTERVAL_S:
        raise ValueError(
            f"--interval {text!r}: at least {MIN_INTERVAL_S:g} s; every pass queries slurmctld and slurmdbd, "
            "so a shorter pause only loads them (30s is the default)"
        )
    if value > MAX_INTERVAL_S:
        raise ValueError(f"--interval {text!r}: at most 24h (use cron with --once for rarer passes)")
    return value


def _print_report(report: PassReport, as_json: bool, verbose: bool, stream: bool = False) -> None:
    """A pass as a table; every other line soft-wrapped (one line each, whole in a log or through grep)."""
    if as_json:
        print_json(report.to_json(), one_line=stream)  # the loop writes one object a line
        return
    if not report.ok and report.plan is None:
        err.print(
            f"[yellow]pass {report.seq}:[/] {safe_escape(report.error or '')}; nothing written",
            soft_wrap=True,
        )
        return
    plan = report.plan
    assert plan is not None
    if plan.warning:
        err.print(f"[yellow]pass {report.seq}:[/] {safe_escape(plan.warning)}", soft_wrap=True)
    t = Table(
        title=f"pass {report.seq}: {plan.pending} pending, {plan.running} running ({plan.queue_source})"
    )
    right = ("rank", "GPUs", "score", "site now", "site new")
    for col in ("rank", "job", "user", "name", "GPUs", "tier", "score", "site now", "site new", "status"):
        # the id whole, as Slurm prints it (`19_[4-9]`): a narrow terminal squeezes the other columns
        t.add_column(col, justify="right" if col in right else "left", no_wrap=col == "job")
    applied = {c.job_id for c in report.applied}
    changed = {c.job_id for c in plan.changes}
    skipped = {c.job_id for c in report.not_attempted}
    for r in plan.rows:
        if r.job_id in report.failed:
            status = f"[red]failed[/]: {safe_escape(report.failed[r.job_id])}"
        elif r.job_id in applied:
            status = "[green]written[/]"
        elif r.job_id in skipped:
            status = "[yellow]not attempted[/]"
        elif r.job_id in changed:
            status = "dry run" if report.dry_run else "not written"
        else:
            status = "unchanged"
        if not verbose and status == "unchanged" and len(plan.rows) > 50:
            continue
        t.add_row(  # what Slurm or a user named (`-J '[/]'`) as plain text, never as markup
            str(r.rank),
            plain(r.display_id),
            plain(r.user or "-"),
            plain(r.name or "-"),
            f"{r.gpus:g}" + (f" x{r.tasks}" if r.tasks > 1 else ""),
            plain(r.tier.split(" ")[0]),
            f"{r.score:.4g}",
            "?" if r.current is None else str(r.current),
            str(r.target),
            status,
        )
    print_table(t)
    if plan.skipped_cpu_only:
        out.print(
            f"left alone (no GPUs requested): {safe_escape(', '.join(plan.skipped_cpu_only))}", soft_wrap=True
        )
    if plan.skipped_waiting:
        waiting = safe_escape(", ".join(f"{j} ({why})" for j, why in plan.skipped_waiting.items()))
        resets = f"; to the low end now: {safe_escape(', '.join(plan.resets))}" if plan.resets else ""
        out.print(
            "left alone (cannot start whatever their priority; a SiteFactor from before goes to the "
            f"range's low end): {waiting}{resets}",
            soft_wrap=True,
        )
    distinct = len({r.target for r in plan.rows})
    if distinct < len(plan.rows):
        out.print(
            f"[yellow]note:[/] {len(plan.rows):,} jobs ranked onto {distinct:,} SiteFactor values: "
            "neighbours share one, so Slurm may start them in either order (widen --range)",
            soft_wrap=True,
        )
    summary = f"{len(plan.changes)} to change, {plan.unchanged} unchanged"
    if report.dry_run:
        out.print(f"{summary}; dry run: nothing written (add --apply to write SiteFactors)", soft_wrap=True)
    else:
        out.print(f"{summary}; {report.writes()}", soft_wrap=True)
    if report.error:
        err.print(f"[yellow]pass {report.seq}:[/] {safe_escape(report.error)}", soft_wrap=True)


# One line a paragraph: rich help keeps a docstring's line breaks, which cut sentences mid-way.
_SYNC_HELP = (
    "Rank Slurm's pending jobs with headway's policy core and map the ranks onto SiteFactor.\n\n"
    "Reads `squeue --json` (or `squeue -O` text), new history from `sacct -a -X -P -D` (incrementally), and "
    "current SiteFactors from `sprio`. A dry run (the default) prints the plan and writes nothing, neither "
    "to Slurm nor to the store; `--apply` writes only changed values and stores the new history. When "
    "slurmctld does not answer, the pass writes nothing and the loop backs off and retries; when only "
    "slurmdbd does not, the pass ranks with the history already held and says how old it is."
)


@app.command("sync", help=_SYNC_HELP)
def sync(
    once: Annotated[bool, typer.Option("--once", help="Run one pass and exit.")] = False,
    interval: Annotated[
        str, typer.Option(help="Time between passes when looping, e.g. 30s, 2m (doubles after failures).")
    ] = "30s",
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Write changed SiteFactors with scontrol (root or SlurmUser). Without it: dry run.",
        ),
    ] = False,
    factor_range: Annotated[
        str,
        typer.Option(
            "--range",
            help="SiteFactor range LO:HI: the order is kept with as few rewrites as possible; a first spread "
            "uses the middle three quarters, best highest.",
        ),
    ] = "0:100000",
    db: DbOpt = None,
    since: Annotated[
        str,
        typer.Option(
            help="How far back the first pass reads sacct's history (from the store's newest job end, when "
            "that is later; later passes go on from the last read): 30d, 12h, a date."
        ),
    ] = "30d",
    source: Annotated[str, typer.Option(help="Source name of this cluster's jobs in the store.")] = "sacct",
    policy: Annotated[str, typer.Option(help="Ranking policy of the scheduling core.")] = "impact",
    preemptible_qos: PreemptibleQosOpt = "low",
    max_passes: Annotated[
        int | None, typer.Option(help="Stop after this many passes (for scripts).", hidden=True)
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per pass on stdout, nothing else.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show unchanged jobs in long queues too.")
    ] = False,
) -> None:
    """Rank pending jobs and write SiteFactors (the help is _SYNC_HELP, kept on one line a paragraph)."""
    from headway.policy import live_policy_error
    from headway.slurm.runner import Runner, SlurmDenied, SlurmError, SlurmMissing
    from headway.slurm.sitefactor import FactorRange
    from headway.slurm.sync import SlurmSync, SyncOptions, parse_qos_list, run_loop

    try:
        rng = FactorRange.parse(factor_range)
        every = parse_interval(interval)
    except ValueError as e:
        fail(str(e))
    if (problem := live_policy_error(policy)) is not None:
        fail(problem)
    _check_since(since)
    if rng.lo < 0:
        err.print(
            f"[yellow]note:[/] --range {factor_range}: Slurm floors a job's priority at 1, so jobs whose "
            f"other factors add up to less than {-rng.lo:,} end up tied at 1 and lose headway's order; "
            "a range from 0 keeps it",
            soft_wrap=True,
        )
    _check_store_path(db, write=apply)
    opts = SyncOptions(
        rng=rng,
        apply=apply,
        db=db,
        source=source,
        since=since,
        policy=policy,
        preemptible_qos=parse_qos_list(preemptible_qos),
    )
    runner = Runner()
    try:
        for cmd in ("squeue", "sacct", "sprio", "sinfo", *(("scontrol",) if apply else ())):
            runner.which(cmd)
        syncer = SlurmSync(runner, opts)
        syncer.load_store()  # a bad store fails now, once, not every pass of a loop
    except SlurmError as e:
        fail(str(e))
    try:
        if once:
            with err.status("reading Slurm and ranking ...") if not as_json else _null() as status:
                if status is not None:
                    syncer.on_progress = lambda n, total: status.update(
                        f"writing SiteFactors: {n:,} of {total:,} answered ..."
                    )
                report = syncer.run_pass()
            _print_report(report, as_json, verbose)
            if report.interrupted:
                raise typer.Exit(130)
            if not report.ok:
                raise typer.Exit(1)
            return
        if not as_json:
            err.print(
                f"syncing every {every:g} s ({'writing' if apply else 'dry run'}); Ctrl-C to stop",
                soft_wrap=True,
            )
        stop = threading.Event()  # SIGTERM (a service manager stopping us) ends the loop between passes
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        run_loop(
            syncer,
            every,
            lambda r: _print_report(r, as_json, verbose, stream=True),
            stop=stop,
            max_passes=max_passes,
        )
    except (SlurmMissing, SlurmDenied) as e:
        fail(str(e))
    except KeyboardInterrupt:
        if not as_json:
            err.print("stopped")


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@app.command("why")
def why(
    job_id: Annotated[
        str, typer.Argument(help="A pending Slurm job id; for an array, 19, 19_5 or 19_[4-9].")
    ],
    db: DbOpt = None,
    factor_range: Annotated[
        str, typer.Option("--range", help="SiteFactor range LO:HI, as for sync.")
    ] = "0:100000",
    since: Annotated[
        str, typer.Option(help="History to read when the store has none: 30d, 12h, a date.")
    ] = "30d",
    source: Annotated[str, typer.Option(help="Source name of this cluster's jobs in the store.")] = "sacct",
    policy: Annotated[str, typer.Option(help="Ranking policy of the scheduling core.")] = "impact",
    preemptible_qos: PreemptibleQosOpt = "low",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Headway's factors for one pending job next to Slurm's own `sprio -l` line for it (writes nothing)."""
    job_id = job_id.strip()
    if not job_id or any(c in job_id for c in ", \t"):
        fail(f"give one job id (e.g. 12345, or 19_5 for an array task), not {job_id!r}")
    from headway.policy import live_policy_error
    from headway.slurm.explain import rank_in_words
    from headway.slurm.queue import ParseError, parse_sprio_long
    from headway.slurm.runner import Runner, SlurmError
    from headway.slurm.sitefactor import FactorRange
    from headway.slurm.sync import SlurmSync, SyncOptions, parse_qos_list

    try:
        rng = FactorRange.parse(factor_range)
    except ValueError as e:
        fail(str(e))
    if (problem := live_policy_error(policy)) is not None:
        fail(problem)
    _check_since(since)
    runner = Runner()
    try:
        opts = SyncOptions(
            rng=rng,
            apply=False,
            db=db,
            source=source,
            since=since,
            policy=policy,
            preemptible_qos=parse_qos_list(preemptible_qos),
        )
        syncer = SlurmSync(runner, opts)
        plan = syncer.plan()
    except SlurmError as e:
        fail(str(e))
    row = plan.row(job_id)
    if row is None:
        name = plan.resolve(job_id)
        if name in plan.skipped_cpu_only:
            fail(f"job {name} asks for no GPUs; headway leaves its SiteFactor alone")
        if name in plan.skipped_waiting:
            fail(
                f"job {name} cannot start whatever its priority (Slurm's reason: "
                f"{plan.skipped_waiting[name]}); headway ranks only jobs that can"
            )
        try:
            state = runner.run("squeue", ["-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
        except SlurmError:
            state = ""
        if not state:
            fail(f"job {job_id} is not in Slurm's queue: it ended (`sacct -j {job_id}`) or never existed")
        state = state.splitlines()[0]
        if state == "PENDING":  # submitted after the queue was read
            fail(f"job {job_id} was not in the queue headway read a moment ago; ask again")
        fail(f"job {job_id} is {state}: headway ranks only pending jobs")
    try:
        res = runner.run("sprio", ["-l", "-j", row.job_id], check=False)
        out_ok = res.returncode == 0
        sprio = [s for s in parse_sprio_long(res.stdout) if s.job_id == row.job_id] if out_ok else []
    except ParseError:  # (a SlurmError too: caught first) shown as "sprio has no line", with what it said
        sprio = []
    except SlurmError as e:
        fail(str(e))
    because = rank_in_words(row, plan.rows)
    data = {
        "job_id": row.job_id,
        "slurm_id": row.display_id,
        "tasks": row.tasks,
        "headway": {
            "rank": row.rank,
            "of": len(plan.rows),
            "tier": row.tier,
            "score": row.score,
            "factors": row.factors,
            "reason": row.reason,
            "because": because,
            "site_factor_planned": row.target,
            "site_factor_now": row.current,
        },
        # the first partition's line, and every partition's (a job pending in several has one each)
        "slurm": _sprio_json(sprio[0]) if sprio else None,
        "slurm_partitions": [_sprio_json(s) for s in sprio],
        "warning": plan.warning,
    }
    if as_json:
        print_json(data)
        return
    if plan.warning:
        err.print(f"[yellow]warning:[/] {safe_escape(plan.warning)}", soft_wrap=True)
    tasks = f", {row.tasks} pending tasks ranked as one: they share one priority" if row.tasks > 1 else ""
    out.print(
        Text.assemble(
            (printable(f"job {row.display_id}"), "bold"),
            printable(f" ({row.user or '-'}, {row.name or '-'}, {row.gpus:g} GPUs{tasks})"),
        ),
        soft_wrap=True,
    )
    if because:
        out.print(f"headway: {safe_escape(because)}", soft_wrap=True)
    t = Table(title="headway", show_header=False)
    t.add_row("rank", plain(f"{row.rank} of {len(plan.rows)} pending GPU jobs ({row.tier})"))
    t.add_row("score", f"{row.score:.4g}")
    for k, v in row.factors.items():
        t.add_row(plain(k), f"{v:.4g}")
    t.add_row("SiteFactor", f"{'?' if row.current is None else row.current} now, {row.target} planned")
    if not sprio:
        print_table(t)
        out.print(
            "slurm: sprio has no line for this job"
            + (f" ({safe_escape(res.stderr.strip())})" if res.stderr.strip() else ""),
            soft_wrap=True,
        )
        return
    tables = [t]
    for line in sprio:
        where = f", partition {line.partition}" if len(sprio) > 1 and line.partition else ""
        s = Table(title=plain(f"slurm (sprio{where}): priority {line.priority}"), show_header=False)
        for k, v in line.factors.items():
            s.add_row(plain(k), f"{v:g}")
        tables.append(s)
    out.print(Columns(tables))


def _sprio_json(line: SprioLine) -> dict[str, object]:
    return {"partition": line.partition, "priority": line.priority, "factors": line.factors}


def _check_since(since: str) -> None:
    """--since is read on the first pass; a typo must stop the command now, not fail every pass."""
    import datetime as dt

    from headway.traces.base import BadInputError
    from headway.traces.sacct import parse_since

    try:
        start = parse_since(since)
    except (BadInputError, ValueError) as e:
        fail(str(e))
    if start.astimezone() > dt.datetime.now().astimezone():
        fail(f"--since {since!r}: in the future; give a span such as 30d or a past date")


def _check_store_path(db: Path | None, write: bool) -> None:
    """What would fail every pass fails now: a --db that is no store, or (to write) not writable here."""
    import os

    from headway.store import default_db_path, is_duckdb_file

    path = db if db is not None else default_db_path()
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        fail(f"--db {path}: is a directory; give the job store's file name")
    if path.exists() and not is_duckdb_file(path) and path.stat().st_size > 0:
        fail(f"--db {path}: not a headway job store (a DuckDB file)")
    if not write:
        return
    if not parent.is_dir():
        fail(f"--db {path}: no such directory {parent}; --apply stores the new history there")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(
            f"--db {path}: not writable by this user (DuckDB also writes {path.name}.wal in {parent}); "
            "--apply stores the new history there: give a --db you can write, or run as its owner"
        )
