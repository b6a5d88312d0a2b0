"""Turning a ranking into SiteFactor values, and deciding which `scontrol update` calls to make."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from headway.slurm.runner import Runner, SlurmDenied, SlurmDown, classify

_RANGE = re.compile(r"^\s*(-?\d+)\s*:\s*(-?\d+)\s*$")


@dataclass(frozen=True, slots=True)
class FactorRange:
    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> FactorRange:
        """`LO:HI`, e.g. `0:100000` or `-5000:5000`; raises ValueError with a one-line reason."""
        m = _RANGE.match(text)
        if not m:
            raise ValueError(f"--range {text!r}: expected LO:HI with integers, e.g. 0:100000")
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo >= hi:
            raise ValueError(f"--range {text!r}: LO must be below HI")
        # Slurm stores SiteFactor as a signed 32-bit value around NICE_OFFSET; stay well inside it.
        if lo < -SITE_FACTOR_LIMIT or hi > SITE_FACTOR_LIMIT:
            raise ValueError(f"--range {text!r}: keep both ends within +-{SITE_FACTOR_LIMIT:,}")
        return cls(lo, hi)


SITE_FACTOR_LIMIT = 1_000_000_000  # Slurm keeps SiteFactor as a signed 32-bit value: stay well inside it


def map_ranks(order: Sequence[str], rng: FactorRange) -> dict[str, int]:
    """SiteFactor per job from its place in `order` (best first): best gets HI, worst LO, evenly spaced.

    Ranks, not raw scores, go into Slurm: scores span orders of magnitude and would squash most jobs
    onto the same value; evenly spaced ranks keep headway's order exact in `sprio`.
    """
    n = len(order)
    if n == 0:
        return {}
    if n == 1:
        return {order[0]: rng.hi}
    span = rng.hi - rng.lo
    return {job: rng.hi - round(i * span / (n - 1)) for i, job in enumerate(order)}


def _longest_descending(vals: Sequence[int | None]) -> list[int]:
    """Positions of a longest strictly decreasing run of the known values, in order (O(n log n))."""
    tails: list[int] = []  # tails[k]: the smallest negated value that ends a run of length k + 1
    tail_pos: list[int] = []
    back: dict[int, int] = {}
    for i, v in enumerate(vals):
        if v is None:
            continue
        k = bisect.bisect_left(tails, -v)
        if k == len(tails):
            tails.append(-v)
            tail_pos.append(i)
        else:
            tails[k], tail_pos[k] = -v, i
        back[i] = tail_pos[k - 1] if k else -1
    out: list[int] = []
    i = tail_pos[-1] if tail_pos else -1
    while i >= 0:
        out.append(i)
        i = back[i]
    return out[::-1]


def place_ranks(order: Sequence[str], current: Mapping[str, int], rng: FactorRange) -> dict[str, int]:
    """SiteFactors that put `order` (best first) exactly in order while rewriting as few jobs as it can.

    Slurm ranks by the values, not by how evenly they are spread, so a job whose value already sits in
    order keeps it: the longest run of such jobs stays, and every other job (new, or moved) goes between
    its kept neighbours. Spreading every pass from scratch rewrote nearly the whole queue at each start or
    end (451 of 452 jobs on the live test cluster after one start). A fresh spread uses the middle three
    quarters of the range, leaving room at both ends for jobs that arrive best or worst. Where the jobs
    to place would sit closer than a quarter of the usual spacing, the stretch widens over its kept
    neighbours, one at a time, until they fit, and those are placed again too: a burst of arrivals at one
    rank moves a few neighbours, not the queue. Only when an end of the range runs out of room (jobs
    leaving at the top and arriving at the bottom make the queue drift) is it spread afresh."""
    n = len(order)
    if n == 0:
        return {}
    span = rng.hi - rng.lo
    margin = span // 8
    band = FactorRange(rng.lo + margin, rng.hi - margin) if span - 2 * margin >= n else rng

    def fresh() -> dict[str, int]:
        return map_ranks(order, band)

    # 0 is Slurm's default, what every job has before headway wrote anything: not a place to keep.
    vals = [v if (v := current.get(j)) and rng.lo <= v <= rng.hi else None for j in order]
    kept = _longest_descending(vals)
    if not kept:
        return fresh()
    value = {i: v for i in kept if (v := vals[i]) is not None}
    nominal = max((band.hi - band.lo) / max(n - 1, 1), 1.0)
    min_gap = max(nominal / 4, 1.0)
    anchors = [-1, *kept, n]  # -1 and n: the ends of the range, not jobs

    def step_between(a: int, b: int) -> float:
        """The spacing the jobs strictly between anchors a and b would get (inf: the whole queue)."""
        k = b - a - 1
        upper, lower = value.get(a), value.get(b)
        if upper is not None and lower is not None:
            return (upper - lower) / (k + 1)
        if lower is not None:  # above the best kept job: at the usual spacing, or what room there is
            return min(nominal, (rng.hi - lower) / k)
        if upper is not None:  # below the worst kept job
            return min(nominal, (upper - rng.lo) / k)
        return math.inf

    out = {order[i]: v for i, v in value.items()}
    i = 0
    while i < len(anchors) - 1:
        lo_i, hi_i = i, i + 1
        if anchors[hi_i] - anchors[lo_i] == 1:
            i += 1
            continue
        widen_down = True
        while step_between(anchors[lo_i], anchors[hi_i]) < min_gap:
            if lo_i == 0 or hi_i == len(anchors) - 1:
                # Out of room at an end of the range: the queue has drifted (jobs leave at one end and
                # arrive at the other), and only spreading it afresh gives the room back.
                return fresh()
            if widen_down:  # one kept neighbour more, below and above in turn
                hi_i += 1
            else:
                lo_i -= 1
            widen_down = not widen_down
        a, b = anchors[lo_i], anchors[hi_i]
        step = step_between(a, b)
        upper, lower = value.get(a), value.get(b)
        todo = range(a + 1, b)
        k = len(todo)
        if upper is not None:
            placed = [upper - math.floor((m + 1) * step) for m in range(k)]
        else:
            assert lower is not None
            placed = [lower + math.floor(step * (k - m)) for m in range(k)]
        out.update((order[j], v) for j, v in zip(todo, placed, strict=True))
        i = hi_i
    return out


@dataclass(frozen=True, slots=True)
class Change:
    job_id: str
    old: int | None  # None: unknown (sprio did not list it)
    new: int


def plan_changes(target: Mapping[str, int], current: Mapping[str, int]) -> list[Change]:
    """Only jobs whose SiteFactor differs from what Slurm has now."""
    return [Change(j, current.get(j), v) for j, v in target.items() if current.get(j) != v]


@dataclass(slots=True)
class ApplyReport:
    applied: list[Change]
    failed: dict[str, str]  # job id -> one-line reason
    commands: int  # scontrol processes run
    aborted: str | None = None  # set when slurmctld stopped answering: the rest was not written


_FOR_JOB = re.compile(r"for job (\d+(?:[_+]\d+)?)", re.IGNORECASE)


def apply_changes(runner: Runner, changes: Sequence[Change], batch: int = 256) -> ApplyReport:
    """`scontrol update JobId=N SiteFactor=X` for each change, many per scontrol process (read from its
    stdin, one command a line); failures per job, never fatal for the others.

    scontrol names each failing job (`Invalid job id specified for job 99`), so a failed batch is told
    apart job by job. If slurmctld stops answering, nothing further is written (values computed before it
    went away may be stale). Raises SlurmDenied when Slurm refuses the update itself (not root or
    SlurmUser): every later write would be refused too.
    """
    report = ApplyReport(applied=[], failed={}, commands=0)
    for i in range(0, len(changes), batch):
        chunk = changes[i : i + batch]
        script = "".join(f"update JobId={c.job_id} SiteFactor={c.new}\n" for c in chunk)
        res = runner.run("scontrol", [], check=False, stdin=script)
        report.commands += 1
        if res.returncode == 0:
            report.applied.extend(chunk)
            continue
        text = (res.stderr + "\n" + res.stdout).strip()
        named: dict[str, str] = {}
        for line in text.splitlines():
            m = _FOR_JOB.search(line)
            if m:
                named[m.group(1)] = line.strip().removeprefix("scontrol: ")
        err = classify("scontrol update", res.returncode, text)
        if isinstance(err, SlurmDenied):
            raise err
        if isinstance(err, SlurmDown):
            report.aborted = str(err)
            for c in chunk:  # some may have been written before it went away: not known which
                report.failed[c.job_id] = f"not confirmed: {err}"
            return report
        for c in chunk:
            if c.job_id in named:
                report.failed[c.job_id] = named[c.job_id]
            elif named:
                report.applied.append(c)  # scontrol names only the jobs that failed
            else:
                report.failed[c.job_id] = str(err)
    return report
