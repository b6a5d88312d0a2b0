"""Writing ended jobs from the queue's database (SQLite) into the DuckDB job store, for the daemon.

The watcher asks for a flush on every pass (`StoreFlush.soon`); the write runs in a thread, one at a time,
so a slow or locked store never holds up a request. A store that cannot be written (a reader holds it, the
disk is full) keeps the jobs unstored in SQLite and is retried with a back-off, warning now and then.
The passes that started jobs (the queue's decision log) go along in the same write, into the store's
decision log, and are marked stored the same way (a `stored` flag of the queue's `decisions` rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway.local.db import StateDB

if TYPE_CHECKING:
    from headway.decision_log import DecisionRecord

log = logging.getLogger("headway.daemon")

# Writing ended jobs into the DuckDB store while another process holds it: retry after 1, 2, 4 ... 60 s,
# and warn once per 10 minutes of failing.
STORE_RETRY_MIN_S = 1.0
STORE_RETRY_MAX_S = 60.0
STORE_WARN_EVERY_S = 600.0
DECISIONS_PER_FLUSH = 100  # logged passes copied per write (a few ms each)
# A logged pass goes with the next write of ended jobs, or on its own once it has waited this long: a
# short job's start and end then take one open of the store, not two (each open locks readers out).
DECISIONS_ALONE_AFTER_S = 3.0

Decisions = list[tuple[int, "DecisionRecord"]]  # (the queue's decision id, the record to store)


def unstored_decisions(db: StateDB, limit: int) -> tuple[Decisions, dict[int, str]]:
    """The queue's logged passes not yet in the store, as records (with the user, name and GPUs of the
    jobs they name, from the queue's database), and those that cannot be read (id: why). Reads SQLite:
    call it in the daemon's thread."""
    from headway.local.store_sync import to_decision

    rows = db.unstored_decisions(limit)
    if not rows:
        return [], {}
    ids: set[int] = set()
    for r in rows:
        for text in (r["ranking"], r["starts"]):
            with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):  # to_decision says why
                ids.update(int(e["job_id"] if isinstance(e, dict) else e[0]) for e in json.loads(text))
    jobs: dict[int, dict[str, Any]] = {}
    for chunk in range(0, len(ids), 500):
        part = sorted(ids)[chunk : chunk + 500]
        for j in db.rows(f"id IN ({', '.join('?' for _ in part)})", part):
            jobs[int(j["id"])] = dict(j)
    good: Decisions = []
    bad: dict[int, str] = {}
    for r in rows:
        try:
            good.append((int(r["id"]), to_decision(dict(r), jobs)))
        except Exception as e:
            bad[int(r["id"])] = f"{type(e).__name__}: {e}"
    return good, bad


def write_storable(
    store: Path, rows: list[dict[str, Any]], decisions: Sequence[tuple[int, DecisionRecord]] = ()
) -> dict[int, str]:
    """Write the ended jobs to the job store, all but those that cannot be converted to its schema
    (returned, with why): one row with an infinite time limit failed every batch, forever, and 17 of 23
    ended jobs never reached the store. Runs in a thread (pyarrow, DuckDB)."""
    from headway.local.store_sync import to_table, write_ended

    bad: dict[int, str] = {}
    try:
        to_table(rows)
        good = rows
    except Exception:
        good = []
        for r in rows:
            try:
                to_table([r])
                good.append(r)
            except Exception as e:
                bad[int(r["id"])] = f"{type(e).__name__}: {e}"
    if good or decisions:
        write_ended(store, good, decisions)
    return bad


class StoreFlush:
    """The flush of ended jobs into the job store at `store`, with its retry and warning state. `db`
    gives the queue's database (open only after the daemon's `open`)."""

    def __init__(self, store: Path, db: Callable[[], StateDB]) -> None:
        self.store = store
        self._db = db
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0
        self._delay = STORE_RETRY_MIN_S  # doubles while the store cannot be written
        self._failing_since: float | None = None
        self._warned = 0.0

    def soon(self) -> None:
        """Start writing the unstored ended jobs in a thread, unless a write is under way or a failed one
        was too recent (the back-off). Needs the running event loop."""
        if self._task is not None and not self._task.done():
            return
        if time.time() - self._last < self._delay:
            return
        rows = self._db().unstored()
        oldest = self._db().unstored_decisions(1)
        if not rows and not (oldest and time.time() - float(oldest[0]["time"]) >= DECISIONS_ALONE_AFTER_S):
            return
        decisions = self._decisions(DECISIONS_PER_FLUSH)
        if not rows and not decisions:
            return
        self._last = time.time()
        self._task = asyncio.get_running_loop().create_task(self._flush([dict(r) for r in rows], decisions))

    async def wait(self) -> None:
        """Let the write under way (if any) finish: at shutdown, before the last `now`."""
        if self._task is not None:
            await self._task

    def _decisions(self, limit: int) -> Decisions:
        """The logged passes to copy; one that cannot be read is marked so (-1) with a line, not retried."""
        decisions, bad = unstored_decisions(self._db(), limit)
        if bad:
            for did, why in bad.items():
                log.error(
                    "decision %d cannot be written to the job store (%s); skipped, not retried", did, why
                )
            db = self._db()
            with db.transaction():
                db.mark_decisions_stored(list(bad), -1)
        return decisions

    async def _flush(self, rows: list[dict[str, Any]], decisions: Decisions) -> None:
        try:
            bad = await asyncio.to_thread(write_storable, self.store, rows, decisions)
        except Exception as e:  # locked by a reader, disk full: keep them unstored and retry later
            # Backing off, and one warning per STORE_WARN_EVERY_S: a reader holding the store for an hour
            # wrote a line a second before.
            now = time.time()
            self._delay = min(self._delay * 2.0, STORE_RETRY_MAX_S)
            if self._failing_since is None:
                self._failing_since = now
            if now - self._warned >= STORE_WARN_EVERY_S:
                self._warned = now
                log.warning(
                    "job store %s not written yet (%s); %d ended job(s) and %d decision(s) stay in the "
                    "queue's database, retrying every %.0f s or less",
                    self.store,
                    e,
                    len(rows),
                    len(decisions),
                    STORE_RETRY_MAX_S,
                )
            return
        self._mark_flushed(rows, bad, decisions)
        if self._failing_since is not None:
            log.info(
                "job store %s written again after %.0f s",
                self.store,
                time.time() - self._failing_since,
            )
        self._delay, self._failing_since, self._warned = STORE_RETRY_MIN_S, None, 0.0

    def now(self) -> None:
        """Write every unstored ended job at once, in this thread (at shutdown; raises on failure)."""
        rows = [dict(r) for r in self._db().unstored(limit=100_000)]
        decisions = self._decisions(10 * DECISIONS_PER_FLUSH)  # a long backlog: the rest at the next start
        if rows or decisions:
            self._mark_flushed(rows, write_storable(self.store, rows, decisions), decisions)

    def _mark_flushed(self, rows: list[dict[str, Any]], bad: dict[int, str], decisions: Decisions) -> None:
        """Mark the written rows stored, and the rows that cannot be (`bad`) as such (`stored = -1`),
        each with one log line: they stay in the queue's database and history, and are not retried."""
        for jid, why in bad.items():
            log.error("job %d cannot be written to the job store (%s); skipped, not retried", jid, why)
        db = self._db()
        with db.transaction() as con:
            db.mark_stored([int(r["id"]) for r in rows if int(r["id"]) not in bad])
            con.executemany("UPDATE jobs SET stored = -1 WHERE id = ?", [(jid,) for jid in bad])
            db.mark_decisions_stored([did for did, _ in decisions])
