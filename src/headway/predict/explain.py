"""Plain words for features and for what drove a prediction (from LightGBM's SHAP contributions)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headway.predict.model import FEATURES, TREE_FEATURES

_RATE = "rate"
_LOGS = "log_seconds"
_HOURS = "hours"
_COUNT = "count"
_RAW = "raw"
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

WORDS: dict[str, tuple[str, str]] = {
    "user_jobs_ended": ("jobs of this user that ended before", _COUNT),
    "user_success_rate": ("this user's smoothed success rate", _RATE),
    "user_last1": ("whether the user's last job completed", _RATE),
    "user_last3": ("completions among the user's last 3 jobs", _RATE),
    "user_last10": ("completions among the user's last 10 jobs", _RATE),
    "user_fail_streak": ("failures in a row for this user", _COUNT),
    "user_hours_since_failure": ("time since the user's last failure", _HOURS),
    "user_hours_since_success": ("time since the user's last success", _HOURS),
    "user_submits_last_hour": ("the user's submissions in the last hour", _COUNT),
    "user_log_runtime_median": ("the user's median runtime", _LOGS),
    "user_log_runtime_p90": ("the user's p90 runtime", _LOGS),
    "user_log_ttf_median": ("the user's median time to failure", _LOGS),
    "user_log_runtime_last": ("the user's last successful runtime", _LOGS),
    "user_log_runtime_recent5": ("the median of the user's last 5 successful runtimes", _LOGS),
    "shape_log_runtime_recent5": ("the median of the user's last 5 runtimes at this GPU count", _LOGS),
    "user_log_runtime_dense": ("the most common runtime among the user's recent successes", _LOGS),
    "shape_log_runtime_dense": ("the most common recent runtime of the user at this GPU count", _LOGS),
    "name_jobs_ended": ("earlier runs of this job name", _COUNT),
    "name_success_rate": ("this job name's smoothed success rate", _RATE),
    "name_fail_streak": ("failures in a row of this job name", _COUNT),
    "name_log_runtime_median": ("this job name's median runtime", _LOGS),
    "name_log_runtime_p90": ("this job name's p90 runtime", _LOGS),
    "name_log_ttf_median": ("this job name's median time to failure", _LOGS),
    "group_jobs_ended": ("jobs of this group that ended before", _COUNT),
    "group_success_rate": ("this group's smoothed success rate", _RATE),
    "group_log_runtime_median": ("this group's median runtime", _LOGS),
    "shape_jobs_ended": ("earlier jobs of this user with this GPU count", _COUNT),
    "shape_success_rate": ("success rate of this user's jobs with this GPU count", _RATE),
    "shape_log_runtime_median": ("median runtime of this user's jobs with this GPU count", _LOGS),
    "shape_log_ttf_median": ("median time to failure of this user's jobs with this GPU count", _LOGS),
    "global_success_rate": ("the cluster's success rate so far", _RATE),
    "global_last100": ("completions among the cluster's last 100 jobs", _RATE),
    "global_last500": ("completions among the cluster's last 500 jobs", _RATE),
    "global_log_runtime_median": ("the cluster's recent median runtime", _LOGS),
    "global_log_ttf_median": ("the cluster's recent median time to failure", _LOGS),
    "gpus": ("GPUs requested", _RAW),
    "nodes": ("nodes requested", _RAW),
    "log_time_limit": ("the requested time limit", _LOGS),
    "hour": ("hour of submission (UTC)", _RAW),
    "weekday": ("day of submission", "weekday"),
    "partition": ("partition", "cat"),
    "priority_class": ("priority class", "cat"),
    "group": ("group", "cat"),
}


_REQUESTED = frozenset({"log_time_limit"})  # features of the job's request, not of the history before it


def duration(seconds: float) -> str:
    """A short human duration: 45s, 12m, 3.5h, 2.1d."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def describe_value(name: str, value: float, vocab: dict[str, list[str]]) -> str:
    kind = WORDS.get(name, (name, _RAW))[1]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        if name in _REQUESTED:  # asked for, not learnt from history: "none yet" read as if it would come
            return "none given"
        return "none yet" if kind in (_RATE, _LOGS, _HOURS) else "unknown"
    if kind == _RATE:
        return f"{100 * value:.0f}%"
    if kind == _LOGS:
        return duration(math.exp(value))
    if kind == _HOURS:
        return duration(value * 3600)
    if kind == _COUNT:
        return f"{value:.0f}"
    if kind == "weekday":
        return _WEEKDAYS[int(value) % 7]
    if kind == "cat":
        levels = vocab.get(name, [])
        k = int(value)
        return levels[k] if 0 <= k < len(levels) else "unseen"
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class Reason:
    feature: str
    words: str  # e.g. "this user's smoothed success rate is 35%"
    effect: float  # contribution: log-odds (completion) or log seconds (runtimes)
    direction: str  # e.g. "lowers the chance", "makes it longer"


def top_reasons(
    contrib: npt.NDArray[np.float64],
    row: npt.NDArray[np.float64],
    vocab: dict[str, list[str]],
    up: str,
    down: str,
    k: int = 4,
) -> list[Reason]:
    """The k features with the largest |contribution| to one prediction, in words (`row`: the design row,
    every feature; `contrib`: the trees' features, TREE_FEATURES)."""
    c = contrib[: len(TREE_FEATURES)]
    order = np.argsort(-np.abs(c), kind="stable")[:k]
    out = []
    for i in order.tolist():
        if c[i] == 0:
            continue
        name = TREE_FEATURES[i]
        label = WORDS.get(name, (name, _RAW))[0]
        out.append(
            Reason(
                feature=name,
                words=f"{label}: {describe_value(name, float(row[FEATURES.index(name)]), vocab)}",
                effect=float(c[i]),
                direction=up if c[i] > 0 else down,
            )
        )
    return out
