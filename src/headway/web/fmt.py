"""Jinja2 filters: the terminal report's own formatting (hours, shares, durations, dollars)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headway.audit.render import dur, gh, pct, usd


def _dur(v: Any) -> str:
    return "–" if v is None else dur(float(v))


def _num(v: Any) -> str:
    if v is None:
        return "–"
    return f"{v:,}" if isinstance(v, int) else f"{float(v):,.3g}"


FILTERS: dict[str, Callable[[Any], str]] = {
    "gh": lambda v: "–" if v is None else gh(float(v)),
    "pct": lambda v: "–" if v is None else pct(float(v)),
    "dur": _dur,
    "usd": lambda v: "–" if v is None else usd(float(v)),
    "num": _num,
}
