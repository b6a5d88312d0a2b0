"""Why a job ranks where it does, in words, from the policy's factors (for `headway slurm why`).

The impact score is w p / c x fair share, with c = gpus x (p R + (1 - p) F) the GPU-hours a job is
expected to take. A job likely to fail can still rank high when it would fail fast: the GPU-hours lost
if it does are few, and if it does not, its work is done. A reader of `p = 0.2` near the top of the queue
needs that said, not just the numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from headway.slurm.sync import PlanRow

# Factors the impact policy gives each job; other policies give other ones and get no sentence.
_COST_FACTORS = ("p", "R_h", "F_h", "c_gpu_h")


def _hours(h: float) -> str:
    """A predicted duration as `6m` (under two hours) or `2.5h`."""
    if h * 60 < 1:
        return "a minute"
    return f"{h * 60:.0f}m" if h < 2 else f"{h:.1f}h"


def fails_fast(row: PlanRow, rows: Sequence[PlanRow]) -> str | None:
    """The sentence for a job that ranks high because a failure would be short and so cheap, or None.

    That is: a normal-tier job in the better half of the ranking (of two jobs or more), more likely to
    fail than not (p < 0.5), predicted to fail sooner than it would finish (F < R: its likely outcome is
    the cheap one), and whose expected cost c is below the median of the ranked jobs.
    """
    f = row.factors
    if not row.tier.startswith("normal") or len(rows) < 2 or row.rank > (len(rows) + 1) // 2:
        return None
    if any(k not in f for k in _COST_FACTORS):
        return None
    p, r_h, f_h, c = (f[k] for k in _COST_FACTORS)
    median = statistics.median(x.factors["c_gpu_h"] for x in rows if "c_gpu_h" in x.factors)
    if not (p < 0.5 and f_h < r_h and c < median):
        return None
    return (
        f"ranks high because, if it fails, it fails fast: predicted failure within {_hours(f_h)}, so "
        f"trying it costs little ({c:.2g} expected GPU-hours, against {median:.2g} for the median ranked "
        f"job), although it completes with p = {p:.2f} only"
    )


def rank_in_words(row: PlanRow, rows: Sequence[PlanRow]) -> str | None:
    """One sentence on why `row` ranks where it does among `rows` (the plan's ranked jobs), where one of
    the cases below applies; None otherwise (the factors speak for themselves)."""
    if row.tier.startswith("starved"):
        waited = row.factors.get("waited_h")
        since = f" ({_hours(waited)})" if waited is not None else ""
        return f"ranks ahead of every job that has not: it has waited past its class's max_wait{since}"
    if row.tier.startswith("held"):
        return (
            "ranks at the bottom: jobs of this user and name failed several times in a row with no "
            "success since (it still runs when nothing else wants the GPUs)"
        )
    return fails_fast(row, rows)


__all__ = ["fails_fast", "rank_in_words"]
