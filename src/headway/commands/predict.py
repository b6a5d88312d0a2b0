"""`headway predict ...` (being built)."""

from __future__ import annotations

import typer

from headway.console import fail

app = typer.Typer(help="Predict completion probability and runtime for jobs.", no_args_is_help=True)


@app.command("train")
def train() -> None:
    """Not built yet."""
    fail("not built yet")
