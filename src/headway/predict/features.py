"""Causal features: a job submitted at t sees only jobs that ended strictly before t.

One rolling state (`RollingState`) serves both uses: the batch sweep over a job table (submit and end
events merged in one time-sorted pass, O(N log N) for the sort and O(1)-ish per event after it) and the
online path (`observe_end` at each job's end, a feature row for each new submission). Because both go
through the same object, the features a model is trained on are exactly the ones it is served.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headway.predict.api import is_outcome
from headway.schema import ENDED_STATES, State, submit_order

NAN = math.nan
PRIOR_STRENGTH = 4.0  # pseudo-jobs of the Beta prior: how much history outweighs the global rate
USER_WINDOW = 25  # runtimes kept per user for the running median / p90
RECENT = 5  # the "recent" runtime median: the last 5 successes track a user's current work best
NAME_WINDOW = 15  # per user+name
GROUP_WINDOW = 25
GLOBAL_WINDOW = 51
SUBMIT_WINDOW_S = 3600.0
GLOBAL_RECENT = 500  # the cluster's success rate over its last 500 ended jobs: about a week on Philly
DENSE_WINDOW = 10  # the mode-seeking runtime looks at the key's last 10 successful runtimes
# A prediction p is within +-50% of a runtime y when 2p/3 <= y <= 2p: in log seconds, y - p lies in
# [log 2/3, log 2]. The mode-seeking estimate tries p = y_k, 1.5 y_k and y_k / 2 for each runtime y_k of
# the window, i.e. windows of y - y_k in these ranges (the same three, written around y_k).
DENSE_RANGES: tuple[tuple[float, float, float], ...] = (
    (0.0, math.log(2.0 / 3.0), math.log(2.0)),  # (shift of p from y_k, low, high)
    (math.log(1.5), 0.0, math.log(3.0)),
    (-math.log(2.0), -math.log(3.0), 0.0),
)
DENSE_EPS = 1e-9  # inclusive edges, so runtimes exactly 2x apart count whatever the rounding of their logs
ENDED = frozenset(s.value for s in ENDED_STATES)
SUCCESS = State.COMPLETED.value


def _labelled(
    state: npt.NDArray[np.object_],
    start: npt.NDArray[np.float64],
    end: npt.NDArray[np.float64],
    job_id: npt.NDArray[np.object_],
) -> npt.NDArray[np.bool_]:
    """Ended with a known final state and end time, and an outcome (api.is_outcome: not cancelled before
    it started, not a requeued job's earlier run): the jobs with a label, the only ones history counts."""
    out: npt.NDArray[np.bool_] = (
        np.isin(state, list(ENDED)) & ~np.isnan(end) & (~np.isnan(start) | (state != State.CANCELLED.value))
    )
    preempted = out & (state == State.PREEMPTED.value)
    if preempted.any():  # rare: the per-id rule (is_outcome's) runs on those rows only
        for i in np.flatnonzero(preempted).tolist():
            out[i] = is_outcome(State.PREEMPTED.value, True, str(job_id[i]))
    return out


# History features, in the order `RollingState.row` returns them.
HISTORY_FEATURES: tuple[str, ...] = (
    "user_jobs_ended",
    "user_success_rate",
    "user_last1",
    "user_last3",
    "user_last10",
    "user_fail_streak",
    "user_hours_since_failure",
    "user_hours_since_success",
    "user_submits_last_hour",
    "user_log_runtime_median",
    "user_log_runtime_p90",
    "user_log_ttf_median",
    "user_log_runtime_last",
    "user_log_runtime_recent5",
    "name_jobs_ended",
    "name_success_rate",
    "name_fail_streak",
    "name_log_runtime_median",
    "name_log_runtime_p90",
    "name_log_ttf_median",
    "group_jobs_ended",
    "group_success_rate",
    "group_log_runtime_median",
    "shape_jobs_ended",
    "shape_success_rate",
    "shape_log_runtime_median",
    "shape_log_runtime_recent5",
    "shape_log_ttf_median",
    "global_success_rate",
    "global_last100",
    "global_log_runtime_median",
    "global_log_ttf_median",
    "global_last500",
    "user_log_runtime_dense",
    "shape_log_runtime_dense",
)
# Columns that only feed the runtime's starting point, never the trees (see model.TREE_FEATURES).
START_ONLY_FEATURES: tuple[str, ...] = ("user_log_runtime_dense", "shape_log_runtime_dense")
# Request features, computed straight from the job (vectorised in the batch path).
REQUEST_FEATURES: tuple[str, ...] = ("gpus", "nodes", "log_time_limit", "hour", "weekday")
CATEGORICAL_FEATURES: tuple[str, ...] = ("partition", "priority_class", "group")
NUMERIC_FEATURES: tuple[str, ...] = HISTORY_FEATURES + REQUEST_FEATURES
H = {name: i for i, name in enumerate(HISTORY_FEATURES)}


def log_seconds(seconds: float) -> float:
    """Runtimes live in log space (a 1 s floor keeps zero-length jobs finite)."""
    return math.log(max(seconds, 1.0))


class Window:
    """The last K values in arrival order plus the same values sorted: O(K) update, O(1) quantiles."""

    __slots__ = ("order", "sorted")

    def __init__(self) -> None:
        self.order: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, value: float, k: int, keep: int = 0) -> None:
        """Add a value: `sorted` holds the last k, `order` the last max(k, keep) (for `dense`)."""
        o = self.order
        o.append(value)
        insort(self.sorted, value)
        if len(o) > k:
            del self.sorted[bisect_left(self.sorted, o[-k - 1])]
            if len(o) > keep:
                o.popleft()

    def quantile(self, q: float) -> float:
        s = self.sorted
        if not s:
            return NAN
        return s[int(q * (len(s) - 1) + 0.5)]

    def recent_median(self, k: int = RECENT) -> float:
        """Median (same rank rule as `quantile`) of the last k values in arrival order."""
        o = self.order
        if not o:
            return NAN
        last = sorted(o[i] for i in range(max(0, len(o) - k), len(o)))
        return last[int(0.5 * (len(last) - 1) + 0.5)]

    def last_sorted(self, k: int) -> list[float]:
        o = self.order
        return sorted(o[i] for i in range(max(0, len(o) - k), len(o)))

    def dense(self) -> float:
        """The mode-seeking runtime of the last DENSE_WINDOW values (see `dense_estimate`)."""
        if not self.order:
            return NAN
        return float(dense_estimate([self.last_sorted(DENSE_WINDOW)])[0])


def dense_estimate(
    windows: Sequence[Sequence[float]] | npt.NDArray[np.float64], chunk: int = 4096
) -> npt.NDArray[np.float64]:
    """Mode-seeking point estimates, one per window of log runtimes (each sorted ascending; a matrix
    padded with +inf, or a list of lists): the candidate p among y_k, 1.5 y_k and y_k / 2 that the most
    values of the window would be within +-50% of (|p - y| <= y / 2), ties to the candidate closest to
    the window's median, then the smallest. The claim counts that hit rate, and the best point estimate
    for a hit rate is the centre of the densest window, not the median. NaN for an empty window."""
    if isinstance(windows, np.ndarray):
        w = windows
    else:
        k = max((len(x) for x in windows), default=0)
        w = np.full((len(windows), k), np.inf)
        for i, x in enumerate(windows):
            w[i, : len(x)] = x
    n, k = w.shape
    out = np.full(n, np.nan)
    if n == 0 or k == 0:
        return out
    for a in range(0, n, chunk):
        out[a : a + chunk] = _dense_block(w[a : a + chunk])
    return out


def _dense_block(w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    n = len(w)
    valid = np.isfinite(w)
    length = valid.sum(axis=1)
    med = w[np.arange(n), np.floor(0.5 * (np.maximum(length, 1) - 1) + 0.5).astype(np.int64)]
    with np.errstate(invalid="ignore"):
        d = w[:, None, :] - w[:, :, None]  # d[r, c, j] = y_j - y_c (inf or NaN beyond the window)
    counts, cands = [], []
    for shift, lo, hi in DENSE_RANGES:
        with np.errstate(invalid="ignore"):
            c = np.count_nonzero((d >= lo - DENSE_EPS) & (d <= hi + DENSE_EPS), axis=2)
        counts.append(np.where(valid, c, -1))
        cands.append(w + shift)
    cnt = np.concatenate(counts, axis=1)
    cand = np.concatenate(cands, axis=1)
    best = cnt.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        dist = np.where(cnt == best, np.abs(cand - med[:, None]), np.inf)
    near = dist <= dist.min(axis=1, keepdims=True) + DENSE_EPS
    pick: npt.NDArray[np.float64] = np.where(near, cand, np.inf).min(axis=1)
    return np.where(length > 0, pick, np.nan)


class KeyStats:
    """Rolling history of one key (a user, a user+name, a group)."""

    __slots__ = (
        "dense_memo",
        "dense_ok",
        "fail_streak",
        "idx",
        "last_fail",
        "last_success",
        "memo",
        "memo_at",
        "n",
        "recent",
        "recent_sum",
        "runtime",
        "submits",
        "succ",
        "ttf",
    )

    def __init__(self, keep: int = 100) -> None:
        self.n = 0
        self.succ = 0
        self.fail_streak = 0
        self.last_fail = NAN
        self.last_success = NAN
        self.recent: deque[int] = deque(maxlen=keep)
        self.recent_sum = 0  # sum of `recent`, kept as it slides (the cluster's last 500 in O(1))
        self.runtime = Window()
        self.ttf = Window()
        self.submits: deque[float] = deque()
        self.memo: tuple[float, ...] = ()  # this key's part of a feature row, valid while memo_at holds
        self.memo_at = -1
        self.dense_memo = NAN  # the mode-seeking runtime, valid while dense_ok (until the next success)
        self.dense_ok = True
        self.idx = -1  # this key's id in its `_Table` once a batch has seen it (-1: not yet)

    def dense(self) -> float:
        if not self.dense_ok:
            self.dense_memo = self.runtime.dense()
            self.dense_ok = True
        return self.dense_memo

    def runtime_part(self) -> tuple[float, float, float, float, float]:
        """Median, p90, median time to failure, last and recent-5 median runtime (log seconds)."""
        rt = self.runtime
        return (
            rt.quantile(0.5),
            rt.quantile(0.9),
            self.ttf.quantile(0.5),
            rt.order[-1] if rt.order else NAN,
            rt.recent_median(),
        )

    def end(self, success: bool, end_time: float, log_rt: float, started: bool, k: int) -> None:
        self.n += 1
        rec = self.recent
        if len(rec) == rec.maxlen:
            self.recent_sum -= rec[0]
        rec.append(1 if success else 0)
        self.recent_sum += 1 if success else 0
        if success:
            self.succ += 1
            self.fail_streak = 0
            self.last_success = end_time
            self.runtime.add(log_rt, k, DENSE_WINDOW)
            self.dense_ok = False
        else:
            self.fail_streak += 1
            self.last_fail = end_time
            if started:
                self.ttf.add(log_rt, k)


def _dense_many(stats: Sequence[KeyStats | None]) -> npt.NDArray[np.float64]:
    """`KeyStats.dense` for many keys: the stale ones computed in one vectorised call."""
    stale = [s for s in stats if s is not None and not s.dense_ok]
    if stale:
        vals = dense_estimate([s.runtime.last_sorted(DENSE_WINDOW) for s in stale])
        for s, v in zip(stale, vals.tolist(), strict=True):
            s.dense_memo = v
            s.dense_ok = True
    return np.fromiter((NAN if s is None else s.dense_memo for s in stats), np.float64, len(stats))


def _last(recent: deque[int], k: int) -> float:
    n = len(recent)
    if n == 0:
        return NAN
    m = min(k, n)
    return sum(recent[i] for i in range(n - m, n)) / m


_USER_NAN_COLS = np.array([0, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 33])  # a job without a user
_KEY_SPAN = 1 << 31  # compound key codes: (interned user + 1) * _KEY_SPAN + interned name / GPU count


def _object_array(values: Sequence[Any]) -> npt.NDArray[np.object_]:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _user_own(us: KeyStats) -> tuple[float, ...]:
    """A user's own part of a row (changes only when the user's jobs end): n, successes, last 1 / 3 / 10,
    failure streak, runtime part, last failure and success times."""
    rec = us.recent
    return (
        float(us.n),
        float(us.succ),
        _last(rec, 1),
        _last(rec, 3),
        _last(rec, 10),
        float(us.fail_streak),
        *us.runtime_part(),
        us.last_fail,
        us.last_success,
    )


def _name_own(ns: KeyStats) -> tuple[float, ...]:
    rt = ns.runtime
    return (
        float(ns.n),
        float(ns.succ),
        float(ns.fail_streak),
        rt.quantile(0.5),
        rt.quantile(0.9),
        ns.ttf.quantile(0.5),
    )


def _group_own(gs: KeyStats) -> tuple[float, ...]:
    return (float(gs.n), float(gs.succ), gs.runtime.quantile(0.5))


def _shape_own(ss: KeyStats) -> tuple[float, ...]:
    rt = ss.runtime
    return (float(ss.n), float(ss.succ), rt.quantile(0.5), rt.recent_median(), ss.ttf.quantile(0.5))


def _count_submits_quick(
    deques: list[deque[float]], codes: npt.NDArray[np.int64], times: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64] | None:
    """`_count_submits` without reading the queues, in the usual case: per user the batch's times never
    go back, none is before the user's last queued one, and the oldest queued one is still within the hour
    of the user's last batch job. `row` then pops nothing while the queue is not empty, so a job counts the
    queue plus its user's earlier batch jobs; with an empty queue, the earlier ones within the hour.
    None when the case does not hold (nothing changed)."""
    order = np.argsort(codes, kind="stable")
    c_s, t_s = codes[order], times[order]
    if np.any((c_s[1:] == c_s[:-1]) & (t_s[1:] < t_s[:-1])):
        return None
    users = np.arange(len(deques))
    starts = np.searchsorted(c_s, users, side="left").tolist()
    ends = np.searchsorted(c_s, users + 1, side="left").tolist()
    tl = t_s.tolist()
    w = SUBMIT_WINDOW_S
    for d, a, b in zip(deques, starts, ends, strict=True):
        if d and (d[-1] > tl[a] or d[0] <= tl[b - 1] - w):
            return None
    old_len = np.fromiter(map(len, deques), np.int64, len(deques))
    ranks = np.unique(np.concatenate([t_s, t_s - w]), return_inverse=True)[1]
    m = int(ranks.max()) + 1
    comp = c_s * m + ranks[: len(t_s)]
    idx = np.arange(len(t_s))
    within = idx - np.searchsorted(comp, c_s * m + ranks[len(t_s) :], side="right")
    run_start = np.asarray(starts, dtype=np.int64)[c_s]
    cnt = np.where(old_len[c_s] > 0, old_len[c_s] + idx - run_start, within)
    out = np.empty(len(t_s), dtype=np.float64)
    out[order] = cnt
    for d, a, b in zip(deques, starts, ends, strict=True):
        if d:
            d.extend(tl[a:b])  # nothing is popped: the queue's head stays within the hour
        else:
            lim = tl[b - 1] - w
            d.extend(t for t in tl[a:b] if t > lim)
    return out


class _Interner:
    """Values (strings or floats) to dense int ids, looked up for a whole array at once (pandas' hash
    index in C instead of a dictionary lookup per value)."""

    __slots__ = ("ids", "index", "values")

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        self.values: list[Any] = []
        self.index: Any = None

    def add(self, value: Any) -> int:
        i = self.ids.get(value)
        if i is None:
            i = self.ids[value] = len(self.values)
            self.values.append(value)
            self.index = None
        return i

    def lookup(self, values: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        """Each value's id, -1 for values never added (and for None)."""
        import pandas as pd

        if not self.values:
            return np.full(len(values), -1, dtype=np.int64)
        if self.index is None:
            arr = np.empty(len(self.values), dtype=values.dtype)
            arr[:] = self.values
            self.index = pd.Index(arr, dtype=values.dtype)
        # An Index of the same dtype as the target: pandas would otherwise convert strings to its own
        # string type first (a copy of the batch).
        target = pd.Index(values, dtype=values.dtype, copy=False)
        out: npt.NDArray[np.int64] = self.index.get_indexer(target).astype(np.int64)
        return out


class _Table:
    """One family of keys (users, user + name, groups, user + GPU count) for batch rows: each key gets an
    id the first time a batch sees it, and its own part of a row (what changes only when the key itself
    ends) is kept in `part`, recomputed only for keys that ended since (`fresh` false)."""

    __slots__ = ("codes", "fresh", "index", "part", "stats")

    def __init__(self, width: int) -> None:
        self.stats: list[KeyStats] = []
        self.codes: list[int] = []  # each key's integer code (see RollingState._sync)
        self.index: Any = None  # pandas index over `codes`
        self.part = np.full((64, width), NAN)  # rows past the registered keys are never read as data
        self.fresh = np.zeros(64, dtype=bool)

    def register(self, ks: KeyStats, code: int) -> None:
        ks.idx = len(self.stats)
        self.stats.append(ks)
        self.codes.append(code)
        self.index = None
        if ks.idx >= len(self.fresh):
            cap = max(64, 2 * len(self.fresh))
            part = np.empty((cap, self.part.shape[1]))
            part[: len(self.part)] = self.part
            fresh = np.zeros(cap, dtype=bool)
            fresh[: len(self.fresh)] = self.fresh
            self.part, self.fresh = part, fresh

    def lookup(self, codes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Ids of keys by code; -1 for keys not registered."""
        import pandas as pd

        if not self.codes:
            return np.full(len(codes), -1, dtype=np.int64)
        if self.index is None:
            self.index = pd.Index(np.asarray(self.codes, dtype=np.int64))
        out: npt.NDArray[np.int64] = self.index.get_indexer(codes).astype(np.int64)
        return out

    def refresh(self, ids: npt.NDArray[np.int64], fn: Any, dense: bool) -> None:
        """Recompute the parts of the stale keys among `ids` (>= 0) with fn(KeyStats)."""
        ids = ids[ids >= 0]
        stale = np.unique(ids[~self.fresh[ids]]).tolist()
        if not stale:
            return
        st = self.stats
        rows = [fn(st[i]) for i in stale]
        if dense:
            d = _dense_many([st[i] for i in stale]).tolist()
            rows = [(*r, v) for r, v in zip(rows, d, strict=True)]
        self.part[stale] = _matrix(rows, self.part.shape[1])
        self.fresh[stale] = True


class RollingState:
    """Everything the features know: updated by job ends, read at job submissions."""

    def __init__(self) -> None:
        self.users: dict[str, KeyStats] = {}
        self.names: dict[tuple[str | None, str], KeyStats] = {}
        self.groups: dict[str, KeyStats] = {}
        self.shapes: dict[tuple[str | None, float], KeyStats] = {}  # user + GPU count: repeats without names
        self.glob = KeyStats(keep=GLOBAL_RECENT)
        self.ended = 0
        # Batch rows (`rows`): users, user + name, groups, user + GPU count interned to ids, each key's
        # own part of a row in an array, marked stale when the key ends (`fresh`).
        self._tables = (_Table(14), _Table(6), _Table(3), _Table(6))
        self._user_ids = _Interner()
        self._name_ids = _Interner()
        self._group_ids = _Interner()
        self._gpu_ids = _Interner()

    # -- updates -------------------------------------------------------------------------------------
    def observe_end(
        self,
        user: str | None,
        group: str | None,
        name: str | None,
        gpus: float,
        start_time: float | None,
        end_time: float,
        state: str,
    ) -> None:
        """One job ended at `end_time`: fold it into its user, user+name, group and the global stats."""
        success = state == SUCCESS
        started = start_time is not None and not math.isnan(start_time)
        log_rt = log_seconds(end_time - start_time) if started else 0.0  # type: ignore[operator]
        self.ended += 1
        self.glob.end(success, end_time, log_rt, started, GLOBAL_WINDOW)
        if user is not None:
            us = self.users.get(user)
            if us is None:
                us = self.users[user] = KeyStats()
            us.end(success, end_time, log_rt, started, USER_WINDOW)
            if us.idx >= 0:
                self._tables[0].fresh[us.idx] = False
        if name is not None:
            key = (user, name)
            ns = self.names.get(key)
            if ns is None:
                ns = self.names[key] = KeyStats()
            ns.end(success, end_time, log_rt, started, NAME_WINDOW)
            if ns.idx >= 0:
                self._tables[1].fresh[ns.idx] = False
        if group is not None:
            gs = self.groups.get(group)
            if gs is None:
                gs = self.groups[group] = KeyStats()
            gs.end(success, end_time, log_rt, started, GROUP_WINDOW)
            if gs.idx >= 0:
                self._tables[2].fresh[gs.idx] = False
        skey = (user, gpus)
        ss = self.shapes.get(skey)
        if ss is None:
            ss = self.shapes[skey] = KeyStats()
        ss.end(success, end_time, log_rt, started, NAME_WINDOW)
        if ss.idx >= 0:
            self._tables[3].fresh[ss.idx] = False

    # -- reads ---------------------------------------------------------------------------------------
    def _parts(self) -> tuple[float, float, tuple[float, ...]]:
        """(prior, a * prior, the cluster's part of a row): one computation per end, shared by all rows."""
        g = self.glob
        if g.memo_at != self.ended:
            prior = (g.succ + 1.0) / (g.n + 2.0)
            g.memo = (
                prior,
                _last(g.recent, 100),
                g.runtime.quantile(0.5),
                g.ttf.quantile(0.5),
                # all of it (GLOBAL_RECENT), smoothed toward the all-time rate as every rate here is:
                # a raw share of 3 ended jobs (0/3) would be a prior of 0 for every new user
                _recent_rate(g.recent_sum, len(g.recent), prior),
            )
            g.memo_at = self.ended
        prior = g.memo[0]
        return prior, PRIOR_STRENGTH * prior, g.memo

    def _user_part(self, us: KeyStats, a_prior: float) -> tuple[float, ...]:
        """A user's part of a row that only changes at job ends (memoised until the next end)."""
        if us.memo_at != self.ended:
            rec = us.recent
            us.memo = (
                float(us.n),
                (us.succ + a_prior) / (us.n + PRIOR_STRENGTH),
                _last(rec, 1),
                _last(rec, 3),
                _last(rec, 10),
                float(us.fail_streak),
                *us.runtime_part(),
            )
            us.memo_at = self.ended
        return us.memo

    def _name_part(
        self, user: str | None, name: str | None, prior: float, a_prior: float
    ) -> tuple[float, ...]:
        """The user + name part of a row (memoised per key until the next end)."""
        ns = self.names.get((user, name)) if name is not None else None
        if ns is None:
            return (0.0, prior, 0.0, NAN, NAN, NAN) if name is not None else (NAN,) * 6
        if ns.memo_at != self.ended:
            ns.memo = (
                float(ns.n),
                (ns.succ + a_prior) / (ns.n + PRIOR_STRENGTH),
                float(ns.fail_streak),
                ns.runtime.quantile(0.5),
                ns.runtime.quantile(0.9),
                ns.ttf.quantile(0.5),
            )
            ns.memo_at = self.ended
        return ns.memo

    def _group_part(self, group: str | None, prior: float, a_prior: float) -> tuple[float, ...]:
        gs = self.groups.get(group) if group is not None else None
        if gs is None:
            return (0.0, prior, NAN) if group is not None else (NAN, NAN, NAN)
        if gs.memo_at != self.ended:
            gs.memo = (float(gs.n), (gs.succ + a_prior) / (gs.n + PRIOR_STRENGTH), gs.runtime.quantile(0.5))
            gs.memo_at = self.ended
        return gs.memo

    def _shape_part(self, user: str | None, gpus: float, prior: float, a_prior: float) -> tuple[float, ...]:
        ss = self.shapes.get((user, gpus))
        if ss is None:
            return (0.0, prior, NAN, NAN, NAN)
        if ss.memo_at != self.ended:
            ss.memo = (
                float(ss.n),
                (ss.succ + a_prior) / (ss.n + PRIOR_STRENGTH),
                ss.runtime.quantile(0.5),
                ss.runtime.recent_median(),
                ss.ttf.quantile(0.5),
            )
            ss.memo_at = self.ended
        return ss.memo

    def row(
        self, user: str | None, group: str | None, name: str | None, gpus: float, t: float
    ) -> tuple[float, ...]:
        """History features of a job submitted at `t` (and count it as a submission of its user).

        Each key's part of the row only changes when a job ends (every rate depends on the cluster's
        rate, so any end), so it is memoised per key until the next end: rows of a batch of pending jobs
        of the same users cost a dictionary lookup each."""
        prior, a_prior, glob = self._parts()
        us = self.users.get(user) if user is not None else None
        if us is not None:
            subs = us.submits
            while subs and subs[0] <= t - SUBMIT_WINDOW_S:
                subs.popleft()
            n_subs = float(len(subs))
            subs.append(t)
            m = self._user_part(us, a_prior)
            u = (
                *m[:6],
                (t - us.last_fail) / 3600.0,
                (t - us.last_success) / 3600.0,
                n_subs,
                *m[6:],
            )
        elif user is not None:
            us = self.users[user] = KeyStats()
            us.submits.append(t)
            u = (0.0, prior, NAN, NAN, NAN, 0.0, NAN, NAN, 0.0, NAN, NAN, NAN, NAN, NAN)
        else:
            u = (NAN, prior, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN)
        ss = self.shapes.get((user, gpus))
        return (
            *u,
            *self._name_part(user, name, prior, a_prior),
            *self._group_part(group, prior, a_prior),
            *self._shape_part(user, gpus, prior, a_prior),
            *glob,
            us.dense() if us is not None else NAN,
            ss.dense() if ss is not None else NAN,
        )

    def rows(
        self,
        users: Sequence[str | None],
        groups: Sequence[str | None],
        names: Sequence[str | None],
        gpus: Sequence[float],
        t: Sequence[float],
    ) -> npt.NDArray[np.float64]:
        """`row` for a batch of new jobs, in order: the same numbers, as one (n, features) array.

        Each key's part (user, user + name, group, user + GPUs) is built once per distinct key and
        gathered with fancy indexing; only the times since the user's last failure / success and the
        submission counts differ per job, and those are vectorised too."""
        n = len(users)
        out = np.empty((n, len(HISTORY_FEATURES)), dtype=np.float64)
        if n == 0:
            return out
        prior, a_prior, glob = self._parts()
        tt = np.asarray(t, dtype=np.float64)
        u_code, u_uniq = _factorize(users)
        udict = self.users
        for user in u_uniq:  # `row` creates a user it has not seen: the same empty history
            if user not in udict:
                udict[user] = KeyStats()
        self._sync()
        T_user, T_name, T_group, T_shape = self._tables
        # Users: each distinct user's id, its own part (refreshed if it ended since), gathered per job.
        u_ids = self._user_ids.lookup(_object_array(u_uniq))
        uid_u = T_user.lookup(u_ids)
        T_user.refresh(uid_u, _user_own, dense=True)
        nu = u_code < 0
        uid = np.append(uid_u, 0)[u_code]  # no user: any row, overwritten below
        U = T_user.part[uid]
        out[:, 0] = U[:, 0]
        out[:, 1] = (U[:, 1] + a_prior) / (U[:, 0] + PRIOR_STRENGTH)
        out[:, 2:6] = U[:, 2:6]
        out[:, 6] = (tt - U[:, 11]) / 3600.0
        out[:, 7] = (tt - U[:, 12]) / 3600.0
        out[:, 9:14] = U[:, 6:11]
        out[:, 33] = U[:, 13]
        if nu.any():
            out[np.ix_(nu, _USER_NAN_COLS)] = NAN
            out[nu, 1] = prior
        u_ic = np.append(u_ids, -1)[u_code] + 1  # interned user + 1 (0: no user), for compound keys
        # User + name.
        narr = _object_array(names)
        n_ids = self._name_ids.lookup(narr)
        nid = T_name.lookup(np.where(n_ids >= 0, u_ic * _KEY_SPAN + n_ids, -1))
        T_name.refresh(nid, _name_own, dense=False)
        N = T_name.part[np.maximum(nid, 0)]
        has = nid >= 0
        out[:, 14] = np.where(has, N[:, 0], 0.0)
        out[:, 15] = np.where(has, (N[:, 1] + a_prior) / (N[:, 0] + PRIOR_STRENGTH), prior)
        out[:, 16] = np.where(has, N[:, 2], 0.0)
        out[:, 17:20] = np.where(has[:, None], N[:, 3:6], NAN)
        no_name = narr == None  # noqa: E711
        out[no_name, 14:20] = NAN
        # Groups.
        garr = _object_array(groups)
        gid = T_group.lookup(self._group_ids.lookup(garr))
        T_group.refresh(gid, _group_own, dense=False)
        G = T_group.part[np.maximum(gid, 0)]
        has = gid >= 0
        out[:, 20] = np.where(has, G[:, 0], 0.0)
        out[:, 21] = np.where(has, (G[:, 1] + a_prior) / (G[:, 0] + PRIOR_STRENGTH), prior)
        out[:, 22] = np.where(has, G[:, 2], NAN)
        out[garr == None, 20:23] = NAN  # noqa: E711
        # User + GPU count.
        gp_ids = self._gpu_ids.lookup(np.asarray(gpus, dtype=np.float64))
        sid = T_shape.lookup(np.where(gp_ids >= 0, u_ic * _KEY_SPAN + gp_ids, -1))
        T_shape.refresh(sid, _shape_own, dense=True)
        S = T_shape.part[np.maximum(sid, 0)]
        has = sid >= 0
        out[:, 23] = np.where(has, S[:, 0], 0.0)
        out[:, 24] = np.where(has, (S[:, 1] + a_prior) / (S[:, 0] + PRIOR_STRENGTH), prior)
        out[:, 25:28] = np.where(has[:, None], S[:, 2:5], NAN)
        out[:, 34] = np.where(has, S[:, 5], NAN)
        out[:, 28:33] = glob
        out[:, 8] = self._count_submits(users, u_code, u_uniq, tt)
        return out

    def _sync(self) -> None:
        """Give an id to every key that appeared since the last batch (dicts keep insertion order, and a
        key, once in them, stays), with an integer code: the interned string, or for a compound key
        (interned user + 1) * _KEY_SPAN + interned name / GPU count."""
        T_user, T_name, T_group, T_shape = self._tables
        ui, ni, gi, pi = self._user_ids, self._name_ids, self._group_ids, self._gpu_ids
        if len(T_user.stats) < len(self.users):
            for uname, ks in islice(self.users.items(), len(T_user.stats), None):
                T_user.register(ks, ui.add(uname))
        if len(T_name.stats) < len(self.names):
            for (n_user, name), ks in islice(self.names.items(), len(T_name.stats), None):
                u = 0 if n_user is None else ui.add(n_user) + 1
                T_name.register(ks, u * _KEY_SPAN + ni.add(name))
        if len(T_group.stats) < len(self.groups):
            for group, ks in islice(self.groups.items(), len(T_group.stats), None):
                T_group.register(ks, gi.add(group))
        if len(T_shape.stats) < len(self.shapes):
            for (s_user, gpus), ks in islice(self.shapes.items(), len(T_shape.stats), None):
                u = 0 if s_user is None else ui.add(s_user) + 1
                T_shape.register(ks, u * _KEY_SPAN + pi.add(gpus))

    def _count_submits(
        self,
        users: Sequence[str | None],
        u_code: npt.NDArray[np.int64],
        u_uniq: list[Any],
        tt: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """Each job's count of its user's submissions in the hour before, then count the job itself, as
        `row` does job by job.

        When every user's times (those queued, then the batch's in order) never go back, the deque steps
        of `row` reduce to binary searches in one array sorted by (user, time); otherwise (jobs first seen
        late) the same deque steps run job by job."""
        res = np.full(len(tt), NAN)
        deques = [self.users[u].submits for u in u_uniq]
        bi = np.flatnonzero(u_code >= 0)
        if len(bi) == 0:
            return res
        quick = _count_submits_quick(deques, u_code[bi], tt[bi])
        if quick is not None:
            res[bi] = quick
            return res
        old_len = np.fromiter(map(len, deques), np.int64, len(deques))
        old_t = np.fromiter(chain.from_iterable(deques), np.float64, int(old_len.sum()))
        codes = np.concatenate([np.repeat(np.arange(len(deques)), old_len), u_code[bi]])
        times = np.concatenate([old_t, tt[bi]])
        order = np.argsort(codes, kind="stable")  # per user: what is queued, then the batch in order
        c_s, t_s = codes[order], times[order]
        if np.any((c_s[1:] == c_s[:-1]) & (t_s[1:] < t_s[:-1])):
            return self._count_submits_slow(users, tt)
        ranks = np.unique(np.concatenate([t_s, tt[bi] - SUBMIT_WINDOW_S]), return_inverse=True)[1]
        m = int(ranks.max()) + 1
        comp = c_s * m + ranks[: len(t_s)]
        pos = np.empty(len(codes), dtype=np.int64)
        pos[order] = np.arange(len(codes))
        bpos = pos[len(old_t) :]  # where each batch job sits in the sorted array
        cut = np.searchsorted(comp, u_code[bi] * m + ranks[len(t_s) :], side="right")
        res[bi] = bpos - cut  # the user's earlier submissions after t - 1 hour
        # What each deque holds afterwards: its user's run from the last job's cut to the end.
        ends = np.searchsorted(c_s, np.arange(1, len(deques) + 1), side="left")
        cut_at = np.empty(len(codes), dtype=np.int64)
        cut_at[bpos] = cut
        keep_from = cut_at[ends - 1].tolist()
        tl = t_s.tolist()
        for d, a, b in zip(deques, keep_from, ends.tolist(), strict=True):
            d.clear()
            d.extend(tl[a:b])
        return res

    def _count_submits_slow(
        self, users: Sequence[str | None], tt: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        res: list[float] = []
        udict = self.users
        w = SUBMIT_WINDOW_S
        for user, ti in zip(users, tt.tolist(), strict=True):
            if user is None:
                res.append(NAN)
                continue
            subs = udict[user].submits
            while subs and subs[0] <= ti - w:
                subs.popleft()
            res.append(float(len(subs)))
            subs.append(ti)
        return np.asarray(res, dtype=np.float64)

    def peek_row(
        self, user: str | None, group: str | None, name: str | None, gpus: float, t: float
    ) -> tuple[float, ...]:
        """Like `row` but leaves the state untouched (for `show` and what-if questions)."""
        us = self.users.get(user) if user is not None else None
        saved = deque(us.submits) if us is not None else None
        r = self.row(user, group, name, gpus, t)
        if user is not None:
            if us is None:
                del self.users[user]
            elif saved is not None:
                us.submits = saved
        return r


@dataclass(slots=True)
class FeatureFrame:
    """Features and labels of a job table, rows sorted by submit time."""

    X: npt.NDArray[np.float64]  # numeric features, columns NUMERIC_FEATURES
    cats: dict[str, npt.NDArray[np.object_]]  # CATEGORICAL_FEATURES -> strings (None when null)
    job_id: npt.NDArray[np.object_]
    user: npt.NDArray[np.object_]
    name: npt.NDArray[np.object_]
    submit: npt.NDArray[np.float64]  # epoch seconds
    start: npt.NDArray[np.float64]  # NaN when not started
    end: npt.NDArray[np.float64]  # NaN when not ended
    state: npt.NDArray[np.object_]
    time_limit: npt.NDArray[np.float64]  # seconds, NaN when unknown
    gpus: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.submit)

    @property
    def ended(self) -> npt.NDArray[np.bool_]:
        """Jobs with a known final state and end time: the only ones with a label."""
        return _labelled(self.state, self.start, self.end, self.job_id)

    @property
    def success(self) -> npt.NDArray[np.bool_]:
        return self.state == SUCCESS

    @property
    def runtime(self) -> npt.NDArray[np.float64]:
        return np.maximum(self.end - self.start, 0.0)

    def col(self, name: str) -> npt.NDArray[np.float64]:
        return self.X[:, NUMERIC_FEATURES.index(name)]

    def take(self, idx: npt.NDArray[np.intp] | npt.NDArray[np.bool_]) -> FeatureFrame:
        return FeatureFrame(
            X=self.X[idx],
            cats={k: v[idx] for k, v in self.cats.items()},
            job_id=self.job_id[idx],
            user=self.user[idx],
            name=self.name[idx],
            submit=self.submit[idx],
            start=self.start[idx],
            end=self.end[idx],
            state=self.state[idx],
            time_limit=self.time_limit[idx],
            gpus=self.gpus[idx],
        )


def _seconds(col: pa.ChunkedArray) -> npt.NDArray[np.float64]:
    us = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64)
    arr: npt.NDArray[np.float64] = us / 1e6
    return arr


def _floats(col: pa.ChunkedArray) -> npt.NDArray[np.float64]:
    return np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _objects(col: pa.ChunkedArray) -> npt.NDArray[np.object_]:
    arr = np.empty(len(col), dtype=object)
    arr[:] = col.to_numpy(zero_copy_only=False)
    return arr


def request_features(
    gpus: npt.NDArray[np.float64],
    nodes: npt.NDArray[np.float64],
    time_limit: npt.NDArray[np.float64],
    submit: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """What the job asks for and when: vectorised, identical for batch and online rows."""
    tl = np.where(np.isnan(time_limit), np.nan, np.log(np.maximum(np.nan_to_num(time_limit, nan=1.0), 1.0)))
    day = np.floor(submit / 86400.0)
    hour = np.floor((submit - day * 86400.0) / 3600.0)
    weekday = (day + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
    return np.column_stack([gpus, nodes, tl, hour, weekday]).astype(np.float64)


def _codes(*cols: npt.NDArray[np.object_]) -> npt.NDArray[np.int64]:
    """Dense integer codes of a (compound) key; -1 where any part of it is null."""
    import pandas as pd

    code = np.zeros(len(cols[0]), dtype=np.int64)
    null = np.zeros(len(cols[0]), dtype=bool)
    for c in cols:
        part, uniq = pd.factorize(c, use_na_sentinel=True)
        null |= part < 0
        code = code * (len(uniq) + 1) + (part + 1)
    code = np.where(null, -1, code)
    _, inv = np.unique(code, return_inverse=True)
    out: npt.NDArray[np.int64] = np.where(null, -1, inv).astype(np.int64)
    return out


def _window_quantiles(
    vals: npt.NDArray[np.float64],
    lo: npt.NDArray[np.int64],
    hi: npt.NDArray[np.int64],
    qs: tuple[float, ...],
    chunk: int = 100_000,
) -> list[npt.NDArray[np.float64]]:
    """Quantiles of vals[lo:hi] per row (`Window.quantile` exactly), NaN for empty windows."""
    n = len(lo)
    outs = [np.full(n, np.nan) for _ in qs]
    if n == 0 or len(vals) == 0:
        return outs
    k = int((hi - lo).max(initial=0))
    if k == 0:
        return outs
    offs = np.arange(k)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        length = hi[a:b] - lo[a:b]
        gidx = lo[a:b, None] + offs
        w = np.where(offs < length[:, None], vals[np.clip(gidx, 0, len(vals) - 1)], np.inf)
        w.sort(axis=1)
        rows = np.arange(b - a)
        for out, q in zip(outs, qs, strict=True):
            j = np.floor(q * (np.maximum(length, 1) - 1) + 0.5).astype(np.int64)
            out[a:b] = np.where(length > 0, w[rows, j], np.nan)
    return outs


def _window_dense(
    vals: npt.NDArray[np.float64], lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """`dense_estimate` of vals[lo:hi] per row (NaN for empty windows), once per distinct window."""
    out = np.full(len(lo), np.nan)
    has = hi > lo
    if not has.any():
        return out
    span = int((hi - lo).max()) + 1
    keys, inv = np.unique(hi[has] * span + (hi - lo)[has], return_inverse=True)
    b = keys // span
    a = b - keys % span
    k = int((b - a).max())
    offs = np.arange(k)
    w = np.where(offs < (b - a)[:, None], vals[np.clip(a[:, None] + offs, 0, len(vals) - 1)], np.inf)
    w.sort(axis=1)
    out[has] = dense_estimate(w)[inv.reshape(-1)]
    return out


@dataclass(slots=True)
class _KeyHistory:
    n: npt.NDArray[np.float64]
    succ: npt.NDArray[np.float64]
    last: dict[int, npt.NDArray[np.float64]]
    streak: npt.NDArray[np.float64]
    last_fail: npt.NDArray[np.float64]
    last_success: npt.NDArray[np.float64]
    rt_med: npt.NDArray[np.float64]
    rt_p90: npt.NDArray[np.float64]
    ttf_med: npt.NDArray[np.float64]
    rt_last: npt.NDArray[np.float64]
    rt_recent: npt.NDArray[np.float64]
    rt_dense: npt.NDArray[np.float64]


def _key_history(
    qkey: npt.NDArray[np.int64],
    qrank: npt.NDArray[np.int64],
    ekey: npt.NDArray[np.int64],
    erank: npt.NDArray[np.int64],
    erow: npt.NDArray[np.int64],
    eend: npt.NDArray[np.float64],
    esucc: npt.NDArray[np.bool_],
    elrt: npt.NDArray[np.float64],
    estarted: npt.NDArray[np.bool_],
    m: int,
    window: int,
) -> _KeyHistory:
    """What `KeyStats` would hold for each query's key at its submit rank, from sorted ends + searchsorted."""
    keep = ekey >= 0
    o = np.lexsort((erow[keep], erank[keep], ekey[keep]))
    ekey, erank = ekey[keep][o], erank[keep][o]
    eend, elrt = eend[keep][o], elrt[keep][o]
    esucc, estarted = esucc[keep][o], estarted[keep][o]
    comp = ekey * m + erank
    valid = qkey >= 0
    qk = np.where(valid, qkey, 0)
    qcomp = qk * m + qrank
    qorder = np.argsort(qcomp, kind="stable")  # sorted needles make the binary searches cache-friendly
    n_keys = int(qk.max(initial=0)) + 1

    def search(c: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(position of each query's submit rank, start of its key) in sorted composite keys c."""
        pos = np.empty(len(qcomp), dtype=np.int64)
        pos[qorder] = np.searchsorted(c, qcomp[qorder], side="left")
        start = np.searchsorted(c, np.arange(n_keys, dtype=np.int64) * m, side="left")[qk]
        return np.where(valid, pos, start), start

    idx, ks = search(comp)
    n = (idx - ks).astype(np.float64)
    s_cum = np.concatenate([[0], np.cumsum(esucc)])
    succ = (s_cum[idx] - s_cum[ks]).astype(np.float64)
    last: dict[int, npt.NDArray[np.float64]] = {}
    for k in (1, 3, 10, 100, GLOBAL_RECENT):
        lo = np.maximum(idx - k, ks)
        cnt = idx - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            last[k] = np.where(cnt > 0, (s_cum[idx] - s_cum[lo]) / np.maximum(cnt, 1), np.nan)
    pos = np.arange(len(comp))
    ls = np.maximum.accumulate(np.where(esucc, pos, -1)) if len(comp) else pos
    lf = np.maximum.accumulate(np.where(~esucc, pos, -1)) if len(comp) else pos
    prev = np.clip(idx - 1, 0, max(len(comp) - 1, 0))
    has = idx > ks
    ls_q = np.where(has, ls[prev] if len(comp) else -1, -1)
    lf_q = np.where(has, lf[prev] if len(comp) else -1, -1)
    streak = np.where(has, (idx - 1) - np.maximum(ls_q, ks - 1), 0).astype(np.float64)
    safe_end = eend if len(eend) else np.zeros(1)
    last_success = np.where(ls_q >= ks, safe_end[np.clip(ls_q, 0, None)], np.nan)
    last_fail = np.where(lf_q >= ks, safe_end[np.clip(lf_q, 0, None)], np.nan)

    def windowed(
        sel: npt.NDArray[np.bool_], qs: tuple[float, ...], w: int = window
    ) -> list[npt.NDArray[np.float64]]:
        i2, k2 = search(comp[sel])
        return _window_quantiles(elrt[sel], np.maximum(i2 - w, k2), i2, qs)

    rt_med, rt_p90 = windowed(esucc, (0.5, 0.9))
    (ttf_med,) = windowed(~esucc & estarted, (0.5,))
    (rt_last,) = windowed(esucc, (1.0,), 1)
    (rt_recent,) = windowed(esucc, (0.5,), RECENT)
    i2, k2 = search(comp[esucc])
    rt_dense = _window_dense(elrt[esucc], np.maximum(i2 - DENSE_WINDOW, k2), i2)
    return _KeyHistory(
        n, succ, last, streak, last_fail, last_success, rt_med, rt_p90, ttf_med, rt_last, rt_recent, rt_dense
    )


def _vector_history(
    users: npt.NDArray[np.object_],
    groups: npt.NDArray[np.object_],
    names: npt.NDArray[np.object_],
    submit: npt.NDArray[np.float64],
    start: npt.NDArray[np.float64],
    end: npt.NDArray[np.float64],
    state: npt.NDArray[np.object_],
    ended: npt.NDArray[np.bool_],
    gpus: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """The same history features as the event sweep, computed with sorts and binary searches."""
    n = len(submit)
    er = np.flatnonzero(ended)
    # Integer ranks of every time involved, so (key, time) pairs compare as one int64.
    pool = np.concatenate([submit, end[er], submit - SUBMIT_WINDOW_S])
    _, inv = np.unique(pool, return_inverse=True)
    m = int(inv.max(initial=0)) + 2
    q_rank = inv[:n].astype(np.int64)
    e_rank = inv[n : n + len(er)].astype(np.int64)
    h_rank = inv[n + len(er) :].astype(np.int64)
    e_end = end[er]
    e_succ = state[er] == SUCCESS
    e_started = ~np.isnan(start[er])
    e_lrt = np.where(e_started, np.log(np.maximum(np.nan_to_num(e_end - start[er], nan=0.0), 1.0)), 0.0)
    e_lrt = np.where(e_started, e_lrt, 0.0)
    user_c = _codes(users)
    name_c = _codes(np.where(pd_isnull(users), "\x00none", users).astype(object), names)
    group_c = _codes(groups)
    shape_c = _codes(np.where(pd_isnull(users), "\x00none", users).astype(object), gpus.astype(object))
    glob_c = np.zeros(n, dtype=np.int64)

    def hist(codes: npt.NDArray[np.int64], window: int) -> _KeyHistory:
        return _key_history(
            codes, q_rank, codes[er], e_rank, er.astype(np.int64), e_end, e_succ, e_lrt, e_started, m, window
        )

    g = hist(glob_c, GLOBAL_WINDOW)
    u = hist(user_c, USER_WINDOW)
    nm = hist(name_c, NAME_WINDOW)
    gr = hist(group_c, GROUP_WINDOW)
    sh = hist(shape_c, NAME_WINDOW)
    prior = (g.succ + 1.0) / (g.n + 2.0)
    a = PRIOR_STRENGTH
    a_prior = a * prior

    def rate(h: _KeyHistory) -> npt.NDArray[np.float64]:
        r: npt.NDArray[np.float64] = (h.succ + a_prior) / (h.n + a)
        return r

    # Submissions of the same user in the last hour, before this one in sweep order.
    has_u = user_c >= 0
    uc = np.where(has_u, user_c, 0)
    o = np.lexsort((np.arange(n), q_rank, uc))
    comp = uc[o] * m + q_rank[o]
    pos_in = np.empty(n, dtype=np.int64)
    pos_in[o] = np.arange(n)
    first_recent = np.searchsorted(comp, uc * m + h_rank, side="right")
    subs = (pos_in - first_recent).astype(np.float64)

    nan = np.full(n, np.nan)
    nu = ~has_u
    has_n = name_c >= 0
    has_g = group_c >= 0

    def u_(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.where(nu, np.nan, x)

    cols = [
        u_(u.n),
        np.where(nu, prior, rate(u)),
        u_(u.last[1]),
        u_(u.last[3]),
        u_(u.last[10]),
        u_(u.streak),
        u_((submit - u.last_fail) / 3600.0),
        u_((submit - u.last_success) / 3600.0),
        u_(subs),
        u_(u.rt_med),
        u_(u.rt_p90),
        u_(u.ttf_med),
        u_(u.rt_last),
        u_(u.rt_recent),
        np.where(has_n, nm.n, nan),
        np.where(has_n, rate(nm), nan),
        np.where(has_n, nm.streak, nan),
        np.where(has_n, nm.rt_med, nan),
        np.where(has_n, nm.rt_p90, nan),
        np.where(has_n, nm.ttf_med, nan),
        np.where(has_g, gr.n, nan),
        np.where(has_g, rate(gr), nan),
        np.where(has_g, gr.rt_med, nan),
        sh.n,
        rate(sh),
        sh.rt_med,
        sh.rt_recent,
        sh.ttf_med,
        prior,
        g.last[100],
        g.rt_med,
        g.ttf_med,
        recent_rate(g.last[GLOBAL_RECENT], np.minimum(g.n, GLOBAL_RECENT), prior),
        u_(u.rt_dense),
        sh.rt_dense,
    ]
    return np.column_stack(cols).astype(np.float64)


def _recent_rate(succ: float, count: int, prior: float) -> float:
    """`recent_rate` for one row (RollingState)."""
    if count >= GLOBAL_RECENT:
        return succ / count
    return (succ + PRIOR_STRENGTH * prior) / (count + PRIOR_STRENGTH) if count else NAN


def recent_rate(
    share: npt.NDArray[np.float64], count: npt.NDArray[np.float64], prior: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The cluster's recent success share over `count` ended jobs, smoothed toward the all-time `prior`
    with PRIOR_STRENGTH pseudo-jobs (NaN while nothing has ended), as RollingState computes it."""
    with np.errstate(invalid="ignore"):
        succ = np.rint(share * count)  # the whole number of successes the share was taken from
    smoothed = (succ + PRIOR_STRENGTH * prior) / (count + PRIOR_STRENGTH)
    out: npt.NDArray[np.float64] = np.where(
        count >= GLOBAL_RECENT, share, np.where(count > 0, smoothed, np.nan)
    )
    return out


def _matrix(rows: list[tuple[float, ...]], width: int) -> npt.NDArray[np.float64]:
    """A (len(rows), width) array from tuples: one flat pass (numpy's nested-sequence path is slower)."""
    flat = np.fromiter(chain.from_iterable(rows), np.float64, len(rows) * width)
    return flat.reshape(len(rows), width)


def _factorize(values: Sequence[Any]) -> tuple[npt.NDArray[np.int64], list[Any]]:
    """(codes, distinct values in first-seen order); None gets code -1."""
    import pandas as pd

    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    codes, uniq = pd.factorize(arr, use_na_sentinel=True)
    return codes.astype(np.int64), list(uniq)


def pd_isnull(a: npt.NDArray[np.object_]) -> npt.NDArray[np.bool_]:
    return np.array([v is None for v in a.tolist()], dtype=bool) if len(a) else np.zeros(0, bool)


def _sweep_history(
    users: npt.NDArray[np.object_],
    groups: npt.NDArray[np.object_],
    names: npt.NDArray[np.object_],
    submit: npt.NDArray[np.float64],
    start: npt.NDArray[np.float64],
    end: npt.NDArray[np.float64],
    state: npt.NDArray[np.object_],
    ended: npt.NDArray[np.bool_],
    gpus: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Reference path: one Python pass over time-sorted events through a `RollingState`."""
    n = len(submit)
    end_rows = np.flatnonzero(ended)
    times = np.concatenate([submit, end[end_rows]])
    kinds = np.concatenate([np.zeros(n, np.int8), np.ones(len(end_rows), np.int8)])
    rows = np.concatenate([np.arange(n), end_rows])
    ev = np.lexsort((rows, kinds, times))  # by time, then submissions before ends, then row
    st = RollingState()
    u_l, g_l, n_l, s_l, gp_l = users.tolist(), groups.tolist(), names.tolist(), submit.tolist(), gpus.tolist()
    start_l, end_l, state_l = start.tolist(), end.tolist(), state.tolist()
    hist: list[tuple[float, ...]] = [()] * n
    for kind, i in zip(kinds[ev].tolist(), rows[ev].tolist(), strict=True):
        if kind == 0:
            hist[i] = st.row(u_l[i], g_l[i], n_l[i], gp_l[i], s_l[i])
        else:
            st.observe_end(u_l[i], g_l[i], n_l[i], gp_l[i], start_l[i], end_l[i], state_l[i])
    return np.array(hist, dtype=np.float64).reshape(n, len(HISTORY_FEATURES))


def build_features(table: pa.Table, *, include_cpu: bool = False, method: str = "vector") -> FeatureFrame:
    """Causal features for every job of `table` that has a submit time (and GPUs, unless include_cpu).

    Submit and end events are ordered by time; at equal times submissions come first, so a job ending
    exactly when another is submitted is not visible to it ("ended strictly before"). `method="sweep"`
    replays the events through `RollingState` (the online path); the default computes the same numbers
    with sorts and binary searches, O(N log N) and fast enough for millions of jobs.
    """
    keep = pc.is_valid(table.column("submit_time"))
    if not include_cpu:
        keep = pc.and_(keep, pc.greater(pc.fill_null(table.column("gpus"), 0.0), 0.0))
    table = table.filter(keep)
    submit = _seconds(table.column("submit_time"))
    order = submit_order(submit, table)  # ties in one order, whatever the rows' order (headway.schema)
    table = table.take(pa.array(order))
    submit = submit[order]
    start = _seconds(table.column("start_time"))
    end = _seconds(table.column("end_time"))
    state = _objects(table.column("state"))
    users = _objects(table.column("user"))
    groups = _objects(table.column("group"))
    names = _objects(table.column("name"))
    job_ids = _objects(table.column("job_id"))
    ended = _labelled(state, start, end, job_ids)
    gpus = np.nan_to_num(_floats(table.column("gpus")), nan=0.0)
    fn = _sweep_history if method == "sweep" else _vector_history
    h_arr = fn(users, groups, names, submit, start, end, state, ended, gpus)
    nodes = np.nan_to_num(_floats(table.column("nodes")), nan=1.0)
    time_limit = _floats(table.column("time_limit"))
    X = np.hstack([h_arr, request_features(gpus, nodes, time_limit, submit)])
    return FeatureFrame(
        X=X,
        cats={
            "partition": _objects(table.column("partition")),
            "priority_class": _objects(table.column("priority_class")),
            "group": groups,
        },
        job_id=job_ids,
        user=users,
        name=names,
        submit=submit,
        start=start,
        end=end,
        state=state,
        time_limit=time_limit,
        gpus=gpus,
    )


def replay_state(frame: FeatureFrame, before: float) -> RollingState:
    """The rolling state as it stood at `before`: every job that ended strictly before it, in end order."""
    st = RollingState()
    mask = frame.ended & (frame.end < before)
    idx = np.flatnonzero(mask)
    idx = idx[np.argsort(frame.end[idx], kind="stable")]
    for i in idx.tolist():
        st.observe_end(
            frame.user[i],
            frame.cats["group"][i],
            frame.name[i],
            frame.gpus[i],
            frame.start[i],
            frame.end[i],
            frame.state[i],
        )
    return st
