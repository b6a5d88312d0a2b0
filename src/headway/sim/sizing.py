"""Whether a model cluster suits the log replayed on it: the offered load, and a size that fits better.

A log replayed on a cluster many times its own size shows every policy tied (every job starts at
once), and on one far smaller every wait is the cluster's, not the policy's; nothing in the table says
so. The offered load says it: GPU-hours demanded / (GPUs x the window they arrive in). It is the
figure `--load` sets and the table's title shows; for a log whose jobs were all submitted in the same
second (no arrival window) the window is the log's own span instead, from its first submission to its
last recorded end, so a batch submitted at once still gets a figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.sim.cluster import ClusterSpec

LOW, HIGH = 0.5, 1.5  # outside these the note says the cluster does not suit the log
TARGET = 0.9  # the load a suggested size aims for: busy, with queues that policies can reorder
ARRIVALS = "arrivals"  # the window: first to last submission (what --load rescales)
LOG_SPAN = "first submission to last end"  # the window when every job arrives in the same second
DEFAULT_GPUS_PER_NODE = 8  # simulate's --gpus-per-node default: a suggestion need not repeat it


@dataclass(frozen=True, slots=True)
class LoadCheck:
    """The offered load of the replayed jobs on one cluster, and a node count for TARGET when it is off."""

    offered_load: float | None  # None: no GPU-hours, or no window at all
    window: str  # ARRIVALS or LOG_SPAN
    window_s: float
    gpu_hours: float
    capacity_gpus: int
    suggested_nodes: int | None = None
    gpus_per_node: int | None = None  # of the suggested uniform cluster
    suggested_load: float | None = None

    @property
    def verdict(self) -> str:
        """`low`, `high`, `ok`, or `unknown` (no figure)."""
        x = self.offered_load
        if x is None:
            return "unknown"
        return "low" if x < LOW else "high" if x > HIGH else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "offered_load": self.offered_load,
            "window": self.window,
            "window_s": self.window_s,
            "gpu_hours": self.gpu_hours,
            "capacity_gpus": self.capacity_gpus,
            "verdict": self.verdict,
            "suggested_nodes": self.suggested_nodes,
            "suggested_gpus_per_node": self.gpus_per_node,
            "suggested_load": self.suggested_load,
        }

    def note(self, replaces: str | None = None) -> str | None:
        """One or two sentences for the terminal when the load is off (None when it is fine).
        `replaces`: the option that gave the cluster (`--cluster from-log`), which the suggested uniform
        cluster's flags replace; None for the flags' own cluster, where `--nodes` alone changes it."""
        x = self.offered_load
        if x is None or self.verdict == "ok":
            return None
        over = "" if self.window == ARRIVALS else f" (from its {LOG_SPAN}: the jobs arrive at once)"
        what = (
            f"offered load {x:.2g} on {self.capacity_gpus:,} GPUs{over} is below {LOW:g}: jobs rarely "
            "wait, so the policies differ little"
            if self.verdict == "low"
            else f"offered load {x:.2g} on {self.capacity_gpus:,} GPUs{over} is above {HIGH:g}: the queue "
            "only grows, so waits show the cluster's size more than the policy"
        )
        if self.suggested_nodes is None or self.suggested_load is None or self.gpus_per_node is None:
            return what + "."
        flags = f"--nodes {self.suggested_nodes}"
        if replaces is not None or self.gpus_per_node != DEFAULT_GPUS_PER_NODE:
            flags += f" --gpus-per-node {self.gpus_per_node}"
        if replaces is not None:
            flags += f" in place of {replaces}"
        alt = f", or --load {TARGET:g} to rescale the arrivals instead" if self.window == ARRIVALS else ""
        return (
            f"{what}. For a load near {TARGET:g}, try {flags} "
            f"({self.suggested_nodes * self.gpus_per_node:,} GPUs, offered load {self.suggested_load:.2g})"
            f"{alt}."
        )


def typical_node_gpus(spec: ClusterSpec) -> int:
    """The most common GPUs per node (the larger on a tie): the node a suggested uniform cluster repeats."""
    sizes: dict[int, int] = {}
    for n in spec.nodes:
        sizes[n.gpus] = sizes.get(n.gpus, 0) + 1
    return max(sizes, key=lambda g: (sizes[g], g)) if sizes else DEFAULT_GPUS_PER_NODE


def suggest_nodes(
    gpu_seconds: float, window_s: float, gpus_per_node: int, largest_job: float, target: float = TARGET
) -> tuple[int, float] | None:
    """The node count whose offered load is nearest `target` among those that still hold the largest
    job, with that load; None without a window or demand."""
    if not (gpu_seconds > 0 and window_s > 0 and gpus_per_node > 0):
        return None
    ideal = gpu_seconds / (target * gpus_per_node * window_s)
    least = max(1, math.ceil(largest_job / gpus_per_node - 1e-9))
    cands = {max(least, math.floor(ideal)), max(least, math.ceil(ideal))}

    def load(n: int) -> float:
        return gpu_seconds / (n * gpus_per_node * window_s)

    # Nearest in absolute terms, which leans to the lighter side (and on a tie the larger cluster): past
    # 1 the queue only grows, so 1.25 is further from a useful replay than 0.625 is.
    best = min(cands, key=lambda n: (abs(load(n) - target), -n))
    return best, load(best)


def check_load(jobs: pa.Table, spec: ClusterSpec, *, include_cpu: bool = False) -> LoadCheck:
    """The offered load of the jobs a replay on `spec` keeps (the same ones: `prepare` picks them) and,
    outside [LOW, HIGH], a uniform cluster of the same typical node for TARGET."""
    from headway.sim.run import prepare

    arrays, truth, *_ = prepare(jobs, spec, include_cpu=include_cpu)
    g = np.asarray(arrays.gpus, dtype=np.float64)
    demand = float((g * np.asarray(truth.runtime, dtype=np.float64)).sum())
    cap = spec.capacity_gpus
    window = float(arrays.submit[-1]) if len(arrays.submit) else 0.0
    kind = ARRIVALS
    if window <= 0 and len(arrays.submit):  # all at once: the log's own span, to its last recorded end
        kind = LOG_SPAN
        mine = jobs.filter(pc.is_in(jobs.column("job_id"), pa.array(list(arrays.job_id), pa.string())))
        last_end = pc.max(mine.column("end_time")).as_py()
        if last_end is not None:
            window = last_end.timestamp() - arrays.epoch0
    # Over the arrivals, the very formula of `prepare`'s natural load (the table title's figure).
    offered = demand / (cap * window) if demand > 0 and window > 0 and cap > 0 else None
    base = LoadCheck(offered, kind, window, demand / 3600.0, cap)
    if base.verdict not in ("low", "high"):
        return base
    gpn = typical_node_gpus(spec)
    sug = suggest_nodes(demand, window, gpn, float(g.max(initial=0.0)))
    if sug is None:
        return base
    return LoadCheck(offered, kind, window, demand / 3600.0, cap, sug[0], gpn, sug[1])
