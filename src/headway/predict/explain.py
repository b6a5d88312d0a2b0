"""Plain words for features and for what drove a prediction (from LightGBM's SHAP contributions), and
one job's feature row (stored, or pending as of a time) for `headway predict show`."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from headway.predict.model import FEATURES, TREE_FEATURES

if TYPE_CHECKING:
    from headway.predict.api import Predictions
    from headway.predict.features import FeatureFrame
    from headway.predict.model import Predictor

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


# What a contribution's sign means, per prediction: (up, down).
DIRECTIONS: dict[str, tuple[str, str]] = {
    "p_success": ("raises the chance", "lowers the chance"),
    "runtime_q50": ("makes it longer", "makes it shorter"),
    "runtime_q90": ("makes the p90 longer", "makes the p90 shorter"),
    "ttf_q50": ("later failure", "earlier failure"),
}


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """One job's feature row as the model reads it: numbers `X` (1 x FEATURES), categories `cats`
    (each an array of one), its time limit `tl` (seconds, nan for none) and what to say about the job."""

    X: npt.NDArray[np.float64]
    cats: dict[str, npt.NDArray[Any]]
    tl: npt.NDArray[np.float64]
    job: dict[str, Any]


def iso_utc(t: float) -> str:
    """Epoch seconds as an ISO time in UTC, to the second."""
    return dt.datetime.fromtimestamp(float(t), tz=dt.UTC).isoformat(timespec="seconds")


def stored_job_features(frame: FeatureFrame, i: int) -> JobFeatures:
    """Row `i` of the store's feature frame: the features the job had at its own submit time."""
    runtime = frame.runtime[i]
    job = {
        "job_id": str(frame.job_id[i]),
        "user": frame.user[i],
        "name": frame.name[i],
        "group": frame.cats["group"][i],
        "gpus": float(frame.gpus[i]),
        "submit_time": iso_utc(frame.submit[i]),
        "state": frame.state[i],
        "runtime": None if math.isnan(runtime) else float(runtime),
    }
    cats = {k: v[i : i + 1] for k, v in frame.cats.items()}
    return JobFeatures(frame.X[i : i + 1], cats, frame.time_limit[i : i + 1], job)


def pending_job_features(
    frame: FeatureFrame,
    now: float,
    *,
    user: str | None,
    name: str | None,
    group: str | None,
    gpus: float,
    nodes: int,
    time_limit_s: float,
    partition: str | None,
    priority_class: str | None,
) -> JobFeatures:
    """A job not yet submitted, as if submitted at `now`: its history features from every stored job
    that ended before `now` (causal, as in training), its request features from what it asks for."""
    from headway.predict.features import replay_state, request_features

    state = replay_state(frame, now)
    hist = np.array([state.peek_row(user, group, name, gpus, now)], dtype=np.float64)
    tl = np.array([time_limit_s])
    X = np.hstack([hist, request_features(np.array([gpus]), np.array([float(nodes)]), tl, np.array([now]))])
    cats = {
        "partition": np.array([partition], dtype=object),
        "priority_class": np.array([priority_class], dtype=object),
        "group": np.array([group], dtype=object),
    }
    job = {
        "job_id": None,
        "user": user,
        "name": name,
        "group": group,
        "gpus": gpus,
        "submit_time": iso_utc(now),
    }
    return JobFeatures(X, cats, tl, job)


def explain_prediction(
    model: Predictor | None, f: JobFeatures
) -> tuple[Predictions, dict[str, list[dict[str, Any]]]]:
    """The predictions for one job and, with a model, what drove each (its top features in words);
    without one, the cold-start estimates and no reasons."""
    from headway.predict.model import fallback_predictions

    if model is None:
        return fallback_predictions(f.X, f.tl), {}
    Xd = model.design(f.X, f.cats)
    pred = model.predict_design(Xd, f.tl)
    contrib = model.contributions(Xd)
    reasons: dict[str, list[dict[str, Any]]] = {}
    for key, (up, down) in DIRECTIONS.items():
        if key in contrib:
            reasons[key] = [
                {"feature": r.feature, "words": r.words, "effect": r.effect, "direction": r.direction}
                for r in top_reasons(contrib[key][0], Xd[0], model.vocab, up, down)
            ]
    return pred, reasons


def feature_values(f: JobFeatures) -> dict[str, Any]:
    """Every feature by name (numbers, then categories), None for a missing one, as --json prints them."""
    values = f.X[0].tolist() + [c[0] for c in f.cats.values()]
    return {
        n: (None if isinstance(v, float) and math.isnan(v) else v)
        for n, v in zip(FEATURES, values, strict=True)
    }
