"""One sync pass: read Slurm's queue and new history, predict, rank with the policy core, write SiteFactors.

The pass is all-or-nothing on slurmctld's inputs: if the queue, nodes or SiteFactors cannot be read,
nothing is written, and values are never computed from an older pass's queue. Only the history may be
older: with slurmdbd down, a pass ranks with the history held (read before, or from the store) and says
so. `SlurmSync.run_pass` never raises for Slurm trouble; the loop (`run_loop`) backs off and retries, so
it survives a controller restart.

Every pass with --apply, ok or not, is recorded in the store's decision log (decision_log.py): what it
ranked, what it wrote and what ran. A log that cannot be written (the store held by a reader) never fails
the pass: the records wait for the next open of the store.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headway.humanize import dur
from headway.policy.inputs import (
    EndedRow,
    PendingRow,
    PolicyBook,
    RunningRow,
    add_ended,
    pending_columns,
    running_jobs,
)
from headway.policy.snapshot import FULL_SHARE, ClusterView, Ranking, Snapshot
from headway.predict.api import EndedJob, OnlinePredictor, Predictions, SubmittedJob
from headway.schema import OUTCOME_OF, JobRecord, Outcome, natural_key
from headway.slurm.queue import (
    SINFO_ARGS,
    NodeGpus,
    QueueJob,
    array_has_task,
    parse_sinfo,
    read_queue,
    read_site_factors,
)
from headway.slurm.runner import Runner, SlurmDenied, SlurmDown, SlurmError, SlurmMissing, SlurmTimeout
from headway.slurm.sitefactor import (
    ApplyReport,
    Change,
    FactorRange,
    Progress,
    apply_changes,
    place_ranks,
    plan_changes,
    write_counts,
)

if TYPE_CHECKING:
    from headway.decision_log import DecisionRecord

HISTORY_MARGIN_S = 600.0  # re-read this much before the last history read (late accounting records)
LOG_WAIT_S = 2.0  # how long a pass waits for the store held by another process, to log itself
LOG_BACKLOG = 1000  # passes kept for the decision log while the store cannot be written (oldest dropped)

PredictorFactory = Callable[[], OnlinePredictor]
# The QOS whose running jobs a higher class may preempt (docs/slurm.md, "Preemption: classes to QOS"): on
# Slurm a job is preemptable through its QOS, which slurm.conf's PreemptType=preempt/qos reads.
DEFAULT_PREEMPTIBLE_QOS: frozenset[str] = frozenset({"low"})


def parse_qos_list(text: str) -> frozenset[str]:
    """`low,scavenger` as a set of QOS names; Slurm's names are case-insensitive (sacctmgr stores them in
    lower case), so they are compared so. An empty text: no QOS is preemptable."""
    return frozenset(q.strip().lower() for q in text.split(",") if q.strip())


@dataclass(frozen=True, slots=True)
class SyncOptions:
    rng: FactorRange = field(default_factory=lambda: FactorRange(0, 100000))
    apply: bool = False
    db: Path | None = None  # job store; None: the default store
    source: str = "sacct"  # the store's source name for this cluster (as `ingest --from-slurm`)
    since: str = "30d"  # first history read, when the store has none of this cluster's jobs
    policy: str = "impact"
    max_age_s: float = 60.0  # inputs older than this at write time are stale: write nothing
    preemptible_qos: frozenset[str] = DEFAULT_PREEMPTIBLE_QOS  # lower case (parse_qos_list)


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One pending job's place in headway's order and the SiteFactor that follows from it."""

    job_id: str
    user: str | None
    name: str | None
    gpus: float
    rank: int  # 1-based
    tier: str
    score: float
    factors: dict[str, float]
    reason: str
    current: int | None  # SiteFactor in Slurm now (None: unknown)
    target: int
    # Slurm's name (`19_[4-9]`: the pending tasks of array 19, ranked as one job since they share one
    # priority) and the pending tasks it stands for, each asking for `gpus`.
    slurm_id: str = ""
    tasks: int = 1

    @property
    def display_id(self) -> str:
        return self.slurm_id or self.job_id


@dataclass(slots=True)
class Plan:
    read_at: float  # wall time the queue was read
    queue_source: str
    pending: int
    running: int
    history_new: int
    history_total: int
    rows: list[PlanRow]
    skipped_cpu_only: list[str]
    changes: list[Change]
    # Pending jobs that cannot start whatever their priority (held, waiting on a dependency or a begin
    # time): job id -> Slurm's reason. Not ranked, not written (sprio does not even list them).
    skipped_waiting: dict[str, str] = field(default_factory=dict)
    # Jobs left alone whose SiteFactor goes to the range's low end in this plan (display ids): ranked
    # before and held or waiting since, or held with a value nothing here can read (sprio hides them).
    resets: list[str] = field(default_factory=list)
    # Pending records Slurm names otherwise: job id -> that name (array `19` -> `19_[4-9]`, so a task id
    # finds its record; het component `8` -> `7+1`).
    arrays: dict[str, str] = field(default_factory=dict)
    # Set when this plan ranks with history held from before because sacct failed (slurmdbd down): why,
    # and how old that history is.
    warning: str | None = None
    # The running jobs of the queue read (for the decision log's picture of the cluster).
    queue_running: list[QueueJob] = field(default_factory=list)

    def resolve(self, job: str) -> str:
        """The name this plan knows a job by: `19` and `19_5` are `19_[4-9]` while task 5 is pending."""
        if job in self.arrays:
            return self.arrays[job]
        base, _, task = job.partition("_")
        if task.isdigit():
            for name in self.arrays.values():
                if name.startswith(f"{base}_[") and array_has_task(name[len(base) + 1 :], int(task)):
                    return name
        return job

    def row(self, job: str) -> PlanRow | None:
        name = self.resolve(job)
        return next((r for r in self.rows if r.display_id == name), None)

    @property
    def unchanged(self) -> int:
        """Ranked jobs whose SiteFactor is already what the plan wants."""
        return sum(1 for r in self.rows if r.current == r.target)


@dataclass(slots=True)
class PassReport:
    seq: int
    at: float
    ok: bool
    dry_run: bool
    error: str | None = None
    plan: Plan | None = None
    applied: list[Change] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    commands: int = 0
    # Planned writes never made: the pass stopped first (slurmctld gone mid-write, a stale queue, Ctrl-C).
    not_attempted: list[Change] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C while writing: the caller shows this report, then stops

    def writes(self) -> str:
        """`written N, failed M, not attempted K`: what this pass's writes did, counted one by one."""
        return write_counts(len(self.applied), len(self.failed), len(self.not_attempted))

    def to_json(self) -> dict[str, object]:
        p = self.plan
        return {
            "pass": self.seq,
            "at": dt.datetime.fromtimestamp(self.at, dt.UTC).isoformat(),
            "ok": self.ok,
            "dry_run": self.dry_run,
            "error": self.error,
            "queue_source": p.queue_source if p else None,
            "pending": p.pending if p else None,
            "running": p.running if p else None,
            "history_new": p.history_new if p else None,
            "warning": p.warning if p else None,
            "jobs": [
                {
                    "job_id": r.job_id,
                    "slurm_id": r.display_id,
                    "tasks": r.tasks,
                    "user": r.user,
                    "name": r.name,
                    "gpus": r.gpus,
                    "rank": r.rank,
                    "tier": r.tier,
                    "score": r.score,
                    "factors": r.factors,
                    "site_factor_now": r.current,
                    "site_factor_planned": r.target,
                }
                for r in (p.rows if p else [])
            ],
            "skipped_cpu_only": p.skipped_cpu_only if p else [],
            "skipped_waiting": p.skipped_waiting if p else {},
            "reset_to_low_end": p.resets if p else [],
            "planned_changes": len(p.changes) if p else 0,
            "unchanged": p.unchanged if p else 0,
            "applied": [{"job_id": c.job_id, "old": c.old, "new": c.new} for c in self.applied],
            "failed": self.failed,
            "not_attempted": [c.job_id for c in self.not_attempted],
            "writes": {
                "written": len(self.applied),
                "failed": len(self.failed),
                "not_attempted": len(self.not_attempted),
            },
            "scontrol_calls": self.commands,
        }


def rank_jobs(snapshot: Snapshot, policy: str) -> Ranking:
    """The one call into the scheduling core: the same `rank` the simulator and local queue use."""
    from headway.policy import get_policy

    return get_policy(policy).rank(snapshot)


def default_predictor() -> OnlinePredictor:
    """The project's online predictor (predict/online.py): cold-started, fed ended jobs by the sync loop,
    retraining itself as history grows, exactly as the simulator drives it."""
    from headway.predict.online import OnlinePredictor as Online

    return Online()


def _epoch(t: dt.datetime | None) -> float | None:
    return None if t is None else t.timestamp()


def submitted_from_record(r: JobRecord) -> SubmittedJob:
    return SubmittedJob(
        job_id=r.job_id,
        user=r.user,
        group=r.group,
        name=r.name,
        partition=r.partition,
        priority_class=r.priority_class,
        submit_time=_epoch(r.submit_time) or 0.0,
        gpus=float(r.gpus or 0.0),
        nodes=int(r.nodes or 1),
        time_limit=float(r.time_limit) if r.time_limit is not None else None,
    )


def submitted_from_queue(j: QueueJob) -> SubmittedJob:
    return SubmittedJob(
        job_id=j.job_id,
        user=j.user,
        group=j.account,
        name=j.name,
        partition=j.partition,
        priority_class=j.qos,
        submit_time=j.submit_time,
        gpus=j.gpus,
        nodes=j.nodes,
        time_limit=j.time_limit,
    )


class History:
    """Ended jobs of this cluster: what the store had, plus what sacct reported since (incremental)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        self.next_since: dt.datetime | None = None
        self.read_at: float | None = None  # wall time of the last sacct read that worked
        self.store_newest: dt.datetime | None = None  # newest job end the store held when loaded
        self.bad_rows = 0  # rows of the last sacct read that could not be read (their jobs are missing)

    def load_store(self, db: Path | None, source: str) -> None:
        from headway.schema import table_to_records
        from headway.store import JobStore, StoreError, default_db_path

        path = db if db is not None else default_db_path()
        if not Path(path).exists():
            return
        try:
            with JobStore(path, read_only=True) as store, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # duckdb's note on Arrow copies is not for our users
                table = store.table("source = ? AND end_time IS NOT NULL", [source])
        except StoreError as e:
            raise SlurmError(str(e)) from e
        for r in table_to_records(table):
            self.jobs[r.job_id] = r
        ends = [r.end_time for r in self.jobs.values() if r.end_time is not None]
        if ends:
            self.store_newest = max(ends)
            self.next_since = self.store_newest - dt.timedelta(seconds=HISTORY_MARGIN_S)

    def held_since(self, now: float) -> str | None:
        """How old the history held is, in words; None when none was ever read (nothing to rank with)."""
        if self.read_at is not None:
            return f"the history read from sacct {dur(max(now - self.read_at, 0.0))} ago"
        if self.store_newest is not None:
            age = max(now - self.store_newest.timestamp(), 0.0)
            return f"the store's history (its newest job ended {dur(age)} ago)"
        return None

    def fetch(self, runner: Runner, since: str, source: str, now: float) -> list[JobRecord]:
        """New or changed ended jobs from `sacct -a -X -P` since the last read; the reader is traces/sacct."""
        from headway.traces.base import BadInputError, ReadOptions
        from headway.traces.checks import tidy
        from headway.traces.sacct import READER, SACCT_ENV, SACCT_TZ, parse_since, sacct_command, sacct_label

        try:
            floor = parse_since(since).astimezone()
        except (BadInputError, ValueError) as e:
            raise SlurmError(f"--since: {e}") from e
        # Never before --since on the first read: a store last fed months ago would make every pass ask
        # sacct for months. Later reads go on from the last one, so an outage longer than --since leaves
        # no gap in the history.
        if self.next_since is None:
            start = floor
        elif self.read_at is None:
            start = max(self.next_since.astimezone(), floor)
        else:
            start = self.next_since.astimezone()
        argv = sacct_command(start, sacct="sacct")
        try:
            res = runner.run("sacct", argv[1:], env=SACCT_ENV)
        except SlurmTimeout as e:
            span = max(now - start.timestamp(), 0.0)
            if span > 2 * 86400:
                days = math.ceil(span / 86400)
                hint = (
                    "sacct is slow on a long window; give a shorter --since, or store it once with "
                    f"`headway ingest --from-slurm --since {days}d` (it waits longer) into this store"
                )
            else:
                hint = "slurmdbd may be overloaded or hung"
            raise SlurmTimeout(
                f"{e} reading the history since {start:%Y-%m-%d %H:%M %Z} ({dur(span)}): {hint}"
            ) from None
        with tempfile.TemporaryDirectory(prefix="headway-sync-") as tmp:
            path = Path(tmp) / "sacct.txt"
            path.write_text(res.stdout)
            if not res.stdout.strip():
                records: list[JobRecord] = []
            else:
                from headway.schema import table_to_records

                try:
                    result = tidy(READER.read(path, ReadOptions(source=source, tz=SACCT_TZ)))
                except BadInputError as e:  # named by its window, not the temp file it went to
                    said = str(e).replace(str(path), sacct_label(start))
                    raise SlurmError(f"sacct output: {said}") from e
                records = table_to_records(result.table)
                self.bad_rows = result.bad_row_count
        new = []
        for r in records:
            if r.end_time is None or OUTCOME_OF[r.state] is Outcome.UNFINISHED:
                continue
            old = self.jobs.get(r.job_id)
            if old is None or old != r:
                self.jobs[r.job_id] = r
                new.append(r)
        self.next_since = dt.datetime.fromtimestamp(now - HISTORY_MARGIN_S, dt.UTC)
        self.read_at = now
        return new


def _ended_rows(history: Sequence[JobRecord]) -> list[EndedRow]:
    """The history's ended jobs in end order (ties in Slurm's numbering), as the shared book reads them."""
    done = sorted(
        ((r, r.end_time) for r in history if r.end_time is not None),
        key=lambda re: (re[1], natural_key(re[0].job_id)),
    )
    return [
        EndedRow(
            r.user or "",
            r.name,
            r.group,
            r.state.value,
            float(r.gpus or 0.0),
            _epoch(r.start_time),
            end.timestamp(),
        )
        for r, end in done
    ]


def _cluster(nodes: Sequence[NodeGpus]) -> ClusterView:
    """Slurm's nodes as the policy sees them: each node's free GPUs whole, the rest busy (racks unknown)."""
    node_gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
    max_gpus = int(node_gpus.max()) if len(node_gpus) else 0
    share = np.full((len(nodes), max(max_gpus, 1)), -1, dtype=np.int64)
    owner = np.full_like(share, -2)
    for i, n in enumerate(nodes):
        share[i, : n.gpus] = 0
        share[i, : n.gpus - n.used] = FULL_SHARE
        owner[i, : n.gpus - n.used] = -1
    free = np.array([n.gpus - n.used for n in nodes], dtype=np.int64)
    return ClusterView(share, free, owner, node_gpus, np.zeros(len(nodes), dtype=np.int64), 1)


def _limit(j: QueueJob) -> float:
    return j.time_limit if j.time_limit is not None else math.nan


def _pending_rows(pending: Sequence[QueueJob], pred: Predictions, max_gpus: int) -> list[PendingRow]:
    from headway.policy.placement import max_nodes_for

    return [
        PendingRow(
            key=i,
            job_id=j.job_id,
            user=j.user or "",
            name=j.name,
            group=j.account,
            klass=j.qos or "normal",
            submit=j.submit_time,
            gpus=j.gpus,
            max_nodes=max_nodes_for(j.gpus, j.nodes, max_gpus),
            time_limit=_limit(j),
            p_success=float(pred.p_success[i]),
            runtime=float(pred.runtime[i]),
            runtime_p90=float(pred.runtime_p90[i]),
            time_to_failure=float(pred.time_to_failure[i]),
        )
        for i, j in enumerate(pending)
    ]


def _running_rows(
    running: Sequence[QueueJob],
    pred: Predictions,
    first_key: int,
    now: float,
    preemptible_qos: frozenset[str] = DEFAULT_PREEMPTIBLE_QOS,
) -> list[RunningRow]:
    """The running jobs as the policy core reads them: preemptable when their QOS is one of
    `preemptible_qos`, with the predictor's chance to complete and time to failure. Slurm says nothing of
    a job's checkpoints or its last preemption in squeue, so those keep the policies' defaults."""
    return [
        RunningRow(
            key=first_key + i,
            job_id=j.job_id,
            user=j.user or "",
            klass=j.qos or "normal",
            gpus=j.gpus,
            start=j.start_time if j.start_time is not None else now,
            time_limit=_limit(j),
            runtime=float(pred.runtime[i]),
            runtime_p90=float(pred.runtime_p90[i]),
            preemptible=j.qos is not None and j.qos.lower() in preemptible_qos,
            p_success=float(pred.p_success[i]),
            time_to_failure=float(pred.time_to_failure[i]),
        )
        for i, j in enumerate(running)
    ]


def build_snapshot(
    pending: Sequence[QueueJob],
    running: Sequence[QueueJob],
    nodes: Sequence[NodeGpus],
    pred_pending: Predictions,
    pred_running: Predictions,
    history: Sequence[JobRecord],
    now: float,
    seq: int,
    preemptible_qos: frozenset[str] = DEFAULT_PREEMPTIBLE_QOS,
) -> Snapshot:
    """The policy core's read-only view of a live Slurm cluster, built as the simulator and the local
    queue build theirs (policy/inputs.py): a `PolicyBook` fed with the history in end order, then the
    queue's jobs. The book is built afresh each pass: sacct may rewrite a job it reported before."""
    classes = sorted({j.qos or "normal" for j in (*pending, *running)}) or ["normal"]
    # A job is keyed by user and name, else user and account; by user alone only where no job of the
    # history or the queue has a name or an account (`streak_key`), as the audit keys its repeat failures.
    log_has_names = any(r.name or r.group for r in history) or any(
        j.name or j.account for j in (*pending, *running)
    )
    book = PolicyBook.new(classes)
    add_ended(book, _ended_rows(history), log_has_names=log_has_names)
    view = _cluster(nodes)
    cols = pending_columns(
        book, _pending_rows(pending, pred_pending, view.max_node_gpus), log_has_names=log_has_names
    )
    run = running_jobs(book, _running_rows(running, pred_running, len(pending), now, preemptible_qos))
    return book.snapshot(now, seq, cols, run, view, running_in_ledger=False)


class SlurmSync:
    """Keeps the predictor and history between passes; each pass reads Slurm afresh."""

    def __init__(
        self,
        runner: Runner,
        options: SyncOptions,
        predictor_factory: PredictorFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.runner = runner
        self.options = options
        self.clock = clock
        self.history = History()
        self.predictor = (predictor_factory or default_predictor)()
        self.fed: set[str] = set()
        self.seq = 0  # snapshots ranked (the policy's pass number)
        self.passes = 0
        self._store_loaded = False
        # Ended jobs read from sacct but not yet in the store (a pass that failed after the read, e.g. on
        # a locked store): `History` has already moved past them, so they wait here for the next pass.
        self._unstored: dict[str, JobRecord] = {}
        # SiteFactors this process wrote: sprio does not list held jobs and no other Slurm 22.05 command
        # shows a SiteFactor, so this is all that is known of a held job's value once this process has
        # reset it (see the resets in `plan`); a new process resets each held job once.
        self.written: dict[str, int] = {}
        # Called after each answered `scontrol update` with (answered, planned): the CLI's progress line.
        self.on_progress: Progress | None = None
        # --apply passes not yet in the store's decision log (it was held by another process), and
        # whether that was said (once, until the log is written again).
        self._unlogged: list[DecisionRecord] = []
        self._log_warned = False

    def _feed(self, now: float) -> None:
        """Tell the predictor about ended jobs it has not seen, in end order, strictly before now."""
        todo = [
            r
            for r in self.history.jobs.values()
            if r.job_id not in self.fed and r.end_time is not None and r.end_time.timestamp() < now
        ]
        todo.sort(key=lambda r: (r.end_time, r.job_id))
        for r in todo:
            self.predictor.observe_end(
                EndedJob(
                    job=submitted_from_record(r),
                    start_time=_epoch(r.start_time) or _epoch(r.end_time) or 0.0,
                    end_time=_epoch(r.end_time) or 0.0,
                    state=r.state.value,
                    started=r.start_time is not None,
                )
            )
            self.fed.add(r.job_id)
        self.predictor.maybe_retrain(now)

    def load_store(self) -> None:
        """The store's history, once; raises SlurmError (a bad --db fails at startup, not every pass)."""
        if not self._store_loaded:
            self.history.load_store(self.options.db, self.options.source)
            self._store_loaded = True

    def _store_new(self, records: Sequence[JobRecord]) -> None:
        import duckdb

        from headway.schema import records_to_table
        from headway.store import JobStore, StoreError, default_db_path

        if not records:
            return
        try:
            with JobStore(self.options.db) as store:
                n = store.upsert(records_to_table(records))
                store.record_ingest("headway slurm sync", "sacct", self.options.source, len(records), n, 0)
                try:  # earlier passes waiting for the decision log: in the same open
                    self._write_log(store.con)
                except duckdb.Error as e:
                    self._log_failed(" ".join(str(e).split()) or type(e).__name__)
        except StoreError as e:
            raise SlurmError(str(e)) from e
        except duckdb.Error as e:  # e.g. its directory not writable by this user: DuckDB's .wal fails
            path = self.options.db or default_db_path()
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SlurmError(f"{path}: cannot write the job store: {said}") from e

    def plan(self) -> Plan:
        """Read everything, predict and rank; raises SlurmError when any input cannot be read."""
        opts = self.options
        self.load_store()
        # History and training first: training on a long history takes seconds to a minute, and the
        # queue read after it is what the staleness check at write time measures.
        history_at = self.clock()
        warning = None
        try:
            new = self.history.fetch(self.runner, opts.since, opts.source, history_at)
        except (SlurmMissing, SlurmDenied):
            raise
        except SlurmError as e:
            # slurmdbd down: Slurm's queue still moves, so rank with the history held (new jobs would
            # otherwise sit at SiteFactor 0); with none held yet there is nothing to rank with.
            held = self.history.held_since(history_at)
            if held is None:
                raise
            new, warning = [], f"{e}; ranking with {held}"
        else:
            if self.history.bad_rows:  # a job name with a line break splits its -P row: say so
                warning = (
                    f"{self.history.bad_rows:,} rows of sacct's history could not be read (a job name "
                    "holding a line break?): those jobs are missing from the history"
                )
        if opts.apply:  # kept until stored, whatever fails later in this pass
            self._unstored.update((r.job_id, r) for r in new)
            self._store_new(list(self._unstored.values()))  # raises (the pass fails) and keeps them
            self._unstored.clear()
        self._feed(history_at)
        read_at = self.clock()
        jobs, queue_source = read_queue(self.runner)
        nodes = parse_sinfo(self.runner.run("sinfo", SINFO_ARGS).stdout)
        current = read_site_factors(self.runner)
        now = self.clock()
        # Jobs of one submit second in Slurm's own numbering (10 after 9, not before 5), as everywhere.
        pending_all = sorted(
            (j for j in jobs if j.state == "PENDING"), key=lambda j: (j.submit_time, natural_key(j.job_id))
        )
        running = [j for j in jobs if j.state == "RUNNING"]
        queued = {j.job_id for j in pending_all}
        self.written = {k: v for k, v in self.written.items() if k in queued}  # started or gone: forget
        pending = [j for j in pending_all if j.gpus > 0 and not j.cannot_start]
        skipped = [j.display_id for j in pending_all if j.gpus <= 0]
        waiting = {
            j.display_id: j.reason or ("held (priority 0)" if j.held else "")
            for j in pending_all
            if j.gpus > 0 and j.cannot_start
        }
        self.seq += 1
        rows: list[PlanRow] = []
        if pending:
            preds = self.predictor.predict([submitted_from_queue(j) for j in pending], now)
            pred_run = self.predictor.predict([submitted_from_queue(j) for j in running], now)
            snap = build_snapshot(
                pending,
                running,
                nodes,
                preds,
                pred_run,
                list(self.history.jobs.values()),
                now,
                self.seq,
                opts.preemptible_qos,
            )
            ranking = rank_jobs(snap, opts.policy)
            order_ids = [str(ranking.job_id[int(i)]) for i in ranking.order]
            target = place_ranks(order_ids, current, opts.rng)
            for rank, pos in enumerate(ranking.order, start=1):
                p = int(pos)
                j = pending[p]
                rows.append(
                    PlanRow(
                        job_id=j.job_id,
                        user=j.user,
                        name=j.name,
                        gpus=j.gpus,
                        rank=rank,
                        tier=ranking.tier_names[int(ranking.tier[p])],
                        score=float(ranking.score[p]),
                        factors={k: float(v[p]) for k, v in ranking.factors.items()},
                        reason=ranking.reason(p),
                        current=current.get(j.job_id),
                        target=target[j.job_id],
                        slurm_id=j.display_id,
                        tasks=j.tasks,
                    )
                )
        # A job left alone keeps no stale SiteFactor from when it was ranked (or from another --range): it
        # goes to the bottom of the range, and is ranked again once it can start. A held job's value
        # cannot be read (sprio leaves it out, squeue and `scontrol show job` do not show one), so unless
        # this process wrote it, it is written: once per held job and process, so that a job held while
        # another sync process ranked it is reset after a restart too. A job waiting on a dependency or a
        # begin time is reset only when its value is known to differ (an update makes Slurm show it as
        # eligible until its next scheduling pass, which would rank and rewrite it every pass).
        known = self.written | current  # what sprio shows wins over what this process remembers
        resets = {
            j.job_id: opts.rng.lo
            for j in pending_all
            if j.gpus > 0
            and j.cannot_start
            and known.get(j.job_id) != opts.rng.lo
            and (j.held or j.job_id in known)
        }
        changes = plan_changes(
            {r.job_id: r.target for r in rows} | resets,
            {r.job_id: r.current for r in rows if r.current is not None}
            | {k: known[k] for k in resets if k in known},
        )
        return Plan(
            read_at=read_at,
            queue_source=queue_source,
            pending=len(pending_all),
            running=len(running),
            history_new=len(new),
            history_total=len(self.history.jobs),
            rows=rows,
            skipped_cpu_only=skipped,
            changes=changes,
            skipped_waiting=waiting,
            resets=[j.display_id for j in pending_all if j.job_id in resets],
            arrays={j.job_id: j.display_id for j in pending_all if j.display_id != j.job_id},
            warning=warning,
            queue_running=running,
        )

    def run_pass(self) -> PassReport:
        """One pass; trouble ends up in the report (ok=False), never as an exception, so a loop goes on.

        Only what retrying cannot fix is raised: Slurm missing or not configured, or refusing the update.
        """
        self.passes += 1
        report = PassReport(seq=self.passes, at=self.clock(), ok=False, dry_run=not self.options.apply)
        began = time.perf_counter()
        try:
            self._pass(report)
        except (SlurmMissing, SlurmDenied) as e:
            report.error = str(e)
            self._log_pass(report, time.perf_counter() - began)
            raise
        except SlurmError as e:
            report.error = str(e)
        except Exception as e:  # a bug or a surprise from Slurm must not end a long-running loop
            report.error = f"unexpected {type(e).__name__}: {e}; nothing more written this pass"
        self._log_pass(report, time.perf_counter() - began)
        return report

    def _log_pass(self, report: PassReport, duration_s: float) -> None:
        """Record an --apply pass in the store's decision log; a dry run writes nothing to the store."""
        if not self.options.apply:
            return
        try:
            rec = decision_record(report, self.options, duration_s)
        except Exception as e:  # a bug here must not fail the pass it records
            self._log_failed(f"cannot record pass {report.seq}: {type(e).__name__}: {e}")
            return
        self._unlogged = [*self._unlogged, rec][-LOG_BACKLOG:]
        from headway.store import JobStore

        try:
            with JobStore(self.options.db, wait=LOG_WAIT_S, on_wait=lambda _said: None) as store:
                self._write_log(store.con)
        except Exception as e:
            said = " ".join(str(e).split()) or type(e).__name__
            self._log_failed(f"{said}; {len(self._unlogged)} pass(es) wait for the next try")

    def _write_log(self, con: Any) -> None:
        """The passes waiting for the decision log, oldest first; each is forgotten once written."""
        from headway import decision_log

        while self._unlogged:
            decision_log.record(con, self._unlogged[0])
            self._unlogged.pop(0)
        self._log_warned = False

    def _log_failed(self, said: str) -> None:
        if not self._log_warned:
            self._log_warned = True
            print(f"warning: the store's decision log not written: {said}", file=sys.stderr)

    def _pass(self, report: PassReport) -> None:
        plan = self.plan()
        report.plan = plan
        if not self.options.apply or not plan.changes:
            report.ok = True
            return
        age = self.clock() - plan.read_at
        if age > self.options.max_age_s:
            report.not_attempted = list(plan.changes)
            report.error = (
                f"queue read {age:.0f} s ago (over {self.options.max_age_s:.0f} s): stale, wrote nothing"
            )
            return
        # Filled update by update, so that whatever stops the writing, the report says what was written.
        writes = ApplyReport()
        try:
            apply_changes(self.runner, plan.changes, on_progress=self.on_progress, report=writes)
        except KeyboardInterrupt:
            report.interrupted = True
            writes.aborted = "interrupted (Ctrl-C) while writing"
        finally:
            self.written.update((c.job_id, c.new) for c in writes.applied)
            report.applied, report.failed = writes.applied, writes.failed
            report.not_attempted, report.commands = writes.not_attempted, writes.commands
        report.ok = writes.aborted is None
        if writes.aborted is not None:
            report.error = f"{writes.aborted}; {report.writes()}"


def decision_record(report: PassReport, options: SyncOptions, duration_s: float | None) -> DecisionRecord:
    """A pass as the decision log keeps it: its ranking (with why, in words where `slurm why` has
    words for it), the SiteFactors it wrote and the queue's running jobs."""
    from headway.decision_log import DecisionRecord
    from headway.slurm.explain import rank_in_words

    plan = report.plan
    rows = plan.rows if plan is not None else []
    ranking = []
    for r in rows:
        f = r.factors
        # rank_in_words has words only for starved and held jobs and for those likely to fail fast (p < 0.5
        # and F < R); asking it only then keeps a long queue's pass from computing a median per job.
        maybe = r.tier.startswith(("starved", "held")) or (
            f.get("p", 1.0) < 0.5 and f.get("F_h", math.inf) < f.get("R_h", -math.inf)
        )
        ranking.append(
            {
                "job_id": r.job_id,
                "slurm_id": r.display_id,
                "tasks": r.tasks,
                "rank": r.rank,
                "tier": r.tier,
                "score": r.score,
                "p_success": f.get("p"),
                "runtime_s": f["R_h"] * 3600.0 if "R_h" in f else None,
                "reason": (rank_in_words(r, rows) if maybe else None) or r.reason,
                "estimated_start": None,  # Slurm's own scheduler starts the jobs; a pass estimates none
                "user": r.user,
                "name": r.name,
                "gpus": r.gpus,
                "site_factor": r.target,
            }
        )
    running = [
        {
            "job_id": j.job_id,
            "slurm_id": j.display_id,
            "user": j.user,
            "name": j.name,
            "gpus": j.gpus,
            "where": f"{j.nodes} node{'s' if j.nodes != 1 else ''}",
        }
        for j in (plan.queue_running if plan is not None else [])
    ]
    return DecisionRecord(
        at=dt.datetime.fromtimestamp(report.at, dt.UTC),
        source=options.source,
        adapter="slurm",
        policy=options.policy,
        ok=report.ok,
        applied=options.apply,
        duration_s=duration_s,
        error=report.error,
        written=tuple({"job_id": c.job_id, "old": c.old, "new": c.new} for c in report.applied),
        ranking=tuple(ranking),
        running=tuple(running),
        pending=plan.pending if plan is not None else None,
    )


def run_loop(
    sync: SlurmSync,
    interval_s: float,
    on_report: Callable[[PassReport], None],
    stop: threading.Event | None = None,
    max_passes: int | None = None,
) -> int:
    """Pass after pass; after a failed pass wait interval x 2^k (k failures in a row, capped at 8x)."""
    stop = stop or threading.Event()
    passes = 0
    failures = 0
    while not stop.is_set():
        report = sync.run_pass()
        passes += 1
        try:
            on_report(report)
        except Exception as e:  # showing a pass must never stop the syncing: say so on one line, go on
            said = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"pass {report.seq}: could not show its report: {said}", file=sys.stderr)
        if report.interrupted:  # Ctrl-C while writing: its report is shown, then the loop stops
            raise KeyboardInterrupt
        failures = 0 if report.ok else failures + 1
        if max_passes is not None and passes >= max_passes:
            break
        wait = interval_s * (2 ** min(failures, 3)) if failures else interval_s
        stop.wait(wait)
    return passes


__all__ = [
    "DEFAULT_PREEMPTIBLE_QOS",
    "History",
    "PassReport",
    "Plan",
    "PlanRow",
    "SlurmDown",
    "SlurmSync",
    "SyncOptions",
    "build_snapshot",
    "decision_record",
    "parse_qos_list",
    "rank_jobs",
    "run_loop",
]
