"""The discrete-event engine: a heap of (time, order, seq) events and one policy pass per instant.

At one instant, ends go first (their GPUs free up and the predictor learns them), then arrivals (they
get predictions in one batch), then the scheduling pass, which applies the policy's Decision. Time only
moves to the next event: there is no tick. A job's truth (recorded runtime and final state) lives in
`Truth`, which only this module reads; policies get a `Snapshot` built from what a scheduler knows.
Arrivals come from the submit-sorted job arrays through a cursor, not the heap, so a million-job trace
never sits in the heap at once.
"""

from __future__ import annotations

import heapq
import math
import time as wallclock
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from headway.policy.placement import placeable
from headway.policy.policies import Policy
from headway.policy.snapshot import F64, FULL_SHARE, I64, Decision, PendingJobs, RunningJobs, Snapshot
from headway.predict.api import EndedJob, OnlinePredictor, SubmittedJob
from headway.schema import State
from headway.sim.cluster import Cluster
from headway.sim.result import JOB_COLUMNS, TIMELINE_COLUMNS, SimResult, WaitRecord

END, ARRIVAL, PASS = 0, 1, 2  # same-instant order: ends, then arrivals, then the scheduling pass
DAY = 86400.0
_WASTE = {State.FAILED.value, State.TIMEOUT.value, State.OUT_OF_MEMORY.value, State.NODE_FAIL.value}


@dataclass(slots=True)
class JobArrays:
    """What a scheduler can know of each job, sorted by submit (index = the job's key)."""

    job_id: npt.NDArray[np.object_]
    user: I64  # index into users
    group: npt.NDArray[np.object_]
    name: npt.NDArray[np.object_]
    name_key: I64  # index of (user, name); -1 when the job has no name
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


@dataclass(slots=True)
class EngineOptions:
    usage_half_life_s: float = 7 * DAY
    retrain_every_s: float = DAY
    repredict_limit: int = 50_000  # re-predict the queue after a retrain when it is at most this long
    explain: frozenset[str] = frozenset()
    progress: Callable[[int, int], None] | None = None
    validate: bool = False  # check cluster invariants after every change (tests)
    log_decisions: bool = False


class _Set:
    """A dense set of job keys with O(1) add and swap-remove, plus per-key columns kept alongside, so
    a snapshot copies contiguous slices instead of gathering from million-row arrays."""

    def __init__(self, size: int, sources: dict[str, np.ndarray]) -> None:
        size = max(size, 1)
        self.keys: I64 = np.empty(size, dtype=np.int64)
        self.pos: I64 = np.full(size, -1, dtype=np.int64)
        self.n = 0
        self.sources = sources
        self.cols = {name: np.empty(size, dtype=src.dtype) for name, src in sources.items()}
        self._pairs = [(self.cols[name], src) for name, src in sources.items()]

    def add(self, key: int) -> int:
        i = self.n
        self.keys[i] = key
        self.pos[key] = i
        for buf, src in self._pairs:
            buf[i] = src[key]
        self.n = i + 1
        return i

    def remove(self, key: int) -> int:
        """Remove `key`; returns the key moved into its slot (or -1)."""
        i = int(self.pos[key])
        last = self.n - 1
        moved = -1
        if i != last:
            moved = int(self.keys[last])
            self.keys[i] = moved
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

    def col(self, name: str, copy: bool = False) -> np.ndarray:
        """Column slice: a read-only view (valid until the set changes), or a copy."""
        v = self.cols[name][: self.n]
        if copy:
            return v.copy()
        v.setflags(write=False)
        return v


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
        # Per-job mutable state.
        p_succ = np.full(n, np.nan)
        r_pred = np.full(n, np.nan)
        r_p90 = np.full(n, np.nan)
        ttf = np.full(n, np.nan)
        p_first = np.full(n, np.nan)
        r_first = np.full(n, np.nan)
        first_start = np.full(n, np.nan)
        end_t = np.full(n, np.nan)
        run_start = np.zeros(n)
        remaining = T.runtime.astype(np.float64).copy()
        attained = np.zeros(n)
        last_stop = J.submit.astype(np.float64).copy()
        epoch = np.zeros(n, dtype=np.int64)
        preemptions = np.zeros(n, dtype=np.int64)
        restarts = np.zeros(n, dtype=np.int64)
        nodes_used = np.zeros(n, dtype=np.int64)
        racks_used = np.zeros(n, dtype=np.int64)
        used_gpus: dict[int, list[tuple[int, int]]] = {}
        n_names = int(J.name_key.max(initial=-1)) + 2
        streak = np.zeros(n_names, dtype=np.int64)  # last slot (-1) stays 0: unnamed jobs never hold
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
                **({"oracle": T.runtime} if pol.oracle else {}),
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
        )
        pend_sizes: Counter[tuple[int, int]] = Counter()  # (whole, max_nodes) of pending whole-GPU jobs
        pend_milli: Counter[int] = Counter()
        n_users = len(J.users)
        usage = np.zeros(n_users)
        rate = np.zeros(n_users)
        seen_user = np.zeros(n_users, dtype=bool)
        shares = np.zeros(n_users)
        lam = math.log(2) / self.opts.usage_half_life_s
        t_usage = 0.0
        explain_keys = (
            {i for i, j in enumerate(J.job_id) if j in self.opts.explain} if self.opts.explain else set()
        )
        explain: dict[str, list[WaitRecord]] = {str(J.job_id[k]): [] for k in explain_keys}
        tl = {c: array("d") for c in TIMELINE_COLUMNS}
        completed = 0
        goodput = 0.0
        heap: list[tuple[float, int, int, int, int]] = []  # (time, order, seq, key, epoch)
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

        def submitted(k: int) -> SubmittedJob:
            tl_ = J.time_limit[k]
            return SubmittedJob(
                str(J.job_id[k]),
                J.users[J.user[k]],
                J.group[k],
                J.name[k],
                J.partition[k],
                J.classes[J.klass[k]],
                ep0 + float(J.submit[k]),
                float(J.gpus[k]),
                int(J.nodes[k]),
                None if math.isnan(tl_) else float(tl_),
            )

        def predict(keys: list[int], now: float) -> None:
            if not keys:
                return
            pr = self.predictor.predict([submitted(k) for k in keys], ep0 + now)
            idx = np.asarray(keys, dtype=np.int64)
            p_succ[idx] = np.clip(pr.p_success, 0.0, 1.0)
            r_pred[idx] = np.maximum(pr.runtime, 1.0)
            r_p90[idx] = np.maximum(pr.runtime_p90, r_pred[idx])
            ttf[idx] = np.maximum(pr.time_to_failure, 1.0)

        def add_pending(k: int) -> None:
            pend.add(k)
            if whole[k]:
                pend_sizes[(int(whole[k]), int(max_nodes[k]))] += 1
            elif milli[k]:
                pend_milli[int(milli[k])] += 1
            else:
                pend_milli[0] += 1  # CPU-only: always startable

        def drop_pending(k: int) -> None:
            pend.remove(k)
            if whole[k]:
                key_ = (int(whole[k]), int(max_nodes[k]))
                pend_sizes[key_] -= 1
                if not pend_sizes[key_]:
                    del pend_sizes[key_]
            else:
                mk = int(milli[k])
                pend_milli[mk] -= 1
                if not pend_milli[mk]:
                    del pend_milli[mk]

        def advance_usage(now: float) -> None:
            nonlocal t_usage
            dt = now - t_usage
            if dt > 0:
                d = math.exp(-lam * dt)
                usage[:] = usage * d + rate * ((1.0 - d) / lam)
                t_usage = now

        def stop_running(k: int, now: float) -> None:
            moved = runb.remove(k)
            if moved >= 0:
                C.move_holder(used_gpus[moved], int(runb.pos[moved]))
            used = used_gpus.pop(k)
            C.release(used, int(milli[k]) if whole[k] == 0 else 0)
            g = float(J.gpus[k])
            rate[J.user[k]] -= g
            attained[k] += g * (now - run_start[k])

        def could_start() -> bool:
            """Cheap test: can any pending job be placed on the free GPUs at all?"""
            if pend_milli and int(C.share.max()) >= min(pend_milli):
                return True
            if not pend_sizes:
                return False
            fmax = int(C.free.max())
            ftot = int(C.free.sum()) if fmax else 0
            return any(w <= fmax or (m > 1 and w <= ftot) for w, m in pend_sizes)

        def frag_now() -> float:
            free_total = C.free_gpus
            if free_total <= 0 or pend.n == 0:
                return 0.0
            ftot = int(C.free.sum())
            for w, m in pend_sizes:
                if w <= ftot and not placeable(C.free, C.share, float(w), m):
                    return free_total
            if pend_milli:
                free_share = float(C.share[C.share > 0].sum())
                smax = int(C.share.max())
                for mm in pend_milli:
                    if 0 < mm <= free_share and mm > smax:
                        return free_total
            return 0.0

        ro_users = _ro(shares)
        cview = C.view()

        def snapshot(now: float) -> Snapshot:
            # Columns are fresh copies of contiguous slices; views of live state are read-only.
            keep = self.opts.log_decisions  # logged Decisions keep their rankings: give them copies

            def c(name: str) -> np.ndarray:
                return pend.col(name, keep)

            def r(name: str) -> np.ndarray:
                return runb.col(name, keep)

            pending = PendingJobs(
                pend.keys[: pend.n].copy(),
                c("job_id"),
                c("user"),
                c("klass"),
                c("submit"),
                c("gpus"),
                c("max_nodes"),
                c("time_limit"),
                c("p_success"),
                c("runtime"),
                c("runtime_p90"),
                c("time_to_failure"),
                c("attained"),
                c("last_stop"),
                streak[pend.cols["name_key"][: pend.n]],
                c("oracle") if pol.oracle else None,
            )
            running = RunningJobs(
                runb.keys[: runb.n].copy(),
                r("job_id"),
                r("user"),
                r("klass"),
                r("gpus"),
                r("start"),
                r("time_limit"),
                r("runtime"),
                r("runtime_p90"),
                r("attained"),
                np.ones(runb.n, dtype=bool),
            )
            return Snapshot(now, passes, pending, running, cview, J.users, J.classes, usage.copy(), ro_users)

        def apply(dec: Decision, now: float) -> None:
            nonlocal seq
            for key in dec.preempt:
                stop_running(key, now)
                remaining[key] = max(end_t[key] - now, 0.0)
                end_t[key] = np.nan
                epoch[key] += 1
                preemptions[key] += 1
                last_stop[key] = now
                add_pending(key)
            for s in dec.start:
                k = s.key
                drop_pending(k)
                run_start[k] = now
                slot = runb.add(k)
                used_gpus[k] = C.allocate(s.alloc, slot)
                if math.isnan(first_start[k]):
                    first_start[k] = now
                    nodes_used[k] = s.alloc.n_nodes
                    racks_used[k] = len({int(C.rack[nd]) for nd in s.alloc.nodes})
                else:
                    restarts[k] += 1
                    remaining[k] += pol.restart_penalty_s
                run_start[k] = now
                rate[J.user[k]] += float(J.gpus[k])
                end_t[k] = now + remaining[k]
                seq += 1
                heapq.heappush(heap, (float(end_t[k]), END, seq, k, int(epoch[k])))
            if dec.wake_at is not None and dec.wake_at > now:
                seq += 1
                heapq.heappush(heap, (dec.wake_at, PASS, seq, -1, 0))

        submit = J.submit
        while True:
            t_heap = heap[0][0] if heap else math.inf
            t_arr = float(submit[nxt]) if nxt < n else math.inf
            now = min(t_heap, t_arr)
            if now == math.inf:
                break
            changed = False
            arrivals: list[int] = []
            # 1. ends at `now` (stale ends of preempted runs are skipped by their epoch)
            while heap and heap[0][0] == now and heap[0][1] == END:
                _, _, _, k, ep = heapq.heappop(heap)
                events += 1
                if ep != epoch[k] or math.isnan(end_t[k]):
                    continue
                advance_usage(now)
                stop_running(k, now)
                state = str(T.state[k])
                nk = J.name_key[k]
                if state == State.COMPLETED.value:
                    completed += 1
                    goodput += float(J.gpus[k]) * float(T.runtime[k]) / 3600.0
                    if nk >= 0:
                        streak[nk] = 0
                elif state in _WASTE and nk >= 0:
                    streak[nk] += 1
                self.predictor.observe_end(
                    EndedJob(submitted(k), ep0 + float(first_start[k]), ep0 + now, state)
                )
                done += 1
                changed = True
            # 2. arrivals at `now`
            while nxt < n and submit[nxt] == now:
                arrivals.append(nxt)
                u = int(J.user[nxt])
                if not seen_user[u]:
                    seen_user[u] = True
                    shares[seen_user] = 1.0 / int(seen_user.sum())
                nxt += 1
                events += 1
            # 3. wake-ups asked by the policy
            woke = False
            while heap and heap[0][0] == now and heap[0][1] == PASS:
                heapq.heappop(heap)
                events += 1
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
            if arrivals:
                predict(arrivals, now)
                for k in arrivals:
                    p_first[k] = p_succ[k]
                    r_first[k] = r_pred[k]
                    add_pending(k)
                changed = True
            if not changed:
                continue
            # 4. the scheduling pass
            if pend.n and (
                preemptive or could_start() or (explain_keys and not explain_keys.isdisjoint(arrivals))
            ):
                advance_usage(now)
                snap = snapshot(now)
                dec = pol.decide(snap)
                passes += 1
                if self.opts.log_decisions:
                    decisions.append(dec)
                if explain_keys and dec.ranking is not None:
                    self._explain(snap, dec, explain_keys, explain)
                apply(dec, now)
                if self.opts.validate:
                    C.validate()
            elif pend.n and has_wake and (arrivals or woke):
                # No pass, but the policy may want one later (a starvation deadline): only new jobs or
                # a spent wake-up can move its earliest request, as the queue otherwise only shrinks.
                snap = snapshot(now)
                w = pol.wake_at(snap)
                if w is not None and w > now:
                    seq += 1
                    heapq.heappush(heap, (w, PASS, seq, -1, 0))
            frag = frag_now()
            free = C.free_gpus
            for c, v in zip(
                TIMELINE_COLUMNS,
                (now, C.busy, free, pend.n, runb.n, frag, completed, goodput),
                strict=True,
            ):
                tl[c].append(float(v))
            if progress is not None and done - reported >= prog_step:
                reported = done
                progress(done, n)
        if progress is not None:
            progress(done, n)
        jobs_tbl = pa.table(
            {
                "job_id": pa.array(J.job_id.tolist(), pa.string()),
                "user": pa.array([J.users[u] for u in J.user.tolist()], pa.string()),
                "group": pa.array(J.group.tolist(), pa.string()),
                "name": pa.array(J.name.tolist(), pa.string()),
                "gpus": pa.array(J.gpus, pa.float64()),
                "nodes_used": pa.array(nodes_used, pa.int64()),
                "racks_used": pa.array(racks_used, pa.int64()),
                "submit": pa.array(J.submit, pa.float64()),
                "start": pa.array(first_start, pa.float64(), from_pandas=True),
                "end": pa.array(end_t, pa.float64(), from_pandas=True),
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
        started = {s.key for s in dec.start}
        ranks = rk.rank_of()
        of = len(rk.order)
        for pos, key in enumerate(snap.pending.key.tolist()):
            if key not in keys:
                continue
            res = dec.reservation
            out[str(snap.pending.job_id[pos])].append(
                WaitRecord(
                    t=snap.now,
                    rank=int(ranks[pos]) + 1,
                    of=of,
                    score=float(rk.score[pos]),
                    reason=rk.reason(pos) + ("; started" if key in started else ""),
                    reservation_start=res.start if res is not None and res.key == key else None,
                )
            )
