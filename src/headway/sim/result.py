"""What one simulation run hands to metrics, reports and `--explain` (engine -> metrics contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

# Jobs without a user share this one name inside a run (one fair-share account, as Slurm would bill
# them to one); the result's `user` column gives them null, so per-user metrics leave them out.
UNKNOWN_USER = "(unknown)"

# One row per simulated job. Times are seconds on the simulation clock (0 = first arrival).
#   job_id str, user str, group str|null, name str|null, gpus float, nodes_used int, racks_used int,
#   submit float, start float|null (null: never started before the end), end float|null,
#   runtime float (the recorded runtime it ran), state str (its recorded final state),
#   preemptions int, restarts int (LAS), time_limit float|null,
#   p_success float, pred_runtime float (the predictions the policy saw at its first ranking),
#   priority_class str, preemptible bool (at its end: a survived probe is), lost_s float (seconds held
#   for work redone or restarts because of preemptions), probe_lost_s float (the same for fail-fast
#   probes), held_s float (seconds it held GPUs over all its runs: runtime + lost_s + probe_lost_s once
#   it ended), probed bool (stopped at a probe's end), frag_at_submit float|null (high and urgent jobs:
#   free GPUs at its arrival when enough in number but unable to hold its gang, else 0)
JOB_COLUMNS: tuple[str, ...] = (
    "job_id",
    "user",
    "group",
    "name",
    "gpus",
    "nodes_used",
    "racks_used",
    "submit",
    "start",
    "end",
    "runtime",
    "state",
    "preemptions",
    "restarts",
    "time_limit",
    "p_success",
    "pred_runtime",
    "priority_class",
    "preemptible",
    "lost_s",
    "probe_lost_s",
    "held_s",
    "probed",
    "frag_at_submit",
)

# One row per change of cluster state (piecewise constant until the next row):
#   t float, busy_gpus float, free_gpus float, pending int, running int,
#   frag_free_gpus float (free GPUs at t if some pending job fits the free GPU *count* but cannot be
#   placed, else 0: DESIGN.md's fragmentation, time-averaged by metrics), completed_total int,
#   goodput_gpu_hours_total float
TIMELINE_COLUMNS: tuple[str, ...] = (
    "t",
    "busy_gpus",
    "free_gpus",
    "pending",
    "running",
    "frag_free_gpus",
    "completed_total",
    "goodput_gpu_hours_total",
)


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """One scheduling pass's view of a waiting job, kept for `simulate --explain`."""

    t: float
    rank: int
    of: int
    score: float
    reason: str
    reservation_start: float | None = None


@dataclass(slots=True)
class SimResult:
    policy: str
    placement: str
    jobs: pa.Table  # JOB_COLUMNS
    timeline: pa.Table  # TIMELINE_COLUMNS
    capacity_gpus: float
    load: float  # offered GPU-hours / capacity after --load rescaling
    excluded: list[str] = field(default_factory=list)  # "job_id: needs N GPUs, cluster has M" lines
    explain: dict[str, list[WaitRecord]] = field(default_factory=dict)  # only for jobs asked about
    wall_seconds: float = 0.0
    events: int = 0
    # Additions (engine, compatible): why jobs were left out, by reason -> count (e.g. "never started
    # in the trace", "CPU-only", "larger than the cluster"); scheduling passes run; the natural load
    # before --load rescaling; Decisions (only when the engine was asked to log them).
    excluded_counts: dict[str, int] = field(default_factory=dict)
    passes: int = 0
    natural_load: float = 0.0
    decisions: list[Any] = field(default_factory=list)
