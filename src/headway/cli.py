"""The `headway` command: assembles the verbs in headway.commands (one module per verb)."""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from headway import __version__
from headway.commands import audit, demo, ingest, predict, simulate
from headway.commands import daemon as daemon_cmd
from headway.commands import queue as queue_cmd
from headway.commands import slurm as slurm_cmd

app = typer.Typer(
    name="headway",
    help="Make shared GPU clusters spend their GPU-hours on jobs that finish: "
    "read job logs, audit waste, predict outcomes, rank and simulate queues.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from headway._native import build_name

        sim = {"native": "compiled", "pure": "plain Python", "partial": "partly compiled"}[build_name()]
        typer.echo(f"headway {__version__} (simulator: {sim})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print headway's version and exit."),
    ] = False,
) -> None:
    """Make shared GPU clusters spend their GPU-hours on jobs that finish: read job logs, audit waste,
    predict outcomes, rank and simulate queues."""


app.command("ingest")(ingest.ingest)
app.command("export")(ingest.export)
app.command("audit")(audit.audit)
app.command("demo")(demo.demo)
app.add_typer(predict.app, name="predict")
app.add_typer(slurm_cmd.app, name="slurm")
app.command("simulate")(simulate.simulate)
app.command("sweep")(simulate.sweep)
app.command("synth")(simulate.synth)
app.command("daemon")(daemon_cmd.daemon)
app.command("submit", context_settings=queue_cmd.SUBMIT_SETTINGS)(queue_cmd.submit)
app.command("queue")(queue_cmd.queue)
app.command("why")(queue_cmd.why)
app.command("cancel")(queue_cmd.cancel)
app.command("logs")(queue_cmd.logs)
app.command("history")(queue_cmd.history)


def _reflow(text: str) -> str:
    """One line per paragraph: Typer's rich help keeps a docstring's line breaks after the first
    paragraph, which wrapped a 100-column docstring raggedly in an 80-column terminal."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _reflow_help(t: typer.Typer) -> None:
    for info in t.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = _reflow(doc)
    for group in t.registered_groups:
        if group.typer_instance is not None:
            _reflow_help(group.typer_instance)


_reflow_help(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
