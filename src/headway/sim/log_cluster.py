"""A model of the user's own cluster from the nodes its job log names (`simulate --cluster from-log`).

The job record (DESIGN.md) has no node list, and the store keeps none, so the node names are read again
from the log file itself: sacct -P's `NodeList`, sacct --json's `nodes`, the slurmdbd job table's
`nodelist`, Philly's `detail[].ip`. They are joined to the reader's jobs by job id, and the reader's
start, end and GPU count are used as they are, so times and GPUs mean here what they mean in the replay.

A node's GPUs are the most GPUs seen in use on it at the same time (jobs overlapping in [start, end)):
a log never shows a node's idle GPUs, but a busy node's GPUs are all in use at some point, and the
scheduler never gave out more than the node had. A multi-node Slurm job's GPUs count evenly on each of
its nodes (sacct gives the job's total); Philly's `detail` gives each node's share itself, and names
the GPUs (`gpu0`..`gpu7`), so a node where `gpu7` was used has at least 8 even in a sampled log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.sim.cluster import ClusterSpec, ClusterSpecError

FROM_LOG = "from-log"  # the `--cluster` value that asks for this model
GPU_RULE = "the most GPUs seen in use on it at once"
NAMED_GPU_RULE = "at least its highest GPU index + 1, where the log names the GPUs"
FORMATS_WITH_NODES: tuple[str, ...] = ("sacct", "slurmdb", "philly")

# One job's nodes: (node name, GPUs it used there, or None where the log gives only the job's total).
NodeUse = tuple[str, float | None]

_NO_NODE = frozenset({"", "none assigned", "(null)", "none", "null", "\\n", "unknown"})


class NodeListError(ValueError):
    """A log whose node lists cannot be used; str() is the one-line message."""


# --------------------------------------------------------------------------------------------- hostlists


def _top_level_split(text: str) -> list[str]:
    """`a[1-2],b3` -> [`a[1-2]`, `b3`]: commas inside brackets separate ranges, not hosts."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise NodeListError(f"unbalanced ']' in node list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise NodeListError(f"unclosed '[' in node list {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTS_PER_LIST = 100_000  # a range like n[1-999999999] is a broken field, not a cluster


def _ranges(body: str, whole: str) -> list[str]:
    """`01-03,7` -> [`01`, `02`, `03`, `7`], keeping the zero padding of the range's first number."""
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise NodeListError(f"cannot read range {part!r} in node list {whole!r}")
        a, b = m.group(1), m.group(2)
        lo, hi = int(a), int(b) if b is not None else int(a)
        if hi < lo or hi - lo >= MAX_HOSTS_PER_LIST:
            raise NodeListError(f"cannot read range {part!r} in node list {whole!r}")
        width = len(a) if a.startswith("0") else 0
        out.extend(f"{i:0{width}d}" for i in range(lo, hi + 1))
    return out


def expand_hostlist(text: str | None) -> list[str]:
    """Slurm's compressed host list as names: `n[1-2],gpu07` -> n1, n2, gpu07; `rack[1-2]-n[1-2]`
    gives every combination, as Slurm's hostlist does. No node (`None assigned`, empty) gives []."""
    if text is None or text.strip().lower() in _NO_NODE:
        return []
    hosts: list[str] = []
    for item in _top_level_split(text.strip()):
        names = [""]
        for piece in re.split(r"(\[[^\]]*\])", item):
            if piece.startswith("["):
                names = [n + r for n in names for r in _ranges(piece[1:-1], text)]
            else:
                names = [n + piece for n in names]
        hosts.extend(names)
        if len(hosts) > MAX_HOSTS_PER_LIST:
            raise NodeListError(f"node list {text[:60]!r}... names more than {MAX_HOSTS_PER_LIST:,} nodes")
    return hosts


# ---------------------------------------------------------------------------------------------- readers


@dataclass
class NodeLists:
    """Each job id's nodes as the log names them (the last listing of an id wins, as in the store)."""

    by_job: dict[str, list[NodeUse]] = field(default_factory=dict)
    unreadable: int = 0  # listings whose node field could not be read (a bad host list)
    example: str | None = None  # the first such problem, to name
    # Where the log names a node's GPUs (Philly's `gpu7`), the highest index + 1: the node has at least
    # these, even when no one job or overlap in a sampled log used them all at once.
    least_gpus: dict[str, int] = field(default_factory=dict)


def _add(lists: NodeLists, job_id: object, nodes: str | None) -> None:
    if job_id is None:
        return
    try:
        names = expand_hostlist(nodes)
    except NodeListError as e:
        lists.unreadable += 1
        lists.example = lists.example or str(e)
        return
    lists.by_job[str(job_id)] = [(n, None) for n in names]


def _sacct_text(path: Path) -> NodeLists:
    from headway.traces import tabular as tb
    from headway.traces.sacct import SACCT_DELIMITER

    with open(path, "rb") as fh:
        first = fh.readline()
    sep = SACCT_DELIMITER if SACCT_DELIMITER.encode() in first else "|"
    raw = tb.read_delimited(path, sep, quoting=False)
    ids, nodes = raw.get("JobID", "JobIDRaw"), raw.get("NodeList")
    if ids is None or nodes is None:
        raise NodeListError(
            f"{path}: the sacct output has no NodeList column; ask sacct for it "
            "(`sacct -a -X -P -o JobID,...,NodeList`) or give the cluster with --nodes or --cluster FILE"
        )
    steps = pc.fill_null(tb.is_step_id(ids), False).to_pylist()
    out = NodeLists()
    for jid, nl, step in zip(ids.to_pylist(), nodes.to_pylist(), steps, strict=True):
        if not step:
            _add(out, jid, nl)
    return out


def _sacct_json(path: Path) -> NodeLists:
    import json

    from headway.traces.sacct_json import _job_id

    try:
        doc = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NodeListError(f"{path}: not sacct --json output ({e})") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    out = NodeLists()
    for job in jobs if isinstance(jobs, list) else []:
        if not isinstance(job, dict):
            continue
        try:
            jid = _job_id(job)
        except Exception:  # the reader skipped this record as a bad row: no job to join to
            continue
        nodes = job.get("nodes")
        _add(out, jid, nodes if isinstance(nodes, str) else None)
    return out


def _slurmdb(path: Path) -> NodeLists:
    from headway.traces import tabular as tb
    from headway.traces.slurmdb import SlurmdbReader

    raw = tb.read_delimited(path, None, quoting=True)
    nodes = raw.get("nodelist")
    if nodes is None or not raw.has("id_job"):
        raise NodeListError(
            f"{path}: the job table export has no nodelist column; export it with every column "
            "(SELECT * FROM <cluster>_job_table) or give the cluster with --nodes or --cluster FILE"
        )
    ids = SlurmdbReader._job_id(tb.Frame(raw), raw)  # the reader's own ids: array tasks as `job_task`
    out = NodeLists()
    for jid, nl in zip(ids.to_pylist(), nodes.to_pylist(), strict=True):
        _add(out, jid, nl)
    return out


_GPU_INDEX = re.compile(r"(\d+)$")
MAX_GPUS_PER_NODE = 1024  # a GPU name with a larger index is not one GPU of a node


def _philly(path: Path) -> NodeLists:
    from headway.traces.philly import iter_records, open_text

    out = NodeLists()

    def on_bad(_n: int, _reason: str) -> None:  # the reader reports damaged records; nothing to join
        return None

    for _n, obj in iter_records(open_text(path), path, on_bad, None):
        if not isinstance(obj, dict) or obj.get("jobid") in (None, ""):
            continue
        run: Mapping[str, Any] = obj
        attempts = obj.get("attempts")
        if isinstance(attempts, list):  # the reader keeps the last attempt; so do its nodes
            run = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
        detail = run.get("detail")
        uses: list[NodeUse] = []
        for node in detail if isinstance(detail, list) else []:
            if isinstance(node, dict) and isinstance(node.get("ip"), str) and node["ip"]:
                ip, gpus = node["ip"], node.get("gpus")
                uses.append((ip, float(len(gpus)) if isinstance(gpus, list) else None))
                for g in gpus if isinstance(gpus, list) else []:
                    m = _GPU_INDEX.search(g) if isinstance(g, str) else None
                    if m is not None and int(m.group(1)) < MAX_GPUS_PER_NODE:
                        out.least_gpus[ip] = max(out.least_gpus.get(ip, 0), int(m.group(1)) + 1)
        out.by_job[str(obj["jobid"])] = uses
    return out


def read_node_lists(path: Path, fmt: str) -> NodeLists:
    """The node names of every job in the log `path` (plain, not gzip) of format `fmt`."""
    if fmt not in FORMATS_WITH_NODES:
        raise NodeListError(
            f"--cluster {FROM_LOG}: a {fmt} log names no nodes (only {', '.join(FORMATS_WITH_NODES)} logs "
            "do); give the cluster with --nodes and --gpus-per-node, or --cluster FILE.toml"
        )
    if fmt == "philly":
        return _philly(path)
    if fmt == "slurmdb":
        return _slurmdb(path)
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return _sacct_json(path)
    return _sacct_text(path)


# ---------------------------------------------------------------------------------------------- cluster


@dataclass(frozen=True, slots=True)
class LogCluster:
    """The cluster the log's nodes make, and what it rests on."""

    spec: ClusterSpec
    node_gpus: dict[str, int]  # every node with GPUs, in rack order
    jobs_placed: int  # GPU jobs whose nodes the log names (they set the nodes' sizes)
    jobs_without_nodes: int  # GPU jobs that ran but whose nodes the log does not name
    cpu_only_nodes: tuple[str, ...] = ()  # nodes seen only with jobs that used no GPU: left out
    unreadable: int = 0
    named_gpus: bool = False  # the log names GPUs (Philly's gpu0..gpu7): NAMED_GPU_RULE applies

    @property
    def rule(self) -> str:
        """How a node's GPUs were counted, in words."""
        return GPU_RULE + (f"; {NAMED_GPU_RULE}" if self.named_gpus else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "node_gpus": dict(self.node_gpus),
            "jobs_placed": self.jobs_placed,
            "jobs_without_nodes": self.jobs_without_nodes,
            "cpu_only_nodes": list(self.cpu_only_nodes),
            "unreadable_node_lists": self.unreadable,
        }

    def summary(self) -> str:
        """`4 nodes, 24 GPUs: n1 8, n2 8, n3 4, n4 4` (large clusters: nodes counted by size)."""
        head = f"{len(self.node_gpus):,} nodes, {self.spec.capacity_gpus:,} GPUs"
        if len(self.node_gpus) <= 12:
            return head + ": " + ", ".join(f"{n} {g}" for n, g in self.node_gpus.items())
        sizes: dict[int, int] = {}
        for g in self.node_gpus.values():
            sizes[g] = sizes.get(g, 0) + 1
        return head + ": " + ", ".join(f"{c:,} with {g}" for g, c in sorted(sizes.items(), reverse=True))


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """n2 before n10: digits compare as numbers."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def _seconds(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    us = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
    return np.asarray(us, dtype=np.float64) / 1e6


@dataclass(frozen=True, slots=True)
class _Run:
    start: float
    end: float  # +inf for a job still running when the log was taken (it held its GPUs from its start)
    gpus: float
    placed: list[tuple[str, float]]  # (node, GPUs there); empty where the log names no node


def _runs(jobs: pa.Table, lists: NodeLists) -> Iterator[_Run]:
    """Every started job of the reader's table (the last listing of an id, as the store keeps it)."""
    last: dict[str, int] = {}
    for i, jid in enumerate(jobs.column("job_id").to_pylist()):
        last[str(jid)] = i
    t = jobs.take(pa.array(sorted(last.values()), pa.int64()))
    start = _seconds(t.column("start_time"))
    end = _seconds(t.column("end_time"))
    gpus = np.nan_to_num(np.asarray(t.column("gpus").to_numpy(zero_copy_only=False), dtype=np.float64))
    for k, jid in enumerate(t.column("job_id").to_pylist()):
        if math.isnan(start[k]):
            continue
        nodes = lists.by_job.get(str(jid)) or []
        g = float(gpus[k])
        share = g / len(nodes) if nodes else 0.0
        placed = [(n, share if own is None else own) for n, own in nodes]
        yield _Run(float(start[k]), math.inf if math.isnan(end[k]) else float(end[k]), g, placed)


def peak_gpus(runs: Sequence[_Run]) -> dict[str, float]:
    """Each node's most GPUs in use at once; a job ending at t frees its GPUs before one starting at t."""
    codes: dict[str, int] = {}
    node: list[int] = []
    when: list[float] = []
    delta: list[float] = []
    for r in runs:
        for n, g in r.placed:
            c = codes.setdefault(n, len(codes))
            node += [c, c]
            when += [r.start, r.end]
            delta += [g, -g]
    names = list(codes)
    peak = dict.fromkeys(names, 0.0)
    if not node:
        return peak
    nd, tm, dl = np.array(node), np.array(when), np.array(delta)
    order = np.lexsort((dl, tm, nd))  # by node, then time, then frees (negative) before takes
    nd, dl = nd[order], dl[order]
    run = np.cumsum(dl)
    first = np.flatnonzero(np.r_[True, nd[1:] != nd[:-1]])
    base = np.r_[0.0, run][first]  # the running total before each node's first event
    sizes = np.diff(np.r_[first, len(nd)])
    per_node = np.maximum.reduceat(run - np.repeat(base, sizes), first)
    for c, p in zip(nd[first].tolist(), per_node.tolist(), strict=True):
        peak[names[c]] = float(p)
    return peak


def cluster_from_log(
    jobs: pa.Table, lists: NodeLists, nodes_per_rack: int = 8, label: str = ""
) -> LogCluster:
    """The nodes the log names, each with `GPU_RULE`'s GPUs, racked `nodes_per_rack` at a time in name
    order (n1, n2, ..., n10); nodes seen only with CPU jobs are left out and listed."""
    runs = [r for r in _runs(jobs, lists) if r.gpus > 0 or r.placed]
    peak = peak_gpus(runs)
    names = sorted(peak, key=natural_key)
    sized = {n: max(math.ceil(peak[n] - 1e-6), lists.least_gpus.get(n, 0)) for n in names}
    with_gpus = {n: g for n, g in sized.items() if g > 0}
    if not with_gpus:
        where = f"{label}: " if label else ""
        raise ClusterSpecError(
            f"{where}--cluster {FROM_LOG}: no job with GPUs names its nodes in this log"
            + (
                f" ({lists.unreadable:,} node lists could not be read: {lists.example})"
                if lists.unreadable
                else ""
            )
            + "; give the cluster with --nodes and --gpus-per-node, or --cluster FILE.toml"
        )
    spec = ClusterSpec.from_counts(list(with_gpus.values()), list(with_gpus), nodes_per_rack=nodes_per_rack)
    return LogCluster(
        spec=spec,
        node_gpus=with_gpus,
        jobs_placed=sum(1 for r in runs if r.placed and r.gpus > 0),
        jobs_without_nodes=sum(1 for r in runs if not r.placed and r.gpus > 0),
        cpu_only_nodes=tuple(n for n in names if sized[n] == 0),
        unreadable=lists.unreadable,
        named_gpus=bool(lists.least_gpus),
    )
