"""`headway notify`: the facts on the real Philly sample (cross-checked with the audit), delivery to a real
SMTP server and a real HTTP receiver on the loopback, dedup in the store, and the one-line errors."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import socket
import threading
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message as EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiosmtpd.controller import Controller
from typer.testing import CliRunner, Result

from headway.audit.compute import REPEAT_MIN, anchor_time, audit_report
from headway.audit.periods import parse_time
from headway.cli import app
from headway.data import sample_path
from headway.local.ordering import add_end, fail_streak, new_book
from headway.notify.addresses import AddressError, read_addresses
from headway.notify.facts import HOLD_AFTER, suggested_limit
from headway.schema import JobRecord, State, records_to_table
from headway.store import JobStore

T0 = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
SENDER = "headway@cluster.example.org"


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["notify", *args])


def notify_json(db: Path, *args: str) -> dict[str, Any]:
    res = run("--db", str(db), "--json", *args)
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


@pytest.fixture(scope="module")
def philly_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled Philly sample, ingested by `headway ingest` once for the module."""
    db = tmp_path_factory.mktemp("philly") / "philly.duckdb"
    res = CliRunner().invoke(
        app, ["ingest", "--db", str(db), "--json", str(sample_path("philly_jobs.json.gz"))]
    )
    assert res.exit_code == 0, res.output
    return db


@pytest.fixture
def philly(philly_store: Path, tmp_path: Path) -> Path:
    """A copy of it that a test may write (sent-state, an added job)."""
    db = tmp_path / "philly.duckdb"
    shutil.copy(philly_store, db)
    return db


def _job(
    job_id: str,
    state: State,
    user: str,
    name: str | None,
    submit: dt.datetime,
    runtime: dt.timedelta | None,
    *,
    limit_s: int | None = None,
    gpus: float = 1.0,
    group: str | None = None,
    source: str = "test",
) -> JobRecord:
    start = submit + dt.timedelta(minutes=5) if runtime is not None else None
    end = start + runtime if start is not None and runtime is not None else None
    return JobRecord(
        job_id,
        state,
        source,
        user=user,
        name=name,
        group=group,
        gpus=gpus,
        submit_time=submit,
        start_time=start,
        end_time=end,
        time_limit=limit_s,
    )


def _add(db: Path, jobs: list[JobRecord]) -> None:
    with JobStore(db) as s:
        s.upsert(records_to_table(jobs))


def flat(text: str) -> str:
    """A body with its line wrapping undone, to find a phrase in it."""
    return " ".join(text.split())


def _text_of(mail: EmailMessage) -> str:
    """An email's text body as sent, SMTP's CRLF line ends read back as newlines."""
    payload = mail.get_payload(decode=True)
    assert isinstance(payload, bytes)
    return payload.decode().replace("\r\n", "\n")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class _Inbox:
    """aiosmtpd handler: every message the server accepted, parsed."""

    def __init__(self) -> None:
        self.mails: list[tuple[str, list[str], EmailMessage]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.mails.append((envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[str, _Inbox]]:
    inbox = _Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield f"127.0.0.1:{port}", inbox
    finally:
        controller.stop()


class _Receiver(BaseHTTPRequestHandler):
    posts: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/fail"):
            self.send_response(500, "Internal Server Error")
            self.end_headers()
            return
        self.posts.append({"content_type": self.headers.get("Content-Type"), "json": json.loads(body)})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads the posts, not a log."""


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    posts: list[dict[str, Any]] = []
    handler = type("Handler", (_Receiver,), {"posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook/SECRET", posts
    finally:
        server.shutdown()
        server.server_close()


def test_philly_messages_name_every_user_with_a_run_of_failures_with_the_audits_counts(
    philly_store: Path,
) -> None:
    got = notify_json(philly_store)
    with duckdb.connect(str(philly_store), read_only=True) as con:
        anchor = anchor_time(con)
        since = parse_time("7d", anchor=anchor)
        audit = audit_report(con, since=since, top=100_000)["repeat_failures"]
    assert got["window"]["since"] == since.isoformat()
    expected: dict[str, list[tuple[str | None, int, float]]] = {}
    for r in audit["rows"]:
        expected.setdefault(r["user"], []).append((r["group"], r["failures"], r["gpu_hours"]))
    runs = {
        m["user"]: [(r["group"], r["failures"], r["gpu_hours"]) for r in m["facts"]["repeat_failures"]]
        for m in got["messages"]
        if m["facts"]["repeat_failures"]
    }
    assert runs == expected and len(runs) >= 10
    assert sum(len(v) for v in runs.values()) == audit["streaks"] == 35
    assert all(n >= REPEAT_MIN for v in runs.values() for _, n, _ in v)
    # The biggest waster of the week: user ef0012, 14 failures in a row in virtual cluster 0e4a51.
    ef = next(m for m in got["messages"] if m["user"] == "ef0012")
    body = flat(ef["body"])
    assert "jobs in group 0e4a51: 14 failures in a row (FAILED), 2,839.4 GPU-hours" in body
    assert "still failing" in body
    assert ef["subject"].startswith("headway: 5 failure streaks (5,422 GPU-hours)")
    # Philly has no time limits and only ended jobs: nothing to lower, nobody held.
    assert not any(m["facts"]["over_asks"] or m["facts"]["held_jobs"] for m in got["messages"])


def test_long_waits_say_when_the_size_asked_for_explains_them(philly_store: Path) -> None:
    got = notify_json(philly_store)
    waits = {m["user"]: m["facts"]["long_wait"] for m in got["messages"] if m["facts"]["long_wait"]}
    assert waits
    for w in waits.values():
        assert w["median_s"] >= 2 * w["cluster_median_s"] or w["p90_s"] >= 2 * w["cluster_p90_s"]
    big = waits["037f86"]  # asks for 9-32 GPUs: everyone's jobs of that size wait 2.4 h against 18 min
    assert big["size"] == "9-32" and big["reason"] == "size"
    body = flat(next(m["body"] for m in got["messages"] if m["user"] == "037f86"))
    assert "jobs of that size wait longer for everyone" in body
    small = waits["1f4f96"]  # 2-4 GPUs wait 10 min for everyone: size does not explain 4 h
    assert small["reason"] == "not_size"


def test_json_shape_and_a_dry_run_writes_nothing_and_sends_nothing(
    philly: Path, smtp: tuple[str, _Inbox]
) -> None:
    server, inbox = smtp
    before = _digest(philly)
    got = notify_json(philly, "--smtp", server, "--from", SENDER, "--domain", "example.org")
    assert _digest(philly) == before and not inbox.mails
    assert got["dry_run"] is True and got["channels"] == ["email"] and got["sent"] == []
    keys = {"user", "to", "subject", "body", "facts", "fingerprint", "already_sent"}
    assert got["messages"] and all(set(m) == keys for m in got["messages"])
    m = got["messages"][0]
    assert m["to"] == f"{m['user']}@example.org" and m["already_sent"] is False
    assert set(m["facts"]) == {"user", "repeat_failures", "held_jobs", "over_asks", "long_wait"}
    with duckdb.connect(str(philly), read_only=True) as con:
        assert not con.execute("SELECT * FROM duckdb_tables() WHERE table_name = 'notifications'").fetchall()
    res = run("--db", str(philly), "--user", "ef0012")  # the readable form
    assert res.exit_code == 0 and "Hello ef0012" in res.stdout and "dry run: 1 message" in res.stdout


def test_emails_arrive_once_and_again_only_when_a_fact_changes(
    philly: Path, smtp: tuple[str, _Inbox], tmp_path: Path
) -> None:
    server, inbox = smtp
    dry = notify_json(philly)["messages"]
    users = [m["user"] for m in dry]
    book = tmp_path / "addresses.txt"
    # Every user but the first, half as `user email`, half as CSV, with a comment and a blank line.
    lines = ["# who gets mail", ""] + [
        f"{u} {u}@mail.example.org" if i % 2 else f"{u},{u}@mail.example.org" for i, u in enumerate(users[1:])
    ]
    book.write_text("\n".join(lines) + "\n")
    args = ("--send", "--smtp", server, "--from", SENDER, "--addresses", str(book))

    first = notify_json(philly, *args)
    assert first["skipped"] == [{"user": users[0], "channel": "email", "reason": "no address"}]
    assert len(inbox.mails) == len(users) - 1 == len(first["sent"])
    want = {m["user"]: m for m in first["messages"]}
    for mail_from, rcpts, mail in inbox.mails:
        user = mail["To"].split("@")[0]
        assert mail_from == SENDER == mail["From"] and rcpts == [f"{user}@mail.example.org"]
        assert mail["Subject"] == want[user]["subject"]
        assert mail["X-Headway-Fingerprint"] == want[user]["fingerprint"]
        assert _text_of(mail).strip() == want[user]["body"].strip()

    again = notify_json(philly, *args)  # the same facts: nothing goes out
    assert again["sent"] == [] and len(inbox.mails) == len(users) - 1
    assert all(m["already_sent"] for m in again["messages"] if m["user"] != users[0])

    # ef0012's open streak in 0e4a51 grows by one failure: that message alone is new.
    late = dt.datetime(2017, 12, 12, 10, tzinfo=dt.UTC)
    _add(
        philly,
        [_job("x1", State.FAILED, "ef0012", None, late, HOUR, gpus=8.0, group="0e4a51", source="philly")],
    )
    third = notify_json(philly, *args)
    assert third["sent"] == [{"user": "ef0012", "channel": "email"}]
    assert "15 failures in a row" in flat(_text_of(inbox.mails[-1][2]))


def test_webhook_posts_arrive_as_json_once(philly: Path, receiver: tuple[str, list[dict[str, Any]]]) -> None:
    url, posts = receiver
    first = notify_json(philly, "--send", "--webhook", url)
    assert first["skipped"] == []  # a webhook needs no address
    assert len(posts) == len(first["messages"]) == len(first["sent"]) > 0
    by_user = {m["user"]: m for m in first["messages"]}
    for p in posts:
        body = p["json"]
        assert p["content_type"] == "application/json"
        m = by_user[body["user"]]
        assert body["subject"] == m["subject"] and body["text"] == f"{m['subject']}\n\n{m['body']}"
    again = notify_json(philly, "--send", "--webhook", url)
    assert again["sent"] == [] and len(posts) == len(first["messages"])


def test_over_asked_limits_get_a_suggested_limit_and_held_jobs_are_named(tmp_path: Path) -> None:
    db = tmp_path / "small.duckdb"
    jobs = [
        _job(f"t{k}", State.COMPLETED, "alice", "train", T0 + k * HOUR, HOUR * (1 + 0.1 * k), limit_s=86400)
        for k in range(5)
    ]
    jobs += [
        _job(f"s{k}", State.FAILED, "alice", "sweep", T0 + (6 + k) * HOUR, dt.timedelta(minutes=10))
        for k in range(3)
    ]
    jobs += [
        _job("p1", State.PENDING, "alice", "sweep", T0 + 10 * HOUR, None),
        _job("p2", State.PENDING, "alice", "train", T0 + 10 * HOUR, None),  # its name succeeds: not held
        _job("b1", State.COMPLETED, "bob", "eval", T0, HOUR, limit_s=7200),  # used half its limit: fine
    ]
    _add(db, jobs)
    got = notify_json(db)
    assert [m["user"] for m in got["messages"]] == ["alice"]  # bob has nothing to act on
    facts = got["messages"][0]["facts"]
    assert [(h["job_id"], h["streak"]) for h in facts["held_jobs"]] == [("p1", 3)]
    (ask,) = facts["over_asks"]
    # p95 of 1.0..1.4 h is 1.38 h; x 1.2 headroom = 1.656 h, rounded up to 15 min: 1 h 45 min.
    assert ask["name"] == "train" and ask["over_asking_jobs"] == 5 == ask["completed_jobs"]
    assert ask["suggested_limit_s"] == 6300.0
    body = flat(got["messages"][0]["body"])
    assert "a limit of 1 h 45 min (--time=1:45:00) covers 95% of them" in body
    assert "job p1 (sweep): 3 failures in a row" in body
    # The hold's own count (the local queue's book, fed the same ended jobs in end order) agrees.
    book = new_book()
    for j in sorted((j for j in jobs if j.end_time is not None), key=lambda j: j.end_time or T0):
        assert j.user is not None and j.start_time is not None and j.end_time is not None
        add_end(book, j.user, j.name, j.state.value, j.gpus, j.start_time.timestamp(), j.end_time.timestamp())
    assert fail_streak(book, "alice", "sweep") == 3 >= HOLD_AFTER and fail_streak(book, "alice", "train") == 0
    # The audit counts the same over-asking jobs for alice.
    with duckdb.connect(str(db), read_only=True) as con:
        rows = audit_report(con, top=100)["timeouts"]["over_asking"]["by_user"]
    assert [(r["user"], r["over_asking_jobs"]) for r in rows] == [("alice", 5)]


def test_suggested_limit_rule() -> None:
    assert suggested_limit(3600.0, 86400.0, 3) == 4500.0  # 1.2 h rounded up to 1 h 15 min
    assert suggested_limit(3600.0, 86400.0, 2) is None  # too few jobs to tell
    assert suggested_limit(3600.0, 5000.0, 10) is None  # not worth lowering: 4500 > 0.8 x 5000


def test_addresses_file_errors_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "a.csv"
    f.write_text("user,email\nalice,alice@example.org\nbob bob-at-example\n")
    with pytest.raises(AddressError, match=r"line 3: 'bob-at-example' is not an email address"):
        read_addresses(f)
    f.write_text("alice a@example.org\nalice b@example.org\n")
    with pytest.raises(AddressError, match="line 2: user 'alice' already given on line 1"):
        read_addresses(f)


def _one_line_error(res: Result, *needles: str) -> None:
    assert res.exit_code == 1, res.output
    assert ("Traceback" not in res.output and res.exception is None) or isinstance(res.exception, SystemExit)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for n in needles:
        assert n in lines[0]


def test_unreachable_smtp_server_is_one_line_naming_it(philly: Path) -> None:
    port = _free_port()  # nothing listens there now
    res = run("--db", str(philly), "--json", "--send", "--smtp", f"127.0.0.1:{port}", "--from", SENDER,
              "--domain", "example.org")  # fmt: skip
    _one_line_error(res, f"127.0.0.1:{port}", "cannot reach the mail server")
    assert res.stdout == ""


def test_other_errors_are_one_line(
    philly: Path, tmp_path: Path, receiver: tuple[str, list[dict[str, Any]]]
) -> None:
    url, posts = receiver
    _one_line_error(run("--db", str(philly), "--smtp", "mailhost", "--from", SENDER), "--smtp 'mailhost'")
    _one_line_error(run("--db", str(tmp_path / "none.duckdb")), "no job store here yet")
    _one_line_error(run("--db", str(philly), "--send"), "--send needs somewhere to send")
    _one_line_error(
        run("--db", str(philly), "--send", "--smtp", "localhost:25", "--from", SENDER), "needs addresses"
    )
    fail_url = url.replace("/hook/", "/fail/")
    res = run("--db", str(philly), "--json", "--send", "--webhook", fail_url)
    _one_line_error(res, "HTTP 500")
    assert "SECRET" not in res.stderr and not posts  # the webhook's secret path stays out of the logs
    _one_line_error(run("--db", str(philly), "--since", "last tuesday"), "--since")
    _one_line_error(run("--db", str(philly), "--user", "nobody"), "no jobs of that user")
