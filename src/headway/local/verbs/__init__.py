"""The verbs of the socket protocol, one module each (pueue's shape).

A verb takes the daemon, the caller (from SO_PEERCRED) and its typed request (protocol.py), and returns
a typed reply or raises RequestError. The daemon keeps the loop and the state; `answer` is the way in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headway.local import protocol as p
from headway.local.server import Caller
from headway.local.verbs import cancel, info, listing, logs, submit, why

if TYPE_CHECKING:
    from headway.local.daemon import Daemon

Verb = Callable[["Daemon", Caller, Any], Any]

VERBS: dict[type[p.Request], Verb] = {
    p.Ping: info.ping,
    p.Gpus: info.gpus,
    p.Submit: submit.run,
    p.Cancel: cancel.run,
    p.Logs: logs.run,
    p.Queue: listing.queue,
    p.History: listing.history,
    p.Why: why.run,
}


def answer(d: Daemon, caller: Caller, req: p.Request) -> p.Reply:
    """The reply of the verb `req` asks for."""
    reply: p.Reply = VERBS[type(req)](d, caller, req)
    return reply
