"""The predictor's contract with its callers (simulator, local queue, Slurm adapter).

Callers see only what a scheduler knows at submit time (`SubmittedJob`) and tell the predictor when a
job ends (`EndedJob`); the predictor keeps its rolling state causal from those calls alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt


class SubmittedJob(NamedTuple):
    """What a scheduler knows of a job when it is submitted. Times are epoch seconds (or virtual seconds).

    A named tuple rather than a dataclass: a batch of them turns into columns with one `zip(*jobs)`, and
    the simulator makes one per job (measured: 10k jobs to columns 12.6 ms as attribute reads)."""

    job_id: str
    user: str | None
    group: str | None
    name: str | None
    partition: str | None
    priority_class: str | None
    submit_time: float
    gpus: float
    nodes: int
    time_limit: float | None  # seconds


class EndedJob(NamedTuple):
    """A job's end as the predictor learns it (at `end_time`, never before).

    A named tuple, as `SubmittedJob`: the simulator makes one per job, and a frozen dataclass costs
    2.5x as much to make (0.76 against 0.31 µs)."""

    job: SubmittedJob
    start_time: float
    end_time: float
    state: str  # headway.schema.State value
    started: bool = True  # False: it never ran (start_time is then a stand-in); see is_outcome

    @property
    def runtime(self) -> float:
        return max(self.end_time - self.start_time, 0.0)


def is_outcome(state: str, started: bool, job_id: str = "") -> bool:
    """Whether a job's end tells how jobs run. Not: one cancelled before it started, which neither ran nor
    failed (as history, an admin's clean-up of 450 queued jobs read as 450 failures and moved everyone's
    P(complete)); nor a requeued job's earlier run (`ID@START`, PREEMPTED), whose job has its own record."""
    if state == "PREEMPTED" and "@" in job_id:
        return False
    return started or state != "CANCELLED"


@dataclass(frozen=True, slots=True)
class Predictions:
    """Column arrays, one entry per job asked about, in the same order."""

    p_success: npt.NDArray[np.float64]  # calibrated probability of COMPLETED
    runtime: npt.NDArray[np.float64]  # median runtime if it completes, seconds (capped by time limit)
    runtime_p90: npt.NDArray[np.float64]  # p90 runtime if it completes, seconds
    time_to_failure: npt.NDArray[np.float64]  # median runtime if it does not complete, seconds

    def __len__(self) -> int:
        return len(self.p_success)


class ScalarPredictor(Protocol):
    """An optional fast path a predictor may add for the usual arrival, one job at a time: the same four
    numbers as `predict([job], now)` gives, as plain floats, without four one-element arrays. The
    simulator uses it when the predictor has it (the results are the same either way), instead of
    `predict`: whatever `predict` does besides (advancing its clock) it must do too."""

    def predict_one(self, job: SubmittedJob, now: float) -> tuple[float, float, float, float]:
        """(p_success, runtime, runtime_p90, time_to_failure) of one job: `predict([job], now)`'s."""
        ...


class OnlinePredictor(Protocol):
    """Causal predictor driven by a clock: the simulator's virtual one or the wall clock."""

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        """Predictions for jobs submitted at or before `now`, from jobs that ended before `now` only."""
        ...

    def observe_end(self, ended: EndedJob) -> None:
        """Update rolling statistics with one ended job (called at its end time)."""
        ...

    def maybe_retrain(self, now: float) -> bool:
        """Retrain if its schedule says so (for `OnlinePredictor`, predict/schedule.py); True if it did."""
        ...
