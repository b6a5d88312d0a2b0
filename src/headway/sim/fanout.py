"""One replay per policy, in parallel worker processes, with live progress from each.

`headway simulate --policy a,b,c` replays the same trace once per policy; the runs share nothing, so
on a machine with several cores they run side by side. Each worker gets the job table once (when it
starts, not once per policy) and sends `(policy, done, total)` progress through a queue that the
parent drains while it waits. Results are identical to running the policies one after another: each
run is seeded and the engine is deterministic (a test compares both ways).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headway.policy.registry import knobs_for
from headway.sim.cluster import ClusterSpec
from headway.sim.result import SimResult
from headway.traces.base import BadInputError

# Rough peak memory of one replay: measured 220 MB at 100k jobs and 865 MB at 1M (bench_sim.py),
# rounded up so that an automatic worker count leaves the machine some room.
RUN_BASE_BYTES = 300 * 2**20
RUN_BYTES_PER_JOB = 1_000
# Below this many job replays in all, one process finishes before worker processes would have started
# (each imports numpy, pyarrow and LightGBM, about a second or two).
PARALLEL_MIN_JOB_RUNS = 5_000
OUT_OF_MEMORY = (
    "not enough memory for this replay (the cluster model holds a row per node and a column per GPU of "
    "its largest node: check the node and GPU counts)"
)


@dataclass(frozen=True, slots=True)
class RunArgs:
    """What every replay of one `simulate` call shares (sent to each worker once)."""

    jobs: pa.Table
    spec: ClusterSpec
    placement: str | None
    load: float | None
    seed: int
    explain: frozenset[str]
    include_cpu: bool
    policy_options: dict[str, object] = field(default_factory=dict)  # knobs_for each policy


class PolicyError(Exception):
    """A replay failed; `policy` says which (the message is the original error's)."""

    def __init__(self, policy: str, message: str) -> None:
        super().__init__(message)
        self.policy = policy

    def __reduce__(self) -> tuple[type[PolicyError], tuple[str, str]]:  # it crosses a process boundary
        return (PolicyError, (self.policy, str(self)))


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_workers(n_policies: int, n_jobs: int, available_bytes: int | None = None) -> int:
    """As many workers as policies, capped by usable CPUs and by memory for replays of this size; one
    for small replays."""
    if n_policies * n_jobs < PARALLEL_MIN_JOB_RUNS:
        return 1
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    per_run = RUN_BASE_BYTES + RUN_BYTES_PER_JOB * n_jobs
    by_memory = max(1, available_bytes // per_run)
    return max(1, min(n_policies, usable_cpus(), by_memory))


_shared: dict[str, Any] = {}  # in a worker: its RunArgs and the progress queue


def _init_worker(args: RunArgs, progress_q: Any) -> None:
    _shared["args"] = args
    _shared["q"] = progress_q


def _run_one(policy: str) -> SimResult:
    from headway.sim.run import run_simulation

    args: RunArgs = _shared["args"]
    q = _shared["q"]

    def progress(done: int, total: int) -> None:
        q.put((policy, done, total))

    progress(0, args.jobs.num_rows)  # started: the parent starts this policy's clock
    try:
        return run_simulation(
            args.jobs,
            args.spec,
            policy=policy,
            placement=args.placement,
            load=args.load,
            seed=args.seed,
            explain=args.explain,
            include_cpu=args.include_cpu,
            progress=progress,
            policy_options=knobs_for(policy, args.policy_options),
        )
    except (ValueError, RuntimeError, BadInputError) as e:  # bad input: reported with the policy's name
        raise PolicyError(policy, str(e)) from None
    except MemoryError:  # numpy refused an array (a cluster of absurd size): a line, not a traceback
        raise PolicyError(policy, OUT_OF_MEMORY) from None


def run_parallel(
    args: RunArgs,
    policies: Sequence[str],
    workers: int,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> list[SimResult]:
    """Replay `args.jobs` under each policy in `workers` processes; results in the order of `policies`.

    Raises PolicyError for the first policy whose replay failed (the others are cancelled)."""
    ctx = mp.get_context("spawn")  # a clean interpreter: no inherited threads or open stores
    progress_q = ctx.Queue()
    futures: dict[Future[SimResult], str] = {}

    def drain() -> None:
        """Hand every progress report waiting in the queue to `on_progress`."""
        try:
            while True:
                item = progress_q.get_nowait()
                if on_progress is not None:
                    on_progress(*item)
        except queue_mod.Empty:
            pass

    with ProcessPoolExecutor(
        max_workers=max(1, min(workers, len(policies))),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(args, progress_q),
    ) as pool:
        try:
            for pol in policies:
                futures[pool.submit(_run_one, pol)] = pol
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for fut in done:
                    fut.result()  # raise the first failure now
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        drain()
    by_policy = {pol: fut.result() for fut, pol in futures.items()}
    return [by_policy[p] for p in policies]
