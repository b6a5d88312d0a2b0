"""What each page computes, from the store: the audit's own functions (never a second copy of its SQL),
the before/after comparison, and the decision log. Every function takes a read-only connection."""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from headway.audit import audit_report
from headway.audit.before_after import before_after, submit_span
from headway.web.config import ServeConfig

RECENT_JOBS = 200  # jobs listed on a user's page, newest first


def summary(con: duckdb.DuckDBPyConnection, cfg: ServeConfig, top: int = 10) -> dict[str, Any]:
    """The audit of the whole store: what `headway audit --json --top N` prints for it."""
    return audit_report(
        con, top=top, gpu_hour_price=cfg.gpu_hour_price, include_cpu=cfg.include_cpu, source=cfg.source
    )


def user_page(con: duckdb.DuckDBPyConnection, cfg: ServeConfig, user: str) -> dict[str, Any] | None:
    """One user's audit (the same figures, scoped to them) and their newest jobs; None for no such user."""
    cond, params = ("AND source = ?", [cfg.source]) if cfg.source is not None else ("", [])
    rows = con.execute(
        "SELECT source, job_id, name, state, gpus, submit_time, start_time, end_time, runtime, wait, "
        f'gpu_hours FROM jobs_v WHERE "user" = ? {cond} ORDER BY submit_time DESC NULLS LAST, job_id LIMIT ?',
        [user, *params, RECENT_JOBS],
    ).fetchall()
    if not rows:
        return None
    report = audit_report(
        con,
        top=10,
        gpu_hour_price=cfg.gpu_hour_price,
        include_cpu=cfg.include_cpu,
        source=cfg.source,
        user=user,
    )
    keys = ("source", "job_id", "name", "state", "gpus", "submit_time", "start_time", "end_time")
    jobs = []
    for r in rows:
        d = dict(zip(keys, r[:8], strict=True))
        for k in ("submit_time", "start_time", "end_time"):
            d[k] = d[k].astimezone(dt.UTC).isoformat(timespec="seconds") if d[k] is not None else None
        d.update(runtime_s=r[8], wait_s=r[9], gpu_hours=r[10])
        jobs.append(d)
    return {"user": user, "report": report, "jobs": jobs}


def job_page(con: duckdb.DuckDBPyConnection, source: str, job_id: str) -> dict[str, Any] | None:
    from headway.decision_log import for_job

    cur = con.execute(
        'SELECT source, job_id, "user", name, state, gpus, submit_time, start_time, end_time, runtime, wait, '
        "gpu_hours, time_limit, exit_code FROM jobs_v WHERE source = ? AND job_id = ?",
        [source, job_id],
    )
    row = cur.fetchone()
    names = [d[0] for d in cur.description or ()]
    decisions = [_record_json(d) for d in for_job(con, source, job_id)]
    if row is None and not decisions:
        return None
    job = None
    if row is not None:
        job = dict(zip(names, row, strict=True))
        for k in ("submit_time", "start_time", "end_time"):
            if job[k] is not None:
                job[k] = job[k].astimezone(dt.UTC).isoformat(timespec="seconds")
    return {"source": source, "job_id": job_id, "job": job, "decisions": decisions}


def _record_json(rec: Any) -> dict[str, Any]:
    return {
        "id": rec.id,
        "at": rec.at.isoformat(timespec="seconds"),
        "source": rec.source,
        "adapter": rec.adapter,
        "policy": rec.policy,
        "ok": rec.ok,
        "applied": rec.applied,
        "duration_s": rec.duration_s,
        "error": rec.error,
        "pending": rec.pending,
        "started": list(rec.started),
        "written": [dict(w) for w in rec.written],
        "ranking": [dict(r) for r in rec.ranking],
        "running": [dict(r) for r in rec.running],
    }


def decisions(
    con: duckdb.DuckDBPyConnection, cfg: ServeConfig, limit: int = 100, before_id: int | None = None
) -> list[dict[str, Any]]:
    from headway.decision_log import passes

    return [_record_json(r) for r in passes(con, source=cfg.source, limit=limit, before_id=before_id)]


def decision(con: duckdb.DuckDBPyConnection, decision_id: int) -> dict[str, Any] | None:
    from headway.decision_log import get

    rec = get(con, decision_id)
    return None if rec is None else _record_json(rec)


def latest_slurm(con: duckdb.DuckDBPyConnection, cfg: ServeConfig) -> Any:
    from headway.decision_log import latest

    return latest(con, source=cfg.source, adapter="slurm")


def pass_stats(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    from headway.decision_log import pass_stats as stats

    return stats(con)


def default_compare_date(con: duckdb.DuckDBPyConnection, cfg: ServeConfig) -> tuple[dt.datetime | None, str]:
    """The first day headway's ranking was applied (the decision log), else the middle of the jobs' span."""
    from headway.decision_log import first_applied

    first = first_applied(con, policy=None)
    if first is not None:
        day = first.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return day, "the first day a headway pass was applied (decision log)"
    span = submit_span(con, cfg.source)
    if span is None:
        return None, "no jobs in the store"
    lo, hi = span
    mid = (lo + (hi - lo) / 2).replace(hour=0, minute=0, second=0, microsecond=0)
    return mid, "no applied headway pass in the decision log: the middle of the jobs' span"


def compare(
    con: duckdb.DuckDBPyConnection, cfg: ServeConfig, at: dt.datetime | None, days: float | None
) -> dict[str, Any]:
    why = "the date asked for"
    if at is None:
        at, why = default_compare_date(con, cfg)
    if at is None:
        return {
            "at": None,
            "chosen_because": why,
            "metrics": [],
            "notes": [why],
            "before": None,
            "after": None,
        }
    out = before_after(con, at, days=days, source=cfg.source, include_cpu=cfg.include_cpu)
    out["chosen_because"] = why
    return out
