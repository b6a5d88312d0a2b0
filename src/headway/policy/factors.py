"""The factors policies score and plan with: fair share, expected runtimes and ends, per-class tables.

Pure functions over a snapshot's columns, shared by the policies of policy/ (none imports a policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from headway.policy.snapshot import F64, I64, Snapshot

HOUR = 3600.0
DAY = 86400.0
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def fairshare(snap: Snapshot) -> F64:
    """Slurm's classic factor 2^(-usage/share) per user, usage normalised over all users' decayed usage."""
    total = float(snap.usage.sum())
    if total <= 0:
        return np.ones(len(snap.usage))
    shares = np.maximum(snap.shares, 1e-12)
    return np.asarray(np.exp2(-(snap.usage / total) / shares), dtype=np.float64)


def fairshare_of(snap: Snapshot, users: I64) -> F64:
    """`fairshare(snap)[users]`, computed only for the users asked about."""
    total = float(snap.usage.sum())
    if total <= 0:
        return np.ones(len(users))
    return np.asarray(np.exp2(-(snap.usage[users] / total) / np.maximum(snap.shares[users], 1e-12)))


def slip_end(start: F64, first: F64, p90: F64, limit: F64, now: float) -> F64:
    """Expected end of running jobs: the estimate, then p90 once passed, then half the elapsed time more.

    A job past its estimate re-plans the reservation at every pass with this updated end (slip handling).
    A time limit caps the estimate (the job would be killed there) while it is still ahead.
    """
    e1 = start + first
    e2 = start + np.fmax(p90, first)
    e3 = now + np.maximum(60.0, 0.5 * (now - start))
    est = np.where(e1 > now, e1, np.where(e2 > now, e2, e3))
    cap = start + limit
    capped = np.isfinite(cap) & (cap > now)
    return np.where(capped, np.minimum(est, cap), est)


def lognormal_mean(median: F64, p90: F64) -> F64:
    """Mean of the log-normal with this median and 90th percentile (p90 below the median counts as
    equal to it: no spread). exp(sigma^2 / 2) grows fast, so sigma is capped at 3 (a factor 90)."""
    sigma = np.minimum(np.log(np.fmax(p90, median) / median) / Z90, 3.0)
    out: F64 = median * np.exp(0.5 * sigma * sigma)
    return np.where(np.isnan(sigma), median, out)


def expected_runtime(p_success: F64, runtime: F64, ttf: F64, limit: F64) -> F64:
    """p R + (1 - p) F, each capped by the time limit where there is one."""
    r = np.where(np.isfinite(limit), np.fmin(runtime, limit), runtime)
    f = np.where(np.isfinite(limit), np.fmin(ttf, limit), ttf)
    return np.asarray(p_success * r + (1.0 - p_success) * f, dtype=np.float64)


@lru_cache(maxsize=64)
def _class_values(classes: tuple[str, ...], table: tuple[tuple[str, float], ...], default: float) -> F64:
    d = dict(table)
    out = np.array([d.get(c, default) for c in classes] or [default], dtype=np.float64)
    out.setflags(write=False)
    return out


def class_table(classes: Sequence[str], klass: I64, table: dict[str, float], default: float) -> F64 | float:
    """Per job of these classes, the class's value (a scalar when the trace has a single class)."""
    if len(classes) == 1:
        return table.get(classes[0], default)
    return _class_values(tuple(classes), tuple(table.items()), default)[klass]
