"""What every policy is fed besides the jobs: fair-share usage, shares and failure streaks, kept one way.

The simulator, the local queue and the Slurm adapter each keep one `PolicyBook` and build every
snapshot through `PolicyBook.snapshot`, so the same history gives the same snapshot whichever of them
runs it (tests/test_policy_inputs.py feeds one history to all three).

Usage is Slurm's decayed usage (PriorityDecayHalfLife): a job's GPU-seconds accrue while it runs and
every GPU-second decays by half each half-life after it was used. In closed form, a run of g GPUs from s
to e counts g * (2^-((now-e)/h) - 2^-((now-s)/h)) * h / ln 2 at `now`. The book keeps, per user, sums
from which any `now` is a few vector operations over users, whatever the number of jobs.

Shares are equal among the users seen so far (any job submitted, pending, running or ended).
A failure streak is the number of a key's own failures in a row (`STREAK_FAILURES`) with no success
since; the key is `streak_key`. The audit's repeat-failure view uses the same key rule and state sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from headway.policy.snapshot import F64, I64, ClusterView, PendingJobs, RunningJobs, Snapshot
from headway.schema import OWN_FAILURE_STATES, State

HALF_LIFE_S = 7 * 86400.0  # Slurm's default PriorityDecayHalfLife
# The states that extend a failure streak (the owner's own failures) and the one that ends it. Any other
# end (a node failure, a cancellation, a preemption) neither extends nor ends it: one bad node must not
# hold back a user's sweep.
STREAK_FAILURES: frozenset[str] = OWN_FAILURE_STATES
STREAK_SUCCESS: str = State.COMPLETED.value
_REANCHOR = 400.0  # re-anchor the per-user sums when 2^(this) would be reached (float64 holds 2^1023)

StreakKey = tuple[str, str, str]


def streak_key(
    user: str | None, name: str | None, group: str | None, *, log_has_names: bool
) -> StreakKey | None:
    """One job's failure-streak key: its user and name, else its user and group; in a log where no job has
    a name or a group, its user alone. None (never in a streak): no user, or a nameless, groupless job in a
    log with names (it is not lumped in with every other nameless job of its user)."""
    if not user:
        return None
    if name:
        return (user, "name", name)
    if group:
        return (user, "group", group)
    return (user, "user", "") if not log_has_names else None


class UsageLedger:
    """Decayed GPU-seconds per user (see the module docstring), users interned to dense indices.

    Per user: `ended` (runs over), and for its running jobs `rate` (their GPUs) and `started` (their
    GPUs times 2^((start - t0)/h)); usage at `now` is D * ended + (rate - D * started) * h / ln 2 with
    D = 2^(-(now - t0)/h). `t0` moves forward (every sum rescaled) before the exponents grow large.
    """

    def __init__(self, half_life_s: float = HALF_LIFE_S, t0: float = 0.0, users: Sequence[str] = ()) -> None:
        self.half_life_s = half_life_s
        self.lam = math.log(2) / half_life_s
        self.t0 = t0
        self.users: list[str] = []
        self.index: dict[str, int] = {}
        self._ended = np.zeros(0)
        self._rate = np.zeros(0)
        self._started = np.zeros(0)
        self.seen = np.zeros(0, dtype=bool)
        self._n_seen = 0
        self._shares = np.zeros(0)
        self._usage = np.zeros(0)
        self._usage_at = math.nan
        for u in users:
            self.user(u)

    def user(self, name: str) -> int:
        """The dense index of user `name` (added, not yet seen, when new)."""
        i = self.index.get(name)
        if i is not None:
            return i
        i = self.index[name] = len(self.users)
        self.users.append(name)
        if i >= len(self._ended):
            size = max(8, 2 * len(self._ended))
            self._ended, self._rate, self._started, self._usage, self._shares = (
                _grown(a, size) for a in (self._ended, self._rate, self._started, self._usage, self._shares)
            )
            self.seen = np.concatenate([self.seen, np.zeros(size - len(self.seen), dtype=bool)])
        return i

    def see(self, u: int) -> None:
        """User `u` has submitted a job: it counts among the users the shares divide between."""
        if not self.seen[u]:
            self.seen[u] = True
            self._n_seen += 1
            self._shares[: len(self.users)] = np.where(self.seen[: len(self.users)], 1.0 / self._n_seen, 0.0)

    def _weight(self, t: float) -> float:
        """2^((t - t0)/h), re-anchoring first when it would grow too large."""
        x = self.lam * (t - self.t0)
        if x > _REANCHOR * math.log(2):
            self._reanchor(t)
            x = 0.0
        return math.exp(x)

    def _reanchor(self, t: float) -> None:
        d = math.exp(-self.lam * (t - self.t0))
        self._ended *= d
        self._started *= d
        self.t0 = t

    # Each weight is taken before any sum is read: `_weight` may re-anchor (rescale every sum), and
    # `a[u] += f()` reads a[u] before calling f, so that user's sum would miss the rescaling. The later
    # time's weight comes first, so that the earlier one is taken at the same anchor.

    def start(self, u: int, gpus: float, t: float) -> None:
        """User u's job of `gpus` GPUs started running at t."""
        w = self._weight(t)
        self._rate[u] += gpus
        self._started[u] += gpus * w
        self._usage_at = math.nan

    def stop(self, u: int, gpus: float, start: float, t: float) -> None:
        """User u's job that `start`ed at `start` stopped at t: its run moves to the ended sum."""
        we = self._weight(t)
        ws = self._weight(start)
        self._rate[u] -= gpus
        self._started[u] -= gpus * ws
        self._ended[u] += gpus * (we - ws) / self.lam
        self._usage_at = math.nan

    def add_run(self, u: int, gpus: float, start: float, end: float) -> None:
        """A run that is over (history): the same sums `start` then `stop` leave."""
        if end > start:
            we = self._weight(end)
            ws = self._weight(start)
            self._ended[u] += gpus * (we - ws) / self.lam
            self._usage_at = math.nan

    def usage(self, now: float) -> F64:
        """Every user's decayed GPU-seconds at `now`, to the milli-GPU-second (read-only; valid until the
        next change). Rounded so that the order in which runs were added leaves no trace in a tie."""
        if now != self._usage_at:
            n = len(self.users)
            d = math.exp(-self.lam * (now - self.t0))
            _closed_form(self._usage[:n], d, self.lam, self._ended[:n], self._rate[:n], self._started[:n])
            self._usage_at = now
        v = self._usage[: len(self.users)].view()
        v.flags.writeable = False
        return v

    def running_gpus(self) -> F64:
        """Per user, the GPUs of its jobs running now (as `start` and `stop` left them; validate())."""
        return self._rate[: len(self.users)].copy()

    def usage_with_running(self, now: float, users: I64, gpus: F64, starts: F64) -> F64:
        """Every user's usage at `now` as if `start(users[i], gpus[i], starts[i])` had been called for each
        running job in turn, leaving the ledger as it is: an adapter that reads its running jobs afresh
        every pass (the local queue, the Slurm sync) adds them per snapshot without counting them twice.
        The same sums, re-anchoring and closed form as `start` then `usage`: the same bits (a new array)."""
        n = len(self.users)
        t0, lam, limit = self.t0, self.lam, _REANCHOR * math.log(2)
        ended, rate, started = self._ended[:n].copy(), self._rate[:n].copy(), self._started[:n].copy()
        for u, g, s in zip(users.tolist(), gpus.tolist(), starts.tolist(), strict=True):
            x = lam * (s - t0)
            if x > limit:  # `_weight` would re-anchor the ledger here: re-anchor the copies alike
                d = math.exp(-lam * (s - t0))
                ended *= d
                started *= d
                t0, x = s, 0.0
            rate[u] += g
            started[u] += g * math.exp(x)
        out = np.empty(n)
        _closed_form(out, math.exp(-lam * (now - t0)), lam, ended, rate, started)
        out.flags.writeable = False
        return out

    def shares(self) -> F64:
        """Normalised shares: equal among the users seen, 0 for the others (read-only view)."""
        v = self._shares[: len(self.users)].view()
        v.flags.writeable = False
        return v


class FailureStreaks:
    """Failures in a row per streak key, keys interned to dense indices (-1: a job with no key)."""

    def __init__(self) -> None:
        self.index: dict[StreakKey, int] = {}
        # One slot past the keys stays 0: a job without a key (-1) reads it and is never held.
        self._count = np.zeros(9, dtype=np.int64)

    def key(self, k: StreakKey | None) -> int:
        if k is None:
            return -1
        i = self.index.get(k)
        if i is None:
            i = self.index[k] = len(self.index)
            if i + 1 >= len(self._count):
                self._count = _grown(self._count, 2 * len(self._count))
                self._count[-1] = 0
        return i

    def observe(self, key: int, state: str) -> None:
        """A job of streak `key` ended in `state`."""
        if key < 0:
            return
        if state == STREAK_SUCCESS:
            self._count[key] = 0
        elif state in STREAK_FAILURES:
            self._count[key] += 1

    def of(self, keys: I64) -> I64:
        """The streak of each key (0 for -1)."""
        return self._count[keys]

    def count(self, k: StreakKey | None) -> int:
        i = self.index.get(k) if k is not None else None
        return 0 if i is None else int(self._count[i])


@dataclass(slots=True)
class PendingColumns:
    """A snapshot's pending jobs before the book adds what it keeps (fail streaks): PendingJobs' columns
    but `fail_streak`, and each job's streak key index (`FailureStreaks.key`)."""

    key: I64
    job_id: npt.NDArray[np.object_]
    user: I64  # index into the book's users
    klass: I64
    submit: F64
    gpus: F64
    max_nodes: I64
    time_limit: F64
    p_success: F64
    runtime: F64
    runtime_p90: F64
    time_to_failure: F64
    attained: F64
    last_stop: F64
    streak_key: I64
    oracle_runtime: F64 | None = None
    oracle_success: npt.NDArray[np.bool_] | None = None


@dataclass(slots=True)
class PolicyBook:
    """The inputs an adapter keeps between passes, and the one way to build a policy's Snapshot."""

    ledger: UsageLedger
    streaks: FailureStreaks
    classes: Sequence[str]

    @classmethod
    def new(
        cls,
        classes: Sequence[str],
        half_life_s: float = HALF_LIFE_S,
        t0: float = 0.0,
        users: Sequence[str] = (),
    ) -> PolicyBook:
        return cls(UsageLedger(half_life_s, t0, users), FailureStreaks(), classes)

    def ended(self, u: int, streak: int, state: str, gpus: float, start: float | None, end: float) -> None:
        """A job that ended before the adapter started watching (its history), in end order."""
        self.ledger.see(u)
        if start is not None:
            self.ledger.add_run(u, gpus, start, end)
        self.streaks.observe(streak, state)

    def fail_streak(
        self, user: str | None, name: str | None, group: str | None = None, *, log_has_names: bool = True
    ) -> int:
        """One job's failure streak now, by the job's fields (`streak_key`): what `why` tells a held job."""
        return self.streaks.count(streak_key(user, name, group, log_has_names=log_has_names))

    def snapshot(
        self,
        now: float,
        seq: int,
        pending: PendingColumns,
        running: RunningJobs,
        cluster: ClusterView,
        *,
        running_in_ledger: bool = True,
        lazy_usage: bool = False,
    ) -> Snapshot:
        """The policy's Snapshot. `running_in_ledger`: the ledger was told of every running job through
        `start` (the simulator); False for an adapter that reads its running jobs afresh each pass (the
        local queue, the Slurm sync): their usage so far is added for this snapshot alone
        (`UsageLedger.usage_with_running`), so repeated snapshots never count a run twice. `lazy_usage`:
        usage is computed when a policy first reads it (the simulator's passes, valid while the pass runs:
        most rank a queue whose order needs no fair share)."""
        p = pending
        jobs = PendingJobs(
            p.key, p.job_id, p.user, p.klass, p.submit, p.gpus, p.max_nodes, p.time_limit, p.p_success,
            p.runtime, p.runtime_p90, p.time_to_failure, p.attained, p.last_stop,
            self.streaks.of(p.streak_key), p.oracle_runtime, p.oracle_success,
        )  # fmt: skip
        ledger = self.ledger
        usage: F64 | Callable[[], F64]
        if running_in_ledger and lazy_usage:
            usage = partial(ledger.usage, now)
        elif running_in_ledger:
            usage = ledger.usage(now)
        else:
            usage = ledger.usage_with_running(now, running.user, running.gpus, running.start)
        return Snapshot(now, seq, jobs, running, cluster, ledger.users, self.classes, usage, ledger.shares())


# ---- rows: what an adapter reads of one job, before the book interns its user and streak key ----
#
# The local queue and the Slurm sync fill these rows from their own records and build every column through
# `pending_columns`, `running_jobs` and `add_ended`: no adapter has a copy of the column building.


@dataclass(frozen=True, slots=True)
class PendingRow:
    """One pending job as an adapter reads it (times in epoch seconds)."""

    key: int  # the adapter's stable integer handle (Decision and Ranking refer to it)
    job_id: str
    user: str
    name: str | None
    group: str | None
    klass: str  # one of the book's classes
    submit: float
    gpus: float
    max_nodes: int
    time_limit: float  # NaN: no limit
    p_success: float
    runtime: float
    runtime_p90: float
    time_to_failure: float
    attained: float = 0.0
    last_stop: float | None = None  # None: its submit time


@dataclass(frozen=True, slots=True)
class RunningRow:
    """One running job as an adapter reads it: its current run started at `start`."""

    key: int
    job_id: str
    user: str
    klass: str
    gpus: float
    start: float
    time_limit: float
    runtime: float
    runtime_p90: float
    attained: float = 0.0
    preemptible: bool = False
    p_success: float = math.nan
    time_to_failure: float = math.nan
    last_preempted: float = math.nan  # epoch seconds of its last preemption; NaN: never
    checkpoint_every: float = math.nan  # seconds; NaN: the policies' default
    probe: bool = False  # a fail-fast probe run (Start.probe_s)


@dataclass(frozen=True, slots=True)
class EndedRow:
    """One ended job of an adapter's history; `start` None: it never ran."""

    user: str
    name: str | None
    group: str | None
    state: str
    gpus: float
    start: float | None
    end: float


def add_ended(book: PolicyBook, rows: Iterable[EndedRow], *, log_has_names: bool) -> None:
    """Ended jobs into the book, in end order (a streak is the order of its ends)."""
    ledger, streaks = book.ledger, book.streaks
    for r in rows:
        key = streaks.key(streak_key(r.user, r.name, r.group, log_has_names=log_has_names))
        book.ended(ledger.user(r.user), key, r.state, r.gpus, r.start, r.end)


def _seen_users(book: PolicyBook, users: Iterable[str]) -> I64:
    """Each user's index, every one marked seen (a pending or running job counts its user among the
    users the shares divide between)."""
    ledger = book.ledger
    out = []
    for name in users:
        u = ledger.user(name)
        ledger.see(u)
        out.append(u)
    return np.array(out, dtype=np.int64)


def _klass(book: PolicyBook, names: Iterable[str]) -> I64:
    index = {c: i for i, c in enumerate(book.classes)}
    return np.array([index[c] for c in names], dtype=np.int64)


def _col(values: Iterable[float]) -> F64:
    return np.fromiter(values, dtype=np.float64)


def pending_columns(book: PolicyBook, rows: Sequence[PendingRow], *, log_has_names: bool) -> PendingColumns:
    """The pending jobs' columns for `PolicyBook.snapshot`: users interned and seen, streak keys interned
    by `streak_key` (the same `log_has_names` as the history's `add_ended`)."""
    keys = book.streaks
    return PendingColumns(
        key=np.array([r.key for r in rows], dtype=np.int64),
        job_id=np.array([r.job_id for r in rows], dtype=object),
        user=_seen_users(book, (r.user for r in rows)),
        klass=_klass(book, (r.klass for r in rows)),
        submit=_col(r.submit for r in rows),
        gpus=_col(r.gpus for r in rows),
        max_nodes=np.array([r.max_nodes for r in rows], dtype=np.int64),
        time_limit=_col(r.time_limit for r in rows),
        p_success=_col(r.p_success for r in rows),
        runtime=_col(r.runtime for r in rows),
        runtime_p90=_col(r.runtime_p90 for r in rows),
        time_to_failure=_col(r.time_to_failure for r in rows),
        attained=_col(r.attained for r in rows),
        last_stop=_col(r.submit if r.last_stop is None else r.last_stop for r in rows),
        streak_key=np.array(
            [keys.key(streak_key(r.user, r.name, r.group, log_has_names=log_has_names)) for r in rows],
            dtype=np.int64,
        ),
    )


def running_jobs(book: PolicyBook, rows: Sequence[RunningRow]) -> RunningJobs:
    """The running jobs' columns for `PolicyBook.snapshot`: users interned and seen."""
    return RunningJobs(
        key=np.array([r.key for r in rows], dtype=np.int64),
        job_id=np.array([r.job_id for r in rows], dtype=object),
        user=_seen_users(book, (r.user for r in rows)),
        klass=_klass(book, (r.klass for r in rows)),
        gpus=_col(r.gpus for r in rows),
        start=_col(r.start for r in rows),
        time_limit=_col(r.time_limit for r in rows),
        runtime=_col(r.runtime for r in rows),
        runtime_p90=_col(r.runtime_p90 for r in rows),
        attained=_col(r.attained for r in rows),
        preemptible=np.array([r.preemptible for r in rows], dtype=bool),
        p_success=_col(r.p_success for r in rows),
        time_to_failure=_col(r.time_to_failure for r in rows),
        last_preempted=_col(r.last_preempted for r in rows),
        checkpoint_every=_col(r.checkpoint_every for r in rows),
        probe=np.array([r.probe for r in rows], dtype=bool),
    )


def _closed_form(out: F64, d: float, lam: float, ended: F64, rate: F64, started: F64) -> None:
    """Usage into `out`: (rate - d * started) / lam + d * ended, clipped at 0, to the milli-GPU-second.
    One sequence of operations for `usage` and `usage_with_running`, so that both give the same bits."""
    np.multiply(started, -d, out)
    np.add(out, rate, out)
    np.multiply(out, 1.0 / lam, out)
    out += d * ended
    np.maximum(out, 0.0, out=out)
    out.round(3, out)


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=a.dtype)
    out[: len(a)] = a
    return out
