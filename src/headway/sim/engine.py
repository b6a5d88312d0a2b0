"""The discrete-event engine: a small loop over the event queue, the state and the policy.

Each instant: pop its events (ends, then arrivals, then wake-ups) and apply them to the state, let the
predictor retrain and predict the arrivals, run one scheduling pass (one more after a pass that
preempted: its victims wait again, beside GPUs its starts may not have needed), and let the observers
record.
Time only moves to the next event: there is no tick. A pass is `policy.decide(snapshot)`, the same call
the local queue and the Slurm adapter make; it is skipped when no pending job can be placed on the free
GPUs at all and the policy may not preempt now (`Policy.may_preempt`: it would start nothing), and then
only its wake-up is asked.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from headway.policy.policies import Policy
from headway.predict.api import OnlinePredictor
from headway.sim.cluster import Cluster
from headway.sim.events import Arrival, End, EventQueue, WakeUp
from headway.sim.forecast import Forecaster
from headway.sim.observer import DecisionLog, Timeline
from headway.sim.result import JOB_COLUMNS, SimResult
from headway.sim.state import JobArrays, SimState, Truth

DAY = 86400.0
MAX_PASSES_PER_INSTANT = 8

__all__ = ["DAY", "Engine", "EngineOptions", "JobArrays", "Truth"]


@dataclass(slots=True)
class EngineOptions:
    usage_half_life_s: float = 7 * DAY
    repredict_limit: int = 50_000  # re-predict the queue after a retrain when it is at most this long
    explain: frozenset[str] = frozenset()
    progress: Callable[[int, int], None] | None = None
    validate: bool = False  # check every state invariant after every event and pass (tests)
    log_decisions: bool = False  # keep every Decision (with a ranking on a copy of its snapshot)


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
        J, pol, opts = self.jobs, self.policy, self.opts
        state = SimState(
            J, self.truth, self.cluster, oracle=pol.oracle, restart_penalty_s=pol.restart_penalty_s,
            checkpoint_default_s=pol.checkpoint_default_s,
            half_life_s=opts.usage_half_life_s, copies=opts.log_decisions,
        )  # fmt: skip
        explain = {k for k, j in enumerate(J.job_id.tolist()) if j in opts.explain} if opts.explain else set()
        log = DecisionLog(opts.log_decisions, explain)
        log.explain = {str(J.job_id[k]): [] for k in sorted(explain)}
        loop = _Loop(state, EventQueue(state.submit), pol, log, opts)
        loop.forecaster = Forecaster(self.predictor, state, opts.repredict_limit)
        loop.run()
        res = SimResult(
            policy=pol.name,
            placement=pol.placement,
            jobs=_jobs_table(state),
            timeline=loop.timeline.table(),
            capacity_gpus=self.cluster.capacity,
            load=0.0,
            explain=log.explain,
            wall_seconds=wallclock.perf_counter() - t_wall,
            events=loop.events.popped,
        )
        res.passes = loop.passes
        res.decisions = log.decisions
        return res


class _Loop:
    """One run's loop (see the module docstring)."""

    forecaster: Forecaster

    def __init__(
        self, state: SimState, events: EventQueue, pol: Policy, log: DecisionLog, opts: EngineOptions
    ):
        self.state, self.events, self.pol, self.log, self.opts = state, events, pol, log, opts
        self.timeline = Timeline()
        self.passes = 0
        self._check = state.validate if opts.validate else None
        n = len(state.jobs)
        self._progress, self._step, self._reported = opts.progress, max(n // 200, 1), 0

    def run(self) -> None:
        events, st = self.events, self.state
        while (now := events.peek()) < math.inf:
            ended, arrivals, woke = self._take(now)
            # A wake-up for a queue that has emptied since it was asked for changes nothing.
            woke = woke and (st.pending.n > 0 or bool(arrivals))
            if not (ended or arrivals or woke):
                continue
            self.forecaster.tick(now)
            self.forecaster.arrived(
                arrivals, now
            )  # predicted before they queue: a queued job has predictions
            for k in arrivals:
                st.on_arrival(k)
            if arrivals and self._check is not None:
                self._check()
            # A pass that preempted leaves its victims waiting and, often, GPUs its starts did not need:
            # the next pass at the same instant sees both (as the local queue's pass after the victims
            # exit, and Slurm's next cycle, do). Each such pass stopped a running job; the bound is a guard.
            for _ in range(MAX_PASSES_PER_INSTANT):
                if not self._pass(now, arrivals, woke):
                    break
                arrivals, woke = [], False
            self.timeline.record(now, st)
            if self._progress is not None and st.done - self._reported >= self._step:
                self._reported = st.done
                self._progress(st.done, len(st.jobs))
        if self._progress is not None:
            self._progress(st.done, len(st.jobs))

    def _take(self, now: float) -> tuple[bool, list[int], bool]:
        """Pop every event at `now` and apply the ends: (whether a run ended, the arrivals, whether a
        wake-up came). Arrivals join the queue once predicted (`run`)."""
        events, st, check = self.events, self.state, self._check
        ended, woke = False, False
        arrivals: list[int] = []
        while (ev := events.pop_at(now)) is not None:
            if isinstance(ev, End) and ev.probe:
                ended = st.on_probe_end(ev, now) or ended
            elif isinstance(ev, End):
                state = st.on_end(ev, now)
                if state is not None:
                    self.forecaster.ended(ev.key, now, state)
                    ended = True
            elif isinstance(ev, Arrival):
                arrivals.append(ev.key)
            else:
                woke = True
            if check is not None:
                check()
        return ended, arrivals, woke

    def _pass(self, now: float, arrivals: list[int], woke: bool) -> bool:
        """One pass; whether it preempted."""
        st, pol = self.state, self.pol
        if not st.pending.n:
            return False
        go = st.can_place_any() or self.log.wants(arrivals)
        snap = None
        if not go and pol.preemptive:  # nothing to start: a pass only if it may stop something
            snap = st.snapshot(now, self.passes)
            go = pol.may_preempt(snap)
        if go:
            snap = snap if snap is not None else st.snapshot(now, self.passes)
            dec = pol.decide(snap)
            self.passes += 1
            self.log.record(snap, dec)
            for t, end in st.apply(dec, now):
                self.events.schedule(t, end)
            self._wake(dec.wake_at, now)
            if self._check is not None:
                self._check()
            return bool(dec.preempt)
        if pol.wakes and (arrivals or woke):
            # No pass, but the policy may want one later (a starvation deadline): only new jobs or a spent
            # wake-up can move its earliest request, as the queue otherwise only shrinks.
            self._wake(pol.wake_at(st.snapshot(now, self.passes)), now)
        return False

    def _wake(self, t: float | None, now: float) -> None:
        if t is not None and t > now:
            self.events.schedule(t, WakeUp(1))


_STRING_COLUMNS = ("job_id", "user", "group", "name", "state", "priority_class")


def _jobs_table(state: SimState) -> pa.Table:
    cols = state.job_table()
    types = {
        "nodes_used": pa.int64(),
        "racks_used": pa.int64(),
        "preemptions": pa.int64(),
        "restarts": pa.int64(),
        "preemptible": pa.bool_(),
        "probed": pa.bool_(),
    }
    nullable = {"start", "end", "time_limit", "p_success", "pred_runtime", "frag_at_submit"}
    arrays = {
        c: pa.array(
            v,
            types.get(
                c,
                pa.string()
                if c in ("job_id", "user", "group", "name", "state", "priority_class")
                else pa.float64(),
            ),
            from_pandas=c in nullable,
        )
        for c, v in cols.items()
    }
    return pa.table(arrays).select(list(JOB_COLUMNS))
