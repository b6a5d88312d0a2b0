"""`headway audit` (being built)."""

from __future__ import annotations

from headway.console import fail


def audit() -> None:
    """Not built yet."""
    fail("not built yet")
