"""The web face of headway: pages and a JSON API over the job store and the live adapters, and /metrics.

`create_app(ServeConfig(...))` builds the FastAPI app that `headway serve` runs on uvicorn. The service
only reads: the store is opened read-only for each refresh and closed at once (DuckDB lets one process
write or many read, never both, so a reader that kept it open would lock the daemon's and `slurm sync`'s
writes out), the local queue is asked over its socket with read-only verbs, and Slurm is never called.
"""

from __future__ import annotations

from headway.web.app import create_app
from headway.web.config import ServeConfig

__all__ = ["ServeConfig", "create_app"]
