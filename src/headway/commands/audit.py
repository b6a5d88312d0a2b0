"""`headway audit`: where the GPU-hours went, in the terminal, as JSON, or as one offline HTML file."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from headway.console import check_output_file, err, fail, fail_unknown_source, out, print_json, safe_escape
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP

BY_HELP = "Rank the top table by user, group, name, partition or gpus (JSON always carries all of them)."


def audit(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db", help="DuckDB job store (default ./headway.duckdb, or $HEADWAY_DB).", show_default=False
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only jobs submitted at or after this: a date (2026-01-31), a time (2026-01-31T12:00) or a "
            "relative time (30d, 12h, 2w) counted back from the newest job in the store (of --source).",
            show_default=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            help="Only jobs submitted before this (a bare date includes that whole day); "
            "same forms as --since.",
            show_default=False,
        ),
    ] = None,
    by: Annotated[str, typer.Option(help=BY_HELP)] = "user",
    top: Annotated[int, typer.Option(help="Rows in each ranked table.", min=1, max=1000)] = 10,
    gpu_hour_price: Annotated[
        float,
        typer.Option(
            "--gpu-hour-price",
            help="USD per GPU-hour for the cost of waste (default: a rough cloud price).",
            min=0.0,
        ),
    ] = 2.0,
    period: Annotated[
        str | None,
        typer.Option(
            help="Audit this period A..B (either end may be open: -7d.., ..2026-01-31); with --vs, compare.",
            show_default=False,
        ),
    ] = None,
    vs: Annotated[
        str | None,
        typer.Option(
            help="Compare --period against this period C..D, e.g. --period -7d.. --vs -14d..-7d.",
            show_default=False,
        ),
    ] = None,
    include_cpu: Annotated[
        bool, typer.Option("--include-cpu", help="Audit CPU-only jobs too (default: GPU jobs only).")
    ] = False,
    source: Annotated[
        str | None,
        typer.Option(
            help="Only jobs of this source (as stored by `headway ingest --source`): one cluster of a store "
            "that holds several.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object only.")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write a self-contained offline HTML report here.", show_default=False
        ),
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
    ] = DEFAULT_WAIT,
) -> None:
    """Show where the GPU-hours went: totals per state and outcome, completion rate, waste and its cost,
    top wasters, repeat failures, early failures, timeouts and over-asking, queueing delay, weekly series.

    Jobs are selected by submit time. Outcome classes: success = COMPLETED; waste =
    FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL; CANCELLED and PREEMPTED are reported separately.
    The JSON schema is documented in docs/audit-json.md.
    """
    from headway.audit.compute import BY_CHOICES, anchor_time, configure, sources
    from headway.audit.periods import PeriodError, parse_period, parse_window
    from headway.store import JobStore, StoreError

    if by not in BY_CHOICES:
        fail(f"--by {by!r}: choose one of {', '.join(BY_CHOICES)}")
    if not math.isfinite(gpu_hour_price) or gpu_hour_price > 1e6:
        fail(f"--gpu-hour-price: expected USD per GPU-hour from 0 to 1,000,000, got {gpu_hour_price}")
    if vs and not period:
        fail("--vs needs --period (the period to compare against it)")
    if period and (since or until):
        fail("use either --period or --since/--until, not both")
    if html is not None:
        check_output_file(html, "--html")
    try:
        store = JobStore(db, read_only=True, wait=wait)
    except StoreError as e:
        fail(str(e))
    with store:
        try:
            configure(store.con)
            # Relative times count back from the newest job; an empty store counts from now.
            known = sources(store.con) if source is not None else []
            anchor = anchor_time(store.con, source) or datetime.datetime.now(datetime.UTC)
            if period:
                window = parse_period(period, anchor=anchor)
                other = parse_period(vs, anchor=anchor) if vs else None
            else:
                window = parse_window(since, until, anchor=anchor)
                other = None
        except PeriodError as e:
            fail(str(e))
        except Exception as e:  # a store that is not a headway store, a broken file
            fail(f"{store.path}: cannot read the job store: {(str(e).splitlines() or [type(e).__name__])[0]}")
        if source is not None and source not in known:
            fail_unknown_source(source, store.path, known)
        report = _run(store.con, window, other, by, top, gpu_hour_price, include_cpu, source, quiet=as_json)
    report["db"] = str(store.path)
    report["anchor"] = anchor.isoformat() if anchor else None
    if html is not None:
        from headway.audit.html import write_html

        try:
            write_html(report, html)
        except OSError as e:
            fail(f"{html}: cannot write the report: {e.strerror or e}")
    if as_json:
        print_json(report)
        return
    from headway.audit.render import render_terminal

    render_terminal(report, out)
    if html is not None:
        out.print(f"HTML report written to [bold]{safe_escape(str(html))}[/]")


def _run(
    con: Any,
    window: Any,
    other: Any,
    by: str,
    top: int,
    price: float,
    include_cpu: bool,
    source: str | None,
    *,
    quiet: bool,
) -> dict[str, Any]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from headway.audit.compute import audit_report

    kw: dict[str, Any] = {
        "since": window.since,
        "until": window.until,
        "by": by,
        "top": top,
        "gpu_hour_price": price,
        "include_cpu": include_cpu,
        "vs": other,
        "source": source,
    }
    try:
        if quiet or not err.is_terminal:  # off a terminal rich would leave a blank line on stderr
            return audit_report(con, **kw)
        with Progress(
            SpinnerColumn(),
            TextColumn("auditing: {task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("start", total=None)
            return audit_report(con, progress=lambda s: bar.update(task, description=s), **kw)
    except Exception as e:
        import duckdb

        if isinstance(e, duckdb.Error):
            fail(f"audit query failed: {str(e).splitlines()[0]}")
        raise
