"""Time limits as people write them (`2h`, `90m`, `1-12:00:00`) and elapsed times as Slurm shows them."""

from __future__ import annotations

import re

from headway.local.protocol import MAX_TIME_LIMIT_S

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SUFFIXED = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


_CLOCK = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_clock_seconds(text: str) -> float:
    """Seconds from Slurm's time formats: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`.
    The first field may run over (`90:00` is 90 minutes) unless a day count leads; every later field is in
    range (hours 0-23, minutes and seconds 0-59): `1-25:99:00` or `5:99` is no time, where adding the
    fields up read them as 182340 s and 399 s. Raises ValueError saying which field is out of range."""
    m = _CLOCK.match(text.strip())
    if not m:
        raise ValueError(f"time {text!r}: not [D-]HH:MM:SS, MM:SS or minutes")
    d, a, b, c = m.groups()
    fields = [int(x) for x in (a, b, c) if x is not None]
    if d is None:  # MM, MM:SS, HH:MM:SS
        names = {1: ("minutes",), 2: ("minutes", "seconds"), 3: ("hours", "minutes", "seconds")}[len(fields)]
        scale = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(fields)]
        first = 1  # the leading field runs over
    else:  # D-HH, D-HH:MM, D-HH:MM:SS
        names = ("hours", "minutes", "seconds")[: len(fields)]
        scale = (3600, 60, 1)[: len(fields)]
        first = 0
    for name, v in list(zip(names, fields, strict=True))[first:]:
        if v > (23 if name == "hours" else 59):
            raise ValueError(f"time {text!r}: {name} {v} out of range (0-{23 if name == 'hours' else 59})")
    return float(int(d or 0) * 86400 + sum(v * k for v, k in zip(fields, scale, strict=True)))


MAX_TEXT = 32  # characters of a time limit; a 400-digit one is a typo (or worse), not a time


def parse_duration(text: str) -> float:
    """Seconds, more than 0 and at most a year (`MAX_TIME_LIMIT_S`). Accepts `30s`, `90m`, `2h`, `1d`,
    `MM:SS`, `HH:MM:SS`, `D-HH[:MM[:SS]]`, or a bare number of minutes (Slurm's --time convention).
    Raises ValueError in one line: which field is out of range (`25:99`), that it is over a year
    (`999...9s` was infinity and poisoned the job store), or the accepted forms."""
    t = text.strip().lower()
    shown = text if len(text) <= MAX_TEXT else text[:20] + f"... ({len(text):,} characters)"
    forms = "use e.g. 30s, 90m, 2h, 1d, HH:MM:SS, D-HH:MM:SS, or minutes"
    if len(t) > MAX_TEXT:
        raise ValueError(f"time {shown!r}: too long; {forms}, at most a year")
    m = _SUFFIXED.match(t)
    if m:
        value = float(m.group(1)) * _UNITS[m.group(2)]
    elif _CLOCK.match(t):
        value = slurm_clock_seconds(t)  # its ValueError names the field out of range
    else:
        raise ValueError(f"time {shown!r}: {forms}")
    if value <= 0:
        raise ValueError(f"time {shown!r}: must be more than zero")
    if not value <= MAX_TIME_LIMIT_S:
        days = MAX_TIME_LIMIT_S / 86400
        raise ValueError(f"time {shown!r}: more than a year ({days:.0f} days), the longest time limit")
    return value


def format_elapsed(seconds: float | None) -> str:
    """Slurm's TIME column: M:SS, H:MM:SS, D-HH:MM:SS."""
    if seconds is None:
        return "0:00"
    s = max(int(seconds), 0)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"
