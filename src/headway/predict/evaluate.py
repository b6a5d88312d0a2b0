"""Honest evaluation: a temporal split, the model against the simple baselines it must beat.

The last `test_fraction` of ended jobs (by submit time) are the test set. The model is trained only on
jobs that *ended* before the first test job was submitted, so no training label comes from the test
period; features are causal throughout (see features.py). Baselines: the user's smoothed success rate
(for completion) and the user's running median runtime (for runtime), both read from the same causal
feature row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.predict.api import Predictions
from headway.predict.features import FeatureFrame
from headway.predict.model import P_CLIP, Predictor, TrainConfig

ECE_BINS = 10


def auc(y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64]) -> float:
    """Area under the ROC curve (ties counted half); NaN when only one class is present."""
    from sklearn.metrics import roc_auc_score

    if y.all() or not y.any():
        return math.nan
    return float(roc_auc_score(y, p))


def brier(y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64]) -> float:
    return float(np.mean((p - y) ** 2)) if len(y) else math.nan


def log_loss(y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64]) -> float:
    pc = np.clip(p, *P_CLIP)
    return float(-np.mean(np.where(y, np.log(pc), np.log(1 - pc)))) if len(y) else math.nan


def reliability(
    y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64], bins: int = ECE_BINS
) -> list[dict[str, Any]]:
    """Equal-width probability bins: how many jobs, mean prediction, observed completion rate."""
    b = np.minimum((p * bins).astype(int), bins - 1)
    rows = []
    for k in range(bins):
        m = b == k
        n = int(m.sum())
        rows.append(
            {
                "bin": f"{k / bins:.1f}-{(k + 1) / bins:.1f}",
                "jobs": n,
                "predicted": float(p[m].mean()) if n else None,
                "observed": float(y[m].mean()) if n else None,
            }
        )
    return rows


def ece(y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64], bins: int = ECE_BINS) -> float:
    """Expected calibration error: job-weighted mean |predicted - observed| over equal-width bins."""
    if len(y) == 0:
        return math.nan
    total = 0.0
    for row in reliability(y, p, bins):
        if row["jobs"]:
            total += row["jobs"] * abs(row["predicted"] - row["observed"])
    return total / len(y)


def classification(y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64]) -> dict[str, Any]:
    return {
        "auc": auc(y, p),
        "brier": brier(y, p),
        "log_loss": log_loss(y, p),
        "ece": ece(y, p),
        "reliability": reliability(y, p),
    }


def runtime_profile(pred: npt.NDArray[np.float64], actual: npt.NDArray[np.float64]) -> dict[str, Any]:
    """Median absolute log error and the share of jobs within +-10% / +-50% / +-100% / 10x."""
    actual = np.maximum(actual, 1.0)
    pred = np.maximum(pred, 1.0)
    rel = np.abs(pred - actual) / actual
    ratio = pred / actual
    n = len(actual)

    def share(m: npt.NDArray[np.bool_]) -> float:
        return float(m.mean()) if n else math.nan

    return {
        "jobs": n,
        "median_abs_log_error": float(np.median(np.abs(np.log(ratio)))) if n else math.nan,
        "within_10pct": share(rel <= 0.1),
        "within_50pct": share(rel <= 0.5),
        "within_100pct": share(rel <= 1.0),
        "within_10x": share((ratio >= 0.1) & (ratio <= 10.0)),
    }


def _baseline_seconds(
    frame: FeatureFrame, user_col: str, global_col: str, cap: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The user's running median (log seconds) if any, else the cluster's, else one hour; capped."""
    u = frame.col(user_col)
    g = frame.col(global_col)
    log_s = np.where(np.isnan(u), g, u)
    s = np.where(np.isnan(log_s), 3600.0, np.exp(np.nan_to_num(log_s)))
    return np.minimum(s, np.where(np.isnan(cap), np.inf, cap))


def split(frame: FeatureFrame, test_fraction: float) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """(train rows, test rows): test = the last share of ended jobs by submit time; train = jobs that
    ended before the first test job was submitted."""
    lab = np.flatnonzero(frame.ended)  # frame rows are in submit order
    n_test = round(len(lab) * test_fraction)
    if n_test == 0 or n_test >= len(lab):
        raise ValueError(f"cannot split {len(lab)} ended jobs with test fraction {test_fraction}")
    test = lab[len(lab) - n_test :]
    t_split = frame.submit[test[0]]
    head = lab[: len(lab) - n_test]
    train = head[frame.end[head] < t_split]
    return train, test


def daily_predictions(
    frame: FeatureFrame, test: npt.NDArray[np.intp], config: TrainConfig
) -> tuple[Predictions, list[dict[str, Any]]]:
    """Predictions for the test jobs as the live predictor makes them: retrained at the start of each
    (UTC) day on every job that had ended by then, test-period jobs included once their outcome is known.
    A test period longer than MAX_RETRAINS days retrains every few days (still only on past outcomes).

    Only outcomes known before the day began are used, so it stays causal; it is what `OnlinePredictor`
    does when it retrains after a day of new ends.
    """
    lab = np.flatnonzero(frame.ended)
    day = np.floor(frame.submit[test] / 86400.0)
    # A long test period retrains every few days instead, so evaluation stays at most MAX_RETRAINS fits.
    step = max(1.0, math.ceil((day.max() - day.min() + 1) / MAX_RETRAINS)) if len(day) else 1.0
    day = day.min(initial=0.0) + np.floor((day - day.min(initial=0.0)) / step) * step
    parts = [np.zeros(len(test)) for _ in range(4)]
    metas = []
    for d in np.unique(day):
        rows = lab[frame.end[lab] < d * 86400.0]
        model = Predictor.fit(frame, rows, config)
        sel = np.flatnonzero(day == d)
        p = model.predict_frame(frame.take(test[sel]))
        for arr, v in zip(parts, (p.p_success, p.runtime, p.runtime_p90, p.time_to_failure), strict=True):
            arr[sel] = v
        metas.append(model.meta)
    return Predictions(*parts), metas


RETRAIN_MODES = ("daily", "none")
MAX_RETRAINS = 60


def evaluate(
    frame: FeatureFrame,
    test_fraction: float = 0.3,
    config: TrainConfig | None = None,
    retrain: str = "daily",
) -> dict[str, Any]:
    """Train on the past, score the future; the report the CLI prints (JSON-ready).

    retrain="daily" (the default) scores what the live predictor serves: a model retrained at the start
    of each test day on every job that had ended by then. retrain="none" scores one model frozen at the
    split. Both are computed; the other one's completion metrics are under `other_mode`.
    """
    if retrain not in RETRAIN_MODES:
        raise ValueError(f"retrain must be daily or none, got {retrain!r}")
    cfg = config or TrainConfig()
    train, test = split(frame, test_fraction)
    model = Predictor.fit(frame, train, cfg)
    tf = frame.take(test)
    frozen = model.predict_frame(tf)
    daily, daily_meta = daily_predictions(frame, test, cfg)
    pred = daily if retrain == "daily" else frozen
    y = tf.success
    base_p = np.clip(tf.col("user_success_rate"), *P_CLIP)
    m = classification(y, pred.p_success)
    other_name = "none" if retrain == "daily" else "daily"
    other_pred = frozen if retrain == "daily" else daily
    other = classification(y, other_pred.p_success)
    other.pop("reliability")
    ok0 = y & ~np.isnan(tf.start)
    other["runtime_within_50pct"] = runtime_profile(other_pred.runtime[ok0], tf.runtime[ok0])["within_50pct"]
    other["retrain"] = other_name
    b = classification(y, base_p)
    ok = y & ~np.isnan(tf.start)
    failed = ~y & ~np.isnan(tf.start)
    rt = tf.runtime
    base_rt = _baseline_seconds(tf, "user_log_runtime_median", "global_log_runtime_median", tf.time_limit)
    base_ttf = _baseline_seconds(tf, "user_log_ttf_median", "global_log_ttf_median", tf.time_limit)
    p90_cover = float(np.mean(rt[ok] <= pred.runtime_p90[ok])) if ok.any() else math.nan
    report: dict[str, Any] = {
        **m,
        "runtime": runtime_profile(pred.runtime[ok], rt[ok]) | {"p90_coverage": p90_cover},
        "time_to_failure": runtime_profile(pred.time_to_failure[failed], rt[failed]),
        "baseline": {
            "name": "smoothed per-user success rate; user's median runtime",
            **b,
            "runtime": runtime_profile(base_rt[ok], rt[ok]),
            "time_to_failure": runtime_profile(base_ttf[failed], rt[failed]),
        },
        "split": {
            "test_fraction": test_fraction,
            "jobs": len(frame),
            "ended_jobs": int(frame.ended.sum()),
            "train_jobs": len(train),
            "test_jobs": len(test),
            "test_success_rate": float(y.mean()),
            "train_ended_before": _iso(frame.submit[test[0]]),
            "test_from": _iso(frame.submit[test[0]]),
            "test_to": _iso(frame.submit[test[-1]]),
            "test_days": len(daily_meta),
        },
        "model": model.meta,
        "retrain": retrain,
        "other_mode": other,
    }
    report["claims"] = {
        "auc_gain": report["auc"] - b["auc"],
        "auc_gain_at_least_0.03": bool(report["auc"] - b["auc"] >= 0.03),
        "brier_below_baseline": bool(report["brier"] < b["brier"]),
        "ece_at_most_0.03": bool(report["ece"] <= 0.03),
        "runtime_within_50pct_above_baseline": bool(
            report["runtime"]["within_50pct"] > report["baseline"]["runtime"]["within_50pct"]
        ),
    }
    return report


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(float(t), tz=dt.UTC).isoformat(timespec="seconds")
