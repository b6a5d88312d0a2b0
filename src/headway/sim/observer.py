"""What a run records besides its state: the timeline (one row per instant) and the decisions asked about.

Both are observers: the engine calls them once per instant (the timeline) or once per pass (the
decision log), and neither changes what the simulator does.
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from headway.policy.snapshot import Decision, Snapshot
from headway.sim.result import TIMELINE_COLUMNS, WaitRecord
from headway.sim.state import SimState

_INT_COLUMNS = ("pending", "running", "completed_total")


class Timeline:
    """The cluster's state after each instant (TIMELINE_COLUMNS), piecewise constant until the next."""

    def __init__(self) -> None:
        self._cols = {c: array("d") for c in TIMELINE_COLUMNS}
        self._append = tuple(self._cols[c].append for c in TIMELINE_COLUMNS)

    def record(self, now: float, st: SimState) -> None:
        t, busy, free, pend, run, frag, done, good = self._append
        b = st.cluster.busy
        t(now)
        busy(float(b))
        free(st.cluster.capacity - b)
        pend(float(st.pending.n))
        run(float(st.running.n))
        frag(st.fragmented_free())
        done(float(st.completed))
        good(st.goodput)

    def table(self) -> pa.Table:
        cols = {c: pa.array(np.frombuffer(self._cols[c], dtype=np.float64)) for c in TIMELINE_COLUMNS}
        for c in _INT_COLUMNS:
            cols[c] = cols[c].cast(pa.int64())
        return pa.table(cols)


class DecisionLog:
    """Every Decision (`keep`), and the passes' view of the jobs asked about (`simulate --explain`)."""

    def __init__(self, keep: bool, explain: set[int]) -> None:
        self.keep = keep
        self.explain_keys = explain
        self.decisions: list[Decision] = []
        self.explain: dict[str, list[WaitRecord]] = {}

    def wants(self, arrivals: list[int]) -> bool:
        """Whether a pass must run for the log's sake (a job asked about just arrived)."""
        return bool(self.explain_keys) and not self.explain_keys.isdisjoint(arrivals)

    def record(self, snap: Snapshot, dec: Decision) -> None:
        if self.keep:
            if dec.ranking is not None:
                dec.ranking.score  # noqa: B018 - a deferred ranking reads the snapshot: read it now
            self.decisions.append(dec)
        if self.explain_keys and dec.ranking is not None:
            self._explain(snap, dec)

    def _explain(self, snap: Snapshot, dec: Decision) -> None:
        rk = dec.ranking
        assert rk is not None
        started = {s.key: s.backfill for s in dec.start}
        ranks = rk.rank_of()
        res = dec.reservation
        for pos, key in enumerate(snap.pending.key.tolist()):
            if key not in self.explain_keys:
                continue
            how = ""
            if key in started:
                how = "; started"
                if started[key] and res is not None:  # EASY: it ends before the head's GPUs are due
                    how += f" by backfill (ends before the reservation of job {res.job_id})"
                elif started[key]:
                    how += " by backfill"
            self.explain.setdefault(str(snap.pending.job_id[pos]), []).append(
                WaitRecord(
                    t=snap.now,
                    rank=int(ranks[pos]) + 1,
                    of=len(rk.order),
                    score=float(rk.score[pos]),
                    reason=rk.reason(pos) + how,
                    reservation_start=res.start if res is not None and res.key == key else None,
                )
            )
