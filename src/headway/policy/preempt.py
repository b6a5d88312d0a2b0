"""Choosing what to stop so that a waiting gang fits: the victims' side of every preemptive policy.

Two ways, one module: `make_room` stops candidates in the order a policy gives (Tiresias' lowest queue
first, Slurm's newest first) until the job fits, then drops the ones it did not need; `cheapest_block`
(impact) frees a contiguous block (fewest nodes, then racks, as topology placement prefers) at the least
expected cost. A preempted job resumes from its last checkpoint: `progress_lost` is what it redoes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from headway.policy.placement import gang_size, place, take
from headway.policy.snapshot import (
    F64,
    FULL_SHARE,
    I64,
    Allocation,
    ClusterView,
    PendingJobs,
    Snapshot,
    Start,
)

# A job that gives no `checkpoint_every` is taken to save its progress every 30 minutes (a common
# interval for training jobs); progress since its last checkpoint is lost when it is stopped.
DEFAULT_CHECKPOINT_S = 1800.0
DEFAULT_RESTART_S = 30.0
# The classes that may preempt (and whose time to start the simulator reports as "urgent" metrics).
URGENT_CLASSES: tuple[str, ...] = (
    "high",
    "urgent",
)  # seconds a restarted job spends before it does work again (load, warm-up)

Job = tuple[float, int, int]  # (gpus, max_nodes, whole GPUs) of the job to make room for


def progress_lost(elapsed: F64, checkpoint_every: F64) -> F64:
    """Seconds of work a run of `elapsed` seconds loses when stopped now: what it did since its last
    checkpoint (`checkpoint_every` NaN: DEFAULT_CHECKPOINT_S; 0 or less: it checkpoints on the stop)."""
    ce = np.where(np.isnan(checkpoint_every), DEFAULT_CHECKPOINT_S, checkpoint_every)
    e = np.maximum(elapsed, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        lost = np.where(ce > 0, np.fmod(e, np.where(ce > 0, ce, 1.0)), 0.0)
    return np.asarray(lost, dtype=np.float64)


def stop(view: ClusterView, free: I64, share: I64, v: int) -> bool:
    """Give running job `v`'s whole GPUs back on (free, share), in place; False when it holds none."""
    mask = view.owner == v
    if not mask.any():
        return False
    share[mask] = FULL_SHARE
    free += mask.sum(axis=1)
    return True


def _try(how: str, view: ClusterView, free: I64, share: I64, job: Job) -> Allocation | None:
    gpus, max_nodes, whole = job
    if whole > 0 and (whole > (free.sum() if max_nodes > 1 else free.max(initial=0))):
        return None
    return place(how, free, share, view.rack, view.n_racks, gpus, max_nodes)


def _after(
    how: str, view: ClusterView, free: I64, share: I64, victims: Sequence[int], job: Job
) -> tuple[Allocation | None, I64, I64]:
    """Where `job` fits once `victims` (running positions) are stopped, and the free GPUs then."""
    f2, s2 = free.copy(), share.copy()
    for v in victims:
        stop(view, f2, s2, v)
    return _try(how, view, f2, s2, job), f2, s2


def _commit(free: I64, share: I64, f2: I64, s2: I64, alloc: Allocation) -> None:
    free[:], share[:] = f2, s2
    take(free, share, alloc)


def make_room(
    how: str, view: ClusterView, free: I64, share: I64, cands: Sequence[int], job: Job
) -> tuple[list[int], Allocation] | None:
    """Stop candidates (running positions, in order) until `job` fits, keep only those it cannot fit
    without (latest added tried first), and place it: (victims, allocation), with (free, share) updated
    in place; None: it never fits."""
    f2, s2 = free.copy(), share.copy()
    chosen: list[int] = []
    alloc = None
    for v in cands:
        if not stop(view, f2, s2, v):
            continue
        chosen.append(v)
        alloc = _try(how, view, f2, s2, job)
        if alloc is not None:
            break
    if alloc is None:
        return None
    for v in reversed(chosen[:-1]):
        fewer = [u for u in chosen if u != v]
        got, g2, t2 = _after(how, view, free, share, fewer, job)
        if got is not None:
            chosen, alloc, f2, s2 = fewer, got, g2, t2
    _commit(free, share, f2, s2, alloc)
    return chosen, alloc


def _holdings(view: ClusterView, cands: Sequence[int]) -> dict[int, dict[int, int]]:
    """node -> {candidate: whole GPUs it holds there}."""
    held: dict[int, dict[int, int]] = {}
    mask = np.isin(view.owner, np.asarray(cands, dtype=np.int64))
    for n, g in zip(*np.nonzero(mask), strict=True):
        v = int(view.owner[n, g])
        on = held.setdefault(int(n), {})
        on[v] = on.get(v, 0) + 1
    return held


def _cheapest_on_node(need: int, on: dict[int, int], cost: F64) -> tuple[float, list[int]] | None:
    """The cheapest victims on one node that free `need` more GPUs there (greedy by cost per GPU, then
    pruned): (cost, victims); None: the node's candidates cannot free that many."""
    if need <= 0 or sum(on.values()) < need:
        return None
    order = sorted(on, key=lambda v: (float(cost[v]) / on[v], v))
    chosen: list[int] = []
    got = 0
    for v in order:
        chosen.append(v)
        got += on[v]
        if got >= need:
            break
    for v in sorted(chosen, key=lambda u: -float(cost[u])):
        if got - on[v] >= need:
            chosen.remove(v)
            got -= on[v]
    return float(sum(float(cost[v]) for v in chosen)), chosen


def cheapest_block(
    how: str, view: ClusterView, free: I64, share: I64, cands: Sequence[int], cost: F64, job: Job
) -> tuple[list[int], Allocation] | None:
    """Victims among `cands` (running positions; `cost` per running position) that free a contiguous
    block for `job`: one node if it fits one, else the fewest whole nodes within one rack, else across
    racks; the cheapest such set, then only the victims the placement still needs. (free, share) are
    updated in place; None: no such set."""
    _, max_nodes, whole = job
    if whole <= 0 or not cands:
        return None  # a GPU share: never worth stopping a job for (it waits for one to free)
    held = _holdings(view, cands)
    options: list[tuple[tuple[int, int, float], list[int]]] = []  # ((nodes, racks, cost), victims)
    for n, on in held.items():
        if whole <= int(view.node_gpus[n]):
            got = _cheapest_on_node(whole - int(free[n]), on, cost)
            if got is not None:
                options.append(((1, 1, got[0]), got[1]))
    if not options and max_nodes > 1:
        options = _multi_node(view, free, held, cost, whole, max_nodes)
    for _, victims in sorted(options, key=lambda o: o[0])[:4]:
        alloc, f2, s2 = _after(how, view, free, share, victims, job)
        if alloc is None:
            continue
        # The placement may use fewer of the freed GPUs than the plan (a gang victim freed GPUs on
        # another node too): keep only victims it cannot fit without, most expensive tried first.
        for v in sorted(victims, key=lambda u: -float(cost[u])):
            fewer = [u for u in victims if u != v]
            fit, g2, t2 = _after(how, view, free, share, fewer, job)
            if fit is not None and fit.n_nodes <= alloc.n_nodes:
                victims, alloc, f2, s2 = fewer, fit, g2, t2
        if not victims:
            return None  # it fits without stopping anything: on GPUs the pass kept for someone else
        _commit(free, share, f2, s2, alloc)
        return victims, alloc
    return None


def _multi_node(
    view: ClusterView, free: I64, held: dict[int, dict[int, int]], cost: F64, whole: int, max_nodes: int
) -> list[tuple[tuple[int, int, float], list[int]]]:
    """Multi-node options, fewest nodes first: for k nodes, each must give ceil(whole / k) GPUs (free, or
    freed by its cheapest victims); the k cheapest such nodes within one rack, and over the cluster. The
    first k with an option gives them all."""
    n_nodes = len(view.node_gpus)
    k_min = -(-whole // max(int(view.node_gpus.max(initial=1)), 1))
    for k in range(max(k_min, 2), max_nodes + 1):
        per = -(-whole // k)
        nodes: list[tuple[float, int, list[int]]] = []  # (cost, node, victims) of the nodes that can give
        for n in range(n_nodes):
            f = int(free[n])
            if per > int(view.node_gpus[n]):
                continue
            if f >= per:
                nodes.append((0.0, n, []))
                continue
            got = _cheapest_on_node(per - f, held.get(n, {}), cost)
            if got is not None:
                nodes.append((got[0], n, got[1]))
        if len(nodes) < k:
            continue
        nodes.sort()
        groups: dict[int, list[tuple[float, int, list[int]]]] = {}
        for item in nodes:
            groups.setdefault(int(view.rack[item[1]]), []).append(item)
        out: list[tuple[tuple[int, int, float], list[int]]] = []
        for group in [*groups.values(), nodes]:
            if len(group) < k:
                continue
            picked = group[:k]
            if all(not v for _, _, v in picked):
                continue  # it fits without stopping anything: not this function's case
            victims = sorted({v for _, _, vs in picked for v in vs})
            racks = len({int(view.rack[n]) for _, n, _ in picked})
            out.append(((k, racks, float(sum(float(cost[v]) for v in victims))), victims))
        if out:
            return out
    return []


def class_rank(classes: Sequence[str], weights: dict[str, float]) -> F64:
    """Per class index, its weight (a job may stop only jobs of a strictly lower one); unknown: 1."""
    return np.array([weights.get(c, 1.0) for c in classes] or [1.0], dtype=np.float64)


def gang_of(p: PendingJobs, pos: int) -> Job:
    """(gpus, max_nodes, whole GPUs) of pending job `pos`: what the victim choosers place."""
    g = float(p.gpus[pos])
    return g, int(p.max_nodes[pos]), gang_size(g)[0]


class Planned:
    """What a preemptive policy's pass has chosen so far: victims taken (running positions), their keys
    in order, and the starts they make room for (`Policy.preemptions` returns `result()`)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.gone: set[int] = set()
        self.keys: list[int] = []
        self.starts: list[Start] = []

    def free_of(self, cands: list[int]) -> list[int]:
        """The candidates not already taken by an earlier start of this pass."""
        return [v for v in cands if v not in self.gone]

    def take(self, pos: int, plan: tuple[list[int], Allocation]) -> None:
        chosen, alloc = plan
        self.gone.update(chosen)
        keys = tuple(int(self.snap.running.key[v]) for v in chosen)
        self.keys.extend(keys)
        p = self.snap.pending
        self.starts.append(Start(int(p.key[pos]), str(p.job_id[pos]), alloc, preempts=keys))

    def result(self) -> tuple[list[int], list[Start]]:
        return self.keys, self.starts


def classes_waiting(snap: Snapshot, names: Sequence[str]) -> bool:
    """Whether a pending job belongs to one of these classes."""
    idx = [i for i, c in enumerate(snap.classes) if c in names]
    return bool(idx) and bool(np.isin(snap.pending.klass, idx).any())
