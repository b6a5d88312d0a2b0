"""The `headway` command: assembles the verbs in headway.commands (one module per verb)."""

from __future__ import annotations

import typer

from headway.commands import audit, demo, ingest, predict, simulate

app = typer.Typer(
    name="headway",
    help="Make shared GPU clusters spend their GPU-hours on jobs that finish: "
    "read job logs, audit waste, predict outcomes, rank and simulate queues.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

app.command("ingest")(ingest.ingest)
app.command("export")(ingest.export)
app.command("audit")(audit.audit)
app.command("demo")(demo.demo)
app.add_typer(predict.app, name="predict")
app.command("simulate")(simulate.simulate)
app.command("sweep")(simulate.sweep)
app.command("synth")(simulate.synth)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
