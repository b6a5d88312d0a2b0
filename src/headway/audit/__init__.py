"""The waste audit: compute (DuckDB SQL -> one dict), then render it in the terminal or as offline HTML.

Use: `report = audit_report(con)`, `render_terminal(report, console)`, `write_html(report, path)`.
"""

from __future__ import annotations

from headway.audit.compute import BY_CHOICES, DEFAULT_PRICE, anchor_time, audit_report, compare, configure
from headway.audit.html import render_html, write_html
from headway.audit.periods import PeriodError, Window, parse_period, parse_time, parse_window
from headway.audit.render import render_terminal

__all__ = [
    "BY_CHOICES",
    "DEFAULT_PRICE",
    "PeriodError",
    "Window",
    "anchor_time",
    "audit_report",
    "compare",
    "configure",
    "parse_period",
    "parse_time",
    "parse_window",
    "render_html",
    "render_terminal",
    "write_html",
]
