"""The cluster: nodes with GPUs grouped in racks (switches), and its mutable allocation state.

A `ClusterSpec` says what exists (from flags, a TOML file, or the Alibaba node list). A `Cluster` holds
who uses which GPU now; policies never touch it: they get `Cluster.view()` (read-only arrays) and plan
on copies with the pure functions in `headway.policy.placement`. The same class serves the live queue.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

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
        per_rack = doc.get("nodes_per_rack", 8)
        groups = doc.get("nodes")
        if not isinstance(groups, list) or not groups:
            raise ClusterSpecError(f"{p}: needs at least one [[nodes]] table")
        if not isinstance(per_rack, int) or per_rack < 1:
            raise ClusterSpecError(f"{p}: nodes_per_rack must be a positive integer")
        out: list[NodeSpec] = []
        rack_ids: dict[str, int] = {}
        auto_rack = 0
        for gi, g in enumerate(groups, 1):
            where = f"{p}: [[nodes]] #{gi}"
            count, gpus = g.get("count", 1), g.get("gpus")
            if not isinstance(gpus, int) or gpus < 1:
                raise ClusterSpecError(f"{where}: gpus must be a positive integer")
            if not isinstance(count, int) or count < 1:
                raise ClusterSpecError(f"{where}: count must be a positive integer")
            prefix, model, rack = g.get("name", f"g{gi}-"), g.get("model"), g.get("rack")
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

    def view(self) -> ClusterView:
        def ro(a: I64) -> I64:
            v = a.view()
            v.setflags(write=False)
            return v

        return ClusterView(
            ro(self.share), ro(self.free), ro(self.owner), ro(self.node_gpus), ro(self.rack), self.n_racks
        )

    def allocate(self, alloc: Allocation, holder: int) -> list[tuple[int, int]]:
        """Take the GPUs; `holder` is the job's running position (whole GPUs record it as owner)."""
        used = take(self.free, self.share, alloc)
        if alloc.frac_gpu >= 0:
            n, gi = used[0]
            self.owner[n, gi] = -2
            self.busy += alloc.frac_milli / FULL_SHARE
        else:
            for n, gi in used:
                self.owner[n, gi] = holder
            self.busy += sum(alloc.counts)
        return used

    def release(self, used: list[tuple[int, int]], frac_milli: int) -> None:
        if frac_milli:
            n, gi = used[0]
            self.share[n, gi] += frac_milli
            if self.share[n, gi] == FULL_SHARE:
                self.free[n] += 1
                self.owner[n, gi] = -1
            self.busy -= frac_milli / FULL_SHARE
            return
        for n, gi in used:
            self.share[n, gi] = FULL_SHARE
            self.owner[n, gi] = -1
            self.free[n] += 1
        self.busy -= len(used)

    def move_holder(self, used: list[tuple[int, int]], holder: int) -> None:
        """The job's running position changed (swap-remove in the caller's buffers)."""
        for n, gi in used:
            if self.owner[n, gi] >= 0:
                self.owner[n, gi] = holder

    @property
    def free_gpus(self) -> float:
        return self.capacity - self.busy

    def validate(self) -> None:
        """Invariants after every change (tests call this)."""
        exists = self.share >= 0
        assert (self.free == ((self.share == FULL_SHARE) & exists).sum(axis=1)).all()
        assert ((self.share <= FULL_SHARE) & (self.share >= -1)).all()
        assert abs(self.busy - (self.capacity - self.share[exists].sum() / FULL_SHARE)) < 1e-6
