"""The local queue's state machine: events in, instructions out, no I/O and no clock.

Every change of a job's state happens in `QueueCore.handle`; the daemon (daemon.py) persists the jobs it
reports as changed, then carries out the instructions (start a supervisor, signal one, record an end).
Ordering is not decided here: a `Planner` (ordering.py, which calls the shared policy core) is handed a
frozen view of the queue and returns which jobs start on which GPUs.
"""

from __future__ import annotations

import dataclasses
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


Event = Submitted | Claimed | Finished | Abandoned | Lost | CancelRequested | Predicted | Tick

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
class Record:
    """A job ended: write it to the job store and teach the predictor."""

    job: LocalJob


@dataclass(frozen=True, slots=True)
class LogDecision:
    plan: Plan
    now: float


Instruction = Launch | Terminate | Record | LogDecision

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
                job.reason = "requeued: its launch was interrupted"
                step.changed.add(jid)
                step.log.append((jid, "requeued", f"attempt {att} never started"))
            case Lost(job_id=jid, attempt=att, time=t):
                job = self._attempt(jid, att)
                if job is not None and job.state is not JobState.PENDING:
                    self._end(job, JobState.FAILED, None, job.start_time, t, step, "its supervisor vanished")
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
        if plan.starts:
            step.instructions.append(LogDecision(plan, now))


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in ids) or "none"
