"""`why ID`: a job's rank, its impact factors in words, what it waits for, its estimated start."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from headway.local.protocol import Why, WhyReply
from headway.local.server import Caller

if TYPE_CHECKING:
    from headway.local.daemon import Daemon


def run(d: Daemon, caller: Caller, req: Why) -> WhyReply:
    assert d.views is not None
    return d.views.why(caller.uid, req.id, time.time())
