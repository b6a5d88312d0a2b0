"""Turning a ranking into SiteFactor values, and deciding which `scontrol update` calls to make."""

from __future__ import annotations

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
