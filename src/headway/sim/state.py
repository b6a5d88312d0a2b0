"""The simulator's state between events, in the shape of dask's worker state.

`SimState` holds what a scheduler knows of every job (its request, its predictions, pending or running,
where it runs) plus the hidden truth (`Truth`: recorded runtime and final state), which only this module
reads. It changes only through its transitions: `on_arrival`, `on_end`, `apply(decision)`, and the
predictions a forecaster sets. `snapshot` gives a policy its frozen view, built by the policy core's
`PolicyBook` like the local queue's and the Slurm adapter's. `validate()` checks every invariant; tests
call it after every event.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.policy.inputs import PendingColumns, PolicyBook
from headway.policy.placement import FreeIndex
from headway.policy.preempt import DEFAULT_CHECKPOINT_S, URGENT_CLASSES
from headway.policy.snapshot import (
    F64,
    FULL_SHARE,
    I64,
    Allocation,
    ClusterView,
    Decision,
    RunningJobs,
    Snapshot,
)
from headway.schema import State
from headway.sim.cluster import Cluster
from headway.sim.events import End
from headway.sim.jobset import JobSet, read_only, shared
from headway.sim.result import JOB_COLUMNS, UNKNOWN_USER

COMPLETED = State.COMPLETED.value
PREDICTIONS = ("p_success", "runtime", "runtime_p90", "time_to_failure")
_P_COLS: tuple[str, ...] = ("job_id", "user", "klass", "submit", "gpus", "max_nodes", "time_limit")
_P_COLS += (*PREDICTIONS, "attained", "last_stop", "streak_key")
_R_COLS: tuple[str, ...] = (
    "job_id",
    "user",
    "klass",
    "gpus",
    "start",
    "time_limit",
    "runtime",
    "runtime_p90",
    "attained",
    "preemptible",
    "p_success",
    "time_to_failure",
    "last_preempted",
    "checkpoint_every",
    "probe",
)
_VIEWS_KEPT = 4096  # snapshot views kept per queue length


@dataclass(slots=True)
class JobArrays:
    """What a scheduler can know of each job, sorted by submit (index = the job's key)."""

    job_id: npt.NDArray[np.object_]
    user: I64  # index into users
    group: npt.NDArray[np.object_]
    name: npt.NDArray[np.object_]
    streak_key: I64  # index into streak_keys (policy.inputs.streak_key); -1: the job has none
    klass: I64  # index into classes
    partition: npt.NDArray[np.object_]
    submit: F64  # seconds on the simulation clock
    gpus: F64
    nodes: I64
    time_limit: F64  # NaN when none
    users: list[str]
    classes: list[str]
    epoch0: float  # epoch seconds of simulation time 0 (the predictor sees real timestamps)
    streak_keys: list[tuple[str, str, str]]
    preemptible: npt.NDArray[np.bool_] | None = None  # None: no job is
    checkpoint_every: F64 | None = None  # seconds; NaN (or None for all): the default

    def __len__(self) -> int:
        return len(self.submit)


@dataclass(frozen=True, slots=True)
class Truth:
    """The recorded runtime and final state: read by the state (and an oracle policy) only."""

    runtime: F64
    state: npt.NDArray[np.object_]

    def __reduce__(self) -> tuple[type[Truth], tuple[F64, npt.NDArray[np.object_]]]:
        """Pickle through the constructor (see cluster.NodeSpec.__reduce__)."""
        return (Truth, (self.runtime, self.state))


Floats = F64 | list[float]


def _at_least(x: float, lo: float) -> float:
    """max(x, lo), NaN when either is NaN (as numpy's maximum)."""
    if x != x or lo != lo:
        return math.nan
    return x if x >= lo else lo


def _ints(a: np.ndarray) -> array[int]:
    return array("q", a.astype(np.int64).tobytes())


def _floats(a: np.ndarray) -> array[float]:
    return array("d", a.astype(np.float64).tobytes())


class SimState:
    """See the module docstring. Keys are job positions in `JobArrays` (submit order)."""

    def __init__(
        self,
        jobs: JobArrays,
        truth: Truth,
        cluster: Cluster,
        *,
        oracle: bool = False,
        restart_penalty_s: float = 0.0,
        checkpoint_default_s: float = DEFAULT_CHECKPOINT_S,
        half_life_s: float = 7 * 86400.0,
        copies: bool = False,
    ) -> None:
        """`copies`: snapshots copy the columns (a Decision kept past the pass reads its own), else they
        are read-only views of the live columns, valid while the policy runs."""
        self.jobs, self.truth, self.cluster = jobs, truth, cluster
        self.restart_penalty_s = restart_penalty_s
        self.checkpoint_default_s = checkpoint_default_s
        self.copies = copies
        self.book = PolicyBook.new(jobs.classes, half_life_s, 0.0, jobs.users)
        for key in jobs.streak_keys:
            self.book.streaks.key(key)
        self._init_requests()
        self._init_progress()
        self._init_sets(oracle)
        self._init_cluster()
        self.completed = 0
        self.goodput = 0.0  # GPU-hours of completed runs
        self.done = 0

    def _init_requests(self) -> None:
        J, C = self.jobs, self.cluster
        max_gpn = C.spec.max_node_gpus
        whole = np.where(J.gpus >= 1.0, np.ceil(J.gpus - 1e-9), 0).astype(np.int64)
        milli = np.where((J.gpus > 0) & (J.gpus < 1.0), np.maximum(1, np.round(J.gpus * FULL_SHARE)), 0)
        need_nodes = np.where(max_gpn > 0, np.ceil(whole / max(max_gpn, 1)), 1).astype(np.int64)
        self.max_nodes = np.maximum(np.maximum(J.nodes, 1), need_nodes)
        self.whole, self.milli = _ints(whole), _ints(milli.astype(np.int64))
        self.mnodes, self.user = _ints(self.max_nodes), _ints(J.user)
        self.gpus, self.submit = _floats(J.gpus), _floats(J.submit)
        self.streak_key = _ints(J.streak_key)
        self.state_l: list[str] = [str(s) for s in self.truth.state.tolist()]
        self.runtime = _floats(self.truth.runtime)

    def _init_progress(self) -> None:
        """Per-job mutable state: an `array` for single items and a numpy view of it for vectors."""
        n = len(self.jobs)
        self.p_succ_a, self.p_succ = shared(np.full(n, np.nan))
        self.r_pred_a, self.r_pred = shared(np.full(n, np.nan))
        self.r_p90_a, self.r_p90 = shared(np.full(n, np.nan))
        self.ttf_a, self.ttf = shared(np.full(n, np.nan))
        self.p_first_a, self.p_first = shared(np.full(n, np.nan))
        self.r_first_a, self.r_first = shared(np.full(n, np.nan))
        self.first_start_a, self.first_start = shared(np.full(n, np.nan))
        self.end_a, self.end = shared(np.full(n, np.nan))
        self.run_start_a, self.run_start = shared(np.zeros(n))
        self.remaining = _floats(self.truth.runtime)
        self.attained_a, self.attained = shared(np.zeros(n))
        self.last_stop_a, self.last_stop = shared(self.jobs.submit.astype(np.float64))
        self.epoch = array("q", bytes(8 * n))
        self.preemptions_a, self.preemptions = shared(np.zeros(n, dtype=np.int64))
        self.restarts_a, self.restarts = shared(np.zeros(n, dtype=np.int64))
        self.last_preempted_a, self.last_preempted = shared(np.full(n, np.nan))
        # Seconds of GPU holding redone (progress since the last checkpoint, restart penalties) because of
        # preemptions, and because of fail-fast probes; seconds held over all runs.
        self.lost_a, self.lost = shared(np.zeros(n))
        self.probe_lost_a, self.probe_lost = shared(np.zeros(n))
        self.held_a, self.held = shared(np.zeros(n))
        self.probe_a, self.probe = shared(np.zeros(n, dtype=bool))  # the current run is a probe
        self.probed_a, self.probed = shared(np.zeros(n, dtype=bool))  # it was stopped at a probe's end
        self.frag_a, self.frag = shared(np.full(n, np.nan))  # high/urgent: fragmented free GPUs at arrival
        self.penalty = array("d", bytes(8 * n))  # restart penalty the current run pays first
        self.cause = array("b", bytes(n))  # why it last stopped: 1 preempted, 2 a probe's end
        J = self.jobs
        pre = J.preemptible if J.preemptible is not None else np.zeros(n, dtype=bool)
        self.preemptible_a, self.preemptible = shared(np.asarray(pre, dtype=bool).copy())
        ce = J.checkpoint_every if J.checkpoint_every is not None else np.full(n, np.nan)
        self.ckpt = _floats(np.where(np.isnan(ce), self.checkpoint_default_s, ce))
        self.ckpt_col = read_only(np.asarray(ce, dtype=np.float64).copy())
        self.nodes_used_a, self.nodes_used = shared(np.zeros(n, dtype=np.int64))
        self.racks_used_a, self.racks_used = shared(np.zeros(n, dtype=np.int64))

    def _init_sets(self, oracle: bool) -> None:
        J, T = self.jobs, self.truth
        n = len(J)
        klass, limit = _ints(J.klass), _floats(J.time_limit)
        common: dict[str, Any] = {
            "job_id": J.job_id,
            "user": J.user,
            "klass": J.klass,
            "gpus": J.gpus,
            "time_limit": J.time_limit,
        }
        items: dict[str, Any] = {"user": self.user, "klass": klass, "gpus": self.gpus, "time_limit": limit}
        predicted: dict[str, Any] = {
            "runtime": self.r_pred,
            "runtime_p90": self.r_p90,
            "attained": self.attained,
            "p_success": self.p_succ,
            "time_to_failure": self.ttf,
        }
        predicted_items: dict[str, Any] = {
            "runtime": self.r_pred_a,
            "runtime_p90": self.r_p90_a,
            "attained": self.attained_a,
            "p_success": self.p_succ_a,
            "time_to_failure": self.ttf_a,
        }
        oracle_cols: dict[str, Any] = (
            {"oracle": T.runtime, "oracle_ok": T.state == COMPLETED} if oracle else {}
        )
        pending_only: dict[str, tuple[Any, Any]] = {
            "submit": (J.submit, self.submit),
            "max_nodes": (self.max_nodes, self.mnodes),
            "last_stop": (self.last_stop, self.last_stop_a),
            "streak_key": (J.streak_key, self.streak_key),
        }
        self.pending = JobSet(
            n,
            {**common, **predicted, **{c: v for c, (v, _) in pending_only.items()}, **oracle_cols},
            {**items, **predicted_items, **{c: v for c, (_, v) in pending_only.items()}},
        )
        running_only: dict[str, tuple[Any, Any]] = {
            "start": (self.run_start, self.run_start_a),
            "preemptible": (self.preemptible, self.preemptible_a),
            "last_preempted": (self.last_preempted, self.last_preempted_a),
            "checkpoint_every": (self.ckpt_col, self.ckpt_col),
            "probe": (self.probe, self.probe_a),
        }
        self.running = JobSet(
            n,
            {**common, **predicted, **{c: v for c, (v, _) in running_only.items()}},
            {**items, **predicted_items, **{c: v for c, (_, v) in running_only.items()}},
        )
        # (whole GPUs, max nodes) of pending whole-GPU jobs, and milli-GPU shares of fractional ones
        self.pend_sizes: Counter[tuple[int, int]] = Counter()
        self.pend_milli: Counter[int] = Counter()
        self._urgent = [c in URGENT_CLASSES for c in J.classes]
        self._p_views: dict[int, PendingColumns] = {}
        self._r_views: dict[int, RunningJobs] = {}
        self._oracle = oracle

    def _init_cluster(self) -> None:
        C = self.cluster
        self.used: dict[int, list[tuple[int, int]]] = {}  # running key -> its GPUs
        self.frac_at: dict[int, tuple[int, int]] = {}  # running fractional jobs' GPU (ClusterView.frac_at)
        self.rack_of: list[int] = C.rack.tolist()
        self.index = FreeIndex(C.free, C.rack, C.n_racks)  # kept live: set_free after every change
        self._free = C.free.reshape(-1).data.cast("B").cast("q")  # plain-int reads of C.free
        cv = C.view()
        self.view = ClusterView(
            cv.share, cv.free, cv.owner, cv.node_gpus, cv.rack, cv.n_racks, self.index, self.frac_at
        )

    # --- transitions ---------------------------------------------------------------------------------

    def on_arrival(self, k: int) -> None:
        """Job k was submitted: it waits (predictions are set by the forecaster before the pass)."""
        self.book.ledger.see(self.user[k])
        if self._urgent[self.jobs.klass[k]]:
            self.frag_a[k] = self._fragmented_for(k)
        self._add_pending(k)

    def _fragmented_for(self, k: int) -> float:
        """The free GPUs when they are enough in number for job k's gang but cannot hold it, else 0."""
        w, free = self.whole[k], self.cluster.free_gpus
        if w == 0 or free < w:
            return 0.0
        return 0.0 if self.index.placeable(w, self.mnodes[k]) else float(free)

    def on_probe_end(self, end: End, now: float) -> bool:
        """A probe's slot is over: the run, if still going, stops and the job is requeued preemptible."""
        k = end.key
        if end.epoch != self.epoch[k] or math.isnan(self.end_a[k]) or not self.probe_a[k]:
            return False
        self._preempt(k, now, probe=True)
        self.preemptible_a[k] = True
        self.probed_a[k] = True
        return True

    def on_end(self, end: End, now: float) -> str | None:
        """A run ended at `now`: its final state, or None for a stale end (the run was preempted)."""
        k = end.key
        if end.epoch != self.epoch[k] or math.isnan(self.end_a[k]):
            return None
        self._stop(k, now)
        if self.penalty[k]:  # the last run's restart, charged to what stopped the run before
            (self.probe_lost_a if self.cause[k] == 2 else self.lost_a)[k] += self.penalty[k]
        state = self.state_l[k]
        if state == COMPLETED:
            self.completed += 1
            self.goodput += self.gpus[k] * self.runtime[k] / 3600.0
        self.book.streaks.observe(self.streak_key[k], state)
        self.done += 1
        return state

    def apply(self, dec: Decision, now: float) -> list[tuple[float, End]]:
        """Apply a policy's Decision; returns the ends to schedule for the runs it started.

        A preemption that makes room for a start (Start.preempts) is applied right before it, in the order
        the policy planned: otherwise a start placed before it could take the GPU its planned share names."""
        attached = {key for s in dec.start for key in s.preempts}
        for key in dec.preempt:
            if key not in attached:
                self._preempt(key, now)
        ends = []
        for s in dec.start:
            for key in s.preempts:
                self._preempt(key, now)
            self.probe_a[s.key] = s.probe_s > 0  # before the start: the running set copies it
            t, end = self._start(s.key, s.alloc, now)
            ends.append((t, end))
            if s.probe_s > 0 and now + s.probe_s < t:
                ends.append((now + s.probe_s, End(s.key, end.epoch, probe=True)))
        return ends

    def set_predictions(
        self, keys: list[int], p: Floats, r: Floats, r90: Floats, ttf: Floats, first: bool
    ) -> None:
        """The forecaster's predictions for `keys`, bounded to what a policy may rely on (a probability in
        [0, 1], runtimes of at least a second, a p90 no shorter than the median; NaN stays unknown)."""
        cols = (p, r, r90, ttf)
        p_l, r_l, r90_l, f_l = (c.tolist() if isinstance(c, np.ndarray) else c for c in cols)
        for k, pk, rk, r9, fk in zip(keys, p_l, r_l, r90_l, f_l, strict=True):
            rk = _at_least(rk, 1.0)
            self.p_succ_a[k] = pk if pk != pk else min(max(pk, 0.0), 1.0)
            self.r_pred_a[k] = rk
            self.r_p90_a[k] = _at_least(r9, rk)
            self.ttf_a[k] = _at_least(fk, 1.0)
            if first:
                self.p_first_a[k] = self.p_succ_a[k]
                self.r_first_a[k] = rk
        if not first:
            self.pending.refresh(PREDICTIONS)

    # --- what a pass reads ---------------------------------------------------------------------------

    def snapshot(self, now: float, seq: int) -> Snapshot:
        lazy = not self.copies  # a copied snapshot outlives the pass: its usage is read now
        return self.book.snapshot(
            now, seq, self._pending_columns(), self._running_jobs(), self.view, lazy_usage=lazy
        )

    def can_place_any(self) -> bool:
        """Whether some pending job can be placed on the free GPUs now (by any placement rule): when none
        can, a pass that may not preempt starts nothing."""
        if self.pend_milli and int(self.cluster.share.max()) >= min(self.pend_milli):
            return True
        return any(self.index.placeable(w, m) for w, m in self.pend_sizes)

    def fragmented_free(self) -> float:
        """The free GPUs when some pending job fits their count but cannot be placed (DESIGN.md), else 0."""
        free_total = self.cluster.free_gpus
        if self.pending.n == 0 or free_total <= 0:
            return 0.0
        total = self.index.total
        if any(w <= total and not self.index.placeable(w, m) for w, m in self.pend_sizes):
            return free_total
        if self.pend_milli:
            share = self.cluster.share
            free_share, smax = float(share[share > 0].sum()), int(share.max())
            if any(0 < mm <= free_share and mm > smax for mm in self.pend_milli):
                return free_total
        return 0.0

    # --- internals -----------------------------------------------------------------------------------

    def _add_pending(self, k: int) -> None:
        self.pending.add(k)
        w = self.whole[k]
        if w:
            self.pend_sizes[(w, self.mnodes[k])] += 1
        else:
            self.pend_milli[self.milli[k]] += 1  # 0: CPU-only, always startable

    def _drop_pending(self, k: int) -> None:
        self.pending.remove(k)
        w = self.whole[k]
        counter: Counter[Any] = self.pend_sizes if w else self.pend_milli
        size: Any = (w, self.mnodes[k]) if w else self.milli[k]
        c = counter[size] - 1
        if c:
            counter[size] = c
        else:
            del counter[size]

    def _node_changed(self, nd: int) -> None:
        self.index.set_free(nd, self._free[nd])

    def _start(self, k: int, al: Allocation, now: float) -> tuple[float, End]:
        self._drop_pending(k)
        self.run_start_a[k] = now
        slot = self.running.add(k)
        self.used[k] = self.cluster.allocate(al, slot)
        if al.frac_gpu >= 0:
            self.frac_at[k] = (al.nodes[0], al.frac_gpu)
        for nd in al.nodes:
            self._node_changed(nd)
        if math.isnan(self.first_start_a[k]):
            self.first_start_a[k] = now
            self.nodes_used_a[k] = len(al.nodes)
            self.racks_used_a[k] = 1 if len(al.nodes) == 1 else len({self.rack_of[nd] for nd in al.nodes})
        else:
            self.restarts_a[k] += 1
            self.penalty[k] = self.restart_penalty_s
        self.book.ledger.start(self.user[k], self.gpus[k], now)
        e = self.end_a[k] = now + self.penalty[k] + self.remaining[k]
        return e, End(k, self.epoch[k])

    def _stop(self, k: int, now: float) -> None:
        moved = self.running.remove(k)
        if moved >= 0:
            self.cluster.move_holder(self.used[moved], self.running.pos[moved])
        used = self.used.pop(k)
        frac = self.milli[k] if self.whole[k] == 0 else 0
        if frac:
            del self.frac_at[k]
        self.cluster.release(used, frac)
        last = -1
        for nd, _ in used:  # `allocate` lists a node's GPUs together
            if nd != last:
                self._node_changed(nd)
                last = nd
        g = self.gpus[k]
        self.book.ledger.stop(self.user[k], g, self.run_start_a[k], now)
        self.attained_a[k] += g * (now - self.run_start_a[k])
        self.held_a[k] += now - self.run_start_a[k]

    def _preempt(self, k: int, now: float, probe: bool = False) -> None:
        """Stop job k's run and requeue it: it keeps the work up to its last checkpoint; what it did
        since, and the restart penalty this run paid, are lost (counted in `lost` or `probe_lost`)."""
        elapsed = now - self.run_start_a[k]
        pen = self.penalty[k]
        work = min(max(elapsed - pen, 0.0), self.remaining[k])
        ce = self.ckpt[k]
        saved = work - math.fmod(work, ce) if ce > 0 else work
        self.remaining[k] -= saved
        (self.probe_lost_a if probe else self.lost_a)[k] += elapsed - saved
        self.penalty[k] = 0.0
        self.probe_a[k] = False
        self.cause[k] = 2 if probe else 1
        self._stop(k, now)
        if not probe:
            self.last_preempted_a[k] = now
        self.end_a[k] = math.nan
        self.epoch[k] += 1
        if not probe:
            self.preemptions_a[k] += 1
        self.last_stop_a[k] = now
        self._add_pending(k)

    def _pending_columns(self) -> PendingColumns:
        m, P = self.pending.n, self.pending
        if self.copies:
            rt, ok = self._oracle_cols(m, True)
            cols = {c: P.cols[c][:m].copy() for c in _P_COLS}
            return PendingColumns(P.keys[:m].copy(), **cols, oracle_runtime=rt, oracle_success=ok)
        got = self._p_views.get(m)
        if got is None:
            if len(self._p_views) >= _VIEWS_KEPT:
                self._p_views.clear()
            # Views of the live buffers show their current contents, so the views for a length are made once.
            rt, ok = self._oracle_cols(m, False)
            cols = {c: P.ro[c][:m] for c in _P_COLS}
            got = self._p_views[m] = PendingColumns(
                P.ro_keys[:m], **cols, oracle_runtime=rt, oracle_success=ok
            )
        return got

    def _oracle_cols(self, m: int, copy: bool) -> tuple[F64 | None, npt.NDArray[np.bool_] | None]:
        if not self._oracle:
            return None, None
        src = self.pending.cols if copy else self.pending.ro
        rt, ok = src["oracle"][:m], src["oracle_ok"][:m]
        return (rt.copy(), ok.copy()) if copy else (rt, ok)

    def _running_jobs(self) -> RunningJobs:
        k, R = self.running.n, self.running
        if self.copies:
            cols = {c: R.cols[c][:k].copy() for c in _R_COLS}
            return RunningJobs(R.keys[:k].copy(), **cols)
        got = self._r_views.get(k)
        if got is None:
            if len(self._r_views) >= _VIEWS_KEPT:
                self._r_views.clear()
            cols = {c: R.ro[c][:k] for c in _R_COLS}
            got = self._r_views[k] = RunningJobs(R.ro_keys[:k], **cols)
        return got

    # --- checks and output ---------------------------------------------------------------------------

    def validate(self) -> None:
        """Every invariant of the state (tests call it after every event)."""
        C = self.cluster
        C.validate()
        self.index.check(C.free, C.rack, C.n_racks)
        self.pending.check()
        self.running.check()
        pend, run = set(self.pending.view().tolist()), set(self.running.view().tolist())
        assert not pend & run and set(self.used) == run and set(self.frac_at) <= run
        assert all(math.isnan(self.end_a[k]) for k in pend)
        sizes = Counter((self.whole[k], self.mnodes[k]) for k in pend if self.whole[k])
        assert sizes == self.pend_sizes
        assert Counter(self.milli[k] for k in pend if not self.whole[k]) == self.pend_milli
        for k in run:
            slot = self.running.pos[k]
            assert all(int(C.owner[n, g]) in (slot, -2) for n, g in self.used[k])
            assert self.run_start_a[k] <= self.end_a[k]
        rate = np.bincount(
            self.jobs.user[list(run)], weights=self.jobs.gpus[list(run)], minlength=len(self.jobs.users)
        )
        assert np.allclose(self.book.ledger.running_gpus(), rate, atol=1e-6)

    def job_table(self) -> dict[str, object]:
        """The columns of SimResult.jobs (JOB_COLUMNS), as arrays and lists."""
        J, T = self.jobs, self.truth
        cols: dict[str, object] = {
            "job_id": J.job_id.tolist(),
            "user": [None if (name := J.users[u]) == UNKNOWN_USER else name for u in J.user.tolist()],
            "group": J.group.tolist(), "name": J.name.tolist(), "gpus": J.gpus,
            "nodes_used": self.nodes_used, "racks_used": self.racks_used, "submit": J.submit,
            "start": self.first_start, "end": self.end, "runtime": T.runtime, "state": T.state.tolist(),
            "preemptions": self.preemptions, "restarts": self.restarts, "time_limit": J.time_limit,
            "p_success": self.p_first, "pred_runtime": self.r_first,
            "priority_class": [J.classes[c] for c in J.klass.tolist()], "preemptible": self.preemptible,
            "lost_s": self.lost, "probe_lost_s": self.probe_lost, "held_s": self.held, "probed": self.probed,
            "frag_at_submit": self.frag,
        }  # fmt: skip
        assert tuple(cols) == JOB_COLUMNS
        return cols
