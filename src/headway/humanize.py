"""Figures as people say them, shared by every part that prints one (the audit, the Slurm adapter):
pure functions with no imports, so an adapter can use them without depending on another part."""

from __future__ import annotations


def dur(seconds: float | None) -> str:
    """A duration as people say it: 45 s, 12 min, 3.4 h, 2.1 d."""
    if seconds is None:
        return "–"
    s = float(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s < 60:
        return f"{sign}{s:.0f} s"
    if s < 3600:
        return f"{sign}{s / 60:.0f} min"
    if s < 86400 * 2:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"
