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
from headway.predict.model import P_CLIP, Calibration, Predictor, TrainConfig
from headway.predict.schedule import SCHEDULE, RetrainSchedule, Served

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


def bin_of(p: npt.NDArray[np.float64], bins: int = ECE_BINS) -> npt.NDArray[np.intp]:
    """Each prediction's equal-width bin (1.0 in the last)."""
    return np.minimum((p * bins).astype(np.intp), bins - 1)


def reliability(
    y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64], bins: int = ECE_BINS
) -> list[dict[str, Any]]:
    """Equal-width probability bins: how many jobs, mean prediction, observed completion rate."""
    b = bin_of(p, bins)
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
    if len(train) == 0:
        raise ValueError(
            f"no job ended before the test period began ({_iso(t_split)}): nothing to train on; "
            "pass a smaller --test-fraction or ingest a longer history"
        )
    return train, test


def daily_predictions(
    frame: FeatureFrame, test: npt.NDArray[np.intp], config: TrainConfig
) -> tuple[Predictions, list[dict[str, Any]]]:
    """Predictions for the test jobs of a model retrained at the start of each (UTC) day on every job that
    had ended by then, test-period jobs included once their outcome is known: the most retraining can
    give, the yardstick of the online predictor's schedule (`scheduled_predictions`). A test period
    longer than MAX_RETRAINS days retrains every few days (still only on past outcomes).

    Only outcomes known before the day began are used, so it stays causal. With `config.recalibrate` =
    N, each day's probabilities are then recalibrated (Platt) on the last N jobs that ended before the
    day began, using the probabilities they were served (so jobs of the RECAL_WARMUP_DAYS before the
    test are served too, only for that).
    """
    lab = np.flatnonzero(frame.ended)
    first = frame.submit[test[0]] if len(test) else 0.0
    warm = np.zeros(0, dtype=np.intp)
    if config.recalibrate and len(test):
        w = lab[(frame.submit[lab] >= first - RECAL_WARMUP_DAYS * 86400.0) & (frame.submit[lab] < first)]
        warm = w[~np.isin(w, test)]
    served = np.concatenate([warm, test])
    day = np.floor(frame.submit[served] / 86400.0)
    # A long test period retrains every few days instead, so evaluation stays at most MAX_RETRAINS fits.
    step = max(1.0, math.ceil((day.max() - day.min() + 1) / MAX_RETRAINS)) if len(day) else 1.0
    day = day.min(initial=0.0) + np.floor((day - day.min(initial=0.0)) / step) * step
    parts = [np.zeros(len(served)) for _ in range(4)]
    raw = np.full(len(served), np.nan)  # what each job was served, before the online recalibration
    metas = []
    for d in np.unique(day):
        rows = lab[frame.end[lab] < d * 86400.0]
        model = Predictor.fit(frame, rows, config)
        sel = np.flatnonzero(day == d)
        p = model.predict_frame(frame.take(served[sel]))
        p_s = p.p_success
        if config.recalibrate:
            raw[sel] = p_s
            known = np.flatnonzero(~np.isnan(raw) & (frame.end[served] < d * 86400.0))
            known = known[np.argsort(frame.end[served[known]], kind="stable")][-config.recalibrate :]
            if len(known) >= RECAL_MIN:
                cal = Calibration.fit("platt", raw[known], frame.success[served[known]])
                p_s = cal.apply(p_s)
        for arr, v in zip(parts, (p_s, p.runtime, p.runtime_p90, p.time_to_failure), strict=True):
            arr[sel] = v
        if sel[-1] >= len(warm):  # a day with test jobs (the warm-up days only feed the recalibration)
            metas.append(model.meta)
    k = len(warm)
    return Predictions(*(a[k:] for a in parts)), metas


def scheduled_predictions(
    frame: FeatureFrame, test: npt.NDArray[np.intp], config: TrainConfig, schedule: RetrainSchedule = SCHEDULE
) -> tuple[Predictions, list[dict[str, Any]]]:
    """Predictions for the test jobs as the online predictor makes them on its retraining schedule
    (predict/schedule.py): a fit when the first test job is submitted, then one whenever the schedule
    is due at a test job's submission, each on the schedule's window of the jobs that ended before it.
    The drift it watches is that of the test jobs served by the current fit and ended since."""
    lab = np.flatnonzero(frame.ended)
    lab = lab[np.argsort(frame.end[lab], kind="stable")]
    ends = frame.end[lab]
    submit = frame.submit[test]
    ended = np.searchsorted(ends, submit, side="left")  # jobs ended strictly before each submission
    by_end = np.argsort(frame.end[test], kind="stable")  # test positions in end order
    test_end, success = frame.end[test].tolist(), frame.success[test].tolist()
    parts = [np.zeros(len(test)) for _ in range(4)]
    current: list[npt.NDArray[np.float64]] = []  # the current fit's predictions for test[first:]
    fit_of = np.full(len(test), -1)  # which fit served each test job
    metas: list[dict[str, Any]] = []
    served, last_fit, at_fit, trained, first, e = Served(), None, 0, 0, 0, 0
    for i, (t, n) in enumerate(zip(submit.tolist(), ended.tolist(), strict=True)):
        while e < len(by_end) and test_end[by_end[e]] < t:  # outcomes learnt before this submission
            k = int(by_end[e])
            if fit_of[k] == len(metas) - 1:
                served.add(float(parts[0][k]), bool(success[k]))
            e += 1
        if last_fit is None or schedule.due(t, n, n - at_fit, trained, last_fit, served.z()):
            trained = min(n, schedule.window)
            model = Predictor.fit(frame, lab[n - trained : n], config)
            p = model.predict_frame(frame.take(test[i:]))
            current, first = [p.p_success, p.runtime, p.runtime_p90, p.time_to_failure], i
            metas.append({**model.meta, "served_from": t})
            served, last_fit, at_fit = Served(), t, n
        for arr, v in zip(parts, current, strict=True):
            arr[i] = v[i - first]
        fit_of[i] = len(metas) - 1
    return Predictions(*parts), metas


RECAL_WARMUP_DAYS = 7
RECAL_MIN = 100


RETRAIN_MODES = ("daily", "schedule", "none")
MAX_RETRAINS = 60
# Validation folds: blocks of the training period's ended jobs (by submit time), each scored like the test.
FOLDS: tuple[tuple[float, float], ...] = ((0.55, 0.70), (0.70, 0.85), (0.85, 1.0))
BOOTSTRAP = 300


def compare(tf: FeatureFrame, pred: Predictions) -> dict[str, Any]:
    """Model against the baselines on exactly the same rows: every test job for completion, completed
    (started) ones for runtime, not-completed started ones for time to failure."""
    y = tf.success
    base_p = np.clip(tf.col("user_success_rate"), *P_CLIP)
    ok = y & ~np.isnan(tf.start)
    failed = ~y & ~np.isnan(tf.start)
    rt = tf.runtime
    base_rt = _baseline_seconds(tf, "user_log_runtime_median", "global_log_runtime_median", tf.time_limit)
    base_ttf = _baseline_seconds(tf, "user_log_ttf_median", "global_log_ttf_median", tf.time_limit)
    p90_cover = float(np.mean(rt[ok] <= pred.runtime_p90[ok])) if ok.any() else math.nan
    return {
        **classification(y, pred.p_success),
        "runtime": runtime_profile(pred.runtime[ok], rt[ok]) | {"p90_coverage": p90_cover},
        "time_to_failure": runtime_profile(pred.time_to_failure[failed], rt[failed]),
        "baseline": {
            "name": "smoothed per-user success rate; user's median runtime",
            **classification(y, base_p),
            "runtime": runtime_profile(base_rt[ok], rt[ok]),
            "time_to_failure": runtime_profile(base_ttf[failed], rt[failed]),
        },
    }


def user_days(tf: FeatureFrame) -> npt.NDArray[np.int64]:
    """A block id per job: its user and the UTC day it was submitted (a job without a user is its own
    block). A user's jobs of one day tend to succeed or fail together (a sweep, a broken environment),
    so these, not single jobs, are the independent units of a test set."""
    day = np.floor(tf.submit / 86400.0).astype(np.int64)
    users = {u: i for i, u in enumerate(dict.fromkeys(u for u in tf.user if u is not None))}
    who = np.array([users[u] if u is not None else len(users) + i for i, u in enumerate(tf.user)])
    pairs = np.stack([who.astype(np.int64), day], axis=1).reshape(-1, 2)
    _, block = np.unique(pairs, axis=0, return_inverse=True)
    return block.reshape(-1).astype(np.int64)


def noise(tf: FeatureFrame, pred: Predictions, rounds: int = BOOTSTRAP, seed: int = 0) -> dict[str, Any]:
    """How much the headline figures move by chance on a test set of this size.

    A bootstrap of the test jobs gives 90% intervals of the model's margins over the baseline;
    `ece_floor` is the ECE a perfectly calibrated model would still show here (labels drawn from its own
    probabilities), the sampling floor under which ECE cannot be read. `by_user_day` resamples whole
    user-days instead (`user_days`): outcomes within one are correlated, so job-level intervals are too
    narrow; it also says how correlated (`correlation`) and the ECE floor of a calibrated model with that
    correlation."""
    rng = np.random.default_rng(seed)
    y = tf.success
    p = pred.p_success
    bp = np.clip(tf.col("user_success_rate"), *P_CLIP)
    has_rt = y & ~np.isnan(tf.start)
    ok = np.flatnonzero(has_rt)
    rt = np.maximum(tf.runtime, 1.0)
    base_rt = _baseline_seconds(tf, "user_log_runtime_median", "global_log_runtime_median", tf.time_limit)
    hit_m = np.abs(np.maximum(pred.runtime, 1.0) - rt) / rt <= 0.5
    hit_b = np.abs(np.maximum(base_rt, 1.0) - rt) / rt <= 0.5
    n = len(y)
    names = ("auc_gain", "brier_gain", "ece", "runtime_gain")
    acc: dict[str, list[float]] = {k: [] for k in names}
    by_block: dict[str, list[float]] = {k: [] for k in names}
    block = user_days(tf)
    order = np.argsort(block, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(block[order])) + 1) if n else []
    floor = []
    rng_b = np.random.default_rng(seed + 1)  # its own stream: the job-level draws stay as they were

    def margins(i: npt.NDArray[np.intp], out: dict[str, list[float]]) -> None:
        out["auc_gain"].append(auc(y[i], p[i]) - auc(y[i], bp[i]))
        out["brier_gain"].append(brier(y[i], bp[i]) - brier(y[i], p[i]))
        out["ece"].append(ece(y[i], p[i]))

    for _ in range(rounds):
        i = rng.integers(0, n, n)
        margins(i, acc)
        if len(ok):
            j = ok[rng.integers(0, len(ok), len(ok))]
            acc["runtime_gain"].append(float(hit_m[j].mean() - hit_b[j].mean()))
        floor.append(ece(rng.random(n) < p, p))
        if members:
            bi = np.concatenate([members[b] for b in rng_b.integers(0, len(members), len(members))])
            margins(bi, by_block)
            bj = bi[has_rt[bi]]
            if len(bj):
                by_block["runtime_gain"].append(float(hit_m[bj].mean() - hit_b[bj].mean()))
    out: dict[str, Any] = {"rounds": rounds}
    out.update(_intervals(acc))
    out["ece_floor"] = {"mean": float(np.mean(floor)), "p95": float(np.quantile(floor, 0.95))}
    out["by_user_day"] = {"blocks": len(members), **_intervals(by_block)}
    corr, weight = block_dependence(y, p, block)
    known = math.isfinite(corr) and math.isfinite(weight)
    out["by_user_day"]["correlation"] = corr if known else None
    out["by_user_day"]["ece_floor"] = (
        correlated_ece_floor(p, block, weight, rounds, seed + 2) if known else None
    )
    return out


def block_dependence(
    y: npt.NDArray[np.bool_], p: npt.NDArray[np.float64], block: npt.NDArray[np.int64]
) -> tuple[float, float]:
    """How much the outcomes of one block (user-day) move together beyond what their predictions say:
    (the mean pairwise correlation of their residuals, the `correlated_labels` weight that reproduces
    it). Both are moment estimates from the within-block sums of residuals, E[(sum r)^2] = sum v + the
    sum over pairs i != j of cov(y_i, y_j); NaN when no block holds two jobs (a log without users).

    The residuals are taken against the test set's own reliability curve (each bin's observed rate),
    not against p: a miscalibrated model's shared error would otherwise read as correlation and raise
    the floor below that excuses it. That makes the estimates low, if anything (a burst that sets its
    bin's observed rate is partly taken away with it)."""
    if len(y) == 0:
        return math.nan, math.nan
    rows = reliability(y, p)
    seen = np.array([r["observed"] if r["jobs"] else 0.0 for r in rows])
    q = np.clip(seen[bin_of(p)], *P_CLIP)
    v = q * (1.0 - q)
    s_v = np.bincount(block, v)
    excess = float(np.sum(np.bincount(block, y - q) ** 2 - s_v))  # the within-block covariances, summed
    pairs = float(np.sum(np.bincount(block, np.sqrt(v)) ** 2 - s_v))
    if pairs <= 1e-12:
        return math.nan, math.nan
    # correlated_labels gives a pair cov = w * (min(p_i, p_j) - p_i p_j); sum that shape over the pairs
    order = np.lexsort((p, block))
    ps, bs = p[order], block[order]
    size = np.bincount(block)
    first = np.concatenate([[0], np.cumsum(size)[:-1]])
    rank = np.arange(len(ps)) - first[bs]  # position within the block, smallest p first
    mins = 2.0 * float(np.sum(ps * (size[bs] - 1 - rank)))  # sum over i != j of min(p_i, p_j)
    prods = float(np.sum(np.bincount(block, p) ** 2 - np.bincount(block, p * p)))
    shape = mins - prods
    weight = float(np.clip(excess / shape, 0.0, 1.0)) if shape > 1e-12 else math.nan
    return float(np.clip(excess / pairs, 0.0, 1.0)), weight


def correlated_labels(
    p: npt.NDArray[np.float64], block: npt.NDArray[np.int64], weight: float, rng: np.random.Generator
) -> npt.NDArray[np.bool_]:
    """Outcomes drawn from a perfectly calibrated model whose blocks move together: u < p, where each job
    takes its block's shared uniform with probability sqrt(weight) and its own otherwise. Every job still
    succeeds with probability exactly p; two jobs of one block covary by weight * (min(p_i, p_j) - p_i p_j),
    so two with the same p correlate by weight."""
    n = len(p)
    shared = rng.random(int(block.max()) + 1 if n else 0)[block]
    u = np.where(rng.random(n) < math.sqrt(weight), shared, rng.random(n))
    return u < p


def correlated_ece_floor(
    p: npt.NDArray[np.float64],
    block: npt.NDArray[np.int64],
    weight: float,
    rounds: int = BOOTSTRAP,
    seed: int = 0,
) -> dict[str, float]:
    """The ECE a perfectly calibrated model (P(success) = p exactly) would show on this test set when its
    jobs' outcomes are as correlated within blocks as measured (`block_dependence`'s weight); `ece_floor`
    is the case weight = 0."""
    rng = np.random.default_rng(seed)
    a = np.asarray([ece(correlated_labels(p, block, weight, rng), p) for _ in range(rounds)])
    return {"mean": float(a.mean()), "p05": float(np.quantile(a, 0.05)), "p95": float(np.quantile(a, 0.95))}


def _intervals(acc: dict[str, list[float]]) -> dict[str, dict[str, float] | None]:
    """90% interval (5th and 95th percentile) of each list, NaNs left out."""
    out: dict[str, dict[str, float] | None] = {}
    for k, v in acc.items():
        a = np.asarray([x for x in v if not math.isnan(x)])
        out[k] = {"p05": float(np.quantile(a, 0.05)), "p95": float(np.quantile(a, 0.95))} if len(a) else None
    return out


def ece_floor(p: npt.NDArray[np.float64], rounds: int = 100, seed: int = 0) -> float:
    """Mean ECE of a perfectly calibrated model with these probabilities (labels drawn from them)."""
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(rng.random(len(p)) < p, p) for _ in range(rounds)])) if len(p) else math.nan


def evaluate(
    frame: FeatureFrame,
    test_fraction: float = 0.3,
    config: TrainConfig | None = None,
    retrain: str = "daily",
    bootstrap: int = BOOTSTRAP,
) -> dict[str, Any]:
    """Train on the past, score the future; the report the CLI prints (JSON-ready).

    retrain="daily" (the default) scores what the live predictor serves: a model retrained at the start
    of each test day on every job that had ended by then. retrain="none" scores one model frozen at the
    split. Both are computed; the other one's completion metrics are under `other_mode`.
    """
    if retrain not in RETRAIN_MODES:
        raise ValueError(f"retrain must be one of {', '.join(RETRAIN_MODES)}, got {retrain!r}")
    cfg = config or TrainConfig()
    train, test = split(frame, test_fraction)
    model = Predictor.fit(frame, train, cfg)
    tf = frame.take(test)
    frozen = model.predict_frame(tf)
    if retrain == "schedule":
        retrained, fit_meta = scheduled_predictions(frame, test, cfg)
    else:
        retrained, fit_meta = daily_predictions(frame, test, cfg)
    pred = frozen if retrain == "none" else retrained
    y = tf.success
    other_name = "daily" if retrain == "none" else "none"
    other_pred = retrained if retrain == "none" else frozen
    other = classification(y, other_pred.p_success)
    other.pop("reliability")
    ok0 = y & ~np.isnan(tf.start)
    other["runtime_within_50pct"] = runtime_profile(other_pred.runtime[ok0], tf.runtime[ok0])["within_50pct"]
    other["retrain"] = other_name
    report: dict[str, Any] = {
        **compare(tf, pred),
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
            # calendar days from the first test submission to the last (counted in whole days)
            "test_days": int(
                np.floor(frame.submit[test[-1]] / 86400.0) - np.floor(frame.submit[test[0]] / 86400.0)
            )
            + 1,
            "retrainings": len(fit_meta),
        },
        "model": model.meta,
        "retrain": retrain,
        "other_mode": other,
    }
    if bootstrap:
        report["noise"] = noise(tf, pred, bootstrap)
    report["warnings"] = small_sample_warnings(len(train), y)
    return report


# Below these the figures are noise. AUC compares completed with failed jobs pairwise: with fewer than 30 of
# either, its standard error (Hanley & McNeil) is 0.05-0.1, larger than the gains a model shows over the
# baseline on real logs (+0.02 on Philly), and a handful of jobs gives AUC 1.0 or 0.0 by chance. 50 ended
# jobs is the least `predict train` trains on.
MIN_TEST_PER_OUTCOME = 30
MIN_TRAIN_JOBS = 50


def small_sample_warnings(train_jobs: int, y: npt.NDArray[np.bool_]) -> list[str]:
    """Why the figures of a split cannot be trusted, if they cannot: too few training jobs, or too few
    completed or failed test jobs (a store of 5 jobs trained on 1 and reported AUC 1.0, without a word)."""
    out = []
    if train_jobs < MIN_TRAIN_JOBS:
        out.append(
            f"trained on {train_jobs} jobs, fewer than the {MIN_TRAIN_JOBS} `predict train` needs: "
            "its figures mean little"
        )
    done, failed = int(np.sum(y)), int(len(y) - np.sum(y))
    if min(done, failed) < MIN_TEST_PER_OUTCOME:
        out.append(
            f"the test set has {done} completed and {failed} other jobs; with fewer than "
            f"{MIN_TEST_PER_OUTCOME} of either, AUC and calibration figures are mostly chance"
        )
    return out


def training_period(frame: FeatureFrame, test_fraction: float) -> tuple[FeatureFrame, npt.NDArray[np.intp]]:
    """The history as it stood at the test split: jobs submitted before it, with the outcome of those
    that ended after it hidden (unlabelled), and the rows of its labelled jobs (in submit order)."""
    _, test = split(frame, test_fraction)
    t_split = frame.submit[test[0]]
    sub = frame.take(np.flatnonzero(frame.submit < t_split))
    late = ~(sub.end < t_split)
    sub.end = np.where(late, np.nan, sub.end)
    sub.state = np.where(late, "RUNNING", sub.state).astype(object)
    return sub, np.flatnonzero(sub.ended)


def validation_folds(
    frame: FeatureFrame,
    test_fraction: float = 0.3,
    config: TrainConfig | None = None,
    folds: tuple[tuple[float, float], ...] = FOLDS,
) -> dict[str, Any]:
    """Rolling-origin validation inside the training period only (the test jobs are never read).

    Each fold is a block of the training period's labelled jobs (by submit time), predicted exactly as the
    test is (retrained daily on what had ended before each day) and compared with the same baselines.
    Settings are chosen on the mean over folds."""
    cfg = config or TrainConfig()
    sub, lab = training_period(frame, test_fraction)
    rows = []
    for a, b in folds:
        test = lab[round(a * len(lab)) : round(b * len(lab))]
        if len(test) == 0:
            continue
        pred, _ = daily_predictions(sub, test, cfg)
        r = compare(sub.take(test), pred)
        rows.append(
            {
                "fold": f"{a:.0%}-{b:.0%}",
                "jobs": len(test),
                "success_rate": float(sub.success[test].mean()),
                "auc_gain": r["auc"] - r["baseline"]["auc"],
                "brier_gain": r["baseline"]["brier"] - r["brier"],
                "ece": r["ece"],
                "baseline_ece": r["baseline"]["ece"],
                "runtime_within_50pct": r["runtime"]["within_50pct"],
                "runtime_gain": r["runtime"]["within_50pct"] - r["baseline"]["runtime"]["within_50pct"],
                "auc": r["auc"],
                "brier": r["brier"],
                "ece_floor": ece_floor(pred.p_success),
                **_fold_floor(sub.take(test), pred.p_success),
            }
        )
    if not rows:
        raise ValueError(
            f"the training period holds {len(lab)} ended jobs: too few to cut into validation folds "
            "(ingest a longer history, or pass a smaller --test-fraction)"
        )
    keys = (
        "auc_gain",
        "brier_gain",
        "ece",
        "baseline_ece",
        "runtime_gain",
        "auc",
        "brier",
        "ece_floor",
        "ece_floor_user_day",
    )
    mean = {k: _finite_mean([r[k] for r in rows]) for k in keys}
    return {"folds": rows, "mean": mean, "training_jobs": len(lab)}


def _fold_floor(tf: FeatureFrame, p: npt.NDArray[np.float64]) -> dict[str, float]:
    """A fold's within-user-day correlation (NaN for a log without users) and the ECE a calibrated model
    would show with it (with none measured, the independent floor), so a fold's ECE can be read against
    what its bursts allow."""
    block = user_days(tf)
    corr, weight = block_dependence(tf.success, p, block)
    floor = correlated_ece_floor(p, block, weight if math.isfinite(weight) else 0.0, rounds=100)["mean"]
    return {"user_day_correlation": corr, "ece_floor_user_day": floor}


def _finite_mean(values: list[float]) -> float:
    """The mean of the finite values, NaN when there are none (every fold's AUC is NaN when the history
    has one outcome only): np.nanmean printed "RuntimeWarning: Mean of empty slice" to the terminal."""
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if len(a) else math.nan


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(float(t), tz=dt.UTC).isoformat(timespec="seconds")
