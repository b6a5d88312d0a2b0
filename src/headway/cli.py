"""The `headway` command: assembles the verbs in headway.commands (one module per verb)."""

from __future__ import annotations

import inspect
import sys
from typing import Annotated

import typer

from headway import __version__

# The local queue's verbs: `headway submit` in a shell loop must not pay for importing the data stack
# (pyarrow, pandas, DuckDB: about 0.3 s) that only the other verbs use. `main` builds an app of these
# alone when one of them is called; everything else (and --help) gets the whole app. Both register the
# same functions (`_register`).
QUEUE_VERBS = ("submit", "queue", "why", "cancel", "logs", "history", "gpus")


def _new_app() -> typer.Typer:
    return typer.Typer(
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
        typer.echo(f"headway {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print headway's version and exit."),
    ] = False,
) -> None:
    """Make shared GPU clusters spend their GPU-hours on jobs that finish: read job logs, audit waste,
    predict outcomes, rank and simulate queues."""


def _register_queue(app: typer.Typer) -> None:
    from headway.commands import queue as queue_cmd

    app.command("submit", context_settings=queue_cmd.SUBMIT_SETTINGS)(queue_cmd.submit)
    app.command("queue")(queue_cmd.queue)
    app.command("why")(queue_cmd.why)
    app.command("cancel")(queue_cmd.cancel)
    app.command("logs")(queue_cmd.logs)
    app.command("history")(queue_cmd.history)
    if hasattr(queue_cmd, "gpus"):
        app.command("gpus")(queue_cmd.gpus)


def _register(app: typer.Typer) -> None:
    from headway.commands import audit, demo, ingest, predict, simulate
    from headway.commands import daemon as daemon_cmd
    from headway.commands import notify as notify_cmd
    from headway.commands import serve as serve_cmd
    from headway.commands import slurm as slurm_cmd

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
    app.command("serve")(serve_cmd.serve)
    app.command("notify")(notify_cmd.notify)
    _register_queue(app)


def build_app(*, queue_only: bool = False) -> typer.Typer:
    """The `headway` app: every verb, or (`queue_only`) the local queue's alone."""
    app = _new_app()
    app.callback()(_root)
    (_register_queue if queue_only else _register)(app)
    _reflow_help(app)
    return app


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


_APP: typer.Typer | None = None


def __getattr__(name: str) -> typer.Typer:
    """`headway.cli.app`, the whole app, built on first use (tests and `python -m headway.cli` use it)."""
    global _APP
    if name != "app":
        raise AttributeError(name)
    if _APP is None:
        _APP = build_app()
    return _APP


def _verb(argv: list[str]) -> str | None:
    """The verb of a command line: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def main() -> None:
    verb = _verb(sys.argv[1:])
    build_app(queue_only=verb in QUEUE_VERBS)()


if __name__ == "__main__":
    main()
