"""Hostile clients of a shared root daemon (issue 23): real Unix users (tests/setup/users.sh) writing to the
socket directly what a careless or malicious user can write. One test per item of the issue.

The daemon knows callers only from SO_PEERCRED, so every client here is a child process of this (root)
test that has dropped to the user's uid before it connects, exactly as that user's own program would.
The venv's interpreter is unreachable to the test users, so a child only runs code this process has
already loaded: raw sockets from the standard library, which is also what a hostile client would use.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import errno
import json
import os
import pwd
import resource
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from headway.local.client import ClientError, request
from test_local_support import REPO, DaemonProc, cli, need_users, shared_dir, start_daemon, wait_until

__all__ = ["shared_dir", "start_daemon"]

ENV = {"PATH": "/usr/bin:/bin"}


# ---------- clients as other users ----------


def _drop(pw: pwd.struct_passwd) -> None:
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def _in_child(pw: pwd.struct_passwd, work: Callable[[], Any]) -> Any:
    """Run `work` in a child process running as `pw`; its JSON-able result comes back through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            _drop(pw)
            data = json.dumps({"result": work()}).encode()
        except BaseException as e:
            data = json.dumps({"crash": f"{type(e).__name__}: {e}"}).encode()
            code = 1
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 20):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    got = json.loads(b"".join(chunks))
    assert "crash" not in got, got
    return got["result"]


def _exchange(path: str, payload: bytes, timeout: float) -> bytes:
    """One raw connection: write `payload`, read until the daemon closes."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        for _ in range(200):  # a full listen queue: wait, as headway's own client does
            try:
                s.connect(path)
                break
            except BlockingIOError:
                time.sleep(0.05)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(payload)
        buf = bytearray()
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(1 << 16):
                buf += chunk
        return bytes(buf)
    finally:
        s.close()


def raw_as(
    pw: pwd.struct_passwd, state_dir: Path, payloads: list[bytes], timeout: float = 20.0
) -> list[bytes]:
    """Each payload on its own connection from a child running as `pw`; the raw bytes of each reply."""
    path = str(state_dir / "headway.sock")

    def work() -> list[str]:
        return [base64.b64encode(_exchange(path, p, timeout)).decode() for p in payloads]

    return [base64.b64decode(b) for b in _in_child(pw, work)]


def line(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg).encode() + b"\n"


def ask_as(pw: pwd.struct_passwd, state_dir: Path, msg: dict[str, Any]) -> dict[str, Any]:
    """One request as `pw`; the daemon's reply as a dict (ok true or false)."""
    reply: dict[str, Any] = json.loads(raw_as(pw, state_dir, [line(msg)])[0])
    return reply


def pages_as(pw: pwd.struct_passwd, state_dir: Path, msg: dict[str, Any]) -> list[bytes]:
    """A listing read page by page as `pw`, following the daemon's `next` cursor; the raw reply lines."""
    got: list[bytes] = []
    cursor: Any = None
    for _ in range(1000):
        raw = raw_as(pw, state_dir, [line({**msg, **({"cursor": cursor} if cursor is not None else {})})])[0]
        got.append(raw)
        cursor = json.loads(raw).get("next")
        if cursor is None:
            return got
    raise AssertionError("the listing never ended")


def submit_msg(argv: list[str], cwd: str = "/", **kw: Any) -> dict[str, Any]:
    return {"op": "submit", "argv": argv, "cwd": cwd, "env": ENV, **kw}


def _one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1 and "Traceback" not in text


def _history(d: DaemonProc) -> dict[int, dict[str, Any]]:
    """Every ended job, read page by page as root (whose pages hold every job's command)."""
    jobs: dict[int, dict[str, Any]] = {}
    msg: dict[str, Any] = {"op": "history", "limit": 0}
    while True:
        page = d.ask(msg)
        jobs.update((j["id"], j) for j in page["jobs"])
        if page.get("next") is None:
            return jobs
        msg["cursor"] = page["next"]


def _running(d: DaemonProc, jid: int) -> Callable[[], bool]:
    return lambda: any(j["id"] == jid and j["state"] == "RUNNING" for j in d.ask({"op": "queue"})["jobs"])


@pytest.fixture
def users() -> tuple[pwd.struct_passwd, pwd.struct_passwd]:
    return need_users()


@pytest.fixture
def daemon(shared_dir: Path, start_daemon: Callable[..., DaemonProc]) -> Iterator[Callable[..., DaemonProc]]:
    """A root daemon on a state dir the test users can reach."""
    yield lambda gpus="1", **kw: start_daemon(gpus=gpus, state_dir=shared_dir / "state", **kw)


# ---------- 1. a typed protocol ----------


def test_ill_typed_fields_are_refused_naming_the_field_and_change_nothing(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """Requests were bare dicts read field by field: `"id": true` was job 1 (a bool is an int), `"all":
    "no"` was true, `"after": true` queued a job behind job 1, and unknown fields passed unnoticed."""
    _, bob = users
    d = daemon()
    first = d.submit(["sleep", "30"])
    assert first == 1
    bad = {
        "id": {"op": "why", "id": True},
        "all": {"op": "queue", "all": "no"},
        "after": submit_msg(["true"], after=True),
        "offset": {"op": "logs", "id": first, "offset": True},
        "limit": {"op": "history", "limit": True},
        "gpus": submit_msg(["true"], gpus="1"),
        "time_limit": submit_msg(["true"], time_limit="60"),
        "frobnicate": submit_msg(["true"], frobnicate=1),
        "op": {"id": 1},
    }
    for field, msg in bad.items():
        reply = ask_as(bob, d.state_dir, msg)
        assert reply["ok"] is False, (field, reply)
        assert f"'{field}'" in reply["error"], (field, reply)
        assert "\n" not in reply["error"]
    assert [j["id"] for j in d.ask({"op": "queue"})["jobs"]] == [first]  # nothing of bob's was queued

    # Client and daemon share the request types: what the client encodes is what the daemon decodes.
    from headway.local import protocol

    sub = protocol.Submit(argv=("python", "train.py"), cwd="/srv", env={"A": "1"}, gpus=2, time_limit=60.0)
    assert protocol.decode_request(protocol.encode_request(sub)) == sub
    ok = ask_as(bob, d.state_dir, sub.to_wire() | {"cwd": "/", "gpus": 0, "argv": ["true"]})
    assert ok["ok"] is True and ok["user"] == bob.pw_name


# ---------- 2. a poisoned store ----------


def _stored_ids(store: Path) -> set[int]:
    try:
        con = duckdb.connect(str(store), read_only=True)
    except duckdb.Error:
        return set()
    try:
        return {int(r[0]) for r in con.execute("SELECT job_id FROM jobs WHERE source = 'local'").fetchall()}
    finally:
        con.close()


def test_numbers_are_finite_and_bounded_and_one_bad_row_never_blocks_the_job_store(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """`"time_limit": Infinity` was accepted, and from then on every flush of ended jobs to the store
    failed and was retried forever (17 of 23 ended jobs never reached it); `--time 999...9s` was the same
    infinity, and `--time 999...9` (minutes) a traceback."""
    alice, _ = users
    d = daemon(gpus="1")
    for value in (b"Infinity", b"-Infinity", b"NaN", b"1e400", b"31622400", b"0", b"-5"):
        raw = b'{"op": "submit", "argv": ["true"], "cwd": "/", "env": {}, "time_limit": ' + value + b"}\n"
        reply = json.loads(raw_as(alice, d.state_dir, [raw])[0])
        assert reply["ok"] is False and ("time_limit" in reply["error"] or "number" in reply["error"]), (
            value,
            reply,
        )
    huge_int = b'{"op": "submit", "argv": ["true"], "cwd": "/", "env": {}, "gpus": ' + b"9" * 5000 + b"}\n"
    reply = json.loads(raw_as(alice, d.state_dir, [huge_int])[0])
    assert reply["ok"] is False and "5,000 digits" in reply["error"]
    for spec in ("9" * 400 + "s", "9" * 400, "366d", "inf", "nan"):
        res = cli("submit", "--time", spec, "--", "true", state_dir=d.state_dir)
        assert res.returncode == 1 and _one_line(res.stderr), (spec[:12], res.stderr)
    res = cli("submit", "--time", "366d", "--", "true", state_dir=d.state_dir)
    assert "a year" in res.stderr
    assert d.ask({"op": "queue"})["jobs"] == []

    # A queue database written before these checks may already hold such a row: it must be skipped once,
    # with one line, and every other ended job still written to the store.
    ids = [d.submit(["true"], time_limit=60.0, name=f"j{k}") for k in range(3)]
    wait_until(lambda: set(ids) <= set(_history(d)), 30, "three jobs to end")
    wait_until(lambda: _stored_flags(d, ids) == [1, 1, 1], 30, "the jobs in the store")
    d.kill(signal.SIGTERM)
    store = d.state_dir / "jobs.duckdb"
    store.unlink()
    con = sqlite3.connect(str(d.state_dir / "queue.sqlite"))
    with con:
        con.execute("UPDATE jobs SET stored = 0")
        con.execute("UPDATE jobs SET time_limit = ? WHERE id = ?", (float("inf"), ids[1]))
    con.close()
    d.start()
    later = d.submit(["true"], name="later")
    # Read in SQLite (WAL: it never blocks the daemon): 1 is written, -1 cannot be, 0 not yet.
    wait_until(lambda: _stored_flags(d, [*ids, later]) == [1, -1, 1, 1], 30, "the good rows in the store")
    assert _stored_ids(store) == {ids[0], ids[2], later}
    time.sleep(3.0)  # several flush intervals: the bad row is not retried
    log = (d.state_dir / "daemon.log").read_text()
    skipped = [ln for ln in log.splitlines() if f"job {ids[1]} " in ln and "job store" in ln]
    assert len(skipped) == 1, skipped
    assert _history(d)[ids[1]]["state"] == "COMPLETED"  # still in the queue's own history


def _stored_flags(d: DaemonProc, ids: list[int]) -> list[int]:
    con = sqlite3.connect(f"file:{d.state_dir / 'queue.sqlite'}?mode=ro", uri=True)
    try:
        flags = dict(con.execute("SELECT id, stored FROM jobs").fetchall())
    finally:
        con.close()
    return [int(flags.get(i, 0)) for i in ids]


# ---------- 3. huge requests ----------


def test_sizes_are_limited_at_submit_and_listings_come_in_bounded_pages(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """Five submissions with 14 MB argvs made `queue`, `queue --all` and `history` fail for every user
    ("reply from the daemon is too large")."""
    alice, bob = users
    d = daemon(gpus="1")
    too_big = {
        "argv": submit_msg(["sh", "-c", "x" * (14 * 1024 * 1024)]),
        "many args": submit_msg(["true"] + ["a"] * 5000),
        "env": {**submit_msg(["true"]), "env": {"BIG": "e" * (300 * 1024)}},
        "name": submit_msg(["true"], name="n" * 300),
        "cwd": submit_msg(["true"], cwd="/" + "c" * 5000),
    }
    for what, msg in too_big.items():
        reply = json.loads(raw_as(alice, d.state_dir, [line(msg)])[0])
        assert reply["ok"] is False and "\n" not in reply["error"], (what, reply)
    cmd = cli("submit", "--", "true", "a" * 100_000, "b" * 100_000, state_dir=d.state_dir)
    assert cmd.returncode == 1 and _one_line(cmd.stderr) and "128 KiB" in cmd.stderr, cmd.stderr

    # Forty jobs just under the limits: 4.8 MB of argv in the queue, behind a blocker.
    blocker = d.submit(["sleep", "60"])
    wait_until(_running(d, blocker), 20, "the blocker to run")
    heavy = [submit_msg(["true", f"{k}:" + "y" * 120_000], name=f"heavy{k}") for k in range(40)]
    replies = [json.loads(r) for r in raw_as(alice, d.state_dir, [line(m) for m in heavy])]
    assert all(r["ok"] for r in replies), [r for r in replies if not r["ok"]][:1]
    mine = {r["id"] for r in replies}

    from headway.local.protocol import MAX_REQUEST_BYTES, PAGE_BYTES

    for msg in ({"op": "queue"}, {"op": "queue", "all": True}):
        for who in (alice, bob):
            raw = pages_as(who, d.state_dir, msg)
            assert all(len(r) <= PAGE_BYTES + MAX_REQUEST_BYTES for r in raw)
            jobs = [j for r in raw for j in json.loads(r)["jobs"]]
            assert {j["id"] for j in jobs} == mine | {blocker}
            if who is alice:
                assert len(raw) > 1  # her commands take several pages
                assert all(len(j["command"][1]) > 120_000 for j in jobs if j["id"] in mine)
            else:
                assert all(j["command"] is None for j in jobs if j["id"] in mine)
    for args in (("queue", "--json"), ("queue", "--all", "--json"), ("queue",)):
        res = cli(*args, state_dir=d.state_dir)
        assert res.returncode == 0, res.stderr
    rows = json.loads(cli("queue", "--json", state_dir=d.state_dir).stdout)
    assert {r["id"] for r in rows} == mine | {blocker}
    for jid in mine:
        d.ask({"op": "cancel", "id": jid})
    wait_until(lambda: mine <= set(_history(d)), 30, "the heavy jobs to be cancelled")
    res = cli("history", "--json", "--limit", "0", state_dir=d.state_dir)
    assert res.returncode == 0, res.stderr
    assert mine <= {r["id"] for r in json.loads(res.stdout)}
    hist = [
        j for r in pages_as(bob, d.state_dir, {"op": "history", "limit": 0}) for j in json.loads(r)["jobs"]
    ]
    assert mine <= {j["id"] for j in hist}


# ---------- 4. idle connections ----------


def _flood(path: str, n: int, seconds: float, ready_fd: int) -> dict[str, int]:
    """Keep `n` connections open that never send a request, reopening each one the daemon closes."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 64, n + 64))
    stats: collections.Counter[str] = collections.Counter()
    open_: dict[int, socket.socket] = {}
    poller = select.poll()

    def connect() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except (BlockingIOError, InterruptedError):
            stats["backlog full"] += 1
            s.close()
            return
        except OSError as e:
            stats[f"connect {errno.errorcode.get(e.errno or 0, e.errno)}"] += 1
            s.close()
            return
        open_[s.fileno()] = s
        poller.register(s, select.POLLIN)

    for _ in range(n):
        connect()
    os.write(ready_fd, b"x")
    deadline = time.monotonic() + seconds
    reopened = time.monotonic()
    while time.monotonic() < deadline:
        for fd, _ in poller.poll(100):
            s = open_.pop(fd)
            poller.unregister(fd)
            with contextlib.suppress(OSError):
                data = s.recv(4096)
                if b"too many connections" in data:
                    stats["refused"] += 1
                elif b"no request within" in data:
                    stats["timed out"] += 1
                else:
                    stats["closed"] += 1
            s.close()
        if time.monotonic() - reopened >= 0.5:  # the pressure stays, without a busy loop on 2 cores
            reopened = time.monotonic()
            for _ in range(n - len(open_)):
                connect()
    stats["open at the end"] = len(open_)
    return dict(stats)


def test_idle_connections_cannot_starve_other_users_or_lose_job_ends(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """1,111 connections that never finished a request made submits fail for everyone else and job
    ends go unrecorded (`Too many open files`)."""
    alice, bob = users
    d = daemon(gpus="1")
    assert d.proc is not None
    limit = 256  # a small descriptor limit, so that the flood below is 1.5 times it
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
    ending = d.submit(["sleep", "3"], name="ends-during-the-flood")
    wait_until(_running(d, ending), 20, "the job to run")

    path = str(d.state_dir / "headway.sock")
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the flooder, as alice
        try:
            os.close(r)
            os.close(ready_r)
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
            _drop(alice)
            stats = _flood(path, 400, 14.0, ready_w)
            os.write(w, json.dumps(stats).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        started = time.monotonic()
        most_fds = 0
        bob_submit: dict[str, Any] = {}
        recorded = False
        while time.monotonic() - started < 11.0:
            most_fds = max(most_fds, len(os.listdir(f"/proc/{d.proc.pid}/fd")))
            if not bob_submit.get("ok"):
                bob_submit = ask_as(bob, d.state_dir, submit_msg(["true"], gpus=0, name="bob-during-flood"))
            if not recorded:
                with contextlib.suppress(ClientError):
                    got = request(d.state_dir, {"op": "history", "limit": 10}, timeout=3)
                    recorded = ending in {j["id"] for j in got["jobs"]}
            if recorded and bob_submit.get("ok") and time.monotonic() - started > 7.0:
                break
            time.sleep(0.2)
        assert bob_submit.get("ok"), bob_submit
        assert recorded, "the job that ended during the flood was not recorded"
        assert most_fds < limit - 16, most_fds
    finally:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(ready_r)
    stats = json.loads(b"".join(chunks))
    assert stats.get("refused", 0) > 100, stats  # over the per-user cap: told so at once, one line
    assert stats.get("timed out", 0) > 0, stats  # a request must arrive within a few seconds
    assert _history(d)[ending]["state"] == "COMPLETED"
    log = (d.state_dir / "daemon.log").read_text()
    assert "Too many open files" not in log
    unit = (REPO / "contrib" / "headway.service").read_text()  # where systemd runs it: a known limit
    assert any(ln.startswith("LimitNOFILE=") for ln in unit.splitlines())


# ---------- 5. log flooding ----------


def test_malformed_requests_are_one_rate_limited_log_line_not_a_traceback_each(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """Each malformed request wrote a full traceback to daemon.log (2,333 of them)."""
    _, bob = users
    d = daemon(gpus="1")
    garbage = [
        b"{\n",
        b"\xff\xfe\xfd\n",
        b"[" * 100_000 + b"\n",
        b"null\n",
        b'{"op": 5}\n',
        b'{"op": "submit", "argv": "rm -rf /"}\n',
        b'{"op": "cancel", "id": 1e999}\n',
        b'{"op": "nothing"}\n',
    ]
    payloads = garbage * 25
    replies = raw_as(bob, d.state_dir, payloads)
    for raw in replies:
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw[:200]
        reply = json.loads(raw)
        assert reply["ok"] is False and reply["error"]
    assert ask_as(bob, d.state_dir, submit_msg(["true"], gpus=0))["ok"]  # the daemon is fine
    log = (d.state_dir / "daemon.log").read_text()
    assert "Traceback" not in log
    about_bob = [ln for ln in log.splitlines() if f"uid {bob.pw_uid}" in ln]
    assert 1 <= len(about_bob) <= 6, about_bob  # a few lines a minute per user, not one per request


# ---------- 6. argv for all to see ----------


def test_other_users_see_no_argv_cwd_or_env_only_the_owner_and_root_do(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc], shared_dir: Path
) -> None:
    """`queue --json`, `why --json` and `history --json` showed every user's argv and working directory to
    everyone (an `--api-key=...` was read)."""
    alice, bob = users
    work = shared_dir / "cwd-SECRET-dir"
    work.mkdir()
    os.chown(work, alice.pw_uid, alice.pw_gid)
    d = daemon(gpus="1")
    env = {**ENV, "API_TOKEN": "SECRET-env"}

    def sub(argv: list[str], **kw: Any) -> int:
        reply = ask_as(alice, d.state_dir, {**submit_msg(argv, cwd=str(work), **kw), "env": env})
        assert reply["ok"], reply
        return int(reply["id"])

    running = sub(["sh", "-c", "sleep 30", "sh", "--api-key=SECRET-1"])
    wait_until(_running(d, running), 20, "alice's job to run")
    pending = sub(["sh", "-c", "true", "sh", "--api-key=SECRET-2"])
    ended = sub(["sh", "-c", "true", "sh", "--api-key=SECRET-3"], gpus=0)
    wait_until(lambda: ended in _history(d), 20, "alice's CPU job to end")
    asks = [
        {"op": "queue"},
        {"op": "queue", "all": True},
        {"op": "history", "limit": 0},
        {"op": "gpus"},
        *({"op": "why", "id": j} for j in (running, pending, ended)),
    ]
    for msg in asks:
        seen = raw_as(bob, d.state_dir, [line(msg)])[0]
        assert json.loads(seen)["ok"], seen
        assert b"SECRET" not in seen, (msg, seen)
        own = raw_as(alice, d.state_dir, [line(msg)])[0]
        if msg["op"] != "gpus":
            assert b"SECRET-" in own and b"cwd-SECRET-dir" in own, (msg, own)
        assert b"SECRET-env" not in own  # the environment is never in a reply
    bobs_view = json.loads(raw_as(bob, d.state_dir, [line({"op": "queue"})])[0])["jobs"]
    row = next(j for j in bobs_view if j["id"] == running)
    assert (row["user"], row["name"], row["state"], row["gpus"]) == (alice.pw_name, "sh", "RUNNING", 1)
    assert row["command"] is None and row["cwd"] is None and row["submit_time"]
    assert next(j for j in bobs_view if j["id"] == pending)["rank"] == 1
    root_view = {j["id"]: j for j in d.ask({"op": "queue"})["jobs"]}
    assert root_view[running]["command"][-1] == "--api-key=SECRET-1"
    assert root_view[running]["cwd"] == str(work)


# ---------- 7. priority classes ----------


def test_priority_classes_above_normal_need_the_policy_file(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc]
) -> None:
    """Any user could submit `--priority urgent` and jump the queue."""
    alice, bob = users
    d = daemon(gpus="1")

    def try_class(pw: pwd.struct_passwd, klass: str) -> dict[str, Any]:
        return ask_as(pw, d.state_dir, submit_msg(["true"], gpus=0, priority=klass))

    for klass in ("low", "normal"):
        assert try_class(bob, klass)["ok"]
    for klass in ("high", "urgent"):
        refused = try_class(bob, klass)
        assert refused["ok"] is False and f"priority {klass}" in refused["error"], refused
        assert "classes.toml" in refused["error"] and "\n" not in refused["error"]
    assert d.ask(submit_msg(["true"], gpus=0, priority="urgent"))["id"]  # root: every class

    policy = d.state_dir / "classes.toml"
    policy.write_text(f'[classes]\nhigh = ["{alice.pw_name}"]\nurgent = ["@{bob.pw_name}"]\n')
    time.sleep(0.05)
    assert try_class(alice, "high")["ok"]
    assert not try_class(alice, "urgent")["ok"]
    assert try_class(bob, "urgent")["ok"]  # through his group
    assert not try_class(bob, "high")["ok"]

    policy.write_text('[classes]\nhigh = "everyone"\n')  # broken: the restricted classes are refused
    time.sleep(0.05)
    broken = try_class(alice, "high")
    assert broken["ok"] is False and "classes.toml" in broken["error"], broken
    assert try_class(alice, "normal")["ok"]

    policy.write_text('[classes]\nhigh = ["*"]\n')
    policy.chmod(0o666)  # writable by anyone: no policy at all
    time.sleep(0.05)
    assert not try_class(bob, "high")["ok"]


# ---------- 11. smaller ----------


def test_nul_bytes_empty_commands_bad_clocks_startup_errors_pending_logs_classes_and_gpus(
    users: tuple[pwd.struct_passwd, pwd.struct_passwd], daemon: Callable[..., DaemonProc], shared_dir: Path
) -> None:
    """NUL bytes and an empty command were queued (and failed at exec), `--time 25:99` got the generic
    line, a socket path taken by a directory stopped the daemon with a traceback, `logs` of a pending job
    printed nothing, `why` never named an urgent job's class, and no command listed the GPUs."""
    alice, _ = users
    d = daemon(gpus="2")
    bad = {
        "NUL": submit_msg(["echo", "a\0b"]),
        "NUL ": {**submit_msg(["true"]), "env": {"A": "x\0y"}},
        "'='": {**submit_msg(["true"]), "env": {"A=B": "x"}},
        "empty command": submit_msg([""]),
        "empty command ": submit_msg([]),
    }
    for what, msg in bad.items():
        reply = ask_as(alice, d.state_dir, msg)
        assert reply["ok"] is False and what.strip() in reply["error"], (what, reply)
    clock = cli("submit", "--time", "25:99", "--", "true", state_dir=d.state_dir)
    assert clock.returncode == 1 and _one_line(clock.stderr) and "seconds 99" in clock.stderr, clock.stderr

    blocker = d.submit(["sleep", "60"], name="blocker")
    wait_until(_running(d, blocker), 20, "the blocker to run")
    waiting = d.submit(["true"], gpus=2, priority="urgent", name="waiting")
    logs = cli("logs", str(waiting), state_dir=d.state_dir)
    assert logs.returncode == 0 and "has not started" in logs.stderr, logs.stderr
    why = cli("why", str(waiting), state_dir=d.state_dir)
    assert "priority class: urgent" in why.stdout, why.stdout
    gpus = cli("gpus", "--json", state_dir=d.state_dir)
    assert gpus.returncode == 0, gpus.stderr
    table = {g["index"]: g for g in json.loads(gpus.stdout)}
    assert set(table) == {0, 1}
    busy = [g for g in table.values() if g["state"] == "busy"]
    assert len(busy) == 1 and busy[0]["job"] == blocker and busy[0]["user"] == "root"
    assert [g["state"] for g in table.values()].count("free") == 1
    text = cli("gpus", state_dir=d.state_dir)
    assert text.returncode == 0 and "busy" in text.stdout and "free" in text.stdout, text.stderr

    for taken in ("headway.sock", "daemon.log"):  # a directory where the daemon needs a file
        state = shared_dir / f"taken-{taken}"
        (state / taken / "inside").mkdir(parents=True)
        start = subprocess.run(
            [
                sys.executable,
                "-m",
                "headway.cli",
                "daemon",
                "--gpus",
                "1",
                "--quiet",
                "--state-dir",
                str(state),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert start.returncode == 1 and _one_line(start.stderr) and taken in start.stderr, start.stderr
