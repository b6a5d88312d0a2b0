"""`headway ingest` and `headway export`: job logs into the store, the store out to Parquet."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pyarrow.compute as pc
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from headway.console import (
    check_output_file,
    count,
    err,
    fail,
    out,
    plain,
    print_json,
    print_table,
    safe_escape,
)
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP
from headway.traces.base import ROW_SKIPPED, BadInputError, ReadOptions, ReadResult
from headway.traces.compressed import plain_file, relabel
from headway.traces.registry import FORMATS, read, sniff
from headway.traces.sacct import SACCT_TZ

if TYPE_CHECKING:
    from headway.store import JobStore

DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="DuckDB job store (default ./headway.duckdb, or $HEADWAY_DB).", show_default=False
    ),
]


def _parse_tres_ids(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        fail(f"--gpu-tres-ids: expected comma-separated integers, got {value!r}")


def _read_one(path: Path, fmt: str, opts: ReadOptions, quiet: bool) -> ReadResult:
    with plain_file(path) as plain:
        return relabel(_read_plain(plain, path, fmt, opts, quiet), plain, path)


def _read_plain(plain: Path, path: Path, fmt: str, opts: ReadOptions, quiet: bool) -> ReadResult:
    """Read `plain` (`path`, or its decompressed copy), naming `path` to the user."""
    chosen = fmt
    if fmt == "auto":
        chosen = sniff(plain, has_mapping=opts.mapping is not None)
        if not quiet:
            err.print(f"{safe_escape(str(path))}: detected format [bold]{chosen}[/]")
    size = plain.stat().st_size if plain.is_file() else 0
    if quiet or size < 8 * 1024 * 1024 or not err.is_terminal:  # rich leaves a blank line off a terminal
        return read(chosen, plain, opts)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(f"reading {safe_escape(path.name)}", total=size)

        def advance(n: int) -> None:
            progress.update(task, completed=n)

        return read(chosen, plain, dataclasses.replace(opts, progress=advance))


def ingest(
    paths: Annotated[
        list[Path] | None,
        # Not checked by click (a framed usage error that stopped every file): `_unreadable` names each.
        typer.Argument(help="Job log files to read.", show_default=False, readable=False),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="Input format: " + ", ".join(FORMATS) + ". `auto` sniffs each file and says what it chose.",
        ),
    ] = "auto",
    mapping: Annotated[
        Path | None, typer.Option(help="TOML column mapping for --format csv (see docs/csv-mapping.md).")
    ] = None,
    db: DbOpt = None,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad row instead of skipping it.")] = False,
    source: Annotated[
        str | None,
        typer.Option(help="Name stored as the jobs' source (default: the format). Use one per cluster."),
    ] = None,
    from_slurm: Annotated[
        bool, typer.Option("--from-slurm", help="Run `sacct` on this machine and ingest its output.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="With --from-slurm: how far back, e.g. 30d, 12h, 2026-01-01 (default 30d)."),
    ] = None,
    gpu_tres_ids: Annotated[
        str | None,
        typer.Option(help="slurmdb: comma-separated tres ids that count as GPUs (default: ids >= 1001)."),
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option(
            help="Timezone of naive timestamps in the files, e.g. America/Los_Angeles (not for --from-slurm: "
            "headway runs sacct in UTC)."
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            help="Replace stored jobs whose job id a file gives to a different job (another submit time or "
            "user). Without it such a file is refused: give each cluster its own --source instead."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary only.")] = False,
    wait: Annotated[
        float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
    ] = DEFAULT_WAIT,
    show_bad: Annotated[
        int,
        typer.Option(
            help="How many examples (file:line: value) to show for each kind of unreadable value.", min=0
        ),
    ] = 3,
) -> None:
    """Read job logs into the job store; re-ingesting a file updates the jobs it lists (never duplicates them,
    never deletes a stored job the file no longer lists, never forgets a known value a poorer file lacks).

    A value the job record can do without (memory, CPUs, array ids, exit code, a start or end time) that
    cannot be read is stored as null and the job kept; only an unreadable job id, submit time, state or GPU
    count skips its row. The summary counts both per column and reason, with the first examples.

    Exit status: 0 when every file was read and its jobs stored (a file with no rows at all says so);
    1 when a file is missing, cannot be read, or had rows of which none could be stored: the other files
    are still ingested."""
    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if mapping is not None and fmt not in ("csv", "auto"):
        fail(f"--mapping is for --format csv; --format {fmt} reads its own columns")
    if since is not None and not from_slurm:
        fail("--since is for --from-slurm (how far back sacct reads); a file is ingested whole")
    if from_slurm and fmt not in ("auto", "sacct") and not paths:
        fail(
            f"--from-slurm reads sacct's own output; --format {fmt} is for files: drop it, or ingest "
            "those files in a run of their own"
        )
    if tz is not None and from_slurm and not paths:
        fail(
            "--tz is for the times in files; with --from-slurm headway runs sacct in UTC and reads UTC, so "
            "no zone is needed: drop --tz"
        )
    if tz is not None:  # every format's times go through it, or none do (epoch times): check it here
        from headway.traces.tabular import check_tz

        try:
            check_tz(tz)
        except BadInputError as e:
            fail(f"--tz: {e}")
    opts = ReadOptions(
        strict=strict, source=source, mapping=mapping, gpu_tres_ids=_parse_tres_ids(gpu_tres_ids), tz=tz
    )
    # (kind, file to read, what to call it in bad rows and errors: the file, or the sacct run behind it)
    inputs: list[tuple[str, Path, str]] = [("file", p, str(p)) for p in (paths or [])]
    fmt_for_slurm = "sacct"  # whatever --format says about the files given with it
    if from_slurm:
        from headway.traces.sacct import fetch_from_slurm

        try:
            inputs.append(("slurm", *fetch_from_slurm(since or "30d")))
        except BadInputError as e:
            fail(str(e))
    if not inputs:
        fail("nothing to ingest: give one or more files, or --from-slurm")
    from headway.store import JobStore, StoreError, default_db_path

    target = db or default_db_path()
    new_store = not target.exists()
    try:
        store = JobStore(db, wait=wait)
    except StoreError as e:
        fail(str(e))
    summary: list[dict[str, object]] = []
    try:
        with store:
            try:
                _ingest_all(store, inputs, fmt, fmt_for_slurm, opts, as_json, show_bad, replace, summary)
            except KeyboardInterrupt as e:  # Ctrl-C: one line, not DuckDB's 'Query interrupted' traceback
                fail(_interrupted(e, inputs[min(len(summary), len(inputs) - 1)][2], summary), code=130)
            total = store.count()
    except KeyboardInterrupt:  # counting, or closing the store (a checkpoint): every file was stored
        done = sum(1 for s in summary if not s.get("error"))
        fail(f"interrupted while closing the store: the {done} file(s) ingested were stored", code=130)
    finally:
        for kind, path, _ in inputs:
            if kind == "slurm":
                path.unlink(missing_ok=True)
        if new_store and _empty_store(target):  # no empty store left to read as "nothing to audit"
            for leftover in (target, target.with_name(target.name + ".wal")):
                leftover.unlink(missing_ok=True)
    failed = [s for s in summary if s.get("error")]
    if as_json:
        print_json({"files": summary, "jobs_in_store": total, "db": str(store.path)})
        if failed:
            raise typer.Exit(1)
        return
    _print_summary(store.path, summary, show_bad)
    if new_store and not target.exists():  # nothing stored: the empty store was not left behind
        out.print(plain(f"no jobs stored; {target} was not created"))
    else:
        out.print(f"{count(total, 'job')} in the store.")
    if failed:
        for s in failed:
            err.print(f"error: {safe_escape(str(s['error']))}", highlight=False, soft_wrap=True)
        stored = len(summary) - len(failed)
        fail(
            f"{len(failed)} of {len(summary)} files could not be read or stored, and stored nothing"
            + (f"; the other {stored} {'was' if stored == 1 else 'were'} stored" if stored else "")
        )


def _print_summary(db: Path, summary: list[dict[str, Any]], show_bad: int) -> None:
    """The files table, then one table of unreadable values per column and reason, then the notes:
    nothing line by line before it, so a log of a million rows with one bad column reads in one screen."""
    t = Table(title=f"ingested into {safe_escape(str(db))}")
    numbers = ("rows", "jobs stored", "new", "updated", "bad rows", "values nulled")
    for col in ("file", "format", *numbers, "missing fields"):
        t.add_column(col, justify="right" if col in numbers else "left")
    for s in summary:
        if s.get("error") and "rows_read" not in s:
            t.add_row(safe_escape(str(s["path"])), "[red]failed[/]", "-", "0", "0", "0", "-", "-", "-")
            continue
        t.add_row(
            safe_escape(str(s["path"])),
            str(s["format"]) + (" [red](nothing stored)[/]" if s.get("error") else ""),
            f"{s['rows_read']:,}",
            f"{s['jobs_stored']:,}",
            f"{s['jobs_added']:,}",
            f"{s['jobs_updated']:,}",
            f"{s['bad_rows']:,}",
            f"{s['values_nulled']:,}",
            ", ".join(s["missing_fields"]) or "-",
        )
    print_table(t)
    problems = [(s["path"], p) for s in summary for p in s.get("problems", [])]
    if problems:
        several = len({path for path, _ in problems}) > 1
        pt = Table(title="unreadable values (per column and reason)")
        if several:
            pt.add_column("file")
        for col in ("column", "problem", "rows", "done", "first examples (file:line: value)"):
            pt.add_column(col, justify="right" if col == "rows" else "left")
        for path, p in problems:
            shown = p["examples"][:show_bad]
            more = p["count"] - len(shown)
            cell = "\n".join(safe_escape(x) for x in shown) + (f"\n... {more:,} more" if more > 0 else "")
            done = "[red]row skipped[/]" if p["effect"] == ROW_SKIPPED else "stored as null, job kept"
            row = [safe_escape(p["column"]), safe_escape(p["reason"]), f"{p['count']:,}", done, cell or "-"]
            pt.add_row(*([safe_escape(str(path))] if several else []), *row)
        print_table(pt)
        if any(p["count"] > show_bad for _, p in problems):
            out.print(plain("(--show-bad N shows more examples of each; --json lists them)"))
    for s in summary:
        for n in s["notes"]:
            out.print(f"note ({safe_escape(str(s['path']))}): {safe_escape(str(n))}", soft_wrap=True)


def _interrupted(e: KeyboardInterrupt, where: str, summary: list[dict[str, object]]) -> str:
    """Whether the file being ingested was stored, from the store's own answer (store.Interrupted)."""
    from headway.store import Interrupted

    if isinstance(e, Interrupted) and e.stored:
        what = f"the jobs of {where} were stored (the interrupt came as they were committed)"
    else:
        what = f"nothing from {where} was stored"
    before = sum(1 for s in summary if not s.get("error"))
    if before:
        what += f"; the {before} file(s) before it were stored"
    return (
        f"interrupted: {what}. Each file is stored whole or not at all, and ingesting again updates "
        "rather than duplicates: running the same ingest again is safe"
    )


# The counts of a file that stored nothing: the same keys as a stored one's, so `--json` readers need no
# special case.
_NOTHING_STORED: dict[str, Any] = {
    "jobs_stored": 0,
    "jobs_added": 0,
    "jobs_updated": 0,
    "kept_ended": 0,
    "kept_values": 0,
}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _store_failed(where: str, e: Exception) -> str:
    """The one line for a store write that failed (the upsert is one transaction: nothing of it stays)."""
    if "No space left on device" in str(e):
        return f"STORE: disk full while storing {where}; nothing from it was stored"
    return f"STORE: cannot store {where}: {_first_line(e)}; nothing from it was stored"


def _empty_store(path: Path) -> bool:
    """True only for a job store that holds no job (a failure after an earlier file was stored, or another
    process writing meanwhile, leaves jobs: then it stays)."""
    from headway.store import JobStore, StoreError

    if not path.exists():
        return False
    try:
        with JobStore(path, read_only=True) as store:
            return store.count() == 0
    except (StoreError, OSError):
        return False


def _is_export(path: Path) -> bool:
    """Whether `path` is a Parquet file with the columns `export` writes (the job schema and the derived
    runtime, wait and gpu_hours), or an earlier headway wrote (its schema lacked the ADDED_COLUMNS)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from headway.schema import FIELD_NAMES
    from headway.store import ADDED_COLUMNS

    try:
        names = pq.read_schema(path).names
    except (OSError, pa.ArrowException):  # not Parquet, or unreadable
        return False
    derived = ["runtime", "wait", "gpu_hours"]
    earliest = len(FIELD_NAMES) - len(ADDED_COLUMNS)
    return any(names == [*FIELD_NAMES[:k], *derived] for k in range(earliest, len(FIELD_NAMES) + 1))


def export(
    parquet: Annotated[
        Path, typer.Option("--parquet", help="Write every stored job (with derived fields) here.")
    ],
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
    wait: Annotated[
        float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
    ] = DEFAULT_WAIT,
) -> None:
    """Export the job store to a Parquet file (the job record plus runtime, wait, gpu_hours)."""
    from headway.store import JobStore, StoreError

    check_output_file(parquet, "--parquet")
    if parquet.is_file() and parquet.stat().st_size:
        # An earlier export is replaced; anything else may be the only copy of a job log.
        if not os.access(parquet, os.R_OK):
            fail(f"--parquet {parquet}: exists and cannot be read to tell whether it is an earlier export")
        if not _is_export(parquet):
            fail(
                f"--parquet {parquet}: exists and is not an earlier export (a job log?); writing would "
                "replace it: remove it first or give another file name"
            )
    try:
        with JobStore(db, read_only=True, wait=wait) as store:
            n = store.export_parquet(parquet)
    except StoreError as e:
        fail(str(e))
    if as_json:
        print_json({"parquet": str(parquet), "jobs": n})
    else:
        out.print(f"wrote {n:,} jobs to {safe_escape(str(parquet))}")


def _ingest_all(
    store: JobStore,
    inputs: list[tuple[str, Path, str]],
    fmt: str,
    fmt_for_slurm: str,
    opts: ReadOptions,
    as_json: bool,
    show_bad: int,
    replace: bool = False,
    done: list[dict[str, object]] | None = None,
) -> list[dict[str, object]]:
    """Read and store each input; `done` (the summary, one entry per input so far) is filled as it goes."""
    import duckdb

    from headway.store import ReusedIdError

    summary: list[dict[str, object]] = [] if done is None else done
    for kind, path, where in inputs:
        use_fmt = fmt_for_slurm if kind == "slurm" else fmt
        label = "sacct (from Slurm)" if kind == "slurm" else str(path)
        # One file that cannot be read stores nothing of its own; the others are still read and stored,
        # and the summary says which failed (the command then exits 1).
        error = _unreadable(path) if kind == "file" else None
        # headway ran sacct with TZ=UTC: its times are UTC whatever --tz says about the files
        read_opts = dataclasses.replace(opts, tz=SACCT_TZ) if kind == "slurm" else opts
        try:
            if error is None:
                res = relabel(_read_one(path, use_fmt, read_opts, quiet=as_json), path, where, note=None)
        except BadInputError as e:
            error = str(e).replace(str(path), where)  # not the temp file sacct's output went to
        except (OSError, UnicodeError) as e:
            error = f"{where}: cannot read: {getattr(e, 'strerror', None) or e}"
        if error is None and res.rows_read and not res.table.num_rows:
            # Not stopped here even when it is the only file: the summary shows why no row was readable.
            summary.append(
                {
                    "path": label,
                    "format": res.format,
                    "error": f"{where}: none of its {res.rows_read:,} rows could be read as a job; nothing "
                    "from it was stored",
                    **_NOTHING_STORED,
                    **_what_was_read(res, show_bad),
                }
            )
            continue
        if error is not None:
            if opts.strict or len(inputs) == 1:
                fail(error)
            summary.append({"path": label, "error": error, **_NOTHING_STORED, "notes": []})
            continue
        # A Parquet export keeps each row's own source: name those, not the format.
        src = opts.source or (
            ",".join(sorted(str(x) for x in pc.unique(res.table.column("source")).to_pylist()))
            if res.table.num_rows
            else res.format
        )
        try:
            stored = store.upsert(res.table, refuse_reused_ids=not replace)
        except duckdb.Error as e:  # a full disk, say: one line, and the other files still go on
            error = _store_failed(where, e)
            if opts.strict or len(inputs) == 1:
                fail(error)
            summary.append({"path": label, "error": error, **_NOTHING_STORED, "notes": []})
            continue
        except ReusedIdError as e:
            error = (
                f"{where}: {e}; nothing from it was stored. Another cluster under the same --source, the "
                "same log read with another --tz, or requeued jobs read without sacct -D? Ingest each "
                "cluster under its own --source NAME (or pass --replace if the stored jobs are to go)"
            )
            if opts.strict or len(inputs) == 1:
                fail(error)
            summary.append({"path": label, "error": error, **_NOTHING_STORED, "notes": []})
            continue
        if res.rows_read == 0 and not res.bad_row_count:  # a header alone, a Parquet file of no rows
            res.notes.append("no jobs in it (no rows); nothing stored")
        if store.last_repeats:  # (counted by the upsert's own duplicate check)
            why = " (requeued jobs in `sacct -D` output look like this)" if res.format == "sacct" else ""
            res.notes.append(
                f"{store.last_repeats:,} rows repeat a job id of an earlier row in this file{why}; the last "
                "row of each job id was kept"
            )
        if store.last_kept_ended:
            k = store.last_kept_ended
            res.notes.append(
                f"{count(k, 'stored job')} had ended and this file lists "
                f"{'them' if k != 1 else 'it'} as still pending or running (an older snapshot?): the "
                "stored rows were kept"
            )
        if store.last_kept_values:
            by_field = ", ".join(f"{f} {k:,}" for f, k in store.last_kept_by_field.items())
            res.notes.append(
                f"{store.last_kept_values:,} known values were kept where this file has none ({by_field}): "
                "a re-ingest from a poorer format never forgets what a richer one told"
            )
        if store.last_other_source:
            other, k = store.last_other_source
            res.notes.append(
                f"{k:,} of these jobs (same id and submit time) are also stored under source {other!r}: "
                f"the store holds them twice, and audits count both; ingest with --source {other} to "
                "update those instead"
            )
        try:
            store.record_ingest(label, res.format, src, res.rows_read, stored, res.bad_row_count)
        except duckdb.Error as e:  # the jobs are in: only the ingest log's line is missing
            res.notes.append(f"its jobs were stored, but not the line of the ingest log: {_first_line(e)}")
        summary.append(
            {
                "path": label,
                "format": res.format,
                "source": src,
                "jobs_stored": stored,
                "jobs_added": store.last_added,
                "jobs_updated": store.last_updated,
                "kept_ended": store.last_kept_ended,
                "kept_values": store.last_kept_values,
                **_what_was_read(res, show_bad),
            }
        )
    return summary


def _what_was_read(res: ReadResult, show_bad: int) -> dict[str, object]:
    """A file's summary entry as far as its reader tells it (rows, problems, notes)."""
    return {
        "rows_read": res.rows_read,
        "bad_rows": res.bad_row_count,
        "values_nulled": res.nulled_values,
        "missing_fields": res.missing_fields,
        "notes": res.notes,
        "problems": [p.as_dict(show_bad) for p in res.problems],
        "bad_row_examples": [str(b) for b in res.bad_rows[:show_bad]],
    }


def _unreadable(path: Path) -> str | None:
    """Why a named path cannot be ingested, before any reader tries it (one line, never a usage box)."""
    import stat

    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{path}: no such file"
    except OSError as e:
        return f"{path}: cannot read: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode):
        return f"{path}: is a directory; give the log files inside it"
    try:  # non-blocking: a named pipe with no writer yet must not hang the check
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        return f"{path}: cannot read: {e.strerror or e}"
    return None
