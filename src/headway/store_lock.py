"""Waiting for a job store that another process holds open.

DuckDB lets one process write a database file or any number of processes read it, never both: a reader
started while an ingest writes (or an ingest started while a command reads) got DuckDB's lock error at
once. `connect_waiting` retries the connect until the holder lets go or the wait runs out.

Kept apart from store.py (and free of DuckDB) so the commands can name DEFAULT_WAIT and WAIT_HELP in their
options without loading DuckDB for `headway --help`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

DEFAULT_WAIT = 60.0  # seconds a command waits for the store (its --wait)
WAIT_ENV = "HEADWAY_WAIT"  # what --wait reads when it is not given
WAIT_HELP = (
    "Seconds to wait while another process holds the job store (an ingest writing it; for a command "
    f"that writes, commands reading it) before giving up; 0 gives up at once (default {DEFAULT_WAIT:g})."
)

T = TypeVar("T")

# DuckDB 1.x-2.x: 'IO Error: Could not set lock on file "F": Conflicting lock is held in EXE (PID 123).'
# A writer refused by readers alone is told it could open the file read-only: that is how a writer
# tells readers from a writer (DuckDB tries a shared lock after the exclusive one fails).
_LOCK = re.compile(r"Could not set lock on file")
_PID = re.compile(r"\(PID (\d+)\)")
_READERS_ONLY = "open this database in read-only mode"

_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 0.5


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the lock, as far as DuckDB's message says: the PID (None when it named none), and
    whether only readers hold it (so a writer waits for readers, not for another writer)."""

    pid: int | None
    readers: bool

    def doing(self) -> str:
        """`being written by PID 12`, `being read by PID 12`, `being written by another process`."""
        who = f"PID {self.pid}" if self.pid is not None else "another process"
        return f"being {'read' if self.readers else 'written'} by {who}"


def lock_holder(error: BaseException) -> Holder | None:
    """The holder named by DuckDB's lock error, or None when `error` is no lock error."""
    text = str(error)
    if not _LOCK.search(text):
        return None
    pid = _PID.search(text)
    return Holder(int(pid.group(1)) if pid else None, _READERS_ONLY in text)


class StillLocked(Exception):
    """The store stayed locked for the whole wait; `holder` is the last process DuckDB named."""

    def __init__(self, holder: Holder, waited: float) -> None:
        super().__init__(holder.doing())
        self.holder = holder
        self.waited = waited


def connect_waiting(
    connect: Callable[[], T],
    *,
    wait: float,
    on_wait: Callable[[Holder], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`connect()`, retried with a short backoff (50 ms doubling to 0.5 s) while it fails on a lock,
    for up to `wait` seconds (0 or NaN: no retry; inf: until the holder lets go). `on_wait` is called
    once, at the first lock error of a wait that will retry. Other errors pass through at once. Raises
    StillLocked when the wait runs out."""
    wait = wait if wait >= 0 else 0.0  # NaN too
    deadline = clock() + wait
    delay = _FIRST_DELAY_S
    told = False
    while True:
        try:
            return connect()
        except Exception as e:
            holder = lock_holder(e)
            if holder is None:
                raise
            left = deadline - clock()
            if left <= 0:
                raise StillLocked(holder, wait) from e
            if not told:
                on_wait(holder)
                told = True
            sleep(min(delay, left))
            delay = min(delay * 2, _MAX_DELAY_S)
