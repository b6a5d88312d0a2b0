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
