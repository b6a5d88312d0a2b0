"""`headway simulate --cluster from-log` (the user's own nodes, from the log's node lists) and the
offered-load note that says when a model cluster does not suit the log replayed on it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.data import sample_path
from headway.sim.cluster import ClusterSpec
from headway.sim.log_cluster import NodeListError, _Run, expand_hostlist, peak_gpus
from headway.sim.sizing import ARRIVALS, LOG_SPAN, LoadCheck, suggest_nodes
from headway.sim.synth import generate

runner = CliRunner()
DATA = Path(__file__).parent / "data"
SACCT = sample_path("slurm-22.05-sacct.txt")  # the same bytes as ../shared's sacct_allocations.txt
THE_LAB_CLUSTER = {"n1": 8, "n2": 8, "n3": 4, "n4": 4}  # 2 x 8 a100, 2 x 4 v100 (its README)


def _json(*args: str) -> dict[str, Any]:
    res = runner.invoke(app, ["simulate", *args, "--policy", "fifo,multifactor", "--json"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


# ------------------------------------------------------------------------------------ from the command


@pytest.mark.shared
def test_from_log_gives_the_four_nodes_of_the_real_sacct_export(shared_traces: Path) -> None:
    doc = _json(str(shared_traces / "slurm-22.05" / "sacct_allocations.txt"), "--cluster", "from-log")
    cluster = doc["cluster"]
    assert cluster["from_log"]["node_gpus"] == THE_LAB_CLUSTER
    assert cluster["capacity_gpus"] == 24 and cluster["gpus_per_node"] == {"4": 2, "8": 2}
    assert cluster["from_log"]["jobs_placed"] == 23 and cluster["from_log"]["jobs_without_nodes"] == 0
    # every job fits its own cluster, the 2-node 16-GPU job too
    assert doc["excluded_counts"] == {} and doc["policies"]["fifo"]["jobs"] == 23


@pytest.mark.shared
@pytest.mark.parametrize("name", ["slurmdb_job_table.csv", "sacct.json", "sacct_with_steps.txt"])
def test_from_log_reads_the_same_nodes_from_every_export_of_that_cluster(
    shared_traces: Path, name: str
) -> None:
    doc = _json(str(shared_traces / "slurm-22.05" / name), "--cluster", "from-log")
    assert doc["cluster"]["from_log"]["node_gpus"] == THE_LAB_CLUSTER


@pytest.mark.shared
def test_default_cluster_on_the_real_sacct_export_says_its_load_is_low_and_suggests_nodes(
    shared_traces: Path,
) -> None:
    """64 x 8 GPUs for a 24-GPU cluster's log: every policy tied, and nothing said why."""
    log = str(shared_traces / "slurm-22.05" / "sacct_allocations.txt")
    res = runner.invoke(app, ["simulate", log, "--policy", "fifo,multifactor"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "offered 0.0235 from first submission to last end" in text  # the title: no arrival rate
    assert "note: offered load 0.024 on 512 GPUs" in text and "is below 0.5" in text
    assert "try --nodes 2 (16 GPUs, offered load 0.75)" in text
    check = _json(log)["load_check"]
    assert check["verdict"] == "low" and check["window"] == LOG_SPAN
    assert check["suggested_nodes"] == 2 and check["suggested_gpus_per_node"] == 8
    assert check["offered_load"] == pytest.approx(1373 / (512 * 114))  # GPU-seconds / (GPUs x span)


def test_from_log_on_the_bundled_sacct_sample_loads_it_within_range_so_no_note() -> None:
    res = runner.invoke(app, ["simulate", str(SACCT), "--cluster", "from-log", "--policy", "fifo"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "cluster from the log's nodes: 4 nodes, 24 GPUs: n1 8, n2 8, n3 4, n4 4" in text
    assert "the most GPUs seen in use on it at once" in text
    assert "note: offered load" not in text
    check = _json(str(SACCT), "--cluster", "from-log")["load_check"]
    assert check["verdict"] == "ok" and check["note"] is None and check["suggested_nodes"] is None
    assert check["offered_load"] == pytest.approx(1373 / (24 * 114))


def test_from_log_reads_the_slurmdb_job_tables_nodelist() -> None:
    doc = _json(str(DATA / "slurmdb_job_table_22.05.csv"), "--cluster", "from-log")
    assert doc["cluster"]["from_log"]["node_gpus"] == THE_LAB_CLUSTER


def test_a_multi_node_jobs_gpus_count_evenly_on_the_nodes_of_its_host_list() -> None:
    """sacct --json's 2-node job: 16 GPUs on `n[1-2]` make 8 on each, not 16 on one name."""
    doc = _json(str(DATA / "sacct_22.05_sample.json"), "--cluster", "from-log")
    nodes = doc["cluster"]["from_log"]["node_gpus"]
    assert nodes["n1"] == 8 and nodes["n2"] == 8 and set(nodes) == {"n1", "n2", "n3", "n4"}


def test_from_log_on_the_gzipped_philly_sample_counts_gpus_by_their_names() -> None:
    """A sampled log rarely shows a node full; Philly names the GPUs, and `gpu7` means 8 or more."""
    doc = _json(str(sample_path("philly_jobs.json.gz")), "--cluster", "from-log")
    cluster = doc["cluster"]
    assert cluster["nodes"] == 410 and cluster["capacity_gpus"] == 2304
    assert cluster["gpus_per_node"]["8"] == 239 and cluster["gpus_per_node"]["2"] == 143
    assert "highest GPU index" in cluster["from_log"]["rule"]
    check = doc["load_check"]  # its 410 nodes, of which the sample is a part, are mostly idle here
    assert check["verdict"] == "low" and check["window"] == ARRIVALS
    assert "--gpus-per-node 8 in place of --cluster from-log" in check["note"]


def test_the_load_note_is_left_out_when_load_sets_the_load(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", str(SACCT), "--policy", "fifo", "--json"])
    assert json.loads(res.stdout)["load_check"]["note"] is not None
    path = tmp_path / "t.parquet"
    pq.write_table(generate(120, seed=2), path)  # with an arrival rate, so --load can rescale it
    natural = runner.invoke(app, ["simulate", str(path), "--policy", "fifo"])
    assert natural.exit_code == 0 and "note: offered load" in natural.output  # 120 jobs on 512 GPUs
    loaded = runner.invoke(app, ["simulate", str(path), "--policy", "fifo", "--load", "1.0"])
    assert loaded.exit_code == 0, loaded.output
    assert "note: offered load" not in loaded.output


def test_a_heavy_log_on_a_small_cluster_is_called_heavy_with_more_nodes_suggested(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(generate(300, seed=4), path)
    doc = _json(str(path), "--nodes", "1", "--gpus-per-node", "8")
    check = doc["load_check"]  # the synthetic profile is busy: one 8-GPU node is far too small
    assert check["verdict"] == "high" and check["offered_load"] > 1.5 and check["suggested_nodes"] > 1
    assert "is above 1.5" in check["note"] and f"--nodes {check['suggested_nodes']}" in check["note"]
    assert 0.6 < check["suggested_load"] < 1.3


def test_sweep_takes_the_cluster_from_the_log_too() -> None:
    grid = ["--policy", "fifo", "--load", "natural", "--seeds", "0", "--workers", "1"]
    res = runner.invoke(app, ["sweep", str(SACCT), "--cluster", "from-log", *grid, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (
        doc["cluster"]["from_log"]["node_gpus"] == THE_LAB_CLUSTER and doc["cluster"]["capacity_gpus"] == 24
    )


# -------------------------------------------------------------------------------------------- errors


def _error(*args: str) -> str:
    res = runner.invoke(app, ["simulate", *args, "--policy", "fifo"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


def test_from_log_on_the_store_says_the_store_keeps_no_node_names(tmp_path: Path) -> None:
    db = tmp_path / "jobs.duckdb"
    assert runner.invoke(app, ["ingest", str(SACCT), "--db", str(db), "--tz", "UTC"]).exit_code == 0
    text = _error("--db", str(db), "--cluster", "from-log")
    assert "the job store keeps no node names" in text and "simulate FILE --cluster from-log" in text


def test_from_log_on_a_format_without_node_names_names_the_formats_that_have_them(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(generate(20, seed=1), path)
    text = _error(str(path), "--cluster", "from-log")
    assert "a parquet log names no nodes" in text and "sacct, slurmdb, philly" in text


def test_from_log_on_sacct_output_without_nodelist_asks_for_the_column(tmp_path: Path) -> None:
    lines = SACCT.read_text().splitlines()
    col = lines[0].split("|").index("NodeList")
    cut = tmp_path / "no_nodes.txt"
    cut.write_text(
        "\n".join("|".join(f for i, f in enumerate(x.split("|")) if i != col) for x in lines) + "\n"
    )
    text = _error(str(cut), "--cluster", "from-log")
    assert f"{cut}: the sacct output has no NodeList column" in text


def test_from_log_refuses_node_flags_that_it_would_ignore() -> None:
    text = _error(str(SACCT), "--cluster", "from-log", "--nodes", "4")
    assert "--nodes: not used with --cluster from-log" in text


def test_from_log_where_no_job_names_a_node_says_so(tmp_path: Path) -> None:
    lines = SACCT.read_text().splitlines()
    col = lines[0].split("|").index("NodeList")
    blank = [lines[0]] + [
        "|".join("" if i == col else f for i, f in enumerate(x.split("|"))) for x in lines[1:]
    ]
    path = tmp_path / "unplaced.txt"
    path.write_text("\n".join(blank) + "\n")
    text = _error(str(path), "--cluster", "from-log")
    assert "no job with GPUs names its nodes in this log" in text


# ---------------------------------------------------------------------------------------------- pieces


def test_host_lists_expand_as_slurm_writes_them() -> None:
    assert expand_hostlist("n[1-2]") == ["n1", "n2"]
    assert expand_hostlist("gpu[01-03,07],cpu5") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]
    assert expand_hostlist("r[1-2]-n[1-2]") == ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
    assert (
        expand_hostlist("None assigned") == [] and expand_hostlist("") == [] and expand_hostlist(None) == []
    )
    for bad in ("n[1-", "n[a-b]", "n[3-1]", "n1]"):
        with pytest.raises(NodeListError):
            expand_hostlist(bad)


def test_a_nodes_gpus_are_its_most_in_use_at_once_and_back_to_back_jobs_do_not_add_up() -> None:
    runs = [
        _Run(0.0, 10.0, 4.0, [("a", 4.0)]),
        _Run(10.0, 20.0, 4.0, [("a", 4.0)]),  # starts as the first ends: still 4 at once
        _Run(5.0, 8.0, 2.0, [("b", 2.0)]),
        _Run(6.0, math.inf, 3.0, [("b", 3.0)]),  # still running when the log was taken
    ]
    assert peak_gpus(runs) == {"a": 4.0, "b": 5.0}


def test_a_suggested_cluster_aims_near_the_target_and_still_holds_the_largest_job() -> None:
    # 100 GPU-hours in 10 hours: 10 GPUs busy; at 0.9, about 11 GPUs, so 1 or 2 nodes of 8
    nodes, load = suggest_nodes(100 * 3600, 10 * 3600, 8, largest_job=4) or (0, 0.0)
    assert nodes == 2 and load == pytest.approx(10 / 16)
    nodes, _ = suggest_nodes(100 * 3600, 10 * 3600, 8, largest_job=64) or (0, 0.0)
    assert nodes == 8  # a 64-GPU job needs 8 nodes, however light the load
    assert suggest_nodes(0.0, 3600, 8, largest_job=1) is None and suggest_nodes(3600, 0.0, 8, 1) is None


def test_a_load_within_half_to_one_and_a_half_gets_no_note() -> None:
    spec = ClusterSpec.from_flags(2, 8)
    for x, verdict in ((0.49, "low"), (0.5, "ok"), (1.5, "ok"), (1.51, "high")):
        check = LoadCheck(x, ARRIVALS, 3600.0, x * 16, spec.capacity_gpus, 3, 8, 0.9)
        assert check.verdict == verdict
        assert (check.note() is None) == (verdict == "ok")
    assert LoadCheck(None, ARRIVALS, 0.0, 0.0, 16).verdict == "unknown"
