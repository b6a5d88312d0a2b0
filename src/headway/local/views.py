"""What clients are shown: job rows for `queue` and `history` in bounded pages, and the story behind `why`.

Who looks decides what is shown: a job's argv and working directory only to its owner and root (an
`--api-key=...` in a command line was everyone's to read), its environment to nobody.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from headway.local.core import TOO_BIG, JobState, LocalJob, Plan, QueueCore, RankEntry
from headway.local.db import ACTIVE, StateDB, parse_ids, path_of
from headway.local.protocol import (
    PAGE_BYTES,
    PAGE_JOBS,
    HistoryPage,
    JobRow,
    QueuePage,
    RequestError,
    WhyReply,
)

RECENT_SECONDS = 24 * 3600  # `queue --all` also lists jobs that ended this recently
_ENDED = f"state NOT IN ({', '.join(repr(s) for s in ACTIVE)})"


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(float(t), dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def sees_all(viewer: int, owner: int) -> bool:
    """Whether `viewer` (a uid) may see a job's argv and working directory: its owner and root may."""
    return viewer == 0 or viewer == owner


def job_row(
    r: sqlite3.Row | dict[str, Any], job: LocalJob | None = None, *, viewer: int = 0, rank: int | None = None
) -> JobRow:
    """The client-facing record of a job, as `viewer` may see it; the core's copy (if active) is fresher
    than the row."""
    d = dict(r)
    if job is not None:
        d.update(
            state=job.state.value,
            gpu_ids=",".join(map(str, job.gpu_ids)),
            start_time=job.start_time,
            end_time=job.end_time,
            exit_code=job.exit_code,
            reason=job.reason,
            p_success=job.p_success,
            pred_runtime=job.pred_runtime,
            cancel_requested=job.cancel_requested,
            preemptible=job.preemptible,
            preemptions=job.preemptions,
            last_preempted=job.last_preempted,
            preempt_requested=job.preempt_requested,
        )
    state = JobState(d["state"])
    # A running job told to stop (cancelled or preempted) shows Slurm's CG (completing) through its grace
    # period, not R.
    told = bool(d.get("cancel_requested")) or bool(d.get("preempt_requested"))
    stopping = state.active and state is not JobState.PENDING and told
    mine = sees_all(viewer, int(d["uid"]))
    return JobRow(
        id=int(d["id"]),
        name=d["name"],
        user=d["user"],
        state=state.value,
        st="CG" if stopping else state.short,
        exit_code=d["exit_code"],
        gpus=int(d["gpus"]),
        gpu_ids=parse_ids(d["gpu_ids"]),
        submit_time=iso(d["submit_time"]),
        start_time=iso(d["start_time"]),
        end_time=iso(d["end_time"]),
        time_limit=d["time_limit"],
        priority=d["priority"],
        after=d["after"],
        reason=d["reason"],
        p_success=d["p_success"],
        pred_runtime=d["pred_runtime"],
        command=tuple(json.loads(d["argv"])) if mine else None,
        cwd=path_of(d["cwd"]) if mine else None,
        submit_ts=d["submit_time"],
        start_ts=d["start_time"],
        end_ts=d["end_time"],
        rank=rank if state is JobState.PENDING else None,
        preemptible=bool(d.get("preemptible")),
        checkpoint_every=d.get("checkpoint_every"),
        attempt=int(d.get("preemptions") or 0) + 1,
        preemptions=int(d.get("preemptions") or 0),
        last_preempted=iso(d.get("last_preempted")),
    )


def fill_page(
    rows: Iterable[JobRow], most: int = PAGE_JOBS, budget: int = PAGE_BYTES
) -> tuple[list[JobRow], bool]:
    """Rows until the page holds `most` of them or `budget` bytes of JSON (at least one row), and whether
    rows were left over. A reply never grows with the queue, however large the commands in it: five
    14 MB argvs made every user's `queue` fail with "reply from the daemon is too large"."""
    page: list[JobRow] = []
    size = 0
    for row in rows:
        if len(page) >= most:
            return page, True
        n = len(json.dumps(row.to_wire()))
        if page and size + n > budget:
            return page, True
        page.append(row)
        size += n
    return page, False


class JobViews:
    def __init__(self, db: StateDB, core: QueueCore) -> None:
        self.db = db
        self.core = core

    def _places(self) -> dict[int, int]:
        """Each pending job's place in the last plan's order among the jobs still pending (1 starts
        next): a job that started since that plan no longer counts ahead of the rest."""
        plan = self.core.last_plan
        if plan is None:
            return {}
        jobs = self.core.jobs
        still = (e for e in sorted(plan.ranking, key=lambda e: e.rank) if e.job_id in jobs)
        pending = (e.job_id for e in still if jobs[e.job_id].state is JobState.PENDING)
        return {jid: k for k, jid in enumerate(pending, 1)}

    def queue_ids(self, include_ended: bool = False, now: float | None = None) -> list[int]:
        """Running jobs first (by id), then pending ones in the order they will start (their rank), then
        (`include_ended`) those ended in the last 24 h. Ids only: the rows are read a page at a time."""
        places = self._places()
        active = list(self.core.jobs.values())
        running = sorted(j.id for j in active if j.state is not JobState.PENDING)

        def order(j: LocalJob) -> tuple[bool, int, int]:
            place = places.get(j.id)
            return (place is None, place or 0, j.id)

        pending = [j.id for j in sorted((j for j in active if j.state is JobState.PENDING), key=order)]
        ids = running + pending
        if include_ended:
            since = (now if now is not None else dt.datetime.now(dt.UTC).timestamp()) - RECENT_SECONDS
            cur = self.db.con.execute(
                f"SELECT id FROM jobs WHERE {_ENDED} AND end_time >= ? ORDER BY end_time", (since,)
            )
            ids += [int(r[0]) for r in cur]
        return ids

    def queue_page(
        self, viewer: int, include_ended: bool = False, cursor: int = 0, now: float | None = None
    ) -> QueuePage:
        """One page of the queue from position `cursor`. Pages are read one after another, not as one
        snapshot: a job that moves up between two of them may show twice (clients keep its first)."""
        ids = self.queue_ids(include_ended, now)
        window = ids[cursor : cursor + PAGE_JOBS]
        places = self._places()
        active = self.core.jobs

        def rows() -> Iterator[JobRow]:
            for k in range(0, len(window), 50):  # a few rows at a time: each may hold 128 KiB of argv
                batch = window[k : k + 50]
                got = {int(r["id"]): r for r in self.db.rows(f"id IN ({','.join(map(str, batch))})")}
                for jid in batch:
                    if (r := got.get(jid)) is not None:
                        yield job_row(r, active.get(jid), viewer=viewer, rank=places.get(jid))

        page, more = fill_page(rows())
        end = cursor + window.index(page[-1].id) + 1 if more else cursor + len(window)
        return QueuePage(tuple(page), self.core.gpu_ids, end if end < len(ids) else None)

    def history_page(
        self,
        viewer: int,
        limit: int = 100,
        user: str | None = None,
        cursor: tuple[float, int] | None = None,
    ) -> HistoryPage:
        """Ended jobs, most recent first, after `cursor` (the end time and id of the last job of the page
        before): at most `limit` of them (0: all), and at most one page. The rows are read lazily, so a
        page of large jobs reads only what it sends."""
        where = _ENDED
        params: list[Any] = []
        if user:
            where += " AND user = ?"
            params.append(user)
        if cursor is not None:
            where += " AND (COALESCE(end_time, 0) < ? OR (COALESCE(end_time, 0) = ? AND id < ?))"
            params += [cursor[0], cursor[0], cursor[1]]
        q = f"SELECT * FROM jobs WHERE {where} ORDER BY COALESCE(end_time, 0) DESC, id DESC"
        if limit:
            q += f" LIMIT {int(limit)}"
        cur = self.db.con.execute(q, params)
        try:
            page, more = fill_page(
                (job_row(r, viewer=viewer) for r in cur), most=min(PAGE_JOBS, limit or PAGE_JOBS)
            )
        finally:
            cur.close()
        last = page[-1] if more and page else None
        return HistoryPage(tuple(page), (float(last.end_ts or 0.0), last.id) if last else None)

    def why(self, viewer: int, job_id: int, now: float) -> WhyReply:
        row = self.db.row(job_id)
        if row is None:
            raise RequestError(f"no job {job_id}")
        job = self.core.jobs.get(job_id)
        d = job_row(row, job, viewer=viewer)
        plan = self.core.last_plan
        lines: list[str] = [f"priority class: {d.priority}"]
        out: dict[str, Any] = {}
        state = JobState(d.state)
        if state is JobState.PENDING:
            out.update(self._why_pending(job_id, job, plan, now, lines))
        elif state in (JobState.LAUNCHING, JobState.RUNNING):
            gpus = f"GPUs {','.join(map(str, d.gpu_ids))}" if d.gpu_ids else "no GPU"
            lines.append(f"running since {d.start_time or 'just now'} on {gpus}")
            if job is not None and job.start_time is not None:
                lines.extend(survival_words(job, now))
            out.update(self._why_started(row, lines))
        else:
            lines.append(f"ended {state.value} at {d.end_time}" + (f": {d.reason}" if d.reason else ""))
            out.update(self._why_started(row, lines))
        lines.extend(preemption_words(d, job, plan))
        if d.p_success is not None:
            lines.append(
                f"predicted: {100 * d.p_success:.0f}% chance to complete, "
                f"median runtime ~{_dur(d.pred_runtime)} if it does"
            )
        if state is JobState.PENDING and out.get("rank") is not None:
            d = dataclasses.replace(d, rank=out["rank"])
        return WhyReply(job=d, policy=plan.policy if plan else None, explanation=tuple(lines), **out)

    def _why_pending(
        self, job_id: int, job: LocalJob | None, plan: Plan | None, now: float, lines: list[str]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": None,
            "of": None,
            "score": None,
            "factors": {},
            "estimated_start": None,
        }
        if job is not None and job.reason == "Dependency":
            lines.append(f"waits for job {job.after} to complete (--after)")
            out["waits_for"] = f"job {job.after}"
            return out
        if job is not None and job.reason == TOO_BIG:
            n = len(self.core.gpu_ids)
            lines.append(
                f"asks for {job.gpus} GPUs and this daemon hands out {n}: it starts only under a daemon with "
                "enough GPUs (cancel it, or restart the daemon with more)"
            )
            out["waits_for"] = f"a daemon with {job.gpus} GPUs"
            return out
        entry = next((e for e in plan.ranking if e.job_id == job_id), None) if plan else None
        if plan is None or entry is None:
            lines.append("not ranked yet (the next scheduling pass will rank it)")
            return out
        if job is not None and job.reason == "Held":
            from headway.local.ordering import fail_streak

            book = getattr(self.core.planner, "book", None)
            streak = fail_streak(book, job.user, job.name) if book is not None else 0
            lines.append(
                f"held: {job.user}'s jobs named {job.name!r} failed {streak} times in a row with no success "
                "since; it is ranked after the jobs that are not held until one of those completes"
            )
        n = len(plan.ranking)
        out.update(
            rank=entry.rank, of=n, score=entry.score, factors=dict(entry.factors), policy_reason=entry.reason
        )
        lines.append(f"rank {entry.rank} of {n} pending under the {plan.policy} policy")
        lines.extend(factor_words(entry))
        free = len(self.core.free_gpu_ids())
        gpus = job.gpus if job else 0
        if entry.rank > 1:
            ahead = [e.job_id for e in plan.ranking if e.rank < entry.rank]
            lines.append(f"waits for {len(ahead)} job(s) ranked ahead of it: {_list(ahead)}")
            out["waits_for"] = f"{len(ahead)} job(s) ranked ahead"
        else:
            lines.append(f"next in line; waits for GPUs: needs {gpus}, {free} free now")
            out["waits_for"] = f"{gpus} GPU(s); {free} free"
        est = plan.estimated_start.get(job_id)
        if plan.reservation and plan.reservation[0] == job_id:
            est = plan.reservation[1]
        if est is not None and est == est and est != float("inf"):
            out["estimated_start"] = iso(max(est, now))
            lines.append(f"estimated start: {iso(max(est, now))} (in ~{_dur(max(est - now, 0.0))})")
        else:
            lines.append("estimated start: unknown (running jobs have no predicted end)")
        return out

    def _why_started(self, row: sqlite3.Row, lines: list[str]) -> dict[str, Any]:
        did = row["decision_id"]
        if did is None:
            return {}
        dec = self.db.decision(int(did))
        if dec is None:
            return {}
        ranking = json.loads(dec["ranking"])
        me = next((e for e in ranking if e["job_id"] == row["id"]), None)
        if me is None:
            return {"decision_id": did}
        label = dec["decision"] or dec["policy"]
        lines.append(f"started by decision {did} ({label}) at rank {me['rank']} of {len(ranking)}")
        entry = RankEntry(me["job_id"], me["rank"], me["score"], me["factors"], me["reason"])
        lines.extend(factor_words(entry))
        return {
            "decision_id": did,
            "rank": me["rank"],
            "of": len(ranking),
            "score": me["score"],
            "factors": me["factors"],
        }


def survival_words(job: LocalJob, now: float) -> list[str]:
    """How long a running job has run, and what its predictions say given that it has (policy/survival.py):
    its chance to complete now that it has run this long, and its expected remaining runtime."""
    ran = max(0.0, now - float(job.start_time or now))
    lines = [f"has run {_dur(ran)} (this run)"]
    if job.p_success is None or job.pred_runtime is None:
        return lines
    import numpy as np

    from headway.policy.survival import expected_remaining, p_complete_after

    def col(x: float | None, default: float) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
        return np.array([default if x is None else float(x)], dtype=np.float64)

    args = (
        col(ran, 0.0),
        col(job.p_success, np.nan),
        col(job.pred_runtime, np.nan),
        col(job.pred_runtime_p90, job.pred_runtime),
        col(job.pred_ttf, job.pred_runtime),
    )
    pc = float(p_complete_after(*args)[0])
    rem = float(expected_remaining(*args)[0])
    if pc == pc and rem == rem:
        lines.append(f"P(complete | ran {_dur(ran)}) = {pc:.2f}, expected remaining {_dur(rem)}")
    return lines


def preemption_words(d: JobRow, job: LocalJob | None, plan: Plan | None) -> list[str]:
    """Whether the job may be preempted, its run number, and what a pending job's start waits for."""
    lines = []
    if d.preemptible:
        every = d.checkpoint_every
        hint = f"checkpoints every {_dur(every)}" if every else "checkpoint interval not given (default)"
        lines.append(f"preemptible: a higher class may stop it and requeue it ({hint})")
    if d.attempt > 1:
        lines.append(f"run {d.attempt}: preempted {d.preemptions} time(s), last at {d.last_preempted}")
    if job is not None and job.preempt_requested:
        lines.append("being preempted: told to stop (SIGTERM, then SIGKILL after the grace); requeued then")
    victims = plan.waits_for_preempted.get(d.id) if plan is not None else None
    if victims and d.state == JobState.PENDING.value:
        lines.append(f"starts once preempted job(s) {_list(list(victims))} have stopped")
    return lines


_WORDS: dict[str, tuple[str, Callable[[float], str]]] = {
    "p": ("chance to complete (p)", lambda v: f"{100 * v:.0f}%"),
    "R_h": ("expected runtime if it completes (R, the mean)", lambda v: _dur(v * 3600)),
    "F_h": ("predicted time to failure if it fails (F)", lambda v: _dur(v * 3600)),
    "c_gpu_h": ("expected GPU-hours it will take (c)", lambda v: f"{v:.3g}"),
    "w": ("priority-class weight (w)", lambda v: f"{v:g}"),
    "fairshare": ("fair-share factor of its user", lambda v: f"{v:.2f} (1 = no recent usage)"),
    "waited_h": ("waited so far", lambda v: _dur(v * 3600)),
    "age": ("age factor", lambda v: f"{v:.2f}"),
    "size": ("size factor", lambda v: f"{v:.2f}"),
    "pred_gpu_h": ("predicted GPU-hours", lambda v: f"{v:.3g}"),
    "pred_runtime_h": ("predicted runtime", lambda v: _dur(v * 3600)),
}


def factor_words(entry: RankEntry) -> list[str]:
    """The policy's tier and score, then each factor as a phrase (unknown ones as name = value)."""
    lines = []
    if entry.reason:
        # "TIER; score S (FACTORS)": the factors follow as phrases. Only that last part goes: a tier's name
        # has words in parentheses of its own ("held (repeat failures)").
        words = entry.reason
        if words.endswith(")") and "; score " in words:
            words = words.rsplit(" (", 1)[0]
        lines.append(f"tier and score: {words}")
    for k, v in entry.factors.items():
        if v != v:  # NaN: not used by this policy
            continue
        if k in _WORDS:
            label, fmt = _WORDS[k]
            lines.append(f"  {label}: {fmt(float(v))}")
        else:
            lines.append(f"  {k} = {float(v):.4g}")
    return lines


def _dur(s: float | None) -> str:
    if s is None or s != s:
        return "?"
    s = float(s)
    if s < 90:
        return f"{s:.0f}s"
    if s < 5400:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _list(ids: list[int], n: int = 8) -> str:
    shown = ", ".join(str(i) for i in ids[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")
