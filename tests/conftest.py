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


@pytest.fixture(scope="session", autouse=True)
def _private_run_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Root daemons the tests start register a shared queue under HEADWAY_RUN_DIR (/run/headway by
    default): keep that registration, and the GPU locks beside it, inside the test run."""
    if "HEADWAY_RUN_DIR" not in os.environ:
        os.environ["HEADWAY_RUN_DIR"] = str(tmp_path_factory.mktemp("run"))
