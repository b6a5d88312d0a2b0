"""The client side of the socket protocol: one JSON line out, one JSON line back, per connection."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from headway.local.paths import socket_address, socket_path

MAX_LINE = 64 * 1024 * 1024


class ClientError(RuntimeError):
    """The daemon refused a request, or could not be reached; the message is one line for the user."""


class DaemonUnreachable(ClientError):
    """No daemon answered (none running, restarting, or it went away mid-request): worth trying again,
    unlike a refusal."""


def request(state_dir: Path, msg: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Send one request and return the daemon's reply (raises ClientError on a refusal)."""
    path = socket_path(state_dir)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            with socket_address(path) as address:
                s.connect(address)
        except (FileNotFoundError, NotADirectoryError, ConnectionRefusedError):
            raise DaemonUnreachable(
                f"no headway daemon at {path} (start one with `headway daemon`, or pass --state-dir)"
            ) from None
        except PermissionError:
            raise ClientError(f"{path}: permission denied (ask the server's admin for access)") from None
        s.sendall(json.dumps(msg).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise ClientError("reply from the daemon is too large")
    except TimeoutError:
        raise DaemonUnreachable(f"the daemon at {path} did not answer within {timeout:.0f} s") from None
    except OSError as e:
        raise DaemonUnreachable(f"talking to the daemon at {path}: {e}") from None
    finally:
        s.close()
    if not buf:
        raise DaemonUnreachable(f"the daemon at {path} closed the connection without answering")
    reply = json.loads(buf)
    if not isinstance(reply, dict):
        raise ClientError("malformed reply from the daemon")
    if not reply.get("ok"):
        raise ClientError(str(reply.get("error") or "request refused"))
    return reply
