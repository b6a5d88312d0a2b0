"""Why jobs were not replayed: the reasons a simulation left them out, in words a footer can show."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from headway.sim.run import CPU_ONLY, NEVER_RAN, NO_GPUS, NO_SUBMIT

if TYPE_CHECKING:
    import pyarrow as pa

    from headway.sim.result import SimResult


def why_left_out(jobs: pa.Table, results: Sequence[SimResult], job_id: str) -> str | None:
    """Why `job_id` is not in the replay (None when it is)."""
    import pyarrow.compute as pc

    if not results or pc.any(pc.equal(results[0].jobs.column("job_id"), job_id)).as_py():
        return None
    for line in results[0].excluded:
        if line.startswith(f"{job_id}: "):
            return line[len(job_id) + 2 :]
    # The last listing: a job listed again is replayed from its last listing (as the store keeps it), so
    # that one is what was left out, not an earlier listing that may have run.
    row = jobs.filter(pc.equal(jobs.column("job_id"), job_id)).to_pylist()[-1]
    if row["submit_time"] is None:
        return NO_SUBMIT
    if row["gpus"] is None:
        return NO_GPUS
    if row["start_time"] is None or row["end_time"] is None:
        return NEVER_RAN
    return CPU_ONLY + " (--include-cpu adds such jobs)"


def left_out_text(counts: Mapping[str, int]) -> str:
    """`897 never started or never ended in the trace, 1,052 CPU-only (0 GPUs)`."""
    return ", ".join(f"{n:,} {reason}" for reason, n in counts.items())


def cpu_hint(counts: Mapping[str, int], include_cpu: bool) -> str:
    """The hint that --include-cpu would replay the CPU-only jobs that were left out ('' when none were)."""
    return "; --include-cpu replays CPU-only jobs too" if counts.get(CPU_ONLY) and not include_cpu else ""
