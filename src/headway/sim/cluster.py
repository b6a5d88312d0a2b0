"""The cluster: nodes with GPUs grouped in racks (switches), and its mutable allocation state.

A `ClusterSpec` says what exists (from flags, a TOML file, or the Alibaba node list). A `Cluster` holds
who uses which GPU now; policies never touch it: they get `Cluster.view()` (read-only arrays) and plan
on copies with the pure functions in `headway.policy.placement`. The same class serves the live queue.
"""

from __future__ import annotations

import tomllib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import numpy as np

from headway.policy.placement import take
from headway.policy.snapshot import FULL_SHARE, I64, Allocation, ClusterView


class ClusterSpecError(ValueError):
    """A cluster description that cannot be used; str() is the one-line message."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    gpus: int
    rack: int
    model: str | None = None

    def __reduce__(self) -> tuple[type[NodeSpec], tuple[str, int, int, str | None]]:
        """Pickle through the constructor: compiled (mypyc), a frozen dataclass cannot be rebuilt
        attribute by attribute, and parallel replays and Dask workers pickle the cluster."""
        return (NodeSpec, (self.name, self.gpus, self.rack, self.model))


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    def __reduce__(self) -> tuple[type[ClusterSpec], tuple[tuple[NodeSpec, ...]]]:
        """See NodeSpec.__reduce__."""
        return (ClusterSpec, (self.nodes,))

    @property
    def capacity_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def max_node_gpus(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    @property
    def n_racks(self) -> int:
        return 1 + max((n.rack for n in self.nodes), default=-1)

    def describe(self) -> str:
        return f"{len(self.nodes)} nodes, {self.capacity_gpus} GPUs, {self.n_racks} racks"

    @classmethod
    def from_flags(cls, nodes: int, gpus_per_node: int, nodes_per_rack: int = 8) -> ClusterSpec:
        """`nodes` identical nodes; racks of `nodes_per_rack` consecutive nodes."""
        if nodes < 1 or gpus_per_node < 1 or nodes_per_rack < 1:
            raise ClusterSpecError("nodes, gpus per node and nodes per rack must all be at least 1")
        return cls(tuple(NodeSpec(f"node{i:04d}", gpus_per_node, i // nodes_per_rack) for i in range(nodes)))

    @classmethod
    def from_counts(
        cls,
        gpus: list[int],
        names: list[str] | None = None,
        models: list[str | None] | None = None,
        nodes_per_rack: int = 8,
    ) -> ClusterSpec:
        """Nodes with the given GPU counts (GPU-less nodes are dropped), racked in order."""
        out: list[NodeSpec] = []
        for i, g in enumerate(gpus):
            if g <= 0:
                continue
            name = names[i] if names else f"node{i:04d}"
            model = models[i] if models else None
            out.append(NodeSpec(name, int(g), len(out) // nodes_per_rack, model))
        if not out:
            raise ClusterSpecError("the cluster has no GPUs")
        return cls(tuple(out))

    @classmethod
    def from_alibaba(cls, path: str | Path, nodes_per_rack: int = 8) -> ClusterSpec:
        """The Alibaba `openb_node_list_*.csv`: GPU nodes in file order; racks are assumed, not traced."""
        from headway.traces.alibaba import read_alibaba_nodes

        nodes = read_alibaba_nodes(path)
        if not any(n.gpus > 0 for n in nodes):  # the file is named: `the cluster has no GPUs` alone was not
            raise ClusterSpecError(
                f"{path}: none of its {len(nodes):,} nodes has a GPU (Alibaba's GPU nodes are in "
                "openb_node_list_gpu_node.csv)"
            )
        return cls.from_counts(
            [n.gpus for n in nodes], [n.name for n in nodes], [n.model for n in nodes], nodes_per_rack
        )

    @classmethod
    def from_toml(cls, path: str | Path) -> ClusterSpec:
        """A TOML file of `[[nodes]]` groups (format in docs/policies.md)."""
        p = Path(path)
        try:
            doc = tomllib.loads(p.read_text())
        except OSError as e:
            raise ClusterSpecError(f"{p}: cannot read: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise ClusterSpecError(f"{p}: not valid TOML: {e}") from e
        except UnicodeDecodeError as e:  # a binary file given by mistake: say which file, as for bad TOML
            raise ClusterSpecError(f"{p}: not valid TOML: not UTF-8 text (byte {e.start})") from None
        per_rack = doc.get("nodes_per_rack", 8)
        groups = doc.get("nodes")
        if unknown := sorted(set(doc) - _TOP_KEYS):
            raise ClusterSpecError(f"{p}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
        if not isinstance(groups, list) or not groups:
            raise ClusterSpecError(f"{p}: needs at least one [[nodes]] table")
        if not _positive_int(per_rack):
            raise ClusterSpecError(f"{p}: nodes_per_rack must be a positive integer")
        out: list[NodeSpec] = []
        rack_ids: dict[str, int] = {}
        auto_rack = 0
        for gi, g in enumerate(groups, 1):
            where = f"{p}: [[nodes]] #{gi}"
            if not isinstance(g, dict):
                raise ClusterSpecError(f"{where}: expected a table")
            if unknown := sorted(set(g) - _GROUP_KEYS):  # a typo ("gpu") must not silently mean the default
                known = ", ".join(sorted(_GROUP_KEYS))
                raise ClusterSpecError(f"{where}: unknown key {unknown[0]!r} (known: {known})")
            count, gpus = g.get("count", 1), g.get("gpus")
            if not _positive_int(gpus):
                raise ClusterSpecError(f"{where}: gpus must be a positive integer")
            if not _positive_int(count):
                raise ClusterSpecError(f"{where}: count must be a positive integer")
            prefix, model, rack = g.get("name", f"g{gi}-"), g.get("model"), g.get("rack")
            if model is not None and not isinstance(model, str):  # NodeSpec.model (compiled: str or None)
                raise ClusterSpecError(f'{where}: model must be a string, e.g. model = "A100"')
            for i in range(count):
                if rack is not None:
                    r = rack_ids.setdefault(str(rack), len(rack_ids) + 10**6)
                else:
                    r = auto_rack // per_rack
                    auto_rack += 1
                out.append(NodeSpec(f"{prefix}{i:04d}", gpus, r, model))
        # Renumber racks densely in first-seen order (named racks and auto racks never collide).
        dense: dict[int, int] = {}
        nodes = tuple(NodeSpec(n.name, n.gpus, dense.setdefault(n.rack, len(dense)), n.model) for n in out)
        return cls(nodes)


_TOP_KEYS = frozenset({"nodes", "nodes_per_rack"})
_GROUP_KEYS = frozenset({"count", "gpus", "name", "model", "rack"})


def _positive_int(v: object) -> TypeGuard[int]:
    """A TOML integer >= 1 (TOML's true is a bool, which Python also counts as the int 1)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _flat(a: I64) -> memoryview:
    """The items of a C-contiguous int64 array as one flat memoryview of the same memory."""
    return a.reshape(-1).data.cast("B").cast("q")


class Cluster:
    """Mutable GPU state: free share per GPU, whole free GPUs per node, and who holds each GPU."""

    def __init__(self, spec: ClusterSpec) -> None:
        if not spec.nodes:
            raise ClusterSpecError("the cluster has no nodes")
        self.spec = spec
        _n, g = len(spec.nodes), spec.max_node_gpus
        self.node_gpus: I64 = np.array([x.gpus for x in spec.nodes], dtype=np.int64)
        self.rack: I64 = np.array([x.rack for x in spec.nodes], dtype=np.int64)
        self.n_racks = spec.n_racks
        exists = np.arange(g)[None, :] < self.node_gpus[:, None]
        self.share: I64 = np.where(exists, FULL_SHARE, -1).astype(np.int64)
        self.free: I64 = self.node_gpus.copy()
        self.owner: I64 = np.where(exists, -1, -2).astype(np.int64)
        self.capacity = float(self.node_gpus.sum())
        self.busy = 0.0  # GPUs in use (fractions count as their share)
        # Flat views of the same memory for the per-job writes below: an item of a memoryview is read and
        # written as a plain int, several times faster than a numpy scalar, and a node's run of GPUs is
        # one slice assignment. The numpy arrays (and the views policies get) see every write.
        self._g = g
        self._sh = _flat(self.share)
        self._ow = _flat(self.owner)
        self._fr = _flat(self.free)
        self._full = memoryview(array("q", [FULL_SHARE] * g))
        self._zero = memoryview(array("q", [0] * g))
        self._unowned = memoryview(array("q", [-1] * g))

    def view(self) -> ClusterView:
        def ro(a: I64) -> I64:
            v = a.view()
            v.setflags(write=False)
            return v

        return ClusterView(
            ro(self.share), ro(self.free), ro(self.owner), ro(self.node_gpus), ro(self.rack), self.n_racks
        )

    def allocate(self, alloc: Allocation, holder: int) -> list[tuple[int, int]]:
        """Take the GPUs; `holder` is the job's running position (whole GPUs record it as owner).

        The same GPUs as `headway.policy.placement.take` (each node's first free ones, in order), written
        through the flat views: a node's consecutive GPUs as one slice."""
        sh, ow, fr, g = self._sh, self._ow, self._fr, self._g
        if alloc.frac_gpu >= 0:
            n, gi = alloc.nodes[0], alloc.frac_gpu
            i = n * g + gi
            if sh[i] == FULL_SHARE:
                fr[n] -= 1
            sh[i] -= alloc.frac_milli
            ow[i] = -2
            self.busy += alloc.frac_milli / FULL_SHARE
            return [(n, gi)]
        if g > 64:  # nodes with many GPUs: numpy's scan of a row beats a list's
            used = take(self.free, self.share, alloc)
            for n, gi in used:
                ow[n * g + gi] = holder
            self.busy += sum(alloc.counts)
            return used
        nodes, counts = alloc.nodes, alloc.counts
        if len(nodes) == 1 and counts[0] == 1:  # one GPU: the node's first free one
            n = nodes[0]
            b = n * g
            row = sh[b : b + g].tolist()
            if FULL_SHARE in row:
                a = row.index(FULL_SHARE)
                sh[b + a] = 0
                ow[b + a] = holder
                fr[n] -= 1
                self.busy += 1
                return [(n, a)]
        used = []
        for n, c in zip(nodes, counts, strict=True):
            b = n * g
            row = sh[b : b + g].tolist()
            a = row.index(FULL_SHARE) if c and FULL_SHARE in row else -1
            if a >= 0 and row[a : a + c] == [FULL_SHARE] * c:  # the first c free GPUs are consecutive
                i = b + a
                sh[i : i + c] = self._zero[:c]
                for j in range(i, i + c):
                    ow[j] = holder
                used.extend([(n, gi) for gi in range(a, a + c)])
            else:
                for gi in [gi for gi, v in enumerate(row) if v == FULL_SHARE][:c]:
                    sh[b + gi] = 0
                    ow[b + gi] = holder
                    used.append((n, gi))
            fr[n] -= c
        self.busy += sum(counts)
        return used

    def release(self, used: list[tuple[int, int]], frac_milli: int) -> None:
        """Give back what `allocate` returned (`frac_milli`: the share of a fractional job, else 0)."""
        sh, ow, fr, g = self._sh, self._ow, self._fr, self._g
        if frac_milli:
            n, gi = used[0]
            i = n * g + gi
            s = sh[i] + frac_milli
            sh[i] = s
            if s == FULL_SHARE:
                fr[n] += 1
                ow[i] = -1
            self.busy -= frac_milli / FULL_SHARE
            return
        k = len(used)
        if k == 1:
            n, gi = used[0]
            i = n * g + gi
            sh[i] = FULL_SHARE
            ow[i] = -1
            fr[n] += 1
        elif k:
            n, a = used[0]
            n_last, a_last = used[-1]
            # One node's consecutive GPUs (`allocate` lists a node's GPUs together, in order).
            if n == n_last and a_last - a == k - 1:
                i = n * g + a
                sh[i : i + k] = self._full[:k]
                ow[i : i + k] = self._unowned[:k]
                fr[n] += k
            else:
                for n, gi in used:
                    i = n * g + gi
                    sh[i] = FULL_SHARE
                    ow[i] = -1
                    fr[n] += 1
        self.busy -= k

    def move_holder(self, used: list[tuple[int, int]], holder: int) -> None:
        """The job's running position changed (swap-remove in the caller's buffers)."""
        ow, g = self._ow, self._g
        for n, gi in used:
            i = n * g + gi
            if ow[i] >= 0:
                ow[i] = holder

    @property
    def free_gpus(self) -> float:
        return self.capacity - self.busy

    def validate(self) -> None:
        """Invariants after every change (tests call this)."""
        exists = self.share >= 0
        assert (self.free == ((self.share == FULL_SHARE) & exists).sum(axis=1)).all()
        assert ((self.share <= FULL_SHARE) & (self.share >= -1)).all()
        assert abs(self.busy - (self.capacity - self.share[exists].sum() / FULL_SHARE)) < 1e-6
