"""What a policy sees (a frozen, columnar snapshot) and what it returns (Ranking, Decision).

Columns are numpy arrays so one pass over 10k pending jobs stays in vectorised code; the caller hands
read-only arrays and must not keep mutating them while a policy call runs. Nothing here holds a job's
true runtime or outcome, except `PendingJobs.oracle_runtime`, which only an `*-oracle` policy gets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

FULL_SHARE = 1000  # milli-GPU: a whole, unshared GPU


@dataclass(frozen=True, slots=True)
class PendingJobs:
    """Jobs waiting to start, one array entry per job (positions are local to this snapshot)."""

    key: I64  # the caller's stable integer handle for the job
    job_id: npt.NDArray[np.object_]  # str ids, for reasons and logs
    user: I64  # index into Snapshot.users
    klass: I64  # index into Snapshot.classes
    submit: F64
    gpus: F64  # requested GPUs (a fraction < 1 shares one GPU)
    max_nodes: I64  # nodes its gang may span
    time_limit: F64  # seconds; NaN when the job has none
    p_success: F64
    runtime: F64  # predicted runtime if it completes (seconds)
    runtime_p90: F64
    time_to_failure: F64
    attained: F64  # GPU-seconds already served (jobs preempted before); 0 for fresh jobs
    last_stop: F64  # when it last entered the queue (submit, or its preemption time)
    fail_streak: I64  # failures in a row of the same user+name, ended before now, no success since
    oracle_runtime: F64 | None = None  # true runtimes: only for policies named `*-oracle`
    oracle_success: npt.NDArray[np.bool_] | None = None  # true outcomes (COMPLETED): the same

    def __len__(self) -> int:
        return len(self.key)


@dataclass(frozen=True, slots=True)
class RunningJobs:
    """Jobs holding GPUs now. `Snapshot.cluster.owner` points into these arrays by position."""

    key: I64
    job_id: npt.NDArray[np.object_]
    user: I64
    klass: I64
    gpus: F64
    start: F64  # start of the current run
    time_limit: F64
    runtime: F64  # predicted runtime if it completes
    runtime_p90: F64
    attained: F64  # GPU-seconds served before the current run
    preemptible: npt.NDArray[np.bool_]  # the job said a higher class may stop it (requeued, same id)
    # What survival-aware planning reads (policy/survival.py): the job's predicted chance to complete and
    # median time to failure, when it was last preempted (NaN: never) and how often it saves its progress
    # (seconds; NaN: the default of policy/preempt.py).
    p_success: F64
    time_to_failure: F64
    last_preempted: F64
    checkpoint_every: F64
    probe: npt.NDArray[np.bool_]  # a fail-fast probe run (Start.probe_s), stopped by the caller at its end

    def __len__(self) -> int:
        return len(self.key)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Per-GPU free share and owner; a policy copies what it changes while planning a pass."""

    share: I64  # [node, gpu] free milli-GPU; -1 where the node has no such GPU
    free: I64  # [node] whole free GPUs (share == FULL_SHARE)
    owner: I64  # [node, gpu] position in RunningJobs of its whole-GPU holder; -1 free; -2 shared/none
    node_gpus: I64  # [node] GPUs on the node
    rack: I64  # [node] rack (switch) index
    n_racks: int
    # The placement index over `free`, kept current by a caller that changes it in place (the
    # simulator): a pass plans on a copy-on-write scratch of it. None: the pass builds one.
    index: object | None = None  # a `placement.FreeIndex` (typed loosely: placement imports this module)
    # Running key -> (node, gpu) of every running fractional job, kept current by the caller: a shared
    # GPU is free again when its last sharer ends, which a reservation needs to know. None: a shared GPU
    # is taken to stay busy (no reservation counts on it).
    frac_at: Mapping[int, tuple[int, int]] | None = None

    @property
    def capacity(self) -> float:
        return float(self.node_gpus.sum())

    @property
    def max_node_gpus(self) -> int:
        return int(self.node_gpus.max()) if len(self.node_gpus) else 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    seq: int  # pass number; Decision ids derive from it so they are deterministic
    pending: PendingJobs
    running: RunningJobs
    cluster: ClusterView
    users: Sequence[str]
    classes: Sequence[str]  # priority class names ("normal" where a job has none)
    # [user] decayed GPU-seconds (fair share), or how to compute them on first read (`usage`): most
    # passes rank a queue whose order needs no fair share, and they skip computing it.
    usage_or_fn: F64 | Callable[[], F64]
    shares: F64  # [user] normalised shares (sum 1 over users)
    _usage: list[F64] = field(default_factory=list, compare=False, repr=False)

    @property
    def usage(self) -> F64:
        if not self._usage:
            u = self.usage_or_fn
            self._usage.append(u() if callable(u) else u)
        return self._usage[0]


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where a gang goes: whole GPUs per node, or one GPU share for a fractional job."""

    nodes: tuple[int, ...]
    counts: tuple[int, ...]  # whole GPUs taken on each node
    frac_gpu: int = -1  # GPU index on nodes[0] for a fractional job, else -1
    frac_milli: int = 0

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True, slots=True)
class Start:
    key: int
    job_id: str
    alloc: Allocation
    backfill: bool = False
    # Running jobs (keys) this start preempts: stopped right before it, in the order the policy planned,
    # so the GPUs it was planned on are the ones freed for it (Decision.preempt lists them all).
    preempts: tuple[int, ...] = ()
    # A fail-fast probe (policy/impact.py): the caller stops this run after `probe_s` seconds unless it
    # ended first, and requeues the job as preemptible (0: an ordinary run).
    probe_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reservation:
    key: int
    job_id: str
    start: float  # the earliest time the plan expects its GPUs (inf: unknown)
    nodes: tuple[int, ...]


class Ranking:
    """Every pending job's place in the order, with the factors behind its score.

    `score`, `tier` and `factors` may be computed on first use (`Ranking.deferred`): a pass over a queue
    of one job needs no score to know its order, and most simulator passes are such passes.
    """

    __slots__ = ("_compute", "_factors", "_score", "_tier", "job_id", "order", "policy", "tier_names")

    def __init__(
        self,
        policy: str,
        order: I64,
        score: F64,
        tier: I64,
        factors: dict[str, F64],
        tier_names: tuple[str, ...],
        job_id: npt.NDArray[np.object_],
    ) -> None:
        self.policy = policy
        self.order = order  # pending positions, best first
        self._score: F64 | None = score  # per pending position (higher runs first within a tier)
        self._tier: I64 | None = tier  # per pending position (0 first): e.g. starved / normal / held
        self._factors: dict[str, F64] | None = factors  # per pending position
        self._compute: Callable[[], tuple[I64, F64, dict[str, F64]]] | None = None
        self.tier_names = tier_names
        self.job_id = job_id

    @classmethod
    def deferred(
        cls,
        policy: str,
        order: I64,
        compute: Callable[[], tuple[I64, F64, dict[str, F64]]],
        tier_names: tuple[str, ...],
        job_id: npt.NDArray[np.object_],
        tier: I64 | None = None,
        score: F64 | None = None,
    ) -> Ranking:
        """A ranking whose order is known without (all of) its scores; `compute()` gives (tier, score,
        factors), of which a `tier` and `score` given here are kept."""
        r = cls.__new__(cls)
        r.policy, r.order, r.tier_names, r.job_id = policy, order, tier_names, job_id
        r._factors = None
        r._tier, r._score = tier, score
        r._compute = compute
        return r

    def _fill(self) -> None:
        assert self._compute is not None
        tier, score, self._factors = self._compute()
        if self._tier is None or self._score is None:
            self._tier, self._score = tier, score
        self._compute = None

    @property
    def score(self) -> F64:
        if self._score is None:
            self._fill()
        assert self._score is not None
        return self._score

    @property
    def tier(self) -> I64:
        if self._tier is None:
            self._fill()
        assert self._tier is not None
        return self._tier

    @property
    def factors(self) -> dict[str, F64]:
        if self._factors is None:
            self._fill()
        assert self._factors is not None
        return self._factors

    def __repr__(self) -> str:
        return f"Ranking({self.policy!r}, {len(self.order)} jobs)"

    def rank_of(self) -> I64:
        """Per pending position, its 0-based rank."""
        r = np.empty(len(self.order), dtype=np.int64)
        r[self.order] = np.arange(len(self.order))
        return r

    def reason(self, pos: int) -> str:
        """Words for one job: its tier, score and factors."""
        parts = [f"{k}={_fmt(float(v[pos]))}" for k, v in self.factors.items()]
        tier = self.tier_names[int(self.tier[pos])]
        return f"{tier}; score {_fmt(float(self.score[pos]))} ({', '.join(parts)})"

    def reasons(self) -> list[str]:
        return [self.reason(int(i)) for i in self.order]


def tier_of_reason(reason: str | None) -> str | None:
    """The tier a `Ranking.reason` names: what comes before its "; score" (None for no reason). The
    adapters keep only the reason text, and a tier's own name may hold parentheses."""
    if not reason:
        return None
    return reason.split("; score ", 1)[0].strip() or None


@dataclass(frozen=True, slots=True)
class Decision:
    """A diff for the caller to apply: jobs to start (with GPUs), jobs to preempt, the reservation."""

    id: str
    now: float
    start: tuple[Start, ...] = ()
    preempt: tuple[int, ...] = ()  # keys of running jobs to stop (they go back to the queue)
    reservation: Reservation | None = None
    wake_at: float | None = None  # ask for another pass then, even if nothing else happens
    ranking: Ranking | None = field(default=None, compare=False)


def _fmt(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if abs(x) >= 1e4 or (0 < abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"
