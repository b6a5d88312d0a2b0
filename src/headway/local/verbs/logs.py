"""`logs ID`: a chunk of a job's stdout or stderr, for its owner and root."""

from __future__ import annotations

import base64
import contextlib
import os
from typing import TYPE_CHECKING

from headway.local.core import JobState
from headway.local.paths import log_paths
from headway.local.protocol import Logs, LogsReply
from headway.local.server import Caller
from headway.local.verbs.common import owned

if TYPE_CHECKING:
    from headway.local.daemon import Daemon

LOG_CHUNK = 256 * 1024  # bytes of log per reply (base64 makes it a third more)


def run(d: Daemon, caller: Caller, req: Logs) -> LogsReply:
    row = owned(d, caller, req.id, "read the logs of")
    job = d.core.jobs.get(req.id)
    state = job.state if job is not None else JobState(row["state"])
    start = job.start_time if job is not None else row["start_time"]
    path = log_paths(d.state_dir, req.id)[0 if req.stream == "out" else 1]
    data = b""
    size = 0
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(req.offset)
        data = f.read(LOG_CHUNK)
    return LogsReply(
        id=req.id,
        data=base64.b64encode(data).decode(),
        offset=req.offset + len(data),
        size=size,
        ended=not state.active,
        state=state.value,
        # A pending job has no output yet, and `logs` says so rather than print nothing.
        started=state is not JobState.PENDING and (state.active or start is not None or size > 0),
    )
