"""The local queue's socket protocol, shared by the daemon and its clients (pueue's shape: one module of
message types for both sides).

A client writes one request, a JSON object on one line, and reads one JSON line back; a listing (`queue`,
`history`) answers one bounded page per request and names the cursor of the next. Every request is a
frozen dataclass with its limits. `decode_request` turns a line into one and checks each field once, at
the edge (type, finiteness, bounds, sizes), so no verb ever sees a value it did not ask for, and a bad
request costs one line back (`BadRequest`), never a traceback. Replies are dataclasses too
(`to_wire`, `from_wire`).

Standard library only: every `headway submit` imports this module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

PRIORITIES = ("low", "normal", "high", "urgent")  # priority classes, lowest first (core.py uses these)

# ---- limits (docs/local-queue.md, "Limits") ----

KIB = 1024
MAX_REQUEST_BYTES = 2048 * KIB  # one request line, JSON and all
MAX_ARGV_BYTES = 128 * KIB  # the command with its arguments, as exec gets them (each with its NUL)
MAX_ARGS = 4096
MAX_ENV_BYTES = 256 * KIB  # NAME=value and a NUL for every variable
MAX_NAME_CHARS = 256
MAX_CWD_BYTES = 4096  # PATH_MAX
MAX_TIME_LIMIT_S = 365 * 86400.0  # a year
MAX_JOB_ID = 2**63 - 1  # SQLite's integers end there
MAX_GPUS = 1024  # as `headway daemon --gpus` (gpus.MAX_GPUS)
MAX_USER_CHARS = 256
MAX_OFFSET = 2**63 - 1
MAX_DIGITS = 20  # any whole number a field takes fits in 20 digits; a 5,000-digit one is not parsed
PAGE_JOBS = 500  # jobs in one page of a listing
PAGE_BYTES = 1024 * KIB  # a page stops growing once it is this large (one job more at most)
REQUEST_TIMEOUT_S = 5.0  # a connection that has not sent a whole request by then is closed
MAX_CONNECTIONS_PER_UID = 32  # open at once, per user
MAX_CONNECTIONS = 1024  # open at once, all users but root; never more than half the descriptor limit


class RequestError(ValueError):
    """A refused request; its message, one line, goes back to the client."""


class BadRequest(RequestError):
    """A request that breaks the protocol (not JSON, a field of the wrong type, over a limit). Refused as
    any other, and logged by the daemon, a few lines a minute per user."""


_MISSING: Any = object()


def _show(v: Any) -> str:
    """A client's value in a message, kept short: a 14 MB string is neither echoed back nor logged."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, str):
        return repr(v) if len(v) <= 40 else repr(v[:37]) + f"... ({len(v):,} characters)"
    if isinstance(v, int | float):
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(v, list):
        return f"a list of {len(v):,}"
    if isinstance(v, dict):
        return f"an object of {len(v):,} fields"
    return type(v).__name__


def _size(n: int) -> str:
    return f"{n / KIB:,.0f} KiB" if n >= KIB else f"{n} bytes"


# ---- field checks: each names the verb and the field it refuses ----


def _fields(op: str, msg: Mapping[str, Any], known: tuple[str, ...]) -> None:
    extra = [k for k in msg if k != "op" and k not in known]
    if extra:
        raise BadRequest(f"{op}: unknown field {_show(extra[0])} (fields: {', '.join(known) or 'none'})")


def _integer(op: str, key: str, v: Any, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"{op}: field {key!r} must be a whole number, got {_show(v)}")
    if not lo <= v <= hi:
        raise BadRequest(f"{op}: field {key!r} must be from {lo:,} to {hi:,}, got {_show(v)}")
    return v


def _job_id(op: str, key: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadRequest(f"{op}: field {key!r} must be a job id (a whole number), got {_show(v)}")
    if not 0 < v <= MAX_JOB_ID:
        raise RequestError(f"no job {v}")
    return v


def _boolean(op: str, key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{op}: field {key!r} must be true or false, got {_show(v)}")
    return v


def _text(op: str, key: str, v: Any, max_chars: int) -> str:
    if not isinstance(v, str):
        raise BadRequest(f"{op}: field {key!r} must be a string, got {_show(v)}")
    if len(v) > max_chars:
        raise BadRequest(f"{op}: field {key!r} is {len(v):,} characters; at most {max_chars:,}")
    return v


def _os_bytes(op: str, what: str, v: str) -> int:
    """Bytes of a string as exec and the kernel get it (undecodable bytes arrive as surrogates); NUL and
    lone surrogates have no such bytes."""
    if "\0" in v:
        raise BadRequest(f"{op}: {what} contains a NUL byte")
    try:
        return len(v.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        raise BadRequest(f"{op}: {what} is not valid text (a lone surrogate)") from None


def _positive_seconds(op: str, key: str, v: Any, most: float) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise BadRequest(f"{op}: field {key!r} must be a number of seconds, got {_show(v)}")
    if not math.isfinite(v) or not 0 < v <= most:
        raise BadRequest(
            f"{op}: field {key!r} must be more than 0 and at most {most:,.0f} s (a year), got {_show(v)}"
        )
    return float(v)


# ---- requests ----


class _Request:
    """What every request has: its verb (`op`) and its wire form."""

    __slots__ = ()
    op: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, **wire(self)}


@dataclass(frozen=True, slots=True)
class Ping(_Request):
    """Is a daemon there, which GPUs does it hand out, is it ready."""

    op: ClassVar[str] = "ping"

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Ping:
        _fields(cls.op, msg, ())
        return cls()


@dataclass(frozen=True, slots=True)
class Submit(_Request):
    """Queue a command. The daemon takes the user from the socket, never from here."""

    op: ClassVar[str] = "submit"
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: int = 1
    time_limit: float | None = None
    name: str | None = None
    priority: str = "normal"
    after: int | None = None
    preemptible: bool = False  # a higher class may stop it; it is requeued under the same id
    checkpoint_every: float | None = None  # seconds between its checkpoints (a hint; None: the default)

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Submit:
        op = cls.op
        known = ("argv", "cwd", "env", "gpus", "time_limit", "name", "priority", "after", "preemptible")
        _fields(op, msg, (*known, "checkpoint_every"))
        argv = msg.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise BadRequest(f"{op}: field 'argv' must be a list of strings, got {_show(argv)}")
        if not argv or not argv[0]:
            raise BadRequest(f"{op}: empty command (headway submit -- CMD ARGS...)")
        if len(argv) > MAX_ARGS:
            raise BadRequest(f"{op}: the command has {len(argv):,} arguments; at most {MAX_ARGS:,}")
        size = sum(_os_bytes(op, f"argument {i}", a) + 1 for i, a in enumerate(argv))
        if size > MAX_ARGV_BYTES:
            raise BadRequest(
                f"{op}: the command is {_size(size)} with its arguments; at most {_size(MAX_ARGV_BYTES)}"
            )
        cwd = msg.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise BadRequest(f"{op}: field 'cwd' must be an absolute working directory, got {_show(cwd)}")
        if _os_bytes(op, "the working directory", cwd) > MAX_CWD_BYTES:
            raise BadRequest(f"{op}: the working directory is longer than {MAX_CWD_BYTES:,} bytes")
        env = msg.get("env")
        env = {} if env is None else env
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise BadRequest(f"{op}: field 'env' must map names to strings, got {_show(env)}")
        env_size = 0
        for k, v in env.items():
            if not k or "=" in k:
                raise BadRequest(f"{op}: environment variable name {_show(k)} is empty or contains '='")
            env_size += _os_bytes(op, f"environment variable {_show(k)[:40]}", k)
            env_size += _os_bytes(op, f"the value of {_show(k)[:40]}", v) + 2
        if env_size > MAX_ENV_BYTES:
            raise BadRequest(
                f"{op}: the environment is {_size(env_size)}; at most {_size(MAX_ENV_BYTES)} "
                "(unset large variables before submitting)"
            )
        gpus = _integer(op, "gpus", msg.get("gpus", 1), 0, MAX_GPUS)
        limit = msg.get("time_limit")
        if limit is not None:
            limit = _positive_seconds(op, "time_limit", limit, MAX_TIME_LIMIT_S)
        name = msg.get("name")
        if name is not None:
            name = _text(op, "name", name, MAX_NAME_CHARS) or None
            if name is not None and not name.isprintable():  # a tab or newline broke every table
                raise BadRequest(f"--name {_show(name)}: no tabs, newlines or other control characters")
        prio = msg.get("priority")
        prio = "normal" if prio is None else prio
        if prio not in PRIORITIES:
            classes = ", ".join(PRIORITIES)
            raise BadRequest(f"{op}: field 'priority' must be one of {classes}, got {_show(prio)}")
        after = msg.get("after")
        if after is not None:
            after = _job_id(op, "after", after)
        preemptible = _boolean(op, "preemptible", msg.get("preemptible", False))
        every = msg.get("checkpoint_every")
        if every is not None:
            every = _positive_seconds(op, "checkpoint_every", every, MAX_TIME_LIMIT_S)
        return cls(tuple(argv), cwd, dict(env), gpus, limit, name, str(prio), after, preemptible, every)


@dataclass(frozen=True, slots=True)
class Cancel(_Request):
    op: ClassVar[str] = "cancel"
    id: int

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Cancel:
        _fields(cls.op, msg, ("id",))
        return cls(_job_id(cls.op, "id", msg.get("id")))


@dataclass(frozen=True, slots=True)
class Logs(_Request):
    """A chunk of a job's stdout or stderr from `offset` on."""

    op: ClassVar[str] = "logs"
    id: int
    stream: str = "out"
    offset: int = 0

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Logs:
        _fields(cls.op, msg, ("id", "stream", "offset"))
        stream = msg.get("stream", "out")
        if stream not in ("out", "err"):
            raise BadRequest(f"logs: field 'stream' must be out or err, got {_show(stream)}")
        offset = _integer(cls.op, "offset", msg.get("offset", 0), 0, MAX_OFFSET)
        return cls(_job_id(cls.op, "id", msg.get("id")), str(stream), offset)


@dataclass(frozen=True, slots=True)
class Queue(_Request):
    """Running and pending jobs (`all`: and those ended in the last 24 h), one page from `cursor` on."""

    op: ClassVar[str] = "queue"
    all: bool = False
    cursor: int = 0

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Queue:
        _fields(cls.op, msg, ("all", "cursor"))
        cursor = msg.get("cursor")
        return cls(
            _boolean(cls.op, "all", msg.get("all", False)),
            0 if cursor is None else _integer(cls.op, "cursor", cursor, 0, 2**62),
        )


@dataclass(frozen=True, slots=True)
class History(_Request):
    """Ended jobs, most recent first: up to `limit` (0: all), one page after `cursor` (end time, id)."""

    op: ClassVar[str] = "history"
    limit: int = 100
    user: str | None = None
    cursor: tuple[float, int] | None = None

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> History:
        op = cls.op
        _fields(op, msg, ("limit", "user", "cursor"))
        limit = _integer(op, "limit", msg.get("limit", 100), 0, 2**62)
        user = msg.get("user")
        if user is not None:
            user = _text(op, "user", user, MAX_USER_CHARS)
        cursor = msg.get("cursor")
        if cursor is not None:
            if (
                not isinstance(cursor, list)
                or len(cursor) != 2
                or not isinstance(cursor[0], int | float)
                or isinstance(cursor[0], bool)
            ):
                raise BadRequest(f"{op}: field 'cursor' must be [end_ts, id] of a page, got {_show(cursor)}")
            cursor = (float(cursor[0]), _integer(op, "cursor", cursor[1], 0, MAX_JOB_ID))
        return cls(limit, user or None, cursor)


@dataclass(frozen=True, slots=True)
class Why(_Request):
    op: ClassVar[str] = "why"
    id: int

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Why:
        _fields(cls.op, msg, ("id",))
        return cls(_job_id(cls.op, "id", msg.get("id")))


@dataclass(frozen=True, slots=True)
class Gpus(_Request):
    """The daemon's GPUs, and which job holds each."""

    op: ClassVar[str] = "gpus"

    @classmethod
    def from_wire(cls, msg: Mapping[str, Any]) -> Gpus:
        _fields(cls.op, msg, ())
        return cls()


Request = Ping | Submit | Cancel | Logs | Queue | History | Why | Gpus
REQUESTS: dict[str, type[Request]] = {
    c.op: c for c in (Ping, Submit, Cancel, Logs, Queue, History, Why, Gpus)
}


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise BadRequest(f"malformed request: a number of {len(text):,} digits (at most {MAX_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"malformed request: {_show(text)} is no finite number")
    return value


def _parse_constant(name: str) -> Any:
    raise BadRequest(f"malformed request: {name} is not a number (JSON has no {name})")


def parse_request(msg: Any) -> Request:
    """A decoded JSON value as a request, every field checked (raises BadRequest or RequestError)."""
    if not isinstance(msg, dict):
        raise BadRequest(f"malformed request: not a JSON object but {_show(msg)}")
    op = msg.get("op", _MISSING)
    if op is _MISSING:
        raise BadRequest(f"a request needs a field 'op' (one of {', '.join(REQUESTS)})")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise BadRequest(f"unknown request {_show(op)} (one of {', '.join(REQUESTS)})")
    return cls.from_wire(msg)


def decode_request(line: bytes) -> Request:
    """One request line from the socket: UTF-8 JSON with finite numbers only, then `parse_request`."""
    if len(line) > MAX_REQUEST_BYTES:
        raise BadRequest(f"request larger than {_size(MAX_REQUEST_BYTES)}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("malformed request: not UTF-8 text") from None
    try:
        msg = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except json.JSONDecodeError as e:
        raise BadRequest(f"malformed request: not JSON ({e.msg} at character {e.pos:,})") from None
    except RecursionError:
        raise BadRequest("malformed request: nested too deeply") from None
    return parse_request(msg)


def wire(obj: Any) -> Any:
    """A reply or request as plain JSON values: dataclasses as objects, tuples as lists, and a float that
    is not finite (a factor a policy does not use is NaN) as null, which every JSON reader takes."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: wire(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, list | tuple):
        return [wire(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): wire(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def encode_request(req: Request) -> bytes:
    """One request line. UTF-8 as it is (a request's limits count its bytes), or with escapes when a
    string holds undecodable bytes (surrogates), which UTF-8 cannot carry."""
    msg = req.to_wire()
    try:
        return json.dumps(msg, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(msg, allow_nan=False).encode() + b"\n"


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    return json.dumps(wire(reply), allow_nan=False).encode() + b"\n"


# ---- replies ----
# Plain dataclasses: the daemon builds one per reply and drops it, and a client's start-up does not pay
# for freezing them (every `headway submit` imports this module).


@dataclass
class JobRow:
    """A job as clients see it. `command` and `cwd` are None for other users' jobs: only the owner and
    root see a job's argv and working directory (and nobody its environment)."""

    id: int
    name: str
    user: str
    state: str
    st: str  # Slurm's two-letter code (CG while a running job is told to stop)
    exit_code: int | None
    gpus: int
    gpu_ids: tuple[int, ...]
    submit_time: str | None
    start_time: str | None
    end_time: str | None
    time_limit: float | None
    priority: str
    after: int | None
    reason: str
    p_success: float | None
    pred_runtime: float | None
    command: tuple[str, ...] | None
    cwd: str | None
    submit_ts: float | None  # epoch seconds, so clients compute elapsed times without parsing
    start_ts: float | None
    end_ts: float | None
    rank: int | None = None  # a pending job's place in the queue (1 starts next)
    # Preemption: whether a higher class may stop it, its checkpoint hint (seconds; None: the default),
    # its run number (1 + the times it was preempted and requeued) and when it was last preempted.
    preemptible: bool = False
    checkpoint_every: float | None = None
    attempt: int = 1
    preemptions: int = 0
    last_preempted: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = wire(self)
        return out

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> JobRow:
        kw: dict[str, Any] = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw.update({f.name: None for f in fields(cls) if f.name not in d and f.default is MISSING})
        kw["gpu_ids"] = tuple(kw["gpu_ids"] or ())
        kw["command"] = None if kw["command"] is None else tuple(kw["command"])
        return cls(**kw)


@dataclass
class SubmitReply:
    id: int
    name: str
    user: str


@dataclass
class CancelReply:
    id: int
    state: str
    note: str | None = None


@dataclass
class LogsReply:
    id: int
    data: str  # base64 of the bytes from `offset` on (at most LOG_CHUNK)
    offset: int  # where the next chunk starts
    size: int
    ended: bool
    state: str
    started: bool  # False while the job is pending (or ended without ever starting)


@dataclass
class QueuePage:
    jobs: tuple[JobRow, ...]
    gpu_ids: tuple[int, ...]
    next: int | None  # the cursor of the next page; None on the last

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> QueuePage:
        return cls(
            tuple(JobRow.from_wire(j) for j in d["jobs"]), tuple(d.get("gpu_ids") or ()), d.get("next")
        )


@dataclass
class HistoryPage:
    jobs: tuple[JobRow, ...]
    next: tuple[float, int] | None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> HistoryPage:
        nxt = d.get("next")
        cursor = None if nxt is None else (float(nxt[0]), int(nxt[1]))
        return cls(tuple(JobRow.from_wire(j) for j in d["jobs"]), cursor)


@dataclass
class WhyReply:
    job: JobRow
    policy: str | None
    explanation: tuple[str, ...]
    rank: int | None = None
    of: int | None = None
    score: float | None = None
    factors: Mapping[str, float | None] = field(default_factory=dict)
    estimated_start: str | None = None
    waits_for: str | None = None
    policy_reason: str | None = None
    decision_id: int | None = None


@dataclass
class GpuRow:
    index: int
    model: str  # NVML's name, or "logical" / "listed" for GPUs given by count or index
    state: str  # "free", "busy", or "retired" (held by a job, no longer handed out)
    job: int | None = None
    user: str | None = None
    name: str | None = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> GpuRow:
        kw: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        return cls(**kw)


@dataclass
class GpusReply:
    gpus: tuple[GpuRow, ...]


@dataclass
class PingReply:
    version: str
    pid: int
    gpu_ids: tuple[int, ...]
    gpu_names: tuple[str, ...]
    policy: str
    store: str
    note: str
    you: int
    ready: bool  # False while the predictor loads at start-up: requests are served, nothing starts yet


Reply = SubmitReply | CancelReply | LogsReply | QueuePage | HistoryPage | WhyReply | GpusReply | PingReply
