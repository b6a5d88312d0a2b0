"""The audit's numbers, computed in DuckDB SQL over the store's `jobs_v` view.

`audit_report` returns one JSON-ready dict (schema: docs/audit-json.md) that the terminal renderer, the
HTML report and `headway demo` all read, so every view of the audit shows the same figures. Outcome classes
and metrics are those of DESIGN.md ("Metrics"); the SQL CASE is generated from `schema.OUTCOME_OF`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from headway.audit.periods import Window
from headway.schema import OUTCOME_OF, Outcome, State

BY_CHOICES: tuple[str, ...] = ("user", "group", "name", "partition", "gpus")
DEFAULT_PRICE = 2.0  # USD per GPU-hour: a rough cloud price; --gpu-hour-price sets a site's own
EARLY_MINUTES: tuple[int, ...] = (5, 15, 60)
CDF_MINUTES: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 240, 480, 720, 1440, 2880, 5760, 10080)
OVER_ASK_SHARE = 0.25  # a job that used less than this share of its time limit over-asked
SHORT_JOB_S = 3600.0
SIZE_BUCKETS: tuple[str, ...] = ("cpu", "<1", "1", "2-4", "5-8", "9-32", "33+")
REPEAT_MIN = 3
SCHEMA_VERSION = 1

Progress = Callable[[str], None]

_OUTCOME_SQL = (
    "CASE state "
    + " ".join(f"WHEN '{s.value}' THEN '{o.value}'" for s, o in OUTCOME_OF.items())
    + f" ELSE '{Outcome.UNFINISHED.value}' END"
)
_SIZE_SQL = (
    "CASE WHEN gpus <= 0 THEN 'cpu' WHEN gpus < 1 THEN '<1' WHEN gpus = 1 THEN '1' WHEN gpus <= 4 THEN '2-4' "
    "WHEN gpus <= 8 THEN '5-8' WHEN gpus <= 32 THEN '9-32' ELSE '33+' END"
)
_ENDED = "outcome <> 'unfinished'"


def configure(
    con: duckdb.DuckDBPyConnection, *, memory_limit: str = "2GB", threads: int | None = None
) -> None:
    """Bound DuckDB's memory and threads so an audit of a big store keeps a predictable footprint."""
    import os
    import tempfile

    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET threads = {int(threads or min(os.cpu_count() or 1, 8))}")
    con.execute("SET preserve_insertion_order = false")
    tmp = os.path.join(tempfile.gettempdir(), "headway-duckdb")
    os.makedirs(tmp, exist_ok=True)
    con.execute(f"SET temp_directory = '{tmp}'")


def anchor_time(con: duckdb.DuckDBPyConnection) -> dt.datetime | None:
    """The newest submit time in the store: what relative times (30d, -14d) count back from."""
    row = con.execute("SELECT max(submit_time) FROM jobs_v").fetchone()
    return _utc(row[0]) if row else None


def _utc(t: Any) -> dt.datetime | None:
    if t is None:
        return None
    assert isinstance(t, dt.datetime)
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def _iso(t: Any) -> str | None:
    u = _utc(t)
    return u.isoformat() if u else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return float(a) / float(b)


def _f(x: Any) -> float:
    return 0.0 if x is None else float(x)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


class _Q:
    """Runs section queries over one window: `w` = jobs submitted in it, `a` = the audited scope of `w`."""

    def __init__(self, con: duckdb.DuckDBPyConnection, window: Window, include_cpu: bool) -> None:
        self.con = con
        conds = []
        self.params: dict[str, object] = {}
        if window.since is not None:
            conds.append("submit_time >= $since")
            self.params["since"] = window.since
        if window.until is not None:
            conds.append("submit_time < $until")
            self.params["until"] = window.until
        where = " WHERE " + " AND ".join(conds) if conds else ""
        scope = "" if include_cpu else " WHERE gpus > 0"
        self.prefix = (
            f"WITH w AS (SELECT * REPLACE (coalesce(gpus, 0) AS gpus), {_OUTCOME_SQL} AS outcome "
            f"FROM jobs_v{where}), a AS (SELECT * FROM w{scope}) "
        )

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.con.execute(self.prefix + sql, self.params).fetchall()

    def one(self, sql: str) -> tuple[Any, ...]:
        r = self.rows(sql)
        return r[0]


def _totals(q: _Q, price: float) -> dict[str, Any]:
    jobs, gpu_jobs, gh, first, last, users = q.one(
        "SELECT count(*), count(*) FILTER (gpus > 0), sum(gpu_hours), min(submit_time), max(submit_time), "
        'count(DISTINCT "user") FROM w'
    )
    states = q.rows("SELECT state, count(*), sum(gpu_hours) FROM a GROUP BY state ORDER BY count(*) DESC")
    scope_jobs = sum(int(n) for _, n, _ in states)
    scope_gh = sum(_f(h) for _, _, h in states)
    by_state = {
        str(s): {
            "jobs": int(n),
            "gpu_hours": _f(h),
            "share_jobs": _ratio(n, scope_jobs),
            "share_gpu_hours": _ratio(_f(h), scope_gh),
        }
        for s, n, h in states
    }
    by_outcome: dict[str, dict[str, Any]] = {o.value: {"jobs": 0, "gpu_hours": 0.0} for o in Outcome}
    for s, n, h in states:
        try:
            o = OUTCOME_OF[State(s)]
        except ValueError:
            o = Outcome.UNFINISHED
        by_outcome[o.value]["jobs"] += int(n)
        by_outcome[o.value]["gpu_hours"] += _f(h)
    for v in by_outcome.values():
        v["share_jobs"] = _ratio(v["jobs"], scope_jobs)
        v["share_gpu_hours"] = _ratio(v["gpu_hours"], scope_gh)
    ended = [v for k, v in by_outcome.items() if k != Outcome.UNFINISHED.value]
    ended_jobs = sum(v["jobs"] for v in ended)
    ended_gh = sum(v["gpu_hours"] for v in ended)
    succ = by_outcome[Outcome.SUCCESS.value]
    waste = by_outcome[Outcome.WASTE.value]
    return {
        "totals": {
            "jobs": int(jobs),
            "gpu_jobs": int(gpu_jobs),
            "cpu_jobs": int(jobs) - int(gpu_jobs),
            "gpu_hours": _f(gh),
            "audited_jobs": scope_jobs,
            "ended_jobs": ended_jobs,
            "ended_gpu_hours": ended_gh,
            "users": int(users),
            "first_submit": _iso(first),
            "last_submit": _iso(last),
        },
        "by_state": by_state,
        "by_outcome": by_outcome,
        "completion_rate": {
            "by_count": _ratio(succ["jobs"], ended_jobs),
            "by_gpu_hours": _ratio(succ["gpu_hours"], ended_gh),
        },
        "goodput_gpu_hours": succ["gpu_hours"],
        "wasted_gpu_hours": waste["gpu_hours"],
        "wasted_cost": {"usd": waste["gpu_hours"] * price, "usd_per_gpu_hour": price},
    }


def _group_rows(q: _Q, key_sql: str, top: int) -> list[dict[str, Any]]:
    rows = q.rows(
        f"SELECT coalesce(CAST({key_sql} AS VARCHAR), '(none)') AS k, count(*), sum(gpu_hours), "
        "coalesce(sum(gpu_hours) FILTER (outcome = 'waste'), 0) AS wasted, "
        "count(*) FILTER (outcome = 'success'), count(*) FILTER (outcome <> 'unfinished'), "
        "coalesce(sum(gpu_hours) FILTER (outcome = 'success'), 0), "
        "coalesce(sum(gpu_hours) FILTER (outcome <> 'unfinished'), 0), count(*) FILTER (outcome = 'waste') "
        f"FROM a GROUP BY k ORDER BY wasted DESC, count(*) DESC, k LIMIT {int(top)}"
    )
    return [
        {
            "key": k,
            "jobs": int(n),
            "gpu_hours": _f(gh),
            "wasted_gpu_hours": _f(wasted),
            "failed_jobs": int(nw),
            "completion_rate": {"by_count": _ratio(ns, ne), "by_gpu_hours": _ratio(_f(gs), _f(ge))},
        }
        for k, n, gh, wasted, ns, ne, gs, ge, nw in rows
    ]


def _top(q: _Q, by: str, top: int) -> dict[str, Any]:
    keys = {
        "user": '"user"',
        "group": '"group"',
        "name": "name",
        "partition": "partition",
        "gpus": "CASE WHEN gpus = floor(gpus) THEN CAST(CAST(gpus AS BIGINT) AS VARCHAR) "
        "ELSE CAST(round(gpus, 3) AS VARCHAR) END",
    }
    out: dict[str, Any] = {"by": by, "n": top}
    for dim in BY_CHOICES:
        out[dim] = _group_rows(q, keys[dim], top)
    return out


def _repeat_failures(q: _Q, top: int, min_run: int) -> dict[str, Any]:
    """Gaps and islands: runs of >= min_run consecutive waste-class jobs of one user+name (or user+group).

    Only successes and waste-class jobs form the sequence (a cancelled job neither extends nor breaks a
    streak); jobs are ordered by end time (else start, else submit).
    """
    streak_cte = (
        ', seq AS (SELECT "user" AS u, coalesce(name, "group") AS k, name IS NULL AS by_group, outcome, '
        "state, gpu_hours, coalesce(end_time, start_time, submit_time) AS t, job_id FROM a "
        "WHERE outcome IN ('success', 'waste') AND \"user\" IS NOT NULL "
        'AND coalesce(name, "group") IS NOT NULL), '
        "num AS (SELECT *, row_number() OVER (PARTITION BY u, by_group, k ORDER BY t, job_id) AS rn "
        "FROM seq), "
        "isl AS (SELECT *, rn - row_number() OVER (PARTITION BY u, by_group, k, outcome ORDER BY t, job_id) "
        "AS grp FROM num), "
        "last_ok AS (SELECT u, by_group, k, max(rn) AS ok_rn FROM num WHERE outcome = 'success' "
        "GROUP BY ALL), "
        "streaks AS (SELECT isl.u, isl.by_group, isl.k, grp, count(*) AS n, sum(gpu_hours) AS gh, "
        "min(t) AS first_t, max(t) AS last_t, max(rn) AS last_rn, string_agg(DISTINCT state, ',' "
        "ORDER BY state) AS states FROM isl WHERE outcome = 'waste' GROUP BY ALL "
        f"HAVING count(*) >= {int(min_run)}), "
        "s AS (SELECT streaks.*, coalesce(last_ok.ok_rn > last_rn, false) AS success_followed FROM streaks "
        "LEFT JOIN last_ok USING (u, by_group, k)) "
    )
    summary = q.one(
        streak_cte + "SELECT count(*), coalesce(sum(n), 0), coalesce(sum(gh), 0), "
        "count(*) FILTER (NOT success_followed), coalesce(sum(gh) FILTER (NOT success_followed), 0) FROM s"
    )
    rows = q.rows(
        streak_cte + "SELECT u, k, by_group, n, gh, first_t, last_t, success_followed, states FROM s "
        f"ORDER BY gh DESC, n DESC, u, k LIMIT {int(top)}"
    )
    wasted = q.one("SELECT coalesce(sum(gpu_hours), 0) FROM a WHERE outcome = 'waste'")[0]
    n, jobs, gh, unresolved, unresolved_gh = summary
    return {
        "min_run": min_run,
        "streaks": int(n),
        "jobs": int(jobs),
        "gpu_hours": _f(gh),
        "share_of_wasted_gpu_hours": _ratio(_f(gh), _f(wasted)),
        "unresolved_streaks": int(unresolved),
        "unresolved_gpu_hours": _f(unresolved_gh),
        "rows": [
            {
                "user": u,
                "name": None if by_group else k,
                "group": k if by_group else None,
                "key": "user+group" if by_group else "user+name",
                "failures": int(nn),
                "gpu_hours": _f(g),
                "first": _iso(first),
                "last": _iso(last),
                "success_followed": bool(ok),
                "states": str(states).split(","),
            }
            for u, k, by_group, nn, g, first, last, ok, states in rows
        ],
    }


def _early_failures(q: _Q) -> dict[str, Any]:
    within = ", ".join(
        f"count(*) FILTER (runtime <= {m * 60}), coalesce(sum(gpu_hours) FILTER (runtime <= {m * 60}), 0)"
        for m in EARLY_MINUTES
    )
    r = q.one(
        f"SELECT count(*), coalesce(sum(gpu_hours), 0), {within} FROM a "
        "WHERE outcome = 'waste' AND runtime IS NOT NULL"
    )
    n, gh = int(r[0]), _f(r[1])
    early = []
    for i, m in enumerate(EARLY_MINUTES):
        nj, g = int(r[2 + 2 * i]), _f(r[3 + 2 * i])
        early.append(
            {
                "minutes": m,
                "jobs": nj,
                "gpu_hours": g,
                "share_jobs": _ratio(nj, n),
                "share_gpu_hours": _ratio(g, gh),
            }
        )
    cdf_cols = ", ".join(f"count(*) FILTER (runtime <= {m * 60})" for m in CDF_MINUTES)
    per = q.rows(
        f"SELECT outcome, count(*), quantile_cont(runtime, 0.5), {cdf_cols} FROM a "
        "WHERE outcome IN ('waste', 'success') AND runtime IS NOT NULL GROUP BY outcome"
    )
    by = {str(row[0]): row for row in per}

    def cdf(outcome: str) -> list[float | None]:
        row = by.get(outcome)
        if row is None:
            return [None for _ in CDF_MINUTES]
        return [_ratio(int(c), int(row[1])) for c in row[3:]]

    return {
        "failed_jobs": n,
        "failed_gpu_hours": gh,
        "within": early,
        "median_runtime_s": {
            "waste": _opt(by["waste"][2]) if "waste" in by else None,
            "success": _opt(by["success"][2]) if "success" in by else None,
        },
        "cdf": {"minutes": list(CDF_MINUTES), "waste": cdf("waste"), "success": cdf("success")},
    }


def _fmt_hours(seconds: float) -> str:
    h = seconds / 3600.0
    if h < 1:
        return f"{max(round(seconds / 60.0), 1):.0f} min"
    return f"{h:.1f} h" if h < 10 else f"{h:.0f} h"


def _timeouts(q: _Q, top: int) -> dict[str, Any]:
    n, gh, with_limit = q.one(
        "SELECT count(*) FILTER (state = 'TIMEOUT'), coalesce(sum(gpu_hours) FILTER (state = 'TIMEOUT'), 0), "
        "count(*) FILTER (time_limit > 0) FROM a"
    )
    wasted = q.one("SELECT coalesce(sum(gpu_hours), 0) FROM a WHERE outcome = 'waste'")[0]
    by_user = q.rows(
        "SELECT coalesce(\"user\", '(none)') AS u, count(*), sum(gpu_hours) FROM a WHERE state = 'TIMEOUT' "
        f"GROUP BY u ORDER BY sum(gpu_hours) DESC, count(*) DESC, u LIMIT {int(top)}"
    )
    out: dict[str, Any] = {
        "jobs": int(n),
        "gpu_hours": _f(gh),
        "share_of_wasted_gpu_hours": _ratio(_f(gh), _f(wasted)),
        "by_user": [{"user": u, "jobs": int(c), "gpu_hours": _f(g)} for u, c, g in by_user],
        "time_limits_known": int(with_limit) > 0,
        "jobs_with_time_limit": int(with_limit),
        "over_asking": None,
    }
    if not with_limit:
        return out
    done = "FROM a WHERE outcome = 'success' AND time_limit > 0 AND runtime IS NOT NULL"
    used = "greatest(runtime, 0) / time_limit"
    jobs, over, med, unused = q.one(
        f"SELECT count(*), count(*) FILTER ({used} < {OVER_ASK_SHARE}), quantile_cont({used}, 0.5), "
        f"coalesce(sum(gpus * greatest(time_limit - greatest(runtime, 0), 0) / 3600.0), 0) {done}"
    )
    users = q.rows(
        f"SELECT coalesce(\"user\", '(none)') AS u, count(*), "
        f"count(*) FILTER ({used} < {OVER_ASK_SHARE}) AS o, quantile_cont({used}, 0.5), "
        "quantile_cont(time_limit, 0.5), quantile_cont(greatest(runtime, 0), 0.95) "
        f"{done} GROUP BY u HAVING o > 0 ORDER BY o DESC, u LIMIT {int(top)}"
    )
    advice = []
    for u, c, o, m, lim, p95 in users:
        m_f, lim_f, p95_f = _f(m), _f(lim), _f(p95)
        suggest = max(p95_f * 1.2, 300.0)
        advice.append(
            {
                "user": u,
                "jobs": int(c),
                "over_asking_jobs": int(o),
                "median_used_share": m_f,
                "median_time_limit_s": lim_f,
                "p95_runtime_s": p95_f,
                "advice": (
                    f"your jobs use a median {m_f * 100:.0f}% of the time you request "
                    f"(median limit {_fmt_hours(lim_f)}); a limit near {_fmt_hours(suggest)} "
                    "would still cover 95% of them and lets the scheduler backfill them sooner"
                ),
            }
        )
    out["over_asking"] = {
        "threshold_share": OVER_ASK_SHARE,
        "completed_jobs_with_limit": int(jobs),
        "jobs": int(over),
        "share_jobs": _ratio(int(over), int(jobs)),
        "median_used_share": _opt(med),
        "unused_reserved_gpu_hours": _f(unused),
        "by_user": advice,
    }
    return out


def _wait_stats(row: Sequence[Any]) -> dict[str, Any]:
    n, med, p90, mx, mean = row
    return {
        "jobs": int(n),
        "median_s": _opt(med),
        "p90_s": _opt(p90),
        "max_s": _opt(mx),
        "mean_s": _opt(mean),
    }


_WAIT_AGG = (
    "count(*), quantile_cont(greatest(wait, 0), 0.5), quantile_cont(greatest(wait, 0), 0.9), "
    "max(greatest(wait, 0)), avg(greatest(wait, 0))"
)


def _waiting(q: _Q, top: int) -> dict[str, Any]:
    started = "FROM a WHERE wait IS NOT NULL"
    short = f"{started} AND runtime < {SHORT_JOB_S}"
    order = {b: i for i, b in enumerate(SIZE_BUCKETS)}

    def by_size(src: str) -> list[dict[str, Any]]:
        rows = q.rows(f"SELECT {_SIZE_SQL} AS b, {_WAIT_AGG} {src} GROUP BY b")
        rows.sort(key=lambda r: order.get(str(r[0]), 99))
        return [{"gpus": str(r[0]), **_wait_stats(r[1:])} for r in rows]

    users = q.rows(
        f"SELECT coalesce(\"user\", '(none)') AS u, {_WAIT_AGG} {started} GROUP BY u "
        f"ORDER BY count(*) DESC, u LIMIT {int(top)}"
    )
    return {
        "overall": _wait_stats(q.one(f"SELECT {_WAIT_AGG} {started}")),
        "by_user": [{"user": r[0], **_wait_stats(r[1:])} for r in users],
        "by_size": by_size(started),
        "short_jobs": {
            "max_runtime_s": SHORT_JOB_S,
            "overall": _wait_stats(q.one(f"SELECT {_WAIT_AGG} {short}")),
            "by_size": by_size(short),
        },
    }


def _weekly(q: _Q) -> list[dict[str, Any]]:
    rows = q.rows(
        "SELECT date_trunc('week', timezone('UTC', submit_time)) AS wk, "
        "strftime(timezone('UTC', submit_time), '%G-W%V') AS label, count(*), "
        f"count(*) FILTER ({_ENDED}), count(*) FILTER (outcome = 'success'), "
        "count(*) FILTER (outcome = 'waste'), coalesce(sum(gpu_hours), 0), "
        f"coalesce(sum(gpu_hours) FILTER ({_ENDED}), 0), "
        "coalesce(sum(gpu_hours) FILTER (outcome = 'success'), 0), "
        "coalesce(sum(gpu_hours) FILTER (outcome = 'waste'), 0), "
        "quantile_cont(greatest(wait, 0), 0.5) "
        "FROM a WHERE submit_time IS NOT NULL GROUP BY wk, label ORDER BY wk"
    )
    return [
        {
            "week": label,
            "week_start": wk.date().isoformat(),
            "jobs": int(n),
            "ended_jobs": int(ne),
            "successful_jobs": int(ns),
            "failed_jobs": int(nw),
            "gpu_hours": _f(gh),
            "completion_rate": {"by_count": _ratio(ns, ne), "by_gpu_hours": _ratio(_f(gs), _f(ge))},
            "goodput_gpu_hours": _f(gs),
            "wasted_gpu_hours": _f(gw),
            "median_wait_s": _opt(mw),
        }
        for wk, label, n, ne, ns, nw, gh, ge, gs, gw, mw in rows
    ]


# Headline figures compared by --period/--vs: (key, label, getter, kind) where kind says how to show it.
HEADLINES: tuple[tuple[str, str, str], ...] = (
    ("jobs", "jobs", "count"),
    ("gpu_jobs", "GPU jobs", "count"),
    ("gpu_hours", "GPU-hours", "hours"),
    ("completion_rate_by_count", "completion rate (jobs)", "rate"),
    ("completion_rate_by_gpu_hours", "completion rate (GPU-hours)", "rate"),
    ("goodput_gpu_hours", "goodput GPU-hours", "hours"),
    ("wasted_gpu_hours", "wasted GPU-hours", "hours"),
    ("wasted_cost_usd", "wasted cost (USD)", "usd"),
    ("early_failures_15min_share", "failures within 15 min", "rate"),
    ("repeat_failure_gpu_hours", "repeat-failure GPU-hours", "hours"),
    ("timeout_gpu_hours", "timeout GPU-hours", "hours"),
    ("median_wait_s", "median queueing delay", "seconds"),
    ("p90_wait_s", "p90 queueing delay", "seconds"),
    ("short_jobs_median_wait_s", "median wait, jobs < 1 h", "seconds"),
)


def headline(report: dict[str, Any]) -> dict[str, float | None]:
    """The figures a before/after comparison shows, picked out of a full report."""
    early15 = next((e for e in report["early_failures"]["within"] if e["minutes"] == 15), None)
    values: dict[str, float | None] = {
        "jobs": report["totals"]["jobs"],
        "gpu_jobs": report["totals"]["gpu_jobs"],
        "gpu_hours": report["totals"]["gpu_hours"],
        "completion_rate_by_count": report["completion_rate"]["by_count"],
        "completion_rate_by_gpu_hours": report["completion_rate"]["by_gpu_hours"],
        "goodput_gpu_hours": report["goodput_gpu_hours"],
        "wasted_gpu_hours": report["wasted_gpu_hours"],
        "wasted_cost_usd": report["wasted_cost"]["usd"],
        "early_failures_15min_share": early15["share_jobs"] if early15 else None,
        "repeat_failure_gpu_hours": report["repeat_failures"]["gpu_hours"],
        "timeout_gpu_hours": report["timeouts"]["gpu_hours"],
        "median_wait_s": report["waiting"]["overall"]["median_s"],
        "p90_wait_s": report["waiting"]["overall"]["p90_s"],
        "short_jobs_median_wait_s": report["waiting"]["short_jobs"]["overall"]["median_s"],
    }
    return values


def compare(period: dict[str, Any], vs: dict[str, Any]) -> dict[str, Any]:
    """Change of every headline figure: period minus vs (absolute) and that over vs (relative)."""
    a, b = headline(period), headline(vs)
    rows = []
    for key, label, kind in HEADLINES:
        x, y = a[key], b[key]
        change = None if x is None or y is None else float(x) - float(y)
        rel = None if change is None or not y else change / abs(float(y))
        rows.append(
            {
                "metric": key,
                "label": label,
                "kind": kind,
                "period": x,
                "vs": y,
                "change": change,
                "change_rel": rel,
            }
        )
    return {"period": period["window"], "vs": vs["window"], "metrics": rows}


def audit_report(
    con: duckdb.DuckDBPyConnection,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    by: str = "user",
    top: int = 10,
    gpu_hour_price: float = DEFAULT_PRICE,
    include_cpu: bool = False,
    vs: Window | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The whole audit of jobs submitted in [since, until) as one JSON-ready dict (docs/audit-json.md).

    `con` is a connection to a job store (anything with a `jobs_v` view). By default only GPU jobs are
    audited (`include_cpu` adds CPU-only jobs); `totals.jobs` always counts every job in the window.
    With `vs`, the report also carries `comparison`: this window against that one.
    """
    if by not in BY_CHOICES:
        raise ValueError(f"by must be one of {', '.join(BY_CHOICES)}")
    window = Window(since, until)
    q = _Q(con, window, include_cpu)
    step = progress or (lambda _s: None)
    step("totals")
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "window": window.to_json(),
        "scope": "all_jobs" if include_cpu else "gpu_jobs",
    }
    report.update(_totals(q, gpu_hour_price))
    step("top")
    report["top"] = _top(q, by, top)
    step("repeat failures")
    report["repeat_failures"] = _repeat_failures(q, top, REPEAT_MIN)
    step("early failures")
    report["early_failures"] = _early_failures(q)
    step("timeouts")
    report["timeouts"] = _timeouts(q, top)
    step("waiting")
    report["waiting"] = _waiting(q, top)
    step("weekly")
    report["weekly"] = _weekly(q)
    report["notes"] = _notes(report, include_cpu)
    report["comparison"] = None
    if vs is not None:
        step("comparison")
        other = audit_report(
            con,
            since=vs.since,
            until=vs.until,
            by=by,
            top=top,
            gpu_hour_price=gpu_hour_price,
            include_cpu=include_cpu,
        )
        report["comparison"] = compare(report, other)
    return report


def _notes(r: dict[str, Any], include_cpu: bool) -> list[str]:
    notes = []
    t = r["totals"]
    if t["jobs"] == 0:
        notes.append("no jobs in this window")
    elif t["audited_jobs"] == 0 and not include_cpu:
        notes.append("no GPU jobs in this window; --include-cpu audits CPU-only jobs too")
    if t["audited_jobs"] and not r["timeouts"]["time_limits_known"]:
        notes.append("no time limits in this data: over-asking cannot be measured")
    if t["cpu_jobs"] and not include_cpu:
        notes.append(f"{t['cpu_jobs']:,} CPU-only jobs not audited (--include-cpu adds them)")
    return notes
