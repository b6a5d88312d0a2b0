"""Small predictors and trace builders shared by the engine, policy and starvation tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.schema import JOB_SCHEMA

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
DAY = 86400.0


@dataclass
class Daily:
    """A test predictor's own retraining clock: due at the first instant of each simulated day after the
    first (the engine asks at every instant; the predictor decides, as the real one does)."""

    origin: float | None = None
    next_at: float = DAY

    def due(self, now: float) -> bool:
        if self.origin is None:
            self.origin = now
        t = now - self.origin
        if t < self.next_at:
            return False
        self.next_at = (t // DAY + 1) * DAY
        return True


@dataclass
class MeanPredictor:
    """Causal rolling means: P(success) and mean runtimes of the jobs that ended so far (O(1) a call)."""

    ended: list[EndedJob] = field(default_factory=list)
    retrains: int = 0
    daily: Daily = field(default_factory=Daily)
    calls: list[float] = field(default_factory=list)
    last_end: float = float("-inf")
    ok_n: int = 0
    ok_sum: float = 0.0
    bad_sum: float = 0.0

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        for j in jobs:
            assert j.submit_time <= now + 1e-6
        assert self.last_end <= now + 1e-6  # causal: only ends seen before now
        self.calls.append(now)
        n_end = len(self.ended)
        p = (self.ok_n + 1) / (n_end + 2)
        r = self.ok_sum / self.ok_n if self.ok_n else 3600.0
        f = self.bad_sum / (n_end - self.ok_n) if n_end > self.ok_n else 600.0
        n = len(jobs)
        return Predictions(np.full(n, p), np.full(n, r), np.full(n, 2 * r), np.full(n, f))

    def observe_end(self, ended: EndedJob) -> None:
        self.ended.append(ended)
        self.last_end = max(self.last_end, ended.end_time)
        if ended.state == "COMPLETED":
            self.ok_n += 1
            self.ok_sum += ended.runtime
        else:
            self.bad_sum += ended.runtime

    def maybe_retrain(self, now: float) -> bool:
        if not self.daily.due(now):
            return False
        self.retrains += 1
        return True


@dataclass
class FixedPredictor:
    """Predictions chosen by the test per job id: (p_success, runtime, time_to_failure)."""

    table: dict[str, tuple[float, float, float]]
    default: tuple[float, float, float] = (0.5, 3600.0, 600.0)

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        vals = np.array([self.table.get(j.job_id, self.default) for j in jobs], dtype=np.float64).reshape(
            -1, 3
        )
        return Predictions(vals[:, 0].copy(), vals[:, 1].copy(), vals[:, 1] * 1.5, vals[:, 2].copy())

    def observe_end(self, ended: EndedJob) -> None:
        pass

    def maybe_retrain(self, now: float) -> bool:
        return False


def make_jobs(rows: Sequence[dict[str, object]]) -> pa.Table:
    """Jobs from dicts with submit/runtime in seconds from T0 (start = submit, end = submit + runtime)."""
    cols: dict[str, list[object]] = {f: [] for f in JOB_SCHEMA.names}
    for i, r in enumerate(rows):
        submit = T0 + dt.timedelta(seconds=float(r.get("submit", 0.0)))  # type: ignore[arg-type]
        runtime = float(r.get("runtime", 60.0))  # type: ignore[arg-type]
        vals = {
            "job_id": str(r.get("job_id", f"j{i}")),
            "user": r.get("user", "u0"),
            "group": None,
            "name": r.get("name"),
            "partition": None,
            "priority_class": r.get("priority_class"),
            "submit_time": submit,
            "start_time": submit,
            "end_time": submit + dt.timedelta(seconds=runtime),
            "gpus": float(r.get("gpus", 1.0)),  # type: ignore[arg-type]
            "nodes": int(r.get("nodes", 1)),  # type: ignore[call-overload]
            "cpus": None,
            "mem_mb": None,
            "time_limit": r.get("time_limit"),
            "state": r.get("state", "COMPLETED"),
            "exit_code": None,
            "source": "test",
            "preemptible": r.get("preemptible"),
            "checkpoint_every": r.get("checkpoint_every"),
        }
        for k, v in vals.items():
            cols[k].append(v)
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)
