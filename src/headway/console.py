"""Shared terminal helpers: one Console for stdout, one for messages, and a clean error exit."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from headway.atomic import replaced_atomically as replaced_atomically  # its home; imported from here too

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}
# Unicode's bidirectional overrides, embeddings and isolates: no terminal command, but `a\u202eb` shows
# a name reversed from that point on, so one name can pass for another in a table. Letters of
# right-to-left scripts are untouched.
_CONTROL.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def printable(value: object) -> str:
    """`value` as text with its control characters shown as `\\x1b` escapes (tab and newline kept): a
    job name or user from a log is written by whoever submitted the job, and an ESC in it (`sbatch -J
    $'\\e]0;title\\a'`) would reach the terminal as a command (colours, the window title, worse on some
    terminals). Rich drops a few control characters, but not ESC."""
    return str(value).translate(_CONTROL)


def safe_escape(value: object) -> str:
    """`printable(value)`, escaped for an f-string printed with Rich markup."""
    return escape(printable(value))


def plain(value: object) -> Text:
    """A value from the data (a job, user, group or partition name, an id, a file path) as Rich shows it:
    its own characters, never read as markup, control characters shown as escapes. Put it in a table
    cell or a title, or join it with `Text.assemble`; inside an f-string printed with markup, use
    `safe_escape` instead. (`[/]` as markup crashes with a MarkupError, `[red]x` prints as a red `x`,
    `[bold]` prints nothing.)"""
    return Text(printable(value))


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 job`, `2 jobs`, `1,200 scheduling passes` (a plural other than noun + s given as `plural`)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def print_table(table: Any, console: Console | None = None) -> None:
    """On a terminal, at its width; piped or redirected (a log, `| less`, CI), at the table's own width.
    Rich takes 80 columns when it cannot ask a terminal, and cut wide tables' cells short there."""
    console = console or out
    if console.is_terminal:
        console.print(table)
        return
    from rich.measure import Measurement

    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    # Console.print caps `width` at the console's own, so a wider one prints it (same file, no colour).
    Console(file=console.file, width=natural, highlight=False, no_color=console.no_color).print(table)


def print_skipped(label: str, shown: list[str], total: int) -> None:
    """A reader's bad rows on stderr, as `ingest`, `simulate` and `sweep` show them: the first few,
    then how many more."""
    for b in shown:
        err.print(f"[yellow]skipped[/] {safe_escape(b)}", markup=True, highlight=False)
    if total > len(shown):
        err.print(f"... and {total - len(shown):,} more bad rows in {safe_escape(label)}")


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one line (no traceback) to stderr and exit."""
    err.print(f"[bold red]error:[/] {safe_escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def check_output_file(path: Path, option: str) -> None:
    """Fail now, not after minutes of work, when `path` cannot be written as a file, or is a job store
    (a DuckDB database) that writing would replace: the store holds every job ingested, a report or a
    model file can be written again in seconds."""
    if path.is_dir():
        fail(f"{option} {path}: is a directory; give a file name")
    from headway.store import is_duckdb_file  # here: `headway --help` need not load DuckDB

    if is_duckdb_file(path):
        fail(
            f"{option} {path}: is a DuckDB database (a job store?); writing here would replace it; "
            "give another file name"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        fail(f"{option} {path}: no such directory {parent}")
    if not os.access(path if path.exists() else parent, os.W_OK):
        fail(f"{option} {path}: not writable")


def fail_unknown_source(source: str, where: object, known: list[str]) -> NoReturn:
    """The one error for a --source the store does not hold, naming the ones it does."""
    fail(f"--source {source!r}: no such source in {where}; it has {', '.join(known) or 'none'}")


def jsonable(obj: Any) -> Any:
    """Replace NaN/inf (not valid JSON) with null, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    return obj


def print_json(obj: Any, *, one_line: bool = False) -> None:
    """JSON to stdout, nothing else, so `--json` output pipes cleanly; `one_line` for a stream of objects
    (one per line, as log tools and `jq -c` read them)."""
    text = json.dumps(jsonable(obj), indent=None if one_line else 2, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
