"""Client verbs of the local queue: `submit`, `queue`, `why`, `cancel`, `logs`, `history`, `gpus`.

Each talks to the daemon over its Unix socket (found through --state-dir or $HEADWAY_STATE_DIR); the
daemon learns who is asking from the socket itself, so these commands carry no identity of their own.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from headway.commands.daemon import StateDirOpt
from headway.console import err, fail, out, plain, print_json, print_table, printable, safe_escape
from headway.local.client import ClientError, DaemonUnreachable, pages, request
from headway.local.durations import format_elapsed, parse_duration
from headway.local.paths import resolve_state_dir
from headway.local.protocol import RequestError, Submit

if TYPE_CHECKING:
    from rich.table import Table

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON only (for scripts).")]
# `headway submit -- CMD ARGS...`: options stop at the command, so its own flags are never ours.
SUBMIT_SETTINGS: dict[str, Any] = {"allow_interspersed_args": False}
# How long `logs -f` waits for a daemon that went away (a restart takes seconds; the job runs on).
FOLLOW_RECONNECT_S = 300.0


def _ask(state_dir: Path | None, msg: dict[str, Any] | Submit) -> dict[str, Any]:
    try:
        return request(resolve_state_dir(state_dir), msg)
    except ClientError as e:
        fail(str(e))


def _jobs(state_dir: Path | None, msg: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A listing's jobs over all its pages (a job seen twice, as it moved up between pages, once), and
    its first page (which carries the rest of the reply)."""
    jobs: list[dict[str, Any]] = []
    seen: set[int] = set()
    first: dict[str, Any] | None = None
    try:
        for page in pages(resolve_state_dir(state_dir), msg):
            first = first or page
            for j in page["jobs"]:
                if j["id"] not in seen:
                    seen.add(j["id"])
                    jobs.append(j)
    except ClientError as e:
        fail(str(e))
    assert first is not None
    return jobs, first


def _table() -> Table:
    from rich.table import Table  # only the verbs that print one pay for it

    return Table(box=None, pad_edge=False, header_style="bold")


def submit(
    command: Annotated[
        list[str], typer.Argument(help="The command and its arguments (after --).", show_default=False)
    ],
    gpus: Annotated[int, typer.Option(help="GPUs the job needs (0 for a CPU-only job).")] = 1,
    time_limit: Annotated[
        str | None,
        typer.Option("--time", help="Time limit: 30m, 2h, HH:MM:SS, D-HH:MM:SS (a bare number is minutes)."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: the command's name).")] = None,
    priority: Annotated[str, typer.Option(help="low, normal, high or urgent.")] = "normal",
    after: Annotated[
        int | None, typer.Option(help="Start only after this job COMPLETED (cancelled if it fails).")
    ] = None,
    preemptible: Annotated[
        bool,
        typer.Option(
            "--preemptible",
            help="A higher class may stop this job (SIGTERM, a grace, SIGKILL); it is requeued under the "
            "same id and resumes from its last checkpoint.",
        ),
    ] = False,
    checkpoint_every: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-every",
            help="How often the job saves its progress, in seconds (or 30m, 2h): a hint for preemption "
            "(default: 1800).",
        ),
    ] = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue a command; it runs in this directory with this environment when its GPUs are free.

    Example: headway submit --gpus 2 --time 4h --name train -- python train.py --lr 3e-4
    """
    if not command:
        fail("nothing to run: headway submit [OPTIONS] -- CMD ARGS...")
    if gpus < 0:
        fail("--gpus must be >= 0")
    limit = None
    if time_limit is not None:
        try:
            limit = parse_duration(time_limit)
        except ValueError as e:
            fail(str(e))
    every = None
    if checkpoint_every is not None:
        try:  # a bare number is seconds here (unlike --time, where it is minutes, as in sbatch)
            text = checkpoint_every.strip()
            every = float(text) if text.isdigit() else parse_duration(text)
        except ValueError as e:
            fail(f"--checkpoint-every: {e}")
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        fail("the current directory no longer exists (deleted?): cd to one the job can run in")
    try:  # the daemon's own checks, here first: a 14 MB argv is refused before it is sent
        req = Submit.from_wire(
            {
                "argv": list(command),
                "cwd": cwd,
                "env": dict(os.environ),
                "gpus": gpus,
                "time_limit": limit,
                "name": name,
                "priority": priority,
                "after": after,
                "preemptible": preemptible,
                "checkpoint_every": every,
            }
        )
    except RequestError as e:
        fail(str(e))
    reply = _ask(state_dir, req)
    if as_json:
        print_json({"id": reply["id"], "name": reply["name"], "user": reply["user"]})
    else:
        out.print(plain(f"Submitted job {reply['id']} ({reply['name']})"))  # a name such as '[/]' as written


def _elapsed(j: dict[str, Any], now: float) -> str:
    if j.get("start_ts") is None:
        return "0:00"
    end = j.get("end_ts") or now
    return format_elapsed(end - j["start_ts"])


def _pct(p: float | None) -> str:
    return "-" if p is None else f"{100 * p:.0f}%"


def _preempt_cell(j: dict[str, Any]) -> str:
    """`yes` for a preemptible job, with its run number once it was preempted (`yes, run 2`)."""
    word = "yes" if j.get("preemptible") else "no"
    run = int(j.get("attempt") or 1)
    return f"{word}, run {run}" if run > 1 else (word if word == "yes" else "-")


def _shows_preemption(jobs: list[dict[str, Any]]) -> bool:
    """Whether a listing needs the PREEMPT column: only when a job in it is preemptible or was preempted."""
    return any(j.get("preemptible") or int(j.get("attempt") or 1) > 1 for j in jobs)


def _public(j: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of a job: everything except internal epoch duplicates."""
    return {k: v for k, v in j.items() if k not in ("submit_ts", "start_ts", "end_ts", "st")}


def queue(
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list jobs that ended in the last 24 hours.")
    ] = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Running and pending jobs, pending ones in the order they will start (rank), with P(complete)."""
    jobs, reply = _jobs(state_dir, {"op": "queue", "all": show_all})
    if as_json:
        print_json([_public(j) for j in jobs])
        return
    now = time.time()
    t = _table()
    preempt_col = _shows_preemption(jobs)
    cols = ("JOBID", "NAME", "USER", "ST", "TIME", "GPUS", "REASON", "RANK", "P(OK)")
    for col in (*cols, "PREEMPT") if preempt_col else cols:
        t.add_column(
            col,
            justify="right" if col in ("JOBID", "TIME", "GPUS", "RANK", "P(OK)") else "left",
            no_wrap=True,
        )
    for j in jobs:
        if j["state"] in ("RUNNING", "LAUNCHING"):
            reason = "gpu:" + ",".join(map(str, j["gpu_ids"])) if j["gpu_ids"] else "-"
        elif j["state"] == "PENDING":
            reason = j["reason"] or "-"
        else:
            reason = j["state"] + (f"({j['exit_code']})" if j["exit_code"] not in (None, 0) else "")
        cells = [  # names, users and reasons as written, never as markup
            str(j["id"]),
            plain(j["name"][:24]),
            plain(j["user"]),
            j["st"],
            _elapsed(j, now),
            str(j["gpus"]),
            plain(reason),
            str(j["rank"]) if j.get("rank") else "-",
            _pct(j["p_success"]),
        ]
        t.add_row(*cells, *([_preempt_cell(j)] if preempt_col else []))
    print_table(t)
    n_run = sum(1 for j in jobs if j["state"] in ("RUNNING", "LAUNCHING"))
    n_pend = sum(1 for j in jobs if j["state"] == "PENDING")
    out.print(f"{n_run} running, {n_pend} pending on {len(reply['gpu_ids'])} GPU(s)")


def why(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why a job is where it is: rank, impact factors in words, what it waits for, estimated start."""
    reply = _ask(state_dir, {"op": "why", "id": job_id})
    reply.pop("ok", None)
    if as_json:
        reply["job"] = _public(reply["job"])
        print_json(reply)
        return
    j = reply["job"]
    from rich.text import Text

    out.print(
        Text.assemble(
            (f"job {j['id']}", "bold"),
            printable(f" ({j['name']}, {j['user']}, {j['gpus']} GPU(s)): {j['state']}"),
        )
    )
    for line in reply["explanation"]:
        out.print(("  " if not line.startswith("  ") else "") + printable(line), markup=False, soft_wrap=True)


def cancel(
    job_ids: Annotated[list[int], typer.Argument(help="Job id(s) to cancel.", show_default=False)],
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel your jobs (root: anyone's). A running job gets SIGTERM, then SIGKILL after the grace.

    Every id is tried, as scancel does; each gets its own line (or JSON entry), and the command exits 1
    if any could not be cancelled."""
    sd = resolve_state_dir(state_dir)
    results: list[dict[str, Any]] = []
    gone: str | None = None  # the daemon stopped answering: the ids after it are not tried
    for jid in job_ids:
        if gone is not None:
            results.append({"id": jid, "state": None, "note": None, "error": f"not tried: {gone}"})
            continue
        try:
            r = request(sd, {"op": "cancel", "id": jid})
            results.append({"id": r["id"], "state": r["state"], "note": r.get("note"), "error": None})
        except DaemonUnreachable as e:
            if not results:
                fail(str(e))  # no daemon at all: no id can be cancelled
            gone = str(e)
            results.append({"id": jid, "state": None, "note": None, "error": gone})
        except ClientError as e:
            results.append({"id": jid, "state": None, "note": None, "error": str(e)})
    if as_json:
        print_json(results)
    else:
        for r in results:
            if r["error"]:
                err.print(f"[bold red]error:[/] {safe_escape(r['error'])}", markup=True, highlight=False)
            else:
                out.print(plain(r["note"] or f"job {r['id']}: cancel requested ({r['state']})"))
    if any(r["error"] for r in results):
        raise typer.Exit(1)


def logs(
    job_id: Annotated[int, typer.Argument(help="Job id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    stderr: Annotated[
        bool, typer.Option("--stderr", help="Show the job's stderr instead of its stdout.")
    ] = False,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's output (only your own jobs; root may read all)."""
    if follow and as_json:
        fail("--follow streams text; it cannot be combined with --json")
    stream = "err" if stderr else "out"
    offset = 0
    # --json streams the text as it arrives (a 300 MB log took 1.6 GB when gathered first); the state,
    # known at the last reply, comes after it.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    json_head = f'{{"id": {job_id}, "stream": "{stream}", "text": "'
    opened = False
    lost_at: float | None = None  # when a followed daemon stopped answering
    reached = False  # no daemon at the first request is an error at once, not a restart to wait out
    said_pending = False
    while True:
        msg = {"op": "logs", "id": job_id, "stream": stream, "offset": offset}
        try:
            r = request(resolve_state_dir(state_dir), msg)
        except DaemonUnreachable as e:
            if not follow or not reached:
                fail(str(e))
            # A restarted daemon adopts the running job and its log files, so following goes on after it.
            if lost_at is None:
                lost_at = time.monotonic()
                err.print(
                    "headway: the daemon is not answering (restarting?); waiting for it to come back "
                    f"for up to {FOLLOW_RECONNECT_S / 60:.0f} minutes (the job keeps running)",
                    soft_wrap=True,
                )
            elif time.monotonic() - lost_at > FOLLOW_RECONNECT_S:
                fail(f"{e}; stopped following after {FOLLOW_RECONNECT_S / 60:.0f} minutes without a daemon")
            time.sleep(1.0)
            continue
        except ClientError as e:
            fail(str(e))
        reached = True
        if lost_at is not None:
            err.print("headway: the daemon is back; following on", soft_wrap=True)
            lost_at = None
        data = base64.b64decode(r["data"])
        offset = int(r["offset"])
        if not r.get("started", True) and not data and not said_pending:
            said_pending = True  # printing nothing read as "it ran and wrote nothing"
            if r["ended"]:
                note = f"job {job_id} ended {r['state']} without starting"
            else:
                note = f"job {job_id} has not started yet ({r['state']})"
                note += "; following it until it starts" if follow else ""
            err.print(f"headway: {note}", soft_wrap=True)
        if as_json:
            sys.stdout.write(("" if opened else json_head) + json.dumps(decoder.decode(data))[1:-1])
            opened = True
        elif data:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        if data and offset < int(r["size"]):
            continue  # more already written: read on without waiting
        if not follow or r["ended"]:
            if follow and r["ended"] and offset < int(r["size"]):
                continue
            break
        time.sleep(0.5)
    if as_json:
        tail = json.dumps(decoder.decode(b"", final=True))[1:-1]
        sys.stdout.write(("" if opened else json_head) + f'{tail}", "state": {json.dumps(r["state"])}}}\n')
        sys.stdout.flush()
    elif follow and offset == 0 and r.get("started", True):  # nothing came: say why it ended at once
        err.print(
            f"headway: job {job_id} ended {r['state']} with no {'stderr' if stderr else 'output'}",
            soft_wrap=True,
        )


def local_stamps(times: list[float]) -> tuple[str, list[str]]:
    """The SUBMIT column's header and cells in local time, with the zone said once in the header, or on
    each row when the rows span more than one (a change to or from summer time): a bare local time
    read as UTC, or the other way round, puts a job hours off."""
    local = [time.localtime(t) for t in times]
    zones = {lt.tm_zone for lt in local}
    if len(zones) <= 1:
        zone = next(iter(zones)) if zones else time.strftime("%Z")
        return f"SUBMIT ({zone})", [time.strftime("%m-%d %H:%M:%S", lt) for lt in local]
    return "SUBMIT", [time.strftime("%m-%d %H:%M:%S %Z", lt) for lt in local]


def history(
    limit: Annotated[int, typer.Option(help="How many ended jobs to show (most recent first); 0: all.")] = 50,
    user: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ended jobs with their final state, exit code, GPUs and times (most recent first)."""
    if limit < 0:
        fail("--limit must be >= 0")
    jobs, _ = _jobs(state_dir, {"op": "history", "limit": limit, "user": user})
    if as_json:
        print_json([_public(j) for j in jobs])
        return
    t = _table()
    submit_col, submitted = local_stamps([j["submit_ts"] for j in jobs])
    preempt_col = _shows_preemption(jobs)
    cols = ("JOBID", "NAME", "USER", "STATE", "EXIT", "GPUS", "GPU_IDS", submit_col, "ELAPSED", "WAIT")
    for col in (*cols, "PREEMPT") if preempt_col else cols:
        t.add_column(
            col,
            justify="right" if col in ("JOBID", "EXIT", "GPUS", "ELAPSED", "WAIT") else "left",
            no_wrap=True,
        )
    for j, stamp in zip(jobs, submitted, strict=True):
        wait = "-"
        if j.get("start_ts") is not None:
            wait = format_elapsed(j["start_ts"] - j["submit_ts"])
        t.add_row(
            str(j["id"]),
            plain(j["name"][:24]),
            plain(j["user"]),
            j["state"],
            "-" if j["exit_code"] is None else str(j["exit_code"]),
            str(j["gpus"]),
            ",".join(map(str, j["gpu_ids"])) or "-",
            stamp,
            _elapsed(j, time.time()) if j.get("start_ts") is not None else "-",
            wait,
            *([_preempt_cell(j)] if preempt_col else []),
        )
    print_table(t)


def gpus(state_dir: StateDirOpt = None, as_json: JsonOpt = False) -> None:
    """The daemon's GPUs: index, model, and free or busy (with the job, its user and name)."""
    rows = _ask(state_dir, {"op": "gpus"})["gpus"]
    if as_json:
        print_json(rows)
        return
    t = _table()
    for col in ("GPU", "MODEL", "STATE", "JOBID", "USER", "NAME"):
        t.add_column(col, justify="right" if col in ("GPU", "JOBID") else "left", no_wrap=True)
    for g in rows:
        t.add_row(
            str(g["index"]),
            plain(g["model"]),
            g["state"],
            "-" if g["job"] is None else str(g["job"]),
            plain(g["user"] or "-"),
            plain((g["name"] or "-")[:24]),
        )
    print_table(t)
    busy = sum(1 for g in rows if g["state"] != "free")
    out.print(f"{len(rows) - busy} free, {busy} busy of {len(rows)} GPU(s)")
