"""The audit's numbers, computed in DuckDB SQL over the store's `jobs_v` view.

`audit_report` returns one JSON-ready dict (schema: docs/audit-json.md) that the terminal renderer, the
HTML report and `headway demo` all read, so every view of the audit shows the same figures. Outcome classes
and metrics are those of DESIGN.md ("Metrics"); the SQL CASE is generated from `schema.OUTCOME_OF`.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from headway.audit.periods import Window
from headway.policy.inputs import STREAK_FAILURES, STREAK_SUCCESS
from headway.schema import OUTCOME_OF, Outcome, State

BY_CHOICES: tuple[str, ...] = ("user", "group", "name", "partition", "gpus")
# How a top table's heading names its rows ("Top users", "Top GPU counts").
BY_TITLES: dict[str, str] = {
    "user": "users",
    "group": "groups",
    "name": "job names",
    "partition": "partitions",
    "gpus": "GPU counts",
}
DEFAULT_PRICE = 2.0  # USD per GPU-hour: a rough cloud price; --gpu-hour-price sets a site's own
EARLY_MINUTES: tuple[int, ...] = (5, 15, 60)
CDF_MINUTES: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 240, 480, 720, 1440, 2880, 5760, 10080)
OVER_ASK_SHARE = 0.25  # a job that used less than this share of its time limit over-asked
SHORT_JOB_S = 3600.0
SIZE_BUCKETS: tuple[str, ...] = ("cpu", "<1", "1", "2-4", "5-8", "9-32", "33+")
REPEAT_MIN = 3
# How a repeat-failure streak is keyed (docs/audit-json.md): a job's user and name, else its user and group;
# in a log that has neither names nor groups, its user alone. This is exactly `policy.inputs.streak_key`,
# the key the repeat-failure hold uses, with the log decided per source: an empty user, name or group counts
# as none there (`if name:`), so `_STREAK_JOBS` reads '' as NULL.
REPEAT_KEYS: tuple[str, ...] = ("user+name", "user+group", "user")
# The sequence a streak is counted in is the hold's: the owner's own failures (`STREAK_FAILURES`, in the
# schema's order) and successes (`STREAK_SUCCESS`). Any other end, a node failure too, neither extends nor
# breaks a run, though it is waste in every other figure of the audit.
STREAK_FAILURE_STATES: tuple[str, ...] = tuple(s.value for s in State if s.value in STREAK_FAILURES)
_STREAK_FAIL_SQL = "state IN (" + ", ".join(f"'{s}'" for s in STREAK_FAILURE_STATES) + ")"
_STREAK_SEQ_SQL = f"({_STREAK_FAIL_SQL} OR state = '{STREAK_SUCCESS}')"
_STREAK_JOBS = (
    "(SELECT source, nullif(\"user\", '') AS \"user\", nullif(name, '') AS name, "
    'nullif("group", \'\') AS "group", state, gpu_hours, t, tie FROM a)'
)
USER_ALONE_LABEL = "by user alone: this log has no job names or groups"
# Cancelled jobs by when they were cancelled (docs/audit-json.md, `cancelled`), in the order shown.
CANCEL_EARLY_S = 600.0  # cancelled this soon after starting: a mistake caught early, GPUs saved
CANCEL_LATE_SHARE = 0.8  # cancelled after using this share of the time limit: most of the GPU time spent
CANCEL_BUCKETS: dict[str, str] = {
    "never_started": "never started",
    "within_10_min": "within 10 min of starting",
    "rest": "after 10 min, before 80% of the limit",
    "near_time_limit": "after 80%+ of the time limit",
    "no_time_limit": "after 10 min, no time limit known",
}
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
    import tempfile

    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET threads = {int(threads or min(os.cpu_count() or 1, 8))}")
    con.execute("SET preserve_insertion_order = false")
    tmp = os.path.join(tempfile.gettempdir(), "headway-duckdb")
    os.makedirs(tmp, exist_ok=True)
    con.execute(f"SET temp_directory = '{tmp}'")


def anchor_time(con: duckdb.DuckDBPyConnection, source: str | None = None) -> dt.datetime | None:
    """The newest submit time in the store (of `source`): what relative times (30d, -14d) count back from."""
    if source is None:
        row = con.execute("SELECT max(submit_time) FROM jobs_v").fetchone()
    else:
        row = con.execute("SELECT max(submit_time) FROM jobs_v WHERE source = ?", [source]).fetchone()
    return _utc(row[0]) if row else None


def sources(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The sources in the store (one per ingested cluster or format), sorted."""
    return [str(r[0]) for r in con.execute("SELECT DISTINCT source FROM jobs_v ORDER BY 1").fetchall()]


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


def _part_of(part: float, whole: float | None) -> float | None:
    """The share of `whole` that `part`, a subset of it, makes up: summed another way than the whole, a part
    that is all of it can come out a rounding error above it (1.0000000000000002)."""
    r = _ratio(part, whole)
    return None if r is None else min(r, 1.0)


def _f(x: Any) -> float:
    return 0.0 if x is None else float(x)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


class _Q:
    """Runs section queries over one window: `w` = jobs submitted in it, `a` = the audited scope of `w`."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        window: Window,
        include_cpu: bool,
        source: str | None = None,
        user: str | None = None,
    ) -> None:
        self.con = con
        conds = []
        self.params: dict[str, object] = {}
        if source is not None:
            conds.append("source = $source")
            self.params["source"] = source
        if user is not None:
            conds.append('"user" = $user')
            self.params["user"] = user
        if window.since is not None:
            conds.append("submit_time >= $since")
            self.params["since"] = window.since
        if window.until is not None:
            conds.append("submit_time < $until")
            self.params["until"] = window.until
        where = " WHERE " + " AND ".join(conds) if conds else ""
        scope = "" if include_cpu else " AND gpus > 0"
        select = (
            'SELECT * FROM (SELECT source, "user", "group", name, partition, coalesce(gpus, 0) AS gpus, '
            "state, start_time IS NOT NULL AS started, "
            f"{_OUTCOME_SQL} AS outcome, submit_time, coalesce(end_time, start_time, submit_time) AS t, "
            f"runtime, wait, gpu_hours, time_limit, hash(job_id) AS tie FROM jobs_v{where}) WHERE true{scope}"
        )
        self.qf = "quantile_cont"  # exact; DuckDB's t-digest (approx_quantile) measured no faster here
        self.prefix = (
            'WITH w AS (SELECT coalesce(gpus, 0) AS gpus, gpu_hours, submit_time, "user" '
            f"FROM jobs_v{where}), "
            f"a AS ({select}) "
        )

    def rows(self, sql: str, params: dict[str, object] | None = None) -> list[tuple[Any, ...]]:
        """`sql` after the window's CTEs; `params` adds named parameters that this one query uses."""
        return self.con.execute(self.prefix + sql, {**self.params, **(params or {})}).fetchall()

    def one(self, sql: str) -> tuple[Any, ...]:
        r = self.rows(sql)
        return r[0]

    def arrays(self, sql: str) -> dict[str, Any]:
        """`sql` after the window's CTEs, as numpy columns (per-job figures, e.g. for a bootstrap)."""
        out: dict[str, Any] = self.con.execute(self.prefix + sql, self.params).fetchnumpy()
        return out


def _totals(q: _Q, price: float) -> dict[str, Any]:
    jobs, gpu_jobs, gh, first, last, users = q.one(
        "SELECT count(*), count(*) FILTER (gpus > 0), fsum(gpu_hours), min(submit_time), max(submit_time), "
        'count(DISTINCT "user") FROM w'
    )
    states = q.rows(
        "SELECT state, count(*), fsum(gpu_hours) FROM a GROUP BY state ORDER BY count(*) DESC, state"
    )
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
            "audited_gpu_hours": scope_gh,
            "ended_jobs": ended_jobs,
            "ended_gpu_hours": ended_gh,
            # a log without users (Alibaba, sacct --json without associations) has an unknown number
            "users": int(users) if users or not jobs else None,
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


_GPUS_KEY = (
    "CASE WHEN gpus = floor(gpus) THEN CAST(CAST(gpus AS BIGINT) AS VARCHAR) "
    "ELSE CAST(round(gpus, 3) AS VARCHAR) END"
)
_DIM_SQL: dict[str, str] = {
    "user": '"user"',
    "group": '"group"',
    "name": "name",
    "partition": "partition",
    "gpus": "gpus_key",
}


def _top(q: _Q, by: str, top: int) -> dict[str, Any]:
    """Every dimension in one scan (GROUPING SETS), each cut to its `top` biggest wasters."""
    sets = ", ".join(f"({c})" for c in _DIM_SQL.values())
    dims = ", ".join(f"{c} AS d{i}" for i, c in enumerate(_DIM_SQL.values()))
    gid = ", ".join(_DIM_SQL.values())
    rows = q.rows(
        f"SELECT grouping({gid}) AS gid, {dims}, count(*) AS n, fsum(gpu_hours), "
        "coalesce(fsum(gpu_hours) FILTER (outcome = 'waste'), 0) AS wasted, "
        "count(*) FILTER (outcome = 'success'), count(*) FILTER (outcome <> 'unfinished'), "
        "coalesce(fsum(gpu_hours) FILTER (outcome = 'success'), 0), "
        "coalesce(fsum(gpu_hours) FILTER (outcome <> 'unfinished'), 0), count(*) FILTER (outcome = 'waste') "
        f"FROM (SELECT *, {_GPUS_KEY} AS gpus_key FROM a) GROUP BY GROUPING SETS ({sets}) "
        f"QUALIFY row_number() OVER (PARTITION BY grouping({gid}) ORDER BY wasted DESC, n DESC, "
        f"coalesce({', '.join(f'{c}' for c in _DIM_SQL.values())})) <= {int(top)}"
    )
    ndim = len(_DIM_SQL)
    out: dict[str, Any] = {"by": by, "n": top}
    for dim in BY_CHOICES:
        out[dim] = []
    for row in rows:
        gid_v = int(row[0])
        # grouping() sets a bit for every column NOT grouped; the one clear bit is this row's dimension
        i = next(j for j in range(ndim) if not gid_v & (1 << (ndim - 1 - j)))
        key = row[1 + i]
        n, gh, wasted, ns, ne, gs, ge, nw = row[1 + ndim :]
        out[BY_CHOICES[i]].append(
            {
                "key": "(none)" if key is None else str(key),
                "jobs": int(n),
                "gpu_hours": _f(gh),
                "wasted_gpu_hours": _f(wasted),
                "failed_jobs": int(nw),
                "completion_rate": {"by_count": _ratio(ns, ne), "by_gpu_hours": _ratio(_f(gs), _f(ge))},
            }
        )
    for dim in BY_CHOICES:
        out[dim].sort(key=lambda r: (-r["wasted_gpu_hours"], -r["jobs"], r["key"]))
    return out


class _Keying:
    """How one window's repeat failures can be keyed (`_repeat_keying`)."""

    def __init__(
        self, bare: list[str], logs: int, keyed: dict[str, int], unkeyed: int, failures: int
    ) -> None:
        self.bare = bare  # sources keyed by user alone: no job in them has a name or a group
        self.logs = logs  # sources with jobs in the window
        self.keyed = keyed  # jobs of the sequence (successes, failures) each key rule keys
        self.unkeyed = unkeyed  # failures no rule keys: no user, or neither name nor group in a named log
        self.failures = failures

    def key(self) -> str | None:
        """The rule the section shows: one of REPEAT_KEYS, "mixed", or None when no job could be keyed."""
        used = [k for k in REPEAT_KEYS if self.keyed[k]]
        return None if not used else used[0] if len(used) == 1 else "mixed"

    def label(self) -> str | None:
        """The words that say how the streaks were keyed, where that is not by user and job name/group."""
        if self.key() is None:
            return "cannot be seen: no failed job names its user" if self.failures else None
        if not self.keyed["user"]:
            return None
        if len(self.bare) == self.logs:
            return USER_ALONE_LABEL
        more = ", ..." if len(self.bare) > 5 else ""
        return f"by user alone in {', '.join(self.bare[:5])}{more}: no job names or groups there"


def _repeat_keying(q: _Q) -> _Keying:
    """Per log (source), not per job: a log with neither a job name nor a group on any job is keyed by user
    alone, so its streaks are seen; in a log with names, a nameless job is not lumped in with every other
    nameless job of its user, and is counted as unkeyed instead (`streak_key`'s `log_has_names`)."""
    rows = q.rows(
        'SELECT source, bool_or(name IS NOT NULL OR "group" IS NOT NULL), '
        "count(*) FILTER (seq AND name IS NOT NULL), "
        'count(*) FILTER (seq AND name IS NULL AND "group" IS NOT NULL), '
        'count(*) FILTER (seq AND name IS NULL AND "group" IS NULL), '
        'count(*) FILTER (fail AND "user" IS NULL), '
        'count(*) FILTER (fail AND "user" IS NOT NULL AND name IS NULL AND "group" IS NULL), '
        "count(*) FILTER (fail) "
        f'FROM (SELECT source, "user", name, "group", {_STREAK_FAIL_SQL} AS fail, '
        f'{_STREAK_SEQ_SQL} AND "user" IS NOT NULL AS seq FROM {_STREAK_JOBS}) '
        "GROUP BY source ORDER BY source"
    )
    keyed = dict.fromkeys(REPEAT_KEYS, 0)
    unkeyed = failures = 0
    for _src, named, by_name, by_group, neither, no_user, nameless, fails in rows:
        keyed["user+name"] += int(by_name)
        keyed["user+group"] += int(by_group)
        if named:
            unkeyed += int(nameless)
        else:
            keyed["user"] += int(neither)
        unkeyed += int(no_user)
        failures += int(fails)
    bare = [str(src) for src, named, *_ in rows if not named]
    return _Keying(bare, len(rows), keyed, unkeyed, failures)


def _repeat_failures(q: _Q, top: int, min_run: int, wasted: float) -> dict[str, Any]:
    """Gaps and islands: runs of >= min_run consecutive own failures (`STREAK_FAILURES`) of one user+name
    (or user+group; or, in a log with neither names nor groups, of one user: `_repeat_keying`).

    Only successes and own failures form the sequence, as for the hold (a cancelled job or a node failure
    neither extends nor breaks a streak); jobs are ordered by end time (else start, else submit), ties by
    job id. One window pass: the
    number of successes so far names the island, so failures between the same two successes share it, and a
    success followed the island when the key has more successes than that.
    """
    keying = _repeat_keying(q)
    fail_states = list(STREAK_FAILURE_STATES)
    code = "CASE state " + " ".join(f"WHEN '{st}' THEN {i}" for i, st in enumerate(fail_states)) + " END"
    flags = ", ".join(f"bool_or(sc = {i}) AS has_{i}" for i in range(len(fail_states)))
    # The source is part of the key: a user's failures on two clusters are not one streak. A job of a log
    # keyed by user alone hashes a NULL name: no named key shares its hash.
    key = 'hash(source, "user", coalesce(name, "group"), name IS NULL)'
    keyable = 'coalesce(name, "group") IS NOT NULL'
    params: dict[str, object] = {}
    if keying.bare:
        keyable = f"({keyable} OR list_contains($bare_sources, source))"
        params["bare_sources"] = keying.bare
    rule = (
        "CASE WHEN name IS NOT NULL THEN 'user+name' WHEN \"group\" IS NOT NULL THEN 'user+group' "
        "ELSE 'user' END"
    )
    # The sort carries only numbers (key hash, time, tie hash); names are looked up for the top rows alone.
    rows = q.rows(
        f", seq AS (SELECT {key} AS key, {_STREAK_FAIL_SQL} AS bad, CAST({code} AS UTINYINT) AS sc, "
        f'gpu_hours, t, tie FROM {_STREAK_JOBS} WHERE {_STREAK_SEQ_SQL} AND "user" IS NOT NULL '
        f"AND {keyable}), "
        "num AS (SELECT *, sum(CAST(NOT bad AS INTEGER)) OVER (PARTITION BY key ORDER BY t, tie "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS oks FROM seq), "
        "tot AS (SELECT key, max(oks) AS all_oks FROM num GROUP BY key), "
        f"s0 AS (SELECT key, oks, count(*) AS n, fsum(gpu_hours) AS gh, min(t) AS first_t, max(t) AS last_t, "
        f"{flags} FROM num WHERE bad GROUP BY key, oks HAVING count(*) >= {int(min_run)}), "
        "s AS (SELECT s0.*, all_oks > oks AS success_followed FROM s0 JOIN tot USING (key)), "
        "best AS (SELECT *, count(*) OVER () AS c_all, sum(n) OVER () AS n_all, fsum(gh) OVER () AS gh_all, "
        # no FILTER inside window aggregates: DuckDB evaluates those per row over the whole frame (quadratic)
        "sum(CAST(NOT success_followed AS INTEGER)) OVER () AS c_open, "
        "fsum(CASE WHEN success_followed THEN 0.0 ELSE gh END) OVER () AS gh_open FROM s "
        f"ORDER BY gh DESC, n DESC, key LIMIT {int(top)}), "
        f'names AS (SELECT {key} AS key, any_value("user") AS u, any_value(coalesce(name, "group")) AS k, '
        f"any_value({rule}) AS rule FROM {_STREAK_JOBS} WHERE {key} IN (SELECT key FROM best) GROUP BY 1) "
        "SELECT u, k, rule, n, gh, first_t, last_t, success_followed, c_all, n_all, gh_all, c_open, "
        "gh_open, "
        f"{', '.join(f'has_{i}' for i in range(len(fail_states)))} FROM best JOIN names USING (key) "
        "ORDER BY gh DESC, n DESC, u, k NULLS FIRST",
        params,
    )
    n, jobs, gh, unresolved, unresolved_gh = rows[0][8:13] if rows else (0, 0, 0.0, 0, 0.0)
    return {
        "min_run": min_run,
        "key": keying.key(),
        "key_label": keying.label(),
        "keyed_jobs": keying.keyed,
        "unkeyed_failures": keying.unkeyed,
        "streaks": int(n),
        "jobs": int(jobs),
        "gpu_hours": _f(gh),
        "share_of_wasted_gpu_hours": _part_of(_f(gh), wasted),
        "unresolved_streaks": int(unresolved),
        "unresolved_gpu_hours": _f(unresolved_gh),
        "rows": [
            {
                "user": u,
                "name": k if rk == "user+name" else None,
                "group": k if rk == "user+group" else None,
                "key": str(rk),
                "failures": int(nn),
                "gpu_hours": _f(g),
                "first": _iso(first),
                "last": _iso(last),
                "success_followed": bool(ok),
                "states": [st for st, has in zip(fail_states, r[5:], strict=True) if has],
            }
            for u, k, rk, nn, g, first, last, ok, *r in rows
        ],
    }


def _early_failures(q: _Q) -> dict[str, Any]:
    """Failures by how soon they ended, and the runtime CDF of failed against successful jobs.

    One small histogram query (runtime bucket x outcome); the cumulative shares are summed up here.
    """
    bucket = (
        "CASE "
        + " ".join(f"WHEN runtime <= {m * 60} THEN {i + 1}" for i, m in enumerate(CDF_MINUTES))
        + " ELSE NULL END"
    )
    rows = q.rows(
        f"SELECT outcome = 'waste' AS w, {bucket} AS b, count(*), fsum(gpu_hours) FROM a "
        "WHERE outcome IN ('waste', 'success') AND runtime IS NOT NULL GROUP BY w, b"
    )
    k = len(CDF_MINUTES)
    hist = {True: [0] * (k + 1), False: [0] * (k + 1)}  # bucket i (1-based) = runtime <= CDF_MINUTES[i-1]
    hist_gh = [0.0] * (k + 1)
    for w, b, n, gh in rows:
        idx = int(b) - 1 if b is not None else k  # beyond the last edge
        hist[bool(w)][idx] += int(n)
        if w:
            hist_gh[idx] += _f(gh)
    n_w, n_ok, gh_w = sum(hist[True]), sum(hist[False]), sum(hist_gh)

    def cum(xs: Sequence[float], upto: int) -> float:
        return float(sum(xs[: upto + 1]))

    early = []
    for m in EARLY_MINUTES:
        i = CDF_MINUTES.index(m)
        nj, g = int(cum(hist[True], i)), cum(hist_gh, i)
        early.append(
            {
                "minutes": m,
                "jobs": nj,
                "gpu_hours": g,
                "share_jobs": _ratio(nj, n_w),
                "share_gpu_hours": _ratio(g, gh_w),
            }
        )
    med = q.one(
        f"SELECT {q.qf}(runtime, 0.5) FILTER (outcome = 'waste'), {q.qf}(runtime, 0.5) FILTER "
        "(outcome = 'success') FROM a WHERE outcome IN ('waste', 'success') AND runtime IS NOT NULL"
    )
    return {
        "failed_jobs": n_w,
        "failed_gpu_hours": gh_w,
        "within": early,
        "median_runtime_s": {"waste": _opt(med[0]), "success": _opt(med[1])},
        "cdf": {
            "minutes": list(CDF_MINUTES),
            "waste": [_ratio(cum(hist[True], i), n_w) for i in range(k)],
            "success": [_ratio(cum(hist[False], i), n_ok) for i in range(k)],
        },
    }


_CANCEL_BUCKET_SQL = (
    "CASE WHEN NOT started THEN 'never_started' "
    f"WHEN runtime <= {CANCEL_EARLY_S} THEN 'within_10_min' "
    "WHEN coalesce(time_limit, 0) <= 0 THEN 'no_time_limit' "
    f"WHEN runtime >= {CANCEL_LATE_SHARE} * time_limit THEN 'near_time_limit' ELSE 'rest' END"
)


def _cancel_block(n: Any, gh: Any, of_n: int, of_gh: float) -> dict[str, Any]:
    return {
        "jobs": int(n),
        "gpu_hours": _f(gh),
        "share_jobs": _ratio(int(n), of_n),
        "share_gpu_hours": _part_of(_f(gh), of_gh),
    }


def _cancelled(q: _Q, top: int, audited_gpu_hours: float) -> dict[str, Any]:
    """Cancelled jobs by when they were cancelled (CANCEL_BUCKETS), overall and for the users with the most
    cancelled GPU-hours: a cancellation soon after the start saved the GPUs; one near the time limit had
    spent most of them on a job that never finished. One scan (GROUPING SETS), the top users cut in SQL."""
    rows = q.rows(
        f", c AS (SELECT coalesce(\"user\", '(none)') AS u, {_CANCEL_BUCKET_SQL} AS b, gpu_hours "
        "FROM a WHERE outcome = 'cancelled'), "
        "g AS (SELECT grouping(u) AS gu, u, b, count(*) AS n, coalesce(fsum(gpu_hours), 0) AS gh FROM c "
        "GROUP BY GROUPING SETS ((b), (u, b))), "
        "tu AS (SELECT u, sum(n) AS un, fsum(gh) AS ugh FROM g WHERE gu = 0 GROUP BY u "
        f"ORDER BY ugh DESC, un DESC, u LIMIT {int(top)}) "
        "SELECT NULL AS u, b, n, gh, NULL AS un, NULL AS ugh FROM g WHERE gu = 1 "
        "UNION ALL SELECT g.u, g.b, g.n, g.gh, tu.un, tu.ugh FROM g JOIN tu ON g.gu = 0 AND g.u = tu.u"
    )
    buckets: dict[str, tuple[int, float]] = {}
    users: dict[str, dict[str, Any]] = {}
    for u, b, n, gh, un, ugh in rows:
        if u is None:  # a bucket's total over every user
            buckets[str(b)] = (int(n), _f(gh))
            continue
        user = users.setdefault(str(u), {"user": str(u), "jobs": int(un), "gpu_hours": _f(ugh), "b": {}})
        user["b"][str(b)] = (int(n), _f(gh))
    jobs = sum(n for n, _ in buckets.values())
    gh_all = math.fsum(g for _, g in buckets.values())
    by_user = sorted(users.values(), key=lambda x: (-x["gpu_hours"], -x["jobs"], x["user"]))
    return {
        "jobs": jobs,
        "gpu_hours": gh_all,
        "share_of_gpu_hours": _part_of(gh_all, audited_gpu_hours),
        "early_s": CANCEL_EARLY_S,
        "near_limit_share": CANCEL_LATE_SHARE,
        "by_bucket": {
            k: {"label": label, **_cancel_block(*buckets.get(k, (0, 0.0)), jobs, gh_all)}
            for k, label in CANCEL_BUCKETS.items()
        },
        "by_user": [
            {
                "user": x["user"],
                "jobs": x["jobs"],
                "gpu_hours": x["gpu_hours"],
                "share_of_cancelled_gpu_hours": _part_of(x["gpu_hours"], gh_all),
                "by_bucket": {
                    k: {"jobs": x["b"].get(k, (0, 0.0))[0], "gpu_hours": x["b"].get(k, (0, 0.0))[1]}
                    for k in CANCEL_BUCKETS
                },
            }
            for x in by_user
        ],
    }


def _fmt_hours(seconds: float) -> str:
    h = seconds / 3600.0
    if h < 1:
        return f"{max(round(seconds / 60.0), 1):.0f} min"
    return f"{h:.1f} h" if h < 10 else f"{h:.0f} h"


def _timeouts(q: _Q, top: int, wasted: float) -> dict[str, Any]:
    used = "greatest(runtime, 0) / time_limit"
    done = "outcome = 'success' AND time_limit > 0 AND runtime IS NOT NULL"
    over = f"{done} AND {used} < {OVER_ASK_SHARE}"
    n, gh, with_limit, jobs, n_over, med, unused = q.one(
        "SELECT count(*) FILTER (state = 'TIMEOUT'), "
        "coalesce(fsum(gpu_hours) FILTER (state = 'TIMEOUT'), 0), "
        f"count(*) FILTER (time_limit > 0), count(*) FILTER ({done}), count(*) FILTER ({over}), "
        f"{q.qf}({used}, 0.5) FILTER ({done}), "
        f"coalesce(fsum(gpus * greatest(time_limit - greatest(runtime, 0), 0) / 3600.0) FILTER ({done}), 0) "
        "FROM a"
    )
    by_user = (
        q.rows(
            "SELECT coalesce(\"user\", '(none)') AS u, count(*), fsum(gpu_hours) FROM a "
            "WHERE state = 'TIMEOUT' "
            f"GROUP BY u ORDER BY fsum(gpu_hours) DESC, count(*) DESC, u LIMIT {int(top)}"
        )
        if n
        else []
    )
    out: dict[str, Any] = {
        "jobs": int(n),
        "gpu_hours": _f(gh),
        "share_of_wasted_gpu_hours": _part_of(_f(gh), wasted),
        "by_user": [{"user": u, "jobs": int(c), "gpu_hours": _f(g)} for u, c, g in by_user],
        "time_limits_known": int(with_limit) > 0,
        "jobs_with_time_limit": int(with_limit),
        "over_asking": None,
    }
    if not with_limit:
        return out
    users = (
        q.rows(
            f"SELECT coalesce(\"user\", '(none)') AS u, count(*), "
            f"count(*) FILTER ({used} < {OVER_ASK_SHARE}) AS o, {q.qf}({used}, 0.5), "
            f"{q.qf}(time_limit, 0.5), {q.qf}(greatest(runtime, 0), 0.95) "
            f"FROM a WHERE {done} GROUP BY u HAVING o > 0 ORDER BY o DESC, u LIMIT {int(top)}"
        )
        if n_over
        else []
    )
    advice = []
    for u, c, o, m, lim, p95 in users:
        m_f, lim_f, p95_f = _f(m), _f(lim), _f(p95)
        suggest = max(p95_f * 1.2, 300.0)
        text = (
            f"your jobs use a median {m_f * 100:.0f}% of the time you request "
            f"(median limit {_fmt_hours(lim_f)})"
        )
        if suggest < 0.8 * lim_f:
            text += (
                f"; a limit near {_fmt_hours(suggest)} would still cover 95% of them "
                "and lets the scheduler backfill them sooner"
            )
        advice.append(
            {
                "user": u,
                "jobs": int(c),
                "over_asking_jobs": int(o),
                "median_used_share": m_f,
                "median_time_limit_s": lim_f,
                "p95_runtime_s": p95_f,
                "advice": text,
            }
        )
    out["over_asking"] = {
        "threshold_share": OVER_ASK_SHARE,
        "completed_jobs_with_limit": int(jobs),
        "jobs": int(n_over),
        "share_jobs": _ratio(int(n_over), int(jobs)),
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


def _waiting(q: _Q, top: int) -> dict[str, Any]:
    """Queueing delay overall, by user, by size, and for short jobs: one scan with GROUPING SETS."""
    rows = q.rows(
        f"SELECT grouping(u, b, short) AS gid, u, b, short, count(*), {q.qf}(wt, [0.5, 0.9]), max(wt), "
        f"fsum(wt) / count(wt) FROM (SELECT coalesce(\"user\", '(none)') AS u, {_SIZE_SQL} AS b, "
        f"coalesce(runtime < {SHORT_JOB_S}, false) AS short, greatest(wait, 0) AS wt FROM a "
        "WHERE wait IS NOT NULL) GROUP BY GROUPING SETS ((), (u), (b), (short), (short, b))"
    )
    order = {b: i for i, b in enumerate(SIZE_BUCKETS)}
    overall: dict[str, Any] = _wait_stats((0, None, None, None, None))
    short_overall: dict[str, Any] = _wait_stats((0, None, None, None, None))
    users, sizes, short_sizes = [], [], []
    for gid, u, b, short, n, qs, mx, mean in rows:
        med, p90 = qs if qs else (None, None)
        stats = _wait_stats((n, med, p90, mx, mean))
        gid = int(gid)  # bits (u, b, short): set = not grouped by it
        if gid == 0b111:
            overall = stats
        elif gid == 0b011:
            users.append({"user": u, **stats})
        elif gid == 0b101:
            sizes.append({"gpus": str(b), **stats})
        elif gid == 0b110 and short:
            short_overall = stats
        elif gid == 0b100 and short:
            short_sizes.append({"gpus": str(b), **stats})
    users.sort(key=lambda x: (-x["jobs"], str(x["user"])))
    sizes.sort(key=lambda x: order.get(x["gpus"], 99))
    short_sizes.sort(key=lambda x: order.get(x["gpus"], 99))
    return {
        "overall": overall,
        "by_user": users[:top],
        "by_size": sizes,
        "short_jobs": {"max_runtime_s": SHORT_JOB_S, "overall": short_overall, "by_size": short_sizes},
    }


_MONDAY_EPOCH = 4 * 86400  # 1970-01-05, the first Monday after the epoch: ISO weeks start on Mondays
_WEEK_S = 7 * 86400


def _weekly(q: _Q, price: float) -> list[dict[str, Any]]:
    """Per ISO week of submission; the week is integer arithmetic on epoch seconds (cheap on 10M rows)."""
    rows = q.rows(
        f"SELECT CAST(floor((epoch(submit_time) - {_MONDAY_EPOCH}) / {_WEEK_S}) AS BIGINT) AS wk, count(*), "
        f"count(*) FILTER ({_ENDED}), count(*) FILTER (outcome = 'success'), "
        "count(*) FILTER (outcome = 'waste'), coalesce(fsum(gpu_hours), 0), "
        f"coalesce(fsum(gpu_hours) FILTER ({_ENDED}), 0), "
        "coalesce(fsum(gpu_hours) FILTER (outcome = 'success'), 0), "
        "coalesce(fsum(gpu_hours) FILTER (outcome = 'waste'), 0), "
        # Started jobs only, as in `waiting` (greatest(NULL, 0) is 0: a pending job read as no wait).
        f"{q.qf}(greatest(wait, 0), [0.5, 0.9]) FILTER (wait IS NOT NULL) "
        "FROM a WHERE submit_time IS NOT NULL GROUP BY wk ORDER BY wk"
    )
    out = []
    for wk, n, ne, ns, nw, gh, ge, gs, gw, qs in rows:
        mw, pw = qs if qs else (None, None)
        start = dt.date(1970, 1, 5) + dt.timedelta(days=7 * int(wk))
        iso = start.isocalendar()
        out.append(
            {
                "week": f"{iso.year}-W{iso.week:02d}",
                "week_start": start.isoformat(),
                "jobs": int(n),
                "ended_jobs": int(ne),
                "successful_jobs": int(ns),
                "failed_jobs": int(nw),
                "gpu_hours": _f(gh),
                "completion_rate": {"by_count": _ratio(ns, ne), "by_gpu_hours": _ratio(_f(gs), _f(ge))},
                "goodput_gpu_hours": _f(gs),
                "wasted_gpu_hours": _f(gw),
                "wasted_cost_usd": _f(gw) * price,
                "median_wait_s": _opt(mw),
                "p90_wait_s": _opt(pw),
            }
        )
    return out


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
    rf = report["repeat_failures"]
    # failures of which none could be keyed (a log without users): repeat failures unknown, not zero
    unseen = rf.get("unkeyed_failures") and not any(rf.get("keyed_jobs", {}).values())
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
        "repeat_failure_gpu_hours": None if unseen else rf["gpu_hours"],
        # without time limits in the data a timeout cannot happen: unknown, not zero
        "timeout_gpu_hours": report["timeouts"]["gpu_hours"]
        if report["timeouts"]["time_limits_known"] or report["timeouts"]["jobs"]
        else None,
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
    source: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The whole audit of jobs submitted in [since, until) as one JSON-ready dict (docs/audit-json.md).

    `con` is a connection to a job store (anything with a `jobs_v` view). By default only GPU jobs are
    audited (`include_cpu` adds CPU-only jobs); `totals.jobs` always counts every job in the window.
    `source` keeps one source (cluster) of a store that holds several, `user` one user's jobs (the
    dashboard's page per user: the same figures, scoped). With `vs`, the report also
    carries `comparison`: this window against that one.
    """
    if by not in BY_CHOICES:
        raise ValueError(f"by must be one of {', '.join(BY_CHOICES)}")
    window = Window(since, until)
    step = progress or (lambda _s: None)
    q = _Q(con, window, include_cpu, source, user)
    step("totals")
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "window": window.to_json(),
        "scope": "all_jobs" if include_cpu else "gpu_jobs",
        "source": source,
    }
    if user is not None:
        report["user"] = user
    report.update(_totals(q, gpu_hour_price))
    step("top")
    report["top"] = _top(q, by, top)
    step("repeat failures")
    report["repeat_failures"] = _repeat_failures(q, top, REPEAT_MIN, report["wasted_gpu_hours"])
    step("early failures")
    report["early_failures"] = _early_failures(q)
    step("timeouts")
    report["timeouts"] = _timeouts(q, top, report["wasted_gpu_hours"])
    step("cancelled")
    report["cancelled"] = _cancelled(q, top, report["totals"]["audited_gpu_hours"])
    step("waiting")
    report["waiting"] = _waiting(q, top)
    step("weekly")
    report["weekly"] = _weekly(q, gpu_hour_price)
    report["notes"] = _notes(report, include_cpu)
    held = sources(con) if source is None else [source]
    if len(held) > 1:
        report["notes"].append(
            f"the store holds {len(held)} sources ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}), "
            "audited together; --source NAME audits one"
        )
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
            source=source,
            user=user,
        )
        report["comparison"] = compare(report, other)
        overlap = window.overlap(vs)
        if overlap is not None:  # the same jobs on both sides make the two periods look alike
            report["notes"].append(
                f"the two periods overlap ({overlap.label()}): jobs submitted then count in both"
                " (a bare end date includes its whole day)"
            )
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
    unweeked = t["audited_jobs"] - sum(wk["jobs"] for wk in r["weekly"])
    if unweeked > 0:
        notes.append(
            f"{unweeked:,} {'job has' if unweeked == 1 else 'jobs have'} no submit time: "
            f"{'it counts' if unweeked == 1 else 'they count'} in the totals but in no week of the series"
        )
    by = r["top"]["by"]
    rows = r["top"].get(by) or []
    if t["audited_jobs"] and len(rows) == 1 and rows[0]["key"] == "(none)":
        others = [d for d in BY_CHOICES if d != by and any(x["key"] != "(none)" for x in r["top"].get(d, []))]
        hint = f"; --by {others[0]} groups by what it has" if others else ""
        what = BY_TITLES.get(by, by)
        notes.append(f"no {what} in this data: the top-{by} table is one row, (none){hint}")
    return notes
