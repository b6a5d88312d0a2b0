"""`headway daemon`: run this server's embedded job queue in the foreground."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from headway.console import err, fail, safe_escape

StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Queue state directory (default $HEADWAY_STATE_DIR, else ~/.local/state/headway; "
        "a shared server typically uses /var/lib/headway).",
        show_default=False,
    ),
]


def daemon(
    gpus: Annotated[
        str,
        typer.Option(
            help="GPUs to hand out: `auto` (detect with NVML), a count N (N logical GPUs, for machines "
            "without GPUs), or indices such as 0,1,3 (one index alone: 3, with a comma)."
        ),
    ] = "auto",
    state_dir: StateDirOpt = None,
    policy: Annotated[
        str,
        typer.Option(
            help="Queue order: `impact` (successful work per GPU-hour) or `fifo` (submit order), or any "
            "policy."
        ),
    ] = "impact",
    db: Annotated[
        Path | None,
        typer.Option(
            "--db",
            help="DuckDB job store that ended jobs are written to (default: jobs.duckdb in the state dir).",
        ),
    ] = None,
    history: Annotated[
        list[Path] | None,
        typer.Option(
            "--history",
            help="Extra job stores (e.g. from `headway ingest`) the predictor also learns from. Repeatable.",
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(help="Seconds between SIGTERM and SIGKILL when a job hits its limit or is cancelled."),
    ] = 10.0,
    preempt_grace: Annotated[
        float,
        typer.Option(
            help="Seconds between SIGTERM and SIGKILL when a preemptible job is preempted (its time to "
            "write a checkpoint); it is then requeued under the same id."
        ),
    ] = 30.0,
    quiet: Annotated[
        bool, typer.Option(help="Log to the state dir's daemon.log only, not to stderr.")
    ] = False,
) -> None:
    """Run the job queue of this server in the foreground until SIGTERM (systemd-ready).

    State (SQLite, WAL), the client socket, per-job logs and daemon.log live in the state directory.
    Jobs run under small supervisor processes that survive a daemon crash; a restarted daemon adopts them.
    Started as root, it runs each job as the user who submitted it.
    """
    from headway.local.daemon import DaemonConfig, DaemonError, run_daemon
    from headway.local.gpus import GpuSpecError, device_uuids, resolve_gpus
    from headway.local.ordering import LocalPlanner, build_predictor, load_book
    from headway.local.paths import MODEL_FILE, resolve_state_dir
    from headway.policy import live_policy_error

    if (problem := live_policy_error(policy)) is not None:
        fail(problem)
    if not 0 <= grace < math.inf:  # NaN too: a NaN grace would never send the SIGKILL
        fail(f"--grace must be a number of seconds >= 0, got {grace}")
    if not 0 <= preempt_grace < math.inf:
        fail(f"--preempt-grace must be a number of seconds >= 0, got {preempt_grace}")
    if db is not None:  # checked now, not at the first job end (which would retry every second, forever)
        if db.is_dir():
            fail(f"--db {db}: is a directory; give a file name for the job store")
        if not db.parent.is_dir():
            fail(f"--db {db}: no such directory {db.parent}")
        if db.exists():
            from headway.store import JobStore, StoreError

            try:
                JobStore(db, read_only=True).close()
            except StoreError as e:
                fail(f"--db {e}")
    try:
        inv = resolve_gpus(gpus)
    except GpuSpecError as e:
        fail(str(e))
    if gpus == "auto" and not inv.ids:
        err.print(
            f"[yellow]warning:[/] no GPUs detected ({safe_escape(inv.note or 'NVML found none')}); only "
            "--gpus 0 jobs can run. Use --gpus N for N logical GPUs.",
            markup=True,
        )
    sd = resolve_state_dir(state_dir)
    cfg = DaemonConfig(
        state_dir=sd,
        gpu_ids=inv.ids,
        policy=policy,
        store_path=db,
        grace=grace,
        preempt_grace=preempt_grace,
        gpu_note=inv.note,
        gpu_names=inv.names,
        # `--gpus 4` or `0,1` on a machine with GPUs hands out real devices: lock them as such
        device_uuids=inv.uuids if inv.source == "nvml" else device_uuids(),
    )
    for h in history or []:
        if not h.exists():
            fail(f"--history {h}: no such job store")
    try:
        book = load_book(sd)
        planner = LocalPlanner(policy, book)
        extra = list(history or [])
        run_daemon(
            cfg,
            planner,
            log_to_stderr=not quiet,
            predictor_factory=lambda: build_predictor(cfg.store, extra, sd / MODEL_FILE),
        )
    except DaemonError as e:
        fail(str(e))
