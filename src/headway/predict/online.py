"""The predictor driven by a clock (the simulator's virtual one, or the wall clock of a live queue).

It implements `headway.predict.api.OnlinePredictor`: callers report ends with `observe_end` and ask for
predictions with `predict(jobs, now)`. Ends are held back until the clock has passed them, so a job only
ever sees jobs that ended strictly before `now`, whatever order the caller reports things in. Each job's
feature row is taken when it is first asked about and kept: that row, with the outcome learnt at its end,
becomes a training example, so the model is trained on exactly what it was served.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.predict.api import EndedJob, Predictions, SubmittedJob, is_outcome
from headway.predict.features import (
    CATEGORICAL_FEATURES,
    HISTORY_FEATURES,
    SUCCESS,
    FeatureFrame,
    RollingState,
    request_features,
)
from headway.predict.model import Predictor, TrainConfig, fallback_predictions
from headway.predict.schedule import SCHEDULE, RetrainSchedule, Served

# Lighter than `predict train`'s; how many rows a fit reads is the schedule's window (schedule.py).
ONLINE_CONFIG = TrainConfig(rounds=150, quantile_rounds=100, early_stopping=20)


class _Batch:
    """Feature rows served to a batch of new jobs: one array, each job's row found by its id. Every job of
    the batch maps to this same object, so a batch of 10k jobs allocates no per-job containers (which
    would also wake the garbage collector over the whole rolling state)."""

    __slots__ = ("cats", "hist", "pos")

    def __init__(self, hist: Any, cats: tuple[Sequence[str | None], ...], pos: dict[str, int]) -> None:
        self.hist = hist
        self.cats = cats
        self.pos = pos


# A served feature row, kept until the job ends and becomes a training example: (history features,
# categorical values) for a job taken alone, or the batch it came in.
_Row = tuple[Sequence[float], tuple[str | None, ...]] | _Batch


def _hist(r: _Row, job_id: str) -> Sequence[float]:
    if isinstance(r, _Batch):
        h: Sequence[float] = r.hist[r.pos[job_id]]
        return h
    return r[0]


def _cats(r: _Row, job_id: str) -> tuple[str | None, ...]:
    if isinstance(r, _Batch):
        k = r.pos[job_id]
        return tuple(c[k] for c in r.cats)
    return r[1]


_NUM = len(HISTORY_FEATURES)  # the buffer's columns: the served history row, then _SCALARS
_SCALARS = 6  # submit, time limit (NaN: none), GPUs, nodes, start, end


class _History:
    """Training examples collected online: the served feature row and what happened.

    Numbers go into one float64 buffer that grows by doubling, so a retraining slices it instead of
    converting the schedule's window of Python rows (that conversion was about a third of a long replay
    with the online predictor). Only the newest `2 x keep` examples are kept: `frame` never reads older
    ones."""

    __slots__ = ("_buf", "_n", "cats", "job_id", "keep", "name", "state", "user")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._buf = np.empty((1024, _NUM + _SCALARS), dtype=np.float64)
        self._n = 0
        self.cats: tuple[list[str | None], ...] = tuple([] for _ in CATEGORICAL_FEATURES)
        self.job_id: list[str] = []
        self.user: list[str | None] = []
        self.name: list[str | None] = []
        self.state: list[str] = []

    def __len__(self) -> int:
        return self._n

    def append(
        self, hist: Sequence[float], cats: tuple[str | None, ...], j: SubmittedJob, e: EndedJob
    ) -> None:
        n = self._n
        if n == len(self._buf):
            if n >= 2 * self.keep:  # drop what `frame` can no longer read
                drop = n - self.keep
                self._buf[: n - drop] = self._buf[drop:n]
                cols: list[list[Any]] = [*self.cats, self.job_id, self.user, self.name, self.state]
                for col in cols:
                    del col[:drop]
                n -= drop
            else:
                grown = np.empty((2 * n, _NUM + _SCALARS), dtype=np.float64)
                grown[:n] = self._buf[:n]
                self._buf = grown
        row = self._buf[n]
        row[:_NUM] = hist
        tl = np.nan if j.time_limit is None else j.time_limit
        row[_NUM:] = (j.submit_time, tl, j.gpus, j.nodes, e.start_time, e.end_time)
        for col, v in zip(self.cats, cats, strict=True):
            col.append(v)
        self.job_id.append(j.job_id)
        self.user.append(j.user)
        self.name.append(j.name)
        self.state.append(e.state)
        self._n = n + 1

    def frame(self, keep: int) -> FeatureFrame:
        a = max(0, self._n - keep)
        b = self._buf[a : self._n]
        obj = lambda xs: np.asarray(xs[a:], dtype=object)  # noqa: E731
        submit, tl, gpus, nodes = (np.ascontiguousarray(b[:, _NUM + k]) for k in range(4))
        return FeatureFrame(
            X=np.hstack([b[:, :_NUM], request_features(gpus, nodes, tl, submit)]),
            cats={name: obj(col) for name, col in zip(CATEGORICAL_FEATURES, self.cats, strict=True)},
            job_id=obj(self.job_id),
            user=obj(self.user),
            name=obj(self.name),
            submit=submit,
            start=b[:, _NUM + 4].copy(),
            end=b[:, _NUM + 5].copy(),
            state=obj(self.state),
            time_limit=tl,
            gpus=gpus,
        )


_JOB_ID = attrgetter("job_id")
_FIELDS = (
    "user",
    "group",
    "name",
    "partition",
    "priority_class",
    "submit_time",
    "gpus",
    "nodes",
    "time_limit",
)


_GETTERS = tuple((f, attrgetter(f)) for f in _FIELDS)


def _columns(jobs: Sequence[SubmittedJob]) -> dict[str, Sequence[Any]]:
    """The jobs' fields as columns, one pass in C per field.

    Not `zip(*jobs)`: that allocates an iterator per job, which the garbage collector tracks, so a batch
    of 10k jobs ran about 14 young collections, and now and then a full one over the whole rolling state
    (about 100 ms) inside the call."""
    return {f: list(map(get, jobs)) for f, get in _GETTERS}


class OnlinePredictor:
    """Causal predictions with rolling state, cold-start fallbacks and periodic retraining."""

    def __init__(
        self,
        model: Predictor | None = None,
        *,
        schedule: RetrainSchedule = SCHEDULE,
        config: TrainConfig = ONLINE_CONFIG,
    ) -> None:
        self.model = model
        self.schedule = schedule
        self.config = config
        self.state = RollingState()
        self.trainings = 0
        self._rows: dict[str, _Row] = {}
        self._preds: dict[str, _Batch] = {}  # job id -> the batch whose `hist` holds its 4 predictions
        self._ends: list[tuple[float, int, EndedJob]] = []  # ends reported but not yet in the past
        self._seq = 0
        self._history = _History(schedule.window)
        self._served = Served()  # the current model's predictions against the outcomes since its fit
        self._new_since_train = 0
        self._trained_rows = 0
        self._last_train: float | None = None
        self._now = -np.inf

    def mark_trained(self, now: float) -> None:
        """Treat the current model as trained at `now` on everything that ended before it (a model loaded
        from a file after replaying its history), so retraining counts from here, not from zero."""
        self._advance(now)
        self._new_since_train, self._served = 0, Served()
        self._trained_rows = min(len(self._history), self.schedule.window)
        self._last_train = now

    # -- api.OnlinePredictor -------------------------------------------------------------------------
    def observe_end(self, ended: EndedJob) -> None:
        """Queue one job's end; it reaches the rolling state once the clock is strictly past it."""
        if not is_outcome(ended.state, ended.started, ended.job.job_id):
            return
        heapq.heappush(self._ends, (ended.end_time, self._seq, ended))
        self._seq += 1

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        if not jobs:
            self._advance(now)
            empty = np.zeros(0)
            return Predictions(empty, empty, empty, empty)
        vals = self._values(jobs, now)
        return Predictions(
            p_success=vals[:, 0].copy(),
            runtime=vals[:, 1].copy(),
            runtime_p90=vals[:, 2].copy(),
            time_to_failure=vals[:, 3].copy(),
        )

    def predict_one(self, job: SubmittedJob, now: float) -> tuple[float, float, float, float]:
        """`predict([job], now)`'s four numbers as floats (api.ScalarPredictor: the usual arrival)."""
        p, r, r90, f = self._values([job], now)[0].tolist()
        return p, r, r90, f

    def _values(self, jobs: Sequence[SubmittedJob], now: float) -> npt.NDArray[np.float64]:
        """(p_success, runtime, runtime_p90, time_to_failure) of each job, one row each."""
        self._advance(now)
        # A job's feature row is fixed once served, so its prediction only changes when the model does.
        cache = self._preds
        ids = list(map(_JOB_ID, jobs))
        # Every cached prediction's job has a served row, so jobs without rows are all new (the usual case
        # at an arrival; a C-level check) and `_matrix` need not look them up again.
        unseen = self._rows.keys().isdisjoint(ids)
        if unseen or cache.keys().isdisjoint(ids):
            todo = list(jobs)
        else:
            todo = [j for j, i in zip(jobs, ids, strict=True) if i not in cache]
            ids = [j.job_id for j in todo]
        vals = None
        if todo:
            X, cats, tl, pos = self._matrix(todo, ids, unseen)
            if self.model is None:
                p = fallback_predictions(X, tl)
            else:
                p = self.model.predict_design(self.model.design(X, cats), tl)
            new = np.column_stack([p.p_success, p.runtime, p.runtime_p90, p.time_to_failure])
            if pos is None:
                pos = dict(zip(ids, range(len(ids)), strict=True))
            batch = _Batch(new, (), pos)
            cache.update(dict.fromkeys(ids, batch))
            if len(todo) == len(jobs):
                vals = new
        if vals is None:
            vals = np.array([_hist(cache[j.job_id], j.job_id) for j in jobs], dtype=np.float64).reshape(
                len(jobs), 4
            )
        return vals

    def maybe_retrain(self, now: float) -> bool:
        """Retrain when the schedule says so (predict/schedule.py), on its window of the latest ends."""
        self._advance(now)
        h, sch = self._history, self.schedule
        last, drift = self._last_train, self._served.z()
        if not sch.due(now, self.state.ended, self._new_since_train, self._trained_rows, last, drift):
            return False
        keep = min(len(h), sch.window)
        frame = h.frame(keep)
        self._new_since_train, self._last_train, self._served = 0, now, Served()
        if frame.success.all() or not frame.success.any():
            return False  # nothing to tell apart yet: the fallbacks stay, and the next try waits its turn
        self.model = Predictor.fit(frame, np.arange(len(frame)), self.config)
        self._preds.clear()
        self.trainings += 1
        self._trained_rows = keep
        return True

    # -- internals -----------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        self._now = max(self._now, now)
        while self._ends and self._ends[0][0] < self._now:
            _, _, e = heapq.heappop(self._ends)
            j = e.job
            row = self._rows.pop(j.job_id, None) or self._row(j)
            served = self._preds.pop(j.job_id, None)  # the current model's prediction, if it made one
            if served is not None:
                self._served.add(float(_hist(served, j.job_id)[0]), e.state == SUCCESS)
            self.state.observe_end(j.user, j.group, j.name, j.gpus, e.start_time, e.end_time, e.state)
            self._history.append(_hist(row, j.job_id), _cats(row, j.job_id), j, e)
            self._new_since_train += 1

    def _row(self, j: SubmittedJob) -> _Row:
        hist = self.state.row(j.user, j.group, j.name, j.gpus, j.submit_time)
        return hist, (j.partition, j.priority_class, j.group)

    def _matrix(
        self, jobs: Sequence[SubmittedJob], ids: list[str], unseen: bool = False
    ) -> tuple[
        npt.NDArray[np.float64],
        dict[str, Sequence[str | None]],
        npt.NDArray[np.float64],
        dict[str, int] | None,
    ]:
        """Design inputs for `jobs`: rows already taken are reused; new jobs get theirs in one batch
        (`RollingState.rows`, each job counted as a submission before the next is read). Also the job id ->
        position map of that batch when it is exactly `jobs` (all new, none twice), else None. `unseen`:
        the caller found none of `ids` in `_rows`."""
        n = len(jobs)
        known = self._rows
        if unseen or known.keys().isdisjoint(ids):
            fresh = dict(zip(ids, jobs, strict=True))  # a job given twice: fewer entries, rebuilt below
        else:
            fresh = {j.job_id: j for j in jobs if j.job_id not in known}
        if len(fresh) < len(jobs):
            fresh = {}
            for j in jobs:
                if j.job_id not in known and j.job_id not in fresh:
                    fresh[j.job_id] = j
        hist_new = None
        pos: dict[str, int] | None = None
        cols: dict[str, Sequence[Any]] = {}
        if fresh:
            new = list(fresh.values())
            cols = _columns(new)
            hist_new = self.state.rows(
                cols["user"], cols["group"], cols["name"], cols["gpus"], cols["submit_time"]
            )
            cat_lists = (cols["partition"], cols["priority_class"], cols["group"])
            pos = dict(zip(fresh, range(len(new)), strict=True))
            batch = _Batch(hist_new, cat_lists, pos)
            known.update(dict.fromkeys(fresh, batch))
        if hist_new is not None and len(fresh) == n:
            h_arr = hist_new  # the usual case at an arrival: every job is new (and `cols` are theirs)
        else:
            h_arr = np.array([_hist(known[j.job_id], j.job_id) for j in jobs], dtype=np.float64).reshape(
                n, len(HISTORY_FEATURES)
            )
            cols = _columns(jobs)
            pos = None
        submit = np.array(cols["submit_time"], dtype=np.float64)
        gpus = np.array(cols["gpus"], dtype=np.float64)
        nodes = np.array(cols["nodes"], dtype=np.float64)
        tl = np.array(cols["time_limit"], dtype=np.float64)  # None (no limit) becomes NaN
        X = np.hstack([h_arr, request_features(gpus, nodes, tl, submit)])
        return X, {name: cols[name] for name in CATEGORICAL_FEATURES}, tl, pos
