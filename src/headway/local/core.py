"""The local queue's state machine: events in, instructions out, no I/O and no clock.

Every change of a job's state happens in `QueueCore.handle`; the daemon (daemon.py) persists the jobs it
reports as changed, then carries out the instructions (start a supervisor, signal one, record an end).
Ordering is not decided here: a `Planner` (ordering.py, which calls the shared policy core) is handed a
frozen view of the queue and returns which jobs start on which GPUs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from headway.local.protocol import PRIORITIES as PRIORITIES  # the classes a request may ask for


class JobState(StrEnum):
    PENDING = "PENDING"
    LAUNCHING = "LAUNCHING"  # GPUs given and the supervisor asked to start; not yet confirmed
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"

    @property
    def active(self) -> bool:
        return self in (JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING)

    @property
    def short(self) -> str:
        """Slurm's two-letter code, for the `queue` table."""
        return _SHORT[self]


_SHORT = {
    JobState.PENDING: "PD",
    JobState.LAUNCHING: "CF",
    JobState.RUNNING: "R",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.TIMEOUT: "TO",
    JobState.CANCELLED: "CA",
}


@dataclass(slots=True)
class LocalJob:
    """One queued job as the core sees it (its argv and environment stay in the database)."""

    id: int
    user: str
    uid: int
    name: str
    gpus: int
    submit_time: float
    time_limit: float | None = None
    priority: str = "normal"
    after: int | None = None
    state: JobState = JobState.PENDING
    attempt: int = 0
    gpu_ids: tuple[int, ...] = ()
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str = ""
    cancel_requested: bool = False
    # Predictions made when it was submitted (or refreshed after a retrain); None until made.
    p_success: float | None = None
    pred_runtime: float | None = None
    pred_runtime_p90: float | None = None
    pred_ttf: float | None = None
    # Preemption (docs/local-queue.md, "Preemption"): whether its user let a higher class stop it (it is
    # requeued under the same id), how often it saves its progress (seconds; None: the default), how
    # many times it was stopped and when last, the GPU-seconds its earlier runs served, the seconds of
    # run time its checkpoints kept, whether a stop is under way, and the probe length of this run.
    preemptible: bool = False
    checkpoint_every: float | None = None
    preemptions: int = 0
    last_preempted: float | None = None
    attained: float = 0.0
    progress: float = 0.0
    preempt_requested: bool = False
    probe_s: float = 0.0  # > 0: this run is a fail-fast probe, stopped (and requeued) after probe_s seconds

    @property
    def stopping(self) -> bool:
        """Told to stop (cancel or preemption) and not yet gone: its GPUs are still held."""
        return self.cancel_requested or self.preempt_requested

    def copy(self) -> LocalJob:
        return dataclasses.replace(self)


# ---- events (past tense: something happened) ----


@dataclass(frozen=True, slots=True)
class Submitted:
    job: LocalJob


@dataclass(frozen=True, slots=True)
class Claimed:
    """The supervisor of this attempt started the job at `start_time`."""

    job_id: int
    attempt: int
    start_time: float


@dataclass(frozen=True, slots=True)
class Finished:
    job_id: int
    attempt: int
    state: JobState
    exit_code: int | None
    start_time: float | None
    end_time: float


@dataclass(frozen=True, slots=True)
class Preempted:
    """The supervisor stopped this attempt because the daemon preempted it (SIGTERM, grace, SIGKILL); the
    job's processes are gone, so its GPUs are free."""

    job_id: int
    attempt: int
    exit_code: int | None
    start_time: float | None
    end_time: float


@dataclass(frozen=True, slots=True)
class Abandoned:
    """A launch that never started (the daemon died before its supervisor claimed it)."""

    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Lost:
    """The supervisor died without recording an end (e.g. killed by hand, or a reboot)."""

    job_id: int
    attempt: int
    time: float


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: int
    time: float


@dataclass(frozen=True, slots=True)
class Predicted:
    job_id: int
    p_success: float
    runtime: float
    runtime_p90: float
    time_to_failure: float


@dataclass(frozen=True, slots=True)
class Tick:
    """A scheduling pass at wall time `now`."""

    now: float


Event = Submitted | Claimed | Finished | Preempted | Abandoned | Lost | CancelRequested | Predicted | Tick

# ---- instructions (imperative: what the I/O layer must do) ----


@dataclass(frozen=True, slots=True)
class Launch:
    job_id: int
    attempt: int
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Terminate:
    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop the attempt to requeue it: its supervisor sends SIGTERM, waits the preemption grace, then
    SIGKILL, and reports `Preempted`."""

    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Requeued:
    """A preempted run is over (the job is pending again): charge its GPU time to its user's fair share
    (never to a failure streak) and drop the attempt's run directory."""

    job: LocalJob
    attempt: int
    start_time: float | None
    end_time: float


@dataclass(frozen=True, slots=True)
class Record:
    """A job ended: write it to the job store and teach the predictor."""

    job: LocalJob


@dataclass(frozen=True, slots=True)
class LogDecision:
    plan: Plan
    now: float


Instruction = Launch | Terminate | Preempt | Requeued | Record | LogDecision

# ---- the planner's contract ----


@dataclass(frozen=True, slots=True)
class QueueView:
    """A frozen picture of the queue for one scheduling pass."""

    now: float
    gpu_ids: tuple[int, ...]
    free_gpu_ids: tuple[int, ...]
    pending: tuple[LocalJob, ...]  # eligible to start (dependencies met), in submit order
    running: tuple[LocalJob, ...]  # launching or running


@dataclass(frozen=True, slots=True)
class RankEntry:
    job_id: int
    rank: int  # 1 = next to start
    score: float
    factors: Mapping[str, float]
    reason: str  # the policy's explanation, in words


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    starts: tuple[tuple[int, tuple[int, ...]], ...]  # (job id, GPU ids)
    ranking: tuple[RankEntry, ...]
    reservation: tuple[int, float] | None = None  # (job id, estimated start) of the blocked head job
    estimated_start: Mapping[int, float] = field(default_factory=dict)
    wake_at: float | None = None  # the policy wants another pass then (e.g. a job about to starve)
    decision: str = ""  # the policy core's Decision id
    # Running jobs to preempt, and for each pending job that waits for some of them, which: it starts in
    # a later pass, once their processes are gone and their GPUs free (never on GPUs still held).
    preempt: tuple[int, ...] = ()
    waits_for_preempted: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    probes: Mapping[int, float] = field(default_factory=dict)  # job id -> probe length (s) of a start


Planner = Callable[[QueueView], Plan]


@dataclass(slots=True)
class Step:
    """What one `handle` call produced: instructions to carry out, jobs to persist, event-log lines."""

    instructions: list[Instruction] = field(default_factory=list)
    changed: set[int] = field(default_factory=set)
    log: list[tuple[int, str, str]] = field(default_factory=list)  # (job id, kind, detail)


TOO_BIG = "BadConstraints"  # Slurm's word for a job whose request this server cannot meet


class CoreError(RuntimeError):
    """An event or plan that breaks an invariant: a bug, never user input."""


class QueueCore:
    """Active jobs, the GPUs they hold, and the latest plan; changed only by `handle`."""

    def __init__(self, gpu_ids: Iterable[int], planner: Planner) -> None:
        self.gpu_ids: tuple[int, ...] = tuple(sorted(set(gpu_ids)))
        self.planner = planner
        self.jobs: dict[int, LocalJob] = {}  # active jobs
        self.ended: dict[int, JobState] = {}  # final state of every ended job (for --after)
        self.last_plan: Plan | None = None
        self._recent: dict[int, LocalJob] = {}
        # GPUs that jobs launched before a restart still hold but this daemon no longer hands out
        # (restarted with a smaller --gpus set): valid while those jobs run, never given again.
        self.retired: set[int] = set()

    # -- loading after a restart --

    def load(self, active: Iterable[LocalJob], ended: Mapping[int, JobState]) -> None:
        self.ended.update(ended)
        for job in active:
            self.jobs[job.id] = job
            if job.state is not JobState.PENDING:
                self.retired.update(g for g in job.gpu_ids if g not in self.gpu_ids)
        self.validate()

    def reset(self) -> None:
        """Forget everything (before loading again from the database, which is the truth)."""
        self.jobs.clear()
        self.ended.clear()
        self._recent.clear()
        self.retired.clear()
        self.last_plan = None

    # -- queries --

    def used_gpu_ids(self) -> set[int]:
        return {g for j in self.jobs.values() if j.state is not JobState.PENDING for g in j.gpu_ids}

    def free_gpu_ids(self) -> tuple[int, ...]:
        used = self.used_gpu_ids()
        return tuple(g for g in self.gpu_ids if g not in used)

    def state_of(self, job_id: int) -> JobState | None:
        job = self.jobs.get(job_id)
        return job.state if job is not None else self.ended.get(job_id)

    def validate(self) -> None:
        """Invariants checked after every event in tests: each GPU held by at most one job, and so on."""
        seen: dict[int, int] = {}
        for j in self.jobs.values():
            if not j.state.active:
                raise CoreError(f"job {j.id} is {j.state} but still active")
            if j.state is JobState.PENDING:
                if j.gpu_ids:
                    raise CoreError(f"pending job {j.id} holds GPUs {j.gpu_ids}")
                continue
            if len(j.gpu_ids) != j.gpus:
                raise CoreError(f"job {j.id} wants {j.gpus} GPUs but holds {j.gpu_ids}")
            for g in j.gpu_ids:
                if g not in self.gpu_ids and g not in self.retired:
                    raise CoreError(f"job {j.id} holds unknown GPU {g}")
                if g in seen:
                    raise CoreError(f"GPU {g} given to jobs {seen[g]} and {j.id}")
                seen[g] = j.id
        overlap = set(self.jobs) & set(self.ended)
        if overlap:
            raise CoreError(f"jobs both active and ended: {sorted(overlap)}")

    # -- the one way state changes --

    def handle(self, *events: Event) -> Step:
        step = Step()
        for ev in events:
            self._one(ev, step)
        return step

    def _one(self, ev: Event, step: Step) -> None:
        match ev:
            case Submitted(job=new):
                if new.id in self.jobs or new.id in self.ended:
                    raise CoreError(f"job {new.id} submitted twice")
                self.jobs[new.id] = new
                step.changed.add(new.id)
                step.log.append((new.id, "submitted", f"{new.gpus} GPU(s)"))
            case Claimed(job_id=jid, attempt=att, start_time=t):
                job = self._attempt(jid, att)
                if job is not None and job.state is JobState.LAUNCHING:
                    job.state = JobState.RUNNING
                    job.start_time = t
                    step.changed.add(jid)
                    step.log.append((jid, "started", f"GPUs {_ids(job.gpu_ids)}"))
            case Finished():
                self._finish(ev, step)
            case Abandoned(job_id=jid, attempt=att):
                job = self._attempt(jid, att)
                if job is None or job.state is JobState.PENDING:
                    return
                if job.cancel_requested:
                    self._end(job, JobState.CANCELLED, None, None, None, step, "cancelled before it started")
                    return
                job.state = JobState.PENDING
                job.gpu_ids = ()
                job.attempt += 1
                job.preempt_requested = False
                job.probe_s = 0.0
                job.reason = "requeued: its launch was interrupted"
                step.changed.add(jid)
                step.log.append((jid, "requeued", f"attempt {att} never started"))
            case Lost(job_id=jid, attempt=att, time=t):
                job = self._attempt(jid, att)
                if job is None or job.state is JobState.PENDING:
                    return
                if job.preempt_requested and not job.cancel_requested:
                    # It was being stopped to be requeued anyway (the daemon killed what was left of it).
                    why = "its supervisor vanished while stopping"
                    self._requeue(job, None, job.start_time, t, step, why)
                else:
                    self._end(job, JobState.FAILED, None, job.start_time, t, step, "its supervisor vanished")
            case Preempted(job_id=jid, attempt=att, exit_code=code, start_time=start, end_time=end):
                job = self._attempt(jid, att)
                if job is None or job.state is JobState.PENDING:
                    return
                start = start if start is not None else job.start_time
                if job.cancel_requested:  # cancelled while it was being stopped: it ends, as cancelled
                    self._end(job, JobState.CANCELLED, code, start, end, step, "cancelled")
                else:
                    self._requeue(job, code, start, end, step, "preempted")
            case CancelRequested(job_id=jid, time=t):
                job = self.jobs.get(jid)
                if job is None:
                    return
                if job.state is JobState.PENDING:
                    self._end(job, JobState.CANCELLED, None, None, t, step, "cancelled while pending")
                elif not job.cancel_requested:
                    job.cancel_requested = True
                    step.changed.add(jid)
                    step.instructions.append(Terminate(jid, job.attempt))
                    step.log.append((jid, "cancel", "asked to stop"))
            case Predicted(job_id=jid):
                job = self.jobs.get(jid)
                if job is not None:
                    job.p_success = ev.p_success
                    job.pred_runtime = ev.runtime
                    job.pred_runtime_p90 = ev.runtime_p90
                    job.pred_ttf = ev.time_to_failure
                    step.changed.add(jid)
            case Tick(now=now):
                self._schedule(now, step)

    def _attempt(self, job_id: int, attempt: int) -> LocalJob | None:
        """The active job if `attempt` is its current one; reports about older attempts are stale."""
        job = self.jobs.get(job_id)
        if job is None or job.attempt != attempt:
            return None
        return job

    def _finish(self, ev: Finished, step: Step) -> None:
        job = self._attempt(ev.job_id, ev.attempt)
        if job is None or job.state is JobState.PENDING:
            return
        reason = {
            JobState.TIMEOUT: "time limit reached",
            JobState.CANCELLED: "cancelled",
            JobState.FAILED: f"exit code {ev.exit_code}",
        }.get(ev.state, "")
        self._end(job, ev.state, ev.exit_code, ev.start_time or job.start_time, ev.end_time, step, reason)

    def _end(
        self,
        job: LocalJob,
        state: JobState,
        exit_code: int | None,
        start: float | None,
        end: float | None,
        step: Step,
        reason: str,
    ) -> None:
        job.state = state
        job.exit_code = exit_code
        job.start_time = start
        job.end_time = end if end is not None else (start or job.submit_time)
        job.reason = reason
        del self.jobs[job.id]
        self.ended[job.id] = state
        step.changed.add(job.id)
        step.instructions.append(Record(job.copy()))
        step.log.append((job.id, "ended", state.value + (f" ({reason})" if reason else "")))
        self._recent[job.id] = job

    def _requeue(
        self, job: LocalJob, exit_code: int | None, start: float | None, end: float, step: Step, why: str
    ) -> None:
        """A preempted run is over: the job is pending again under the same id and its next attempt. Not
        an end: nothing goes to the job store or the failure streaks, and the exit code of the SIGTERM is
        not kept. Its run counts as service (`attained`) and, up to its last checkpoint, as progress."""
        ran = max(0.0, end - start) if start is not None else 0.0
        job.progress += kept_progress(ran, job.checkpoint_every)
        job.attained += job.gpus * ran
        job.preemptions += 1
        job.last_preempted = end
        old_attempt, old_start = job.attempt, start
        job.state = JobState.PENDING
        job.gpu_ids = ()
        job.attempt += 1
        job.start_time = None
        job.end_time = None
        job.exit_code = None
        job.preempt_requested = False
        if job.probe_s > 0:  # a probe that ran its length: what runs next is an ordinary, stoppable run
            job.preemptible = True
        job.probe_s = 0.0
        job.reason = f"requeued: {why}"
        step.changed.add(job.id)
        step.instructions.append(Requeued(job.copy(), old_attempt, old_start, end))
        detail = f"attempt {old_attempt} stopped after {ran:.0f}s (exit {exit_code}); next {job.attempt}"
        step.log.append((job.id, "requeued", detail))

    def _preempt(self, job: LocalJob, step: Step, why: str) -> None:
        job.preempt_requested = True
        step.changed.add(job.id)
        step.instructions.append(Preempt(job.id, job.attempt))
        step.log.append((job.id, "preempt", why))

    def preempting(self) -> bool:
        """Whether a preemption is under way (a job told to stop for one has not yet gone)."""
        return any(j.preempt_requested for j in self.jobs.values())

    def next_probe_end(self) -> float | None:
        """When the earliest running probe is due to be stopped (the daemon passes then)."""
        ends = [
            j.start_time + j.probe_s
            for j in self.jobs.values()
            if j.state is JobState.RUNNING and j.probe_s > 0 and j.start_time is not None and not j.stopping
        ]
        return min(ends) if ends else None

    def _stop_probes(self, now: float, step: Step) -> None:
        """A probe run stops at its length unless it ended first; it is requeued as preemptible."""
        for job in self.jobs.values():
            if job.state is not JobState.RUNNING or job.probe_s <= 0 or job.start_time is None:
                continue
            if job.stopping or now < job.start_time + job.probe_s:
                continue
            self._preempt(job, step, f"its {job.probe_s:.0f}s probe is over")

    def _apply_preemptions(self, plan: Plan, step: Step) -> None:
        """Tell the plan's victims to stop. Only a RUNNING job whose user made it preemptible is ever
        stopped, whatever the policy asked; and one preemption at a time: while a stopped job's processes
        are still going (up to the grace), no other job is preempted for the GPUs it is about to free."""
        if not plan.preempt or self.preempting():
            return

        def stoppable(vid: int) -> LocalJob | None:
            job = self.jobs.get(vid)
            if job is None or job.state is not JobState.RUNNING or not job.preemptible or job.stopping:
                return None
            return job

        # A start's victims go all together or not at all: stopping some of them frees too little.
        for who, victims in plan.waits_for_preempted.items():
            jobs = [stoppable(v) for v in victims]
            if all(j is not None for j in jobs):
                for j in jobs:
                    if j is not None and not j.stopping:
                        self._preempt(j, step, f"for job {who}")
        named = {v for vs in plan.waits_for_preempted.values() for v in vs}
        for vid in plan.preempt:
            if vid not in named and (job := stoppable(vid)) is not None:
                self._preempt(job, step, "by the policy")

    def take_ended(self) -> dict[int, LocalJob]:
        """Jobs that ended since the last call; the daemon persists them, then forgets them."""
        out, self._recent = self._recent, {}
        return out

    def job(self, job_id: int) -> LocalJob | None:
        """An active job, or one that ended since the last `take_ended`."""
        return self.jobs.get(job_id) or self._recent.get(job_id)

    def _on_our_gpus(self, job: LocalJob) -> LocalJob:
        """A copy of a running job for the planner, holding only GPUs this daemon hands out."""
        c = job.copy()
        if self.retired and set(c.gpu_ids) & self.retired:
            c.gpu_ids = tuple(g for g in c.gpu_ids if g not in self.retired)
            c.gpus = len(c.gpu_ids)
        return c

    def _schedule(self, now: float, step: Step) -> None:
        self._stop_probes(now, step)
        eligible: list[LocalJob] = []
        for cand in sorted(self.jobs.values(), key=lambda j: j.id):
            if cand.state is not JobState.PENDING:
                continue
            if cand.after is not None:
                dep = self.state_of(cand.after)
                if dep is None or dep.active:
                    if cand.reason != "Dependency":
                        cand.reason = "Dependency"
                        step.changed.add(cand.id)
                    continue
                if dep is not JobState.COMPLETED:
                    why = f"dependency {cand.after} ended {dep}"
                    self._end(cand, JobState.CANCELLED, None, None, now, step, why)
                    continue
            if cand.gpus > len(self.gpu_ids):
                # Queued before a restart with fewer GPUs (or NVML not up yet): it can never start here,
                # and must not hold up the jobs behind it. It waits for a daemon with enough GPUs.
                if cand.reason != TOO_BIG:
                    cand.reason = TOO_BIG
                    step.changed.add(cand.id)
                continue
            eligible.append(cand)
        if not eligible:
            self.last_plan = None
            return
        running = tuple(self._on_our_gpus(j) for j in self.jobs.values() if j.state is not JobState.PENDING)
        view = QueueView(now, self.gpu_ids, self.free_gpu_ids(), tuple(j.copy() for j in eligible), running)
        plan = self.planner(view)
        self.last_plan = plan
        free = set(view.free_gpu_ids)
        by_id = {j.id: j for j in eligible}
        for jid, gids in plan.starts:
            job = by_id.get(jid)
            if job is None or job.state is not JobState.PENDING:
                raise CoreError(f"plan starts job {jid}, which is not an eligible pending job")
            if len(gids) != job.gpus or not set(gids) <= free or len(set(gids)) != len(gids):
                raise CoreError(f"plan gives job {jid} GPUs {gids}; free are {sorted(free)}")
            free -= set(gids)
            job.state = JobState.LAUNCHING
            job.gpu_ids = tuple(gids)
            job.probe_s = float(plan.probes.get(jid, 0.0))
            job.reason = ""
            step.changed.add(jid)
            step.instructions.append(Launch(jid, job.attempt, job.gpu_ids))
            step.log.append((jid, "launch", f"attempt {job.attempt} on GPUs {_ids(job.gpu_ids)}"))
        started = {jid for jid, _ in plan.starts}
        head = plan.reservation[0] if plan.reservation else None
        for entry in plan.ranking:
            job = by_id.get(entry.job_id)
            if job is None or job.id in started:
                continue
            if entry.reason.startswith("held"):  # repeat failures: last in line, as `why` explains
                reason = "Held"
            elif job.id == head or (head is None and entry.rank == 1):
                reason = "Resources"
            else:
                reason = "Priority"
            if job.reason != reason:
                job.reason = reason
                step.changed.add(job.id)
        self._apply_preemptions(plan, step)
        if plan.starts:
            step.instructions.append(LogDecision(plan, now))


def kept_progress(ran: float, checkpoint_every: float | None) -> float:
    """Seconds of a stopped run that its checkpoints kept: all but what it did since the last one (every
    `checkpoint_every` seconds; None: the policies' DEFAULT_CHECKPOINT_S, policy/preempt.py)."""
    import numpy as np

    from headway.policy.preempt import progress_lost

    every = math.nan if checkpoint_every is None else float(checkpoint_every)
    lost = float(progress_lost(np.array([ran]), np.array([every]))[0])
    return max(0.0, ran - lost)


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in ids) or "none"
