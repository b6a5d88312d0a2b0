"""`cancel ID`: a pending job ends at once, a running one gets SIGTERM (then SIGKILL after the grace)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from headway.local.core import CancelRequested, JobState
from headway.local.protocol import Cancel, CancelReply
from headway.local.server import Caller
from headway.local.verbs.common import owned

if TYPE_CHECKING:
    from headway.local.daemon import Daemon


def run(d: Daemon, caller: Caller, req: Cancel) -> CancelReply:
    row = owned(d, caller, req.id, "cancel")
    state = JobState(row["state"])
    if not state.active:
        return CancelReply(req.id, state.value, f"job {req.id} already ended ({state})")
    d._apply(d.core.handle(CancelRequested(req.id, time.time())))
    d.wake.set()
    job = d.core.job(req.id)
    if job is not None:
        return CancelReply(req.id, job.state.value)
    now = d._db().row(req.id)
    return CancelReply(req.id, now["state"] if now is not None else state.value)
