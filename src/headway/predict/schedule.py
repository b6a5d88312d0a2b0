"""When the online predictor retrains, and on which of the ended jobs.

A retraining refits every model from scratch, so its cost grows with the rows it reads; retraining on a
fixed clock (every day) made a long replay spend nearly all of its time refitting on a history that had
barely changed. The schedule instead retrains when:
- the jobs ended since the last fit reach a share (`growth`) of the rows it trained on: often while the
  history is short (each end changes a lot), rarely once it is long;
- or the outcomes of the jobs the current model predicted stray from its P(complete) (`Served`): a
  cluster whose success rate moves (Philly's fell from 56% to 49% between its training and test months)
  gets a new model within days, a steady one is left alone;
- or a month has passed (`ceiling_s`), as a backstop;
never within an hour of the last fit (`floor_s`), and always on the latest `window` ends. The
simulator, the local queue, the Slurm adapter and `predict evaluate --retrain schedule` use this one
schedule. docs/predict.md ("Retraining schedule") has what it costs in accuracy against a retraining
every day, and what it saves.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class RetrainSchedule:
    """The rule (see the module docstring); the defaults are what every caller uses."""

    growth: float = 0.1  # retrain once the jobs ended since the last fit are this share of its rows
    min_new: int = 50  # ... and at least this many ended since it
    min_train: int = 200  # no model before this many jobs ended
    floor_s: float = HOUR  # never two fits closer than this
    ceiling_s: float = 30 * DAY  # at least this often while jobs keep ending (min_new of them)
    drift_z: float = 3.0  # or when the outcomes since the fit stray this far from its P(complete)
    window: int = 50_000  # train on the latest this many ends

    def due(
        self, now: float, ended: int, new: int, trained: int, last_fit: float | None, drift: float = 0.0
    ) -> bool:
        """Whether to retrain at `now`: `ended` jobs in all, `new` of them since the fit at `last_fit`
        (None: no fit yet), which trained on `trained` rows; `drift`: `Served.z` of the fit's model."""
        if ended < self.min_train or new < self.min_new:
            return False
        if last_fit is None:
            return True
        since = now - last_fit
        if since < self.floor_s:
            return False
        return new >= self.growth * trained or since >= self.ceiling_s or abs(drift) >= self.drift_z


SCHEDULE = RetrainSchedule()


class Served:
    """How the current model's P(complete) compares with the outcomes of the jobs it predicted that have
    ended since: a calibration drift as a z-score (completions minus their expected count, in standard
    deviations of that count), so a cluster whose success rate moves gets a new model within days and a
    steady one is left alone."""

    __slots__ = ("expected", "observed", "var")

    def __init__(self) -> None:
        self.expected = self.observed = self.var = 0.0

    def add(self, p: float, completed: bool) -> None:
        self.expected += p
        self.observed += completed
        self.var += p * (1.0 - p)

    def z(self) -> float:
        return (self.observed - self.expected) / self.var**0.5 if self.var > 0 else 0.0
