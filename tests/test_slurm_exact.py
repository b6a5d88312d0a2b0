"""Issue 23, "exact on Slurm", without a cluster: held jobs read from real 22.05 squeue output, every
ranked job strictly above the low end, a scontrol that echoes nothing still counted right, and `why`
saying when a job ranks high because it would fail fast. The live checks of the same promises, against a
real slurmctld, are in test_slurm_live.py."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

import pytest

from headway.slurm import sitefactor
from headway.slurm.explain import fails_fast, rank_in_words
from headway.slurm.queue import parse_squeue_json, parse_squeue_text
from headway.slurm.runner import Runner
from headway.slurm.sitefactor import Change, FactorRange, apply_changes, place_ranks
from headway.slurm.sync import PlanRow

HERE = Path(__file__).resolve().parent / "slurm"


# --------------------------------------------------------------------------- held jobs
def test_held_jobs_are_told_by_squeue_json_and_text_from_a_real_22_05_queue() -> None:
    """`scontrol hold` (JobHeldAdmin), `scontrol uhold` and `sbatch -H` (JobHeldUser): priority 0 and
    held, read from both forms of squeue's output; a job waiting for resources is not held."""
    by_json = {j.job_id: j for j in parse_squeue_json((HERE / "squeue_held_22.05.json").read_text())}
    by_text = {j.job_id: j for j in parse_squeue_text((HERE / "squeue_held_22.05.txt").read_text(), utc=True)}
    for jobs in (by_json, by_text):
        assert {k for k, j in jobs.items() if j.held} == {"108", "109", "110"}
        assert jobs["108"].reason == "JobHeldAdmin" and jobs["109"].reason == "JobHeldUser"
        assert all(jobs[k].priority == 0 and jobs[k].cannot_start for k in ("108", "109", "110"))
        assert not jobs["107"].held and not jobs["107"].cannot_start and jobs["107"].priority == 10000
        assert not jobs["106"].held  # running


def test_a_pending_job_at_priority_0_is_held_whatever_its_reason_says() -> None:
    from dataclasses import replace

    (job,) = [
        j for j in parse_squeue_json((HERE / "squeue_held_22.05.json").read_text()) if j.job_id == "108"
    ]
    assert replace(job, reason=None).held  # Slurm floors every other job's priority at 1
    assert not replace(job, reason=None, priority=1).held


# --------------------------------------------------------------------------- the low end
def test_the_last_ranked_new_job_sits_above_the_low_end_kept_for_held_jobs() -> None:
    """Two ranked jobs spread over the middle of 0:100000; a third arrives below them. It used to get 0,
    Slurm's default, so it was not even written and tied with held and CPU-only jobs."""
    rng = FactorRange(0, 100000)
    first = place_ranks(["a", "b"], {}, rng)
    assert first == {"a": 87500, "b": 12500}
    placed = place_ranks(["a", "b", "c"], first, rng)
    assert placed["a"] == 87500 and placed["b"] == 12500  # an arrival rewrites only itself
    assert rng.lo < placed["c"] < placed["b"]  # 1: the room there is, short of LO
    # More jobs than the middle three quarters hold: the whole range, still never LO itself.
    tight = FactorRange(0, 10)
    many = [str(i) for i in range(10)]
    assert min(place_ranks(many, {}, tight).values()) == 1
    # A job whose value is LO (a held job just released) is placed again, not kept there.
    back = place_ranks(["a", "b", "held"], {"a": 87500, "b": 12500, "held": -5}, FactorRange(-5, 100000))
    assert back["held"] > -5 and back["a"] == 87500


def test_a_queue_arriving_at_the_bottom_never_puts_a_job_on_the_low_end() -> None:
    """FIFO motion, the drift that runs the bottom out of room: 300 passes, one job leaving at the top and
    one arriving at the bottom each; before, the newest sat at LO (tied with held jobs) in some of them."""
    rng = FactorRange(0, 100000)
    order = [f"j{i}" for i in range(450)]
    cur = place_ranks(order, {}, rng)
    for p in range(300):
        order = [*order[1:], f"n{p}"]
        cur = {j: v for j, v in place_ranks(order, cur, rng).items()}
        vals = [cur[j] for j in order]
        assert min(vals) > rng.lo and all(a > b for a, b in itertools.pairwise(vals))


# --------------------------------------------------------------------------- writes counted one by one
def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_a_scontrol_that_echoes_nothing_is_fed_in_one_go_and_judged_by_what_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scontrol built without readline echoes no command: after FIRST_ECHO_S the rest of the batch goes
    in one go, and its exit status and the jobs its messages name say what was written."""
    monkeypatch.setattr(sitefactor, "FIRST_ECHO_S", 0.2)
    log = tmp_path / "log"
    _script(
        tmp_path / "scontrol",
        f'rc=0\nwhile read -r line; do echo "$line" >> "{log}"\n'
        '  case "$line" in *JobId=6\\ *) echo "Invalid job id specified for job 6" >&2; rc=1;; esac\n'
        "done\nexit $rc\n",
    )
    runner = Runner(timeout_s=10, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    changes = [Change(str(i), None, 100 + i) for i in range(5, 9)]
    rep = apply_changes(runner, changes)
    assert len(log.read_text().splitlines()) == 4 and rep.commands == 1 and rep.aborted is None
    assert rep.failed == {"6": "Invalid job id specified for job 6"}
    assert [c.job_id for c in rep.applied] == ["5", "7", "8"] and rep.not_attempted == []
    assert rep.counts() == "written 3, failed 1, not attempted 0"


# --------------------------------------------------------------------------- why, in words
def _row(
    job: str, rank: int, p: float, r_h: float, f_h: float, gpus: float = 1.0, tier: str = "normal"
) -> PlanRow:
    c = gpus * (p * r_h + (1 - p) * f_h)
    factors = {"p": p, "R_h": r_h, "F_h": f_h, "c_gpu_h": c, "w": 1.0, "fairshare": 1.0, "waited_h": 0.5}
    return PlanRow(job, "ann", "x", gpus, rank, tier, 1.0 / c, factors, "", None, 0)


def test_why_says_a_job_ranks_high_because_it_fails_fast_and_is_cheap_to_try() -> None:
    """p = 0.2, but a failure comes within 6 minutes of a 2-hour run: c = 0.2 x 2 + 0.8 x 0.1 = 0.48
    GPU-hours, below the others' (4-GPU jobs likely to finish), so it ranks first."""
    quick = _row("7", 1, p=0.2, r_h=2.0, f_h=0.1)
    rows = [quick, _row("8", 2, 0.9, 4.0, 1.0, gpus=4), _row("9", 3, 0.9, 6.0, 1.0, gpus=4)]
    said = rank_in_words(quick, rows)
    assert said is not None and said == fails_fast(quick, rows)
    assert said.startswith("ranks high because, if it fails, it fails fast: predicted failure within 6m")
    assert "trying it costs little (0.48 expected GPU-hours, against 15 for the median ranked job)" in said
    assert "p = 0.20" in said


def test_why_says_nothing_of_failing_fast_where_that_is_not_why_a_job_ranks_high() -> None:
    likely = _row("1", 1, p=0.9, r_h=1.0, f_h=0.5)  # cheap because it is short, not because it fails fast
    slow_failure = _row("2", 1, p=0.2, r_h=1.0, f_h=3.0)  # a failure would take longer than a success
    bottom = _row("3", 3, p=0.2, r_h=2.0, f_h=0.1)  # fails fast, but ranks last (say, others waited more)
    others = [_row("8", 2, 0.9, 4.0, 1.0, gpus=4), _row("9", 3, 0.9, 6.0, 1.0, gpus=4)]
    for row in (likely, slow_failure):
        assert fails_fast(row, [row, *others]) is None
    assert fails_fast(bottom, [others[0], _row("x", 1, 0.9, 1.0, 1.0), bottom]) is None
    assert fails_fast(likely, [likely]) is None  # alone in the queue: first by default, not for a reason
    starved = _row("4", 1, 0.2, 2.0, 0.1, tier="starved (past max_wait)")
    said = rank_in_words(starved, [starved, *others])
    assert said is not None and "max_wait" in said and "fails fast" not in said
    no_cost = PlanRow("5", None, None, 1.0, 1, "queued", 1.0, {"waited_h": 1.0}, "", None, 0)  # fifo
    assert rank_in_words(no_cost, [no_cost, *others]) is None
