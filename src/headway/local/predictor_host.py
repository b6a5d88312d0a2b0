"""The daemon's predictor (headway.predict.api.OnlinePredictor, or None): building it, feeding it ended
jobs, asking it for predictions, and retraining it, without ever holding up a request.

Building the predictor (imports, reading the job store, training) and retraining it run in a thread.
Until the thread is done the daemon starts nothing, so no job is ordered without its prediction; jobs that
end meanwhile are kept and fed to the predictor afterwards. A predictor that fails is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from headway.local.core import Event, JobState, LocalJob

log = logging.getLogger("headway.daemon")

LOAD_PATIENCE_S = 60.0  # after this long loading, schedule without the predictor meanwhile
RETRAIN_EVERY_S = 60.0  # how often the predictor is asked whether it wants to retrain

# What `PredictorHost.settle` found: still busy (start nothing), busy for too long (schedule without it),
# or done (predictions of the pending jobs need refreshing).
Settled = Literal["busy", "gave_up", "done"]


class PredictorHost:
    """The predictor and its thread's state. `model_path` is where a retrained model is saved."""

    def __init__(
        self,
        predictor: Any,
        factory: Callable[[], Any] | None,
        model_path: Path,
        now: float,
    ) -> None:
        self.predictor = predictor
        self.factory = factory
        self.model_path = model_path
        self.loading: asyncio.Future[Any] | None = None  # the thread building or retraining it
        self.loading_since = 0.0
        self.loading_kind = "load"  # or "retrain"
        self._ended_while_loading: list[LocalJob] = []
        self._gave_up_waiting = False
        self._last_retrain = now

    @property
    def reading_store(self) -> bool:
        """Whether the predictor is being built: its thread reads the job store, and the daemon is not
        ready (ping) until it is done."""
        return self.loading is not None and self.loading_kind == "load"

    def start_loading(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        """Build the predictor in a thread, if there is a factory to build it with."""
        if self.factory is None:
            return
        self.loading_since = now
        self.loading_kind = "load"
        self.loading = loop.run_in_executor(None, self.factory)

    def observe_end(self, job: LocalJob) -> None:
        """Feed an ended job to the predictor, or keep it for after the thread, which owns the predictor."""
        if self.loading is not None:
            self._ended_while_loading.append(job)
            return
        self.feed(job)

    def feed(self, job: LocalJob) -> None:
        if self.predictor is None or job.start_time is None:
            return
        from headway.local.ordering import ended_for_predictor

        try:
            self.predictor.observe_end(ended_for_predictor(job))
        except Exception:  # the predictor must never take the queue down
            log.exception("predictor.observe_end failed")

    def predictions(self, jobs: Iterable[LocalJob], now: float, refresh: bool = False) -> list[Event]:
        """Core events with predictions for the pending jobs among `jobs` that have none yet (or all of
        them, after a retrain), from one predictor call; none without a predictor or when it fails."""
        if self.predictor is None:
            return []
        todo = [j for j in jobs if j.state is JobState.PENDING and (refresh or j.p_success is None)]
        if not todo:
            return []
        from headway.local.ordering import predicted_events

        try:
            return list(predicted_events(self.predictor, todo, now))
        except Exception:
            log.exception("prediction failed; ranking without it")
            return []

    def retrain_due(self, now: float) -> bool:
        return now - self._last_retrain > RETRAIN_EVERY_S

    def retrain(self, now: float) -> None:
        """Let the predictor retrain (in a thread) when it is due; the new model is saved in the state dir.

        While the predictor is busy, requests are served but nothing is started, so no job is ordered
        without its prediction; ends seen meanwhile are fed to it afterwards."""
        self._last_retrain = now
        if self.predictor is None or self.loading is not None:
            return
        self.loading_kind = "retrain"
        self.loading_since = now
        self.loading = asyncio.get_running_loop().run_in_executor(None, self._retrain_job, now)

    def _retrain_job(self, now: float) -> bool:
        """The retraining thread: whether the predictor retrained (then its model is saved)."""
        if not self.predictor.maybe_retrain(now):
            return False
        model = getattr(self.predictor, "model", None)
        if model is not None and hasattr(model, "save"):
            model.save(self.model_path)
        return True

    def settle(self, now: float) -> Settled:
        """Swap in the predictor once its thread is done (or give up waiting after a minute), and feed it
        the jobs that ended meanwhile. Only while `loading`."""
        fut = self.loading
        assert fut is not None
        if not fut.done():
            if now - self.loading_since < LOAD_PATIENCE_S:
                return "busy"
            if not self._gave_up_waiting:
                log.warning("the predictor is still loading after 60 s; scheduling without it meanwhile")
                self._gave_up_waiting = True
            return "gave_up"
        self.loading = None
        try:
            result = fut.result()
        except Exception:
            log.exception("predictor %s failed; carrying on without it", self.loading_kind)
            result = None
        if self.loading_kind == "load":
            self.predictor = result
            log.info("predictor ready (%.1f s)", now - self.loading_since)
        elif result:
            log.info(
                "predictor retrained (%.1f s); refreshing pending jobs' predictions",
                now - self.loading_since,
            )
        for job in self._ended_while_loading:  # logged and booked when they ended: only the predictor
            self.feed(job)
        self._ended_while_loading.clear()
        return "done"
