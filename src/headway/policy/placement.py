"""Gang placement over a cluster's free GPUs: pure functions over arrays, plus `take` for a scratch copy.

`first-fit`: the first node (in node order) that holds the whole gang; else nodes in order.
`topology`: the fewest nodes, then the fewest racks (switches), then the tightest fit, so that large
jobs still find whole nodes and racks later. Fractional jobs (< 1 GPU) go to one GPU with enough free
share: the first such GPU (first-fit) or the one with the least free share that fits (topology).
"""

from __future__ import annotations

import math

import numpy as np

from headway.policy.snapshot import FULL_SHARE, I64, Allocation

PLACEMENTS: tuple[str, ...] = ("first-fit", "topology")
_BIG = np.iinfo(np.int64).max // 4


def gang_size(gpus: float) -> tuple[int, int]:
    """(whole GPUs, milli-GPU share): a request under 1 GPU shares one GPU; above, it rounds up."""
    if not gpus > 0:
        return 0, 0
    if gpus < 1.0:
        return 0, max(1, min(FULL_SHARE, round(gpus * FULL_SHARE)))
    return math.ceil(gpus - 1e-9), 0


def max_nodes_for(gpus: float, nodes_requested: int, max_node_gpus: int) -> int:
    """Nodes a gang may span: what it asked for, but at least enough for its GPUs on the largest node."""
    whole, _ = gang_size(gpus)
    need = math.ceil(whole / max_node_gpus) if max_node_gpus > 0 and whole > 0 else 1
    return max(int(nodes_requested or 1), need, 1)


def fits_empty(node_gpus: I64, gpus: float, max_nodes: int) -> bool:
    """Whether the gang could run at all on this cluster when it is empty."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        return milli == 0 or bool((node_gpus > 0).any())
    top = np.sort(node_gpus)[::-1][:max_nodes]
    return int(top.sum()) >= whole


def placeable(free: I64, share: I64, gpus: float, max_nodes: int) -> bool:
    """Whether some placement exists now (placement-independent; used for fragmentation)."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        return milli == 0 or bool((share >= milli).any())
    if max_nodes == 1:
        return bool(free.max(initial=0) >= whole)
    top = np.partition(free, len(free) - max_nodes)[-max_nodes:] if max_nodes < len(free) else free
    return int(top.sum()) >= whole


def place(
    how: str, free: I64, share: I64, rack: I64, n_racks: int, gpus: float, max_nodes: int
) -> Allocation | None:
    """An Allocation for the gang on the free GPUs, or None when it cannot be placed now."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        if milli == 0:
            return Allocation((), ())
        return _place_fraction(how, share, milli, free, rack, n_racks)
    if how == "topology":
        return _topology(free, rack, n_racks, whole, max_nodes)
    if how == "first-fit":
        return _first_fit(free, whole, max_nodes)
    raise ValueError(f"unknown placement {how!r}; choose one of {', '.join(PLACEMENTS)}")


def _place_fraction(
    how: str, share: I64, milli: int, free: I64 | None = None, rack: I64 | None = None, n_racks: int = 1
) -> Allocation | None:
    ok = share >= milli
    if how == "first-fit":
        flat = int(np.argmax(ok))
        if not ok.flat[flat]:
            return None
    else:
        # Tightest GPU first; among equally free GPUs, the node with the fewest whole free GPUs, then the
        # tightest rack, so that empty GPUs, nodes and racks stay whole for the jobs that need them.
        cand = np.where(ok, share, _BIG)
        smin = int(cand.min())
        if smin >= _BIG:
            return None
        rows, cols = np.nonzero(cand == smin)
        if free is None or len(rows) == 1:
            return Allocation((int(rows[0]),), (0,), int(cols[0]), milli)
        key = free[rows].astype(np.int64)
        if rack is not None:
            rack_free = np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64)
            key = np.minimum(key, 1023) * (1 << 32) + rack_free[rack[rows]]
        j = int(np.argmin(key))
        return Allocation((int(rows[j]),), (0,), int(cols[j]), milli)
    node, gpu = divmod(flat, share.shape[1])
    return Allocation((node,), (0,), gpu, milli)


def _first_fit(free: I64, g: int, max_nodes: int) -> Allocation | None:
    one = free >= g
    i = int(np.argmax(one))
    if one[i]:
        return Allocation((i,), (g,))
    if max_nodes == 1:
        return None
    nz = np.flatnonzero(free > 0)
    cs = np.cumsum(free[nz])
    if len(cs) == 0 or cs[-1] < g:
        return None
    k = int(np.searchsorted(cs, g)) + 1
    if k > max_nodes:  # in-order nodes would span too many: fall back to the fullest ones
        return _largest_first(free, g, max_nodes)
    return _counts(free, nz[:k].tolist(), g)


def _largest_first(free: I64, g: int, max_nodes: int) -> Allocation | None:
    order = np.argsort(-free, kind="stable")[:max_nodes]
    if int(free[order].sum()) < g:
        return None
    cs = np.cumsum(free[order])
    k = int(np.searchsorted(cs, g)) + 1
    return _counts(free, order[:k].tolist(), g)


def _counts(free: I64, nodes: list[int], g: int) -> Allocation:
    counts: list[int] = []
    left = g
    for n in nodes:
        c = min(int(free[n]), left)
        counts.append(c)
        left -= c
    return Allocation(tuple(nodes), tuple(counts))


def _tightest_for_rest(free: I64, chosen: list[int], candidates: list[int], rest: int) -> int | None:
    best, best_free = None, None
    taken = set(chosen)
    for n in candidates:
        f = int(free[n])
        if n in taken or f < rest:
            continue
        if best_free is None or f < best_free:
            best, best_free = n, f
    return best


def _topology(free: I64, rack: I64, n_racks: int, g: int, max_nodes: int) -> Allocation | None:
    ok1 = free >= g
    if ok1.any():  # one node: in the tightest rack that holds it, the tightest node
        rack_free = np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64)
        key = np.where(ok1, rack_free[rack] * 1024 + np.minimum(free, 1023), _BIG)
        i = int(np.argmin(key))
        return Allocation((i,), (g,))
    if max_nodes == 1:
        return None
    order = np.argsort(-free, kind="stable")
    cs = np.cumsum(free[order])
    if cs[-1] < g:
        return None
    k = int(np.searchsorted(cs, g)) + 1  # fewest nodes possible
    if k > max_nodes:
        return None
    # Fewest racks: is there one rack whose k fullest nodes hold the gang? Take the tightest such rack.
    by_rack = np.lexsort((-free, rack))
    r_sorted = rack[by_rack]
    starts = np.searchsorted(r_sorted, np.arange(n_racks))
    within = np.arange(len(free)) - starts[r_sorted]
    fr = free[by_rack]
    topk = np.bincount(r_sorted, weights=np.where(within < k, fr, 0), minlength=n_racks)
    ok = topk >= g
    if ok.any():
        total = np.bincount(rack, weights=free, minlength=n_racks)
        r = int(np.argmin(np.where(ok, total, np.inf)))
        in_rack = by_rack[starts[r] : starts[r] + int((r_sorted == r).sum())]
        nodes = in_rack.tolist()
    else:
        nodes = order.tolist()
    chosen = nodes[: k - 1]
    rest = g - int(free[chosen].sum()) if chosen else g
    last = _tightest_for_rest(free, chosen, nodes, rest)
    if last is None:  # cannot happen when the first k nodes hold it; keep the safe answer
        return _counts(free, nodes[:k], g)
    return _counts(free, [*chosen, last], g)


def take(free: I64, share: I64, alloc: Allocation) -> list[tuple[int, int]]:
    """Apply an allocation to (scratch or live) arrays; returns the (node, gpu) pairs it used."""
    used: list[tuple[int, int]] = []
    if alloc.frac_gpu >= 0:
        n, gi = alloc.nodes[0], alloc.frac_gpu
        if share[n, gi] == FULL_SHARE:
            free[n] -= 1
        share[n, gi] -= alloc.frac_milli
        used.append((n, gi))
        return used
    for n, c in zip(alloc.nodes, alloc.counts, strict=True):
        row = share[n]
        idx = (row == FULL_SHARE).nonzero()[0][:c]
        row[idx] = 0
        free[n] -= c
        used.extend([(n, gi) for gi in idx.tolist()])
    return used
