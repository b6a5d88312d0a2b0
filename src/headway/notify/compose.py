"""A user's facts as one message (subject and plain-text body), and the fingerprint that dedups it.

The fingerprint hashes the facts that matter (which streaks, how long, which jobs are held, which limits to
lower, whether waits are long and why), never the wording or the dates of the run: the same facts sent
tomorrow give the same fingerprint, and `sent.py` then sends nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import textwrap
from dataclasses import dataclass
from typing import Any

from headway.audit.compute import OVER_ASK_SHARE, REPEAT_MIN
from headway.audit.periods import Window
from headway.console import count, printable
from headway.humanize import dur
from headway.notify.facts import HOLD_AFTER, LIMIT_HEADROOM, LongWait, OverAsk, UserFacts

SIGNATURE = "headway notify"
BODY_WIDTH = 76


@dataclass(frozen=True, slots=True)
class Message:
    """One user's message: `to` is None when no address is known for them."""

    user: str
    to: str | None
    subject: str
    body: str
    facts: UserFacts
    fingerprint: str

    def to_json(self, already_sent: bool) -> dict[str, Any]:
        """The `--json` form (docs/notify.md)."""
        return {
            "user": self.user,
            "to": self.to,
            "subject": self.subject,
            "body": self.body,
            "facts": dataclasses.asdict(self.facts),
            "fingerprint": self.fingerprint,
            "already_sent": already_sent,
        }

    @property
    def text(self) -> str:
        """Subject and body as one text (what a webhook posts)."""
        return f"{self.subject}\n\n{self.body}"


def fingerprint(f: UserFacts) -> str:
    """A hash of what the facts say, not how or when they are said (16 hex digits)."""
    core = {
        "user": f.user,
        "repeat_failures": sorted(
            [
                r.key,
                r.name or "",
                r.group or "",
                r.first or "",
                r.failures,
                round(r.gpu_hours, 1),
                r.still_failing,
            ]
            for r in f.repeat_failures
        ),
        "held_jobs": sorted([h.source, h.job_id, h.streak] for h in f.held_jobs),
        "over_asks": sorted(
            [o.name or "", o.completed_jobs, o.over_asking_jobs, o.suggested_limit_s or 0.0]
            for o in f.over_asks
        ),
        # The exact waits move with every job that starts; whether they are long, and why, is the fact.
        "long_wait": None if f.long_wait is None else [f.long_wait.reason or "", f.long_wait.size or ""],
    }
    text = json.dumps(core, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _when(iso: str | None) -> str:
    if not iso:
        return "?"
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M")


def _limit(seconds: float) -> str:
    """A time limit as people say it and as sbatch takes it: `2 h 15 min (--time=2:15:00)`."""
    total = round(seconds)
    h, m = divmod(total // 60, 60)
    words = " ".join(p for p in (f"{h} h" if h else "", f"{m} min" if m else "") if p) or "0 min"
    return f"{words} (--time={h}:{m:02d}:00)"


def window_words(window: Window) -> str:
    if window.since is None and window.until is None:
        return "all your GPU jobs in the store"
    since = f" since {window.since:%Y-%m-%d %H:%M} UTC" if window.since else ""
    until = f" before {window.until:%Y-%m-%d %H:%M} UTC" if window.until else ""
    return f"your GPU jobs submitted{since}{until}"


def subject_of(f: UserFacts) -> str:
    parts = []
    if f.repeat_failures:
        gh = math.fsum(r.gpu_hours for r in f.repeat_failures)
        shown = f"{gh:,.1f}" if gh < 10 else f"{gh:,.0f}"
        parts.append(f"{count(len(f.repeat_failures), 'failure streak')} ({shown} GPU-hours)")
    if f.held_jobs:
        parts.append(count(len(f.held_jobs), "held job"))
    if f.over_asks:
        parts.append(f"{count(len(f.over_asks), 'time limit')} to lower")
    if f.long_wait:
        parts.append("long waits")
    return printable("headway: " + ", ".join(parts))


def _over_ask_line(o: OverAsk) -> str:
    name = f"job {o.name}" if o.name else "jobs without a name"
    line = (
        f"  - {name}: {o.over_asking_jobs} of {o.completed_jobs} successful jobs used under "
        f"{OVER_ASK_SHARE:.0%} of their limit (median {o.median_used_share:.0%} of {dur(o.median_limit_s)})"
    )
    if o.suggested_limit_s is not None:
        line += (
            f"; a limit of {_limit(o.suggested_limit_s)} covers 95% of them "
            f"with {LIMIT_HEADROOM - 1:.0%} to spare"
        )
    return line


def _wait_lines(w: LongWait) -> list[str]:
    lines = [
        f"  - your median wait was {dur(w.median_s)} (p90 {dur(w.p90_s)}) "
        f"over {count(w.jobs, 'started job')}; "
        f"the cluster's is {dur(w.cluster_median_s)} (p90 {dur(w.cluster_p90_s)})."
    ]
    if w.reason == "size":
        lines.append(
            f"  - most of your jobs ask for {w.size} GPUs, and jobs of that size wait longer for everyone: "
            f"a median {dur(w.size_cluster_median_s)} against {dur(w.cluster_median_s)} for all jobs."
        )
    elif w.reason == "not_size":
        lines.append(
            f"  - most of your jobs ask for {w.size} GPUs; everyone's jobs of that size waited a median "
            f"{dur(w.size_cluster_median_s)}, so their size does not explain your waits."
        )
    return lines


def _wrap(line: str) -> str:
    """At BODY_WIDTH columns, a bullet's later lines under its text (mail readers show a body as is)."""
    if len(line) <= BODY_WIDTH:
        return line
    indent = "    " if line.startswith("  - ") else "  " if line.startswith("  ") else ""
    return textwrap.fill(line, BODY_WIDTH, subsequent_indent=indent, break_long_words=False)


def body_of(f: UserFacts, window: Window) -> str:
    out = [f"Hello {f.user},", "", f"headway looked at {window_words(window)}. Here is what you can act on."]
    if f.repeat_failures:
        gh = math.fsum(r.gpu_hours for r in f.repeat_failures)
        out += ["", f"Failing again and again ({REPEAT_MIN}+ failures in a row, {gh:,.1f} GPU-hours in all):"]
        for r in f.repeat_failures:
            end = "still failing" if r.still_failing else "a success came after"
            out.append(
                f"  - {r.label}: {r.failures} failures in a row ({', '.join(r.states)}), {r.gpu_hours:,.1f} "
                f"GPU-hours, {_when(r.first)} to {_when(r.last)} UTC; {end}"
            )
        out.append("  Read the first failure's log before submitting again: the same error tends to repeat.")
    if f.held_jobs:
        out += ["", f"Held by the repeat-failure hold ({HOLD_AFTER}+ failures in a row, no success since):"]
        for h in f.held_jobs:
            what = h.name or h.group or "(no name)"
            out.append(f"  - job {h.job_id} ({what}): {h.streak} failures in a row")
        out.append(
            "  They run only when nothing else wants the GPUs; one success of that job lifts the hold."
        )
    if f.over_asks:
        out += ["", "Time limits far above use:"]
        out += [_over_ask_line(o) for o in f.over_asks]
        out.append("  A limit near what a job needs lets the scheduler start it sooner, in gaps (backfill).")
    if f.long_wait:
        out += ["", "Waiting:"]
        out += _wait_lines(f.long_wait)
    out += ["", "-- ", f"{SIGNATURE}: sent once for these facts; you hear again only when they change."]
    return "\n".join(_wrap(printable(line)) for line in out)


def compose(f: UserFacts, to: str | None, window: Window) -> Message:
    return Message(f.user, to, subject_of(f), body_of(f, window), f, fingerprint(f))
