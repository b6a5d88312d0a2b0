"""The discrete-event engine: a heap of (time, order, seq) events and one policy pass per instant.

At one instant, ends go first (their GPUs free up and the predictor learns them), then arrivals (they
get predictions in one batch), then the scheduling pass, which applies the policy's Decision. Time only
moves to the next event: there is no tick. A job's truth (recorded runtime and final state) lives in
`Truth`, which only this module reads; policies get a `Snapshot` built from what a scheduler knows.
Arrivals come from the submit-sorted job arrays through a cursor, not the heap, so a million-job trace
never sits in the heap at once; the policy's wake-up times have a heap of their own. A pass over a
queue of one job that fits, and a pass where nothing can be placed, take shortcuts with the same
results (`EngineOptions.single_fast`).
"""

from __future__ import annotations

import heapq
import math
import time as wallclock
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headway.policy.placement import LiveIndex, place_fresh
from headway.policy.policies import Policy
from headway.policy.snapshot import (
    F64,
    FULL_SHARE,
    I64,
    Allocation,
    ClusterView,
    Decision,
    PendingJobs,
    RunningJobs,
    Snapshot,
)
from headway.predict.api import EndedJob, OnlinePredictor, SubmittedJob
from headway.schema import OWN_FAILURE_STATES, State
from headway.sim.cluster import Cluster
from headway.sim.result import JOB_COLUMNS, TIMELINE_COLUMNS, UNKNOWN_USER, SimResult, WaitRecord

_DONE = State.COMPLETED.value  # the one final state that counts as success (oracle outcome)
END, ARRIVAL, PASS = 0, 1, 2  # same-instant order: ends, then arrivals, then the scheduling pass
DAY = 86400.0


@dataclass(slots=True)
class JobArrays:
    """What a scheduler can know of each job, sorted by submit (index = the job's key)."""

    job_id: npt.NDArray[np.object_]
    user: I64  # index into users
    group: npt.NDArray[np.object_]
    name: npt.NDArray[np.object_]
    name_key: I64  # index of (user, name), or of (user, group) where the log has no names; -1: neither
    klass: I64  # index into classes
    partition: npt.NDArray[np.object_]
    submit: F64  # seconds on the simulation clock
    gpus: F64
    nodes: I64
    time_limit: F64  # NaN when none
    users: list[str]
    classes: list[str]
    epoch0: float  # epoch seconds of simulation time 0 (the predictor sees real timestamps)

    def __len__(self) -> int:
        return len(self.submit)


@dataclass(frozen=True, slots=True)
class Truth:
    """The recorded runtime and final state: read by the engine (and an oracle policy) only."""

    runtime: F64
    state: npt.NDArray[np.object_]

    def __reduce__(self) -> tuple[type[Truth], tuple[F64, npt.NDArray[np.object_]]]:
        """Pickle through the constructor (see cluster.NodeSpec.__reduce__)."""
        return (Truth, (self.runtime, self.state))


@dataclass(slots=True)
class EngineOptions:
    usage_half_life_s: float = 7 * DAY
    retrain_every_s: float = DAY
    repredict_limit: int = 50_000  # re-predict the queue after a retrain when it is at most this long
    explain: frozenset[str] = frozenset()
    progress: Callable[[int, int], None] | None = None
    validate: bool = False  # check cluster invariants after every change (tests)
    log_decisions: bool = False
    # Without the shortcuts (snapshot copies, no kept rack totals, vector predictions): tests compare
    # both ways, which must give identical results.
    reference: bool = False
    # For a policy with `single_fast`: a pass over a queue of one job goes straight to the policy's own
    # placement (`Policy.place_one`) when the job fits, and a pass where no pending job can be placed
    # only asks for its wake-up: no snapshot, no Decision. Off: every pass is a full `decide` (tests
    # compare both ways).
    single_fast: bool = True


class _Set:
    """A dense set of job keys with O(1) add and swap-remove, plus per-key columns kept alongside, so
    a snapshot copies contiguous slices instead of gathering from million-row arrays.

    The float and integer columns (and the keys) are `array`s seen by numpy through `_shared`: add and
    remove move plain items, a snapshot slices the numpy views."""

    def __init__(
        self, size: int, sources: dict[str, np.ndarray], items: dict[str, Sequence[Any]] | None = None
    ) -> None:
        """`items`: the same values as some sources, as `array`s or lists sharing their memory or
        contents, read by `add` (a plain item is cheaper to read than a numpy scalar)."""
        size = max(size, 1)
        self.key_a, self.keys = _shared(np.zeros(size, dtype=np.int64))
        self.pos = array("q", [-1]) * size
        self.n = 0
        self.sources = sources
        self.cols: dict[str, np.ndarray] = {}
        got = items or {}
        self._pairs: list[tuple[Any, Any]] = []  # (the column as written, its source as read)
        for name, src in sources.items():
            buf: Any
            if src.dtype == np.float64 or src.dtype == np.int64:
                buf, self.cols[name] = _shared(np.zeros(size, dtype=src.dtype))
            else:
                buf = self.cols[name] = np.empty(size, dtype=src.dtype)
            self._pairs.append((buf, got.get(name, src)))
        # Read-only views of the whole buffers, made once: their slices are read-only too, so a snapshot
        # costs one slice per column.
        self.ro = {name: _ro(buf) for name, buf in self.cols.items()}
        self.ro_keys = _ro(self.keys)

    def add(self, key: int) -> int:
        i = self.n
        self.key_a[i] = key
        self.pos[key] = i
        for buf, src in self._pairs:
            buf[i] = src[key]
        self.n = i + 1
        return i

    def remove(self, key: int) -> int:
        """Remove `key`; returns the key moved into its slot (or -1)."""
        i = self.pos[key]
        last = self.n - 1
        moved = -1
        if i != last:
            moved = self.key_a[last]
            self.key_a[i] = moved
            self.pos[moved] = i
            for buf, _ in self._pairs:
                buf[i] = buf[last]
        self.pos[key] = -1
        self.n = last
        return moved

    def refresh(self, names: tuple[str, ...]) -> None:
        """Re-read columns from their sources (after a re-prediction)."""
        k = self.keys[: self.n]
        for name in names:
            self.cols[name][: self.n] = self.sources[name][k]

    def view(self) -> I64:
        return self.keys[: self.n]


def _pending(
    keys: I64,
    cols: list[np.ndarray],
    streak: I64,
    oracle: F64 | None,
    oracle_ok: npt.NDArray[np.bool_] | None,
) -> PendingJobs:
    """PendingJobs from the columns in the engine's order (see `snapshot` in Engine.run)."""
    job_id, user, klass, submit, gpus, max_nodes, limit, p, rt, rt90, ttf, attained, last_stop = cols
    return PendingJobs(
        keys, job_id, user, klass, submit, gpus, max_nodes, limit, p, rt, rt90, ttf, attained, last_stop,
        streak, oracle, oracle_ok,
    )  # fmt: skip


def _running(keys: I64, cols: list[np.ndarray], preemptible: npt.NDArray[np.bool_]) -> RunningJobs:
    job_id, user, klass, gpus, start, limit, rt, rt90, attained = cols
    return RunningJobs(keys, job_id, user, klass, gpus, start, limit, rt, rt90, attained, preemptible)


def _ints(a: np.ndarray) -> array[int]:
    return array("q", a.astype(np.int64).tobytes())


def _shared(a: np.ndarray) -> tuple[array[Any], np.ndarray]:
    """`a` (float64 or int64) as an `array` and a numpy view of the same memory: the event loop reads
    and writes single items through the `array` (plain floats and ints), vector code uses the view."""
    buf = array("d" if a.dtype == np.float64 else "q", a.tobytes())
    return buf, np.frombuffer(buf, dtype=a.dtype)


def _at_least_1(x: float) -> float:
    """`np.maximum(x, 1.0)` on one float (NaN stays NaN)."""
    return x if x >= 1.0 or x != x else 1.0


def _single_fast(pol: Policy) -> bool:
    """Whether the policy's pass over a queue of one that fits is its `place_one` and `wake_one`."""
    cls = type(pol)

    def owner(name: str) -> type | None:
        return next((c for c in cls.__mro__ if name in c.__dict__), None)

    return (
        pol.single_fast
        and owner("preemptions") is Policy
        and owner("decide") is Policy
        and owner("rank") is Policy
        and owner("wake_one") is owner("wake_at")
        and owner("wake_queue") is owner("wake_at")
    )


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only view (the engine keeps writing the original)."""
    v = a.view()
    v.setflags(write=False)
    return v


@dataclass(slots=True)
class Engine:
    jobs: JobArrays
    truth: Truth
    cluster: Cluster
    policy: Policy
    predictor: OnlinePredictor
    opts: EngineOptions = field(default_factory=EngineOptions)

    def run(self) -> SimResult:
        t_wall = wallclock.perf_counter()
        J, T, C, pol = self.jobs, self.truth, self.cluster, self.policy
        n = len(J)
        max_gpn = C.spec.max_node_gpus
        whole = np.where(J.gpus >= 1.0, np.ceil(J.gpus - 1e-9), 0).astype(np.int64)
        milli = np.where((J.gpus > 0) & (J.gpus < 1.0), np.maximum(1, np.round(J.gpus * FULL_SHARE)), 0)
        milli = milli.astype(np.int64)
        need_nodes = np.where(max_gpn > 0, np.ceil(whole / max(max_gpn, 1)), 1).astype(np.int64)
        max_nodes = np.maximum(np.maximum(J.nodes, 1), need_nodes)
        # Compact copies for per-job reads in the event loop (an array item is a plain int or float,
        # several times cheaper to read than a numpy scalar).
        whole_a, milli_a, mnodes_a = _ints(whole), _ints(milli), _ints(max_nodes)
        user_a, gpus_a = _ints(J.user), array("d", J.gpus.astype(np.float64).tobytes())
        submit = array("d", J.submit.astype(np.float64).tobytes())
        # Per-job mutable state (`_shared`: an `array` for single items, a numpy view of it for vectors).
        p_succ_a, p_succ = _shared(np.full(n, np.nan))
        r_pred_a, r_pred = _shared(np.full(n, np.nan))
        r_p90_a, r_p90 = _shared(np.full(n, np.nan))
        ttf_a, ttf = _shared(np.full(n, np.nan))
        p_first_a, p_first = _shared(np.full(n, np.nan))
        r_first_a, r_first = _shared(np.full(n, np.nan))
        # Per-job scalars the event loop reads and writes one at a time: `array` items are plain floats
        # and ints, several times cheaper than numpy scalars.
        first_start, end_t = array("d", bytes(8 * n)), array("d", bytes(8 * n))
        for buf in (first_start, end_t):
            np.frombuffer(buf, dtype=np.float64)[:] = np.nan
        run_start_a, run_start = _shared(np.zeros(n))
        remaining = array("d", T.runtime.astype(np.float64).tobytes())
        runtime_a = array("d", T.runtime.astype(np.float64).tobytes())
        attained_a, attained = _shared(np.zeros(n))
        last_stop_a, last_stop = _shared(J.submit.astype(np.float64))
        epoch = array("q", bytes(8 * n))
        preemptions_a, preemptions = _shared(np.zeros(n, dtype=np.int64))
        restarts_a, restarts = _shared(np.zeros(n, dtype=np.int64))
        nodes_used_a, nodes_used = _shared(np.zeros(n, dtype=np.int64))
        racks_used_a, racks_used = _shared(np.zeros(n, dtype=np.int64))
        used_gpus: dict[int, list[tuple[int, int]]] = {}
        frac_at: dict[int, tuple[int, int]] = {}  # running fractional jobs' GPU (ClusterView.frac_at)
        n_names = int(J.name_key.max(initial=-1)) + 2
        # last slot (-1) stays 0: unnamed jobs never hold
        streak_a, streak = _shared(np.zeros(n_names, dtype=np.int64))
        # Numbers as `array` items (plain ints and floats, cheaper to read than numpy scalars).
        klass_l, nodes_l = _ints(J.klass), _ints(J.nodes)
        limit_l = array("d", J.time_limit.astype(np.float64).tobytes())
        name_key_a = _ints(J.name_key)
        pend = _Set(
            n,
            {
                "job_id": J.job_id,
                "user": J.user,
                "klass": J.klass,
                "submit": J.submit,
                "gpus": J.gpus,
                "max_nodes": max_nodes,
                "time_limit": J.time_limit,
                "p_success": p_succ,
                "runtime": r_pred,
                "runtime_p90": r_p90,
                "time_to_failure": ttf,
                "attained": attained,
                "last_stop": last_stop,
                "name_key": J.name_key,
                **({"oracle": T.runtime, "oracle_ok": T.state == _DONE} if pol.oracle else {}),
            },
            {
                "user": user_a,
                "klass": klass_l,
                "submit": submit,
                "gpus": gpus_a,
                "max_nodes": mnodes_a,
                "time_limit": limit_l,
                "p_success": p_succ_a,
                "runtime": r_pred_a,
                "runtime_p90": r_p90_a,
                "time_to_failure": ttf_a,
                "attained": attained_a,
                "last_stop": last_stop_a,
                "name_key": name_key_a,
            },
        )
        runb = _Set(
            n,
            {
                "job_id": J.job_id,
                "user": J.user,
                "klass": J.klass,
                "gpus": J.gpus,
                "start": run_start,
                "time_limit": J.time_limit,
                "runtime": r_pred,
                "runtime_p90": r_p90,
                "attained": attained,
            },
            {
                "user": user_a,
                "klass": klass_l,
                "gpus": gpus_a,
                "start": run_start_a,
                "time_limit": limit_l,
                "runtime": r_pred_a,
                "runtime_p90": r_p90_a,
                "attained": attained_a,
            },
        )
        pend_sizes: Counter[tuple[int, int]] = Counter()  # (whole, max_nodes) of pending whole-GPU jobs
        pend_milli: Counter[int] = Counter()
        n_users = len(J.users)
        # Decayed GPU usage per user, kept per user: `base` at `t_at`, then `rate` GPUs since. A start or
        # an end moves its user's alone (`fold`); a snapshot computes every user's at its time (`usage`).
        base_a, base = _shared(np.zeros(n_users))
        t_at_a, t_at = _shared(np.zeros(n_users))
        rate_a, rate = _shared(np.zeros(n_users))
        usage = np.zeros(n_users)
        usage_t = -math.inf  # the time `usage` was computed for, while no user's rate changed since
        seen_user = np.zeros(n_users, dtype=bool)
        seen_l = [False] * n_users
        shares = np.zeros(n_users)
        tmp_d, tmp_c = np.zeros(n_users), np.zeros(n_users)
        lam = math.log(2) / self.opts.usage_half_life_s
        explain_keys = (
            {i for i, j in enumerate(J.job_id) if j in self.opts.explain} if self.opts.explain else set()
        )
        explain: dict[str, list[WaitRecord]] = {str(J.job_id[k]): [] for k in explain_keys}
        tl = {c: array("d") for c in TIMELINE_COLUMNS}
        completed = 0
        goodput = 0.0
        heap: list[tuple[float, int, int, int, int]] = []  # ends: (time, order, seq, key, epoch)
        # Wake-up times, apart: plain floats compare faster than tuples, and at one instant they come
        # after the ends and arrivals anyway (PASS).
        wake_heap: list[float] = []
        seq = 0
        nxt = 0  # arrival cursor
        passes = 0
        events = 0
        done = 0
        decisions: list[Decision] = []
        next_retrain = self.opts.retrain_every_s
        preemptive = type(pol).preemptions is not Policy.preemptions
        has_wake = type(pol).wake_at is not Policy.wake_at
        progress = self.opts.progress
        prog_step = max(n // 200, 1)
        reported = 0
        ep0 = J.epoch0
        ref = self.opts.reference

        subs: dict[int, SubmittedJob] = {}  # made at arrival, reused at the job's end
        # The text columns as lists: an item of a list is a plain read, of an object array a numpy call.
        jid_l, group_l, name_l, part_l = (
            J.job_id.tolist(),
            J.group.tolist(),
            J.name.tolist(),
            J.partition.tolist(),
        )

        def submitted(k: int) -> SubmittedJob:
            sj = subs.get(k)
            if sj is not None:
                return sj
            tl_ = limit_l[k]
            sj = subs[k] = SubmittedJob(
                str(jid_l[k]),
                J.users[user_a[k]],
                group_l[k],
                name_l[k],
                part_l[k],
                J.classes[klass_l[k]],
                ep0 + submit[k],
                gpus_a[k],
                nodes_l[k],
                None if math.isnan(tl_) else tl_,
            )
            return sj

        # A predictor's scalar path for one arrival (api.ScalarPredictor), when it has one.
        one: Callable[[SubmittedJob, float], tuple[float, float, float, float]] | None = getattr(
            self.predictor, "predict_one", None
        )

        def predict(keys: list[int], now: float) -> None:
            if not keys:
                return
            if len(keys) == 1 and not ref:  # the usual arrival: scalar arithmetic equal to the vector form
                k = keys[0]
                if one is not None:
                    p, r, r90, f = one(submitted(k), ep0 + now)
                else:
                    pr = self.predictor.predict([submitted(k)], ep0 + now)
                    p, r = float(pr.p_success[0]), float(pr.runtime[0])
                    r90, f = float(pr.runtime_p90[0]), float(pr.time_to_failure[0])
                r = _at_least_1(r)
                p_succ_a[k] = p if 0.0 <= p <= 1.0 or p != p else (0.0 if p < 0.0 else 1.0)
                r_pred_a[k] = r
                r_p90_a[k] = r90 if r90 >= r or r90 != r90 else r
                ttf_a[k] = _at_least_1(f)
                return
            pr = self.predictor.predict([submitted(k) for k in keys], ep0 + now)
            idx = np.asarray(keys, dtype=np.int64)
            p_succ[idx] = np.clip(pr.p_success, 0.0, 1.0)
            r_pred[idx] = np.maximum(pr.runtime, 1.0)
            r_p90[idx] = np.maximum(pr.runtime_p90, r_pred[idx])
            ttf[idx] = np.maximum(pr.time_to_failure, 1.0)

        def add_pending(k: int) -> None:
            pend.add(k)
            w = whole_a[k]
            if w:
                pend_sizes[(w, mnodes_a[k])] += 1
            else:
                pend_milli[milli_a[k]] += 1  # 0: CPU-only, always startable

        def drop_pending(k: int) -> None:
            pend.remove(k)
            w = whole_a[k]
            if w:
                key_ = (w, mnodes_a[k])
                c = pend_sizes[key_] - 1
                if c:
                    pend_sizes[key_] = c
                else:
                    del pend_sizes[key_]
            else:
                mk = milli_a[k]
                c = pend_milli[mk] - 1
                if c:
                    pend_milli[mk] = c
                else:
                    del pend_milli[mk]

        def fold(u: int, now: float) -> None:
            """User u's usage brought to `now` at its rate so far: call before the rate changes."""
            nonlocal usage_t
            dt = now - t_at_a[u]
            if dt > 0:
                d = math.exp(-lam * dt)
                base_a[u] = base_a[u] * d + rate_a[u] * ((1.0 - d) / lam)
                t_at_a[u] = now
            usage_t = -math.inf

        def usage_now(now: float) -> None:
            """Every user's usage at `now` into `usage`: base * d + rate * ((1 - d) / lam), d = e^(-lam dt),
            in place (`out` by position, which numpy parses faster)."""
            nonlocal usage_t
            if now == usage_t:
                return
            np.subtract(now, t_at, tmp_d)
            np.multiply(tmp_d, -lam, tmp_d)
            np.exp(tmp_d, tmp_d)
            np.subtract(1.0, tmp_d, tmp_c)
            np.divide(tmp_c, lam, tmp_c)
            np.multiply(rate, tmp_c, tmp_c)
            np.multiply(base, tmp_d, usage)
            np.add(usage, tmp_c, usage)
            # To the millisecond of GPU time: the last bits depend on when each user's rate changed, so
            # users with the same history could differ by one and that bit, not submit time and key,
            # would break their tie (tests/test_engine.py).
            usage.round(3, usage)  # the method: np.round adds two Python frames
            usage_t = now

        def stop_running(k: int, now: float) -> None:
            moved = runb.remove(k)
            if moved >= 0:
                C.move_holder(used_gpus[moved], runb.pos[moved])
            used = used_gpus.pop(k)
            frac = milli_a[k] if whole_a[k] == 0 else 0
            if frac:
                del frac_at[k]
                nd = used[0][0]
                C.release(used, frac)
                node_free(nd, int(C.free[nd]))
            else:
                C.release(used, 0)
                if not used:  # a CPU-only job
                    pass
                elif used[0][0] == used[-1][0]:  # one node (`take` lists a node's GPUs together)
                    nd = used[0][0]
                    node_free(nd, free_l[nd] + len(used))
                else:  # one update per node (`take` lists a node's GPUs together)
                    per_node: dict[int, int] = {}
                    for nd, _ in used:
                        per_node[nd] = per_node.get(nd, 0) + 1
                    for nd, c in per_node.items():
                        node_free(nd, free_l[nd] + c)
            g = gpus_a[k]
            u = user_a[k]
            fold(u, now)
            rate_a[u] -= g
            attained_a[k] += g * (now - run_start_a[k])

        # Free GPUs per rack, kept current here so a pass does not recount them (ClusterView.rack_free).
        rack_free_a, rack_free = _shared(
            np.bincount(C.rack, weights=C.free, minlength=C.n_racks).astype(np.int64)
        )
        rack_of: list[int] = C.rack.tolist()
        # Whole free GPUs per node as plain ints, how many nodes have each count, and the total: kept
        # with `rack_free` so the cheap tests below need no pass over the cluster's arrays.
        free_l: list[int] = C.free.tolist()
        free_hist = [0] * (C.spec.max_node_gpus + 1)
        for f in free_l:
            free_hist[f] += 1
        free_tot = sum(free_l)
        # The one-node placements, kept with them for the policy's passes (ClusterView.index).
        live = LiveIndex(C.free, C.rack, C.n_racks) if not ref and LiveIndex.supports(C.node_gpus) else None
        live_set = live.set_free if live is not None else None

        def node_free(nd: int, now_free: int) -> None:
            """Node `nd` has `now_free` whole free GPUs now (after an allocate or release)."""
            nonlocal free_tot
            was = free_l[nd]
            free_l[nd] = now_free
            free_hist[was] -= 1
            free_hist[now_free] += 1
            free_tot += now_free - was
            rack_free_a[rack_of[nd]] += now_free - was
            if live_set is not None:
                live_set(nd, now_free)

        def max_free() -> int:
            f = len(free_hist) - 1
            while f > 0 and not free_hist[f]:
                f -= 1
            return f

        def fits_on_fullest(w: int, m: int) -> bool:
            """Whether the m nodes with the most free GPUs hold w GPUs together."""
            acc = 0
            for f in range(len(free_hist) - 1, 0, -1):
                c = free_hist[f]
                if c >= m:
                    return acc + f * m >= w
                acc += f * c
                m -= c
            return acc >= w

        def could_start() -> bool:
            """Cheap test: can any pending job be placed on the free GPUs at all?"""
            if pend_milli and int(C.share.max()) >= min(pend_milli):
                return True
            if not pend_sizes:
                return False
            fmax = max_free()
            if any(w <= fmax for w, _ in pend_sizes):
                return True
            if not fmax:
                return False
            return any(m > 1 and w <= free_tot for w, m in pend_sizes)

        def any_placeable() -> bool:
            """Whether some pending job can be placed on the free GPUs now (`placeable` on the histogram
            of free counts: `could_start` with the exact test for gangs spread over nodes)."""
            if pend_milli and int(C.share.max()) >= min(pend_milli):
                return True
            fmax = max_free()
            return any(
                w <= fmax or (m > 1 and w <= free_tot and fits_on_fullest(w, m)) for w, m in pend_sizes
            )

        def could_start_one(k: int) -> bool:
            """`could_start` for a queue of job k alone (the same tests on its one size)."""
            w = whole_a[k]
            if not w:
                return int(C.share.max()) >= milli_a[k]
            fmax = max_free()
            if w <= fmax:
                return True
            if not fmax:
                return False
            return mnodes_a[k] > 1 and w <= free_tot

        def frag_now() -> float:
            if pend.n == 0:
                return 0.0
            free_total = C.free_gpus
            if free_total <= 0:
                return 0.0
            ftot = free_tot
            fmax = -1
            for w, m in pend_sizes:
                if w > ftot:
                    continue
                # `placeable` from the histogram of free counts (the same integers): the largest node
                # holds it, or the m fullest nodes together do.
                if fmax < 0:
                    fmax = max_free()
                if w <= fmax:
                    continue
                if m == 1 or not fits_on_fullest(w, m):
                    return free_total
            if pend_milli:
                free_share = float(C.share[C.share > 0].sum())
                smax = int(C.share.max())
                for mm in pend_milli:
                    if 0 < mm <= free_share and mm > smax:
                        return free_total
            return 0.0

        ro_users = _ro(shares)
        preemptible = _ro(np.ones(max(n, 1), dtype=bool))
        cv = C.view()
        cview = ClusterView(
            cv.share,
            cv.free,
            cv.owner,
            cv.node_gpus,
            cv.rack,
            cv.n_racks,
            None if ref else _ro(rack_free),
            live,
            frac_at,
        )

        p_cols: tuple[str, ...] = ("job_id", "user", "klass", "submit", "gpus", "max_nodes", "time_limit")
        p_cols += ("p_success", "runtime", "runtime_p90", "time_to_failure", "attained", "last_stop")
        r_cols: tuple[str, ...] = ("job_id", "user", "klass", "gpus", "start", "time_limit", "runtime")
        r_cols += ("runtime_p90", "attained")
        copies = self.opts.log_decisions or ref  # logged Decisions keep their rankings: give them copies
        p_src = [pend.cols[c] if copies else pend.ro[c] for c in p_cols]
        r_src = [runb.cols[c] if copies else runb.ro[c] for c in r_cols]
        p_keys, r_keys = (pend.keys, runb.keys) if copies else (pend.ro_keys, runb.ro_keys)
        p_oracle = (pend.cols if copies else pend.ro)["oracle"] if pol.oracle else None
        p_oracle_ok = (pend.cols if copies else pend.ro)["oracle_ok"] if pol.oracle else None
        p_name_key = pend.cols["name_key"]

        p_views: dict[int, tuple[I64, list[np.ndarray], F64 | None, npt.NDArray[np.bool_] | None]] = {}
        r_views: dict[int, RunningJobs] = {}
        ro_usage = _ro(usage)  # `usage_now` writes `usage` in place

        def snapshot(now: float) -> Snapshot:
            """Read-only slices of the live columns (valid while the policy runs), or copies."""
            m, k = pend.n, runb.n
            usage_now(now)
            if copies:
                pending = _pending(
                    p_keys[:m].copy(),
                    [a[:m].copy() for a in p_src],
                    streak[p_name_key[:m]],
                    None if p_oracle is None else p_oracle[:m].copy(),
                    None if p_oracle_ok is None else p_oracle_ok[:m].copy(),
                )
                running = _running(r_keys[:k].copy(), [a[:k].copy() for a in r_src], preemptible[:k])
                return Snapshot(
                    now, passes, pending, running, cview, J.users, J.classes, usage.copy(), ro_users
                )
            # Views of the live buffers show their current contents, so the views for a length are made
            # once and reused (RunningJobs whole; PendingJobs but for its fail streaks, gathered anew).
            pv = p_views.get(m)
            if pv is None:
                if len(p_views) >= 4096:
                    p_views.clear()
                pv = p_views[m] = (
                    p_keys[:m],
                    [a[:m] for a in p_src],
                    None if p_oracle is None else p_oracle[:m],
                    None if p_oracle_ok is None else p_oracle_ok[:m],
                )
            pending = _pending(pv[0], pv[1], streak[p_name_key[:m]], pv[2], pv[3])
            got = r_views.get(k)
            if got is None:
                if len(r_views) >= 4096:
                    r_views.clear()
                got = r_views[k] = _running(r_keys[:k], [a[:k] for a in r_src], preemptible[:k])
            running = got
            return Snapshot(now, passes, pending, running, cview, J.users, J.classes, ro_usage, ro_users)

        # Wake-up times in the heap -> how many were asked for. A pass asks for its earliest starvation
        # deadline again and again; copies of one time are popped at the same instant anyway (a wake-up
        # is always in the future), so one heap entry stands for all of them and `events` counts each.
        wakes: dict[float, int] = {}

        def wake(t: float) -> None:
            c = wakes.get(t)
            if c is None:
                wakes[t] = 1
                heapq.heappush(wake_heap, t)
            else:
                wakes[t] = c + 1

        def start_job(k: int, al: Allocation, now: float, queued: bool = True) -> None:
            """Start pending job k (`queued` False: a lone arrival that never entered the queue)."""
            nonlocal seq
            if queued:
                drop_pending(k)
            run_start_a[k] = now
            slot = runb.add(k)
            used_gpus[k] = C.allocate(al, slot)
            if al.frac_gpu >= 0:
                frac_at[k] = (al.nodes[0], al.frac_gpu)
                node_free(al.nodes[0], int(C.free[al.nodes[0]]))
            elif len(al.nodes) == 1:
                nd = al.nodes[0]
                node_free(nd, free_l[nd] - al.counts[0])
            else:
                for nd, c in zip(al.nodes, al.counts, strict=True):
                    node_free(nd, free_l[nd] - c)
            if math.isnan(first_start[k]):
                first_start[k] = now
                nodes = al.nodes
                nodes_used_a[k] = len(nodes)  # Allocation.n_nodes
                racks_used_a[k] = 1 if len(nodes) == 1 else len({rack_of[nd] for nd in nodes})
            else:
                restarts_a[k] += 1
                remaining[k] += pol.restart_penalty_s
            u = user_a[k]
            fold(u, now)
            rate_a[u] += gpus_a[k]
            e = end_t[k] = now + remaining[k]
            seq += 1
            heapq.heappush(heap, (e, END, seq, k, epoch[k]))

        def preempt(key: int, now: float) -> None:
            stop_running(key, now)
            remaining[key] = max(end_t[key] - now, 0.0)
            end_t[key] = math.nan
            epoch[key] += 1
            preemptions_a[key] += 1
            last_stop_a[key] = now
            add_pending(key)

        def apply(dec: Decision, now: float) -> None:
            # A preemption that makes room for a start (Start.preempts) is applied right before it, in
            # the order the policy planned: otherwise a start placed before the preemption could take the
            # freed GPU its planned share names (each node's first free GPUs go to whole-GPU starts).
            attached = {key for s in dec.start for key in s.preempts}
            for key in dec.preempt:
                if key not in attached:
                    preempt(key, now)
            for s in dec.start:
                for key in s.preempts:
                    preempt(key, now)
                start_job(s.key, s.alloc, now)
            if dec.wake_at is not None and dec.wake_at > now:
                wake(dec.wake_at)

        def validate() -> None:
            C.validate()
            assert (rack_free == np.bincount(C.rack, weights=C.free, minlength=C.n_racks)).all()
            assert free_l == C.free.tolist() and free_tot == int(C.free.sum())
            if live is not None:
                live.check(C.free, C.rack, C.n_racks)

        def wake_lone(k: int, now: float) -> None:
            """Ask for the wake-up `wake_at` would give a queue of job k alone (`wake_one`)."""
            w = wake_one(now, submit[k], klass_l[k], J.classes)
            if w is not None and w > now:
                wake(w)

        def start_one(k: int, now: float, queued: bool) -> bool:
            """The pass over a queue of job k alone when it fits: the policy's own placement, the start and
            `wake_one`, the same decision `decide` gives (tests/test_engine_fastpath.py). False: it does
            not fit now (nothing done)."""
            nonlocal passes
            if own_place:
                alloc = place_one(cview, gpus_a[k], mnodes_a[k])
            else:  # `Policy.place_one`, without the call through the policy
                alloc = place_fresh(cview, how, gpus_a[k], mnodes_a[k])
            if alloc is None:
                return False
            passes += 1
            start_job(k, alloc, now, queued)
            wake_lone(k, now)
            return True

        def start_lone(k: int, now: float) -> bool:
            """`start_one` for job k arriving into an empty queue, without queueing it first. False: it
            waits (queued; the full path below runs the same tests and the pass)."""
            if could_start_one(k) and start_one(k, now, queued=False):
                if self.opts.validate:
                    validate()
                return True
            add_pending(k)
            return False

        fast = (
            _single_fast(pol)
            and self.opts.single_fast
            and not (ref or self.opts.log_decisions or explain_keys)
        )
        place_one, wake_one, wake_queue = pol.place_one, pol.wake_one, pol.wake_queue
        own_place, how = type(pol).place_one is not Policy.place_one, pol.placement
        p_submit, p_klass = pend.ro["submit"], pend.ro["klass"]  # `wake_queue`'s columns
        observe_end = self.predictor.observe_end
        state_l = T.state.tolist()
        COMPLETED = State.COMPLETED.value
        tl_now, tl_busy, tl_free, tl_pend, tl_run, tl_frag, tl_done, tl_good = (
            tl[c].append for c in TIMELINE_COLUMNS
        )
        while True:
            t_heap = heap[0][0] if heap else math.inf
            t_arr = submit[nxt] if nxt < n else math.inf
            now = min(t_heap, t_arr, wake_heap[0]) if wake_heap else min(t_heap, t_arr)
            if now == math.inf:
                break
            changed = False
            arrivals: list[int] = []
            # 1. ends at `now` (stale ends of preempted runs are skipped by their epoch)
            while heap and heap[0][0] == now:
                _, _, _, k, ep = heapq.heappop(heap)
                events += 1
                if ep != epoch[k] or math.isnan(end_t[k]):
                    continue
                stop_running(k, now)
                state = str(state_l[k])
                nk = name_key_a[k]
                if state == COMPLETED:
                    completed += 1
                    goodput += gpus_a[k] * runtime_a[k] / 3600.0
                    if nk >= 0:
                        streak_a[nk] = 0
                elif state in OWN_FAILURE_STATES and nk >= 0:
                    streak_a[nk] += 1
                observe_end(EndedJob(submitted(k), ep0 + first_start[k], ep0 + now, state))
                del subs[k]
                done += 1
                changed = True
            # 2. arrivals at `now`
            while nxt < n and submit[nxt] == now:
                arrivals.append(nxt)
                u = user_a[nxt]
                if not seen_l[u]:
                    seen_l[u] = True
                    seen_user[u] = True
                    shares[seen_user] = 1.0 / int(seen_user.sum())
                nxt += 1
                events += 1
            # 3. wake-ups asked by the policy
            woke = False
            if wake_heap and wake_heap[0] == now:
                heapq.heappop(wake_heap)  # one entry per time (`wake`)
                events += wakes.pop(now)
                # A wake-up for a queue that has emptied since it was asked for changes nothing.
                woke = woke or pend.n > 0 or bool(arrivals)
            changed = changed or woke
            if not changed and not arrivals:
                continue
            if now >= next_retrain:
                retrained = self.predictor.maybe_retrain(ep0 + now)
                next_retrain = (math.floor(now / self.opts.retrain_every_s) + 1) * self.opts.retrain_every_s
                if retrained and 0 < pend.n <= self.opts.repredict_limit:
                    predict(pend.view().tolist(), now)
                    pend.refresh(("p_success", "runtime", "runtime_p90", "time_to_failure"))
            lone = -1
            if arrivals:
                predict(arrivals, now)
                for k in arrivals:
                    p_first_a[k] = p_succ_a[k]
                    r_first_a[k] = r_pred_a[k]
                if fast and pend.n == 0 and len(arrivals) == 1:
                    lone = arrivals[0]  # queued below only if it does not start at once
                else:
                    for k in arrivals:
                        add_pending(k)
                changed = True
            if not changed:
                continue
            # 4. the scheduling pass
            if lone >= 0 and start_lone(lone, now):
                pass
            elif pend.n and (
                preemptive or could_start() or (explain_keys and not explain_keys.isdisjoint(arrivals))
            ):
                started = False
                idle = fast and not any_placeable()
                if idle:
                    # No pending job can be placed on the free GPUs at all (by any placement), so the
                    # pass starts nothing: what fits nowhere cannot fit a reservation's backfill, which
                    # places on a subset of them. What is left of it is its wake-up.
                    passes += 1
                    if has_wake and pend.n == 1:
                        wake_lone(pend.key_a[0], now)
                    elif has_wake:
                        w = wake_queue(now, p_submit[: pend.n], p_klass[: pend.n], J.classes)
                        if w is not None and w > now:
                            wake(w)
                elif fast and pend.n == 1:
                    # A queue of one that fits: the pass would start it and ask for `wake_at` of the
                    # queue it saw, so the policy's own placement and `wake_one` give the same decision.
                    started = start_one(pend.key_a[0], now, queued=True)
                if not started and not idle:
                    snap = snapshot(now)
                    dec = pol.decide(snap)
                    passes += 1
                    if self.opts.log_decisions:
                        if dec.ranking is not None:
                            dec.ranking.score  # noqa: B018 - a deferred ranking reads the snapshot: read it now
                        decisions.append(dec)
                    if explain_keys and dec.ranking is not None:
                        self._explain(snap, dec, explain_keys, explain)
                    apply(dec, now)
                if self.opts.validate:
                    validate()
            elif pend.n and has_wake and (arrivals or woke):
                # No pass, but the policy may want one later (a starvation deadline): only new jobs or
                # a spent wake-up can move its earliest request, as the queue otherwise only shrinks.
                if fast and pend.n == 1:
                    wake_lone(pend.key_a[0], now)
                else:
                    m = pend.n
                    w = (
                        wake_queue(now, p_submit[:m], p_klass[:m], J.classes)
                        if fast
                        else pol.wake_at(snapshot(now))
                    )
                    if w is not None and w > now:
                        wake(w)
            frag = frag_now()
            busy = C.busy
            tl_now(now)
            tl_busy(float(busy))
            tl_free(C.capacity - busy)  # Cluster.free_gpus
            tl_pend(float(pend.n))
            tl_run(float(runb.n))
            tl_frag(float(frag))
            tl_done(float(completed))
            tl_good(goodput)
            if progress is not None and done - reported >= prog_step:
                reported = done
                progress(done, n)
        if progress is not None:
            progress(done, n)
        jobs_tbl = pa.table(
            {
                "job_id": pa.array(J.job_id.tolist(), pa.string()),
                "user": pa.array(
                    [None if (name := J.users[u]) == UNKNOWN_USER else name for u in J.user.tolist()],
                    pa.string(),
                ),
                "group": pa.array(J.group.tolist(), pa.string()),
                "name": pa.array(J.name.tolist(), pa.string()),
                "gpus": pa.array(J.gpus, pa.float64()),
                "nodes_used": pa.array(nodes_used, pa.int64()),
                "racks_used": pa.array(racks_used, pa.int64()),
                "submit": pa.array(J.submit, pa.float64()),
                "start": pa.array(np.frombuffer(first_start), pa.float64(), from_pandas=True),
                "end": pa.array(np.frombuffer(end_t), pa.float64(), from_pandas=True),
                "runtime": pa.array(T.runtime, pa.float64()),
                "state": pa.array(T.state.tolist(), pa.string()),
                "preemptions": pa.array(preemptions, pa.int64()),
                "restarts": pa.array(restarts, pa.int64()),
                "time_limit": pa.array(J.time_limit, pa.float64(), from_pandas=True),
                "p_success": pa.array(p_first, pa.float64(), from_pandas=True),
                "pred_runtime": pa.array(r_first, pa.float64(), from_pandas=True),
            }
        ).select(list(JOB_COLUMNS))
        timeline = pa.table({c: pa.array(np.frombuffer(tl[c], dtype=np.float64)) for c in TIMELINE_COLUMNS})
        timeline = timeline.set_column(
            TIMELINE_COLUMNS.index("pending"), "pending", timeline.column("pending").cast(pa.int64())
        )
        for col in ("running", "completed_total"):
            timeline = timeline.set_column(
                TIMELINE_COLUMNS.index(col), col, timeline.column(col).cast(pa.int64())
            )
        res = SimResult(
            policy=pol.name,
            placement=pol.placement,
            jobs=jobs_tbl,
            timeline=timeline,
            capacity_gpus=C.capacity,
            load=0.0,
            explain=explain,
            wall_seconds=wallclock.perf_counter() - t_wall,
            events=events,
        )
        res.passes = passes
        res.decisions = decisions
        return res

    def _explain(
        self, snap: Snapshot, dec: Decision, keys: set[int], out: dict[str, list[WaitRecord]]
    ) -> None:
        rk = dec.ranking
        assert rk is not None
        started = {s.key: s.backfill for s in dec.start}
        ranks = rk.rank_of()
        of = len(rk.order)
        res = dec.reservation
        for pos, key in enumerate(snap.pending.key.tolist()):
            if key not in keys:
                continue
            how = ""
            if key in started:
                how = "; started"
                if started[key] and res is not None:  # EASY: it ends before the head's GPUs are due
                    how += f" by backfill (ends before the reservation of job {res.job_id})"
                elif started[key]:
                    how += " by backfill"
            out[str(snap.pending.job_id[pos])].append(
                WaitRecord(
                    t=snap.now,
                    rank=int(ranks[pos]) + 1,
                    of=of,
                    score=float(rk.score[pos]),
                    reason=rk.reason(pos) + how,
                    reservation_start=res.start if res is not None and res.key == key else None,
                )
            )
