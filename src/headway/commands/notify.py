"""`headway notify`: one message per user with what they can act on; a dry run unless --send is given."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from headway.console import count, err, fail, out, plain, print_json, safe_escape
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP

if TYPE_CHECKING:
    import duckdb

    from headway.audit.periods import Window
    from headway.notify.addresses import AddressBook
    from headway.notify.compose import Message
    from headway.notify.send import SmtpServer
    from headway.store import JobStore


@dataclass(slots=True)
class _Outcome:
    """What a sending run did, for the summary and `--json`."""

    sent: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def notify(
    db: Annotated[
        Path | None,
        typer.Option(
            "--db", help="DuckDB job store (default ./headway.duckdb, or $HEADWAY_DB).", show_default=False
        ),
    ] = None,
    since: Annotated[
        str,
        typer.Option(
            help="Facts of jobs submitted at or after this: a relative time (7d, 12h, 2w) counted back from "
            "the newest job in the store, a date (2026-01-31) or a time (2026-01-31T12:00).",
        ),
    ] = "7d",
    send: Annotated[
        bool,
        typer.Option(
            "--send/--dry-run",
            help="Deliver the messages (by --smtp and/or --webhook) and record them in the store; the "
            "default is a dry run that prints them and writes nothing.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the messages as one JSON object only.")
    ] = False,
    smtp: Annotated[
        str | None,
        typer.Option(
            help="Mail server HOST:PORT to send through (plain SMTP, e.g. a local relay).", show_default=False
        ),
    ] = None,
    sender: Annotated[
        str | None,
        typer.Option(
            "--from", help="The From address of the emails (needed with --smtp).", show_default=False
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            help='Slack-style webhook URL: one POST of JSON {"text", "user", "subject"} per message.',
            show_default=False,
        ),
    ] = None,
    addresses: Annotated[
        Path | None,
        typer.Option(
            help="File of `user email` (or `user,email`) lines: where each user's email goes.",
            show_default=False,
        ),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option(help="Mail users not in --addresses at USER@DOMAIN.", show_default=False),
    ] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's message.", show_default=False)] = None,
    wait: Annotated[
        float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
    ] = DEFAULT_WAIT,
) -> None:
    """Write to each user about what they can act on: job names failing again and again (and the GPU-hours
    they burned), pending jobs the repeat-failure hold is holding, time limits far above use (with a
    limit to ask for instead) and waits far above the cluster's (and why, where the data says).

    A dry run by default: it prints the messages and writes nothing. --send delivers them by email
    (--smtp HOST:PORT --from ADDR) and/or webhook (--webhook URL), and records each in the store's
    notifications table, so a message is sent again only when its facts change. docs/notify.md has the
    rules.
    """
    from headway.notify.addresses import AddressBook, AddressError, check_domain, is_email, read_addresses
    from headway.notify.send import SendError, check_webhook, parse_smtp

    try:
        server = parse_smtp(smtp) if smtp is not None else None
        hook = check_webhook(webhook) if webhook is not None else None
        book = AddressBook(
            read_addresses(addresses) if addresses is not None else {},
            check_domain(domain) if domain is not None else None,
        )
    except (SendError, AddressError) as e:
        fail(str(e))
    if server is not None and not sender:
        fail("--smtp needs --from ADDR: the address the emails come from")
    if sender is not None and not is_email(sender):
        fail(f"--from {sender!r}: not an email address")
    if sender is not None and server is None:
        fail("--from needs --smtp HOST:PORT: the mail server to send through")
    channels = [c for c, on in (("email", server is not None), ("webhook", hook is not None)) if on]
    if send and not channels:
        fail("--send needs somewhere to send: --smtp HOST:PORT --from ADDR and/or --webhook URL")
    if send and server is not None and not book.any():
        fail("--smtp needs addresses: --addresses FILE (user email per line) or --domain DOMAIN")

    con_store = _open(db, send, wait)
    with con_store as store:
        messages, window, anchor = _messages(store.con, store.path, since, user, book, quiet=as_json)
        from headway.notify.sent import ensure_table, sent_channels

        done = sent_channels(store.con)
        already = {m.fingerprint: _already(done, m, channels) for m in messages}
        outcome = _Outcome()
        if send:
            ensure_table(store.con)
            outcome = _deliver(store.con, messages, done, channels, server, sender, hook, quiet=as_json)
    if as_json:
        print_json(
            {
                "messages": [m.to_json(already[m.fingerprint]) for m in messages],
                "db": str(store.path),
                "window": window.to_json(),
                "anchor": anchor.isoformat(),
                "dry_run": not send,
                "channels": channels,
                "sent": outcome.sent,
                "skipped": outcome.skipped,
            }
        )
    else:
        if send:
            _show_sent(messages, outcome)
        else:
            _show(messages, already, channels, user)
    if outcome.refused:
        raise typer.Exit(1)


def _open(db: Path | None, send: bool, wait: float) -> JobStore:
    """The store, read-only for a dry run; writable for --send, which records what it sent there."""
    from headway.store import JobStore, StoreError, default_db_path

    path = Path(db) if db is not None else default_db_path()
    if not path.exists():
        fail(f"{path}: no job store here yet (run `headway ingest` first, or pass --db)")
    if send and not (
        os.access(path, os.W_OK) and os.access(path.parent if str(path.parent) else ".", os.W_OK)
    ):
        fail(
            f"{path}: the job store is not writable; --send records each message it sends there, so none "
            "is sent twice (run without --send for a dry run, or use a store you can write)"
        )
    try:
        return JobStore(path, read_only=not send, wait=wait)
    except StoreError as e:
        fail(str(e))


def _messages(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    since: str,
    user: str | None,
    book: AddressBook,
    *,
    quiet: bool,
) -> tuple[list[Message], Window, datetime.datetime]:
    import duckdb

    from headway.audit.compute import anchor_time, configure
    from headway.audit.periods import PeriodError, parse_window
    from headway.notify.compose import compose
    from headway.notify.facts import user_facts

    try:
        configure(con)
        anchor = anchor_time(con) or datetime.datetime.now(datetime.UTC)
        window = parse_window(since, None, anchor=anchor)
        if user is not None:
            row = con.execute('SELECT count(*) FROM jobs_v WHERE "user" = ?', [user]).fetchone()
            if not row or not row[0]:
                fail(f"--user {user}: no jobs of that user in {path}")
        if not quiet:
            err.print(f"reading {safe_escape(path)}: jobs submitted since {window.since or 'the first'}")
        facts = user_facts(con, window, user=user)
    except PeriodError as e:
        fail(f"--since {e}")
    except duckdb.Error as e:
        fail(f"{path}: cannot read the job store: {(str(e).splitlines() or [type(e).__name__])[0]}")
    return [compose(f, book.lookup(f.user), window) for f in facts], window, anchor


def _already(done: dict[tuple[str, str], set[str]], m: Message, channels: list[str]) -> bool:
    """Sent before on every channel of this run (a dry run without channels: on any)."""
    got = done.get((m.user, m.fingerprint), set())
    return set(channels) <= got if channels else bool(got)


def _deliver(
    con: duckdb.DuckDBPyConnection,
    messages: list[Message],
    done: dict[tuple[str, str], set[str]],
    channels: list[str],
    server: SmtpServer | None,
    sender: str | None,
    hook: str | None,
    *,
    quiet: bool,
) -> _Outcome:
    """Each message on each channel it has not gone out on, recorded the moment it went."""
    import contextlib

    from headway.notify.send import Mailer, RecipientRefused, SendError, post_webhook
    from headway.notify.sent import record

    result = _Outcome()
    todo = [(m, c) for m in messages for c in channels if c not in done.get((m.user, m.fingerprint), set())]
    for m, c in todo:
        if c == "email" and m.to is None:
            result.skipped.append({"user": m.user, "channel": c, "reason": "no address"})
            if not quiet:
                err.print(
                    f"no address for {safe_escape(m.user)}: not emailed (--addresses or --domain gives one)"
                )
    todo = [(m, c) for m, c in todo if not (c == "email" and m.to is None)]
    try:
        with contextlib.ExitStack() as stack:
            mailer = None
            if server is not None and sender is not None and any(c == "email" for _, c in todo):
                mailer = stack.enter_context(Mailer(server, sender))
            for m, c in todo:
                try:
                    if c == "email":
                        assert mailer is not None
                        mailer.send(m)
                    else:
                        assert hook is not None
                        post_webhook(hook, m)
                except RecipientRefused as e:
                    result.refused.append(m.user)
                    err.print(f"[bold red]error:[/] {safe_escape(e)}", highlight=False)
                    continue
                record(con, m.user, m.fingerprint, c)
                result.sent.append({"user": m.user, "channel": c})
    except SendError as e:
        before = f" ({len(result.sent)} sent before it, recorded)" if result.sent else ""
        fail(f"{e}{before}")
    return result


def _show(messages: list[Message], already: dict[str, bool], channels: list[str], user: str | None) -> None:
    """A dry run: every message in full, as it would go out."""
    from rich.panel import Panel
    from rich.text import Text

    if not messages:
        who = f"{safe_escape(user)} has" if user is not None else "nobody has"
        out.print(f"nothing to tell: {who} nothing to act on in this window")
        return
    for m in messages:
        title = Text.assemble("to ", plain(m.to or "(no address)"), "  ", (m.subject, "bold"))
        note = Text(f"fingerprint {m.fingerprint}" + ("  (already sent)" if already[m.fingerprint] else ""))
        out.print(
            Panel(plain(m.body), title=title, title_align="left", subtitle=note, subtitle_align="right")
        )
    how = " by " + " and ".join(channels) if channels else " (with --smtp/--from and/or --webhook)"
    out.print(f"dry run: {count(len(messages), 'message')}, nothing sent; --send delivers them{how}")


def _show_sent(messages: list[Message], o: _Outcome) -> None:
    """A sending run: one line per delivery (the messages themselves went out), then the totals."""
    from rich.text import Text

    by_user = {m.user: m for m in messages}
    for s in o.sent:
        m = by_user[s["user"]]
        where = m.to if s["channel"] == "email" and m.to else s["channel"]
        out.print(Text.assemble(f"sent by {s['channel']:<7}  ", plain(where), "  ", plain(m.subject)))
    by = {c: sum(1 for s in o.sent if s["channel"] == c) for c in ("email", "webhook")}
    parts = [f"{v} by {c}" for c, v in by.items() if v]
    new = {s["user"] for s in o.sent} | {s["user"] for s in o.skipped} | set(o.refused)
    err.print(
        f"{count(len(messages), 'message')}: sent {', '.join(parts) or 'nothing'}; "
        f"{len(messages) - len(new)} already sent for the same facts, {len(o.skipped)} skipped "
        f"(no address), {len(o.refused)} refused"
    )
