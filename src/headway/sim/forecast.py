"""The simulator's side of the predictor: what it is told (submissions, ends, the clock) and when.

A job is predicted once when it arrives; the predictor learns each end as it happens, retrains on its
own schedule (`maybe_retrain`, asked at every instant, as the live adapters ask it at every pass), and
after a retraining the queue is predicted again when it is at most `repredict_limit` jobs long. The predictor
sees real timestamps (the trace's epoch), never a job's truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from headway.predict.api import EndedJob, OnlinePredictor, SubmittedJob
from headway.sim.state import SimState


class Forecaster:
    def __init__(self, predictor: OnlinePredictor, state: SimState, repredict_limit: int) -> None:
        self.predictor, self.state = predictor, state
        self.repredict_limit = repredict_limit
        self._subs: dict[int, SubmittedJob] = {}  # made at arrival, reused at the job's end
        J = state.jobs
        self._ep0 = J.epoch0
        self._text = (J.job_id.tolist(), J.group.tolist(), J.name.tolist(), J.partition.tolist())
        self._klass, self._nodes = J.klass.tolist(), J.nodes.tolist()
        # A predictor's scalar path for one arrival (api.ScalarPredictor), when it has one.
        self._one: Callable[[SubmittedJob, float], tuple[float, float, float, float]] | None = getattr(
            predictor, "predict_one", None
        )

    def submitted(self, k: int) -> SubmittedJob:
        sj = self._subs.get(k)
        if sj is None:
            st, J = self.state, self.state.jobs
            jid, group, name, part = (col[k] for col in self._text)
            limit = float(J.time_limit[k])
            sj = self._subs[k] = SubmittedJob(
                str(jid), J.users[st.user[k]], group, name, part, J.classes[self._klass[k]],
                self._ep0 + st.submit[k], st.gpus[k], self._nodes[k], None if math.isnan(limit) else limit,
            )  # fmt: skip
        return sj

    def arrived(self, keys: list[int], now: float) -> None:
        """Predict the jobs that arrived at `now` (their first predictions, which the result keeps)."""
        if not keys:
            return
        if len(keys) == 1 and self._one is not None:
            p, r, r90, f = self._one(self.submitted(keys[0]), self._ep0 + now)
            self.state.set_predictions(
                keys, np.array([p]), np.array([r]), np.array([r90]), np.array([f]), True
            )
            return
        self._predict(keys, now, first=True)

    def _predict(self, keys: list[int], now: float, first: bool) -> None:
        pr = self.predictor.predict([self.submitted(k) for k in keys], self._ep0 + now)
        self.state.set_predictions(keys, pr.p_success, pr.runtime, pr.runtime_p90, pr.time_to_failure, first)

    def ended(self, k: int, now: float, state: str) -> None:
        st = self.state
        sj = self._subs.pop(k)  # made when it arrived and was predicted
        self.predictor.observe_end(EndedJob(sj, self._ep0 + st.first_start_a[k], self._ep0 + now, state))

    def tick(self, now: float) -> None:
        """Let the predictor retrain when its schedule says so; re-predict the queue after a retraining."""
        retrained = self.predictor.maybe_retrain(self._ep0 + now)
        pend = self.state.pending
        if retrained and 0 < pend.n <= self.repredict_limit:
            self._predict(pend.view().tolist(), now, first=False)
