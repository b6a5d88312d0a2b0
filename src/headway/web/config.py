"""What `headway serve` was started with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ServeConfig:
    db: Path  # the job store (read-only)
    state_dir: Path | None = None  # the local queue's state dir: its live queue
    slurm: bool = False  # the Slurm adapter's last pass (from the store's decision log) as the live queue
    source: str | None = None  # one source of a store that holds several (also the Slurm source's name)
    token: str | None = None  # a shared secret every request but /healthz must carry
    metrics_per_user: bool = False  # per-user series on /metrics (unbounded label values: opt in)
    gpu_hour_price: float = 2.0
    include_cpu: bool = False
    simulations: Path | None = None  # a folder of `headway simulate --json` outputs to list
    refresh_s: float = 15.0  # how often the queue page refreshes itself
