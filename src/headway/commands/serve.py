"""`headway serve`: the dashboard, the JSON API and /metrics over the job store and a live queue."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer

from headway.console import err, fail

TOKEN_ENV = "HEADWAY_TOKEN"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help="DuckDB job store (default ./headway.duckdb, or $HEADWAY_DB); read only.",
            show_default=False,
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Show this local queue's live jobs (its daemon's state dir).",
            show_default=False,
        ),
    ] = None,
    slurm: Annotated[
        bool,
        typer.Option("--slurm", help="Show the Slurm adapter's last `slurm sync --apply` pass as the queue."),
    ] = False,
    source: Annotated[
        str | None,
        typer.Option(
            help="Only jobs of this source (one cluster of a store that holds several).", show_default=False
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8080,
    token: Annotated[
        str | None,
        typer.Option(
            help="Require this secret on every request but /healthz (Authorization: Bearer TOKEN, or "
            f"?token=TOKEN once in a browser); ${TOKEN_ENV} also sets it. For more, use a reverse proxy with "
            "authentication.",
            show_default=False,
        ),
    ] = None,
    metrics_per_user: Annotated[
        bool,
        typer.Option(
            "--metrics-per-user", help="Add per-user series to /metrics (one label value per user)."
        ),
    ] = False,
    simulations: Annotated[
        Path | None,
        typer.Option(
            help="A folder of `headway simulate --json` outputs to list on the Simulations page.",
            show_default=False,
        ),
    ] = None,
    gpu_hour_price: Annotated[
        float, typer.Option("--gpu-hour-price", help="USD per GPU-hour for the cost of waste.", min=0.0)
    ] = 2.0,
    include_cpu: Annotated[bool, typer.Option("--include-cpu", help="Audit CPU-only jobs too.")] = False,
) -> None:
    """Serve the dashboard: the audit week by week, before and after a date, the live queue and why each job
    waits, users and job names, headway's decisions, simulations; the same as JSON under /api/ (schema at
    /docs), Prometheus metrics at /metrics. Read-only: it never writes the store or Slurm."""
    from headway.store import StoreError, default_db_path

    if state_dir is not None and slurm:
        fail("--state-dir and --slurm: give one live queue, not both")
    path = db if db is not None else default_db_path()
    if not path.exists():
        fail(f"{path}: no job store here yet (run `headway ingest` first, or pass --db)")
    if simulations is not None and not simulations.is_dir():
        fail(f"--simulations {simulations}: not a folder")
    token = token or os.environ.get(TOKEN_ENV) or None
    from headway.store import JobStore

    try:
        with JobStore(path, read_only=True, wait=60.0):
            pass
    except StoreError as e:
        fail(str(e))
    if not _loopback(host) and token is None:
        err.print(
            f"warning: listening on {host} without --token: anyone who can reach port {port} can read every "
            "job's user, name and outcome. Put a reverse proxy with authentication in front, or give --token."
        )
    import uvicorn

    from headway.web import ServeConfig, create_app

    cfg = ServeConfig(
        db=path,
        state_dir=state_dir,
        slurm=slurm,
        source=source,
        token=token,
        metrics_per_user=metrics_per_user,
        gpu_hour_price=gpu_hour_price,
        include_cpu=include_cpu,
        simulations=simulations,
    )
    err.print(f"headway serve: http://{host}:{port}/ (store {path}; Ctrl-C stops)")
    try:
        uvicorn.run(create_app(cfg), host=host, port=port, log_level="warning", access_log=False)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
