"""Time windows for the audit: dates, relative offsets (``30d``, ``-14d``) and ``A..B`` periods.

Relative offsets count back from an *anchor*, the newest submit time in the store, not from the wall
clock: an old trace then audits the same way as a live cluster (whose newest job is about now). This
module is pure; the caller finds the anchor.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

_REL = re.compile(r"^\s*-?(\d+(?:\.\d+)?)\s*(h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


class PeriodError(ValueError):
    """A time or period the user typed that cannot be read; str() is the one-line message."""


@dataclass(frozen=True, slots=True)
class Window:
    """Half-open window on submit time: since <= submit_time < until (None = open end)."""

    since: dt.datetime | None = None
    until: dt.datetime | None = None

    def to_json(self) -> dict[str, str | None]:
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }

    def overlap(self, other: Window) -> Window | None:
        """The window both cover, or None when they share no instant."""
        starts = [t for t in (self.since, other.since) if t is not None]
        ends = [t for t in (self.until, other.until) if t is not None]
        since = max(starts) if starts else None
        until = min(ends) if ends else None
        if since is not None and until is not None and since >= until:
            return None
        return Window(since, until)

    def label(self) -> str:
        def fmt(t: dt.datetime | None) -> str:
            if t is None:
                return "…"
            if t.hour == t.minute == t.second == 0:
                return t.strftime("%Y-%m-%d")
            return t.strftime("%Y-%m-%d %H:%M")

        return f"{fmt(self.since)} .. {fmt(self.until)}"


def is_relative(text: str) -> bool:
    return bool(_REL.match(text))


def parse_time(text: str, *, anchor: dt.datetime | None, end: bool = False) -> dt.datetime:
    """One bound: ``2026-01-31``, ``2026-01-31T12:00``, or ``30d``/``-30d``/``12h``/``2w`` before the anchor.

    A bare date used as an end bound means the end of that day, so ``--until 2026-01-31`` includes the 31st.
    """
    s = text.strip()
    m = _REL.match(s)
    if m:
        if anchor is None:
            raise PeriodError(f"{text!r}: a relative time needs jobs in the store to count back from")
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
        return anchor - dt.timedelta(seconds=seconds)
    try:
        if len(s) == 10:
            day = dt.date.fromisoformat(s)
            t = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
            return t + dt.timedelta(days=1) if end else t
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        raise PeriodError(
            f"{text!r}: expected a date (2026-01-31), a time (2026-01-31T12:00) "
            "or a relative time (30d, 12h, 2w)"
        ) from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def parse_window(since: str | None, until: str | None, *, anchor: dt.datetime | None) -> Window:
    lo = parse_time(since, anchor=anchor) if since else None
    hi = parse_time(until, anchor=anchor, end=True) if until else None
    if lo is not None and hi is not None and hi <= lo:
        # Name the bounds as typed (a bare end date stands for the end of its day, not the next midnight).
        shown = (since or "").strip(), (until or "").strip()
        raise PeriodError(
            f"empty window: {shown[0]} ({lo.isoformat()}) is not before the end of {shown[1]} "
            f"({hi.isoformat()})"
            if len(shown[1]) == 10 and not is_relative(shown[1])
            else f"empty window: {shown[0]} ({lo.isoformat()}) is not before {shown[1]} ({hi.isoformat()})"
        )
    return Window(lo, hi)


def parse_period(text: str, *, anchor: dt.datetime | None) -> Window:
    """``A..B`` with either end optional (``..B``, ``A..``); each end as in `parse_time`."""
    if ".." not in text:
        raise PeriodError(f"{text!r}: expected a period A..B (e.g. 2026-01-01..2026-01-31, -14d..-7d, -7d..)")
    a, b = text.split("..", 1)
    return parse_window(a or None, b or None, anchor=anchor)
