"""`headway simulate`, `sweep`, `synth` (being built)."""

from __future__ import annotations

from headway.console import fail


def simulate() -> None:
    """Not built yet."""
    fail("not built yet")


def sweep() -> None:
    """Not built yet."""
    fail("not built yet")


def synth() -> None:
    """Not built yet."""
    fail("not built yet")
