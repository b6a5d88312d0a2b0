"""The client side of the socket protocol (protocol.py): one JSON line out, one JSON line back, per
connection; a listing is read page by page (`pages`)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from headway.local.paths import shared_daemon_hint, socket_address, socket_path
from headway.local.protocol import Request, encode_request

MAX_LINE = 64 * 1024 * 1024  # far above any reply (a page is about 1 MiB): a guard, not a limit


class ClientError(RuntimeError):
    """The daemon refused a request, or could not be reached; the message is one line for the user."""


class DaemonUnreachable(ClientError):
    """No daemon answered (none running, restarting, or it went away mid-request): worth trying again,
    unlike a refusal."""


def _line(msg: Mapping[str, Any] | Request) -> bytes:
    if not isinstance(msg, Mapping):
        return encode_request(msg)
    try:  # UTF-8 as it is, as encode_request writes it; escapes only for undecodable bytes
        return json.dumps(msg, ensure_ascii=False).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(msg).encode() + b"\n"


def _connect(s: socket.socket, address: str, deadline: float) -> None:
    """Connect, waiting while the daemon's listen queue is full (a socket with a timeout gets EAGAIN at
    once there, where a blocking one would wait): another user's flood of connections delays a request,
    it does not fail it."""
    pause = 0.005
    while True:
        try:
            s.connect(address)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise TimeoutError from None
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


def _exchange(path: Path, line: bytes, timeout: float, deadline: float) -> bytes:
    """One connection: the request out, the reply line back (raises ClientError, or OSError)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            with socket_address(path) as address:
                _connect(s, address, deadline)
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError):
            hint = shared_daemon_hint(path.parent)  # the shared queue, for a user without one of their own
            raise DaemonUnreachable(
                f"no headway daemon at {path} (start one with `headway daemon`, or pass --state-dir)"
                + (f"; {hint}" if hint else "")
            ) from None
        except PermissionError:
            raise ClientError(f"{path}: permission denied (ask the server's admin for access)") from None
        # Refused before it read the request (busy), the daemon may have closed already: its line waits.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(line)
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise ClientError("reply from the daemon is too large")
        return bytes(buf)
    finally:
        s.close()


def request(state_dir: Path, msg: Mapping[str, Any] | Request, timeout: float = 60.0) -> dict[str, Any]:
    """Send one request (typed, or its wire form) and return the daemon's reply (raises ClientError on a
    refusal). A daemon with too many connections open (`busy`: it read nothing of the request) is asked
    again, waiting longer each time, until `timeout`: fifty parallel `headway submit` of one user all
    go through, only slower."""
    path = socket_path(state_dir)
    line = _line(msg)
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        try:
            buf = _exchange(path, line, timeout, deadline)
        except TimeoutError:
            raise DaemonUnreachable(f"the daemon at {path} did not answer within {timeout:.0f} s") from None
        except OSError as e:
            raise DaemonUnreachable(f"talking to the daemon at {path}: {e}") from None
        if not buf:
            raise DaemonUnreachable(f"the daemon at {path} closed the connection without answering")
        reply = json.loads(buf)
        if not isinstance(reply, dict):
            raise ClientError("malformed reply from the daemon")
        if reply.get("busy") and time.monotonic() + pause < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            continue
        if not reply.get("ok"):
            raise ClientError(str(reply.get("error") or "request refused"))
        return reply


def pages(state_dir: Path, msg: Mapping[str, Any], timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """Every page of a listing (`queue`, `history`), following the daemon's `next` cursor; for `history`
    the `limit` (0: all) counts over all pages."""
    ask = dict(msg)
    limit = int(ask.get("limit") or 0)
    got = 0
    while True:
        reply = request(state_dir, ask, timeout)
        yield reply
        got += len(reply.get("jobs") or ())
        nxt = reply.get("next")
        if nxt is None or (limit and got >= limit):
            return
        ask["cursor"] = nxt
        if limit:
            ask["limit"] = limit - got
