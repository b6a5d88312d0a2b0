"""Shared fixtures: the real traces (skip cleanly without ../shared) and a fresh job store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(os.environ.get("HEADWAY_SHARED_TRACES", REPO.parent / "shared" / "traces"))


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """../shared/traces (real public traces); tests that need it skip when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture
def tmp_db(tmp_path: Path) -> Path:
    return tmp_path / "jobs.duckdb"
