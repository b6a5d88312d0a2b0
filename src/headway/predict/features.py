"""Causal features: a job submitted at t sees only jobs that ended strictly before t.

One rolling state (`RollingState`) computes them, for both uses. Job ends update it (`observe_end`);
submissions read it (`_Reader`: each key's part of a row, taken from its `KeyStats` and kept until that
key's next end, then one vectorised assembly for all the rows read). The batch build (`build_features`)
replays a table's submit and end events through it in time order; the online path (`rows` for a batch of
new jobs, `row` for one) reads it at the current time. There is no second implementation of any feature:
the features a model is trained on are the ones it is served because both come out of the same code.
"""

from __future__ import annotations

import gc
import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

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


# History features, in the order `RollingState.rows` returns them.
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
# Request features, computed straight from the job (`request_features`, for batch and online rows).
REQUEST_FEATURES: tuple[str, ...] = ("gpus", "nodes", "log_time_limit", "hour", "weekday")
CATEGORICAL_FEATURES: tuple[str, ...] = ("partition", "priority_class", "group")
NUMERIC_FEATURES: tuple[str, ...] = HISTORY_FEATURES + REQUEST_FEATURES
H = {name: i for i, name in enumerate(HISTORY_FEATURES)}


def log_seconds(seconds: float) -> float:
    """Runtimes live in log space (a 1 s floor keeps zero-length jobs finite)."""
    return math.log(max(seconds, 1.0))


class Window:
    """The last K values in arrival order plus the same values sorted: O(K) update, O(1) quantiles."""

    __slots__ = ("_summary", "order", "sorted")

    def __init__(self) -> None:
        self.order: deque[float] = deque()
        self.sorted: list[float] = []
        self._summary: tuple[float, float, float, float] | None = (NAN, NAN, NAN, NAN)

    def add(self, value: float, k: int, keep: int = 0) -> None:
        """Add a value: `sorted` holds the last k, `order` the last max(k, keep) (for `last_sorted`)."""
        o, s = self.order, self.sorted
        o.append(value)
        insort(s, value)
        self._summary = None
        if len(o) > k:
            del s[bisect_left(s, o[-k - 1])]
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
        last = sorted(list(o)[-k:])
        return last[int(0.5 * (len(last) - 1) + 0.5)]

    def last_sorted(self, k: int) -> list[float]:
        return sorted(list(self.order)[-k:])

    def summary(self) -> tuple[float, float, float, float]:
        """(median, p90, last value, `recent_median`), kept until the next `add`."""
        summary = self._summary
        if summary is None:
            s, m = self.sorted, len(self.sorted) - 1  # the rank rule of `quantile`
            summary = self._summary = (
                s[int(0.5 * m + 0.5)],
                s[int(0.9 * m + 0.5)],
                self.order[-1],
                self.recent_median(),
            )
        return summary


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


# DENSE_RANGES as arrays (inclusive edges widened by DENSE_EPS): `_dense_block` takes all three at once.
_DENSE_SHIFT = np.array([shift for shift, _, _ in DENSE_RANGES])
_DENSE_LO = np.array([lo - DENSE_EPS for _, lo, _ in DENSE_RANGES])
_DENSE_HI = np.array([hi + DENSE_EPS for _, _, hi in DENSE_RANGES])


def _dense_block(w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """`dense_estimate` of a block of windows: the three candidate ranges in one broadcast, not a loop, as
    an online arrival computes one window at a time and pays per numpy call, not per value."""
    n, k = w.shape
    m = len(DENSE_RANGES) * k  # candidates per row
    valid = np.isfinite(w)
    length = valid.sum(axis=1)
    med = w[np.arange(n), np.maximum(length, 1) // 2]  # Window.quantile(0.5)'s rank, int(0.5 (len - 1) + 0.5)
    with np.errstate(invalid="ignore"):  # inf - inf beyond the window: NaN, never counted
        d = w[:, None, :] - w[:, :, None]  # d[r, i, j] = y_j - y_i
        lo, hi = _DENSE_LO[:, None, None, None], _DENSE_HI[:, None, None, None]
        c = ((d >= lo) & (d <= hi)).sum(axis=3)  # c[s, r, i]: values of row r in range s around y_i
        # each row's candidates y_i + shift and their counts, range after range (DENSE_RANGES' order)
        cnt = np.where(valid, c, -1).transpose(1, 0, 2).reshape(n, m)
        cand = (w + _DENSE_SHIFT[:, None, None]).transpose(1, 0, 2).reshape(n, m)
        best = cnt.max(axis=1, keepdims=True)
        dist = np.where(cnt == best, np.abs(cand - med[:, None]), np.inf)
    near = dist <= dist.min(axis=1, keepdims=True) + DENSE_EPS
    pick: npt.NDArray[np.float64] = np.where(near, cand, np.inf).min(axis=1)
    return np.where(length > 0, pick, np.nan)


class KeyStats:
    """Rolling history of one key (a user, a user+name, a group, a user+GPU count, the cluster)."""

    __slots__ = (
        "dense_memo",
        "dense_ok",
        "fail_streak",
        "last_fail",
        "last_success",
        "memo",
        "memo_at",
        "n",
        "outcomes",
        "runtime",
        "submits",
        "succ",
        "ttf",
        "waiting",
    )

    def __init__(self, keep: int = 100) -> None:
        self.n = 0
        self.succ = 0
        self.fail_streak = 0
        self.last_fail = NAN
        self.last_success = NAN
        # Successes so far after each of the last `keep` ends (and before them): the successes among the
        # last k ends are a difference of two entries, so any "last k" rate is O(1).
        self.outcomes: deque[int] = deque([0], maxlen=keep + 1)
        self.runtime = Window()
        self.ttf = Window()
        self.submits: deque[float] = deque()  # the user's submission times of the last hour
        self.memo: tuple[float, ...] = ()  # this key's part of a row, valid while memo_at == n
        self.memo_at = -1
        self.dense_memo = NAN  # the mode-seeking runtime, valid while dense_ok (until the next success)
        self.dense_ok = True
        self.waiting: tuple[_Reader, int, int] | None = None  # a reader computing it: (reader, succ, window)

    def end(self, success: bool, end_time: float, log_rt: float, started: bool, k: int) -> None:
        self.n += 1
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
        self.outcomes.append(self.succ)

    def last(self, k: int) -> float:
        """Success share of the key's last k ended jobs (fewer while it has fewer; NaN for none)."""
        o = self.outcomes
        m = min(k, len(o) - 1)
        return (o[-1] - o[-1 - m]) / m if m else NAN


def _recent_rate(succ: float, count: int, prior: float) -> float:
    """The cluster's success share over its last `count` (<= GLOBAL_RECENT) ended jobs, smoothed toward the
    all-time `prior` with PRIOR_STRENGTH pseudo-jobs until it has all GLOBAL_RECENT; NaN while none ended."""
    if count >= GLOBAL_RECENT:
        return succ / count
    return (succ + PRIOR_STRENGTH * prior) / (count + PRIOR_STRENGTH) if count else NAN


# Each key's own part of a row: what changes only when the key's own jobs end. The rates need the
# cluster's prior as well, so `_Reader._flush` finishes them from (jobs ended, successes).
def _user_part(us: KeyStats) -> tuple[float, ...]:
    """n, successes, last 1 / 3 / 10, failure streak, runtime median / p90, time-to-failure median,
    last runtime, recent-5 median, last failure and success times."""
    med, p90, last, recent = us.runtime.summary()
    return (
        float(us.n),
        float(us.succ),
        us.last(1),
        us.last(3),
        us.last(10),
        float(us.fail_streak),
        med,
        p90,
        us.ttf.quantile(0.5),
        last,
        recent,
        us.last_fail,
        us.last_success,
    )


def _name_part(ns: KeyStats) -> tuple[float, ...]:
    med, p90, _, _ = ns.runtime.summary()
    return (float(ns.n), float(ns.succ), float(ns.fail_streak), med, p90, ns.ttf.quantile(0.5))


def _group_part(gs: KeyStats) -> tuple[float, ...]:
    return (float(gs.n), float(gs.succ), gs.runtime.quantile(0.5))


def _shape_part(ss: KeyStats) -> tuple[float, ...]:
    med, _, _, recent = ss.runtime.summary()
    return (float(ss.n), float(ss.succ), med, recent, ss.ttf.quantile(0.5))


def _global_part(g: KeyStats) -> tuple[float, ...]:
    """The cluster's part: all-time rate (the prior of every other rate), last 100, runtime and
    time-to-failure medians, and the last GLOBAL_RECENT smoothed toward the all-time rate (a raw share of
    3 ended jobs, 0/3, would be a prior of 0 for every new user)."""
    prior = (g.succ + 1.0) / (g.n + 2.0)
    return (
        prior,
        g.last(100),
        g.runtime.quantile(0.5),
        g.ttf.quantile(0.5),
        _recent_rate(g.outcomes[-1] - g.outcomes[0], len(g.outcomes) - 1, prior),
    )


_EMPTY = KeyStats()  # a key with no ended job yet: its part is that of an empty history
_EMPTY_NAME, _EMPTY_GROUP, _EMPTY_SHAPE = _name_part(_EMPTY), _group_part(_EMPTY), _shape_part(_EMPTY)
_NO_USER, _NO_NAME, _NO_GROUP = (NAN,) * 13, (NAN,) * 6, (NAN,) * 3  # a job without one: all NaN
# A raw row of `_Reader`: the parts of the user (0-12), user + name (13-18), group (19-21), user + GPUs
# (22-26) and the cluster (27-31), then the submit time, the user's submissions in the hour before, and
# the user's and shape's mode-seeking runtimes.
_RAW_WIDTH = 36
_T, _SUBS, _USER_DENSE, _SHAPE_DENSE = 32, 33, 34, 35
# Each history feature's column in the raw row; None: computed from several in `_Reader._flush`.
_RAW_OF: dict[str, int | None] = {
    "user_jobs_ended": 0,
    "user_success_rate": None,
    "user_last1": 2,
    "user_last3": 3,
    "user_last10": 4,
    "user_fail_streak": 5,
    "user_hours_since_failure": None,
    "user_hours_since_success": None,
    "user_submits_last_hour": _SUBS,
    "user_log_runtime_median": 6,
    "user_log_runtime_p90": 7,
    "user_log_ttf_median": 8,
    "user_log_runtime_last": 9,
    "user_log_runtime_recent5": 10,
    "name_jobs_ended": 13,
    "name_success_rate": None,
    "name_fail_streak": 15,
    "name_log_runtime_median": 16,
    "name_log_runtime_p90": 17,
    "name_log_ttf_median": 18,
    "group_jobs_ended": 19,
    "group_success_rate": None,
    "group_log_runtime_median": 21,
    "shape_jobs_ended": 22,
    "shape_success_rate": None,
    "shape_log_runtime_median": 24,
    "shape_log_runtime_recent5": 25,
    "shape_log_ttf_median": 26,
    "global_success_rate": 27,
    "global_last100": 28,
    "global_log_runtime_median": 29,
    "global_log_ttf_median": 30,
    "global_last500": 31,
    "user_log_runtime_dense": _USER_DENSE,
    "shape_log_runtime_dense": _SHAPE_DENSE,
}
assert tuple(_RAW_OF) == HISTORY_FEATURES
_TAKE = np.array([0 if c is None else c for c in _RAW_OF.values()])
# Rates: successes (raw column) over jobs (raw column) with PRIOR_STRENGTH pseudo-jobs at the prior.
_RATE_OUT = np.array([H[f"{k}_success_rate"] for k in ("user", "name", "group", "shape")])
_RATE_N, _RATE_SUCC = np.array([0, 13, 19, 22]), np.array([1, 14, 20, 23])
_HOURS_OUT = np.array([H["user_hours_since_failure"], H["user_hours_since_success"]])
_LAST_END = np.array([11, 12])  # the user's last failure and success times
_CHUNK = 8192  # rows per `_Reader._flush`


class _Reader:
    """Feature rows read from a `RollingState`, one `add` per submission, in order; `matrix` returns them.

    `add` appends a job's raw row (see _RAW_OF): the parts of its user, user + name, group, user + GPU
    count and the cluster (a key's part is built once per end of that key and shared by every job that
    reads it), and counts the job as a submission of its user. Every _CHUNK jobs (and at the end)
    `_flush` turns raw rows into feature rows: the mode-seeking estimates still to compute, in one
    vectorised call, then the rates and times since the user's last failure and success."""

    __slots__ = ("done", "n", "raw", "st", "wait_keys", "wait_pos", "wait_win", "windows")

    def __init__(self, st: RollingState) -> None:
        self.st = st
        self.done: list[npt.NDArray[np.float64]] = []
        self.raw: list[float] = []  # the raw rows since the last flush, one after the other
        self.n = 0  # rows in `raw`
        # Mode-seeking runtimes still to compute: their places in `raw` and their windows' in `windows`.
        self.wait_pos: list[int] = []
        self.wait_win: list[int] = []
        self.windows: list[list[float]] = []
        self.wait_keys: list[tuple[KeyStats, int]] = []  # per window: its key and the key's `succ` then

    def _wait(self, ks: KeyStats, col: int) -> float:
        """NaN for now in the current row's column `col`, where `_flush` puts the key's mode-seeking runtime:
        its window of runtimes is queued once per success of the key."""
        w = ks.waiting
        if w is None or w[0] is not self or w[1] != ks.succ:
            w = ks.waiting = (self, ks.succ, len(self.windows))
            self.windows.append(ks.runtime.last_sorted(DENSE_WINDOW))
            self.wait_keys.append((ks, ks.succ))
        self.wait_pos.append(self.n * _RAW_WIDTH + col)
        self.wait_win.append(w[2])
        return NAN

    def add(self, user: str | None, group: str | None, name: str | None, gpus: float, t: float) -> None:
        st, put = self.st, self.raw.extend
        us = None
        if user is None:
            put(_NO_USER)
            n_subs = NAN
        else:
            us = st.users.get(user)
            if us is None:  # a new user: an empty history, and its submissions count from here
                us = st.users[user] = KeyStats()
            if us.memo_at != us.n:
                us.memo, us.memo_at = _user_part(us), us.n
            put(us.memo)
            subs = us.submits
            while subs and subs[0] <= t - SUBMIT_WINDOW_S:
                subs.popleft()
            n_subs = float(len(subs))
            subs.append(t)
        ns = st.names.get((user, name)) if name is not None else None
        if ns is None:
            put(_NO_NAME if name is None else _EMPTY_NAME)
        else:
            if ns.memo_at != ns.n:
                ns.memo, ns.memo_at = _name_part(ns), ns.n
            put(ns.memo)
        gs = st.groups.get(group) if group is not None else None
        if gs is None:
            put(_NO_GROUP if group is None else _EMPTY_GROUP)
        else:
            if gs.memo_at != gs.n:
                gs.memo, gs.memo_at = _group_part(gs), gs.n
            put(gs.memo)
        ss = st.shapes.get((user, gpus))
        if ss is None:
            put(_EMPTY_SHAPE)
        else:
            if ss.memo_at != ss.n:
                ss.memo, ss.memo_at = _shape_part(ss), ss.n
            put(ss.memo)
        g = st.glob
        if g.memo_at != g.n:
            g.memo, g.memo_at = _global_part(g), g.n
        put(g.memo)
        u_dense = NAN if us is None else us.dense_memo if us.dense_ok else self._wait(us, _USER_DENSE)
        s_dense = NAN if ss is None else ss.dense_memo if ss.dense_ok else self._wait(ss, _SHAPE_DENSE)
        put((t, n_subs, u_dense, s_dense))
        self.n += 1
        if self.n >= _CHUNK:
            self._flush()

    def matrix(self) -> npt.NDArray[np.float64]:
        """The rows read so far, as one (n, len(HISTORY_FEATURES)) array in HISTORY_FEATURES order."""
        if self.n or not self.done:
            self._flush()
        return self.done[0] if len(self.done) == 1 else np.concatenate(self.done)

    def _flush(self) -> None:
        """Turn the raw rows added since the last flush into feature rows (see the class)."""
        raw = np.array(self.raw, dtype=np.float64).reshape(self.n, _RAW_WIDTH)
        if self.windows:
            est = dense_estimate(self.windows)
            raw.flat[self.wait_pos] = est[self.wait_win]
            for (ks, succ), v in zip(self.wait_keys, est.tolist(), strict=True):
                ks.waiting = None
                if ks.succ == succ:  # its runtimes are still those: keep the estimate until they change
                    ks.dense_memo, ks.dense_ok = v, True
        out = raw[:, _TAKE]
        prior = raw[:, 27]
        n_jobs = raw[:, _RATE_N]
        rates = (raw[:, _RATE_SUCC] + (PRIOR_STRENGTH * prior)[:, None]) / (n_jobs + PRIOR_STRENGTH)
        rates[:, 0] = np.where(np.isnan(n_jobs[:, 0]), prior, rates[:, 0])  # a job without a user: the prior
        out[:, _RATE_OUT] = rates  # NaN for a job without a name or group
        out[:, _HOURS_OUT] = (raw[:, _T, None] - raw[:, _LAST_END]) / 3600.0
        self.done.append(out)
        self.raw, self.n = [], 0
        for waiting in (self.wait_pos, self.wait_win, self.windows, self.wait_keys):
            waiting.clear()


class RollingState:
    """Everything the features know: updated by job ends, read at job submissions."""

    def __init__(self) -> None:
        self.users: dict[str, KeyStats] = {}
        self.names: dict[tuple[str | None, str], KeyStats] = {}
        self.groups: dict[str, KeyStats] = {}
        self.shapes: dict[tuple[str | None, float], KeyStats] = {}  # user + GPU count: repeats without names
        self.glob = KeyStats(keep=GLOBAL_RECENT)

    @property
    def ended(self) -> int:
        """Jobs folded in so far."""
        return self.glob.n

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
        """One job ended at `end_time`: fold it into its user, user+name, group, shape and the cluster."""
        success = state == SUCCESS
        started = start_time is not None and not math.isnan(start_time)
        log_rt = log_seconds(end_time - start_time) if started else 0.0  # type: ignore[operator]
        self.glob.end(success, end_time, log_rt, started, GLOBAL_WINDOW)
        if user is not None:
            us = self.users.get(user)
            if us is None:
                us = self.users[user] = KeyStats()
            us.end(success, end_time, log_rt, started, USER_WINDOW)
        if name is not None:
            ns = self.names.get((user, name))
            if ns is None:
                ns = self.names[(user, name)] = KeyStats()
            ns.end(success, end_time, log_rt, started, NAME_WINDOW)
        if group is not None:
            gs = self.groups.get(group)
            if gs is None:
                gs = self.groups[group] = KeyStats()
            gs.end(success, end_time, log_rt, started, GROUP_WINDOW)
        ss = self.shapes.get((user, gpus))
        if ss is None:
            ss = self.shapes[(user, gpus)] = KeyStats()
        ss.end(success, end_time, log_rt, started, NAME_WINDOW)

    def rows(
        self,
        users: Sequence[str | None],
        groups: Sequence[str | None],
        names: Sequence[str | None],
        gpus: Sequence[float],
        t: Sequence[float],
    ) -> npt.NDArray[np.float64]:
        """History features of new jobs submitted at times `t`, in order (each counted as a submission of
        its user before the next is read), as one (n, len(HISTORY_FEATURES)) array."""
        r = _Reader(self)
        add = r.add
        for job in zip(users, groups, names, gpus, t, strict=True):
            add(*job)
        return r.matrix()

    def row(
        self, user: str | None, group: str | None, name: str | None, gpus: float, t: float
    ) -> tuple[float, ...]:
        """`rows` for one job."""
        r = _Reader(self)
        r.add(user, group, name, gpus, t)
        return tuple(r.matrix()[0].tolist())

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


_LARGEST = float(np.finfo(np.float64).max)


def request_features(
    gpus: npt.NDArray[np.float64],
    nodes: npt.NDArray[np.float64],
    time_limit: npt.NDArray[np.float64],
    submit: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """What the job asks for and when: vectorised, identical for batch and online rows.

    The log time limit floors the limit at a second; no limit (NaN) stays NaN and an infinite one counts
    as the largest float, as it did through nan_to_num (which alone cost a third of this for one job)."""
    tl = np.log(np.clip(time_limit, 1.0, _LARGEST))
    day = np.floor(submit / 86400.0)
    hour = np.floor((submit - day * 86400.0) / 3600.0)
    weekday = (day + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
    return np.column_stack([gpus, nodes, tl, hour, weekday]).astype(np.float64, copy=False)


def _history(
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
    """History features of every job: its submit and the labelled jobs' ends, replayed through one
    `RollingState` in time order (at equal times submissions first, then by row)."""
    n = len(submit)
    end_rows = np.flatnonzero(ended)
    times = np.concatenate([submit, end[end_rows]])
    kinds = np.concatenate([np.zeros(n, np.int8), np.ones(len(end_rows), np.int8)])
    rows = np.concatenate([np.arange(n), end_rows])
    ev = np.lexsort((rows, kinds, times))
    kinds, rows = kinds[ev], rows[ev]
    st = RollingState()
    reader = _Reader(st)
    read, observe = reader.add, st.observe_end
    u_l, g_l, n_l, s_l, gp_l = users.tolist(), groups.tolist(), names.tolist(), submit.tolist(), gpus.tolist()
    start_l, end_l, state_l = start.tolist(), end.tolist(), state.tolist()
    gc_was_on = gc.isenabled()
    gc.disable()  # the replay makes no reference cycles; collections would only rescan the state, often
    try:
        for kind, i in zip(kinds.tolist(), rows.tolist(), strict=True):
            if kind == 0:
                read(u_l[i], g_l[i], n_l[i], gp_l[i], s_l[i])
            else:
                observe(u_l[i], g_l[i], n_l[i], gp_l[i], start_l[i], end_l[i], state_l[i])
    finally:
        if gc_was_on:
            gc.enable()
    out = np.empty((n, len(HISTORY_FEATURES)), dtype=np.float64)
    out[rows[kinds == 0]] = reader.matrix()  # rows in the order they were read
    return out


def build_features(table: pa.Table, *, include_cpu: bool = False) -> FeatureFrame:
    """Causal features for every job of `table` that has a submit time (and GPUs, unless include_cpu).

    Submit and end events are ordered by time; at equal times submissions come first, so a job ending
    exactly when another is submitted is not visible to it ("ended strictly before")."""
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
    h_arr = _history(users, groups, names, submit, start, end, state, ended, gpus)
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
