"""What keeps one user's connections from hurting anyone else: caps on open connections, and a log that
says a few lines a minute per user about bad requests.

The caps keep the daemon's own file descriptors free: a flood of idle connections used to take all of
them, and then the watcher could not open a run directory to record a job's end (`Too many open
files`). Connections over a cap are answered at once with one line and closed, so they hold a
descriptor for a moment only; the rest wait in the kernel's listen queue, where they cost the daemon
nothing.
"""

from __future__ import annotations

import logging
import resource
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

from headway.local.protocol import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is on the other end of the socket, from SO_PEERCRED (never from the request)."""

    pid: int
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def peer(sock: socket.socket) -> Caller:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(pid, uid, gid)


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one (systemd's LimitNOFILE sets both); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def total_cap() -> int:
    """Connections open at once, users other than root together: half the descriptor limit (read each
    time, so a limit lowered while it runs counts), at most MAX_CONNECTIONS. The other half stays for
    the daemon's own files: its database, the run directories it reads, the supervisors it starts."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft // 2))


@dataclass(slots=True)
class ConnectionGate:
    """Counts open connections per uid. Root has its own per-user allowance beyond the total, so an
    admin can always look at a daemon that others are flooding."""

    per_uid: int = MAX_CONNECTIONS_PER_UID
    open: Counter[int] = field(default_factory=Counter)
    others: int = 0  # open connections of users other than root

    def admit(self, uid: int) -> str | None:
        """None if the connection may go on (and is counted), else the one line that refuses it."""
        if self.open[uid] >= self.per_uid:
            return f"too many connections from uid {uid} ({self.per_uid} open); close some and try again"
        if uid != 0:
            if self.others >= total_cap():
                return f"too many connections to the daemon ({self.others} open); try again in a moment"
            self.others += 1
        self.open[uid] += 1
        return None

    def release(self, uid: int) -> None:
        self.open[uid] -= 1
        if self.open[uid] <= 0:
            del self.open[uid]
        if uid != 0:
            self.others -= 1


@dataclass(slots=True)
class _Bucket:
    since: float
    logged: int = 0
    dropped: int = 0


@dataclass(slots=True)
class PeerLog:
    """One log line per bad request, at most `burst` per uid per `window` seconds; the rest are counted
    and the count is said with that uid's next line. A user sending garbage in a loop wrote a traceback
    per request (2,333 of them) before."""

    log: logging.Logger
    burst: int = 5
    window: float = 60.0
    _buckets: dict[int, _Bucket] = field(default_factory=dict)

    def allow(self, uid: int, now: float | None = None) -> tuple[bool, int]:
        """Whether a line about `uid` may be written now, and how many were dropped before it."""
        now = time.monotonic() if now is None else now
        b = self._buckets.get(uid)
        if b is None or now - b.since >= self.window:
            dropped = b.dropped if b is not None else 0
            if len(self._buckets) > 10_000:  # uids are few; this bounds it whatever happens
                self._buckets.clear()
            b = self._buckets[uid] = _Bucket(now)
            b.logged = 1
            return True, dropped
        if b.logged < self.burst:
            b.logged += 1
            return True, 0
        b.dropped += 1
        return False, 0

    def note(self, what: str, uid: int, pid: int, reason: str) -> None:
        """`what` ("bad request", "connection refused", ...) from uid/pid, for `reason`: one line."""
        ok, dropped = self.allow(uid)
        if not ok:
            return
        more = f" ({dropped} more from uid {uid} in the last minute not logged)" if dropped else ""
        self.log.warning("%s from uid %d (pid %d): %s%s", what, uid, pid, _one_line(reason), more)

    def bad_request(self, uid: int, pid: int, reason: str) -> None:
        self.note("bad request", uid, pid, reason)

    def trouble(self, text: str) -> None:
        """The daemon's own trouble on the socket (out of descriptors at accept), rate-limited as well."""
        ok, dropped = self.allow(-1)
        if ok:
            self.log.warning("%s%s", text, f" ({dropped} more like it not logged)" if dropped else "")

    def failed(self, uid: int, pid: int, exc: BaseException) -> None:
        """A request the daemon could not answer (a bug): the traceback, rate-limited like the rest."""
        ok, dropped = self.allow(uid)
        if not ok:
            return
        more = f" ({dropped} more from uid {uid} in the last minute not logged)" if dropped else ""
        self.log.error("request from uid %d (pid %d) failed%s", uid, pid, more, exc_info=exc)


def _one_line(text: str, most: int = 300) -> str:
    """A client's words in the log: on one line (a newline would forge a log line), and short."""
    flat = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return flat if len(flat) <= most else flat[: most - 3] + "..."
