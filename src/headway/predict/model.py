"""The models: calibrated P(complete), and quantile runtimes if it completes / until it fails.

- Completion: a LightGBM binary classifier (categorical columns handled natively), calibrated on a later
  time slice than it was fitted on (isotonic by default, Platt on request), because the queue policy
  multiplies by the probability and needs it to mean what it says.
- Runtime if it completes, and time to failure if it does not: LightGBM quantile regression on log
  seconds, alpha 0.5 (the point estimate) and 0.9 (for suggested time limits), capped by the time limit.
- Cold start: with no model (or too few examples for one part), the smoothed rates and running medians
  already in the feature row are the prediction (`fallback_predictions`).

The model file is one JSON document (format `headway-predictor`, version 1): LightGBM boosters as their
text dumps, the calibration curve as numbers, the category vocabularies and the training summary. No
pickle, so loading a model file never runs code.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.atomic import replaced_atomically
from headway.predict.api import Predictions
from headway.predict.features import (
    CATEGORICAL_FEATURES,
    NUMERIC_FEATURES,
    PRIOR_STRENGTH,
    START_ONLY_FEATURES,
    FeatureFrame,
)

MODEL_FORMAT = "headway-predictor"
MODEL_VERSION = 1
P_CLIP = (0.001, 0.999)
ISOTONIC_MIN_ROWS = 5000
SMALL_FIT_ROWS = 100_000
DEFAULT_RUNTIME_S = 3600.0
COLD_RUNTIME_START = "shape5"  # the runtime's starting point without a model (see RUNTIME_STARTS)
# `runtime_start="auto"` picks among these the one with the most completed jobs within +-50% on the
# latest training jobs (ties: the earlier one).
AUTO_STARTS = ("shape5", "shape_dense", "dense", "median")
FEATURES: tuple[str, ...] = NUMERIC_FEATURES + CATEGORICAL_FEATURES
_COL = {name: i for i, name in enumerate(FEATURES)}
# What the trees see: every design column but the ones that only feed the runtime's starting point, so
# the completion, p90 and time-to-failure trees do not depend on which runtime start is chosen.
TREE_FEATURES: tuple[str, ...] = tuple(f for f in FEATURES if f not in START_ONLY_FEATURES)
_TREE = np.array([_COL[f] for f in TREE_FEATURES], dtype=np.intp)


def tree_input(Xd: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The trees' columns of a design matrix, as one C-contiguous float64 block (LightGBM's fast path).

    `take` along the columns writes the rows in order; `Xd[:, _TREE]` came out in column order and its
    copy to rows took 2.6 ms of a 10k-job batch against 0.4 ms."""
    out: npt.NDArray[np.float64] = np.ascontiguousarray(np.take(Xd, _TREE, axis=1), dtype=np.float64)
    return out


class ModelFileError(ValueError):
    """A model file that cannot be used; str() is the one-line reason."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Knobs of one training run; the defaults are what `headway predict train` uses."""

    rounds: int = 400
    quantile_rounds: int = 200
    learning_rate: float = 0.05
    num_leaves: int = 15
    min_data_in_leaf: int = 30
    early_stopping: int = 30
    calib_fraction: float = 0.2  # the latest share of training jobs (by submit time) used for calibration
    calibration: str = "auto"  # isotonic | platt | auto (isotonic from 5,000 calibration jobs up)
    max_rows: int = 250_000  # train each model on at most the most recent this many jobs
    min_rows: int = 50  # fewer examples than this: that part falls back to running medians / rates
    threads: int = 1  # LightGBM threads from SMALL_FIT_ROWS examples up (smaller fits always use one)
    seed: int = 7
    halflife_days: float | None = 3.0  # weight examples by recency: half weight 3 days before the latest
    # runtime start: shape5 (median of the last 5 successes with the same GPU count, else the user's last 5)
    # | recent5 (user's last 5) | median (user's last 25) | blend (mean of those two in log space)
    runtime_start: str = "auto"
    runtime_select_fraction: float = 0.35  # auto: the latest share of training jobs the choice is made on
    runtime_trees: bool = False  # correct the median runtime with trees (off: see docs/predict.md)
    prior: str = "recent"  # the rates' Beta prior in the starting point: recent (last 500 ends) | all
    calib_by: str = "submit"  # calibration slice: the latest jobs by submit | end time
    p_rounds: int = 0  # completion trees: exactly this many (no early stopping); 0: early-stopped
    # evaluation-only experiment (not in OnlinePredictor; off: it lost on the validation folds): refit a
    # Platt map daily on the last N ended jobs' served probabilities
    recalibrate: int = 0
    parallel: bool = True  # train the models side by side, one thread each (same models as one by one)


@dataclass(slots=True)
class Calibration:
    """A monotone map from the classifier's raw probability to a calibrated one."""

    kind: str = "identity"  # identity | isotonic | platt
    x: list[float] = field(default_factory=list)  # isotonic: thresholds
    y: list[float] = field(default_factory=list)
    a: float = 1.0  # platt: sigmoid(a * logit(p) + b)
    b: float = 0.0

    def check(self) -> None:
        """ValueError unless this is a calibration `apply` can use (a model file read from disk)."""
        if self.kind not in ("identity", "platt", "isotonic"):
            raise ValueError(f"calibration kind {self.kind!r}")
        nums = [self.a, self.b, *self.x, *self.y]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in nums):
            raise ValueError("calibration: a value that is not a finite number")
        if len(self.x) != len(self.y):
            raise ValueError("calibration: thresholds and values differ in length")
        if self.kind == "isotonic" and (
            not self.x or any(b < a for a, b in zip(self.x, self.x[1:], strict=False))
        ):
            raise ValueError("calibration: isotonic thresholds empty or not in increasing order")

    def apply(self, p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        if self.kind == "isotonic" and self.x:
            out = np.interp(p, np.asarray(self.x), np.asarray(self.y))
        elif self.kind == "platt":
            pc = np.clip(p, 1e-6, 1 - 1e-6)
            out = 1.0 / (1.0 + np.exp(-(self.a * np.log(pc / (1 - pc)) + self.b)))
        else:
            out = p
        return np.clip(out, *P_CLIP)

    @classmethod
    def fit(
        cls,
        kind: str,
        p: npt.NDArray[np.float64],
        y: npt.NDArray[np.bool_],
        weight: npt.NDArray[np.float64] | None = None,
    ) -> Calibration:
        if len(p) < 30 or y.all() or not y.any():
            return cls()
        if kind == "auto":
            # Isotonic steps overfit a small slice; a two-parameter sigmoid does not.
            kind = "isotonic" if len(p) >= ISOTONIC_MIN_ROWS else "platt"
        if kind == "platt":
            from sklearn.linear_model import LogisticRegression

            pc = np.clip(p, 1e-6, 1 - 1e-6)
            z = np.log(pc / (1 - pc)).reshape(-1, 1)
            # Platt's own targets (1999): (N+ + 1) / (N+ + 2) for successes and 1 / (N- + 2) for failures,
            # not 1 and 0. A slice the model separates perfectly (a small local queue's: every failure of
            # a name it has seen fail) otherwise gets an unbounded slope, and one failed run put a job
            # name at p = 0.001, as low as a name that failed forty times. On large slices the targets
            # are 1 and 0 to within 1 / N. (Fitted as each row twice, once per label, weighted.)
            n_pos, n_neg = int(y.sum()), int((~y).sum())
            t = np.where(y, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
            w = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=np.float64)
            lr = LogisticRegression(C=1e6).fit(
                np.vstack([z, z]),
                np.r_[np.ones(len(y), bool), np.zeros(len(y), bool)],
                sample_weight=np.r_[w * t, w * (1.0 - t)],
            )
            a = float(lr.coef_[0, 0])
            if not a > 0:  # the slice ranks against the model (no signal, small data): never reverse it
                return cls()
            return cls(kind="platt", a=a, b=float(lr.intercept_[0]))
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(
            p, y.astype(float), sample_weight=weight
        )
        return cls(kind="isotonic", x=iso.X_thresholds_.tolist(), y=iso.y_thresholds_.tolist())


def design(
    X: npt.NDArray[np.float64], cats: dict[str, Any], vocab: dict[str, list[str]]
) -> npt.NDArray[np.float64]:
    """Numeric features plus each categorical column as its code in the training vocabulary (NaN: unseen).

    Filled in place rather than hstacked from reshaped columns: the one row of an arrival pays per numpy
    call, not per value."""
    k = X.shape[1]
    out = np.empty((len(X), k + len(CATEGORICAL_FEATURES)), dtype=np.float64)
    out[:, :k] = X
    for i, name in enumerate(CATEGORICAL_FEATURES):
        out[:, k + i] = _codes(cats[name], vocab.get(name, []))
    return out


def _codes(values: Any, levels: list[str]) -> npt.NDArray[np.float64]:
    """Each value's position in `levels` as a float (NaN: unseen or null)."""
    index = {v: float(k) for k, v in enumerate(levels)}
    if len(values) > 64:  # code each distinct value once, then gather
        import pandas as pd

        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        codes_v, uniq = pd.factorize(arr, use_na_sentinel=True)
        lut = np.array([index.get(v, np.nan) for v in uniq] + [np.nan], dtype=np.float64)
        out: npt.NDArray[np.float64] = lut[codes_v]  # -1 (null) takes the last entry: NaN
        return out
    # a dict beats pandas' setup cost for the few rows an online call brings
    return np.array([index.get(v, np.nan) if v is not None else np.nan for v in values], np.float64)


def _training_input(
    X: npt.NDArray[np.float64], cats: dict[str, Any], rows: npt.NDArray[np.intp], vocab: dict[str, list[str]]
) -> npt.NDArray[np.float64]:
    """`tree_input(design(...))` of `rows` filled in place: one array of 100k+ rows instead of three."""
    k = len(_TREE) - len(CATEGORICAL_FEATURES)
    out = np.empty((len(rows), len(_TREE)), dtype=np.float64)
    out[:, :k] = X[np.ix_(rows, _TREE[:k])]
    for i, name in enumerate(CATEGORICAL_FEATURES):
        out[:, k + i] = _codes(cats[name][rows], vocab.get(name, []))
    return out


RUNTIME_STARTS = {
    "recent5": ("user_log_runtime_recent5",),
    "median": ("user_log_runtime_median",),
    "blend": ("user_log_runtime_recent5", "user_log_runtime_median"),  # their mean in log space
    "shape5": ("shape_log_runtime_recent5", "user_log_runtime_recent5"),  # same GPU count first
    "dense": ("user_log_runtime_dense",),  # mode-seeking over the user's last DENSE_WINDOW successes
    "shape_dense": ("shape_log_runtime_dense", "user_log_runtime_dense"),  # same GPU count first
}


# The rates `_reprior` moves (name's, user's) and their counts of ended jobs, one column each.
_REPRIOR_RATES = np.array([_COL["name_success_rate"], _COL["user_success_rate"]], dtype=np.intp)
_REPRIOR_COUNTS = np.array([_COL["name_jobs_ended"], _COL["user_jobs_ended"]], dtype=np.intp)


def _reprior(X: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The name's and user's smoothed rates (columns 0 and 1) with the cluster's recent rate (its last 500
    ended jobs) as the Beta prior instead of its rate over all time: (succ + a p0) / (n + a) moved by
    a (p_recent - p0) / (n + a). Both in one pass: the numpy calls, not the rows, are the cost of one job."""
    p0 = X[:, _COL["global_success_rate"]]
    recent = X[:, _COL["global_last500"]]
    shift = PRIOR_STRENGTH * (np.where(np.isnan(recent), p0, recent) - p0)
    cnt = np.nan_to_num(X[:, _REPRIOR_COUNTS], nan=0.0)
    out: npt.NDArray[np.float64] = X[:, _REPRIOR_RATES] + shift[:, None] / (cnt + PRIOR_STRENGTH)
    return out


def fallback_predictions(
    X: npt.NDArray[np.float64],
    time_limit: npt.NDArray[np.float64],
    runtime_start: str = COLD_RUNTIME_START,
    prior: str = "recent",
) -> Predictions:
    """Cold-start predictions from the feature row alone: smoothed rates and running medians."""
    if prior == "recent":
        rates = _reprior(X)
        p, p_user = rates[:, 0], rates[:, 1]
    else:
        p, p_user = X[:, _COL["name_success_rate"]], X[:, _COL["user_success_rate"]]
    p = np.where(X[:, _COL["name_jobs_ended"]] >= 3, p, p_user)  # fewer (or NaN): the user's rate
    start = RUNTIME_STARTS[runtime_start]
    if runtime_start == "blend":
        user_rt = 0.5 * (X[:, _COL[start[0]]] + X[:, _COL[start[1]]])
    else:
        user_rt = _first_finite(X, start)
    rt = X[:, _COL["name_log_runtime_median"]]
    for alt in (user_rt, X[:, _COL["group_log_runtime_median"]], X[:, _COL["global_log_runtime_median"]]):
        rt = np.where(np.isnan(rt), alt, rt)
    p90 = _first_finite(X, ("name_log_runtime_p90", "user_log_runtime_p90"))
    p90 = np.where(np.isnan(p90), rt + math.log(3.0), np.maximum(p90, rt))
    ttf = _first_finite(X, ("name_log_ttf_median", "user_log_ttf_median", "global_log_ttf_median"))
    ttf = np.where(np.isnan(ttf), rt + math.log(0.3), ttf)
    return _finish(np.clip(p, *P_CLIP), rt, p90, ttf, time_limit)


def offsets(
    X: npt.NDArray[np.float64],
    time_limit: npt.NDArray[np.float64],
    runtime_start: str = COLD_RUNTIME_START,
    prior: str = "recent",
) -> dict[str, npt.NDArray[np.float64]]:
    """Where each model starts before its trees: the fallback prediction (log-odds / log seconds).

    The trees learn corrections to these, so a thin history still gives the running medians and rates,
    and a feature like "the user's median runtime" maps one-to-one instead of through step functions.
    """
    fb = fallback_predictions(X, time_limit, runtime_start, prior)
    p = fb.p_success  # clipped to P_CLIP already
    return {
        "p_success": np.log(p / (1 - p)),
        "runtime": np.log(np.maximum(fb.runtime, 1.0)),
        "runtime_p90": np.log(np.maximum(fb.runtime_p90, 1.0)),
        "ttf": np.log(np.maximum(fb.time_to_failure, 1.0)),
    }


OFFSET_OF = {
    "p_success": "p_success",
    "runtime_q50": "runtime",
    "runtime_q90": "runtime",
    "ttf_q50": "ttf",
}


def _first_finite(X: npt.NDArray[np.float64], names: tuple[str, ...]) -> npt.NDArray[np.float64]:
    """Each row's first of the columns `names` that is not NaN (NaN when none is); a view of X for one."""
    out = X[:, _COL[names[0]]]
    for name in names[1:]:
        out = np.where(np.isnan(out), X[:, _COL[name]], out)
    return out


def _finish(
    p: npt.NDArray[np.float64],
    log_rt: npt.NDArray[np.float64],
    log_p90: npt.NDArray[np.float64],
    log_ttf: npt.NDArray[np.float64],
    time_limit: npt.NDArray[np.float64],
) -> Predictions:
    """Log seconds to seconds, unknowns to the time limit's half (or an hour), everything capped by it.

    `np.exp` goes straight onto the logs: where a log is NaN its value is not used, and exp(+-inf) is
    inf / 0 as exp of nan_to_num's +-largest float was (nan_to_num cost more than the rest for one job)."""
    tl = np.asarray(time_limit, dtype=np.float64)
    no_limit = np.isnan(tl)
    default = np.where(no_limit, DEFAULT_RUNTIME_S, tl / 2.0)
    rt = np.where(np.isnan(log_rt), default, np.exp(log_rt))
    p90 = np.where(np.isnan(log_p90), rt * 2.0, np.exp(log_p90))
    p90 = np.maximum(p90, rt)
    ttf = np.where(np.isnan(log_ttf), rt * 0.3, np.exp(log_ttf))
    cap = np.where(no_limit, np.inf, tl)
    return Predictions(
        p_success=np.asarray(p, dtype=np.float64),
        runtime=np.minimum(rt, cap),
        runtime_p90=np.minimum(p90, cap),
        time_to_failure=np.minimum(ttf, cap),
    )


def pick_runtime_start(
    frame: FeatureFrame, rows: npt.NDArray[np.intp], fraction: float
) -> tuple[str, dict[str, float]]:
    """The runtime start (from AUTO_STARTS) with the most completed jobs within +-50% among the latest
    `fraction` of `rows` (in submit order), and every candidate's share. Which estimate hits most
    differs between clusters (a few repeated shapes per user, or one cluster-wide spread), so each
    training picks it on its own latest jobs, as the validation folds pick settings."""
    late = rows[len(rows) - round(len(rows) * fraction) :]
    done = late[frame.success[late] & ~np.isnan(frame.start[late])]
    if len(done) == 0:
        return COLD_RUNTIME_START, {}
    y = np.maximum(frame.runtime[done], 1.0)
    scores = {}
    for start in AUTO_STARTS:
        p = np.maximum(fallback_predictions(frame.X[done], frame.time_limit[done], start).runtime, 1.0)
        scores[start] = float(np.mean(np.abs(p - y) / y <= 0.5))
    best = max(AUTO_STARTS, key=lambda s: (scores[s], -AUTO_STARTS.index(s)))
    return best, scores


PREDICT_THREADS = min(os.cpu_count() or 1, 4)
PARALLEL_ROWS = 4096  # from this many rows a batch's boosters run side by side (fewer: one thread)


def _threads(rows: int) -> int:
    """LightGBM threads for one booster (`uncalibrated`): one for the few rows of an arrival (thread
    hand-offs cost more than the trees), up to 4 for a large batch. Measured on a 2-core machine, 10k rows
    through the three boosters in separate processes: 2 threads took 35-38 ms against 64-72 ms for 1 when
    idle, 72-81 ms against 70-74 ms beside one busy process, 82-84 ms against 123 ms beside two. (Training
    keeps its own setting: there 2 threads were up to 9x slower than 1 on the loaded machine.)"""
    return 1 if rows < PARALLEL_ROWS else PREDICT_THREADS


def _corrections(boosters: dict[str, Any], Xt: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
    """Each booster's raw output for the rows of `Xt`, the boosters of a large batch side by side.

    Each booster runs single-threaded on one thread of its own (LightGBM releases the GIL), instead of
    one after another with OpenMP threads splitting the rows: OpenMP's workers spin at the end of each
    booster waiting for the slowest, so beside a busy process 2 OpenMP threads were slower than 1
    (10k rows, 2 cores: 16 ms against 9 ms for the largest booster), while a thread per booster only
    blocks. A booster's rows are computed the same way whatever the thread count (each row is summed
    over the trees in order), so the numbers are the same; no booster is used by two threads at once."""
    keys = list(boosters)
    workers = min(len(keys), PREDICT_THREADS)
    if workers <= 1 or len(Xt) < PARALLEL_ROWS:
        nt = _threads(len(Xt))
        return {k: boosters[k].predict(Xt, raw_score=True, num_threads=nt) for k in keys}
    # Longest first onto the least loaded thread, the trees' count standing for the work.
    bins: list[list[str]] = [[] for _ in range(workers)]
    load = [0] * workers
    for k in sorted(keys, key=lambda k: -boosters[k].num_trees()):
        i = load.index(min(load))
        bins[i].append(k)
        load[i] += max(1, boosters[k].num_trees())
    out: dict[str, npt.NDArray[np.float64]] = {}
    errors: list[BaseException] = []

    def run(part: list[str]) -> None:
        try:
            for k in part:
                out[k] = boosters[k].predict(Xt, raw_score=True, num_threads=1)
        except BaseException as e:  # re-raised on the calling thread
            errors.append(e)

    import threading

    # Threads per call, not a pool: a pool's threads would not survive a fork of the process.
    threads = [threading.Thread(target=run, args=(part,), name="headway-predict") for part in bins[1:]]
    for t in threads:
        t.start()
    run(bins[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {k: out[k] for k in keys}


SHRINK_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
FIT_WEIGHT_FLOOR = 1e-3  # below it, the fit rows' recency weights are rescaled (see Predictor.fit)


def _best_shrink(
    start: npt.NDArray[np.float64],
    corr: npt.NDArray[np.float64],
    target: npt.NDArray[np.float64],
    alpha: float,
) -> float:
    """How much of the trees' correction to the running median to keep: the share (from SHRINK_GRID) with
    the lowest pinball loss on the later validation slice. Corrections that do not carry over to later
    jobs are dropped, so the model cannot do worse there than its starting point."""
    ok = ~np.isnan(start)
    if not ok.any():
        return 1.0
    losses = []
    for lam in SHRINK_GRID:
        r = target[ok] - (start[ok] + lam * corr[ok])
        losses.append(float(np.mean(np.maximum(alpha * r, (alpha - 1.0) * r))))
    return SHRINK_GRID[int(np.argmin(losses))]


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-x))
    return out


def _lgb_params(cfg: TrainConfig, objective: str, **extra: Any) -> dict[str, Any]:
    return {
        "objective": objective,
        "learning_rate": cfg.learning_rate,
        "num_leaves": cfg.num_leaves,
        "min_data_in_leaf": cfg.min_data_in_leaf,
        "feature_fraction": 0.85,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 1.0,
        "max_bin": 127,
        "cat_smooth": 10.0,
        "min_data_per_group": 20,
        "num_threads": cfg.threads,
        "seed": cfg.seed,
        "deterministic": True,
        "force_row_wise": True,
        "verbosity": -1,
        **extra,
    }


def _train_all(tasks: list[tuple[Any, ...]], train: Any, parallel: bool) -> dict[str, Any]:
    """Each task's booster, trained one by one or side by side in threads.

    LightGBM releases the GIL while it bins data and grows trees, and each model is single-threaded
    and seeded on its own, so the boosters are the same either way; side by side a retraining takes
    about the time of its slowest model instead of the sum (most of a long replay with the online
    predictor is these retrainings)."""
    workers = min(len(tasks), os.cpu_count() or 1) if parallel else 1
    if workers <= 1:
        return {t[0]: train(*t) for t in tasks}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="headway-fit") as pool:
        futures = {t[0]: pool.submit(train, *t) for t in tasks}
        return {key: f.result() for key, f in futures.items()}


@dataclass(slots=True)
class Predictor:
    """Trained models (any part may be missing: it then falls back) plus what is needed to use them."""

    vocab: dict[str, list[str]]
    calibration: Calibration
    boosters: dict[str, Any]  # p_success, runtime_q50, runtime_q90, ttf_q50 -> lightgbm.Booster
    meta: dict[str, Any] = field(default_factory=dict)

    # -- training -----------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls, frame: FeatureFrame, rows: npt.NDArray[np.intp] | None = None, config: TrainConfig | None = None
    ) -> Predictor:
        """Train on `rows` of `frame` (default: every ended job); they must all have ended."""
        import lightgbm as lgb

        cfg = config or TrainConfig()
        if rows is None:
            rows = np.flatnonzero(frame.ended)
        rows = rows[np.argsort(frame.submit[rows], kind="stable")][-cfg.max_rows :]
        large = len(rows) >= SMALL_FIT_ROWS
        if (
            large
        ):  # plenty of data: bigger steps, fewer trees, half the rows per tree (fast to train and serve)
            cfg = replace(
                cfg,
                learning_rate=max(cfg.learning_rate, 0.1),
                rounds=min(cfg.rounds, 150),
                quantile_rounds=min(cfg.quantile_rounds, 60),
                early_stopping=min(cfg.early_stopping, 15),
            )
        import pandas as pd

        vocab = {  # distinct values first (in C): a training set has 100k rows and a handful of levels
            name: sorted({str(v) for v in pd.unique(frame.cats[name][rows]).tolist() if v is not None})
            for name in CATEGORICAL_FEATURES
        }
        Xt = _training_input(frame.X, frame.cats, rows, vocab)
        y = frame.success[rows]
        runtime = frame.runtime[rows]
        started = ~np.isnan(runtime)
        log_rt = np.log(np.maximum(np.nan_to_num(runtime, nan=1.0), 1.0))
        n = len(rows)
        n_cal = round(n * cfg.calib_fraction)
        fit_idx, cal_idx = np.arange(n - n_cal), np.arange(n - n_cal, n)
        if cfg.calib_by == "end" and n_cal:  # the jobs whose outcomes came in last, not the last submitted
            late = np.zeros(n, dtype=bool)
            late[np.argsort(frame.end[rows], kind="stable")[n - n_cal :]] = True
            fit_idx, cal_idx = np.flatnonzero(~late), np.flatnonzero(late)
        cat_idx = [TREE_FEATURES.index(c) for c in CATEGORICAL_FEATURES]
        boosters: dict[str, Any] = {}
        meta: dict[str, Any] = {
            "trained_rows": n,
            "calibration_rows": n_cal,
            "success_rate": float(y.mean()) if n else None,
            "fit_success_rate": float(y[fit_idx].mean()) if len(fit_idx) else None,
            # what the training data spans, so that `show` can tell a past job the model has seen
            "trained_from_submit": float(frame.submit[rows].min()) if n else None,
            "trained_until": float(np.nanmax(frame.end[rows])) if n else None,
            "config": asdict(cfg),
        }
        calibration = Calibration()
        shrink: dict[str, float] = {}

        start = cfg.runtime_start
        if start == "auto":
            start, meta["runtime_start_scores"] = pick_runtime_start(frame, rows, cfg.runtime_select_fraction)
        off = offsets(frame.X[rows], frame.time_limit[rows], start, cfg.prior)
        weight = np.ones(n)
        if cfg.halflife_days and n:
            age_days = (frame.submit[rows][-1] - frame.submit[rows]) / 86400.0
            weight = 0.5 ** (age_days / cfg.halflife_days)
            # The weights are relative, but LightGBM's are not quite: its floor on a leaf's hessian sum
            # (1e-3) and float32 storage are absolute. When the calibration slice spans weeks, every fit row
            # is older than it and weighs 2^-(weeks x 7 / 3): no split passes the floor, and the models are
            # one empty tree (a year of sacct history did that). So the fit rows are put back on the scale
            # of their own newest when it has sunk that far; shorter histories train as they did.
            if len(fit_idx) and weight[fit_idx].max() < FIT_WEIGHT_FLOOR:
                fit_age = age_days[fit_idx]
                weight[fit_idx] = 0.5 ** ((fit_age - fit_age.min()) / cfg.halflife_days)

        def train(
            key: str,
            objective: str,
            sel_fit: npt.NDArray[np.intp],
            sel_val: npt.NDArray[np.intp],
            target: npt.NDArray[Any],
            rounds: int,
            extra: dict[str, Any],
        ) -> Any:
            params = _lgb_params(cfg, objective, **extra)
            if large:
                params["bagging_fraction"] = 0.5
            if len(sel_fit) < SMALL_FIT_ROWS:
                params["num_threads"] = 1  # thread hand-offs cost more than they save on small data
            o = off[OFFSET_OF[key]]
            dfit = lgb.Dataset(
                Xt[sel_fit],
                target[sel_fit],
                weight=weight[sel_fit],
                init_score=o[sel_fit],
                categorical_feature=cat_idx,
                free_raw_data=True,
            )
            callbacks: list[Any] = []
            valid_sets = []
            if len(sel_val) >= cfg.min_rows and not (key == "p_success" and cfg.p_rounds):
                valid_sets = [
                    lgb.Dataset(
                        Xt[sel_val],
                        target[sel_val],
                        weight=weight[sel_val],
                        init_score=o[sel_val],
                        reference=dfit,
                    )
                ]
                callbacks = [lgb.early_stopping(cfg.early_stopping, verbose=False)]
            return lgb.train(params, dfit, num_boost_round=rounds, valid_sets=valid_sets, callbacks=callbacks)

        # What to train: (key, objective, fit rows, validation rows, target, rounds, extra parameters).
        tasks: list[tuple[str, str, Any, Any, Any, int, dict[str, Any]]] = []
        if len(fit_idx) >= cfg.min_rows and 0 < y[fit_idx].sum() < len(fit_idx):
            rounds = cfg.p_rounds or cfg.rounds
            tasks.append(("p_success", "binary", fit_idx, cal_idx, y.astype(np.float64), rounds, {}))
        for part, sel in (("runtime", y & started), ("ttf", ~y & started)):
            f_sel = fit_idx[sel[fit_idx]]
            v_sel = cal_idx[sel[cal_idx]]
            meta[f"{part}_rows"] = int(len(f_sel) + len(v_sel))
            if len(f_sel) < cfg.min_rows:
                continue
            for alpha in (0.5, 0.9) if part == "runtime" else (0.5,):  # the API has no p90 time to failure
                key = f"{part}_q{int(alpha * 100)}"
                if key == "runtime_q50" and not cfg.runtime_trees:
                    continue  # the recent-runs median is the estimate: tree corrections did not carry over
                extra: dict[str, Any] = {"alpha": alpha, "metric": "quantile"}
                tasks.append((key, "quantile", f_sel, v_sel, log_rt, cfg.quantile_rounds, extra))
        boosters.update(_train_all(tasks, train, cfg.parallel))
        if "p_success" in boosters and n_cal:
            raw_p = boosters["p_success"].predict(Xt[cal_idx], raw_score=True)
            raw = _sigmoid(raw_p + off["p_success"][cal_idx])
            calibration = Calibration.fit(cfg.calibration, raw, y[cal_idx], weight[cal_idx])
        for key, _, _, v_sel, _, _, extra in tasks:
            if key != "p_success" and len(v_sel) >= cfg.min_rows:
                corr = boosters[key].predict(Xt[v_sel], raw_score=True)
                alpha = float(extra["alpha"])
                shrink[key] = _best_shrink(off[OFFSET_OF[key]][v_sel], corr, log_rt[v_sel], alpha)
        meta["models"] = sorted(boosters)
        meta["shrink"] = shrink
        meta["runtime_start"] = start
        meta["prior"] = cfg.prior
        meta["calibration"] = calibration.kind
        return cls(vocab=vocab, calibration=calibration, boosters=boosters, meta=meta)

    # -- inference ----------------------------------------------------------------------------------
    def design(self, X: npt.NDArray[np.float64], cats: dict[str, Any]) -> npt.NDArray[np.float64]:
        return design(X, cats, self.vocab)

    def uncalibrated(self, Xd: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The classifier's probability before calibration (the fallback rate when there is no classifier)."""
        X = Xd[:, : len(NUMERIC_FEATURES)]
        off = offsets(X, np.full(len(Xd), np.nan), prior=self.meta.get("prior", "all"))["p_success"]
        if "p_success" in self.boosters:
            off = off + self.boosters["p_success"].predict(
                tree_input(Xd), raw_score=True, num_threads=_threads(len(Xd))
            )
        return _sigmoid(off)

    def predict_design(self, Xd: npt.NDArray[np.float64], time_limit: npt.NDArray[np.float64]) -> Predictions:
        """Predictions for rows of the design matrix; missing parts come from the fallback."""
        off = offsets(
            Xd[:, : len(NUMERIC_FEATURES)],
            time_limit,
            self.meta.get("runtime_start", "recent5"),
            self.meta.get("prior", "all"),
        )
        b = self.boosters
        corrs = _corrections(b, tree_input(Xd)) if b else {}
        shrink = self.meta.get("shrink", {})

        def raw(key: str, fallback: str) -> npt.NDArray[np.float64]:
            if key in b:
                out: npt.NDArray[np.float64] = shrink.get(key, 1.0) * corrs[key] + off[OFFSET_OF[key]]
                return out
            return off[fallback]

        p_raw = raw("p_success", "p_success")
        p = self.calibration.apply(_sigmoid(p_raw)) if "p_success" in b else _sigmoid(p_raw)
        rt = raw("runtime_q50", "runtime")
        p90 = np.maximum(raw("runtime_q90", "runtime_p90"), rt)
        ttf = raw("ttf_q50", "ttf")
        return _finish(p, rt, p90, ttf, time_limit)

    def predict_frame(self, frame: FeatureFrame) -> Predictions:
        return self.predict_design(self.design(frame.X, frame.cats), frame.time_limit)

    def contributions(self, Xd: npt.NDArray[np.float64]) -> dict[str, npt.NDArray[np.float64]]:
        """SHAP contributions (LightGBM pred_contrib) per model; the last column is the bias."""
        Xt = tree_input(Xd)
        return {k: np.asarray(v.predict(Xt, pred_contrib=True)) for k, v in self.boosters.items()}

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the model file atomically (temp file + rename)."""
        import lightgbm as lgb

        doc = {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "lightgbm": lgb.__version__,
            "features": list(FEATURES),
            "categorical": list(CATEGORICAL_FEATURES),
            "vocab": self.vocab,
            "calibration": asdict(self.calibration),
            "meta": self.meta,
            "boosters": {k: v.model_to_string() for k, v in self.boosters.items()},
        }
        with replaced_atomically(Path(path)) as tmp:  # a symlink's target is the model file it updates
            tmp.write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        import lightgbm as lgb

        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelFileError(f"{path}: no model file here (run `headway predict train` first)") from None
        except (OSError, UnicodeError, json.JSONDecodeError) as e:
            raise ModelFileError(f"{path}: not a headway model file ({e})") from e
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            raise ModelFileError(f"{path}: not a headway model file (no format {MODEL_FORMAT!r})")
        if doc.get("version") != MODEL_VERSION:
            raise ModelFileError(
                f"{path}: model file version {doc.get('version')} but this headway reads {MODEL_VERSION}; "
                "retrain with `headway predict train`"
            )
        if doc.get("features") != list(FEATURES):
            raise ModelFileError(f"{path}: trained on other features; retrain with `headway predict train`")
        try:
            _check_boosters(doc["boosters"])
            boosters = {k: lgb.Booster(model_str=s) for k, s in doc["boosters"].items()}
            cal = Calibration(**doc["calibration"])
            cal.check()
            vocab, meta = doc["vocab"], doc.get("meta", {})
            if not isinstance(meta, dict) or not isinstance(vocab, dict):
                raise TypeError("vocab and meta must be objects")
            if not all(isinstance(v, list) and all(isinstance(w, str) for w in v) for v in vocab.values()):
                raise TypeError("vocab: every category must list words")
            _check_meta(meta)
        except (KeyError, TypeError, ValueError, lgb.basic.LightGBMError) as e:
            raise ModelFileError(
                f"{path}: damaged model file ({(str(e).splitlines() or [repr(e)])[0]})"
            ) from e
        return cls(vocab=vocab, calibration=cal, boosters=boosters, meta=meta)


PRIORS = ("recent", "all")


def _check_boosters(boosters: object) -> None:
    """TypeError unless the file's boosters are a mapping of known model names to LightGBM text dumps:
    anything else (a list, a number for a dump) failed later as a traceback, in `show` and in the local
    queue's start-up."""
    if not isinstance(boosters, dict):
        raise TypeError("boosters must be an object")
    for key, dump in boosters.items():
        if key not in OFFSET_OF:
            raise ValueError(f"boosters: unknown model {key!r}")
        if not isinstance(dump, str):
            raise TypeError(f"boosters: {key} is not a LightGBM model text")


def _check_meta(meta: dict[str, Any]) -> None:
    """ValueError / TypeError unless the training summary's fields that predictions read are usable: the
    runtime start and prior pick code paths (a wrong one was a KeyError at the first prediction, or
    silently another prior), the shrinkage multiplies the trees' corrections, the sources are named."""
    start = meta.get("runtime_start", "recent5")
    if not isinstance(start, str) or start not in RUNTIME_STARTS:
        raise ValueError(f"meta: unknown runtime start {start!r}")
    prior = meta.get("prior", "all")
    if not isinstance(prior, str) or prior not in PRIORS:
        raise ValueError(f"meta: unknown prior {prior!r}")
    shrink = meta.get("shrink", {})
    if not isinstance(shrink, dict):
        raise TypeError("meta: shrink must be an object")
    for key, v in shrink.items():
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if key not in OFFSET_OF or not number or not math.isfinite(v):
            raise ValueError(f"meta: shrink {key!r} is not a finite number for a known model")
    sources = meta.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(x, str) for x in sources):
        raise TypeError("meta: sources must list names")
