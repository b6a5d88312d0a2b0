"""What several verbs share: finding a job the caller may act on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headway.local.protocol import RequestError
from headway.local.server import Caller

if TYPE_CHECKING:
    from headway.local.daemon import Daemon


def owned(d: Daemon, caller: Caller, job_id: int, verb: str) -> dict[str, Any]:
    """The job's row, if the caller owns it or is root (raises RequestError saying whose it is)."""
    row = d._db().row(job_id)
    if row is None:
        raise RequestError(f"no job {job_id}")
    if not caller.is_root and row["uid"] != caller.uid:
        raise RequestError(f"job {job_id} belongs to {row['user']}; you may only {verb} your own jobs")
    return dict(row)
