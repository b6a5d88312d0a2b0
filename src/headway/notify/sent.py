"""What was sent: the store's `notifications` table, one row per user, fingerprint and channel delivered.

A message whose (user, fingerprint) is already there for a channel is not sent on that channel again. A row
is written right after each delivery, so a run that stops halfway (a server gone) resends nothing that went.
"""

from __future__ import annotations

import datetime as dt

import duckdb

TABLE = "notifications"
CHANNELS: tuple[str, ...] = ("email", "webhook")


def ensure_table(con: duckdb.DuckDBPyConnection) -> None:
    """Create the table in a writable store (a no-op when it is there)."""
    con.execute(
        f'CREATE TABLE IF NOT EXISTS {TABLE} ("user" VARCHAR NOT NULL, fingerprint VARCHAR NOT NULL, '
        "channel VARCHAR NOT NULL, sent_at TIMESTAMPTZ NOT NULL)"
    )


def _has_table(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ? AND table_catalog = "
        "current_database()",
        [TABLE],
    ).fetchone()
    return bool(row and row[0])


def sent_channels(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], set[str]]:
    """(user, fingerprint) -> the channels it was delivered on; empty in a store that never sent any."""
    if not _has_table(con):
        return {}
    out: dict[tuple[str, str], set[str]] = {}
    for user, fp, channel in con.execute(
        f'SELECT DISTINCT "user", fingerprint, channel FROM {TABLE}'
    ).fetchall():
        out.setdefault((str(user), str(fp)), set()).add(str(channel))
    return out


def record(con: duckdb.DuckDBPyConnection, user: str, fingerprint: str, channel: str) -> None:
    """One delivery, written (and committed) at once."""
    con.execute(
        f'INSERT INTO {TABLE} ("user", fingerprint, channel, sent_at) VALUES (?, ?, ?, ?)',
        [user, fingerprint, channel, dt.datetime.now(dt.UTC)],
    )
