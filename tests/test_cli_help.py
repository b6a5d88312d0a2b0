"""Every command's --help reads as prose: a docstring's paragraphs wrap at the terminal, not where the
source lines happened to break."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click
import typer
from typer.testing import CliRunner

from headway.cli import app


def _commands(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_help_paragraph_wraps_at_the_terminal_not_at_the_docstrings_line_breaks() -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, cmd in _commands(root, []):
        if not path or isinstance(cmd, click.Group):
            continue
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000"})
        assert res.exit_code == 0, (path, res.output)
        lines = [line.strip() for line in res.output.splitlines()]
        for para in inspect.cleandoc(cmd.help or "").split("\n\n"):
            text = " ".join(para.split())
            assert text in lines, (path, text, res.output)
            checked += 1
    assert checked >= 20  # every verb has at least its first paragraph


def test_a_local_queue_verb_loads_none_of_the_data_stack() -> None:
    """`headway submit` in a shell loop paid 0.35 s of CPU a call for pyarrow, pandas and DuckDB, which
    no queue verb uses; the same command line run through `main` must not import them."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from headway import cli\n"
        "sys.argv = ['headway', 'queue', '--help']\n"
        "try:\n"
        "    cli.main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "names = ('pyarrow', 'pandas', 'duckdb', 'numpy', 'lightgbm')\n"
        "heavy = sorted(m for m in names if m in sys.modules)\n"
        "print(','.join(heavy) or 'none')\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "none"


def test_the_whole_app_and_the_queue_app_register_the_same_queue_verbs() -> None:
    from headway.cli import QUEUE_VERBS, build_app

    whole = typer.main.get_command(build_app())
    queue_only = typer.main.get_command(build_app(queue_only=True))
    shared = {n: c for n, c in getattr(whole, "commands", {}).items() if n in QUEUE_VERBS}
    assert set(getattr(queue_only, "commands", {})) == set(shared)
    for name, cmd in shared.items():
        other = queue_only.commands[name]  # type: ignore[attr-defined]
        assert [p.name for p in other.params] == [p.name for p in cmd.params] and other.help == cmd.help
