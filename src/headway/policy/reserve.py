"""Planning a reservation: when each GPU is expected free, and the earliest time the head's gang fits.

Pure functions over the snapshot and the pass's scratch GPUs (`Policy.decide` calls them for the first
job that does not fit, in easy mode). The plan also says each node's slack (GPUs free by the reserved
start beyond what the head needs: a job running past it may take that many, and no more of the free ones
now) and which GPUs it counts on being free by then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from headway.policy.placement import place, placeable
from headway.policy.snapshot import F64, FULL_SHARE, I64, Reservation, Snapshot

Bool2D = npt.NDArray[np.bool_]
# (reservation, its start (the shadow time), slack per node, counted[node, gpu])
Plan = tuple[Reservation, float, I64, Bool2D]
# GPUs a start in this pass took ([(node, gpu)]) and its pending position
Taken = list[tuple[list[tuple[int, int]], int]]


def release_times(
    snap: Snapshot, est_run: F64, share: I64, taken: Taken, est_pending: Callable[[], F64]
) -> F64:
    """[node, gpu]: when the GPU is expected whole and free (now if it is; inf: not known or absent).

    A whole GPU frees when its holder's expected end (`est_run`) comes; a shared one when its last
    sharer ends (known only through `ClusterView.frac_at`); one that this pass gave a share of, when
    that job's `est_pending` estimate ends."""
    view = snap.cluster
    # owner -2 (shared or absent) -> never, unless its sharers are known below; -1 (free at the
    # snapshot) -> -inf: now if still free, else the end of what this pass put on it.
    rel = np.append(est_run, [math.inf, -math.inf])[view.owner]
    if view.frac_at:
        nd, gi, at = _sharers(view.frac_at, snap.running.key)
        if len(at):
            rel[nd, gi] = -math.inf
            np.maximum.at(rel, (nd, gi), est_run[at])  # a shared GPU frees when its last sharer ends
    if taken:
        est_p = est_pending()
        for used, tpos in taken:
            e = snap.now + est_p[tpos] if math.isfinite(est_p[tpos]) else math.inf
            for nd_, gi_ in used:
                if share[nd_, gi_] < FULL_SHARE and e > rel[nd_, gi_]:
                    rel[nd_, gi_] = e
    rel[share == FULL_SHARE] = snap.now
    rel[np.isneginf(rel) | (view.share < 0)] = math.inf
    return rel


def plan_reservation(snap: Snapshot, pos: int, whole: int, share: I64, rel: F64, placement: str) -> Plan:
    """The earliest time pending job `pos` (`whole` GPUs) fits once GPUs free at their `rel` times."""
    p = snap.pending
    g = max(int(whole), 1)  # a fractional head is planned as one whole GPU (conservative)
    m = int(p.max_nodes[pos])
    key, jid = int(p.key[pos]), str(p.job_id[pos])
    rel_sorted = np.sort(rel, axis=1)
    if m == 1:
        if g > rel_sorted.shape[1]:
            return _never(key, jid, rel)
        t_node = rel_sorted[:, g - 1]
        node = int(np.argmin(t_node))
        t = float(t_node[node])
        if not math.isfinite(t):
            return _never(key, jid, rel)
        need = np.zeros(len(rel), dtype=np.int64)
        need[node] = g
        return _plan(Reservation(key, jid, t, (node,)), rel, need)
    gang_t = _earliest_gang_time(rel, rel_sorted, share, g, m)
    if gang_t is None:
        return _never(key, jid, rel)
    t = gang_t
    at_t = (rel <= t).sum(axis=1)
    view = snap.cluster
    alloc = place(placement, at_t.copy(), share, view.rack, view.n_racks, float(g), m)
    need = np.zeros(len(rel), dtype=np.int64)
    if alloc is not None:
        for nd_, c in zip(alloc.nodes, alloc.counts, strict=True):
            need[nd_] = c
    return _plan(Reservation(key, jid, t, alloc.nodes if alloc else ()), rel, need)


def _plan(res: Reservation, rel: F64, need: I64) -> Plan:
    counted = rel <= res.start
    return res, res.start, np.clip(counted.sum(axis=1) - need, 0, None), counted


def _never(key: int, jid: str, rel: F64) -> Plan:
    """No known time: no slack anywhere, and every GPU counted on."""
    no_slack = np.zeros(len(rel), np.int64)
    return Reservation(key, jid, math.inf, ()), math.inf, no_slack, np.ones(rel.shape, bool)


def _earliest_gang_time(rel: F64, rel_sorted: F64, share: I64, g: int, m: int) -> float | None:
    """The first release time at which a gang of g GPUs on up to m nodes fits (None: never): a binary
    search, as a gang that fits at some time fits at every later one."""
    flat = rel_sorted[np.isfinite(rel_sorted)]
    times = _candidate_times(flat, rel_sorted, g, m)
    lo, hi = 0, len(times) - 1
    if hi < 0 or not placeable((rel <= times[hi]).sum(axis=1), share, g, m):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if placeable((rel <= times[mid]).sum(axis=1), share, g, m):
            hi = mid
        else:
            lo = mid + 1
    return float(times[lo])


def _sharers(frac_at: Mapping[int, tuple[int, int]], running_key: I64) -> tuple[I64, I64, I64]:
    """(node, gpu, running position) of each running fractional job in `frac_at` (running key ->
    (node, gpu)); keys not among the running jobs are left out."""
    fk = np.fromiter(frac_at.keys(), dtype=np.int64, count=len(frac_at))
    loc = np.array(list(frac_at.values()), dtype=np.int64).reshape(-1, 2)
    srt = np.argsort(running_key, kind="stable")
    i = np.minimum(np.searchsorted(running_key[srt], fk), max(len(srt) - 1, 0))
    ok = (running_key[srt[i]] == fk) if len(srt) else np.zeros(len(fk), bool)
    return loc[ok, 0], loc[ok, 1], srt[i[ok]]


def _candidate_times(flat: F64, rel_sorted: F64, g: int, m: int) -> F64:
    """The sorted release times among which a multi-node head's reservation lies.

    Not before the g-th GPU is released (fewer GPUs cannot hold it); not after m nodes each have
    ceil(g / m) GPUs free (that holds it). Searching only between the two gives the same earliest time
    as searching all release times, over far fewer of them.
    """
    c = -(-g // m)
    n_nodes, per_node = rel_sorted.shape
    if len(flat) < g or c > per_node or m > n_nodes:
        return np.unique(flat)
    low = np.partition(flat, g - 1)[g - 1]
    high = np.partition(rel_sorted[:, c - 1], m - 1)[m - 1]
    if not math.isfinite(float(high)):
        return np.unique(flat)
    return np.unique(flat[(flat >= low) & (flat <= high)])
