"""The bridge from the local queue to the shared policy core and predictor (no ranking of its own).

`LocalPlanner` turns a QueueView into the policy core's frozen Snapshot (one node holding this server's
GPUs), calls `get_policy(name).decide(snapshot)`, and maps the Decision back to GPU ids. The fair-share
usage and failure streaks the snapshot needs come from `UsageBook`, fed with every ended job.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headway.local.core import PRIORITIES, LocalJob, Plan, Predicted, QueueView, RankEntry
from headway.policy import get_policy
from headway.policy.placement import take
from headway.policy.snapshot import FULL_SHARE, ClusterView, PendingJobs, RunningJobs, Snapshot
from headway.predict.api import EndedJob, SubmittedJob
from headway.schema import OWN_FAILURE_STATES

HALF_LIFE_S = 7 * 86400.0  # Slurm's default PriorityDecayHalfLife
DEFAULT_RUNTIME_S = 3600.0  # assumed when a job has neither a prediction nor a time limit


@dataclass(slots=True)
class UsageBook:
    """Decayed GPU-seconds per user (fair share) and failures in a row per user+name (the hold rule)."""

    half_life: float = HALF_LIFE_S
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)  # user -> (value, as of time)
    streak: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(
        self, user: str | None, name: str | None, state: str, gpus: float, start: float | None, end: float
    ) -> None:
        u = user or "?"
        if start is not None and end > start:
            self._add_usage(u, gpus * (end - start), end)
        key = (u, name or "")
        if state == "COMPLETED":
            self.streak[key] = 0
        elif state in OWN_FAILURE_STATES:
            self.streak[key] = self.streak.get(key, 0) + 1

    def _add_usage(self, user: str, gpu_seconds: float, at: float) -> None:
        v, t = self.usage.get(user, (0.0, at))
        if at >= t:
            v = v * 0.5 ** ((at - t) / self.half_life) + gpu_seconds
            self.usage[user] = (v, at)
        else:
            self.usage[user] = (v + gpu_seconds * 0.5 ** ((t - at) / self.half_life), t)

    def usage_at(self, user: str, now: float) -> float:
        v, t = self.usage.get(user, (0.0, now))
        return v * 0.5 ** (max(now - t, 0.0) / self.half_life)

    def fail_streak(self, user: str, name: str) -> int:
        return self.streak.get((user, name), 0)


def _f(x: float | None, default: float = math.nan) -> float:
    return default if x is None or x != x else float(x)


def job_runtime_guess(job: LocalJob) -> float:
    """Predicted runtime if it completes; the time limit or an hour without a prediction."""
    if job.pred_runtime is not None:
        return float(job.pred_runtime)
    return float(job.time_limit) if job.time_limit else DEFAULT_RUNTIME_S


class LocalPlanner:
    """A Planner (see core.py) backed by the shared policy core."""

    def __init__(self, policy: str = "impact", book: UsageBook | None = None) -> None:
        self.policy = get_policy(policy)
        self.name = policy
        self.book = book or UsageBook()
        self.seq = 0

    def snapshot(self, view: QueueView) -> Snapshot:
        pend, run = view.pending, view.running
        users = sorted({j.user for j in (*pend, *run)})
        uidx = {u: i for i, u in enumerate(users)}
        cidx = {c: i for i, c in enumerate(PRIORITIES)}
        n = len(view.gpu_ids)
        pos_of = {g: i for i, g in enumerate(view.gpu_ids)}

        def arr(vals: Iterable[float]) -> np.ndarray[Any, np.dtype[np.float64]]:
            return np.fromiter(vals, dtype=np.float64)

        def iarr(vals: Iterable[int]) -> np.ndarray[Any, np.dtype[np.int64]]:
            return np.fromiter(vals, dtype=np.int64)

        pending = PendingJobs(
            key=iarr(j.id for j in pend),
            job_id=np.array([str(j.id) for j in pend], dtype=object),
            user=iarr(uidx[j.user] for j in pend),
            klass=iarr(cidx.get(j.priority, 1) for j in pend),
            submit=arr(j.submit_time for j in pend),
            gpus=arr(float(j.gpus) for j in pend),
            max_nodes=np.ones(len(pend), dtype=np.int64),
            time_limit=arr(_f(j.time_limit) for j in pend),
            p_success=arr(_f(j.p_success, 1.0) for j in pend),
            runtime=arr(job_runtime_guess(j) for j in pend),
            runtime_p90=arr(_f(j.pred_runtime_p90, job_runtime_guess(j)) for j in pend),
            time_to_failure=arr(_f(j.pred_ttf, job_runtime_guess(j)) for j in pend),
            attained=np.zeros(len(pend)),
            last_stop=arr(j.submit_time for j in pend),
            fail_streak=iarr(self.book.fail_streak(j.user, j.name) for j in pend),
        )
        running = RunningJobs(
            key=iarr(j.id for j in run),
            job_id=np.array([str(j.id) for j in run], dtype=object),
            user=iarr(uidx[j.user] for j in run),
            klass=iarr(cidx.get(j.priority, 1) for j in run),
            gpus=arr(float(j.gpus) for j in run),
            start=arr(_f(j.start_time, view.now) for j in run),
            time_limit=arr(_f(j.time_limit, math.inf) for j in run),
            runtime=arr(job_runtime_guess(j) for j in run),
            runtime_p90=arr(_f(j.pred_runtime_p90, job_runtime_guess(j)) for j in run),
            attained=np.zeros(len(run)),
            preemptible=np.zeros(len(run), dtype=bool),
        )
        share = np.full((1, max(n, 1)), -1 if n == 0 else FULL_SHARE, dtype=np.int64)
        owner = np.full((1, max(n, 1)), -2 if n == 0 else -1, dtype=np.int64)
        for k, j in enumerate(run):
            for g in j.gpu_ids:
                share[0, pos_of[g]] = 0
                owner[0, pos_of[g]] = k
        cluster = ClusterView(
            share=share,
            free=np.array([int((share[0] == FULL_SHARE).sum())], dtype=np.int64),
            owner=owner,
            node_gpus=np.array([n], dtype=np.int64),
            rack=np.zeros(1, dtype=np.int64),
            n_racks=1,
        )
        # Running jobs count towards fair share for the time they have run so far (as Slurm does).
        usage = arr(
            self.book.usage_at(u, view.now)
            + sum(j.gpus * max(view.now - _f(j.start_time, view.now), 0.0) for j in run if j.user == u)
            for u in users
        )
        shares = np.full(len(users), 1.0 / max(len(users), 1))
        self.seq += 1
        return Snapshot(view.now, self.seq, pending, running, cluster, users, PRIORITIES, usage, shares)

    def __call__(self, view: QueueView) -> Plan:
        snap = self.snapshot(view)
        decision = self.policy.decide(snap)
        share, free = snap.cluster.share.copy(), snap.cluster.free.copy()
        starts: list[tuple[int, tuple[int, ...]]] = []
        for s in decision.start:
            used = take(free, share, s.alloc)
            starts.append((s.key, tuple(view.gpu_ids[gi] for _, gi in used)))
        ranking: list[RankEntry] = []
        r = decision.ranking
        if r is not None:
            for rank, pos in enumerate(r.order.tolist(), start=1):
                factors = {k: float(v[pos]) for k, v in r.factors.items()}
                ranking.append(
                    RankEntry(int(snap.pending.key[pos]), rank, float(r.score[pos]), factors, r.reason(pos))
                )
        res = decision.reservation
        reservation = (res.key, float(res.start)) if res is not None else None
        return Plan(
            policy=self.name,
            starts=tuple(starts),
            ranking=tuple(ranking),
            reservation=reservation,
            estimated_start=estimate_starts(view, [e.job_id for e in ranking], {k for k, _ in starts}),
            wake_at=decision.wake_at,
            decision=decision.id,
        )


def estimate_starts(view: QueueView, order: Sequence[int], starting: set[int]) -> dict[int, float]:
    """When each pending job may start if jobs run as predicted and start in rank order (an ETA only)."""
    by_id = {j.id: j for j in view.pending}
    ends: list[float] = []
    for j in view.running:
        start = _f(j.start_time, view.now)
        end = start + job_runtime_guess(j)
        if j.time_limit:
            end = min(end, start + j.time_limit)
        ends.extend([max(end, view.now)] * j.gpus)
    ends.extend([view.now] * len(view.free_gpu_ids))
    out: dict[int, float] = {}
    for jid in order:
        job = by_id.get(jid)
        if job is None:
            continue
        if job.gpus == 0:
            out[jid] = view.now
            continue
        ends.sort()
        if len(ends) < job.gpus:
            out[jid] = math.inf
            continue
        t = ends[job.gpus - 1]
        out[jid] = t
        p = _f(job.p_success, 1.0)
        run = p * job_runtime_guess(job) + (1 - p) * _f(job.pred_ttf, job_runtime_guess(job))
        if job.time_limit:
            run = min(run, job.time_limit)
        ends = [t + run] * job.gpus + ends[job.gpus :]
        if jid in starting:
            out[jid] = view.now
    return out


def submitted_for_predictor(job: LocalJob) -> SubmittedJob:
    return SubmittedJob(
        job_id=str(job.id),
        user=job.user,
        group=None,
        name=job.name,
        partition=None,
        priority_class=job.priority,
        submit_time=job.submit_time,
        gpus=float(job.gpus),
        nodes=1,
        time_limit=job.time_limit,
    )


def ended_for_predictor(job: LocalJob) -> EndedJob:
    start = job.start_time if job.start_time is not None else job.end_time or job.submit_time
    return EndedJob(
        submitted_for_predictor(job),
        float(start),
        float(job.end_time or start),
        job.state.value,
        started=job.start_time is not None,
    )


def predicted_events(predictor: Any, jobs: Sequence[LocalJob], now: float) -> list[Predicted]:
    """One batched predictor call for `jobs`, as core events."""
    preds = predictor.predict([submitted_for_predictor(j) for j in jobs], now)
    return [
        Predicted(
            j.id,
            float(preds.p_success[i]),
            float(preds.runtime[i]),
            float(preds.runtime_p90[i]),
            float(preds.time_to_failure[i]),
        )
        for i, j in enumerate(jobs)
    ]


def load_book(state_dir: Path) -> UsageBook:
    """Fair-share usage and failure streaks from this server's own ended jobs (empty for a new queue)."""
    import sqlite3

    from headway.local.paths import STATE_DB

    book = UsageBook()
    path = state_dir / STATE_DB
    if not path.exists():
        return book
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT user, name, state, gpus, start_time, end_time FROM jobs "
            "WHERE end_time IS NOT NULL AND state NOT IN ('PENDING', 'LAUNCHING', 'RUNNING') "
            "ORDER BY end_time"
        ).fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        con.close()
    for user, name, state, gpus, start, end in rows:
        book.add(user, name, state, float(gpus), start, float(end))
    return book


def build_predictor(store: Path, extra: Sequence[Path] = (), model: Path | None = None) -> Any:
    """The shared online predictor, warmed with every ended job in the job store(s), with the model the
    daemon saved last (if any). It does not train here: a restart must be quick. Until the daemon's first
    retraining, a queue without a saved model uses the predictor's cold-start fallbacks, which already
    follow each user's and job name's record."""
    from headway.predict.model import ModelFileError, Predictor
    from headway.predict.online import OnlinePredictor
    from headway.schema import ENDED_STATES
    from headway.store import JobStore, StoreError

    pred = OnlinePredictor()
    ended = ", ".join(f"'{s.value}'" for s in ENDED_STATES)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in (store, *extra):
        if not path.exists():
            continue
        try:
            with JobStore(path, read_only=True) as js:
                table = js.table(f"end_time IS NOT NULL AND state IN ({ended})")
        except StoreError:
            continue
        for r in table.to_pylist():
            rows[(r["source"], r["job_id"])] = r
    for r in sorted(rows.values(), key=lambda r: r["end_time"]):
        end = r["end_time"].timestamp()
        start = r["start_time"].timestamp() if r["start_time"] is not None else end
        submit = r["submit_time"].timestamp() if r["submit_time"] is not None else start
        job = SubmittedJob(
            job_id=f"{r['source']}:{r['job_id']}",
            user=r["user"],
            group=r["group"],
            name=r["name"],
            partition=r["partition"],
            priority_class=r["priority_class"],
            submit_time=submit,
            gpus=float(r["gpus"] or 0.0),
            nodes=int(r["nodes"] or 1),
            time_limit=float(r["time_limit"]) if r["time_limit"] is not None else None,
        )
        pred.observe_end(EndedJob(job, start, end, r["state"], started=r["start_time"] is not None))
    if model is not None and model.exists():
        try:
            pred.model = Predictor.load(model)
        except (ModelFileError, OSError, ValueError) as e:
            # a damaged model file: start from the fallbacks, the next retraining replaces it
            logging.getLogger("headway.daemon").warning(
                "%s: not used (%s); cold-start estimates until the next retraining", model, e
            )
        else:
            # The loaded model already covers this history: count retraining from now, not from zero.
            pred.mark_trained(model.stat().st_mtime)
    return pred
