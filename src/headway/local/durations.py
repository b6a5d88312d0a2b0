"""Time limits as people write them (`2h`, `90m`, `1-12:00:00`) and elapsed times as Slurm shows them."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SUFFIXED = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_duration(text: str) -> float:
    """Seconds. Accepts `30s`, `90m`, `2h`, `1d`, `MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`, or a bare number of
    minutes (Slurm's --time convention). Raises ValueError with the accepted forms."""
    t = text.strip().lower()
    m = _SUFFIXED.match(t)
    if m:
        value = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        try:
            days = 0
            if "-" in t:
                d, t = t.split("-", 1)
                days = int(d)
            parts = [int(p) for p in t.split(":")]
            if len(parts) == 1:
                secs = parts[0] * 60 if days == 0 else parts[0] * 3600
            elif len(parts) == 2:
                secs = parts[0] * 60 + parts[1] if days == 0 else parts[0] * 3600 + parts[1] * 60
            elif len(parts) == 3:
                secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
            else:
                raise ValueError
            if any(p < 0 for p in parts) or days < 0 or any(p > 59 for p in parts[1:]):
                raise ValueError  # `1:99` is no time (the first field may run over: 90:00 is 90 minutes)
            value = float(days * 86400 + secs)
        except ValueError:
            raise ValueError(
                f"time {text!r}: use e.g. 30s, 90m, 2h, 1d, HH:MM:SS, D-HH:MM:SS, or minutes"
            ) from None
    if value <= 0:
        raise ValueError(f"time {text!r}: must be more than zero")
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
