"""Gang placement over a cluster's free GPUs: one index (`FreeIndex`) and the functions around it.

`first-fit`: the first node (in node order) that holds the whole gang; else nodes in order (the
fullest nodes when in-order nodes would span too many). `topology`: the fewest nodes, then the fewest
racks (switches), then the tightest fit, so that large jobs still find whole nodes and racks later.
Fractional jobs (< 1 GPU) go to one GPU with enough free share: the first such GPU (first-fit) or the
one with the least free share that fits (topology). `place`, `placeable` and `fits_empty` answer on
plain arrays through the same index; `take` writes an allocation into (free, share) arrays.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from headway.policy.snapshot import FULL_SHARE, I64, Allocation, ClusterView

PLACEMENTS: tuple[str, ...] = ("first-fit", "topology")
_CAP = 1023  # a node's free count in the topology key saturates here (nodes of 1,024+ GPUs tie)
_NO_GPUS = Allocation((), ())


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


def _hist(counts: I64) -> list[int]:
    """Nodes per count (index: the count); a count below zero (a backfill's spare) as zero."""
    if not len(counts):
        return [0]
    return np.bincount(np.maximum(counts, 0) if int(counts.min()) < 0 else counts).tolist()


def _fewest_nodes(hist: list[int], g: int) -> int:
    """The fewest nodes that hold g GPUs together (the fullest ones), from the nodes per free count;
    -1 when all of them together do not."""
    k, acc = 0, 0
    for f in range(len(hist) - 1, 0, -1):
        c = hist[f]
        if acc + f * c >= g:
            return k + -(-(g - acc) // f)
        acc += f * c
        k += c
    return -1


def fits_empty(node_gpus: I64, gpus: float, max_nodes: int) -> bool:
    """Whether the gang could run at all on this cluster when it is empty."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        return milli == 0 or bool((node_gpus > 0).any())
    return 0 < _fewest_nodes(_hist(node_gpus), whole) <= max_nodes


def placeable(free: I64, share: I64, gpus: float, max_nodes: int) -> bool:
    """Whether some placement exists now (by any rule): `FreeIndex.placeable` on the arrays."""
    whole, milli = gang_size(gpus)
    if whole == 0:
        return milli == 0 or bool((share >= milli).any())
    return 0 < _fewest_nodes(_hist(free), whole) <= max_nodes


def place(
    how: str, free: I64, share: I64, rack: I64, n_racks: int, gpus: float, max_nodes: int
) -> Allocation | None:
    """An Allocation for the gang on the free GPUs, or None when it cannot be placed now."""
    return FreeIndex(free, rack, n_racks, share, copy_on_write=True).place(how, gpus, max_nodes)


def take(free: I64, share: I64, alloc: Allocation) -> list[tuple[int, int]]:
    """Apply an allocation to (scratch or live) arrays: each node's first free GPUs, in order, or the
    share of one GPU. Returns the (node, gpu) pairs it used. The allocation must fit (a node with fewer
    free GPUs than it takes there is a ValueError)."""
    if alloc.frac_gpu >= 0:
        n, gi = alloc.nodes[0], alloc.frac_gpu
        if share[n, gi] == FULL_SHARE:
            free[n] -= 1
        share[n, gi] -= alloc.frac_milli
        return [(n, gi)]
    used: list[tuple[int, int]] = []
    for n, c in zip(alloc.nodes, alloc.counts, strict=True):
        row = share[n]
        if len(row) <= 64:  # a node's few GPUs: list scans beat numpy calls
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
        free[n] -= c
    return used


_RACKS: dict[bytes, tuple[list[int], list[list[int]]]] = {}


def _racks(rack: I64, n_racks: int) -> tuple[list[int], list[list[int]]]:
    """(rack per node, nodes per rack in node order) as lists: a cluster's racks never change, so they
    are cached by their bytes."""
    key = rack.tobytes()
    got = _RACKS.get(key)
    if got is None or len(got[1]) != n_racks:
        rack_l: list[int] = rack.tolist()
        members: list[list[int]] = [[] for _ in range(n_racks)]
        for n, r in enumerate(rack_l):
            members[r].append(n)
        if len(_RACKS) > 16:
            _RACKS.clear()
        got = _RACKS[key] = (rack_l, members)
    return got


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


def _counts(free_l: list[int], nodes: list[int], g: int) -> Allocation:
    """g GPUs over `nodes` in that order, each node's free GPUs until the gang is whole."""
    counts: list[int] = []
    left = g
    for n in nodes:
        c = min(free_l[n], left)
        counts.append(c)
        left -= c
    return Allocation(tuple(nodes), tuple(counts))


def _tightest_for_rest(free_l: list[int], chosen: list[int], candidates: list[int], rest: int) -> int | None:
    """The first of `candidates` (not chosen) with the fewest free GPUs that still hold `rest`."""
    best, best_free = None, None
    taken = set(chosen)
    for n in candidates:
        f = free_l[n]
        if n in taken or f < rest:
            continue
        if best_free is None or f < best_free:
            best, best_free = n, f
    return best


def _top_sum(free_l: list[int], mem: list[int], k: int) -> int:
    """The sum of the k largest of `free_l` over nodes `mem`: for a few (the usual gang of 2-4 nodes),
    kept in a short list as they come, which costs less than sorting the rack."""
    if k > 4:
        return sum(f for f in sorted(map(free_l.__getitem__, mem), reverse=True)[:k] if f > 0)
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


class FreeIndex:
    """Whole free GPUs per node, indexed for placement: rack totals, nodes per free count (`hist`) and,
    built on first use, per free count a heap of its nodes (first fit) and a heap of packed
    (rack total * 1024 + count, node) keys (topology), whose current top `tops[f]` is cached (-1: none,
    -2: not known). Stale heap entries are dropped when they surface: an entry is current while its
    node has that count and its rack that total, and every change pushes, per count in the node's
    rack, an entry for the rack's lowest such node (the only one of the rack that can be best). A
    count below zero (a backfill's spare GPUs) holds nothing but counts in its rack's total, which
    may then be negative: `_off` keeps every packed key positive.

    Kept live by its owner (the simulator: `FreeIndex(free, rack, n_racks)`, then `set_free` after
    every change), or built over a pass's arrays (`FreeIndex(free, rack, n_racks, share)`): `take`
    writes an allocation into `free` and `share` (copied first with `copy_on_write`) and the index
    follows. `scratch` gives a pass a copy-on-write copy of a live index: it reads the live lists
    until its first `take` copies them.
    """

    __slots__ = (
        "_array_ok",
        "_base",
        "_bits",
        "_limit",
        "_mask",
        "_off",
        "_owned",
        "_partial",
        "_pushes",
        "_zero_full",
        "ff",
        "free",
        "free_l",
        "heaps",
        "hist",
        "members",
        "n_racks",
        "rack",
        "rack_l",
        "rf_l",
        "share",
        "tops",
        "total",
    )

    def __init__(
        self,
        free: I64,
        rack: I64,
        n_racks: int,
        share: I64 | None = None,
        *,
        copy_on_write: bool = False,
        live: FreeIndex | None = None,
    ) -> None:
        """`share`: the [node, gpu] free shares, for fractional jobs and `take` (None: a live index of
        counts, which the owner changes through `set_free` only). `copy_on_write`: leave the caller's
        arrays untouched and copy them at the first `take`. `live`: an index over the same `free`,
        whose lists this one reads until its first `take` (see `scratch`)."""
        self.free, self.share, self.rack, self.n_racks = free, share, rack, n_racks
        self._owned = not copy_on_write
        self._partial: dict[tuple[int, int], int] | None = None  # partly shared GPUs, built on demand
        self._zero_full: list[int] = []  # `_full_at_zero`, found with `_partial`
        self._base = live
        self._array_ok = True  # `free` holds the counts the lists hold
        self.ff: list[list[int]] | None = None  # per free count, its nodes (stale ones skipped)
        self.heaps: list[list[int]] | None = None  # per free count, packed topology keys
        self.tops: list[int] = []
        self.rf_l: list[int] = []  # free GPUs per rack, with the heaps
        self._off = 0  # added to every rack total in the keys, so that none is negative
        self.free_l: list[int]
        self.hist: list[int]  # nodes per free count
        self.total: int  # whole free GPUs
        self.rack_l: list[int]
        self.members: list[list[int]]  # nodes per rack, in node order
        self._bits: int  # a packed key's node field
        self._mask: int  # (1 << _bits) - 1
        self._pushes: int
        self._limit: int  # entries pushed before the heaps are rebuilt
        if live is not None:
            self.free_l, self.hist, self.total = live.free_l, live.hist, live.total
            self.rack_l, self.members = live.rack_l, live.members
            self._bits, self._mask = live._bits, live._mask
            self._pushes, self._limit = live._pushes, live._limit
            self._alias(live)
            return
        self.free_l = free.tolist()
        self.rack_l, self.members = _racks(rack, n_racks)
        # A count below zero (a backfill's spare) holds no GPU, as zero; it still counts in its rack's
        # total, as it always did.
        self.hist = _hist(free)
        self.total = int(free.sum())
        self._bits = max(1, len(self.free_l).bit_length())
        self._mask = (1 << self._bits) - 1
        self._pushes = 0
        self._limit = 2 * len(self.free_l) + 256
        if share is None:
            self._array_ok = False  # a live index reads its lists, never the owner's array

    def scratch(self, free: I64, share: I64) -> FreeIndex:
        """A pass's copy-on-write copy over the owner's arrays `free` (the counts this index holds) and
        `share`: neither they nor this index change, whatever the pass takes."""
        return FreeIndex(free, self.rack, self.n_racks, share, copy_on_write=True, live=self)

    def reshare(self, share: I64) -> None:
        """Place shares on `share` from now on (its GPUs' free shares changed outside this index, or a
        caller hides some GPUs): the partly used GPUs are found again at the next fractional job."""
        self.share, self._partial, self._zero_full = share, None, []

    # --- the structures, built on first use ------------------------------------------------------
    def _alias(self, base: FreeIndex) -> None:
        self.ff, self.heaps, self.tops, self.rf_l = base.ff, base.heaps, base.tops, base.rf_l
        self._off = base._off

    def _counts(self) -> I64:
        """The free counts as an array (the caller's, while this index follows it)."""
        if self._array_ok:
            return self.free
        return np.array(self.free_l, dtype=np.int64)

    def _need_ff(self) -> list[list[int]]:
        if self.ff is None:
            owner = self._base if self._base is not None else self  # unchanged since: build it there
            owner._build_ff(self._counts())
            self._alias(owner)
        assert self.ff is not None
        return self.ff

    def _need_heaps(self) -> list[list[int]]:
        if self.heaps is None:
            owner = self._base if self._base is not None else self
            owner._build_heaps(self._counts())
            self._alias(owner)
        assert self.heaps is not None
        return self.heaps

    def _build_ff(self, fa: I64) -> None:
        order: list[int] = np.argsort(fa, kind="stable").tolist()  # by count, then node
        ff: list[list[int]] = []
        s = 0
        for c in self.hist:
            ff.append(order[s : s + c])  # ascending: already a heap
            s += c
        ff[0] = []
        self.ff = ff

    def _build_heaps(self, fa: I64) -> None:
        rf = np.bincount(self.rack, weights=fa, minlength=self.n_racks).astype(np.int64)
        self.rf_l = rf.tolist()
        off = self._off = max(0, -int(rf.min(initial=0)))
        bits, mask = self._bits, self._mask
        kbits = (((int(rf.max(initial=0)) + off) * 1024 + 1024) << bits).bit_length()  # a key's width
        span = max(len(self.hist), 1 - int(fa.min(initial=0)))
        if kbits + span.bit_length() < 63:  # sorted by (count, key) in one int64 sort
            key = ((rf[self.rack] + off) * 1024 + np.clip(fa, 0, _CAP)) << bits | np.arange(len(fa))
            keys: list[int] = (np.sort(fa << kbits | key) & ((1 << kbits) - 1)).tolist()
        else:  # beyond 64 bits: the same keys as Python ints
            rf_l, rack_l, free_l = self.rf_l, self.rack_l, self.free_l
            keys = sorted(
                ((rf_l[rack_l[n]] + off) * 1024 + min(max(f, 0), _CAP)) << bits | n
                for n, f in enumerate(free_l)
            )
            keys.sort(key=lambda e: free_l[e & mask])  # stable: by count, then key
        heaps: list[list[int]] = []
        s = 0
        for c in self.hist:
            heaps.append(keys[s : s + c])  # ascending: already a heap, its top current
            s += c
        heaps[0] = []
        self.heaps = heaps
        self.tops = [h[0] if h else -1 for h in heaps]

    def _own(self) -> None:
        """Copy what is still the live index's or the caller's, before the first change."""
        if self._base is not None:
            self._base = None
            self.free_l, self.hist = self.free_l.copy(), self.hist.copy()
            if self.ff is not None:
                self.ff = [h.copy() for h in self.ff]
            if self.heaps is not None:
                self.heaps, self.tops = [h.copy() for h in self.heaps], self.tops.copy()
                self.rf_l = self.rf_l.copy()
        if not self._owned:
            assert self.share is not None, "a live index changes through set_free only"
            self.free, self.share = self.free.copy(), self.share.copy()
            self._owned = True

    # --- changes ---------------------------------------------------------------------------------
    def set_free(self, n: int, now: int) -> None:
        """Node `n` has `now` whole free GPUs (after an allocation or a release; below zero: none)."""
        if self._base is not None:
            self._own()
        free_l = self.free_l
        was = free_l[n]
        if was == now:
            return
        if now >= len(self.hist):  # more free than any node had (the cluster started partly used)
            self._grow(now + 1)
        free_l[n] = now
        self.total += now - was
        self.hist[was if was > 0 else 0] -= 1
        self.hist[now if now > 0 else 0] += 1
        if self.ff is not None and now > 0:
            heapq.heappush(self.ff[now], n)
            self._pushes += 1
        if self.heaps is not None:
            self._push_rack(self.rack_l[n], now - was, was)
        if self._pushes > self._limit:
            self._rebuild()

    def _push_rack(self, r: int, delta: int, was: int) -> None:
        """Rack r's total moved by `delta`, so every entry of the rack went stale: push, per free count
        in the rack, an entry for its lowest node. A cached top elsewhere stays the minimum of the other
        racks, so the new entry replaces it where lower; a top in rack r is looked up again (-2). Only
        the counts rack r has now, and `was`, can have had their top in rack r."""
        assert self.heaps is not None
        heaps, tops, rack_l, free_l = self.heaps, self.tops, self.rack_l, self.free_l
        bits, mask = self._bits, self._mask
        self.rf_l[r] += delta
        if self.rf_l[r] + self._off < 0:  # below what the offset keeps positive: new keys
            self._rebuild()
            return
        rf = (self.rf_l[r] + self._off) * 1024
        seen = 0  # bit f set: count f already has its lowest node (node order)
        pushed = 0
        for m in self.members[r]:
            fm = free_l[m]
            if fm > 0 and not seen >> fm & 1:
                seen |= 1 << fm
                e = (rf + (fm if fm < _CAP else _CAP)) << bits | m
                heapq.heappush(heaps[fm], e)
                pushed += 1
                t = tops[fm]
                if t == -1 or (t >= 0 and e < t):
                    tops[fm] = e
                elif t >= 0 and rack_l[t & mask] == r:
                    tops[fm] = -2
        if was > 0 and not seen >> was & 1:
            t = tops[was]
            if t >= 0 and rack_l[t & mask] == r:
                tops[was] = -2
        self._pushes += pushed

    def _grow(self, size: int) -> None:
        more = size - len(self.hist)
        self.hist.extend([0] * more)
        if self.ff is not None:
            self.ff.extend([] for _ in range(more))
        if self.heaps is not None:
            self.heaps.extend([] for _ in range(more))
            self.tops.extend([-1] * more)

    def _rebuild(self) -> None:
        """The heaps again from the counts, without their stale entries."""
        fa = np.array(self.free_l, dtype=np.int64)
        if self.ff is not None:
            self._build_ff(fa)
        if self.heaps is not None:
            self._build_heaps(fa)
        self._pushes = 0

    def take(self, alloc: Allocation) -> list[tuple[int, int]]:
        """`take` on this index's arrays; the index follows. Returns the (node, gpu) pairs used."""
        if self._base is not None or not self._owned:
            self._own()
        assert self.share is not None
        if alloc.frac_gpu >= 0:
            n, gi = alloc.nodes[0], alloc.frac_gpu
            s = int(self.share[n, gi])
            used = take(self.free, self.share, alloc)
            if self._partial is not None:
                if 0 < s - alloc.frac_milli < FULL_SHARE:
                    self._partial[(n, gi)] = s - alloc.frac_milli
                else:
                    self._partial.pop((n, gi), None)
            if s == FULL_SHARE:
                if n in self._zero_full and FULL_SHARE not in self.share[n].tolist():
                    self._zero_full.remove(n)
                self.set_free(n, self.free_l[n] - 1)
            return used
        used = take(self.free, self.share, alloc)
        for n, c in zip(alloc.nodes, alloc.counts, strict=True):
            if c:
                self.set_free(n, self.free_l[n] - c)
        return used

    def writable(self) -> tuple[I64, I64]:
        """The pass's (free, share), copied first if they are still the caller's. The caller may change
        them from here on; the index no longer follows (place nothing more on it)."""
        assert self.share is not None
        if not self._owned:
            self.free, self.share = self.free.copy(), self.share.copy()
            self._owned = True
        self._array_ok = False
        return self.free, self.share

    # --- questions -------------------------------------------------------------------------------
    def max_free(self) -> int:
        """The largest whole-GPU free count on one node."""
        hist = self.hist
        f = len(hist) - 1
        while f > 0 and not hist[f]:
            f -= 1
        return f

    def placeable(self, whole: int, max_nodes: int) -> bool:
        """Whether some placement of `whole` GPUs on at most `max_nodes` nodes exists now, by any rule:
        a node holds it, or the `max_nodes` fullest nodes together do."""
        return whole <= 0 or 0 < _fewest_nodes(self.hist, whole) <= max_nodes

    def place(self, how: str, gpus: float, max_nodes: int) -> Allocation | None:
        """Where the gang goes now by rule `how` (None: it cannot be placed now)."""
        whole, milli = gang_size(gpus)
        return self.place_sized(how, gpus, whole, milli, max_nodes)

    def place_sized(self, how: str, gpus: float, whole: int, milli: int, max_nodes: int) -> Allocation | None:
        """`place` for a gang whose `gang_size` the caller already has (a pass sizes all jobs at once)."""
        topo = how == "topology"
        if not topo and how != "first-fit":
            raise ValueError(f"unknown placement {how!r}; choose one of {', '.join(PLACEMENTS)}")
        if whole == 0:
            if milli == 0:
                return _NO_GPUS
            return self._tightest_share(milli) if topo else self._first_share(milli)
        n = self._tightest(whole) if topo else self._first(whole)
        if n >= 0:
            return _one_node(n, whole)
        if max_nodes == 1:
            return None
        k = _fewest_nodes(self.hist, whole)
        if not 0 < k <= max_nodes:
            return None
        return self._spread(whole, k) if topo else self._in_order(whole, k, max_nodes)

    def _first(self, whole: int) -> int:
        """The lowest node with at least `whole` free GPUs (-1: none)."""
        ff = self.ff if self.ff is not None else self._need_ff()
        free_l = self.free_l
        best = -1
        for f in range(whole, len(ff)):
            h = ff[f]
            while h and free_l[h[0]] != f:
                heapq.heappop(h)
            if h and (best < 0 or h[0] < best):
                best = h[0]
        return best

    def _top(self, f: int) -> int:
        """The current packed (key, node) at the top of count f's heap (-1: none); drops stale ones."""
        t = self.tops[f]
        if t != -2:
            return t
        h = self._need_heaps()[f]
        free_l, rf_l, rack_l, bits, mask = self.free_l, self.rf_l, self.rack_l, self._bits, self._mask
        fk, off = min(f, _CAP), self._off
        while h:
            e = h[0]
            n = e & mask
            if free_l[n] == f and (rf_l[rack_l[n]] + off) * 1024 + fk == e >> bits:
                self.tops[f] = e
                return e
            heapq.heappop(h)
        self.tops[f] = -1
        return -1

    def _tightest(self, whole: int) -> int:
        """Topology's one node for `whole` GPUs: in the tightest rack that holds it, the tightest node,
        then the lowest (-1: no node holds it)."""
        if self.heaps is None:
            self._need_heaps()
        tops = self.tops
        best = -1
        for f in range(whole, len(tops)):
            t = tops[f]
            if t == -2:
                t = self._top(f)
            if t >= 0 and (best < 0 or t < best):
                best = t
        return best & self._mask if best >= 0 else -1

    def _in_order(self, g: int, k: int, max_nodes: int) -> Allocation:
        """First fit over nodes: nodes in order until they hold g GPUs; when that takes more than
        `max_nodes`, the k fullest nodes (k <= max_nodes: the fewest that hold it)."""
        free_l = self.free_l
        nodes: list[int] = []
        acc = 0
        for n, f in enumerate(free_l):
            if f > 0:
                nodes.append(n)
                acc += f
                if acc >= g:
                    return _counts(free_l, nodes, g)
                if len(nodes) == max_nodes:
                    break
        return _counts(free_l, self._fullest(k), g)

    def _fullest(self, k: int) -> list[int]:
        """The k nodes with the most free GPUs (ties: the lowest first)."""
        ff, free_l, hist = self._need_ff(), self.free_l, self.hist
        out: list[int] = []
        for f in range(len(hist) - 1, 0, -1):
            if hist[f]:
                out.extend(heapq.nsmallest(k - len(out), {n for n in ff[f] if free_l[n] == f}))
                if len(out) >= k:
                    break
        return out

    def _spread(self, g: int, k: int) -> Allocation:
        """Topology for a gang no node holds, on k nodes (the fewest that can): the tightest rack (then
        the lowest) whose k fullest nodes hold it, else as few racks as may be; the k-1 fullest of
        those nodes and, for the rest, the tightest node that holds it."""
        self._need_heaps()
        free_l, members, rf_l = self.free_l, self.members, self.rf_l
        nodes: list[int] | None = None
        for _, r in sorted([(rf_l[r], r) for r in range(self.n_racks) if rf_l[r] >= g]):
            if _top_sum(free_l, members[r], k) >= g:  # its k largest free counts hold it
                nodes = sorted(members[r], key=lambda n: -free_l[n])  # stable: ties by node index
                break
        if nodes is None:
            nodes = self._across_racks(g, k)
        chosen = nodes[: k - 1]
        rest = g - sum(free_l[n] for n in chosen)
        last = _tightest_for_rest(free_l, chosen, nodes, rest)
        if last is None:  # cannot happen when the first k nodes hold it; keep the safe answer
            return _counts(free_l, nodes[:k], g)
        return _counts(free_l, [*chosen, last], g)

    def _across_racks(self, g: int, k: int) -> list[int]:
        """No rack holds the gang: the nodes of the fewest racks found, fullest first (then by index).
        Racks whose k fullest nodes hold the most come first (then the lowest index), taken until their
        fullest k nodes hold it; where that takes more racks than the k fullest nodes anywhere lie in,
        those racks (their k fullest nodes hold the gang by construction)."""
        free_l, members = self.free_l, self.members
        tops = []
        for r, mem in enumerate(members):
            top = [f for f in sorted(map(free_l.__getitem__, mem), reverse=True)[:k] if f > 0]
            if top:
                tops.append((-sum(top), r, top))
        tops.sort()
        pool: list[int] = []
        picked: list[int] = []
        for _, r, top in tops:
            picked.append(r)
            pool = sorted(pool + top, reverse=True)[:k]
            if sum(pool) >= g:
                break
        theirs = sorted({self.rack_l[n] for n in self._fullest(k)})
        if len(theirs) < len(picked):
            picked = theirs
        return sorted((n for r in picked for n in members[r]), key=lambda n: (-free_l[n], n))

    def _partials(self) -> dict[tuple[int, int], int]:
        """The partly shared GPUs and their free shares (kept by `take`), and `_zero_full`."""
        if self._partial is None:
            sh = self.share
            assert sh is not None, "fractional jobs need the index's share array"
            rows, cols = np.nonzero(sh > 0)  # every GPU with room, in (node, gpu) order
            vals = sh[rows, cols]
            part = vals < FULL_SHARE
            at = zip(rows[part].tolist(), cols[part].tolist(), strict=True)
            self._partial = dict(zip(at, vals[part].tolist(), strict=True))
            self._zero_full = self._full_at_zero(rows[~part]) if self.hist[0] else []
        return self._partial

    def _full_at_zero(self, full_rows: I64) -> list[int]:
        """Of the nodes with a whole free GPU in `share` (`full_rows`), those counted at zero or below:
        none where the counts are the share's own (a pass's, the simulator's), but a caller may count
        fewer (a backfill's spare GPUs, beside the shares a job may take). A share may go to such a
        GPU; its count, the lowest, puts it first for topology."""
        return np.unique(full_rows[self._counts()[full_rows] <= 0]).tolist()

    def _first_share(self, milli: int) -> Allocation | None:
        """First fit for a share: the first GPU in (node, gpu) order with enough free share, which is
        the first partly used GPU that fits or the first whole free GPU, whichever comes first."""
        best = min((rc for rc, s in self._partials().items() if s >= milli), default=None)
        n = self._first(1)
        if self._zero_full and (n < 0 or self._zero_full[0] < n):
            n = self._zero_full[0]
        if n >= 0 and (best is None or n <= best[0]):
            assert self.share is not None
            cand = (n, self.share[n].tolist().index(FULL_SHARE))
            if best is None or cand < best:
                best = cand
        if best is None:
            return None
        return Allocation((best[0],), (0,), best[1], milli)

    def _tightest_share(self, milli: int) -> Allocation | None:
        """Topology for a share: the partly used GPU with the least free share that fits (ties: the
        node with the fewest whole free GPUs, then the tightest rack, then the lowest node and GPU),
        else a whole free GPU on the node with the fewest, in the tightest rack, the lowest."""
        smin = FULL_SHARE
        pairs: list[tuple[int, int]] = []
        for rc, s in self._partials().items():
            if milli <= s <= smin:
                if s < smin:
                    smin, pairs = s, [rc]
                else:
                    pairs.append(rc)
        if self.heaps is None:
            self._need_heaps()
        if pairs:
            free_l, rf_l, rack_l = self.free_l, self.rf_l, self.rack_l
            pairs.sort()
            keys = [min(free_l[n], _CAP) * (1 << 32) + rf_l[rack_l[n]] for n, _ in pairs]
            n, gi = pairs[keys.index(min(keys))]
            return Allocation((n,), (0,), gi, milli)
        if self._zero_full:
            free_l, rf_l, rack_l = self.free_l, self.rf_l, self.rack_l
            n = min(self._zero_full, key=lambda m: (min(free_l[m], _CAP) * (1 << 32) + rf_l[rack_l[m]], m))
        else:
            best = -1
            for f in range(1, len(self.tops)):  # fewest whole free GPUs first (counts past _CAP tie)
                t = self._top(f)
                if t >= 0 and (best < 0 or t < best):
                    best = t
                    if f < _CAP:
                        break
            if best < 0:
                return None
            n = best & self._mask
        assert self.share is not None
        return Allocation((n,), (0,), self.share[n].tolist().index(FULL_SHARE), milli)

    def check(self, free: I64, rack: I64, n_racks: int) -> None:
        """Invariants against the arrays it follows (tests): counts, totals, histogram, and every
        heap holding what its questions read."""
        assert self.free_l == free.tolist() and self.total == int(free.sum())
        assert self.hist == np.bincount(np.maximum(free, 0), minlength=len(self.hist)).tolist()
        if self.ff is not None:
            for n, f in enumerate(self.free_l):
                assert f <= 0 or n in self.ff[f], (n, f)
        if self.heaps is None:
            return
        rf = np.bincount(rack, weights=free, minlength=n_racks).astype(np.int64).tolist()
        assert self.rf_l == rf
        bits, mask, off = self._bits, self._mask, self._off
        for f in range(1, len(self.heaps)):
            key = (np.array(rf) + off) * 1024 + min(f, _CAP)  # per rack, for count f
            current = [
                e for e in self.heaps[f] if self.free_l[e & mask] == f and e >> bits == key[rack[e & mask]]
            ]
            assert self.tops[f] in (-2, min(current, default=-1)), (f, self.tops[f])
            lowest = {int(rack[n]): n for n in range(len(free) - 1, -1, -1) if free[n] == f}
            for n in lowest.values():
                assert any(e & mask == n for e in current), (f, n)


def scratch_index(view: ClusterView) -> FreeIndex:
    """A pass's scratch free GPUs over the view (copied on the first `take`; see `Policy.decide`)."""
    if isinstance(view.index, FreeIndex):
        return view.index.scratch(view.free, view.share)
    return FreeIndex(view.free, view.rack, view.n_racks, view.share, copy_on_write=True)
