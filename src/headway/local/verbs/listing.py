"""`queue` and `history`: job listings, one bounded page per request, argv and cwd for their owners only."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from headway.local.protocol import History, HistoryPage, Queue, QueuePage
from headway.local.server import Caller

if TYPE_CHECKING:
    from headway.local.daemon import Daemon


def queue(d: Daemon, caller: Caller, req: Queue) -> QueuePage:
    assert d.views is not None
    return d.views.queue_page(caller.uid, include_ended=req.all, cursor=req.cursor, now=time.time())


def history(d: Daemon, caller: Caller, req: History) -> HistoryPage:
    assert d.views is not None
    return d.views.history_page(caller.uid, limit=req.limit, user=req.user, cursor=req.cursor)
