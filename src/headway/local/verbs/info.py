"""`ping` (is a daemon there, is it ready) and `gpus` (each GPU: model, free or busy, and with what)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from headway.local.core import JobState
from headway.local.protocol import GpuRow, Gpus, GpusReply, Ping, PingReply
from headway.local.server import Caller

if TYPE_CHECKING:
    from headway.local.daemon import Daemon


def ping(d: Daemon, caller: Caller, req: Ping) -> PingReply:
    from headway import __version__

    return PingReply(
        version=__version__,
        pid=os.getpid(),
        gpu_ids=d.cfg.gpu_ids,
        gpu_names=d.cfg.gpu_names,
        policy=d.cfg.policy,
        store=str(d.cfg.store),
        note=d.cfg.gpu_note,
        you=caller.uid,
        ready=not d.predictors.reading_store,
    )


def gpus(d: Daemon, caller: Caller, req: Gpus) -> GpusReply:
    """Every GPU the daemon hands out, and any it no longer does that a running job still holds."""
    holders = {g: j for j in d.core.jobs.values() if j.state is not JobState.PENDING for g in j.gpu_ids}
    models = dict(zip(d.cfg.gpu_ids, d.cfg.gpu_names, strict=False))
    rows = []
    for g in sorted(set(d.core.gpu_ids) | d.core.retired):
        job = holders.get(g)
        state = "retired" if g not in d.core.gpu_ids else "busy" if job is not None else "free"
        rows.append(
            GpuRow(
                index=g,
                model=models.get(g, "unknown"),
                state=state,
                job=job.id if job else None,
                user=job.user if job else None,
                name=job.name if job else None,
            )
        )
    return GpusReply(tuple(rows))
