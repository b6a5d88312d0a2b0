"""`--explain JOB`: the story of one job's wait under each policy, pass by pass, in stretches.

The replay records a WaitRecord per scheduling pass the job waited through; this module groups them
into stretches (the same tier and reservation state) and says when the job started, for a table or JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headway.sim.compare import fmt_seconds

if TYPE_CHECKING:
    import pyarrow as pa

    from headway.sim.result import SimResult, WaitRecord


def explain_problem(jobs: pa.Table, job_id: str, label: str) -> str | None:
    """Why `job_id` cannot be explained (None: it names one job): the replay records waits by job id,
    so the same id in two sources of a store (two clusters both have a job 17) gave one table of both
    jobs' passes."""
    import pyarrow.compute as pc

    rows = jobs.filter(pc.equal(jobs.column("job_id"), job_id))
    if rows.num_rows == 0:
        return f"--explain: no job {job_id!r} in {label}"
    sources = sorted({str(s) for s in rows.column("source").to_pylist()})
    if len(sources) > 1:
        return (
            f"--explain: job {job_id!r} is in {len(sources)} sources of {label} ({', '.join(sources)}), "
            "each a different job; --source NAME picks one"
        )
    return None


def wait_segments(recs: Sequence[WaitRecord]) -> list[list[WaitRecord]]:
    """Consecutive passes with the same tier and the same reservation state, as one stretch each: the
    factors in a reason change at every pass (waited time, fair share), so a row per pass would bury
    the few changes that matter."""
    segs: list[list[WaitRecord]] = []
    key = None
    for w in recs:
        k = (w.reason.split(";", 1)[0], w.reservation_start is not None)
        if segs and k == key:
            segs[-1].append(w)
        else:
            segs.append([w])
            key = k
    return segs


def stretch_rows(recs: Sequence[WaitRecord], most: int = 40) -> list[tuple[str, ...]]:
    """The explain table's rows: from, to, passes, rank, reservation, reason; past `most` stretches the
    first and the last ones (how the wait began, and what ended it) around a `...` row."""
    segs: list[list[WaitRecord]] = wait_segments(recs)
    cut = 0
    if len(segs) > most:
        head = most * 3 // 8
        cut = len(segs) - most
        segs = [*segs[:head], [], *segs[head + cut :]]
    rows: list[tuple[str, ...]] = []
    for seg in segs:
        if not seg:
            rows.append(("...", "", "", "", "", f"{cut} more stretches"))
            continue
        a, b = seg[0], seg[-1]
        rows.append(
            (
                fmt_seconds(a.t),
                fmt_seconds(b.t),
                str(len(seg)),
                f"{a.rank}/{a.of}" if len(seg) == 1 else f"{a.rank}/{a.of}->{b.rank}/{b.of}",
                fmt_seconds(b.reservation_start) if b.reservation_start is not None else "-",
                b.reason,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class JobStory:
    """One policy's account of the job: what --json prints, the table's title (plain text) and rows."""

    policy: str
    data: dict[str, Any]
    title: str
    rows: list[tuple[str, ...]]


def _count(n: int, noun: str, plural: str) -> str:
    return f"{n:,} {noun if n == 1 else plural}"


def explain_job(results: Sequence[SimResult], job_id: str) -> list[JobStory]:
    """The job's wait under each replayed policy, in the order the policies ran."""
    import pyarrow.compute as pc

    stories: list[JobStory] = []
    for r in results:
        recs = r.explain.get(job_id, [])
        row = r.jobs.filter(pc.equal(r.jobs.column("job_id"), job_id)).to_pylist()
        job = row[0] if row else {}
        wait = None
        if job.get("start") is not None and job.get("submit") is not None:
            wait = float(job["start"]) - float(job["submit"])
        data: dict[str, Any] = {
            "job": job,
            "queue_delay": wait,
            "passes": [
                {
                    "t": w.t,
                    "rank": w.rank,
                    "of": w.of,
                    "score": w.score,
                    "reason": w.reason,
                    "reservation_start": w.reservation_start,
                }
                for w in recs
            ],
        }
        preempted = int(job.get("preemptions") or 0)
        held_back = None  # submit to end, less its own runtime: every wait, and restart penalties
        if job.get("end") is not None and job.get("runtime") is not None and wait is not None:
            held_back = float(job["end"]) - float(job["submit"]) - float(job["runtime"])
        data["preemptions"] = preempted
        data["waited_in_all"] = held_back
        started = f"started after {fmt_seconds(wait)}"
        if preempted:
            started = (
                f"first started after {fmt_seconds(wait)}, preempted {preempted} time(s), "
                f"{fmt_seconds(held_back)} waiting or restarting in all"
            )
        title = (
            f"{r.policy}: job {job_id} submitted at {fmt_seconds(job.get('submit'))}, "
            f"{started} ({_count(len(recs), 'scheduling pass', 'scheduling passes')} while it waited)"
        )
        stories.append(JobStory(r.policy, data, title, stretch_rows(recs)))
    return stories
