"""Reading Slurm's queue, nodes and priorities: `squeue --json` (or `squeue -O` text), `sinfo`, `sprio`.

Parsers are pure functions of the command's text so they are tested on real Slurm 22.05 output.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from headway.slurm.runner import Runner, SlurmError
from headway.traces.sacct_json import unwrap


class ParseError(SlurmError):
    """Slurm printed something headway cannot read; str() names the command and what was wrong."""


@dataclass(frozen=True, slots=True)
class QueueJob:
    """A pending or running job as squeue shows it (times in epoch seconds)."""

    job_id: str
    state: str  # PENDING or RUNNING
    user: str | None
    account: str | None
    name: str | None
    partition: str | None
    qos: str | None
    submit_time: float
    start_time: float | None  # running jobs only
    gpus: float  # total GPUs requested
    nodes: int
    time_limit: float | None  # seconds; None when unlimited
    priority: int | None
    reason: str | None = None  # Slurm's pending reason (Priority, Resources, JobHeldUser, Dependency, ...)
    # Slurm's own name for the job where it differs from job_id: `19_[4-9]` for the pending tasks of array
    # 19 (one record, one priority: `scontrol update JobId=19` sets them all), `19_0` for a started task,
    # `7+1` for component 1 of heterogeneous job 7.
    slurm_id: str | None = None
    tasks: int = 1  # pending tasks this record stands for (an array's), each asking for `gpus`

    @property
    def display_id(self) -> str:
        return self.slurm_id or self.job_id

    @property
    def held(self) -> bool:
        """Held by its user or an admin (`scontrol hold`, `sbatch -H`, ...): Slurm gives such a job
        priority 0 and `sprio` leaves it out, so its SiteFactor cannot be read until it is released."""
        return self.state == "PENDING" and ((self.reason or "").startswith("JobHeld") or self.priority == 0)

    @property
    def cannot_start(self) -> bool:
        """Held, or waiting on another job or a begin time: no priority makes it start now."""
        return self.held or (self.reason or "").startswith(CANNOT_START_REASONS)


# Pending reasons of jobs that cannot start whatever their priority (sprio does not even list most of
# them); JobArrayTaskLimit: an array's throttle (`--array=0-9%2`) holds its tasks until a sibling ends.
CANNOT_START_REASONS = (
    "JobHeld",
    "Dependency",
    "BeginTime",
    "PartitionDown",
    "PartitionInactive",
    "JobArrayTaskLimit",
)


@dataclass(frozen=True, slots=True)
class NodeGpus:
    name: str
    gpus: int
    used: int
    state: str


@dataclass(frozen=True, slots=True)
class SprioLine:
    """One row of `sprio -l`: the job's priority and each factor, as Slurm computed them."""

    job_id: str
    user: str | None
    priority: int
    factors: dict[str, float]  # column name (lower case) -> value, e.g. site, age, fairshare, partition
    partition: str | None = None  # a job pending in several partitions has one line (one priority) each


_GRES_TOTAL = re.compile(r"(?:^|,)gres/gpu=(\d+(?:\.\d+)?)")
_GRES_SPEC = re.compile(r"gres[:/]gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")
_STATES = ("PENDING", "RUNNING")


def _gres_count(spec: str | None) -> int:
    if not spec or spec in ("N/A", "(null)"):
        return 0
    return sum(int(m) for m in _GRES_SPEC.findall(spec))


def gpus_from_tres(
    req: str | None,
    per_node: str | None,
    per_job: str | None,
    nodes: int,
    *,
    per_task: str | None = None,
    tasks: int = 1,
    per_socket: str | None = None,
) -> float:
    """Total GPUs a job asks for: tres_req `gres/gpu=N` (a total), else per-job, else per-node x nodes,
    else per-task x tasks, else per-socket x nodes (one socket each at least: squeue does not say how many
    a pending job gets)."""
    if req:
        m = _GRES_TOTAL.search(req)
        if m:
            return float(m.group(1))
    for count, times in (
        (_gres_count(per_job), 1),
        (_gres_count(per_node), max(nodes, 1)),
        (_gres_count(per_task), max(tasks, 1)),
        (_gres_count(per_socket), max(nodes, 1)),
    ):
        if count:
            return float(count * times)
    return 0.0


_TASK_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def _task_ranges(spec: str) -> list[tuple[int, int, int]] | None:
    """Slurm's task list (`4-9`, `1-3,7`, `0-99:2%10`; `%` throttles) as (first, last, step) ranges;
    None for a form this reader does not know."""
    out = []
    for part in spec.split("%", 1)[0].strip().strip("[]").split(","):
        m = _TASK_RANGE.match(part.strip())
        if m is None:
            return None
        lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        out.append((lo, hi, max(step, 1)))
    return out


def array_task_count(spec: str) -> int:
    """How many tasks a task list names: `4-9` 6, `1-3,7` 4, `0-99:2%10` 50 (1 for an unknown form)."""
    ranges = _task_ranges(spec)
    if ranges is None:
        return 1  # counted once, as a job that is not an array
    return max(sum((hi - lo) // step + 1 for lo, hi, step in ranges if hi >= lo), 1)


def array_has_task(spec: str, task: int) -> bool:
    """Whether Slurm's task list names `task`."""
    return any(lo <= task <= hi and (task - lo) % step == 0 for lo, hi, step in _task_ranges(spec) or [])


def _array_name(array_job: object, task_id: object, task_list: object) -> tuple[str | None, int]:
    """(slurm_id, tasks) from squeue --json's array fields (array_job_id 0 or absent: not an array)."""
    base, task, spec = unwrap(array_job), unwrap(task_id), _none(unwrap(task_list))
    if not isinstance(base, int) or isinstance(base, bool) or base <= 0:
        return None, 1
    if isinstance(task, int) and not isinstance(task, bool):
        return f"{base}_{task}", 1
    if spec:
        return f"{base}_[{spec}]", array_task_count(spec)
    return None, 1


def _het_name(het_id: object, offset: object) -> str | None:
    """`7+1` for component 1 of heterogeneous job 7 (squeue --json het_job_id 0: not one)."""
    base, off = unwrap(het_id), unwrap(offset)
    if isinstance(base, int) and not isinstance(base, bool) and base > 0 and isinstance(off, int):
        return f"{base}+{off}"
    return None


def _text_array_name(job_id: str, array_id: str | None) -> tuple[str | None, int]:
    """(slurm_id, tasks) from `squeue -O JobArrayID` (`19_[4-9]`, `19_0`, a het component's `7+1`, or the
    job id itself)."""
    if array_id and array_id != job_id and "+" in array_id:
        return array_id, 1
    if not array_id or array_id == job_id or "_" not in array_id:
        return None, 1
    tail = array_id.split("_", 1)[1]
    return array_id, array_task_count(tail) if tail.startswith("[") else 1


def _none(v: object) -> str | None:
    if v is None:
        return None
    s = str(v).strip()
    return None if s in ("", "(null)", "N/A", "None") else s


def _minutes(v: object) -> float | None:
    """squeue --json time_limit: minutes, or null / a huge value / 'UNLIMITED' when there is none."""
    v = unwrap(v)  # later Slurm versions: {"set": true, "infinite": false, "number": N}
    if v is None or isinstance(v, bool):
        return None
    try:
        n = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if n <= 0 or n >= 4294967294 else n * 60.0


def _epoch(v: object) -> float | None:
    v = unwrap(v)
    if v is None or isinstance(v, bool):
        return None
    try:
        n = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def parse_squeue_json(text: str) -> list[QueueJob]:
    """Pending and running jobs from `squeue --json` (22.05 ignores -t with --json, so filter here)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"squeue --json: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise ParseError("squeue --json: no `jobs` list in its output")
    errors = [e for e in doc.get("errors") or [] if e]
    if errors:  # 22.05 exits 0 with an empty `jobs` list when it could not read the queue
        from headway.slurm.runner import SlurmDown

        first = errors[0]
        said = first.get("description") or first.get("error") if isinstance(first, dict) else first
        raise SlurmDown(f"squeue: slurmctld is not answering: {said or 'an error'} (in squeue --json)")
    out: list[QueueJob] = []
    for i, j in enumerate(doc["jobs"], start=1):
        if not isinstance(j, dict):
            raise ParseError(f"squeue --json: job record {i} is not an object")
        state = j.get("job_state")
        if isinstance(state, list):  # later versions: a list of flags
            state = state[0] if state else None
        if state not in _STATES:
            continue
        try:
            job_id = str(j["job_id"])
            nodes = int(unwrap(j.get("node_count")) or 1)  # type: ignore[call-overload]
            submit = _epoch(j.get("submit_time"))
        except (KeyError, TypeError, ValueError) as e:
            raise ParseError(f"squeue --json: job record {i}: bad or missing field {e}") from None
        start = _epoch(j.get("start_time")) if state == "RUNNING" else None
        prio = unwrap(j.get("priority"))
        slurm_id, tasks = _array_name(
            j.get("array_job_id"), j.get("array_task_id"), j.get("array_task_string")
        )
        slurm_id = slurm_id or _het_name(j.get("het_job_id"), j.get("het_job_offset"))
        out.append(
            QueueJob(
                job_id=job_id,
                state=str(state),
                user=_none(j.get("user_name")),
                account=_none(j.get("account")),
                name=_none(j.get("name")),
                partition=_none(j.get("partition")),
                qos=_none(j.get("qos")),
                submit_time=submit or 0.0,
                start_time=start,
                gpus=gpus_from_tres(
                    _none(j.get("tres_req_str")),
                    _none(j.get("tres_per_node")),
                    _none(j.get("tres_per_job")),
                    nodes,
                ),
                nodes=nodes,
                time_limit=_minutes(j.get("time_limit")),
                priority=int(prio) if isinstance(prio, int | float) else None,
                reason=_none(j.get("state_reason")),
                slurm_id=slurm_id,
                tasks=tasks,
            )
        )
    return out


# `squeue -O` fields for the text fallback; each ends with ASCII's unit separator (`TEXT_SEP`), which no
# job name or account holds (a `|` after each, as before, let a job named `x|y` shift every later column
# and fail every pass while it waited).
SQUEUE_FIELDS: tuple[str, ...] = (
    "JobID",
    "State",
    "UserName",
    "Account",
    "Name",
    "Partition",
    "QOS",
    "SubmitTime",
    "StartTime",
    "TimeLimit",
    "NumNodes",
    "tres-per-node",
    "tres-per-job",
    "PriorityLong",
    "Reason",
    "JobArrayID",  # after the fields an older headway asked for, so that output still reads
    "NumTasks",
    "tres-per-task",
    "tres-per-socket",
)
_OLDEST_FIELDS = SQUEUE_FIELDS.index("PriorityLong") + 1


TEXT_SEP = "\x1f"


def squeue_text_args() -> list[str]:
    fmt = ",".join(f"{f}:{TEXT_SEP}" for f in SQUEUE_FIELDS)
    return ["-h", "-a", "-t", "PENDING,RUNNING", "-O", fmt]


def parse_duration(s: str) -> float | None:
    """Slurm's time limit text (MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED) in seconds; None
    when unlimited. ValueError for a field out of range (D-HH was read as D-00:00:HH)."""
    from headway.local.durations import slurm_clock_seconds

    s = s.strip()
    if not s or s.upper() in ("UNLIMITED", "INFINITE", "N/A", "NOT_SET", "PARTITION_LIMIT"):
        return None
    if ":" not in s and "-" not in s:  # squeue prints minutes with a colon: a bare number is seconds here
        return float(int(s))
    return slurm_clock_seconds(s)


# The environment headway runs `squeue -O` with: its times in UTC, which has no repeated hour (in a local
# zone, the hour the clocks go back reads twice, and an hour of submit times came out an hour off).
SQUEUE_TEXT_ENV = {"TZ": "UTC"}


def _slurm_epoch(s: str, utc: bool = False) -> float | None:
    s = s.strip()
    if not s or s in ("N/A", "Unknown", "None", "(null)"):
        return None
    t = dt.datetime.fromisoformat(s)  # Slurm prints time without a zone: local, or UTC when asked
    return (t.replace(tzinfo=dt.UTC) if utc and t.tzinfo is None else t).timestamp()


def parse_squeue_text(text: str, utc: bool = False) -> list[QueueJob]:
    """Pending and running jobs from `squeue -O <SQUEUE_FIELDS>` with `TEXT_SEP` after each field (or `|`,
    as older headway asked for)."""
    out: list[QueueJob] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        cells = line.split(TEXT_SEP if TEXT_SEP in line else "|")
        if len(cells) < _OLDEST_FIELDS:
            raise ParseError(f"squeue -O: line {lineno}: {len(cells)} fields, expected {len(SQUEUE_FIELDS)}")
        c = dict(zip(SQUEUE_FIELDS, (x.strip() for x in cells), strict=False))
        if c["State"] not in _STATES:
            continue
        try:
            nodes = int(c["NumNodes"] or 1)
            prio = _none(c["PriorityLong"])
            slurm_id, tasks = _text_array_name(c["JobID"], _none(c.get("JobArrayID", "")))
            out.append(
                QueueJob(
                    job_id=c["JobID"],
                    state=c["State"],
                    user=_none(c["UserName"]),
                    account=_none(c["Account"]),
                    name=_none(c["Name"]),
                    partition=_none(c["Partition"]),
                    qos=_none(c["QOS"]),
                    submit_time=_slurm_epoch(c["SubmitTime"], utc) or 0.0,
                    start_time=_slurm_epoch(c["StartTime"], utc) if c["State"] == "RUNNING" else None,
                    gpus=gpus_from_tres(
                        None,
                        _none(c["tres-per-node"]),
                        _none(c["tres-per-job"]),
                        nodes,
                        per_task=_none(c.get("tres-per-task", "")),
                        tasks=int(c.get("NumTasks") or 1) if (c.get("NumTasks") or "").isdigit() else 1,
                        per_socket=_none(c.get("tres-per-socket", "")),
                    ),
                    nodes=nodes,
                    time_limit=parse_duration(c["TimeLimit"]),
                    priority=int(prio) if prio is not None else None,
                    reason=_none(c.get("Reason", "")),
                    slurm_id=slurm_id,
                    tasks=tasks,
                )
            )
        except ValueError as e:
            raise ParseError(f"squeue -O: line {lineno}: {e}") from None
    return out


_THROTTLE = re.compile(r"%(\d+)\]$")


def settle_throttles(jobs: Sequence[QueueJob]) -> list[QueueJob]:
    """Pending arrays Slurm says are held by their throttle (`JobArrayTaskLimit`) while fewer of their tasks
    run than `%N` allows: Slurm 22.05 leaves that reason in place for minutes after a task ends on a full
    cluster, so taken at its word the array was left at the bottom while it could start. Their reason is
    rewritten so that they are ranked; a real throttle (N tasks running) keeps it."""
    running: dict[str, int] = {}
    for j in jobs:
        if j.state == "RUNNING" and j.slurm_id and "_" in j.slurm_id:
            base = j.slurm_id.split("_", 1)[0]
            running[base] = running.get(base, 0) + 1
    out = []
    for j in jobs:
        m = _THROTTLE.search(j.slurm_id or "")
        if j.state == "PENDING" and m and (j.reason or "").startswith("JobArrayTaskLimit"):
            base, limit = (j.slurm_id or "").split("_", 1)[0], int(m.group(1))
            if running.get(base, 0) < limit:
                j = replace(j, reason=f"stale JobArrayTaskLimit ({running.get(base, 0)} of {limit} running)")
        out.append(j)
    return out


def read_queue(runner: Runner) -> tuple[list[QueueJob], str]:
    """Pending and running jobs, from `squeue --json`, or from `squeue -O` where JSON is not built in."""
    res = runner.run("squeue", ["--json"], check=False)
    if res.returncode == 0 and res.stdout.lstrip().startswith("{"):
        return settle_throttles(parse_squeue_json(res.stdout)), "squeue --json"
    if res.returncode != 0 and res.stderr:
        from headway.slurm.runner import SlurmDown, classify

        err = classify("squeue", res.returncode, res.stderr)
        if isinstance(err, SlurmDown):
            raise err
    text = runner.run("squeue", squeue_text_args(), env=SQUEUE_TEXT_ENV).stdout
    return settle_throttles(parse_squeue_text(text, utc=True)), "squeue -O"


SINFO_ARGS = ["-N", "-h", "-O", "NodeList:|,Gres:|,GresUsed:|,StateLong:|"]
_GRES_COUNT = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def parse_sinfo(text: str) -> list[NodeGpus]:
    """Nodes with their GPUs (from `sinfo -N -O NodeList,Gres,GresUsed,StateLong`), one per node."""
    nodes: dict[str, NodeGpus] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [x.strip() for x in line.split("|")]
        if len(cells) < 4:
            raise ParseError(f"sinfo: line {lineno}: expected 4 fields")
        name, gres, used, state = cells[:4]
        total = sum(int(n) for n in _GRES_COUNT.findall(re.sub(r"\(.*?\)", "", gres)))
        busy = sum(int(n) for n in _GRES_COUNT.findall(re.sub(r"\(.*?\)", "", used)))
        nodes[name] = NodeGpus(name, total, min(busy, total), state)  # a node listed per partition once
    return list(nodes.values())


def parse_sprio_long(text: str) -> list[SprioLine]:
    """`sprio -l` rows in order, every partition's line of a job kept (`-p gpu,debug` gives two); columns
    by the header line (whatever factors this site has)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0].startswith("Unable to find jobs"):
        return []  # sprio's answer (exit 0) for jobs it does not weigh: held, waiting on a dependency
    header = lines[0].split()
    if not header or header[0] != "JOBID" or "PRIORITY" not in header:
        raise ParseError("sprio -l: no JOBID ... PRIORITY header line")
    out: list[SprioLine] = []
    for lineno, line in enumerate(lines[1:], start=2):
        cells = line.split()
        if len(cells) < header.index("PRIORITY") + 1:
            raise ParseError(f"sprio -l: line {lineno}: too few columns")
        row = dict(zip(header, cells, strict=False))
        factors: dict[str, float] = {}
        for k, v in row.items():
            if k in ("JOBID", "PARTITION", "USER", "PRIORITY", "TRES"):
                continue
            try:
                factors[k.lower()] = float(v)
            except ValueError:
                continue
        # The PARTITION column appears twice (name, then factor); the factor is the later numeric one.
        part = [c for h, c in zip(header, cells, strict=False) if h == "PARTITION"]
        if len(part) > 1:
            with contextlib.suppress(ValueError):
                factors["partition"] = float(part[-1])
        try:
            prio = int(float(row["PRIORITY"]))
        except ValueError:
            raise ParseError(
                f"sprio -l: line {lineno}: PRIORITY {row['PRIORITY']!r} is not a number"
            ) from None
        out.append(SprioLine(row["JOBID"], row.get("USER"), prio, factors, part[0] if part else None))
    return out


SITE_ARGS = ["-h", "-o", "%i|%S"]


def parse_site_factors(text: str) -> dict[str, int]:
    """Current SiteFactor per pending job, from `sprio -h -o '%i|%S'`."""
    out: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split("|")]
        try:
            out[cells[0]] = int(float(cells[1]))
        except (IndexError, ValueError):
            raise ParseError(f"sprio -o '%i|%S': line {lineno}: {line.strip()!r}") from None
    return out


def read_site_factors(runner: Runner, job_ids: Sequence[str] | None = None) -> dict[str, int]:
    args = list(SITE_ARGS)
    if job_ids:
        args += ["-j", ",".join(job_ids)]
    res = runner.run("sprio", args, check=False)
    if res.returncode != 0:
        from headway.slurm.runner import classify

        if "no pending jobs" in (res.stderr + res.stdout).lower() or ("unable to find" in res.stderr.lower()):
            return {}
        raise classify("sprio", res.returncode, res.stderr or res.stdout)
    return parse_site_factors(res.stdout)
