"""`headway demo`: the whole audit on a real bundled trace, with nothing to download or configure."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from headway.console import check_output_file, err, fail, out, plain, print_json, safe_escape
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP

SAMPLE = "philly_jobs.json.gz"
SOURCE = "philly"
DEFAULT_DEMO_DB = Path("headway-demo.duckdb")
DEFAULT_REPORT = Path("headway-report.html")
CITATION = (
    "Data: Microsoft Philly job log (Jeon et al., USENIX ATC '19), CC BY 4.0; subset re-published in "
    "github.com/weifanjiang/DRE. Details: {attribution}."
)


def demo(
    db: Annotated[
        Path,
        typer.Option("--db", help="DuckDB file the sample is ingested into (kept, so you can query it)."),
    ] = DEFAULT_DEMO_DB,
    html: Annotated[Path, typer.Option("--html", help="Where to write the HTML report.")] = DEFAULT_REPORT,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (ingest summary and the audit) only.")
    ] = False,
    wait: Annotated[
        float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
    ] = DEFAULT_WAIT,
) -> None:
    """Audit a real GPU cluster's job log in one step: ingest the bundled Philly sample (5,910 jobs from
    Microsoft's Philly cluster, 2017), print the audit and write the HTML report.

    Running it again replaces the sample's jobs in --db instead of duplicating them.

    To audit your own cluster instead: `headway ingest FILE...` then `headway audit --html report.html`.
    """
    from headway.data import sample_path

    if db.is_dir():
        fail(f"{db}: is a directory; give a file name for --db")
    check_output_file(html, "--html")
    if html.resolve() == db.resolve():
        fail(f"--html {html} is the job store given as --db; give the report another file name")
    try:
        sample = sample_path(SAMPLE)
    except FileNotFoundError as e:
        fail(f"{e} (reinstall headway)")
    ingested = _ingest_sample(sample, db, quiet=as_json, wait=wait)
    report = run_audit(db, html, quiet=as_json, wait=wait)
    if as_json:
        print_json({"sample": SAMPLE, "db": str(db), "html": str(html), "ingest": ingested, "audit": report})
        return
    from headway.audit.render import render_terminal

    render_terminal(report, out)
    out.print()
    others = ingested["jobs_in_store"] - ingested["jobs_stored"]
    db_s, html_s = safe_escape(str(db)), safe_escape(str(html))  # paths as written, never as markup
    if others > 0:
        out.print(
            f"[yellow]note:[/] {db_s} also holds {others:,} other jobs; the audit above covers the sample "
            f"only (source {SOURCE}; `headway audit --db {db_s}` audits them all)."
        )
    out.print(f"[dim]{safe_escape(CITATION.format(attribution=sample.parent / 'ATTRIBUTION.md'))}[/]")
    out.print(f"Jobs stored in [bold]{db_s}[/] (query it: headway audit --db {db_s} --by group).")
    out.print(f"HTML report written to [bold]{html_s}[/] (open it in a browser; it works offline).")


def _ingest_sample(sample: Path, db: Path, *, quiet: bool, wait: float = DEFAULT_WAIT) -> dict[str, Any]:
    """Read the bundled sample with the philly reader and upsert it, as `headway ingest` would."""
    from headway.store import JobStore, StoreError
    from headway.traces.base import BadInputError, ReadOptions
    from headway.traces.philly import READER

    try:
        if quiet:
            res = READER.read(sample, ReadOptions(source=SOURCE))
        else:
            with err.status(f"reading the bundled Philly sample ({sample.name})"):
                res = READER.read(sample, ReadOptions(source=SOURCE))
    except BadInputError as e:
        fail(f"bundled sample is damaged: {e} (reinstall headway)")
    try:
        with JobStore(db, wait=wait) as store:
            stored = store.upsert(res.table)
            store.record_ingest(
                str(sample.name), res.format, SOURCE, res.rows_read, stored, res.bad_row_count
            )
            total = store.count()
    except StoreError as e:
        fail(str(e))
    if not quiet:
        err.print(plain(f"ingested {stored:,} Philly jobs into {db} ({total:,} jobs in that store)"))
    return {
        "format": res.format,
        "source": SOURCE,
        "rows_read": res.rows_read,
        "jobs_stored": stored,
        "bad_rows": res.bad_row_count,
        "jobs_in_store": total,
        "missing_fields": res.missing_fields,
        "notes": res.notes,
    }


def run_audit(db: Path, html: Path, *, quiet: bool = True, wait: float = DEFAULT_WAIT) -> dict[str, Any]:
    """The one place demo meets the audit: compute the report from the store and write its HTML file."""
    from headway.audit.compute import audit_report, configure
    from headway.audit.html import write_html
    from headway.store import JobStore, StoreError

    try:
        with JobStore(db, read_only=True, wait=wait) as store:
            configure(store.con)
            if quiet:
                report = audit_report(store.con, source=SOURCE)
            else:
                with err.status("auditing") as status:
                    report = audit_report(
                        store.con, source=SOURCE, progress=lambda step: status.update(f"auditing: {step}")
                    )
    except StoreError as e:
        fail(str(e))
    report["db"] = str(db)
    try:
        write_html(report, html)
    except OSError as e:
        fail(f"{html}: cannot write the report: {e.strerror or e}")
    return report
