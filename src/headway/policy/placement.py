"""Gang placement over a cluster's free GPUs: pure functions over arrays, plus `take` for a scratch copy.

`first-fit`: the first node (in node order) that holds the whole gang; else nodes in order.
`topology`: the fewest nodes, then the fewest racks (switches), then the tightest fit, so that large
jobs still find whole nodes and racks later. Fractional jobs (< 1 GPU) go to one GPU with enough free
share: the first such GPU (first-fit) or the one with the least free share that fits (topology).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from headway.policy.snapshot import FULL_SHARE, I64, Allocation

PLACEMENTS: tuple[str, ...] = ("first-fit", "topology")
_BIG = np.iinfo(np.int64).max // 4
_NODE_BITS = 21  # FreeIndex packs (key, node) into one int: nodes below 2M
_NODE_MASK = (1 << _NODE_BITS) - 1


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


def _topology(
    free: I64, rack: I64, n_racks: int, g: int, max_nodes: int, rack_free: I64 | None = None
) -> Allocation | None:
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
        total = rack_free if rack_free is not None else np.bincount(rack, weights=free, minlength=n_racks)
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


class FreeIndex:
    """A pass's scratch free GPUs with per-rack totals and the one-node topology key kept current.

    A pass starts hundreds of jobs; recomputing rack totals and scanning every node for each one was
    most of its cost. After a few placements the index switches to one heap of (key, node) per free
    count, updated only for the rack a start touches (stale entries are skipped when they surface).
    Placements equal `place` on the same arrays, ties included; starts must go through `take`.
    """

    __slots__ = (
        "_calls",
        "_ff",
        "_free_l",
        "_heaps",
        "_key_l",
        "_members",
        "_partial",
        "_rack_free",
        "free",
        "n_racks",
        "node_key",
        "rack",
        "share",
        "total",
    )
    BUCKETS_AFTER = 8  # one-node placements served by vector scans before the heaps are built

    def __init__(self, free: I64, share: I64, rack: I64, n_racks: int) -> None:
        self.free, self.share, self.rack, self.n_racks = free, share, rack, n_racks
        self._rack_free: I64 | None = None  # free GPUs per rack, built when topology needs it
        self.node_key: I64 | None = None  # one-node topology key; None when stale (rebuilt on demand)
        self.total = int(free.sum())
        self._partial: dict[tuple[int, int], int] | None = None  # GPUs partly shared: built on demand
        self._calls = 0
        self._heaps: list[list[int]] | None = None  # per free count, (key << _NODE_BITS | node)
        self._ff: list[list[int]] = []  # per free count, node numbers (stale ones skipped)
        self._free_l: list[int] = []
        self._key_l: list[int] = []
        self._members: list[list[int]] = []

    def _build(self) -> None:
        """The per-free-count heaps: node numbers (for `max_free`) and packed topology keys."""
        free_l = self.free.tolist()
        top = max(free_l, default=0)
        if top > 1023 or len(free_l) > _NODE_MASK:  # outside what the packed keys hold: vector path
            self._calls = -(1 << 62)
            return
        self._free_l = free_l
        self._ff = [[] for _ in range(top + 1)]
        for n, f in enumerate(free_l):
            if f > 0:
                self._ff[f].append(n)  # ascending: already a valid heap
        key_l = self._node_key().tolist()
        heaps: list[list[int]] = [[] for _ in range(top + 1)]
        for n, f in enumerate(free_l):
            if f > 0:
                heaps[f].append(key_l[n] << _NODE_BITS | n)  # (key, node) packed in one int
        for h in heaps:
            heapq.heapify(h)
        members: list[list[int]] = [[] for _ in range(self.n_racks)]
        for n, r in enumerate(self.rack.tolist()):
            members[r].append(n)
        self._heaps, self._key_l, self._members = heaps, key_l, members

    @property
    def rack_free(self) -> I64:
        if self._rack_free is None:
            self._rack_free = np.bincount(self.rack, weights=self.free, minlength=self.n_racks).astype(
                np.int64
            )
        return self._rack_free

    def _node_key(self) -> I64:
        if self.node_key is None:
            self.node_key = self.rack_free[self.rack] * 1024 + np.minimum(self.free, 1023)
        return self.node_key

    def _top(self, f: int) -> int:
        """The valid packed (key, node) at the top of free count f's heap (-1: none); drops stale ones."""
        assert self._heaps is not None
        h, free_l, key_l = self._heaps[f], self._free_l, self._key_l
        while h:
            e = h[0]
            n = e & _NODE_MASK
            if free_l[n] == f and key_l[n] == e >> _NODE_BITS:
                return e
            heapq.heappop(h)
        return -1

    def max_free(self) -> int:
        """The largest whole-GPU free count on one node."""
        if not self._free_l:
            return int(self.free.max(initial=0))
        free_l = self._free_l
        for f in range(len(self._ff) - 1, 0, -1):
            h = self._ff[f]
            while h and free_l[h[0]] != f:
                heapq.heappop(h)
            if h:
                return f
        return 0

    def place(self, how: str, gpus: float, max_nodes: int) -> Allocation | None:
        whole, milli = gang_size(gpus)
        if how != "topology":  # first-fit's vector scan stops at the first fit: already cheap
            return place(how, self.free, self.share, self.rack, self.n_racks, gpus, max_nodes)
        if whole == 0:
            return Allocation((), ()) if milli == 0 else self._fraction(milli)
        self._calls += 1
        if not self._free_l and self._calls > self.BUCKETS_AFTER:
            self._build()
        if self._heaps is not None:
            best = -1
            for f in range(whole, len(self._heaps)):
                t = self._top(f)
                if t >= 0 and (best < 0 or t < best):
                    best = t
            if best >= 0:
                return Allocation((best & _NODE_MASK,), (whole,))
        else:
            cand = np.where(self.free >= whole, self._node_key(), _BIG)
            i = int(cand.argmin())
            if cand[i] < _BIG:
                return Allocation((i,), (whole,))
        if max_nodes == 1:
            return None
        return _topology(self.free, self.rack, self.n_racks, whole, max_nodes, self.rack_free)

    def _partials(self) -> dict[tuple[int, int], int]:
        if self._partial is None:
            sh = self.share
            rows, cols = np.nonzero((sh > 0) & (sh < FULL_SHARE))
            self._partial = {(r, c): int(sh[r, c]) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
        return self._partial

    def _fraction(self, milli: int) -> Allocation | None:
        """`_place_fraction("topology", ...)`: the tightest partly used GPU, else a whole free one."""
        free, rack_free, rack = self.free, self.rack_free, self.rack
        fits = [(s, rc) for rc, s in self._partials().items() if s >= milli]
        if fits:
            smin = min(s for s, _ in fits)
            pairs = sorted(rc for s, rc in fits if s == smin)
            keys = [min(int(free[n]), 1023) * (1 << 32) + int(rack_free[rack[n]]) for n, _ in pairs]
            n, gi = pairs[keys.index(min(keys))]
            return Allocation((n,), (0,), gi, milli)
        if self._heaps is not None:
            n = -1
            for f in range(1, len(self._heaps)):  # fewest whole free GPUs, then tightest rack, then index
                t = self._top(f)
                if t >= 0:
                    n = t & _NODE_MASK
                    break
            if n < 0:
                return None
        else:
            key = np.where(free >= 1, np.minimum(free, 1023) * (1 << 32) + rack_free[rack], _BIG)
            n = int(key.argmin())
            if key[n] >= _BIG:
                return None
        gi = int(np.argmax(self.share[n] == FULL_SHARE))
        return Allocation((n,), (0,), gi, milli)

    def take(self, alloc: Allocation) -> list[tuple[int, int]]:
        free, rack = self.free, self.rack
        before = [int(free[n]) for n in alloc.nodes]
        used = take(free, self.share, alloc)
        if alloc.frac_gpu >= 0 and self._partial is not None:
            n, gi = used[0]
            s = int(self.share[n, gi])
            if 0 < s < FULL_SHARE:
                self._partial[(n, gi)] = s
            else:
                self._partial.pop((n, gi), None)
        heaps, free_l = self._heaps, self._free_l
        for n, was in zip(alloc.nodes, before, strict=True):
            now = int(free[n])
            if now == was:
                continue
            self.total -= was - now
            self.node_key = None
            if free_l:
                free_l[n] = now
                if now > 0:
                    heapq.heappush(self._ff[now], n)
            if self._rack_free is None:
                continue
            r = int(rack[n])
            self._rack_free[r] -= was - now
            if heaps is not None:
                rf = int(self._rack_free[r]) * 1024
                key_l = self._key_l
                for m in self._members[r]:
                    fm = free_l[m]
                    key_l[m] = rf + min(fm, 1023)
                    if fm > 0:
                        heapq.heappush(heaps[fm], key_l[m] << _NODE_BITS | m)
        return used
