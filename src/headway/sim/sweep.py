"""Policy x load x seed grids run on Dask, and their summary (median over seeds, with the spread).

Each grid cell is one `run_simulation` in a worker process; the job table goes to the workers once
(scattered) rather than once per cell. Only the metrics dictionary comes back, never the per-job table,
so a large grid does not flood the client's memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from headway.predict.api import OnlinePredictor
from headway.sim.cluster import ClusterSpec
from headway.sim.metrics import MetricValue, compute


@dataclass(frozen=True, slots=True)
class Cell:
    """One point of the grid; load None means the trace's natural arrival times."""

    policy: str
    load: float | None
    seed: int

    @property
    def load_label(self) -> str:
        return "natural" if self.load is None else str(float(self.load))


class SweepError(ValueError):
    """A grid that cannot run: a cell's input error, or a scheduler that is not one; str() says which."""


@dataclass(frozen=True, slots=True)
class CellResult:
    cell: Cell
    metrics: dict[str, MetricValue]
    excluded: tuple[str, ...] = ()  # jobs left out of the replay, and why (the same in every cell)
    excluded_counts: tuple[tuple[str, int], ...] = ()


def grid(policies: Sequence[str], loads: Sequence[float | None], seeds: Sequence[int]) -> list[Cell]:
    """Every policy x load x seed, except that a policy reading no predictions runs once per load (with
    the first seed): the engine is deterministic and the seed only reaches the predictor's training, so
    its other seeds would repeat the same replay."""
    from headway.policy.registry import get_policy

    varies = {p: get_policy(p).uses_predictions for p in policies}
    return [
        Cell(p, load, s)
        for load, p, s in itertools.product(loads, policies, seeds)
        if varies[p] or s == seeds[0]
    ]


def run_cell(
    jobs: pa.Table,
    cluster: ClusterSpec,
    cell: Cell,
    placement: str | None,
    include_cpu: bool,
    predictor_factory: Callable[[], OnlinePredictor] | None = None,
) -> CellResult:
    """Run one simulation and keep only its metrics (this is what a Dask worker executes)."""
    from headway.sim.run import run_simulation

    extra: dict[str, Any] = {} if predictor_factory is None else {"predictor_factory": predictor_factory}
    try:
        res = run_simulation(
            jobs,
            cluster,
            policy=cell.policy,
            placement=placement,
            load=cell.load,
            seed=cell.seed,
            include_cpu=include_cpu,
            **extra,
        )
    except ValueError as e:  # bad input for this cell (a load the trace cannot take): named, no traceback
        raise SweepError(f"{cell.policy} at load {cell.load_label}: {e}") from None
    except MemoryError:  # numpy refused the cluster's arrays on the worker: named, as `simulate` names it
        from headway.sim.fanout import OUT_OF_MEMORY

        raise SweepError(f"{cell.policy} at load {cell.load_label}: {OUT_OF_MEMORY}") from None
    return CellResult(cell, compute(res), tuple(res.excluded), tuple(res.excluded_counts.items()))


def run_grid(
    jobs: pa.Table,
    cluster: ClusterSpec,
    cells: Sequence[Cell],
    *,
    placement: str | None = None,
    include_cpu: bool = False,
    scheduler: str | None = None,
    workers: int = 2,
    on_done: Callable[[CellResult], None] | None = None,
    predictor_factory: Callable[[], OnlinePredictor] | None = None,
) -> list[CellResult]:
    """Run every cell on a Dask cluster (a local one with `workers` processes unless `scheduler` is given).

    `predictor_factory` must be picklable (a module-level class or function); None uses the engine's.
    """
    from dask.distributed import Client, LocalCluster, as_completed

    local: LocalCluster | None = None
    if scheduler:
        client = _connect(scheduler)
        try:
            _wait_for_a_worker(client, scheduler)
        except BaseException:
            client.close()
            raise
    else:
        # The worker processes start with SIGINT ignored (and keep it: Python leaves an ignored SIGINT
        # alone), so Ctrl-C stops the sweep here, which closes them, rather than each printing a trace.
        restore = _ignore_sigint()
        try:
            local = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                # No dashboard, and its bare HTTP server (health, metrics) on a free port rather than
                # 8787, which warns when another Dask holds it.
                scheduler_kwargs={"dashboard_address": ":0"},
                silence_logs=50,  # logging.CRITICAL: keep worker chatter off the user's terminal
            )
        finally:
            restore()
        client = Client(local)
    try:
        jobs_f = client.scatter(jobs, broadcast=True)
        futures = [
            client.submit(run_cell, jobs_f, cluster, c, placement, include_cpu, predictor_factory, pure=False)
            for c in cells
        ]
        results: list[CellResult] = []
        for fut in as_completed(futures):
            r: CellResult = fut.result()
            results.append(r)
            if on_done is not None:
                on_done(r)
        order = {c: i for i, c in enumerate(cells)}
        results.sort(key=lambda r: order[r.cell])
        return results
    finally:
        client.close()
        if local is not None:
            local.close()


CONNECT_DEADLINE_S = 20.0
CONNECT_TIMEOUT_S = 10  # Dask's own: an address where nothing listens fails after this
WORKER_WAIT_S = 10.0  # a scheduler with no worker: how long to wait for one to join


def _wait_for_a_worker(client: Any, scheduler: str) -> None:
    """SweepError naming the command that starts workers when none joins `scheduler` within
    WORKER_WAIT_S: Dask's own error, once the scatter gave up, was 'No valid workers found'."""
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except TimeoutError:
        raise SweepError(
            f"{scheduler}: the scheduler has no worker (none joined within {WORKER_WAIT_S:g} s); start "
            f"one on each machine with `dask worker {scheduler}` (every worker needs headway installed)"
        ) from None


def _connect(scheduler: str) -> Any:
    """A Client of the scheduler at `scheduler`, or SweepError within CONNECT_DEADLINE_S: Dask's own
    timeout does not cover a port that accepts the connection and never greets (a dashboard, any HTTP
    server), where it would wait forever, and bytes from something else can fail in odd ways."""
    import threading

    from dask.distributed import Client

    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=connect, name="headway-dask-connect", daemon=True)
    t.start()
    t.join(CONNECT_DEADLINE_S)
    if t.is_alive():
        raise SweepError(
            f"{scheduler}: no Dask scheduler answered within {CONNECT_DEADLINE_S:g} s; is it the "
            "scheduler's port (8786 by default) and not the dashboard's (8787)?"
        )
    err = box.get("error")
    if isinstance(err, OSError | TimeoutError):
        raise err
    if err is not None:
        raise SweepError(
            f"{scheduler}: connecting failed ({type(err).__name__}: {str(err)[:200]}); is a Dask scheduler "
            "listening there?"
        ) from None
    return box["client"]


def _ignore_sigint() -> Callable[[], None]:
    """Ignore SIGINT (main thread only); returns what puts the previous handler back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def restore() -> None:
        signal.signal(signal.SIGINT, old)

    return restore


@dataclass(frozen=True, slots=True)
class Summary:
    """Median over seeds of one metric for one policy x load, with the min and max seen."""

    median: float | None
    low: float | None
    high: float | None
    n: int


def summarise(
    results: Sequence[CellResult], names: Sequence[str]
) -> dict[tuple[str, str], dict[str, Summary]]:
    """(policy, load label) -> metric -> Summary over seeds, in the order the cells came."""
    groups: dict[tuple[str, str], list[Mapping[str, MetricValue]]] = {}
    for r in results:
        groups.setdefault((r.cell.policy, r.cell.load_label), []).append(r.metrics)
    out: dict[tuple[str, str], dict[str, Summary]] = {}
    for key, ms in groups.items():
        row: dict[str, Summary] = {}
        for name in names:
            vals = np.array([float(v) for m in ms if (v := m.get(name)) is not None])
            if len(vals) == 0:
                row[name] = Summary(None, None, None, 0)
            else:
                row[name] = Summary(float(np.median(vals)), float(vals.min()), float(vals.max()), len(vals))
        out[key] = row
    return out


def iter_rows(summary: Mapping[tuple[str, str], Mapping[str, Summary]]) -> Iterator[dict[str, Any]]:
    """JSON-ready rows: one per policy x load, each metric as {median, min, max, seeds}."""
    for (policy, load), row in summary.items():
        yield {
            "policy": policy,
            "load": load if load == "natural" else float(load),  # as in the grid: a number, or "natural"
            "metrics": {
                k: {"median": s.median, "min": s.low, "max": s.high, "seeds": s.n} for k, s in row.items()
            },
        }
