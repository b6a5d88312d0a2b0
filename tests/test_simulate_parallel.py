"""`headway simulate` runs its policies side by side in worker processes with the same results."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.sim.cluster import ClusterSpec
from headway.sim.fanout import PolicyError, RunArgs, auto_workers, run_parallel
from headway.sim.run import run_simulation
from headway.sim.synth import generate

runner = CliRunner()
CLUSTER = ["--nodes", "4", "--gpus-per-node", "8", "--nodes-per-rack", "2"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("par") / "synth.parquet"
    pq.write_table(generate(300, seed=5), p)
    return p


def _run(trace: Path, workers: str) -> dict[str, dict[str, dict[str, object]]]:
    res = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            *CLUSTER,
            "--policy",
            "fifo,las,impact",
            "--load",
            "0.9",
            "--json",
            *("--workers", workers),
        ],
    )
    assert res.exit_code == 0, res.output
    doc: dict[str, dict[str, dict[str, object]]] = json.loads(res.stdout)
    for m in doc["policies"].values():
        m.pop("sim_wall_seconds")  # how long each replay took: the one figure that may differ
    return doc


def test_parallel_replays_give_the_same_report_as_one_after_another(trace: Path) -> None:
    seq, par = _run(trace, "1"), _run(trace, "3")
    assert list(par["policies"]) == ["fifo", "las", "impact"]
    assert par == seq


def test_parallel_replays_return_identical_job_tables_and_report_progress(trace: Path) -> None:
    jobs = pq.read_table(trace)
    spec = ClusterSpec.from_flags(4, 8, 2)
    args = RunArgs(jobs, spec, None, 0.9, 0, frozenset(), False)
    seen: dict[str, list[int]] = {}
    par = run_parallel(
        args, ["impact", "fifo"], 2, lambda pol, done, total: seen.setdefault(pol, []).append(done)
    )
    for pol, res in zip(["impact", "fifo"], par, strict=True):
        one = run_simulation(jobs, spec, policy=pol, load=0.9)
        assert res.policy == pol
        assert res.jobs.equals(one.jobs)
        assert res.timeline.equals(one.timeline)
    assert set(seen) == {"impact", "fifo"}
    assert seen["impact"] == sorted(seen["impact"]) and seen["impact"][-1] == len(jobs)


def test_a_failing_replay_names_its_policy(trace: Path) -> None:
    args = RunArgs(pq.read_table(trace), ClusterSpec.from_flags(4, 8, 2), None, None, 0, frozenset(), False)
    with pytest.raises(PolicyError) as e:
        run_parallel(args, ["fifo", "no-such-policy"], 2)
    assert e.value.policy == "no-such-policy"
    assert "unknown policy" in str(e.value)


def test_automatic_worker_count_respects_cpus_memory_and_small_replays() -> None:
    gib = 2**30
    assert auto_workers(8, 100, 64 * gib) == 1  # a tiny replay: not worth starting processes
    many = auto_workers(8, 1_000_000, 64 * gib)
    assert 1 <= many <= 8
    assert auto_workers(8, 1_000_000, 2 * gib) == 1  # 1M-job replays need about 1.3 GB each
    assert auto_workers(3, 100_000, 64 * gib) <= 3
