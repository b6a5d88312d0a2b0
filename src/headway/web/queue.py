"""The live queue for the dashboard: the local daemon's (over its socket) or the Slurm adapter's last pass
(from the store's decision log), as one shape.

What a job shows is the same for every viewer of the web service: its id, user, name, GPUs, state, rank,
tier, prediction, estimated start and reason. Never its argv, working directory or environment: the web
has no logged-in user to be the job's owner, so everyone gets what the queue's own commands show to
other users (`local.views.sees_all`), and the fields are copied by name, not filtered out.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from headway.policy.snapshot import tier_of_reason

MAX_EXPLAINED = 200  # pending jobs asked `why` per refresh (in rank order); the rest show their rank only
QUEUE_TTL_S = 2.0  # a refresh within this of the last one is answered from it


@dataclass(frozen=True, slots=True)
class QueueJob:
    job_id: str
    user: str | None
    name: str | None
    gpus: float | None
    state: str  # PENDING or RUNNING (LAUNCHING counts as running)
    priority_class: str | None = None
    rank: int | None = None
    tier: str | None = None
    p_success: float | None = None
    runtime_s: float | None = None
    estimated_start: str | None = None
    reason: str | None = None  # in words: what `why` says
    where: str | None = None  # running: GPU ids or nodes
    submit_time: str | None = None
    start_time: str | None = None


@dataclass(slots=True)
class QueueView:
    adapter: str  # local, slurm, or none
    ok: bool
    as_of: str | None  # when the queue was read (ISO UTC)
    policy: str | None = None
    pending: list[QueueJob] = field(default_factory=list)
    running: list[QueueJob] = field(default_factory=list)
    gpus_total: int | None = None
    gpus_free: int | None = None
    error: str | None = None
    decision_id: int | None = None  # slurm: the logged pass shown

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pending_jobs"] = len(self.pending)
        d["running_jobs"] = len(self.running)
        return d


def _iso_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class LocalQueue:
    """The local daemon's queue, asked with the read-only verbs `ping`, `queue` and `why`."""

    adapter = "local"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._last: tuple[float, QueueView] | None = None

    def view(self) -> QueueView:
        if self._last is not None and time.monotonic() - self._last[0] < QUEUE_TTL_S:
            return self._last[1]
        v = self._read()
        self._last = (time.monotonic(), v)
        return v

    def _read(self) -> QueueView:
        from headway.local.client import ClientError, pages, request

        try:
            ping = request(self.state_dir, {"op": "ping"}, timeout=10.0)
            rows: list[dict[str, Any]] = []
            seen: set[int] = set()
            for page in pages(self.state_dir, {"op": "queue"}, timeout=10.0):
                for j in page.get("jobs") or ():
                    if j["id"] not in seen:
                        seen.add(j["id"])
                        rows.append(j)
            pending_rows = [j for j in rows if j["state"] == "PENDING"]
            whys: dict[int, dict[str, Any]] = {}
            for j in sorted(pending_rows, key=lambda j: (j.get("rank") is None, j.get("rank") or 0, j["id"])):
                if len(whys) >= MAX_EXPLAINED:
                    break
                try:
                    whys[j["id"]] = request(self.state_dir, {"op": "why", "id": j["id"]}, timeout=10.0)
                except ClientError:  # ended between the listing and this question
                    continue
        except (ClientError, OSError) as e:
            return QueueView("local", False, _iso_now(), error=str(e))
        gpu_ids = list(ping.get("gpu_ids") or ())
        busy = {g for j in rows if j["state"] != "PENDING" for g in (j.get("gpu_ids") or ())}
        view = QueueView(
            "local",
            True,
            _iso_now(),
            policy=ping.get("policy"),
            gpus_total=len(gpu_ids),
            gpus_free=len([g for g in gpu_ids if g not in busy]),
        )
        for j in rows:
            w = whys.get(j["id"], {})
            common: dict[str, Any] = {
                "job_id": str(j["id"]),
                "user": j.get("user"),
                "name": j.get("name"),
                "gpus": j.get("gpus"),
                "priority_class": j.get("priority"),
                "p_success": j.get("p_success"),
                "runtime_s": j.get("pred_runtime"),
                "submit_time": j.get("submit_time"),
                "start_time": j.get("start_time"),
            }
            if j["state"] == "PENDING":
                reason = "; ".join(w.get("explanation") or ()) or j.get("reason") or None
                view.pending.append(
                    QueueJob(
                        state="PENDING",
                        rank=w.get("rank", j.get("rank")),
                        tier=tier_of_reason(w.get("policy_reason")),
                        estimated_start=w.get("estimated_start"),
                        reason=reason,
                        **common,
                    )
                )
            else:
                ids = j.get("gpu_ids") or ()
                view.running.append(
                    QueueJob(
                        state="RUNNING", where="GPU " + ",".join(map(str, ids)) if ids else "no GPU", **common
                    )
                )
        view.pending.sort(key=lambda q: (q.rank is None, q.rank or 0, int(q.job_id)))
        return view


def slurm_view(record: Any) -> QueueView:
    """A logged Slurm pass (`decision_log.DecisionRecord`) as the queue it saw."""
    if record is None:
        return QueueView(
            "slurm",
            False,
            None,
            error="no `headway slurm sync --apply` pass in the store's decision log yet",
        )
    view = QueueView(
        "slurm",
        bool(record.ok),
        record.at.isoformat(timespec="seconds"),
        policy=record.policy,
        error=record.error,
        decision_id=record.id,
    )
    for r in record.ranking:
        view.pending.append(
            _logged_job(
                r,
                "PENDING",
                rank=r.get("rank"),
                tier=r.get("tier") or tier_of_reason(r.get("reason")),
                p_success=r.get("p_success"),
                runtime_s=r.get("runtime_s"),
                estimated_start=r.get("estimated_start"),
                reason=r.get("reason"),
            )
        )
    view.running.extend(_logged_job(r, "RUNNING", where=r.get("where")) for r in record.running)
    return view


def _logged_job(r: dict[str, Any], state: str, **more: Any) -> QueueJob:
    """A job of a logged pass, its fields copied by name (a field the log gains does not reach the web)."""
    return QueueJob(
        job_id=str(r.get("job_id")),
        user=r.get("user"),
        name=r.get("name"),
        gpus=r.get("gpus"),
        state=state,
        **more,
    )
