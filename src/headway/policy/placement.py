"""Gang placement over a cluster's free GPUs: pure functions over arrays, plus `take` for a scratch copy.

`first-fit`: the first node (in node order) that holds the whole gang; else nodes in order.
`topology`: the fewest nodes, then the fewest racks (switches), then the tightest fit, so that large
jobs still find whole nodes and racks later. Fractional jobs (< 1 GPU) go to one GPU with enough free
share: the first such GPU (first-fit) or the one with the least free share that fits (topology).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from headway.policy.snapshot import FULL_SHARE, I64, Allocation, ClusterView

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


def _counts(free: I64 | list[int], nodes: list[int], g: int) -> Allocation:
    counts: list[int] = []
    left = g
    for n in nodes:
        c = min(int(free[n]), left)
        counts.append(c)
        left -= c
    return Allocation(tuple(nodes), tuple(counts))


def _tightest_for_rest(free: list[int], chosen: list[int], candidates: list[int], rest: int) -> int | None:
    best, best_free = None, None
    taken = set(chosen)
    for n in candidates:
        f = free[n]
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
    return _spread(free, rack, n_racks, g, max_nodes, rack_free, np.bincount(free).tolist())


def _spread(
    free: I64,
    rack: I64,
    n_racks: int,
    g: int,
    max_nodes: int,
    rack_free: I64 | None,
    hist: list[int],
    free_l: list[int] | None = None,
    members: list[list[int]] | None = None,
) -> Allocation | None:
    """`_topology` for a gang no single node holds, given the nodes per free count (`hist`) and, when
    the caller keeps them, `free` as a list and the racks' members (a live index has all three)."""
    # Fewest nodes possible: the fullest nodes first (counted from the histogram of free counts).
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
        if free_l is None:
            free_l = free.tolist()
        if members is None:
            members = _rack_members(rack, n_racks)
        tot = total[cand].tolist()
        for _, r in sorted(zip(tot, cand.tolist(), strict=True)):
            # the rack's k largest free counts hold it (the counts alone, before ordering its nodes)
            if _top_sum(free_l, members[r], k) >= g:
                fl = free_l
                nodes = sorted(members[r], key=lambda n: -fl[n])  # stable: ties by node index
                break
    if nodes is None:
        # No rack holds it: still k nodes, from as few racks as may be. Racks whose k fullest nodes
        # hold the most come first (then the lowest index), taken until their fullest k nodes hold it.
        if free_l is None:
            free_l = free.tolist()
        if members is None:
            members = _rack_members(rack, n_racks)
        tops = []
        for r, mem in enumerate(members):
            top = sorted(map(free_l.__getitem__, mem), reverse=True)[:k]
            if top and top[0] > 0:
                tops.append((-sum(top), r, top))
        tops.sort()
        pool: list[int] = []
        picked: list[int] = []
        for _, r, top in tops:
            picked.append(r)
            pool = sorted(pool + top, reverse=True)[:k]
            if sum(pool) >= g:
                break
        fl = free_l
        # Taking racks greedily can need more racks than the k fullest nodes anywhere happen to lie in;
        # then those racks are the set (their k fullest nodes hold the gang by construction).
        fullest = sorted(range(len(fl)), key=lambda n: (-fl[n], n))[:k]
        theirs = sorted({int(rack[n]) for n in fullest})
        if len(theirs) < len(picked):
            picked = theirs
        nodes = sorted((n for r in picked for n in members[r]), key=lambda n: (-fl[n], n))
    assert free_l is not None  # made above with `nodes`; the same counts as `free`, read as a list
    chosen = nodes[: k - 1]
    rest = g - sum(free_l[n] for n in chosen)
    last = _tightest_for_rest(free_l, chosen, nodes, rest)
    if last is None:  # cannot happen when the first k nodes hold it; keep the safe answer
        return _counts(free_l, nodes[:k], g)
    return _counts(free_l, [*chosen, last], g)


def _top_sum(free_l: list[int], mem: list[int], k: int) -> int:
    """The sum of the k largest of `free_l` over nodes `mem`: for a few (the usual gang of 2-4 nodes),
    kept in a short list as they come, which costs less than sorting the rack."""
    if k > 4:
        return sum(sorted(map(free_l.__getitem__, mem), reverse=True)[:k])
    top = [0] * k  # the k largest so far, descending (free counts are never negative)
    for n in mem:
        f = free_l[n]
        if f > top[k - 1]:
            i = k - 1
            while i > 0 and top[i - 1] < f:
                top[i] = top[i - 1]
                i -= 1
            top[i] = f
    s = 0
    for f in top:
        s += f
    return s


def _spans(hist: list[int], whole: int, max_nodes: int) -> bool:
    """`_topology`'s fewest-nodes test from the nodes per free count (`hist[f]`): whether the fullest
    nodes hold `whole` GPUs on at most `max_nodes` nodes. False: `_topology` returns None."""
    k, acc = 0, 0
    for f in range(len(hist) - 1, 0, -1):
        c = hist[f]
        if acc + f * c >= whole:
            return k + -(-(whole - acc) // f) <= max_nodes
        acc += f * c
        k += c
    return False


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
    nodes, counts = alloc.nodes, alloc.counts
    if len(nodes) == 1 and counts[0] == 1 and share.shape[1] <= 64:  # one GPU: the first free one
        n = nodes[0]
        row = share[n]
        row_l = row.tolist()
        if FULL_SHARE in row_l:
            a = row_l.index(FULL_SHARE)
            row[a] = 0
            free[n] -= 1
            return [(n, a)]
    for n, c in zip(nodes, counts, strict=True):
        row = share[n]
        idx_l: Sequence[int]
        if len(row) <= 64:  # a node's few GPUs: a plain scan beats three numpy calls
            row_l = row.tolist()
            a = row_l.index(FULL_SHARE) if c and FULL_SHARE in row_l else -1
            if a >= 0 and row_l[a : a + c] == [FULL_SHARE] * c:  # the first c free GPUs are consecutive
                row[a : a + c] = 0
                idx_l = range(a, a + c)
            else:
                idx_l = [gi for gi, v in enumerate(row_l) if v == FULL_SHARE][:c]
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
    """A pass's scratch free GPUs with per-rack totals and the one-node placements kept current.

    A pass starts hundreds of jobs; recomputing rack totals and scanning every node for each one was
    most of its cost. After a few placements the index switches to plain lists: per free count, a heap
    of nodes (first fit, the largest free count) and, for topology, a heap of packed (key, node) whose
    valid top is cached, updated only for the rack a start touches (stale entries are skipped when
    they surface). Placements equal `place` on the same arrays, ties included; starts must go through
    `take`.
    """

    __slots__ = (
        "_calls",
        "_ff",
        "_fmax",
        "_free_l",
        "_heaps",
        "_hist",
        "_live",
        "_members",
        "_owned",
        "_partial",
        "_rack_free",
        "_rack_l",
        "_rf_l",
        "_rf_shared",
        "_rf_stale",
        "_tops",
        "_total",
        "_unspanned",
        "free",
        "n_racks",
        "node_key",
        "rack",
        "share",
    )
    BUCKETS_AFTER: ClassVar[int] = 8  # placements served by vector scans before the lists and heaps are built
    # First fit's vector scan stops at the first fit, so its lists pay off only on longer passes.
    LISTS_AFTER: ClassVar[int] = 32

    def __init__(
        self,
        free: I64,
        share: I64,
        rack: I64,
        n_racks: int,
        rack_free: I64 | None = None,
        *,
        copy_on_write: bool = False,
        live: LiveIndex | None = None,
    ) -> None:
        """`rack_free`: the racks' free totals for `free` when the caller keeps them (copied, not kept).
        `copy_on_write`: leave `free` and `share` untouched and copy them at the first `take` (read
        `self.free` and `self.share` after that); otherwise `take` writes them in place.
        `live`: the caller's `LiveIndex` over `free` (read, never changed): until the first `take` the
        scratch GPUs are the live ones, so placements read it and the lists are copied from it."""
        self.free, self.share, self.rack, self.n_racks = free, share, rack, n_racks
        self._owned = not copy_on_write
        self._live = live if copy_on_write else None
        # free GPUs per rack, built when topology needs it
        self._rack_free: I64 | None = rack_free
        self._rf_shared = rack_free is not None  # still the caller's array: copied before the first write
        self._rf_stale = False  # `_rf_l` moved on since `_rack_free` was last written
        self.node_key: I64 | None = None  # one-node topology key; None when stale (rebuilt on demand)
        self._total = -1  # whole free GPUs in all; counted on first use
        self._partial: dict[tuple[int, int], int] | None = None  # GPUs partly shared: built on demand
        self._calls = 0
        self._fmax = -1  # the largest free count, while known (-1: not known)
        self._heaps: list[list[int]] | None = None  # per free count, (key << _NODE_BITS | node)
        self._tops: list[int] = []  # per free count, its heap's valid top (-1: none, -2: not known)
        self._ff: list[list[int]] = []  # per free count, node numbers (stale ones skipped)
        self._free_l: list[int] = []
        self._hist: list[int] = []  # nodes per free count, kept with `_free_l`
        # (whole, max_nodes) gangs no set of nodes holds: free GPUs only fall during a pass, so they stay so
        self._unspanned: set[tuple[int, int]] = set()
        self._rf_l: list[int] = []  # rack totals as a list, once the heaps are built
        self._members: list[list[int]] = []
        self._rack_l: list[int] = []  # rack per node as a list, once the heaps are built

    def _build_counts(self) -> bool:
        """The per-free-count node heaps (first fit, `max_free`); False where the lists cannot serve."""
        if self._free_l:
            return True
        live = self._live
        if live is not None and not self._owned:  # no take yet: the live lists are this pass's lists
            self._free_l, self._ff, self._hist = (
                live.free_l.copy(),
                [h.copy() for h in live.ff],
                live.hist.copy(),
            )
            return True
        free_l = self.free.tolist()
        top = max(free_l, default=0)
        if top > 1023 or len(free_l) > _NODE_MASK:  # outside what the packed keys hold: vector path
            self._calls = -(1 << 62)
            return False
        ff: list[list[int]] = [[] for _ in range(top + 1)]
        hist = [0] * (top + 1)
        for n, f in enumerate(free_l):
            hist[f] += 1
            if f > 0:
                ff[f].append(n)  # ascending: already a valid heap
        self._free_l, self._ff, self._hist = free_l, ff, hist
        return True

    def _build(self) -> None:
        """The per-free-count heaps of packed topology keys, on top of the node heaps."""
        if self._heaps is not None or not self._build_counts():
            return
        live = self._live
        if live is not None and not self._owned:  # no take yet: copy the live heaps (same invariants)
            self._heaps, self._tops = [h.copy() for h in live.heaps], live.tops.copy()
            self._rf_l, self._rack_l, self._members = live.rf_l.copy(), live.rack_l, live.members
            if self._rack_free is None:  # `_moved` keeps the heaps only alongside the rack totals
                self._rack_free, self._rf_shared = np.array(live.rf_l, dtype=np.int64), False
            return
        free_l = self._free_l
        rf_l: list[int] = self.rack_free.tolist()
        rack_l: list[int] = self.rack.tolist()
        heaps: list[list[int]] = [[] for _ in range(len(self._ff))]
        for n, f in enumerate(free_l):
            if f > 0:  # (topology key, node) packed in one int; f <= 1023 here
                heaps[f].append((rf_l[rack_l[n]] * 1024 + f) << _NODE_BITS | n)
        for h in heaps:
            heapq.heapify(h)
        self._heaps, self._rf_l, self._rack_l = heaps, rf_l, rack_l
        self._tops = [-2] * len(heaps)
        self._members = _rack_members(self.rack, self.n_racks)

    @property
    def total(self) -> int:
        """Whole free GPUs on all nodes."""
        if self._total < 0:
            if self._live is not None and not self._owned:
                self._total = self._live.total
            elif self._rack_free is not None:
                self._total = int(self.rack_free.sum())
            else:
                self._total = int(self.free.sum())
        return self._total

    @property
    def rack_free(self) -> I64:
        if self._rf_stale:  # the lists ran ahead: one array from them (never the caller's array)
            self._rack_free = np.array(self._rf_l, dtype=np.int64)
            self._rf_stale = self._rf_shared = False
        elif self._rack_free is None:
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
        t = self._tops[f]
        if t != -2:
            return t
        assert self._heaps is not None
        # An entry is current while its node still has f free GPUs and its rack total has not moved
        # (totals only fall during a pass). Every change in a rack pushes, per free count, an entry for
        # the rack's lowest such node: the only one of them that can be the best.
        h, free_l, rf_l, rack_l = self._heaps[f], self._free_l, self._rf_l, self._rack_l
        while h:
            e = h[0]
            n = e & _NODE_MASK
            if free_l[n] == f and rf_l[rack_l[n]] * 1024 + f == e >> _NODE_BITS:
                self._tops[f] = e
                return e
            heapq.heappop(h)
        self._tops[f] = -1
        return -1

    def _first(self, whole: int) -> int:
        """The lowest node with at least `whole` free GPUs (-1: none), from the node heaps."""
        free_l, ff = self._free_l, self._ff
        best = -1
        for f in range(whole, len(ff)):
            h = ff[f]
            while h and free_l[h[0]] != f:
                heapq.heappop(h)
            if h and (best < 0 or h[0] < best):
                best = h[0]
        return best

    def max_free(self) -> int:
        """The largest whole-GPU free count on one node (kept until a start takes from such a node)."""
        if self._fmax >= 0:
            return self._fmax
        if not self._free_l and self._live is not None and not self._owned:
            hist = self._live.hist  # the live GPUs' counts: the largest count some node has
            f = len(hist) - 1
            while f > 0 and not hist[f]:
                f -= 1
            self._fmax = f
            return f
        if not self._free_l:
            self._fmax = int(self.free.max(initial=0))
            return self._fmax
        free_l = self._free_l
        self._fmax = 0
        for f in range(len(self._ff) - 1, 0, -1):
            h = self._ff[f]
            while h and free_l[h[0]] != f:
                heapq.heappop(h)
            if h:
                self._fmax = f
                break
        return self._fmax

    def place(self, how: str, gpus: float, max_nodes: int) -> Allocation | None:
        whole, milli = gang_size(gpus)
        return self.place_sized(how, gpus, whole, milli, max_nodes)

    def place_sized(self, how: str, gpus: float, whole: int, milli: int, max_nodes: int) -> Allocation | None:
        """`place` for a gang whose `gang_size` the caller already has (a pass sizes all jobs at once)."""
        if whole == 0 and milli == 0:
            return _NO_GPUS
        self._calls += 1
        if self._calls > self.BUCKETS_AFTER and not self._free_l:
            if how == "topology":
                self._build()
            elif self._calls > self.LISTS_AFTER:
                self._build_counts()
        if how == "topology":
            if whole == 0:
                return self._fraction(milli)
            if self._heaps is None and self._free_l:
                self._build()  # lists built for first fit: topology needs its heaps too
            if self._heaps is not None:
                tops = self._tops
                best = -1
                for f in range(whole, len(tops)):
                    t = tops[f]
                    if t == -2:
                        t = self._top(f)
                    if t >= 0 and (best < 0 or t < best):
                        best = t
                if best >= 0:
                    return _one_node(best & _NODE_MASK, whole)
            elif self._live is not None and not self._owned:  # no take yet: the live GPUs' best node
                live = self._live
                best = live.best(whole)
                if best >= 0:
                    return _one_node(best & _NODE_MASK, whole)
                if max_nodes > 1:  # no node holds it: `_topology`'s spread, on the live lists
                    if not self._spans(live.hist, whole, max_nodes):
                        return None
                    return _spread(
                        self.free,
                        self.rack,
                        self.n_racks,
                        whole,
                        max_nodes,
                        self.rack_free,
                        live.hist,
                        live.free_l,
                        live.members,
                    )
            else:
                cand = np.where(self.free >= whole, self._node_key(), _BIG)
                i = int(cand.argmin())
                if cand[i] < _BIG:
                    return _one_node(i, whole)
            if max_nodes == 1:
                return None
            if self._hist and not self._spans(self._hist, whole, max_nodes):  # the lists are current
                return None
            return _topology(self.free, self.rack, self.n_racks, whole, max_nodes, self.rack_free)
        if how != "first-fit" or not self._free_l:  # first-fit's vector scan stops at the first fit
            return place(how, self.free, self.share, self.rack, self.n_racks, gpus, max_nodes)
        if whole == 0:
            return self._fraction_first(milli)
        n = self._first(whole)
        if n >= 0:
            return _one_node(n, whole)
        if max_nodes == 1:
            return None
        return _first_fit(self.free, whole, max_nodes)

    def _spans(self, hist: list[int], whole: int, max_nodes: int) -> bool:
        """`_spans` on this pass's GPUs, remembering the gangs that cannot be placed."""
        if (whole, max_nodes) in self._unspanned:
            return False
        if _spans(hist, whole, max_nodes):
            return True
        self._unspanned.add((whole, max_nodes))
        return False

    def _partials(self) -> dict[tuple[int, int], int]:
        if self._partial is None:
            sh = self.share
            rows, cols = np.nonzero((sh > 0) & (sh < FULL_SHARE))
            self._partial = {(r, c): int(sh[r, c]) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
        return self._partial

    def _fraction_first(self, milli: int) -> Allocation | None:
        """`_place_fraction("first-fit", ...)`: the first GPU in (node, gpu) order with enough free share.

        That is the first partly used GPU that fits or the first whole free GPU, whichever comes first.
        """
        best = min((rc for rc, s in self._partials().items() if s >= milli), default=None)
        n = self._first(1)
        if n >= 0 and (best is None or n <= best[0]):
            cand = (n, self.share[n].tolist().index(FULL_SHARE))
            if best is None or cand < best:
                best = cand
        if best is None:
            return None
        return Allocation((best[0],), (0,), best[1], milli)

    def _fraction(self, milli: int) -> Allocation | None:
        """`_place_fraction("topology", ...)`: the tightest partly used GPU, else a whole free one."""
        smin = FULL_SHARE  # the partly used GPUs with the least free share that fits
        pairs: list[tuple[int, int]] = []
        for rc, s in self._partials().items():
            if milli <= s <= smin:
                if s < smin:
                    smin, pairs = s, [rc]
                else:
                    pairs.append(rc)
        if len(pairs) == 1:
            n, gi = pairs[0]
            return Allocation((n,), (0,), gi, milli)
        if pairs:
            pairs.sort()
            if self._heaps is not None:
                free_l, rf_l, rack_l = self._free_l, self._rf_l, self._rack_l
                keys = [min(free_l[n], 1023) * (1 << 32) + rf_l[rack_l[n]] for n, _ in pairs]
            else:
                free, rack_free, rack = self.free, self.rack_free, self.rack
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
            free, rack_free, rack = self.free, self.rack_free, self.rack
            key = np.where(free >= 1, np.minimum(free, 1023) * (1 << 32) + rack_free[rack], _BIG)
            n = int(key.argmin())
            if key[n] >= _BIG:
                return None
        gi = self.share[n].tolist().index(FULL_SHARE)  # the first whole free GPU (there is one)
        return Allocation((n,), (0,), gi, milli)

    def writable(self) -> tuple[I64, I64]:
        """The scratch (free, share), copied first if they are still the caller's arrays."""
        if not self._owned:
            self.free, self.share = self.free.copy(), self.share.copy()
            self._owned = True
        self._fmax = -1  # the caller may change them
        self._unspanned.clear()
        return self.free, self.share

    def take(self, alloc: Allocation) -> list[tuple[int, int]]:
        if not self._owned:
            if self._live is not None:
                # The pass goes on after this start: its lists, copied from the live ones while they
                # are still this pass's GPUs, keep later placements to list reads.
                self._build()
            self.free, self.share = self.free.copy(), self.share.copy()
            self._owned = True
        free, share = self.free, self.share
        if alloc.frac_gpu >= 0:
            n, gi = alloc.nodes[0], alloc.frac_gpu
            s = int(share[n, gi])
            s_now = s - alloc.frac_milli
            share[n, gi] = s_now
            if self._partial is not None:
                if 0 < s_now < FULL_SHARE:
                    self._partial[(n, gi)] = s_now
                else:
                    self._partial.pop((n, gi), None)
            if s == FULL_SHARE:
                was = int(free[n])
                free[n] = was - 1
                self._moved(n, was, was - 1)
            return [(n, gi)]
        used: list[tuple[int, int]] = []
        free_l = self._free_l
        for n, c in zip(alloc.nodes, alloc.counts, strict=True):
            row = share[n]
            was = free_l[n] if free_l else int(free[n])
            if c <= was and len(row) <= 64:  # a node's few GPUs: the first c whole ones, by list scans
                row_l = row.tolist()
                gi = -1
                for _ in range(c):
                    gi = row_l.index(FULL_SHARE, gi + 1)
                    row[gi] = 0
                    used.append((n, gi))
            else:
                idx = (row == FULL_SHARE).nonzero()[0][:c]
                row[idx] = 0
                used.extend([(n, gi) for gi in idx.tolist()])
            free[n] = was - c
            if c:
                self._moved(n, was, was - c)
        return used

    def _moved(self, n: int, was: int, now: int) -> None:
        """Node n went from `was` to `now` free GPUs: totals, lists and heaps follow."""
        if self._total >= 0:
            self._total -= was - now
        if was == self._fmax:
            self._fmax = -1
        self.node_key = None
        free_l = self._free_l
        if free_l:
            free_l[n] = now
            self._hist[was] -= 1
            self._hist[now] += 1
            if now > 0:
                heapq.heappush(self._ff[now], n)
        if self._rack_free is None:
            return
        heaps = self._heaps
        if heaps is None:
            if self._rf_shared:
                self._rack_free, self._rf_shared = self._rack_free.copy(), False
            self._rack_free[self.rack[n]] -= was - now
            return
        rack_l, rf_l, tops = self._rack_l, self._rf_l, self._tops
        r = rack_l[n]
        rf_l[r] -= was - now
        self._rf_stale = True
        rf = rf_l[r] * 1024
        # Every entry of rack r went stale (its total fell): push, per free count in the rack, an entry
        # for its lowest node. Each is below any old entry of the rack, so it is the new top where it
        # beats the cached one; a count the rack no longer has (only `was` can go) drops a cached top
        # that pointed into the rack.
        seen = 0  # bit f set: count f already has its lowest node (node order)
        for m in self._members[r]:
            fm = free_l[m]
            if fm > 0 and not seen >> fm & 1:
                seen |= 1 << fm
                e = (rf + fm) << _NODE_BITS | m
                heapq.heappush(heaps[fm], e)
                t = tops[fm]
                if t == -1 or (t >= 0 and e < t):
                    tops[fm] = e
        if not seen >> was & 1:
            t = tops[was]
            if t >= 0 and rack_l[t & _NODE_MASK] == r:
                tops[was] = -2


_NO_GPUS = Allocation((), ())
_ONE_NODE: dict[int, Allocation] = {}


def _one_node(n: int, whole: int) -> Allocation:
    """Allocation((n,), (whole,)), shared: the records are frozen and a pass makes thousands of them."""
    k = n << 11 | whole if whole < 2048 else -1
    a = _ONE_NODE.get(k)
    if a is None:
        a = Allocation((n,), (whole,))
        if k >= 0:
            if len(_ONE_NODE) >= 1 << 16:
                _ONE_NODE.clear()
            _ONE_NODE[k] = a
    return a


class LiveIndex:
    """The live free GPUs' one-node placements, kept current by the owner of the cluster (the simulator).

    Most simulator passes place one job on the GPUs exactly as they are between passes; scanning every
    node for it (or building `FreeIndex`'s heaps in a pass that starts many jobs) was most of such a
    pass. The owner calls `set_free` after every change, so a pass reads the best one-node topology
    placement from `tops` and seeds its scratch lists and heaps by copying these. The structures are
    `FreeIndex`'s: per free count, heaps of packed (rack total * 1024 + count, node) with stale entries
    skipped (an entry is current while its node has that count and its rack that total), holding for
    every (rack, count) the rack's lowest node with that count; `tops[f]` is always the current
    minimum of count f (-1: no node has f free GPUs), and `ff[f]` holds every node with f free GPUs.
    """

    __slots__ = (
        "_limit",
        "_pushes",
        "ff",
        "free_l",
        "heaps",
        "hist",
        "members",
        "rack_l",
        "rf_l",
        "tops",
        "total",
    )

    def __init__(self, free: I64, rack: I64, n_racks: int) -> None:
        self.free_l: list[int] = free.tolist()
        self.rack_l: list[int] = rack.tolist()
        self.members = _rack_members(rack, n_racks)
        self.rf_l = [0] * n_racks
        for n, f in enumerate(self.free_l):
            self.rf_l[self.rack_l[n]] += f
        self.heaps: list[list[int]] = []
        self.ff: list[list[int]] = []
        self.tops: list[int] = []
        self.hist: list[int] = []  # nodes per free count
        self.total = sum(self.free_l)  # whole free GPUs
        self._pushes = 0
        self._limit = 2 * len(self.free_l) + 256  # entries pushed before the heaps are rebuilt
        self._rebuild()

    @staticmethod
    def supports(node_gpus: I64) -> bool:
        """Whether the packed keys hold this cluster (as `FreeIndex`'s lists need)."""
        return len(node_gpus) <= _NODE_MASK and int(node_gpus.max(initial=0)) <= 1023

    def _rebuild(self) -> None:
        free_l, rack_l, rf_l = self.free_l, self.rack_l, self.rf_l
        size = max(max(free_l, default=0) + 1, len(self.heaps))
        heaps: list[list[int]] = [[] for _ in range(size)]
        ff: list[list[int]] = [[] for _ in range(size)]
        seen: set[tuple[int, int]] = set()
        for n, f in enumerate(free_l):
            if f > 0:
                ff[f].append(n)  # ascending: already a valid heap
                r = rack_l[n]
                if (r, f) not in seen:  # a rack's lowest node per count is the only one that can be best
                    seen.add((r, f))
                    heaps[f].append((rf_l[r] * 1024 + f) << _NODE_BITS | n)
        for h in heaps:
            heapq.heapify(h)
        self.heaps, self.ff = heaps, ff
        self.tops = [h[0] if h else -1 for h in heaps]
        self.hist = [0] * size
        for f in free_l:
            self.hist[f] += 1
        self._pushes = 0

    def set_free(self, n: int, now: int) -> None:
        """Node `n` has `now` whole free GPUs (after an allocation or a release)."""
        free_l = self.free_l
        was = free_l[n]
        if was == now:
            return
        if now >= len(self.heaps):  # more free than ever seen (the cluster started partly used)
            free_l[n] = now
            self.rf_l[self.rack_l[n]] += now - was
            self.total += now - was
            self._rebuild()
            return
        free_l[n] = now
        self.total += now - was
        self.hist[was] -= 1
        self.hist[now] += 1
        rack_l, rf_l, heaps, tops = self.rack_l, self.rf_l, self.heaps, self.tops
        r = rack_l[n]
        rf_l[r] += now - was
        if now > 0:
            heapq.heappush(self.ff[now], n)
        # Every entry of rack r went stale (its total moved): push, per free count in the rack, an entry
        # for its lowest node. Where the cached top was not in rack r it is still the minimum of the
        # other racks, so the new entry replaces it only if lower; a top in rack r is looked up again.
        # Only the counts rack r has now, and `was`, can have had their top in rack r (no other node
        # changed), and such a top went stale with the rack's total.
        rf = rf_l[r] * 1024
        seen = 0  # bit f set: count f already has its lowest node (node order)
        push = heapq.heappush
        for m in self.members[r]:
            fm = free_l[m]
            if fm > 0 and not seen >> fm & 1:
                seen |= 1 << fm
                e = (rf + fm) << _NODE_BITS | m
                push(heaps[fm], e)
                t = tops[fm]
                if t < 0 or e < t:
                    tops[fm] = e
                elif rack_l[t & _NODE_MASK] == r:
                    tops[fm] = self._valid_top(fm)
        if was > 0 and not seen >> was & 1:
            t = tops[was]
            if t >= 0 and rack_l[t & _NODE_MASK] == r:
                tops[was] = self._valid_top(was)
        self._pushes += seen.bit_count()
        if self._pushes > self._limit:
            self._rebuild()

    def _valid_top(self, f: int) -> int:
        """The lowest current entry of count f's heap (-1: none), dropping stale ones above it."""
        h, free_l, rf_l, rack_l = self.heaps[f], self.free_l, self.rf_l, self.rack_l
        while h:
            e = h[0]
            m = e & _NODE_MASK
            if free_l[m] == f and rf_l[rack_l[m]] * 1024 + f == e >> _NODE_BITS:
                return e
            heapq.heappop(h)
        return -1

    def best(self, whole: int) -> int:
        """The packed (key, node) of the best one-node topology placement for `whole` GPUs (-1: none)."""
        best = -1
        for t in self.tops[whole:]:
            if t >= 0 and (best < 0 or t < best):
                best = t
        return best

    def spans(self, whole: int, max_nodes: int) -> bool:
        """`_topology`'s fewest-nodes test on the live GPUs (False: it would return None)."""
        return _spans(self.hist, whole, max_nodes)

    def check(self, free: I64, rack: I64, n_racks: int) -> None:
        """Invariants against the arrays it follows (tests)."""
        assert self.free_l == free.tolist()
        rf = np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64)
        assert self.rf_l == rf.tolist() and self.total == int(free.sum())
        assert self.hist == np.bincount(free, minlength=len(self.hist)).tolist()
        key = rf[rack] * 1024 + free
        for w in range(1, len(self.tops)):
            cand = np.where(free >= w, key, _BIG)
            i = int(cand.argmin())
            want = (int(cand[i]) << _NODE_BITS | i) if cand[i] < _BIG else -1
            assert self.best(w) == want, (w, self.best(w), want)


def scratch_index(view: ClusterView) -> FreeIndex:
    """A pass's scratch free GPUs over the view (copied on the first `take`; see `Policy.decide`)."""
    return FreeIndex(
        view.free, view.share, view.rack, view.n_racks, view.rack_free, copy_on_write=True, live=view.index
    )


def place_fresh(view: ClusterView, how: str, gpus: float, max_nodes: int) -> Allocation | None:
    """A pass's first placement on `view`: `place_sized` on its scratch index. Here, compiled, for
    `Policy.place_one` and the simulator, which ask it at most arrivals."""
    whole, milli = gang_size(gpus)
    return scratch_index(view).place_sized(how, gpus, whole, milli, max_nodes)
