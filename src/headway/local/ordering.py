"""The bridge from the local queue to the shared policy core and predictor (no ranking of its own).

`LocalPlanner` turns a QueueView into the policy core's frozen Snapshot (one node holding this server's
GPUs), calls `get_policy(name).decide(snapshot)`, and maps the Decision back to GPU ids. The fair-share
usage, shares and failure streaks come from the shared `PolicyBook` (policy/inputs.py), fed with every
ended job in end order, as the simulator's and the Slurm sync's are.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headway.local.core import PRIORITIES, JobState, LocalJob, Plan, Predicted, QueueView, RankEntry
from headway.policy import get_policy
from headway.policy.inputs import (
    EndedRow,
    PendingRow,
    PolicyBook,
    RunningRow,
    add_ended,
    pending_columns,
    running_jobs,
)
from headway.policy.placement import take
from headway.policy.snapshot import FULL_SHARE, ClusterView, Snapshot
from headway.predict.api import EndedJob, SubmittedJob

DEFAULT_RUNTIME_S = 3600.0  # assumed when a job has neither a prediction nor a time limit
# Every local job has a name: submit names it after its command when --name is not given
# (verbs/submit.py `default_name`). So this queue is a log with names: a job is keyed by its user and name
# (`streak_key`), and a job whose name is somehow empty is never lumped in with its user's other jobs.
# Local jobs have no group (account) either: a server's queue has none.
LOCAL_LOG_HAS_NAMES = True


def new_book() -> PolicyBook:
    """An empty book for this queue's classes (Slurm's default half-life)."""
    return PolicyBook.new(PRIORITIES)


def add_end(
    book: PolicyBook, user: str, name: str | None, state: str, gpus: float, start: float | None, end: float
) -> None:
    """One ended job into the book (call in end order): its GPU-seconds and its streak."""
    add_ended(book, [EndedRow(user, name, None, state, gpus, start, end)], log_has_names=LOCAL_LOG_HAS_NAMES)


def fail_streak(book: PolicyBook, user: str, name: str | None) -> int:
    """The failures in a row of `user`'s jobs named `name` (what holds a job): `why` quotes it."""
    return book.fail_streak(user, name, None, log_has_names=LOCAL_LOG_HAS_NAMES)


def _f(x: float | None, default: float = math.nan) -> float:
    return default if x is None or x != x else float(x)


def _klass(job: LocalJob) -> str:
    """Its priority class; "normal" for one this version does not know (an older database's)."""
    return job.priority if job.priority in PRIORITIES else "normal"


def job_runtime_guess(job: LocalJob) -> float:
    """Predicted runtime if it completes; the time limit or an hour without a prediction."""
    if job.pred_runtime is not None:
        return float(job.pred_runtime)
    return float(job.time_limit) if job.time_limit else DEFAULT_RUNTIME_S


def _left(job: LocalJob, runtime: float) -> float:
    """What is left of a runtime once the job's checkpoints kept `progress` seconds of earlier runs (a
    preempted job resumes there); never under a tenth of it (the prediction may have been short)."""
    return max(runtime - job.progress, 0.1 * runtime) if job.progress > 0 else runtime


def _may_stop(job: LocalJob, preempting: bool) -> bool:
    """Whether the policy may choose this running job as a victim: its user made it preemptible, it has
    started, nothing is stopping it already, and no other preemption is under way (the GPUs about to be
    freed are the ones the waiting job gets). The core holds to the same, whatever a policy asks."""
    return job.preemptible and job.state is JobState.RUNNING and not job.stopping and not preempting


class LocalPlanner:
    """A Planner (see core.py) backed by the shared policy core."""

    def __init__(self, policy: str = "impact", book: PolicyBook | None = None) -> None:
        self.policy = get_policy(policy)
        self.name = policy
        self.book = book if book is not None else new_book()
        self.seq = 0

    def snapshot(self, view: QueueView) -> Snapshot:
        """The policy's Snapshot through the shared `PolicyBook`: ended runs are in the book, running
        jobs' usage so far is added for this snapshot alone (`running_in_ledger=False`)."""
        now, book = view.now, self.book
        preempting = any(j.preempt_requested for j in view.running)
        pending = pending_columns(
            book,
            [
                PendingRow(
                    key=j.id,
                    job_id=str(j.id),
                    user=j.user,
                    name=j.name,
                    group=None,
                    klass=_klass(j),
                    submit=j.submit_time,
                    gpus=float(j.gpus),
                    max_nodes=1,
                    time_limit=_f(j.time_limit),
                    p_success=_f(j.p_success, 1.0),
                    runtime=_left(j, job_runtime_guess(j)),
                    runtime_p90=_left(j, _f(j.pred_runtime_p90, job_runtime_guess(j))),
                    time_to_failure=_f(j.pred_ttf, job_runtime_guess(j)),
                    attained=j.attained,
                    last_stop=j.last_preempted,
                )
                for j in view.pending
            ],
            log_has_names=LOCAL_LOG_HAS_NAMES,
        )
        running = running_jobs(
            book,
            [
                RunningRow(
                    key=j.id,
                    job_id=str(j.id),
                    user=j.user,
                    klass=_klass(j),
                    gpus=float(j.gpus),
                    start=_f(j.start_time, now),
                    time_limit=_f(j.time_limit, math.inf),
                    runtime=_left(j, job_runtime_guess(j)),
                    runtime_p90=_left(j, _f(j.pred_runtime_p90, job_runtime_guess(j))),
                    attained=j.attained,
                    preemptible=_may_stop(j, preempting),
                    p_success=_f(j.p_success),
                    time_to_failure=_f(j.pred_ttf),
                    last_preempted=_f(j.last_preempted),
                    checkpoint_every=_f(j.checkpoint_every),
                    probe=j.probe_s > 0,
                )
                for j in view.running
            ],
        )
        self.seq += 1
        return book.snapshot(now, self.seq, pending, running, _cluster(view), running_in_ledger=False)

    def __call__(self, view: QueueView) -> Plan:
        snap = self.snapshot(view)
        decision = self.policy.decide(snap)
        share, free = snap.cluster.share.copy(), snap.cluster.free.copy()
        starts: list[tuple[int, tuple[int, ...]]] = []
        waits: dict[int, tuple[int, ...]] = {}
        probes: dict[int, float] = {}
        pos_of = {int(k): i for i, k in enumerate(snap.running.key.tolist())}
        for s in decision.start:
            if s.preempts:
                # Planned on GPUs its victims hold: it starts in a later pass, once they are gone (their
                # GPUs, freed here on the scratch copy, are the ones this plan counts on for it).
                for v in s.preempts:
                    if v in pos_of:
                        mask = snap.cluster.owner == pos_of[v]
                        share[mask] = FULL_SHARE
                        free += mask.sum(axis=1)
                take(free, share, s.alloc)
                waits[s.key] = tuple(s.preempts)
                continue
            used = take(free, share, s.alloc)
            starts.append((s.key, tuple(view.gpu_ids[gi] for _, gi in used)))
            if s.probe_s > 0:
                probes[s.key] = float(s.probe_s)
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
            preempt=tuple(int(k) for k in decision.preempt),
            waits_for_preempted=waits,
            probes=probes,
        )


def _cluster(view: QueueView) -> ClusterView:
    """This server as one node: its GPUs, each free or held whole by a running job."""
    n = len(view.gpu_ids)
    pos_of = {g: i for i, g in enumerate(view.gpu_ids)}
    share = np.full((1, max(n, 1)), -1 if n == 0 else FULL_SHARE, dtype=np.int64)
    owner = np.full((1, max(n, 1)), -2 if n == 0 else -1, dtype=np.int64)
    for k, j in enumerate(view.running):
        for g in j.gpu_ids:
            share[0, pos_of[g]] = 0
            owner[0, pos_of[g]] = k
    return ClusterView(
        share=share,
        free=np.array([int((share[0] == FULL_SHARE).sum())], dtype=np.int64),
        owner=owner,
        node_gpus=np.array([n], dtype=np.int64),
        rack=np.zeros(1, dtype=np.int64),
        n_racks=1,
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


def load_book(state_dir: Path) -> PolicyBook:
    """Fair-share usage and failure streaks from this server's own ended jobs, in end order (empty for a
    new queue)."""
    import sqlite3

    from headway.local.paths import STATE_DB

    book = new_book()
    path = state_dir / STATE_DB
    if not path.exists():
        return book
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT user, name, state, gpus, start_time, end_time FROM jobs "
            "WHERE end_time IS NOT NULL AND state NOT IN ('PENDING', 'LAUNCHING', 'RUNNING') "
            "ORDER BY end_time, id"
        ).fetchall()
    except sqlite3.Error:
        rows = []
    finally:
        con.close()
    ended = [EndedRow(u, n, None, st, float(g), s, float(e)) for u, n, st, g, s, e in rows]
    add_ended(book, ended, log_has_names=LOCAL_LOG_HAS_NAMES)
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
