"""The Slurm adapter without a cluster: parsers on real Slurm 22.05 output, SiteFactor mapping, and a
sync pass driven through stand-in Slurm commands (shell scripts on PATH) to prove the failure rules."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.slurm.queue import (
    ParseError,
    array_has_task,
    array_task_count,
    parse_duration,
    parse_sinfo,
    parse_site_factors,
    parse_sprio_long,
    parse_squeue_json,
    parse_squeue_text,
    settle_throttles,
    squeue_text_args,
)
from headway.slurm.runner import Runner, SlurmDenied, SlurmDown, SlurmMissing, SlurmTimeout, classify
from headway.slurm.sitefactor import (
    Change,
    FactorRange,
    apply_changes,
    map_ranks,
    place_ranks,
    plan_changes,
)
from headway.slurm.sync import History, PassReport, Plan, SlurmSync, SyncOptions, run_loop

SLURM = "slurm-22.05"


class RatePredictor:
    """A test stand-in for the online predictor: per-user success rate, fixed runtimes."""

    def __init__(self) -> None:
        self.seen: dict[str, list[bool]] = {}

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        p = np.array(
            [
                (sum(self.seen.get(j.user or "", [])) + 1) / (len(self.seen.get(j.user or "", [])) + 2)
                for j in jobs
            ]
        )
        n = len(jobs)
        return Predictions(p, np.full(n, 600.0), np.full(n, 900.0), np.full(n, 300.0))

    def observe_end(self, ended: EndedJob) -> None:
        self.seen.setdefault(ended.job.user or "", []).append(ended.state == "COMPLETED")

    def maybe_retrain(self, now: float) -> bool:
        return False


# --------------------------------------------------------------------------- parsers on real output
def test_squeue_json_reads_pending_and_running_jobs_with_gpu_totals(shared_traces: Path) -> None:
    jobs = parse_squeue_json((shared_traces / SLURM / "squeue_pending.json").read_text())
    assert len(jobs) == 23
    pending = [j for j in jobs if j.state == "PENDING"]
    running = [j for j in jobs if j.state == "RUNNING"]
    assert len(pending) == 19 and len(running) == 4
    by_id = {j.job_id: j for j in jobs}
    assert by_id["23"].gpus == 16.0 and by_id["23"].nodes == 2  # 2 nodes x 8 GPUs, from tres_req_str
    assert by_id["5"].gpus == 1.0 and by_id["5"].user == "carol" and by_id["5"].name == "debug-run"
    assert by_id["21"].time_limit == 60.0  # minutes in JSON, seconds in headway
    assert by_id["1"].start_time is not None and by_id["5"].start_time is None
    assert by_id["1"].priority == 10000


def test_squeue_json_of_slurm_23_reads_wrapped_numbers_and_state_flags() -> None:
    def num(v: int) -> dict[str, object]:
        return {"set": True, "infinite": False, "number": v}

    job = {
        "job_id": 7,
        "job_state": ["PENDING"],
        "user_name": "ann",
        "submit_time": num(1_700_000_000),
        "node_count": num(2),
        "time_limit": {"set": True, "infinite": True, "number": 0},
        "priority": num(4242),
        "tres_req_str": "cpu=2,gres/gpu=16,node=2",
    }
    (j,) = parse_squeue_json(json.dumps({"jobs": [job]}))
    assert (j.state, j.nodes, j.gpus, j.time_limit, j.priority) == ("PENDING", 2, 16.0, None, 4242)
    assert j.submit_time == 1_700_000_000


def test_sprio_long_gives_priority_and_each_factor(shared_traces: Path) -> None:
    rows = {s.job_id: s for s in parse_sprio_long((shared_traces / SLURM / "sprio_long.txt").read_text())}
    assert len(rows) == 19
    r = rows["23"]
    assert r.user == "dave" and r.priority == 10000
    assert r.factors["site"] == 0 and r.factors["partition"] == 10000 and r.factors["age"] == 0


def test_squeue_text_fallback_parses_the_O_format() -> None:
    text = (
        "3|PENDING|bob|(null)|wrap|gpu|normal|2026-11-29T15:19:38|N/A|UNLIMITED|1|gres:gpu:8|N/A|10000|\n"
        "1|RUNNING|alice|lab|train|gpu|normal|2026-11-29T15:19:09|2026-11-29T15:19:15|1-02:00:00|2|"
        "gres:gpu:a100:4|N/A|10007|\n"
        "9|COMPLETING|carol|(null)|x|gpu|normal|2026-11-29T15:19:09|N/A|5:00|1|N/A|N/A|1|\n"
    )
    jobs = parse_squeue_text(text)
    assert [j.job_id for j in jobs] == ["3", "1"]
    assert jobs[0].gpus == 8 and jobs[0].time_limit is None and jobs[0].account is None
    assert jobs[1].gpus == 8 and jobs[1].time_limit == 26 * 3600 and jobs[1].priority == 10007
    with pytest.raises(ParseError, match="line 1"):
        parse_squeue_text("1|PENDING|bob\n")


def test_squeue_text_fallback_reads_a_job_name_holding_a_bar() -> None:
    """headway asks `squeue -O` for ASCII's unit separator after each field (as Slurm 22.05 printed this
    line): with `|`, a job named `x|y` shifted every later column and failed every pass while it waited."""
    assert all(a.endswith("\x1f") for a in squeue_text_args()[-1].split(","))
    line = (
        "4\x1fPENDING\x1fbob\x1f(null)\x1fx|y\x1fgpu\x1fnormal\x1f2026-11-30T13:45:37\x1fN/A\x1fUNLIMITED"
        "\x1f1\x1fgres:gpu:1\x1fN/A\x1f0\x1fJobHeldUser\x1f4\x1f1\x1fN/A\x1fN/A\x1f\n"
    )
    (job,) = parse_squeue_text(line)
    assert job.job_id == "4" and job.name == "x|y" and job.gpus == 1 and job.time_limit is None


def test_pending_array_tasks_are_one_record_named_as_slurm_names_them() -> None:
    """squeue --json of Slurm 22.05 with array 19 (tasks 0-3 started, 4-9 pending), as a live cluster
    printed it: the pending tasks are one record under the array's id, a started task has its own id."""
    base = {"user_name": "alice", "submit_time": 1_700_000_000, "node_count": 1, "time_limit": 10}
    base |= {"tres_req_str": "cpu=1,node=1,billing=1,gres/gpu=1", "partition": "gpu", "qos": "normal"}
    doc = {
        "jobs": [
            base
            | {
                "job_id": 19,
                "job_state": "PENDING",
                "array_job_id": 19,
                "array_task_id": None,
                "array_task_string": "4-9",
                "state_reason": "Resources",
            },
            base
            | {
                "job_id": 23,
                "job_state": "RUNNING",
                "array_job_id": 19,
                "array_task_id": 0,
                "array_task_string": "",
                "start_time": 1_700_000_100,
            },
            base
            | {
                "job_id": 20,
                "job_state": "PENDING",
                "array_job_id": 0,
                "array_task_id": None,
                "array_task_string": "",
            },
        ]
    }
    arr, task, plain = parse_squeue_json(json.dumps(doc))
    assert (arr.job_id, arr.display_id, arr.tasks, arr.gpus) == ("19", "19_[4-9]", 6, 1.0)
    assert (task.job_id, task.display_id, task.tasks) == ("23", "19_0", 1)
    assert (plain.display_id, plain.slurm_id, plain.tasks) == ("20", None, 1)
    # The text fallback's JobArrayID column, as `squeue -O` printed it on the same cluster.
    row = "|PENDING|alice|(null)|sweep|gpu|normal|2026-11-29T15:19:38|N/A|10:00|1|gres:gpu:1|N/A|10000|"
    row += "Resources|"
    arr_t, task_t, plain_t = parse_squeue_text(
        f"19{row}19_[4-9%2]|\n" + f"23{row.replace('PENDING', 'RUNNING')}19_0|\n" + f"20{row}20|\n"
    )
    assert (arr_t.job_id, arr_t.display_id, arr_t.tasks) == ("19", "19_[4-9%2]", 6)
    assert (task_t.job_id, task_t.display_id, task_t.tasks) == ("23", "19_0", 1)
    assert (plain_t.display_id, plain_t.tasks) == ("20", 1)


def test_heterogeneous_job_components_go_by_slurms_names() -> None:
    """Het job 7 (`sbatch --gres=gpu:1 : --gres=gpu:2`) as Slurm 22.05 printed it, JSON and text."""
    base = {"user_name": "root", "submit_time": 1_700_000_000, "node_count": 1, "time_limit": 10}
    base |= {"partition": "gpu", "qos": "normal", "job_state": "PENDING", "array_job_id": 0}
    doc = {
        "jobs": [
            base | {"job_id": 7, "het_job_id": 7, "het_job_offset": 0, "tres_req_str": "cpu=1,gres/gpu=1"},
            base | {"job_id": 8, "het_job_id": 7, "het_job_offset": 1, "tres_req_str": "cpu=1,gres/gpu=2"},
            base | {"job_id": 9, "het_job_id": 0, "het_job_offset": 0, "tres_req_str": "cpu=1,gres/gpu=4"},
        ]
    }
    lead, comp, plain = parse_squeue_json(json.dumps(doc))
    assert [(j.job_id, j.display_id, j.gpus) for j in (lead, comp, plain)] == [
        ("7", "7+0", 1.0),
        ("8", "7+1", 2.0),
        ("9", "9", 4.0),
    ]
    row = "|PENDING|root|root|wrap|gpu|normal|2026-11-30T08:13:46|N/A|UNLIMITED|1|gres:gpu:2|N/A|10000|None|"
    (text,) = parse_squeue_text(f"8{row}7+1|1|N/A|N/A|\n")
    assert (text.job_id, text.display_id, text.gpus) == ("8", "7+1", 2.0)


def test_the_text_fallback_counts_gpus_per_task_and_per_socket() -> None:
    """`squeue -O` rows as Slurm 22.05 printed them for `-n 3 --gpus-per-task=2` and `--gpus-per-socket=1`
    (the text path read both as CPU-only jobs)."""
    text = (
        "1|PENDING|root|root|wrap|gpu|normal|2026-11-30T08:13:46|N/A|UNLIMITED|1|N/A|N/A|10000|Resources|1|3|"
        "gres:gpu:2|N/A|\n"
        "2|PENDING|root|root|wrap|gpu|normal|2026-11-30T08:13:46|N/A|UNLIMITED|1|N/A|N/A|10000|Resources|2|1|"
        "N/A|gres:gpu:1|\n"
    )
    per_task, per_socket = parse_squeue_text(text)
    assert (per_task.gpus, per_socket.gpus) == (6.0, 1.0)


def test_a_throttle_with_a_free_slot_holds_nothing_whatever_slurm_still_says() -> None:
    """Slurm 22.05 kept `JobArrayTaskLimit` on array 518 (`%1`) for minutes after its one running task
    ended on a full cluster; taken at its word, the array sat at the bottom while it could start."""
    row = "|PENDING|bob|(null)|sweep|gpu|normal|2026-11-29T15:19:38|N/A|10:00|1|gres:gpu:1|N/A|10000|"
    stale = parse_squeue_text(f"518{row}JobArrayTaskLimit|518_[1-5%1]|\n")
    (job,) = settle_throttles(stale)
    assert not job.cannot_start and job.reason == "stale JobArrayTaskLimit (0 of 1 running)"
    # With its one task running, the throttle is real: left alone, as before.
    busy = row.replace("PENDING", "RUNNING")
    real = parse_squeue_text(f"518{row}JobArrayTaskLimit|518_[2-5%1]|\n519{busy}None|518_1|\n")
    held, running = settle_throttles(real)
    assert held.cannot_start and held.reason == "JobArrayTaskLimit" and running.state == "RUNNING"


def test_array_task_lists_count_and_contain_what_slurm_means() -> None:
    assert [array_task_count(s) for s in ("4-9", "1-3,7", "0-99:2%10", "[4-9%2]", "5", "odd")] == [
        6,
        4,
        50,
        6,
        1,
        1,
    ]
    assert array_has_task("1-3,7", 7) and not array_has_task("1-3,7", 4)
    assert array_has_task("0-99:2", 98) and not array_has_task("0-99:2%10", 3)


def test_a_task_id_or_the_array_id_finds_the_arrays_pending_record() -> None:
    plan = Plan(0.0, "squeue --json", 2, 0, 0, 0, [], [], [], arrays={"19": "19_[4-9]", "22": "22_[1-3,7]"})
    assert plan.resolve("19") == "19_[4-9]" and plan.resolve("19_5") == "19_[4-9]"
    assert plan.resolve("22_7") == "22_[1-3,7]" and plan.resolve("22_4") == "22_4"  # 4 is not pending
    assert plan.resolve("19_0") == "19_0" and plan.resolve("20") == "20"


def test_sinfo_and_site_factor_parsers() -> None:
    nodes = parse_sinfo("n1|gpu:a100:8|gpu:a100:8(IDX:0-7)|mixed|\nn3|gpu:v100:4|gpu:v100:0(IDX:N/A)|idle|\n")
    assert [(n.name, n.gpus, n.used) for n in nodes] == [("n1", 8, 8), ("n3", 4, 0)]
    assert parse_site_factors("1|0\n2|500\n") == {"1": 0, "2": 500}
    assert parse_duration("2-00:00:10") == 2 * 86400 + 10 and parse_duration("05:00") == 300


def test_errors_are_sorted_into_down_denied_and_missing() -> None:
    assert isinstance(
        classify("squeue", 1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"),
        SlurmDown,
    )
    assert isinstance(classify("scontrol", 1, "Access/permission denied for job 5"), SlurmDenied)
    with pytest.raises(SlurmMissing, match="squeue not found"):
        Runner(env={"PATH": "/nonexistent"}).which("squeue")


# --------------------------------------------------------------------------- SiteFactor mapping
def test_ranks_map_evenly_onto_the_range_best_first() -> None:
    assert map_ranks(["a", "b", "c"], FactorRange(0, 100)) == {"a": 100, "b": 50, "c": 0}
    assert map_ranks(["a"], FactorRange(-10, 10)) == {"a": 10}
    vals = list(map_ranks([str(i) for i in range(1000)], FactorRange(0, 100000)).values())
    assert vals == sorted(vals, reverse=True) and len(set(vals)) == 1000  # strict order survives
    assert FactorRange.parse("-5000:5000") == FactorRange(-5000, 5000)
    for bad in ("5:1", "a:b", "100"):
        with pytest.raises(ValueError, match="--range"):
            FactorRange.parse(bad)


def test_a_start_or_an_end_rewrites_no_other_job_and_an_arrival_only_itself() -> None:
    rng = FactorRange(0, 100000)
    order = [f"j{i}" for i in range(452)]
    first = place_ranks(order, {}, rng)
    vals = [first[j] for j in order]
    assert vals == sorted(vals, reverse=True) and len(set(vals)) == 452
    # One job starts: the rest keep their values (before, 451 of 452 were rewritten).
    after_start = order[:100] + order[101:]
    assert place_ranks(after_start, first, rng) == {j: first[j] for j in after_start}
    # One arrives in the middle, one ranks best, one worst: each is the only job written.
    for pos in (200, 0, len(after_start)):
        new_order = [*after_start[:pos], "new", *after_start[pos:]]
        placed = place_ranks(new_order, first, rng)
        assert [j for j in new_order if placed[j] != first.get(j)] == ["new"]
        got = [placed[j] for j in new_order]
        assert got == sorted(got, reverse=True) and len(set(got)) == len(got)
    # Two jobs swap places: the fewest moves, and the order is exact.
    swapped = order.copy()
    swapped[10], swapped[11] = swapped[11], swapped[10]
    placed = place_ranks(swapped, first, rng)
    assert sum(placed[j] != first[j] for j in order) == 1
    got = [placed[j] for j in swapped]
    assert got == sorted(got, reverse=True) and len(set(got)) == len(got)


def _rewrites(order: list[str], before: dict[str, int], after: dict[str, int]) -> int:
    got = [after[j] for j in order]
    assert all(a > b for a, b in itertools.pairwise(got)), "order lost"
    return sum(after[j] != before.get(j) for j in order)


def test_a_burst_at_one_rank_moves_a_few_neighbours_not_the_queue() -> None:
    """One user's sweep: 8 jobs of equal score arrive after the same job, three passes in a row (the gap
    ran out at the third and the whole queue of 474 was rewritten)."""
    rng = FactorRange(0, 100000)
    order = [f"j{i}" for i in range(450)]
    cur = place_ranks(order, {}, rng)
    for r in range(3):
        pos = order.index("j200") + 1
        order = [*order[:pos], *(f"b{r}_{k}" for k in range(8)), *order[pos:]]
        nxt = place_ranks(order, cur, rng)
        assert _rewrites(order, cur, nxt) <= 24
        cur = nxt


def test_a_queue_in_motion_is_rewritten_little_more_than_its_arrivals() -> None:
    import random

    rng, rnd = FactorRange(0, 100000), random.Random(1)
    order = [f"j{i}" for i in range(450)]
    cur = place_ranks(order, {}, rng)
    written = arrived = 0
    for p in range(600):
        if rnd.random() < 0.5:
            order.pop(rnd.randrange(len(order)))
        for k in range(rnd.randint(0, 3)):
            order.insert(rnd.randrange(len(order) + 1), f"r{p}_{k}")
            arrived += 1
        nxt = place_ranks(order, cur, rng)
        written += _rewrites(order, cur, nxt)
        cur = {j: nxt[j] for j in order}
    assert written <= 2 * arrived  # evenly spread every pass: about 13 times the arrivals


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=60, unique=True),
    st.dictionaries(st.integers(0, 60), st.integers(-50, 400), max_size=60),
    st.sampled_from([(0, 100), (0, 100000), (-20, 20), (5, 300)]),
)
def test_placed_values_always_keep_the_order_exactly_within_the_range_above_its_low_end(
    order: list[int], current: dict[int, int], bounds: tuple[int, int]
) -> None:
    rng = FactorRange(*bounds)
    jobs = [str(i) for i in order]
    placed = place_ranks(jobs, {str(k): v for k, v in current.items()}, rng)
    got = [placed[j] for j in jobs]
    assert all(rng.lo < v <= rng.hi for v in got)  # LO itself is the held jobs' value
    if len(jobs) <= rng.hi - rng.lo:  # room for every job: a strict order
        assert all(a > b for a, b in itertools.pairwise(got))


def test_only_changed_values_are_planned() -> None:
    changes = plan_changes({"1": 10, "2": 20, "3": 30}, {"1": 10, "2": 5})
    assert [(c.job_id, c.old, c.new) for c in changes] == [("2", 5, 20), ("3", None, 30)]


# --------------------------------------------------------------------------- stand-in Slurm commands
def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_slurm(tmp_path: Path, shared_traces: Path) -> Path:
    """squeue/sinfo/sacct/sprio/scontrol replaced by scripts serving the real 22.05 samples.

    `touch $DIR/down` makes every command answer as when slurmctld is stopped (sacct keeps working, as it
    talks to slurmdbd); scontrol appends each call to $DIR/scontrol.log.
    """
    d = tmp_path / "bin"
    d.mkdir()
    src = shared_traces / SLURM
    down_msg = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    down = f'if [ -e "{d}/down" ]; then echo "{down_msg}" >&2; exit 1; fi\n'
    sinfo = "".join(
        f"{n}|gpu:{t}:{g}|gpu:{t}:{g}(IDX:0-{g - 1})|allocated|\\n"
        for n, t, g in (("n1", "a100", 8), ("n2", "a100", 8), ("n3", "v100", 4), ("n4", "v100", 4))
    )
    sprio_all = f'awk \'NR>1 {{print $1 "|0"}}\' "{src / "sprio_long.txt"}"'
    garbage = f'if [ -e "{d}/garbage" ]; then echo "{{\\"jobs\\": [1,"; exit 0; fi\n'
    _script(d / "squeue", down + garbage + f'cat "{src / "squeue_pending.json"}"\n')
    _script(d / "sinfo", down + f"printf '{sinfo}'\n")
    _script(d / "sacct", f'cat "{src / "sacct_allocations.txt"}" | head -n 11\n')
    long = f'if [ "$1" = "-l" ]; then cat "{src / "sprio_long.txt"}"; exit 0; fi\n'
    _script(d / "sprio", down + long + f'[ -e "{d}/sites" ] && cat "{d}/sites" || {sprio_all}\n')
    # Like scontrol reading commands from stdin through readline: its prompt, the echo of each command
    # as it reads it, the failing job named on stderr, then the next prompt.
    _script(
        d / "scontrol",
        down + f'echo "run" >> "{d}/scontrol.runs"\nrc=0\nprintf "scontrol: "\n'
        f'while read -r line; do printf "%s\\n" "$line"; echo "$line" >> "{d}/scontrol.log"\n'
        '  case "$line" in *JobId=13\\ *) echo "Job has already finished for job 13" >&2; rc=1;; esac\n'
        '  printf "scontrol: "\n'
        "done\necho\nexit $rc\n",
    )
    return d


def _runner(bin_dir: Path) -> Runner:
    return Runner(timeout_s=10, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_dry_run_plans_every_pending_gpu_job_and_writes_nothing(fake_slurm: Path, tmp_path: Path) -> None:
    db = tmp_path / "jobs.duckdb"
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=False, db=db), predictor_factory=RatePredictor)
    report = sync.run_pass()
    assert report.ok and report.dry_run and report.plan is not None
    assert report.plan.pending == 19 and len(report.plan.rows) == 19
    assert not (fake_slurm / "scontrol.log").exists() and not db.exists()
    assert report.plan.history_new == 10  # ten ended jobs in the sacct sample's first rows
    # carol's debug-run failed in history (jobs 5-10): it ranks below dave's finetune jobs.
    rank = {r.job_id: r.rank for r in report.plan.rows}
    assert max(rank[j] for j in ("11", "12", "13")) < min(rank[j] for j in ("5", "6", "7"))
    targets = [r.target for r in report.plan.rows]
    # Ties (same submit second, tier and score) go in Slurm's numbering: 5, 6, ..., 10, not 10 first.
    ties: dict[tuple[str, float], list[int]] = {}
    for r in report.plan.rows:
        ties.setdefault((r.tier, r.score), []).append(int(r.job_id))
    assert all(ids == sorted(ids) for ids in ties.values()) and any(len(ids) > 1 for ids in ties.values())
    # A first spread: the middle three quarters of the range, best first, every value distinct.
    assert targets == sorted(targets, reverse=True) and len(set(targets)) == len(targets)
    assert (targets[0], targets[-1]) == (87500, 12500)


def test_apply_writes_changed_values_in_batches_and_reports_failures_per_job(
    fake_slurm: Path, tmp_path: Path
) -> None:
    db = tmp_path / "jobs.duckdb"
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), predictor_factory=RatePredictor)
    report = sync.run_pass()
    calls = (fake_slurm / "scontrol.log").read_text().splitlines()
    assert report.plan is not None and len(report.plan.changes) == 19  # every job: all were at 0
    assert len(calls) == 19 and report.commands == 1  # one scontrol process for the whole batch
    assert all(c.startswith("update JobId=") and "SiteFactor=" in c for c in calls)
    written = {
        c.split()[1].removeprefix("JobId="): int(c.split()[2].removeprefix("SiteFactor=")) for c in calls
    }
    assert written == {c.job_id: c.new for c in report.plan.changes}
    assert list(report.failed) == ["13"] and "already finished" in report.failed["13"]
    assert len(report.applied) == 18 and report.ok
    assert db.exists()  # new history stored with --apply
    # Next pass: Slurm now has the values (bar job 13), so only job 13 is retried.
    sites = {c.job_id: c.new for c in report.applied}
    (fake_slurm / "sites").write_text(
        "".join(f"{r.job_id}|{sites.get(r.job_id, r.current or 0)}\n" for r in report.plan.rows)
    )
    again = sync.run_pass()
    assert again.plan is not None and [c.job_id for c in again.plan.changes] == ["13"]


def test_loop_survives_a_down_controller_and_writes_nothing_meanwhile(
    fake_slurm: Path, tmp_path: Path
) -> None:
    sync = SlurmSync(
        _runner(fake_slurm),
        SyncOptions(apply=True, db=tmp_path / "j.duckdb"),
        predictor_factory=RatePredictor,
    )
    (fake_slurm / "down").touch()
    reports: list[PassReport] = []

    def on_report(r: PassReport) -> None:
        reports.append(r)
        if len(reports) == 3:
            (fake_slurm / "down").unlink()

    run_loop(sync, 0.01, on_report, max_passes=4)
    assert [r.ok for r in reports] == [False, False, False, True]
    assert all("not answering" in (r.error or "") for r in reports[:3])
    runs = (fake_slurm / "scontrol.runs").read_text().splitlines()
    assert len(runs) == reports[3].commands == 1  # the only write came from the pass after it returned
    assert reports[3].applied and all(r.commands == 0 and not r.applied for r in reports[:3])


def test_a_write_that_finds_the_controller_gone_stops_the_pass(fake_slurm: Path) -> None:
    runner = _runner(fake_slurm)
    (fake_slurm / "down").touch()
    rep = apply_changes(runner, [Change("5", 0, 10), Change("6", 0, 20)])
    assert rep.aborted is not None and rep.commands == 1 and not rep.applied


def test_ctrl_c_while_writing_shows_what_was_written_then_exits_130(fake_slurm: Path, tmp_path: Path) -> None:
    """`sync --once --apply --json` interrupted while scontrol works on its third update: the pass's
    report still comes out, saying written 2, failed 1 (not confirmed), not attempted 16, and the command
    exits 130. (A real slurmctld answers an update in half a millisecond: too fast to interrupt on cue.)"""
    import signal
    import subprocess
    import sys

    _script(
        fake_slurm / "scontrol",
        f'printf "scontrol: "\nn=0\nwhile read -r line; do printf "%s\\n" "$line"; n=$((n+1))\n'
        f'  echo "$line" >> "{fake_slurm}/scontrol.log"; [ $n -eq 3 ] && sleep 10\n'
        '  printf "scontrol: "\ndone\n',
    )
    child = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['headway', 'slurm', 'sync', '--once', '--apply', '--json', '--db', sys.argv[1]]; "
        "runpy.run_module('headway.cli', run_name='__main__')"
    )
    env = {**os.environ, "PATH": f"{fake_slurm}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", child, str(tmp_path / "j.duckdb")], env=env, stdout=subprocess.PIPE, text=True
    )
    log = fake_slurm / "scontrol.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=30)
    doc = json.loads(stdout)
    assert proc.returncode == 130 and not doc["ok"]
    assert doc["writes"] == {"written": 2, "failed": 1, "not_attempted": 16}
    assert list(doc["failed"].values()) == ["not confirmed: interrupted"]
    assert doc["error"] == "interrupted (Ctrl-C) while writing; written 2, failed 1, not attempted 16"


def test_sync_cli_dry_run_json_is_clean(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    monkeypatch.setenv("PATH", f"{fake_slurm}:{os.environ['PATH']}")
    monkeypatch.setattr("headway.slurm.sync.default_predictor", RatePredictor)
    res = CliRunner().invoke(app, ["slurm", "sync", "--once", "--json", "--db", str(tmp_path / "x.duckdb")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["dry_run"] is True and doc["pending"] == 19 and doc["applied"] == []
    bad = CliRunner().invoke(app, ["slurm", "sync", "--once", "--range", "9:1"])
    assert bad.exit_code == 1 and "LO must be below HI" in bad.output and "Traceback" not in bad.output


def test_garbage_from_squeue_fails_the_pass_with_a_reason_and_the_loop_goes_on(
    fake_slurm: Path, tmp_path: Path
) -> None:
    sync = SlurmSync(
        _runner(fake_slurm),
        SyncOptions(apply=True, db=tmp_path / "j.duckdb"),
        predictor_factory=RatePredictor,
    )
    (fake_slurm / "garbage").touch()
    first = sync.run_pass()
    assert not first.ok and "squeue --json: not JSON" in (first.error or "") and first.commands == 0
    (fake_slurm / "garbage").unlink()
    second = sync.run_pass()
    assert second.ok and second.seq == 2 and second.applied


def test_sprio_without_a_line_for_the_job_is_no_line_not_a_parse_error() -> None:
    assert parse_sprio_long("Unable to find jobs matching user/id(s) specified\n") == []


def test_an_error_reported_by_squeue_json_is_not_read_as_an_empty_queue() -> None:
    doc = {"errors": [{"description": "Failed while looking for jobs", "error_number": 1}], "jobs": []}
    with pytest.raises(SlurmDown, match="Failed while looking for jobs"):
        parse_squeue_json(json.dumps(doc))


def test_jobs_held_or_waiting_on_a_dependency_are_left_alone(
    fake_slurm: Path, tmp_path: Path, shared_traces: Path
) -> None:
    doc = json.loads((shared_traces / SLURM / "squeue_pending.json").read_text())
    pending = [j for j in doc["jobs"] if j["job_state"] == "PENDING"]
    pending[0]["state_reason"], pending[1]["state_reason"] = "JobHeldUser", "Dependency"
    held, dep = str(pending[0]["job_id"]), str(pending[1]["job_id"])
    (tmp_path / "queue.json").write_text(json.dumps(doc))
    _script(fake_slurm / "squeue", f'cat "{tmp_path / "queue.json"}"\n')
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=False, db=tmp_path / "j.duckdb"), RatePredictor)
    report = sync.run_pass()
    assert report.ok and report.plan is not None
    assert report.plan.skipped_waiting == {held: "JobHeldUser", dep: "Dependency"}
    ranked = {r.job_id for r in report.plan.rows}
    assert held not in ranked and dep not in ranked and len(ranked) == 17
    assert max(r.target for r in report.plan.rows) == 87500  # the top goes to a job that can start
    # A held job keeps no SiteFactor from when it was ranked: it goes to the range's low end.
    (fake_slurm / "sites").write_text(f"{held}|88000\n{dep}|0\n")
    again = sync.run_pass()
    assert again.plan is not None
    resets = [c for c in again.plan.changes if c.job_id in (held, dep)]
    assert [(c.job_id, c.old, c.new) for c in resets] == [(held, 88000, 0)]


def test_a_job_held_after_it_was_ranked_goes_to_the_bottom_though_sprio_hides_it(
    fake_slurm: Path, tmp_path: Path, shared_traces: Path
) -> None:
    doc = json.loads((shared_traces / SLURM / "squeue_pending.json").read_text())
    (tmp_path / "queue.json").write_text(json.dumps(doc))
    _script(fake_slurm / "squeue", f'cat "{tmp_path / "queue.json"}"\n')
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=tmp_path / "j.duckdb"), RatePredictor)
    first = sync.run_pass()
    assert first.plan is not None and first.applied
    top = first.plan.rows[0].job_id
    written = next(c.new for c in first.applied if c.job_id == top)
    # The top job is held now; sprio lists every job but it (as Slurm does for held jobs).
    for j in doc["jobs"]:
        if str(j["job_id"]) == top:
            j["state_reason"] = "JobHeldUser"
    (tmp_path / "queue.json").write_text(json.dumps(doc))
    (fake_slurm / "sites").write_text(
        "".join(f"{c.job_id}|{c.new}\n" for c in first.applied if c.job_id != top)
    )
    second = sync.run_pass()
    assert second.plan is not None and top in second.plan.skipped_waiting
    assert [(c.old, c.new) for c in second.plan.changes if c.job_id == top] == [(written, 0)]
    # A sync started afresh knows nothing of that write, and nothing shows the held job's value: it is
    # written once more, its old value unknown.
    fresh = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=tmp_path / "j.duckdb"), RatePredictor)
    third = fresh.run_pass()
    assert third.ok and third.plan is not None and third.plan.resets == [top]
    assert [(c.job_id, c.old, c.new) for c in third.applied if c.job_id == top] == [(top, None, 0)]
    again = fresh.run_pass()  # and then it knows
    assert again.plan is not None and top not in {c.job_id for c in again.plan.changes}


def test_ended_jobs_read_in_a_pass_that_fails_later_are_stored_before_the_queue_is_read(
    fake_slurm: Path, tmp_path: Path
) -> None:
    """The history is stored before the queue read, so the time it takes does not age the queue (the
    staleness check at write time measures the queue read), and a failing queue read loses nothing."""
    from headway.store import JobStore

    db = tmp_path / "j.duckdb"
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), predictor_factory=RatePredictor)
    real_sprio = (fake_slurm / "sprio").read_text()
    _script(
        fake_slurm / "sprio", "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1\n"
    )
    first = sync.run_pass()  # sacct was read and stored, then sprio failed
    assert not first.ok
    with JobStore(db, read_only=True) as s:
        assert s.count() == 10
    (fake_slurm / "sprio").write_text(real_sprio)
    second = sync.run_pass()
    assert second.ok and second.plan is not None and second.plan.history_new == 0  # nothing new in sacct
    with JobStore(db, read_only=True) as s:
        assert s.count() == 10


def test_a_missing_slurm_conf_is_one_line_at_once_not_a_minute_of_retries(tmp_path: Path) -> None:
    runner = Runner(env={**os.environ, "SLURM_CONF": str(tmp_path / "nope.conf")})
    with pytest.raises(SlurmMissing, match="no such file"):
        runner.run("sh", ["-c", "exit 0"])


def test_an_accounting_outage_names_slurmdbd() -> None:
    err = classify(
        "sacct",
        1,
        "sacct: error: slurm_persist_conn_open_without_init: failed to open ... Connection refused",
    )
    assert isinstance(err, SlurmDown) and "slurmdbd" in str(err)


def _queue_with_names(tmp_path: Path, shared_traces: Path, fake_slurm: Path, names: list[str]) -> list[str]:
    """The real 22.05 queue, its first pending jobs renamed as a user may name them; returns their ids."""
    doc = json.loads((shared_traces / SLURM / "squeue_pending.json").read_text())
    pending = [j for j in doc["jobs"] if j["job_state"] == "PENDING"]
    for j, name in zip(pending, names, strict=False):
        j["name"] = name
    (tmp_path / "queue.json").write_text(json.dumps(doc))
    _script(fake_slurm / "squeue", f'cat "{tmp_path / "queue.json"}"\n')
    return [str(j["job_id"]) for j in pending[: len(names)]]


def test_job_names_that_look_like_markup_are_shown_as_written(
    fake_slurm: Path, tmp_path: Path, shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    names = ["[/]", "x[/]", "[red]evil", "[bold"]
    ids = _queue_with_names(tmp_path, shared_traces, fake_slurm, names)
    monkeypatch.setenv("PATH", f"{fake_slurm}:{os.environ['PATH']}")
    monkeypatch.setattr("headway.slurm.sync.default_predictor", RatePredictor)
    db = str(tmp_path / "x.duckdb")
    res = CliRunner().invoke(app, ["slurm", "sync", "--once", "-v", "--db", db])
    assert res.exit_code == 0, res.output
    assert all(n in res.stdout for n in names), res.stdout
    for job, name in zip(ids, names, strict=True):
        why = CliRunner().invoke(app, ["slurm", "why", job, "--db", db])
        assert why.exit_code == 0, why.output
        assert f", {name}, " in why.stdout, why.stdout


def test_a_report_that_cannot_be_shown_does_not_end_the_loop(
    fake_slurm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sync = SlurmSync(
        _runner(fake_slurm),
        SyncOptions(apply=False, db=tmp_path / "j.duckdb"),
        predictor_factory=RatePredictor,
    )
    shown: list[int] = []

    def on_report(r: PassReport) -> None:
        shown.append(r.seq)
        raise ValueError("closing tag '[/]' at position 0 has nothing to close")

    assert run_loop(sync, 0.01, on_report, max_passes=3) == 3
    assert shown == [1, 2, 3]
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "pass 1: could not show its report: ValueError: closing tag '[/]' at position 0 has nothing to close"
    )
    assert len(lines) == 3


def _log_sacct_args(fake_slurm: Path, body: str | None = None) -> Path:
    """The stand-in sacct, logging its arguments (one call a line); `body` replaces what it prints."""
    log = fake_slurm / "sacct.args"
    old = (fake_slurm / "sacct").read_text().removeprefix("#!/bin/sh\n")
    _script(fake_slurm / "sacct", f'echo "$@" >> "{log}"\n' + (body if body is not None else old))
    return log


def _sacct_start(args_line: str) -> dt.datetime:
    argv = args_line.split()
    return dt.datetime.fromisoformat(argv[argv.index("-S") + 1]).replace(tzinfo=dt.UTC)  # -S is in UTC


def test_a_store_last_fed_months_ago_is_read_from_since_not_from_its_newest_job(
    fake_slurm: Path, tmp_path: Path
) -> None:
    from headway.schema import JobRecord, State, records_to_table
    from headway.store import JobStore

    db = tmp_path / "stale.duckdb"
    ended = dt.datetime.now(dt.UTC) - dt.timedelta(days=90)
    with JobStore(db) as store:
        store.upsert(records_to_table([JobRecord("1", State.COMPLETED, "sacct", "alice", end_time=ended)]))
    log = _log_sacct_args(fake_slurm)
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(db=db, since="2d"), predictor_factory=RatePredictor)
    assert sync.run_pass().ok
    start = _sacct_start(log.read_text().splitlines()[0])
    assert start.astimezone() >= (dt.datetime.now() - dt.timedelta(days=2, minutes=1)).astimezone()


def test_a_history_read_that_times_out_says_so_and_names_its_window(fake_slurm: Path, tmp_path: Path) -> None:
    _log_sacct_args(fake_slurm, "exec sleep 5\n")
    runner = Runner(timeout_s=1, env={**os.environ, "PATH": f"{fake_slurm}:{os.environ['PATH']}"})
    sync = SlurmSync(runner, SyncOptions(db=tmp_path / "j.duckdb", since="45d"), RatePredictor)
    report = sync.run_pass()
    assert not report.ok and report.error is not None
    assert report.error.startswith("sacct: no answer within 1 s reading the history since ")
    assert "(45.0 d)" in report.error and "shorter --since" in report.error
    assert "headway ingest --from-slurm --since 45d" in report.error and "not answering" not in report.error


def test_after_a_first_read_the_history_goes_on_from_the_last_one_whatever_since_says(
    fake_slurm: Path, tmp_path: Path
) -> None:
    """--since bounds the first read only: an outage longer than --since must not leave a gap."""
    log = _log_sacct_args(fake_slurm)
    history = History()
    now = time.time()
    history.read_at = now - 3 * 86400
    history.next_since = dt.datetime.fromtimestamp(now - 3 * 86400, dt.UTC)
    history.fetch(_runner(fake_slurm), "1m", "sacct", now)
    start = _sacct_start(log.read_text().splitlines()[-1])
    assert abs(start.timestamp() - (now - 3 * 86400)) < 2


def test_a_short_history_read_that_times_out_blames_slurmdbd_not_the_window(
    fake_slurm: Path, tmp_path: Path
) -> None:
    _log_sacct_args(fake_slurm, "exec sleep 5\n")
    runner = Runner(timeout_s=1, env={**os.environ, "PATH": f"{fake_slurm}:{os.environ['PATH']}"})
    history = History()
    now = time.time()
    history.read_at = now - 600
    history.next_since = dt.datetime.fromtimestamp(now - 600, dt.UTC)
    with pytest.raises(SlurmTimeout) as got:
        history.fetch(runner, "30d", "sacct", now)
    said = str(got.value)
    assert "(10 min)" in said and "slurmdbd may be overloaded or hung" in said and "--since" not in said


def test_history_rows_sacct_split_are_a_warning_not_a_silent_gap(fake_slurm: Path, tmp_path: Path) -> None:
    """A job name with a line break splits its row in two; both halves are unreadable, and the pass says
    so (the job would otherwise vanish from the history, and from the repeat-failure hold)."""
    old = (fake_slurm / "sacct").read_text().removeprefix("#!/bin/sh\n").rstrip("\n")
    _script(fake_slurm / "sacct", "{ " + old + "; echo '99|nl'; echo 'name|bob|x'; }\n")
    report = SlurmSync(_runner(fake_slurm), SyncOptions(db=tmp_path / "j.duckdb"), RatePredictor).run_pass()
    assert report.ok and report.plan is not None and report.plan.warning is not None
    assert "2 rows of sacct's history could not be read" in report.plan.warning


def _sacct_fails_while(fake_slurm: Path, flag: str) -> Path:
    """The stand-in sacct answers as with slurmdbd stopped while `$DIR/<flag>` exists."""
    msg = (
        "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
        "host:localhost:6819: Connection refused"
    )
    old = (fake_slurm / "sacct").read_text().removeprefix("#!/bin/sh\n")
    _script(
        fake_slurm / "sacct", f'if [ -e "{fake_slurm / flag}" ]; then echo "{msg}" >&2; exit 1; fi\n' + old
    )
    return fake_slurm / flag


def test_with_slurmdbd_down_a_pass_ranks_with_the_history_read_before_and_says_how_old(
    fake_slurm: Path, tmp_path: Path
) -> None:
    dbd_down = _sacct_fails_while(fake_slurm, "dbd_down")
    t = [1_800_000_000.0]
    sync = SlurmSync(
        _runner(fake_slurm), SyncOptions(db=tmp_path / "j.duckdb"), RatePredictor, clock=lambda: t[0]
    )
    first = sync.run_pass()
    assert first.ok and first.plan is not None and first.plan.warning is None
    dbd_down.touch()
    t[0] += 300
    second = sync.run_pass()
    assert second.ok and second.plan is not None and second.plan.history_new == 0
    assert [r.job_id for r in second.plan.rows] == [r.job_id for r in first.plan.rows]
    assert second.plan.warning == (
        "sacct: slurmdbd (accounting) is not answering: sacct: error: slurm_persist_conn_open_without_init: "
        "failed to open persistent connection to host:localhost:6819: Connection refused; ranking with the "
        "history read from sacct 5 min ago"
    )
    assert second.to_json()["warning"] == second.plan.warning


def test_with_slurmdbd_down_and_no_history_ever_read_the_pass_fails(fake_slurm: Path, tmp_path: Path) -> None:
    _sacct_fails_while(fake_slurm, "dbd_down").touch()
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(db=tmp_path / "none.duckdb"), RatePredictor)
    report = sync.run_pass()
    assert not report.ok and "slurmdbd (accounting) is not answering" in (report.error or "")


def test_why_with_slurmdbd_down_answers_from_the_stores_history_and_says_so(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    db = tmp_path / "j.duckdb"
    assert SlurmSync(_runner(fake_slurm), SyncOptions(apply=True, db=db), RatePredictor).run_pass().ok
    _sacct_fails_while(fake_slurm, "dbd_down").touch()
    monkeypatch.setenv("PATH", f"{fake_slurm}:{os.environ['PATH']}")
    monkeypatch.setattr("headway.slurm.sync.default_predictor", RatePredictor)
    res = CliRunner().invoke(app, ["slurm", "why", "5", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "slurmdbd (accounting) is not answering" in res.output
    assert "ranking with the store's history (its newest job ended" in res.output


def test_sync_reads_sacct_times_right_whatever_zone_sacct_would_print_in(
    fake_slurm: Path, tmp_path: Path
) -> None:
    epoch = 1_800_000_000
    fields = "JobID|JobName|User|State|Submit|Start|End|AllocTRES"
    _script(
        fake_slurm / "sacct",
        f't=$(date -d @{epoch} +%Y-%m-%dT%H:%M:%S)\necho "{fields}"\n'
        'echo "77|a|alice|COMPLETED|$t|$t|$t|gres/gpu=1"\n',
    )
    runner = Runner(
        timeout_s=10, env={**os.environ, "PATH": f"{fake_slurm}:{os.environ['PATH']}", "TZ": "Asia/Tokyo"}
    )
    sync = SlurmSync(runner, SyncOptions(db=tmp_path / "j.duckdb", since="3000d"), RatePredictor)
    assert sync.run_pass().ok
    end = sync.history.jobs["77"].end_time
    assert end is not None and end.timestamp() == epoch


def test_a_job_named_with_the_separator_stays_in_the_history(
    fake_slurm: Path, tmp_path: Path, shared_traces: Path
) -> None:
    """`-J 'x|y'` must not dodge the repeat-failure hold by vanishing from the history: headway asks sacct
    for ASCII's unit separator between fields (this stand-in prints what sacct prints when asked so)."""
    sample = shared_traces / SLURM / "sacct_allocations.txt"
    _script(
        fake_slurm / "sacct",
        'case "$*" in *--delimiter=*) ;; *) echo "no --delimiter" >&2; exit 1;; esac\n'
        f"sed 's/|/\\x1f/g; 2s/\\x1fpretrain-llm\\x1f/\\x1fx|y\\x1f/' \"{sample}\" | head -n 11\n",
    )
    sync = SlurmSync(_runner(fake_slurm), SyncOptions(db=tmp_path / "j.duckdb"), RatePredictor)
    report = sync.run_pass()
    assert report.ok and report.plan is not None and report.plan.history_new == 10
    assert sync.history.jobs["1"].name == "x|y"


def test_an_interval_under_a_second_is_refused_before_any_pass() -> None:
    from typer.testing import CliRunner

    from headway.cli import app
    from headway.commands.slurm import parse_interval

    assert parse_interval("1s") == 1.0 and parse_interval("1500ms") == 1.5 and parse_interval("2m") == 120.0
    for text in ("0.0001ms", "500ms", "0.5", "0s"):
        with pytest.raises(ValueError, match="at least 1 s"):
            parse_interval(text)
    res = CliRunner().invoke(app, ["slurm", "sync", "--interval", "0.0001ms"])
    assert res.exit_code == 1 and "--interval '0.0001ms': at least 1 s" in res.output, res.output


def test_pass_errors_and_summary_lines_stay_one_line_each_on_a_narrow_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from rich.console import Console

    from headway.commands import slurm as cmd

    buf = io.StringIO()
    narrow = Console(file=buf, width=40, highlight=False)
    for where in ("headway.commands.slurm.out", "headway.commands.slurm.err", "headway.console.out"):
        monkeypatch.setattr(where, narrow)
    error = (
        "sacct: slurmdbd (accounting) is not answering: sacct: error: slurm_persist_conn_open_without_init: "
        "failed to open persistent connection to host:localhost:6819: Connection refused"
    )
    cmd._print_report(PassReport(seq=3, at=0.0, ok=False, dry_run=True, error=error), False, False)
    assert buf.getvalue() == f"pass 3: {error}; nothing written\n"
    plan = Plan(0.0, "squeue --json", 40, 0, 0, 0, [], [str(i) for i in range(100, 140)], [])
    buf.truncate(0)
    buf.seek(0)
    cmd._print_report(PassReport(seq=4, at=0.0, ok=True, dry_run=False, plan=plan, error=error), False, False)
    lines = buf.getvalue().splitlines()
    assert lines[-3] == "left alone (no GPUs requested): " + ", ".join(str(i) for i in range(100, 140))
    assert lines[-2] == "0 to change, 0 unchanged; written 0, failed 0, not attempted 0"
    assert lines[-1] == f"pass 4: {error}"


def test_slow_training_does_not_make_the_queue_stale_it_runs_before_the_queue_is_read(
    fake_slurm: Path, tmp_path: Path
) -> None:
    t = [1_800_000_000.0]

    class SlowTrainer(RatePredictor):
        def maybe_retrain(self, now: float) -> bool:
            t[0] += 120.0  # a long history: training takes two minutes
            return True

    sync = SlurmSync(
        _runner(fake_slurm),
        SyncOptions(apply=True, db=tmp_path / "j.duckdb"),
        SlowTrainer,
        clock=lambda: t[0],
    )
    report = sync.run_pass()
    assert report.ok and report.error is None and report.applied
    assert report.plan is not None and report.plan.read_at == t[0]  # the queue was read after training


def test_why_shows_every_partitions_sprio_line_of_a_job_pending_in_two(
    fake_slurm: Path, tmp_path: Path, shared_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    lines = (shared_traces / SLURM / "sprio_long.txt").read_text().splitlines()
    five = next(ln for ln in lines[1:] if ln.split()[0] == "5")
    debug = five.replace(" gpu ", " debug", 1).replace("10000", " 2000", 2)  # as `-p gpu,debug` shows it
    (tmp_path / "sprio5.txt").write_text("\n".join([lines[0], five, debug]) + "\n")
    sprio = (
        (fake_slurm / "sprio")
        .read_text()
        .replace(str(shared_traces / SLURM / "sprio_long.txt"), str(tmp_path / "sprio5.txt"))
    )
    (fake_slurm / "sprio").write_text(sprio)
    monkeypatch.setenv("PATH", f"{fake_slurm}:{os.environ['PATH']}")
    monkeypatch.setattr("headway.slurm.sync.default_predictor", RatePredictor)
    db = str(tmp_path / "x.duckdb")
    res = CliRunner().invoke(app, ["slurm", "why", "5", "--json", "--db", db])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    parts = [(p["partition"], p["priority"]) for p in doc["slurm_partitions"]]
    assert parts == [("gpu", 10000), ("debug", 2000)] and doc["slurm"]["priority"] == 10000
    text = CliRunner().invoke(app, ["slurm", "why", "5", "--db", db])
    assert text.exit_code == 0 and text.stdout.count("(sprio,") == 2, text.stdout  # one table a partition
    assert "debug" in text.stdout and "2000" in text.stdout


@pytest.mark.parametrize("job_id", ["", "  ", "26,27", "26 27", ","])
def test_why_refuses_anything_but_one_job_id(job_id: str) -> None:
    """An empty id said "job  is not in Slurm's queue", a list "ask again" (which never helps)."""
    from typer.testing import CliRunner

    from headway.cli import app

    res = CliRunner().invoke(app, ["slurm", "why", job_id])
    assert res.exit_code == 1 and "give one job id" in res.output and "`sacct -j `" not in res.output


@pytest.mark.parametrize(
    ("text", "ok"), [("1s", True), ("24h", True), ("25h", False), ("99999999999h", False)]
)
def test_an_interval_over_a_day_is_refused(text: str, ok: bool) -> None:
    from headway.commands.slurm import parse_interval

    if ok:
        assert parse_interval(text) > 0
    else:
        with pytest.raises(ValueError, match="at most 24h"):
            parse_interval(text)


def test_a_bad_db_or_a_since_in_the_future_fails_once_at_startup_not_every_pass(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    monkeypatch.setenv("PATH", f"{fake_slurm}:{os.environ['PATH']}")
    monkeypatch.setattr("headway.slurm.sync.default_predictor", RatePredictor)
    notes = tmp_path / "notes.txt"
    notes.write_text("JobID|State\n1|COMPLETED\n")
    loop = ["slurm", "sync", "--interval", "1s", "--max-passes", "3", "--json"]
    cases = [
        (["--db", str(notes)], "not a headway job store"),
        (["--db", str(tmp_path / "nodir" / "j.duckdb"), "--apply"], "no such directory"),
        (["--db", str(tmp_path), "--apply"], "is a directory"),
        (["--db", str(tmp_path / "j.duckdb"), "--since", "2999-01-01"], "in the future"),
    ]
    for args, said in cases:
        res = CliRunner().invoke(app, [*loop, *args])
        assert res.exit_code == 1 and said in res.output, (args, res.output)
        assert '"pass"' not in res.stdout  # no pass ran
    assert not (fake_slurm / "scontrol.log").exists()


def test_sync_help_wraps_at_the_terminal_not_mid_sentence() -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    res = CliRunner().invoke(app, ["slurm", "sync", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    assert "(incrementally), and current SiteFactors from `sprio`. A dry run" in res.output, res.output


def test_the_squeue_text_fallback_reads_times_right_whatever_zone_this_process_runs_in(
    tmp_path: Path,
) -> None:
    """`squeue -O` prints local time without a zone, and the hour the clocks go back reads twice: headway
    runs it with TZ=UTC and reads UTC (this stand-in prints the time in the zone it is run with)."""
    from headway.slurm.queue import read_queue

    epoch = 1_800_000_000
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sep = "\\037"
    cells = "5 PENDING bob (null) x gpu normal $t N/A UNLIMITED 1 gres:gpu:1 N/A 0 Priority 5 1 N/A N/A"
    line = sep.join([*cells.split(), ""])
    _script(
        bin_dir / "squeue",
        'case "$1" in --json) echo "squeue: unrecognized option --json" >&2; exit 1;; esac\n'
        f't=$(date -d @{epoch} +%Y-%m-%dT%H:%M:%S)\nprintf "{line}\\n"\n',
    )
    runner = Runner(
        timeout_s=10, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TZ": "Asia/Tokyo"}
    )
    jobs, source = read_queue(runner)
    assert source == "squeue -O" and [j.submit_time for j in jobs] == [epoch]


def test_squeue_time_limits_in_day_hour_forms_and_out_of_range_fields() -> None:
    """`1-02` (D-HH) was read as a day and 2 seconds; `1-25:99:00` as 182340 s."""
    assert parse_duration("1-02") == 86400 + 2 * 3600
    assert parse_duration("1-02:30") == 86400 + 2 * 3600 + 30 * 60
    assert parse_duration("Partition_Limit") is None and parse_duration("UNLIMITED") is None
    with pytest.raises(ValueError, match="out of range"):
        parse_duration("1-25:99:00")


def test_the_slurm_adapter_imports_nothing_from_the_audit() -> None:
    """slurm/ and audit/ are separate parts: what both need (spoken durations) lives in a shared module."""
    import ast
    from pathlib import Path

    import headway.slurm

    found = []
    for path in Path(headway.slurm.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{path.name}: {n}" for n in names if n == "headway.audit" or n.startswith("headway.audit.")
            ]
    assert found == []


def test_the_snapshot_decays_each_gpu_second_from_when_it_was_used_and_shares_among_every_user_seen() -> None:
    """sacct's history through the shared book (policy/inputs.py): a run's usage decays from when each
    GPU-second was used (not all from its end), running jobs accrue while they run, every user of the
    history or the queue takes an equal share, and a nameless job with an account is keyed by the account."""
    import math

    from headway.policy.inputs import HALF_LIFE_S
    from headway.schema import JobRecord, State
    from headway.slurm.queue import NodeGpus, QueueJob
    from headway.slurm.sync import build_snapshot

    h, day, now = HALF_LIFE_S, 86400.0, 1.8e9

    def ended(i: int, user: str, state: State, start: float, end: float) -> JobRecord:
        utc = [dt.datetime.fromtimestamp(t, dt.UTC) for t in (start, end)]
        return JobRecord(
            str(i), state, "sacct", user=user, group="lab", gpus=8.0, start_time=utc[0], end_time=utc[1]
        )

    def queued(i: int, state: str, user: str, start: float | None = None) -> QueueJob:
        return QueueJob(str(i), state, user, "lab", None, None, None, now - 60, start, 2.0, 1, None, None)

    def preds(n: int) -> Predictions:
        return Predictions(np.ones(n), np.ones(n), np.ones(n), np.ones(n))

    history = [ended(1, "ann", State.COMPLETED, now - 14 * day, now - 7 * day)]
    history += [
        ended(2 + i, "bob", State.FAILED, now - 3600 * (3 - i), now - 3000 * (3 - i)) for i in range(3)
    ]
    pending = [queued(10, "PENDING", "bob"), queued(11, "PENDING", "cy")]
    running = [queued(12, "RUNNING", "dee", now - day)]
    nodes = [NodeGpus("n0", 4, 2, "mixed")]
    snap = build_snapshot(pending, running, nodes, preds(2), preds(1), history, now, 1)
    usage = dict(zip(snap.users, snap.usage.tolist(), strict=True))
    ann = 8 * 7 * day * (1 - 2**-1) / math.log(2) * 2**-1  # 3.49e6 at its end, a half-life ago
    assert usage["ann"] == pytest.approx(ann, abs=1e-3)
    assert usage["dee"] == pytest.approx(2 * (1 - 2 ** (-day / h)) * h / math.log(2), abs=1e-3)
    assert usage["cy"] == 0.0 and set(snap.shares.tolist()) == {0.25}
    assert snap.pending.fail_streak.tolist() == [3, 0]  # bob's nameless jobs: keyed by bob + lab


def test_running_jobs_are_preemptable_by_their_qos_and_carry_the_predictors_survival(
    shared_traces: Path,
) -> None:
    """squeue --json names each job's QOS, what Slurm's preempt/qos preempts by: the running jobs of the
    QOS given to --preemptible-qos (default `low`, matched without regard to case) are preemptable, the
    others and a job without a QOS not; p_success and time to failure are the predictor's for each."""
    from headway.policy.snapshot import Snapshot
    from headway.slurm.queue import NodeGpus
    from headway.slurm.sync import DEFAULT_PREEMPTIBLE_QOS, build_snapshot, parse_qos_list

    doc = json.loads((shared_traces / SLURM / "squeue_pending.json").read_text())
    running_ids = [j["job_id"] for j in doc["jobs"] if j["job_state"] == "RUNNING"]
    qos = dict(zip(running_ids, ["low", "Scavenger", "normal", None], strict=True))
    for j in doc["jobs"]:
        if j["job_id"] in qos:
            j["qos"] = qos[j["job_id"]]
    jobs = parse_squeue_json(json.dumps(doc))
    pending = [j for j in jobs if j.state == "PENDING"]
    running = [j for j in jobs if j.state == "RUNNING"]
    assert [j.qos for j in running] == ["low", "Scavenger", "normal", None]

    def preds(p: list[float], ttf: list[float]) -> Predictions:
        n = len(p)
        return Predictions(np.array(p), np.full(n, 3600.0), np.full(n, 7200.0), np.array(ttf))

    pred_pending = preds([0.5] * len(pending), [60.0] * len(pending))
    pred_running = preds([0.9, 0.2, 0.7, 0.4], [600.0, 30.0, 900.0, 120.0])
    nodes = [NodeGpus("n1", 8, 8, "allocated")]
    now = max(j.submit_time for j in jobs) + 60

    def snapshot(preemptible_qos: frozenset[str]) -> Snapshot:
        return build_snapshot(
            pending, running, nodes, pred_pending, pred_running, [], now, 1, preemptible_qos
        )

    assert parse_qos_list("low") == DEFAULT_PREEMPTIBLE_QOS
    assert snapshot(DEFAULT_PREEMPTIBLE_QOS).running.preemptible.tolist() == [True, False, False, False]
    run = snapshot(parse_qos_list(" low, SCAVENGER ,")).running
    assert run.preemptible.tolist() == [True, True, False, False]
    assert run.p_success.tolist() == [0.9, 0.2, 0.7, 0.4]
    assert run.time_to_failure.tolist() == [600.0, 30.0, 900.0, 120.0]
    assert np.isnan(run.checkpoint_every).all() and np.isnan(run.last_preempted).all()
    assert not snapshot(parse_qos_list("")).running.preemptible.any()
