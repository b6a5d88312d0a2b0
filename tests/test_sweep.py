"""`headway sweep`: the grid, its summary over seeds, and a real run on a 2-worker Dask LocalCluster."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.sim.cluster import ClusterSpec
from headway.sim.metrics import compute
from headway.sim.sweep import Cell, CellResult, grid, iter_rows, run_grid, summarise
from headway.sim.synth import generate

runner = CliRunner()


class HalfPredictor:
    """A fixed guess (p = 0.5, 1 h runtime): keeps the grid test independent of the trained predictor."""

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        n = len(jobs)
        return Predictions(np.full(n, 0.5), np.full(n, 3600.0), np.full(n, 5400.0), np.full(n, 600.0))

    def observe_end(self, ended: EndedJob) -> None:
        return None

    def maybe_retrain(self, now: float) -> bool:
        return False


# Dask workers cannot import this test module: ship HalfPredictor to them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_grid_runs_predicting_policies_per_seed_and_the_others_once_per_load() -> None:
    cells = grid(["fifo", "impact"], [0.8, None], [0, 1, 2])
    assert len(cells) == 8 and len(set(cells)) == 8
    assert {c.load_label for c in cells} == {"0.8", "natural"}
    assert sorted(c.seed for c in cells if c.policy == "impact") == [0, 0, 1, 1, 2, 2]
    assert [c.seed for c in cells if c.policy == "fifo"] == [0, 0]  # its replay ignores the seed


def test_the_seed_reaches_the_predictors_training_and_seed_0_is_its_default() -> None:
    from headway.predict.online import ONLINE_CONFIG
    from headway.sim.run import default_predictor_factory

    assert default_predictor_factory().config == ONLINE_CONFIG
    assert default_predictor_factory(2).config.seed == ONLINE_CONFIG.seed + 2


def test_summary_takes_the_median_over_seeds_with_min_and_max() -> None:
    res = [
        CellResult(Cell("fifo", 1.0, s), {"utilisation": u, "queue_delay_p99": None})
        for s, u in enumerate([0.5, 0.9, 0.6])
    ]
    summary = summarise(res, ["utilisation", "queue_delay_p99"])
    u = summary[("fifo", "1.0")]["utilisation"]
    assert (u.median, u.low, u.high, u.n) == (0.6, 0.5, 0.9, 3)
    assert summary[("fifo", "1.0")]["queue_delay_p99"].median is None
    rows = list(iter_rows(summary))
    assert rows[0]["metrics"]["utilisation"]["seeds"] == 3


@pytest.mark.slow
def test_grid_runs_on_a_local_dask_cluster_and_matches_a_local_run() -> None:
    jobs = generate(150, seed=3)
    spec = ClusterSpec.from_flags(4, 8, 2)
    cells = grid(["fifo", "multifactor", "impact"], [0.8, 1.0], [0, 1])
    done: list[CellResult] = []
    results = run_grid(jobs, spec, cells, workers=2, on_done=done.append, predictor_factory=HalfPredictor)
    assert [r.cell for r in results] == cells
    assert len(done) == len(cells)
    from headway.sim.run import run_simulation

    local = compute(
        run_simulation(jobs, spec, policy="impact", load=1.0, seed=1, predictor_factory=HalfPredictor)
    )
    remote = next(r for r in results if r.cell == Cell("impact", 1.0, 1)).metrics
    assert remote["time_to_success_mean"] == pytest.approx(local["time_to_success_mean"])
    assert remote["utilisation"] == pytest.approx(local["utilisation"])
    for r in results:
        assert 0 < float(r.metrics["utilisation"] or 0) <= 1.0


@pytest.mark.slow
def test_sweep_command_prints_one_json_row_per_policy_and_load(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    pq.write_table(generate(120, seed=4), trace)
    args = ["sweep", str(trace), "--nodes", "4", "--policy", "fifo,multifactor", "--load", "0.9,natural"]
    res = runner.invoke(app, [*args, "--seeds", "0,1", "--workers", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["grid"]["loads"] == [0.9, "natural"]
    assert {(r["policy"], r["load"]) for r in doc["rows"]} == {
        ("fifo", 0.9),
        ("multifactor", 0.9),
        ("fifo", "natural"),
        ("multifactor", "natural"),
    }
    for r in doc["rows"]:
        m = r["metrics"]["time_to_success_mean"]
        assert m["seeds"] == 1  # fifo and multifactor read no predictions: one run per load
        assert m["min"] == m["median"] == m["max"]


def test_sweep_rejects_a_bad_scheduler_address(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    pq.write_table(generate(10, seed=4), trace)
    res = runner.invoke(app, ["sweep", str(trace), "--scheduler", "localhost:8786"])
    assert res.exit_code == 1
    assert "tcp://HOST:PORT" in res.output


@pytest.mark.slow
def test_a_load_the_trace_cannot_take_is_one_line_naming_the_cell(tmp_path: Path) -> None:
    trace = tmp_path / "one.parquet"
    pq.write_table(generate(1, seed=4), trace)  # one job: no arrival rate to rescale
    res = runner.invoke(app, ["sweep", str(trace), "--nodes", "4", "--policy", "fifo", "--load", "1.0"])
    assert res.exit_code == 1 and (res.exception is None or isinstance(res.exception, SystemExit))
    assert "fifo at load 1.0: --load cannot rescale this trace" in res.output
    assert "Traceback" not in res.output


@pytest.mark.slow
def test_a_grid_that_leaves_every_job_out_is_an_error_not_a_table_of_dashes(tmp_path: Path) -> None:
    t = generate(20, seed=4)
    t = t.set_column(t.schema.get_field_index("gpus"), "gpus", pa.array([0.0] * t.num_rows))
    trace = tmp_path / "cpu.parquet"
    pq.write_table(t, trace)
    res = runner.invoke(app, ["sweep", str(trace), "--nodes", "4", "--policy", "fifo", "--load", "natural"])
    assert res.exit_code == 1
    assert "every job was left out" in res.output and "20 CPU-only" in res.output


def test_an_address_that_never_answers_as_a_scheduler_fails_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port that takes the connection and says nothing (a dashboard, any HTTP server) made the sweep
    wait forever: Dask's own timeout does not cover its handshake."""
    import socket
    import time

    import headway.sim.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "CONNECT_DEADLINE_S", 3.0)
    trace = tmp_path / "t.parquet"
    pq.write_table(generate(10, seed=4), trace)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        res = runner.invoke(app, ["sweep", str(trace), "--scheduler", f"tcp://127.0.0.1:{port}"])
        took = time.monotonic() - t0
    assert res.exit_code == 1 and "no Dask scheduler answered within 3 s" in res.output, res.output
    assert took < 30


def test_workers_print_no_arrow_warnings(tmp_path: Path) -> None:
    """Tables reach the workers unpickled, with unaligned buffers: an Acero group-by warned on each."""
    import subprocess
    import sys

    trace = tmp_path / "t.parquet"
    pq.write_table(generate(120, seed=4), trace)
    cmd = [sys.executable, "-m", "headway.cli", "sweep", str(trace), "--nodes", "4", "--policy", "fifo"]
    res = subprocess.run([*cmd, "--seeds", "0,1", "--workers", "2", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "poorly aligned" not in res.stderr and "arrow" not in res.stderr.lower()


@pytest.mark.slow
def test_a_cell_whose_cluster_is_too_big_for_memory_is_one_line_naming_the_cell(tmp_path: Path) -> None:
    """A node of 10^15 GPUs made numpy refuse the cluster's arrays on the worker; the MemoryError came
    back to the client as a traceback, where a load the trace cannot take is one line naming the cell."""
    trace = tmp_path / "one.parquet"
    pq.write_table(generate(5, seed=4), trace)
    c = tmp_path / "c.toml"
    c.write_text(f"[[nodes]]\ncount = 1\ngpus = {10**15}\n")
    res = runner.invoke(
        app, ["sweep", str(trace), "--cluster", str(c), "--policy", "fifo", "--load", "natural"]
    )
    assert res.exit_code == 1 and (res.exception is None or isinstance(res.exception, SystemExit))
    assert "fifo at load natural: not enough memory for this replay" in " ".join(res.output.split())


def test_a_scheduler_with_no_worker_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler that no worker had joined ended the sweep with Dask's 'No valid workers found' after
    its timeout, naming neither the scheduler nor what to do: it names the `dask worker` command."""
    import socket
    import subprocess
    import time

    import headway.sim.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "WORKER_WAIT_S", 2.0, raising=False)
    trace = tmp_path / "t.parquet"
    pq.write_table(generate(10, seed=4), trace)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port)]
    sched = subprocess.Popen(
        [*cmd, "--dashboard-address", ":0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and sched.poll() is None, "the scheduler did not start"
                time.sleep(0.2)
        res = runner.invoke(app, ["sweep", str(trace), "--scheduler", address, "--seeds", "1", "-p", "fifo"])
    finally:
        sched.terminate()
        sched.wait(10)
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and f"{address}: the scheduler has no worker" in text, res.output
    assert f"`dask worker {address}`" in text
