"""`simulate --class-mix`: priority classes and preemptible flags drawn, seeded, onto a real trace.

Public traces carry no classes (Philly, Alibaba) or the classes of one site's policy. A mix gives a
replay what a shared cluster's queue looks like with urgent work in it, reproducibly:

    SPEC    := "default" | ENTRY ("," ENTRY)*
    ENTRY   := CLASS "=" PERCENT "%" ["@" MIN "-" MAX] [":preemptible"]

Entries are drawn in order, each from the jobs no earlier entry took (and, with `@MIN-MAX`, whose GPU
count lies in that range), a PERCENT share of all the trace's jobs chosen uniformly at random by the
seed; every other job becomes `normal` and not preemptible (the trace's own classes and flags are
replaced). Where fewer jobs fit an entry's range than its share, it takes all of them, and the summary
says how many it got. `default` is `urgent=5%@16-64,low=20%:preemptible`: 5% urgent gangs of 16 to 64
GPUs, 20% preemptible low jobs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

DEFAULT_MIX = "urgent=5%@16-64,low=20%:preemptible"
_ENTRY = re.compile(
    r"^(?P<cls>low|normal|high|urgent)=(?P<pct>\d+(?:\.\d+)?)%"
    r"(?:@(?P<lo>\d+(?:\.\d+)?)-(?P<hi>\d+(?:\.\d+)?))?(?P<pre>:preemptible)?$"
)


@dataclass(frozen=True, slots=True)
class MixEntry:
    klass: str
    share: float  # of all jobs
    gpus_min: float = 0.0
    gpus_max: float = math.inf
    preemptible: bool = False


def parse_mix(spec: str) -> list[MixEntry]:
    """The entries of a --class-mix spec (ValueError with the entry at fault)."""
    text = DEFAULT_MIX if spec.strip() == "default" else spec
    out: list[MixEntry] = []
    total = 0.0
    for raw in text.split(","):
        m = _ENTRY.match(raw.strip())
        if m is None:
            raise ValueError(
                f"--class-mix: cannot read {raw.strip()!r}; write CLASS=PCT%[@MIN-MAX][:preemptible] with "
                "CLASS one of low, normal, high, urgent (e.g. urgent=5%@16-64,low=20%:preemptible), "
                "or default"
            )
        share = float(m["pct"]) / 100.0
        lo = float(m["lo"]) if m["lo"] else 0.0
        hi = float(m["hi"]) if m["hi"] else math.inf
        if lo > hi:
            raise ValueError(f"--class-mix: {raw.strip()!r}: the GPU range is empty ({lo:g} > {hi:g})")
        total += share
        out.append(MixEntry(m["cls"], share, lo, hi, bool(m["pre"])))
    if total > 1.0 + 1e-9:
        raise ValueError(f"--class-mix: the shares add up to {100 * total:g}%, more than all the jobs")
    return out


@dataclass(frozen=True, slots=True)
class MixSummary:
    spec: str
    seed: int
    counts: dict[str, int]  # jobs per class after the draw
    preemptible: int
    short: dict[str, int]  # entries that got fewer jobs than their share: how many they got

    def as_dict(self) -> dict[str, object]:
        return {
            "spec": self.spec,
            "seed": self.seed,
            "jobs_per_class": self.counts,
            "preemptible_jobs": self.preemptible,
            "short_of_share": self.short,
        }


def apply_mix(jobs: pa.Table, spec: str, seed: int) -> tuple[pa.Table, MixSummary]:
    """`jobs` with `priority_class` and `preemptible` drawn by the mix (see the module docstring)."""
    entries = parse_mix(spec)
    n = jobs.num_rows
    rng = np.random.default_rng(seed)
    gpus = np.nan_to_num(
        np.asarray(jobs.column("gpus").cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)),
        nan=0.0,
    )
    klass = np.full(n, "normal", dtype=object)
    pre = np.zeros(n, dtype=bool)
    free = np.ones(n, dtype=bool)
    short: dict[str, int] = {}
    for e in entries:
        want = round(e.share * n)
        pool = np.flatnonzero(free & (gpus >= e.gpus_min) & (gpus <= e.gpus_max))
        take = pool if len(pool) <= want else rng.choice(pool, size=want, replace=False)
        if len(pool) < want:
            short[f"{e.klass}={100 * e.share:g}%"] = len(pool)
        klass[take] = e.klass
        pre[take] = e.preemptible
        free[take] = False
    out = _set(jobs, "priority_class", pa.array(klass.tolist(), pa.string()))
    out = _set(out, "preemptible", pa.array(pre, pa.bool_()))
    values, counts = np.unique(klass.astype(str), return_counts=True)
    summary = MixSummary(
        spec if spec.strip() != "default" else f"default ({DEFAULT_MIX})",
        seed,
        {str(v): int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)},
        int(pre.sum()),
        short,
    )
    return out, summary


def _set(t: pa.Table, name: str, col: pa.Array) -> pa.Table:
    i = t.schema.get_field_index(name)
    if i < 0:
        return t.append_column(name, col)
    return t.set_column(i, pa.field(name, col.type), col)
