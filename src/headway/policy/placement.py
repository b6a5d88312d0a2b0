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
    # Fewest nodes possible: the fullest nodes first (counted from the histogram of free counts).
    hist = np.bincount(free).tolist()
    k, acc = 0, 0
    for f in range(len(hist) - 1, 0, -1):
        c = hist[f]
        if acc + f * c >= g:
            k += -(-(g - acc) // f)
            break
        acc += f * c
        k += c
    else:
        return None  # all free GPUs together do not hold it
    if k > max_nodes:
        return None
    # Fewest racks: the tightest rack (then the lowest index) whose k fullest nodes hold the gang.
    total = rack_free if rack_free is not None else np.bincount(rack, weights=free, minlength=n_racks)
    cand = np.flatnonzero(total >= g)
    nodes: list[int] | None = None
    if len(cand):
        free_l = free.tolist()
        members = _rack_members(rack, n_racks)
        tot = total[cand].tolist()
        for _, r in sorted(zip(tot, cand.tolist(), strict=True)):
            in_rack = sorted(members[r], key=lambda n: -free_l[n])  # stable: ties by node index
            if sum(free_l[n] for n in in_rack[:k]) >= g:
                nodes = in_rack
                break
    if nodes is None:  # no rack holds it: the fullest nodes anywhere, the tightest node for the rest
        order = np.argsort(-free, kind="stable")
        chosen = order[: k - 1].tolist()
        rest = g - int(free[chosen].sum()) if chosen else g
        by_free = free[order]
        room = by_free >= rest
        room[: k - 1] = False
        if not room.any():  # cannot happen when the first k nodes hold it; keep the safe answer
            return _counts(free, order[:k].tolist(), g)
        tight = int(order[int(np.argmin(np.where(room, by_free, _BIG)))])  # first of the tightest
        return _counts(free, [*chosen, tight], g)
    chosen = nodes[: k - 1]
    rest = g - int(free[chosen].sum()) if chosen else g
    last = _tightest_for_rest(free, chosen, nodes, rest)
    if last is None:  # cannot happen when the first k nodes hold it; keep the safe answer
        return _counts(free, nodes[:k], g)
    return _counts(free, [*chosen, last], g)


_MEMBERS: dict[bytes, list[list[int]]] = {}


def _rack_members(rack: I64, n_racks: int) -> list[list[int]]:
    """Nodes of each rack in node order (a cluster's racks never change: cached by their bytes)."""
    key = rack.tobytes()
    got = _MEMBERS.get(key)
    if got is None or len(got) != n_racks:
        got = [[] for _ in range(n_racks)]
        for n, r in enumerate(rack.tolist()):
            got[r].append(n)
        if len(_MEMBERS) > 16:
            _MEMBERS.clear()
        _MEMBERS[key] = got
    return got


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
        if len(row) <= 64:  # a node's few GPUs: a plain scan beats three numpy calls
            idx_l = [gi for gi, v in enumerate(row.tolist()) if v == FULL_SHARE][:c]
            for gi in idx_l:
                row[gi] = 0
        else:
            idx = (row == FULL_SHARE).nonzero()[0][:c]
            row[idx] = 0
            idx_l = idx.tolist()
        free[n] -= c
        used.extend([(n, gi) for gi in idx_l])
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
        "_members",
        "_owned",
        "_partial",
        "_rack_free",
        "_rack_l",
        "_rf_l",
        "_rf_shared",
        "_total",
        "free",
        "n_racks",
        "node_key",
        "rack",
        "share",
    )
    BUCKETS_AFTER = 8  # one-node placements served by vector scans before the heaps are built

    def __init__(
        self,
        free: I64,
        share: I64,
        rack: I64,
        n_racks: int,
        rack_free: I64 | None = None,
        *,
        copy_on_write: bool = False,
    ) -> None:
        """`rack_free`: the racks' free totals for `free` when the caller keeps them (copied, not kept).
        `copy_on_write`: leave `free` and `share` untouched and copy them at the first `take` (read
        `self.free` and `self.share` after that); otherwise `take` writes them in place."""
        self.free, self.share, self.rack, self.n_racks = free, share, rack, n_racks
        self._owned = not copy_on_write
        # free GPUs per rack, built when topology needs it
        self._rack_free: I64 | None = rack_free
        self._rf_shared = rack_free is not None  # still the caller's array: copied before the first write
        self.node_key: I64 | None = None  # one-node topology key; None when stale (rebuilt on demand)
        self._total = -1  # whole free GPUs in all; counted on first use
        self._partial: dict[tuple[int, int], int] | None = None  # GPUs partly shared: built on demand
        self._calls = 0
        self._heaps: list[list[int]] | None = None  # per free count, (key << _NODE_BITS | node)
        self._ff: list[list[int]] = []  # per free count, node numbers (stale ones skipped)
        self._free_l: list[int] = []
        self._rf_l: list[int] = []  # rack totals as a list, once the heaps are built
        self._members: list[list[int]] = []
        self._rack_l: list[int] = []  # rack per node as a list, once the heaps are built

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
        rf_l: list[int] = self.rack_free.tolist()
        rack_l: list[int] = self.rack.tolist()
        heaps: list[list[int]] = [[] for _ in range(top + 1)]
        for n, f in enumerate(free_l):
            if f > 0:  # (topology key, node) packed in one int
                heaps[f].append((rf_l[rack_l[n]] * 1024 + min(f, 1023)) << _NODE_BITS | n)
        for h in heaps:
            heapq.heapify(h)
        self._heaps, self._rf_l, self._rack_l = heaps, rf_l, rack_l
        self._members = _rack_members(self.rack, self.n_racks)

    @property
    def total(self) -> int:
        """Whole free GPUs on all nodes."""
        if self._total < 0:
            rf = self._rack_free
            self._total = int(rf.sum()) if rf is not None else int(self.free.sum())
        return self._total

    @property
    def rack_free(self) -> I64:
        if self._rack_free is None:
            self._rack_free = np.bincount(self.rack, weights=self.free, minlength=self.n_racks).astype(
                np.int64
            )
        return self._rack_free

    def _node_key(self) -> I64:
        if self.node_key is None:
            # free counts never exceed the GPUs per node: the cap only matters on nodes of 1,024+ GPUs
            fr = self.free if self.share.shape[-1] <= 1023 else np.minimum(self.free, 1023)
            self.node_key = self.rack_free[self.rack] * 1024 + fr
        return self.node_key

    def _top(self, f: int) -> int:
        """The valid packed (key, node) at the top of free count f's heap (-1: none); drops stale ones."""
        assert self._heaps is not None
        # An entry is current while its node still has f free GPUs and its rack total has not moved
        # (totals only fall during a pass). Every change in a rack pushes, per free count, an entry for
        # the rack's lowest such node: the only one of them that can be the best.
        h, free_l, rf_l, rack_l = self._heaps[f], self._free_l, self._rf_l, self._rack_l
        low = min(f, 1023)
        while h:
            e = h[0]
            n = e & _NODE_MASK
            if free_l[n] == f and rf_l[rack_l[n]] * 1024 + low == e >> _NODE_BITS:
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

    def writable(self) -> tuple[I64, I64]:
        """The scratch (free, share), copied first if they are still the caller's arrays."""
        if not self._owned:
            self.free, self.share = self.free.copy(), self.share.copy()
            self._owned = True
        return self.free, self.share

    def take(self, alloc: Allocation) -> list[tuple[int, int]]:
        free, _ = self.writable()
        if self._rf_shared:
            assert self._rack_free is not None
            self._rack_free, self._rf_shared = self._rack_free.copy(), False
        rack_l = self._rack_l
        free_l = self._free_l
        before = [free_l[n] for n in alloc.nodes] if free_l else [int(free[n]) for n in alloc.nodes]
        used = take(free, self.share, alloc)
        if alloc.frac_gpu >= 0 and self._partial is not None:
            n, gi = used[0]
            s = int(self.share[n, gi])
            if 0 < s < FULL_SHARE:
                self._partial[(n, gi)] = s
            else:
                self._partial.pop((n, gi), None)
        heaps = self._heaps
        for i, (n, was) in enumerate(zip(alloc.nodes, before, strict=True)):
            now = was - alloc.counts[i] if alloc.frac_gpu < 0 else int(free[n])  # `take` took counts[i]
            if now == was:
                continue
            if self._total >= 0:
                self._total -= was - now
            self.node_key = None
            if free_l:
                free_l[n] = now
                if now > 0:
                    heapq.heappush(self._ff[now], n)
            if self._rack_free is None:
                continue
            r = rack_l[n] if rack_l else int(self.rack[n])
            self._rack_free[r] -= was - now
            if heaps is not None:
                self._rf_l[r] -= was - now
                rf = self._rf_l[r] * 1024
                lowest: dict[int, int] = {}
                for m in self._members[r]:  # node order: the first with a count is its lowest
                    fm = free_l[m]
                    if fm > 0 and fm not in lowest:
                        lowest[fm] = m
                for fm, m in lowest.items():
                    heapq.heappush(heaps[fm], (rf + min(fm, 1023)) << _NODE_BITS | m)
        return used
