"""Each user's facts, from the job store: what a message to that user says (docs/notify.md).

Most of it is the audit's own figures (`audit_report`, one call for the window): its repeat-failure runs
(keyed as the repeat-failure hold keys them), its over-asking users and its waiting statistics. The audit
has no per-name or per-size breakdown of one user's jobs, and no view of pending jobs; the three small
queries here add exactly that (`over_asks_by_name`, `waits_by_size`, `held_jobs`) and nothing else.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb

from headway.audit.compute import _SIZE_SQL, OVER_ASK_SHARE, REPEAT_MIN, audit_report
from headway.audit.periods import Window
from headway.policy.impact import Impact
from headway.policy.inputs import STREAK_FAILURES, STREAK_SUCCESS, FailureStreaks, streak_key
from headway.schema import OUTCOME_OF, Outcome, State

ALL_ROWS = 1_000_000_000  # the audit's `top`: every row of its ranked lists, not the first ten
# The hold ranks a pending job last once its user+name failed this many times in a row (the impact policy's
# default, which the simulator, the local queue and the Slurm adapter run).
HOLD_AFTER: int = Impact.hold_after
# A suggested limit: the p95 runtime of the user's successful jobs of that name, times this headroom,
# rounded up to a multiple of LIMIT_STEP_S; suggested only from LIMIT_MIN_JOBS such jobs, and only when it
# is below LIMIT_WORTH_SHARE of the median limit they asked for (else lowering it gains little).
LIMIT_HEADROOM = 1.2
LIMIT_STEP_S = 900.0
LIMIT_MIN_JOBS = 3
LIMIT_WORTH_SHARE = 0.8
# Waits are long when a user's median is at least WAIT_FACTOR times the cluster's and at least
# WAIT_FLOOR_S, or their p90 is WAIT_FACTOR times the cluster's p90 and at least WAIT_P90_FLOOR_S; judged
# only from WAIT_MIN_JOBS started jobs. A size bucket "waits longer" on the same factor and floor.
WAIT_FACTOR = 2.0
WAIT_FLOOR_S = 3600.0
WAIT_P90_FLOOR_S = 4 * 3600.0
WAIT_MIN_JOBS = 3

_SUCCESS_STATES = [s.value for s, o in OUTCOME_OF.items() if o is Outcome.SUCCESS]
_SEQ_STATES = sorted({*STREAK_FAILURES, STREAK_SUCCESS})


@dataclass(frozen=True, slots=True)
class RepeatRun:
    """One run of REPEAT_MIN+ own failures in a row of one user+name (else user+group, else user)."""

    key: str  # the audit's rule: "user+name", "user+group" or "user"
    name: str | None
    group: str | None
    failures: int
    gpu_hours: float
    first: str | None  # end time of its first and last failure (ISO, UTC)
    last: str | None
    still_failing: bool  # no success of that key came after it
    states: tuple[str, ...]

    @property
    def label(self) -> str:
        """What the user calls it: the job name, else the group."""
        if self.name:
            return f"job {self.name}"
        if self.group:
            return f"jobs in group {self.group}"
        return "your jobs"


@dataclass(frozen=True, slots=True)
class HeldJob:
    """A pending job the repeat-failure hold ranks last: its user+name failed `streak` times in a row."""

    source: str
    job_id: str
    name: str | None
    group: str | None
    streak: int
    submitted: str | None


@dataclass(frozen=True, slots=True)
class OverAsk:
    """One job name whose successful jobs typically used under OVER_ASK_SHARE of their time limit."""

    name: str | None
    completed_jobs: int  # successful jobs of that name with a time limit
    over_asking_jobs: int
    median_used_share: float
    median_limit_s: float
    p95_runtime_s: float | None  # of every successful job of that name (with or without a limit)
    suggested_limit_s: float | None


@dataclass(frozen=True, slots=True)
class LongWait:
    """Waits well above the cluster's, and what the data says about why."""

    jobs: int  # started jobs
    median_s: float
    p90_s: float
    cluster_median_s: float
    cluster_p90_s: float
    size: str | None  # the user's most common GPU-count bucket (the audit's SIZE_BUCKETS)
    size_jobs: int
    size_median_s: float | None  # the user's median wait in that bucket
    size_cluster_median_s: float | None  # everyone's median wait in that bucket
    reason: str | None  # "size": that size waits longer for everyone; "not_size": it does not; None


@dataclass(slots=True)
class UserFacts:
    """Everything one message says, as data: what is fingerprinted and what `--json` shows."""

    user: str
    repeat_failures: list[RepeatRun] = field(default_factory=list)
    held_jobs: list[HeldJob] = field(default_factory=list)
    over_asks: list[OverAsk] = field(default_factory=list)
    long_wait: LongWait | None = None

    def empty(self) -> bool:
        return not (self.repeat_failures or self.held_jobs or self.over_asks or self.long_wait)


def _window_sql(window: Window, params: dict[str, object]) -> str:
    conds = []
    if window.since is not None:
        conds.append("submit_time >= $since")
        params["since"] = window.since
    if window.until is not None:
        conds.append("submit_time < $until")
        params["until"] = window.until
    return "".join(f" AND {c}" for c in conds)


def _real_user(u: Any) -> str | None:
    """The audit shows a job without a user as '(none)': nobody to write to."""
    return None if u is None or u in ("", "(none)") else str(u)


def user_facts(con: duckdb.DuckDBPyConnection, window: Window, *, user: str | None = None) -> list[UserFacts]:
    """Every user's facts for jobs submitted in `window` (held jobs: every pending job now), users with
    nothing to act on left out, sorted by user. `user` keeps that one user."""
    report = audit_report(con, since=window.since, until=window.until, top=ALL_ROWS)
    facts: dict[str, UserFacts] = {}

    def of(u: str) -> UserFacts:
        return facts.setdefault(u, UserFacts(u))

    for r in report["repeat_failures"]["rows"]:
        u = _real_user(r["user"])
        if u is None or (user is not None and u != user) or r["failures"] < REPEAT_MIN:
            continue
        of(u).repeat_failures.append(
            RepeatRun(
                key=r["key"],
                name=r["name"],
                group=r["group"],
                failures=int(r["failures"]),
                gpu_hours=float(r["gpu_hours"]),
                first=r["first"],
                last=r["last"],
                still_failing=not r["success_followed"],
                states=tuple(r["states"]),
            )
        )
    for u, jobs in held_jobs(con, user=user).items():
        of(u).held_jobs.extend(jobs)
    over = report["timeouts"]["over_asking"]
    over_users = [u for x in (over or {}).get("by_user", []) if (u := _real_user(x["user"]))]
    if user is not None:
        over_users = [u for u in over_users if u == user]
    if over_users:
        for u, asks in over_asks_by_name(con, window, over_users).items():
            of(u).over_asks.extend(asks)
    waits = report["waiting"]
    for u, lw in long_waits(con, window, waits, user=user).items():
        of(u).long_wait = lw
    return [f for _, f in sorted(facts.items()) if not f.empty()]


def held_jobs(con: duckdb.DuckDBPyConnection, *, user: str | None = None) -> dict[str, list[HeldJob]]:
    """Pending jobs whose streak is at or above HOLD_AFTER, per user. The streaks are counted as the
    hold counts them (`FailureStreaks` fed every ended job of the same source in end order, keyed by
    `streak_key`), over the store's whole history: the hold does not look at a window."""
    params: dict[str, object] = {"pending": State.PENDING.value}
    only = ""
    if user is not None:
        only = ' AND "user" = $user'
        params["user"] = user
    pending = con.execute(
        "SELECT source, job_id, nullif(\"user\", '') AS u, nullif(name, ''), nullif(\"group\", ''), "
        "submit_time FROM jobs_v WHERE state = $pending AND nullif(\"user\", '') IS NOT NULL"
        f"{only} ORDER BY u, submit_time, job_id",
        params,
    ).fetchall()
    if not pending:
        return {}
    srcs = sorted({str(p[0]) for p in pending})
    users = sorted({str(p[2]) for p in pending})
    # Per source, as the audit decides it: a log where no job has a name or a group is keyed by user alone.
    named = {
        str(s): bool(n)
        for s, n in con.execute(
            "SELECT source, bool_or(nullif(name, '') IS NOT NULL OR nullif(\"group\", '') IS NOT NULL) "
            "FROM jobs_v WHERE list_contains($srcs, source) GROUP BY source",
            {"srcs": srcs},
        ).fetchall()
    }
    books: dict[str, FailureStreaks] = defaultdict(FailureStreaks)
    ended = con.execute(
        "SELECT source, \"user\", nullif(name, ''), nullif(\"group\", ''), state FROM jobs_v "
        'WHERE end_time IS NOT NULL AND list_contains($srcs, source) AND list_contains($users, "user") '
        "AND list_contains($states, state) ORDER BY source, end_time, job_id",
        {"srcs": srcs, "users": users, "states": _SEQ_STATES},
    ).fetchall()
    for src, u, name, group, state in ended:
        book = books[str(src)]
        book.observe(book.key(streak_key(u, name, group, log_has_names=named[str(src)])), str(state))
    out: dict[str, list[HeldJob]] = defaultdict(list)
    for src, job_id, u, name, group, submitted in pending:
        k = streak_key(u, name, group, log_has_names=named.get(str(src), True))
        n = books[str(src)].count(k) if str(src) in books else 0
        if n >= HOLD_AFTER:
            out[str(u)].append(
                HeldJob(
                    str(src),
                    str(job_id),
                    name,
                    group,
                    n,
                    submitted.isoformat() if submitted is not None else None,
                )
            )
    return dict(out)


def suggested_limit(p95_runtime_s: float | None, median_limit_s: float, jobs: int) -> float | None:
    """The limit to suggest (the rule is in the constants above), or None when there is none worth it."""
    if p95_runtime_s is None or jobs < LIMIT_MIN_JOBS or not median_limit_s:
        return None
    s = max(math.ceil(p95_runtime_s * LIMIT_HEADROOM / LIMIT_STEP_S), 1) * LIMIT_STEP_S
    return s if s < LIMIT_WORTH_SHARE * median_limit_s else None


def over_asks_by_name(
    con: duckdb.DuckDBPyConnection, window: Window, users: list[str]
) -> dict[str, list[OverAsk]]:
    """The audit's over-asking users' successful GPU jobs by job name (the audit has them by user only):
    the names whose median job used under OVER_ASK_SHARE of its time limit, with a suggested limit."""
    params: dict[str, object] = {"users": users, "ok": _SUCCESS_STATES, "share": OVER_ASK_SHARE}
    where = _window_sql(window, params)
    used = "greatest(runtime, 0) / time_limit"
    rows = con.execute(
        "SELECT \"user\", nullif(name, '') AS nm, count(*) FILTER (time_limit > 0), "
        f"count(*) FILTER (time_limit > 0 AND {used} < $share), "
        f"quantile_cont({used}, 0.5) FILTER (time_limit > 0), "
        "quantile_cont(time_limit, 0.5) FILTER (time_limit > 0), count(*), "
        "quantile_cont(greatest(runtime, 0), 0.95) "
        'FROM jobs_v WHERE list_contains($users, "user") AND list_contains($ok, state) '
        f"AND coalesce(gpus, 0) > 0 AND runtime IS NOT NULL{where} "
        "GROUP BY ALL ORDER BY 1, 4 DESC, nm NULLS LAST",
        params,
    ).fetchall()
    out: dict[str, list[OverAsk]] = defaultdict(list)
    for u, name, n_lim, n_over, med_used, med_limit, n_ok, p95 in rows:
        if not n_lim or med_used is None or float(med_used) >= OVER_ASK_SHARE:
            continue
        p95_f = None if p95 is None else float(p95)
        out[str(u)].append(
            OverAsk(
                name=name,
                completed_jobs=int(n_lim),
                over_asking_jobs=int(n_over),
                median_used_share=float(med_used),
                median_limit_s=float(med_limit),
                p95_runtime_s=p95_f,
                suggested_limit_s=suggested_limit(p95_f, float(med_limit), int(n_ok)),
            )
        )
    return dict(out)


def waits_by_size(
    con: duckdb.DuckDBPyConnection, window: Window, users: list[str]
) -> dict[str, list[tuple[str, int, float]]]:
    """Per user: (GPU-count bucket, started jobs, median wait) for the audited GPU jobs, most jobs first
    (the audit has waits by user and by size, not by both). Buckets are the audit's own (`_SIZE_SQL`)."""
    params: dict[str, object] = {"users": users}
    where = _window_sql(window, params)
    rows = con.execute(
        f'SELECT "user", {_SIZE_SQL} AS b, count(*) AS n, quantile_cont(greatest(wait, 0), 0.5) '
        'FROM (SELECT "user", coalesce(gpus, 0) AS gpus, wait, submit_time FROM jobs_v) '
        f'WHERE list_contains($users, "user") AND gpus > 0 AND wait IS NOT NULL{where} '
        "GROUP BY ALL ORDER BY 1, n DESC, b",
        params,
    ).fetchall()
    out: dict[str, list[tuple[str, int, float]]] = defaultdict(list)
    for u, b, n, med in rows:
        out[str(u)].append((str(b), int(n), float(med)))
    return dict(out)


def _long(med: float | None, p90: float | None, c_med: float | None, c_p90: float | None) -> bool:
    by_median = med is not None and c_med is not None and med >= max(WAIT_FACTOR * c_med, WAIT_FLOOR_S)
    by_p90 = p90 is not None and c_p90 is not None and p90 >= max(WAIT_FACTOR * c_p90, WAIT_P90_FLOOR_S)
    return by_median or by_p90


def long_waits(
    con: duckdb.DuckDBPyConnection, window: Window, waiting: dict[str, Any], *, user: str | None = None
) -> dict[str, LongWait]:
    """The users whose waits are long against the cluster's (`waiting`: the audit's section), with the
    reason the data gives: the size they mostly ask for waits longer for everyone, or it does not."""
    overall = waiting["overall"]
    c_med, c_p90 = overall["median_s"], overall["p90_s"]
    if c_med is None:
        return {}
    flagged = {
        u: x
        for x in waiting["by_user"]
        if (u := _real_user(x["user"]))
        and (user is None or u == user)
        and x["jobs"] >= WAIT_MIN_JOBS
        and _long(x["median_s"], x["p90_s"], c_med, c_p90)
    }
    if not flagged:
        return {}
    cluster_size = {s["gpus"]: s["median_s"] for s in waiting["by_size"]}
    sizes = waits_by_size(con, window, sorted(flagged))
    out = {}
    for u, x in flagged.items():
        mine = sizes.get(u, [])
        size, size_jobs, size_med = mine[0] if mine else (None, 0, None)
        size_cluster = cluster_size.get(size) if size is not None else None
        reason = None
        if size_cluster is not None:
            slow = size_cluster >= max(WAIT_FACTOR * float(c_med), WAIT_FLOOR_S)
            reason = "size" if slow else "not_size"
        out[u] = LongWait(
            jobs=int(x["jobs"]),
            median_s=float(x["median_s"]),
            p90_s=float(x["p90_s"]),
            cluster_median_s=float(c_med),
            cluster_p90_s=float(c_p90),
            size=size,
            size_jobs=size_jobs,
            size_median_s=size_med,
            size_cluster_median_s=None if size_cluster is None else float(size_cluster),
            reason=reason,
        )
    return out
