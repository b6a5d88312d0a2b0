"""`headway demo` (being built)."""

from __future__ import annotations

from headway.console import fail


def demo() -> None:
    """Not built yet."""
    fail("not built yet")
