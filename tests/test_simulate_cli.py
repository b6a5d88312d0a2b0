"""`headway simulate` end to end on small synthetic traces: JSON, HTML, --explain, the store, errors."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.sim.synth import generate, write_sacct

runner = CliRunner()
CLUSTER = ["--nodes", "4", "--gpus-per-node", "8", "--nodes-per-rack", "2"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("sim") / "synth.parquet"
    pq.write_table(generate(200, seed=11), p)
    return p


@pytest.fixture(scope="module")
def run_json(trace: Path) -> dict[str, Any]:
    res = runner.invoke(
        app,
        ["simulate", str(trace), *CLUSTER, "--policy", "fifo,multifactor,impact", "--load", "1.0", "--json"],
    )
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_json_has_every_policy_with_design_metric_names(run_json: dict[str, Any]) -> None:
    pols = run_json["policies"]
    assert isinstance(pols, dict)
    assert list(pols) == ["fifo", "multifactor", "impact"]
    for m in pols.values():
        for name in (
            "time_to_success_mean",
            "time_to_success_p95",
            "queue_delay_p99",
            "queue_delay_max",
            "bounded_slowdown_mean",
            "utilisation",
            "fragmentation",
            "fragmented_gpu_hours",
            "jain_fairness",
            "wasted_gpu_hours",
            "goodput_gpu_hours",
        ):
            assert name in m
        assert 0 < m["utilisation"] <= 1
        # every simulated job ends, whatever the policy
        assert m["jobs_unfinished"] == 0
        assert m["jobs"] + m["excluded"] <= 200
        assert m["excluded"] == sum(run_json["excluded_counts"].values())  # every reason, not too-big only


def test_json_has_ratios_cluster_and_load_but_no_goals(run_json: dict[str, Any]) -> None:
    ratios = run_json["ratios_to_multifactor"]
    assert isinstance(ratios, dict)
    assert ratios["multifactor"]["time_to_success_mean"] == pytest.approx(1.0)
    assert "goals" not in run_json  # the project's goals are checked in benchmarks/bench_goals.py
    assert "goal" not in json.dumps(run_json)
    cluster = run_json["cluster"]
    assert isinstance(cluster, dict)
    assert cluster["capacity_gpus"] == 32
    assert cluster["racks"] == 2
    trace = run_json["trace"]
    assert isinstance(trace, dict)
    assert trace["offered_load"] == pytest.approx(1.0)
    assert run_json["reference"] is None
    check = run_json["load_check"]  # the log's own load on this cluster, whatever --load rescales it to
    assert check["window"] == "arrivals" and check["offered_load"] > 0 and check["note"] is None


def test_jobs_too_large_for_the_cluster_are_listed(run_json: dict[str, Any]) -> None:
    excluded = run_json["excluded"]
    assert isinstance(excluded, list)
    for line in excluded:
        assert "cluster has 32 GPUs" in line


def test_table_output_shows_policies_and_ratios(trace: Path) -> None:
    res = runner.invoke(app, ["simulate", str(trace), *CLUSTER, "--policy", "fifo,multifactor"])
    assert res.exit_code == 0, res.output
    assert "multifactor" in res.stdout
    assert "x" in res.stdout  # ratio cells such as 0.93x
    assert "ratio to multifactor" in res.stdout


def test_table_output_judges_no_policy_against_a_development_goal(trace: Path) -> None:
    """`goal: impact time_to_success_mean <= 0.7x multifactor: 0.90x, not met` ended every replay of a
    user's own log: a target of this project, not a fact about their cluster."""
    res = runner.invoke(
        app, ["simulate", str(trace), *CLUSTER, "--policy", "fifo,multifactor,impact", "--load", "1.0"]
    )
    assert res.exit_code == 0, res.output
    assert "impact" in res.stdout
    for word in ("goal", "not met", " met", "<= 0.7x"):
        assert word not in res.output, word


def test_html_report_is_self_contained(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = runner.invoke(
        app, ["simulate", str(trace), *CLUSTER, "--policy", "fifo,impact", "--html", str(out)]
    )
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "<script src=" not in text  # plotly.js is inlined, nothing loads from the network
    assert "Plotly.newPlot" in text
    assert text.count('<div class="chart" id="sim-chart-') == 6
    assert "Time to success" in text and "Queueing delay" in text


def test_html_report_counts_the_jobs_replayed_and_names_those_left_out(tmp_path: Path) -> None:
    big = generate(60, seed=3)
    gpus = big.column("gpus").to_pylist()
    gpus[0] = 64.0  # more than the 4 x 8 cluster holds
    big = big.set_column(big.schema.get_field_index("gpus"), "gpus", pa.array(gpus, pa.float64()))
    src = tmp_path / "big.parquet"
    pq.write_table(big, src)
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["simulate", str(src), *CLUSTER, "--policy", "fifo", "--html", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "59 jobs replayed of the 60 read" in text
    assert "Left out of the simulation: 1 " in text


def test_an_html_path_that_cannot_be_written_fails_before_the_replay(trace: Path, tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["simulate", str(trace), *CLUSTER, "--policy", "fifo", "--html", str(tmp_path / "no" / "r.html")]
    )
    assert res.exit_code == 1 and "--html" in res.output and "no such directory" in res.output
    assert "simulating" not in res.output  # failed at the option, before reading and replaying


def test_explain_shows_why_a_job_waited(trace: Path, run_json: dict[str, Any]) -> None:
    import pyarrow.compute as pc

    from headway.commands.simulate import load_jobs

    jobs, _ = load_jobs(trace, "auto", None)
    # a job submitted in a burst: likely to wait behind its siblings
    job_id = jobs.column("job_id")[len(jobs) // 2].as_py()
    res = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            *CLUSTER,
            "--policy",
            "fifo,impact",
            "--load",
            "1.0",
            "--explain",
            job_id,
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    ex = json.loads(res.stdout)["explain"]
    assert set(ex) == {"fifo", "impact"}
    for pol in ("fifo", "impact"):
        entry = ex[pol]
        assert entry["job"]["job_id"] == job_id
        passes = entry["passes"]
        if entry["queue_delay"] and entry["queue_delay"] > 0:
            assert passes, "a job that waited was ranked at least once"
        for p in passes:
            assert 1 <= p["rank"] <= p["of"]
            assert p["reason"]
    assert pc.sum(pc.equal(jobs.column("job_id"), job_id)).as_py() == 1


def test_reference_figures_print_beside_ours_when_asked(trace: Path) -> None:
    res = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            *CLUSTER,
            "--policy",
            "qssf,impact",
            "--reference",
            "helios-philly",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    ref = json.loads(res.stdout)["reference"]
    assert ref["name"] == "helios-philly"
    q = [r for r in ref["rows"] if r["policy"] == "qssf" and r["metric"] == "time_to_success_mean"]
    assert q and q[0]["helios"] == 104_075
    assert q[0]["headway_impact"] is not None
    assert q[0]["impact_ratio"] == pytest.approx(q[0]["headway_impact"] / 104_075)
    assert "impact_beats_helios_qssf" not in q[0]  # a figure beside the peer's, not a verdict


@pytest.mark.slow
def test_peer_figures_appear_only_with_reference_even_on_the_philly_sample() -> None:
    """The Helios figures were switched on by the trace's identity (5,910 Philly jobs on 512 GPUs); now
    only `--reference helios-philly` prints them, whatever the trace."""
    from headway.data import sample_path

    sample = str(sample_path("philly_jobs.json.gz"))
    plain = runner.invoke(app, ["simulate", sample, "--policy", "fifo", "--json"])
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["reference"] is None
    table = runner.invoke(app, ["simulate", sample, "--policy", "fifo"])
    assert table.exit_code == 0 and "Helios" not in table.output
    asked = runner.invoke(app, ["simulate", sample, "--policy", "fifo", "--reference", "helios-philly"])
    assert asked.exit_code == 0, asked.output
    assert "Beside a peer: the Helios artifact's simulator" in asked.stdout
    old = runner.invoke(app, ["simulate", sample, "--policy", "fifo", "--reference", "auto"])
    assert old.exit_code != 0 and "choose one of none, helios-philly" in old.output


def test_simulate_reads_jobs_from_the_store(tmp_path: Path) -> None:
    log = tmp_path / "s.txt"
    db = tmp_path / "jobs.duckdb"
    write_sacct(generate(80, seed=5), str(log))
    res = runner.invoke(
        app, ["ingest", "--format", "sacct", "--tz", "UTC", "--db", str(db), "--json", str(log)]
    )
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["simulate", "--db", str(db), *CLUSTER, "--policy", "fifo", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["trace"]["format"] == "store"
    assert doc["policies"]["fifo"]["jobs"] + len(doc["excluded"]) == 80


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo,magic"], "unknown magic"),
        (["--placement", "random"], "--placement"),
        (["--explain", "no-such-job"], "no job 'no-such-job'"),
        (["--load", "0"], "out of range"),
    ],
)
def test_bad_options_fail_in_one_line(trace: Path, args: list[str], message: str) -> None:
    res = runner.invoke(app, ["simulate", str(trace), *CLUSTER, *args])
    assert res.exit_code == 1
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_missing_trace_fails_in_one_line(tmp_path: Path) -> None:
    res = runner.invoke(app, ["simulate", str(tmp_path / "nope.json")])
    assert res.exit_code == 1
    assert "no such file" in res.output


def test_rows_the_reader_skips_are_reported_not_silently_dropped(tmp_path: Path) -> None:
    import gzip
    from importlib.resources import files

    full = gzip.decompress(files("headway.data").joinpath("philly_jobs.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(full[:20_000])  # a copy that stopped mid-record
    res = runner.invoke(app, ["simulate", str(cut), "--policy", "fifo", "--json"])
    assert res.exit_code == 0, res.output
    trace = json.loads(res.stdout)["trace"]
    assert trace["bad_rows"] == 1 and "file ends inside it" in trace["bad_row_examples"][0]
    res = runner.invoke(app, ["simulate", str(cut), "--policy", "fifo"])
    assert "skipped" in res.stderr and "file ends inside it" in " ".join(res.stderr.split())


def test_load_cannot_stretch_a_trace_whose_jobs_all_arrive_at_once(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = generate(40, seed=3)
    same = pc.min(t.column("submit_time"))
    at_once = t.set_column(
        t.schema.get_field_index("submit_time"),
        "submit_time",
        pa.array([same.as_py()] * 40, t.schema.field("submit_time").type),
    )
    path = tmp_path / "once.parquet"
    pq.write_table(at_once, path)
    res = runner.invoke(app, ["simulate", str(path), *CLUSTER, "--policy", "fifo", "--load", "1.0"])
    assert res.exit_code == 1 and "no arrival rate to stretch" in " ".join(res.output.split())
    res = runner.invoke(app, ["simulate", str(path), *CLUSTER, "--policy", "fifo", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["trace"]["offered_load"] is None


def test_csv_with_a_mapping_and_parquet_under_any_name_are_read(trace: Path, tmp_path: Path) -> None:
    csv = tmp_path / "jobs.csv"
    assert (
        runner.invoke(app, ["synth", "-n", "200", "--seed", "11", "-f", "csv", "-o", str(csv)]).exit_code == 0
    )
    renamed = tmp_path / "jobs.json"
    renamed.write_bytes(trace.read_bytes())  # Parquet, whatever the file is called
    runs = {}
    for args in (
        [str(csv), "--mapping", str(tmp_path / "jobs.mapping.toml")],
        [str(renamed)],
        [str(trace)],
    ):
        res = runner.invoke(app, ["simulate", *args, *CLUSTER, "--policy", "fifo", "--json"])
        assert res.exit_code == 0, res.output
        runs[args[0]] = json.loads(res.stdout)["policies"]["fifo"]["time_to_success_mean"]
    assert len(set(runs.values())) == 1, runs


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], "0<=x"),  # click's "-1 is not in the range 0<=x<=..."
        (["--cluster", "c.toml", "--nodes", "4"], "--nodes: not used with --cluster"),
    ],
)
def test_more_bad_options_fail_before_any_replay(
    trace: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "c.toml").write_text("[[nodes]]\ncount = 4\ngpus = 8\n")
    args = [a.replace("c.toml", str(tmp_path / "c.toml")) for a in args]
    res = runner.invoke(app, ["simulate", str(trace), "--policy", "fifo", *args])
    assert res.exit_code != 0 and message in " ".join(res.output.split()), res.output


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[[nodes]]\ncount = 4\ngpu = 8\n", "unknown key 'gpu'"),
        ("[[nodes]]\ncount = true\ngpus = 8\n", "count must be a positive integer"),
        ("node_per_rack = 2\n[[nodes]]\ngpus = 8\n", "unknown key 'node_per_rack'"),
    ],
)
def test_a_cluster_file_with_a_typo_is_refused_not_read_as_the_default(
    trace: Path, tmp_path: Path, toml: str, message: str
) -> None:
    (tmp_path / "c.toml").write_text(toml)
    res = runner.invoke(
        app, ["simulate", str(trace), "--policy", "fifo", "--cluster", str(tmp_path / "c.toml")]
    )
    assert res.exit_code == 1 and message in " ".join(res.output.split()), res.output


def test_explain_of_a_job_left_out_says_why(trace: Path) -> None:
    big = pq.read_table(trace).sort_by([("gpus", "descending")]).column("job_id")[0].as_py()
    res = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--policy",
            "fifo",
            "--explain",
            big,
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"job {big} was left out of the simulation: needs" in " ".join(res.output.split())


def test_every_job_left_out_is_an_error_not_a_table_of_dashes(trace: Path) -> None:
    res = runner.invoke(
        app, ["simulate", str(trace), "--nodes", "1", "--gpus-per-node", "1", "--policy", "fifo"]
    )
    if res.exit_code == 0:  # (a 1-GPU job may fit: then there is something to compare)
        return
    assert "every job was left out" in " ".join(res.output.split())


def test_json_has_the_tables_ratios_also_without_multifactor(trace: Path) -> None:
    res = runner.invoke(app, ["simulate", str(trace), "--nodes", "4", "--policy", "fifo,las", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ratios_to_multifactor"] == {} and doc["ratios"]["baseline"] == "fifo"
    las = doc["ratios"]["policies"]["las"]["time_to_success_mean"]
    p = doc["policies"]
    assert las == pytest.approx(p["las"]["time_to_success_mean"] / p["fifo"]["time_to_success_mean"])


def test_repeat_failures_are_held_in_a_log_without_job_names(tmp_path: Path) -> None:
    """The hold keyed streaks by user + name only, so it never fired on Philly (no names), though the
    trace's note says repeats are recognised by user + virtual cluster: a user + group key now."""
    head = (
        "JobID|JobName|User|Account|Partition|State|ExitCode|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
        "AllocTRES|NNodes|NodeList|Priority|QOS|ReqTRES"
    )
    tres = "billing=1,cpu=1,gres/gpu=8,node=1|1|n1|1|normal|gres/gpu=8,node=1"

    def row(jid: int, name: str, user: str, state: str, submit: str, start: str, end: str, el: int) -> str:
        code = "0:0" if state == "COMPLETED" else "1:0"
        d = "2026-01-01T"
        return f"{jid}|{name}|{user}|acct|gpu|{state}|{code}|{d}{submit}|{d}{start}|{d}{end}|{el}|600|{tres}"

    rows = [
        row(i, "", "ann", "FAILED", f"00:0{2 * i}:00", f"00:0{2 * i}:00", f"00:0{2 * i}:30", 30)
        for i in (1, 2, 3, 4)
    ]
    rows.append(row(5, "other", "bob", "COMPLETED", "00:16:40", "00:16:40", "01:16:40", 3600))
    rows.append(row(6, "", "ann", "COMPLETED", "00:18:20", "01:16:40", "01:26:40", 600))
    log = tmp_path / "noname.txt"
    log.write_text("\n".join([head, *rows]) + "\n")
    args = [
        "simulate",
        str(log),
        "--nodes",
        "1",
        "--policy",
        "impact",
        "--explain",
        "6",
        "--tz",
        "UTC",
        "--json",
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    passes = json.loads(res.stdout)["explain"]["impact"]["passes"]
    assert passes and all(p["reason"].startswith("held (repeat failures)") for p in passes)


def test_a_store_of_several_clusters_is_named_and_source_replays_one(tmp_path: Path) -> None:
    """Two clusters' jobs were replayed as one cluster's without a word (a 9-year span, 2% utilisation)."""
    from headway.store import JobStore

    db = tmp_path / "two.duckdb"
    with JobStore(db) as store:
        for name, seed in (("east", 1), ("west", 2)):
            t = generate(120, seed)
            store.upsert(
                t.set_column(t.schema.get_field_index("source"), "source", pa.array([name] * t.num_rows))
            )
    res = runner.invoke(app, ["simulate", "--db", str(db), "--policy", "fifo", *CLUSTER])
    assert res.exit_code == 0, res.output
    assert "the store holds 2 sources (east, west)" in " ".join(res.output.split())
    res = runner.invoke(
        app, ["simulate", "--db", str(db), "--policy", "fifo", *CLUSTER, "--source", "west", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace"]["sources"] == ["west"]
    res = runner.invoke(app, ["simulate", "--db", str(db), "--policy", "fifo", "--source", "north"])
    assert res.exit_code == 1 and "it has east, west" in res.output


def test_explain_says_when_a_job_started_by_backfill(tmp_path: Path) -> None:
    """A job started at rank 43 of 53 with no word of why (it fit before the head's reservation)."""
    trace = tmp_path / "syn.parquet"
    pq.write_table(generate(400, 3), trace)
    args = ["simulate", str(trace), "--nodes", "4", "--policy", "multifactor", "--load", "1.0"]
    res = runner.invoke(app, [*args, "--explain", "synth-326", "--json"])
    assert res.exit_code == 0, res.output
    last = json.loads(res.stdout)["explain"]["multifactor"]["passes"][-1]
    assert last["rank"] > 1 and "started by backfill (ends before the reservation of job" in last["reason"]


def test_explain_of_a_job_listed_again_says_why_its_last_listing_was_left_out(tmp_path: Path) -> None:
    """A job whose last listing never ran (requeued, still pending when the log was taken) was explained
    from its first listing, which ran: `CPU-only (0 GPUs)` for an 8-GPU job."""
    t = generate(40, seed=3)
    first = t.slice(0, 1).to_pylist()[0]
    again = {**first, "start_time": None, "end_time": None, "state": "PENDING"}
    p = tmp_path / "listed-again.parquet"
    pq.write_table(pa.concat_tables([t, pa.Table.from_pylist([again], schema=t.schema)]), p)
    res = runner.invoke(
        app,
        ["simulate", str(p), *CLUSTER, "--policy", "fifo", "--explain", first["job_id"], "--json"],
    )
    assert res.exit_code == 0, res.output
    why = json.loads(res.stdout)["explain"]["left_out"]
    assert why == "never started or never ended in the trace"


def test_a_parquet_trace_with_a_mapping_is_read_as_parquet_as_ingest_reads_it(
    trace: Path, tmp_path: Path
) -> None:
    """`--mapping` forced the CSV reader on any file, so a Parquet trace failed with its binary bytes
    printed as a CSV header, where `headway ingest --mapping` reads the same file as Parquet."""
    mapping = tmp_path / "m.toml"
    mapping.write_text('[fields]\njob_id = "id"\n')
    res = runner.invoke(
        app, ["simulate", str(trace), *CLUSTER, "--policy", "fifo", "--mapping", str(mapping), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace"]["format"] == "parquet"


def test_json_stdout_stays_empty_when_every_job_is_left_out(trace: Path, tmp_path: Path) -> None:
    """With --json, the footer that lists the left-out jobs went to stdout before the error, so a
    `simulate --json | jq` got text that is not JSON; it goes to stderr with the error now."""
    import pyarrow.compute as pc

    t = pq.read_table(trace)
    big = tmp_path / "big.parquet"
    pq.write_table(t.filter(pc.greater(t.column("gpus"), 1)), big)
    res = runner.invoke(
        app, ["simulate", str(big), "--nodes", "1", "--gpus-per-node", "1", "--policy", "fifo", "--json"]
    )
    assert res.exit_code == 1, res.output
    assert res.stdout == ""
    assert "left out of the simulation" in res.stderr and "every job was left out" in res.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_cluster_too_big_for_memory_is_one_error_line(trace: Path, tmp_path: Path, workers: str) -> None:
    """A node of 10^15 GPUs (a typo's worth of zeros) made numpy refuse the cluster's arrays: a
    MemoryError traceback, in this process or from a worker; one error line now, naming the policy."""
    c = tmp_path / "c.toml"
    c.write_text(f"[[nodes]]\ncount = 1\ngpus = {10**15}\n")
    res = runner.invoke(
        app, ["simulate", str(trace), "--cluster", str(c), "--policy", "fifo,las", "--workers", workers]
    )
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    text = " ".join(res.stderr.split())  # side by side, whichever replay fails first is named
    assert "fifo: not enough memory for this replay" in text or "las: not enough memory" in text, text


def test_a_binary_cluster_file_is_refused_naming_the_file(trace: Path, tmp_path: Path) -> None:
    """A cluster file that is not UTF-8 (a binary given by mistake) failed with Python's codec message
    alone ("'utf-8' codec can't decode byte ..."), naming neither the file nor what was wrong with it."""
    c = tmp_path / "cluster.toml"
    c.write_bytes(b"[[nodes]]\ncount = 1\ngpus = 8\n\xd0\xff\n")
    res = runner.invoke(app, ["simulate", str(trace), "--policy", "fifo", "--cluster", str(c)])
    assert res.exit_code == 1, res.output
    assert f"{c}: not valid TOML: not UTF-8 text" in " ".join(res.stderr.split())


def test_a_node_list_without_gpu_nodes_is_refused_naming_the_file(trace: Path, tmp_path: Path) -> None:
    """A node list whose nodes all have 0 GPUs (the CPU part of Alibaba's all-node list) failed with
    `the cluster has no GPUs`, without saying which file or where the GPU nodes are."""
    nodes = tmp_path / "cpu_nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,32000,262144,0,\n")
    res = runner.invoke(app, ["simulate", str(trace), "--policy", "fifo", "--nodes-file", str(nodes)])
    assert res.exit_code == 1, res.output
    assert f"{nodes}: none of its 1 nodes has a GPU" in " ".join(res.stderr.split())


def test_html_report_says_the_units_its_table_shows(trace: Path, tmp_path: Path) -> None:
    """The page said "Times in hours" above a table whose times read "0 s" or "3.5 min" for short waits
    (the table marks each time's unit; only the CDF charts are in hours)."""
    out = tmp_path / "r.html"
    res = runner.invoke(
        app, ["simulate", str(trace), "--nodes", "64", "--policy", "fifo", "--html", str(out)]
    )
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "<td>0 s</td>" in page  # nobody waits on 512 GPUs: a time in seconds
    assert "Times in hours" not in page
    assert "Times in the table in s, min or h as marked, on the charts in hours;" in page


@pytest.mark.parametrize("what", ["TRACE", "--cluster"])
def test_html_onto_an_input_file_is_refused_and_the_input_kept(
    trace: Path, tmp_path: Path, what: str
) -> None:
    """`--html` naming the trace (or the cluster file) replaced that input with the report, silently."""
    src = tmp_path / "trace.parquet"
    src.write_bytes(trace.read_bytes())
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("[[nodes]]\ncount = 4\ngpus = 8\n")
    before = {src: src.read_bytes(), cluster: cluster.read_bytes()}
    target = src if what == "TRACE" else cluster
    res = runner.invoke(
        app,
        ["simulate", str(src), "--cluster", str(cluster), "--policy", "fifo", "--html", str(target)],
    )
    assert res.exit_code == 1, res.output
    assert f"is the {what} file this command reads" in " ".join(res.stderr.split())
    assert {p: p.read_bytes() for p in before} == before


def _run_with_file_size_limit(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    """`headway ARGS` in a child whose files cannot grow past `limit` bytes (RLIMIT_FSIZE, with SIGXFSZ
    ignored so a write fails with EFBIG as on a full disk)."""

    def limit_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    code = "import sys; from headway.cli import app; sys.argv[0] = 'headway'; app()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        preexec_fn=limit_files,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=300,
    )


def test_html_that_fails_midway_leaves_the_previous_report_not_half_a_page(
    trace: Path, tmp_path: Path
) -> None:
    """`--html` wrote in place: a full disk left a truncated page where the previous report had been
    (`audit --html` already wrote a temporary file and renamed it); now the old report stays."""
    out = tmp_path / "r.html"
    out.write_text("previous report")
    res = _run_with_file_size_limit(
        ["simulate", str(trace), *CLUSTER, "--policy", "fifo", "--html", str(out)], 200_000
    )
    assert res.returncode == 1, res.stderr
    assert "cannot write" in res.stderr
    assert out.read_text() == "previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]  # no temporary file left behind


def test_explain_of_an_id_in_two_sources_asks_which_not_a_mix_of_both(trace: Path, tmp_path: Path) -> None:
    """Two clusters in one store both have a job of that id: the replay records waits by job id, so
    --explain printed one table of both jobs' passes (each pass twice); it now asks for --source."""
    db = tmp_path / "two.duckdb"
    for src in ("east", "west"):
        res = runner.invoke(app, ["ingest", str(trace), "--db", str(db), "--source", src])
        assert res.exit_code == 0, res.output
    job = pq.read_table(trace).column("job_id")[10].as_py()
    res = runner.invoke(app, ["simulate", "--db", str(db), *CLUSTER, "--policy", "fifo", "--explain", job])
    assert res.exit_code == 1, res.output
    assert f"job '{job}' is in 2 sources" in " ".join(res.stderr.split())
    assert "--source NAME picks one" in " ".join(res.stderr.split())
    one = ["simulate", "--db", str(db), "--source", "east", *CLUSTER, "--policy", "fifo", "--json"]
    res = runner.invoke(app, [*one, "--explain", job])
    assert res.exit_code == 0, res.output
    times = [p["t"] for p in json.loads(res.stdout)["explain"]["fifo"]["passes"]]
    assert len(times) == len(set(times))  # one job's passes, each once


def test_titles_name_a_source_with_a_slash_whole(trace: Path, tmp_path: Path) -> None:
    """The table's and the HTML page's titles took `Path(label).name` of `store (source lab/east)`, so
    a source named with a slash came out as `east)`."""
    db = tmp_path / "jobs.duckdb"
    assert runner.invoke(app, ["ingest", str(trace), "--db", str(db), "--source", "lab/east"]).exit_code == 0
    html = tmp_path / "r.html"
    args = ["simulate", "--db", str(db), "--source", "lab/east", *CLUSTER, "--policy", "fifo"]
    res = runner.invoke(app, [*args, "--html", str(html)])
    assert res.exit_code == 0, res.output
    assert "jobs.duckdb (source lab/east): 200 jobs, 32 GPUs" in " ".join(res.stdout.split())
    assert "<h1>headway simulate: jobs.duckdb (source lab/east)</h1>" in html.read_text()


def test_a_trace_of_one_job_is_counted_as_1_job_not_1_jobs(tmp_path: Path) -> None:
    """simulate, sweep and ingest said '1 jobs', sweep '1 simulations on a local Dask cluster of 1
    processes' and --explain '1 scheduling passes'."""
    from headway.sim.synth import generate

    trace = tmp_path / "one.parquet"
    pq.write_table(generate(1, seed=4), trace)
    res = runner.invoke(app, ["simulate", str(trace), "--nodes", "1", "--policy", "fifo"])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    squashed = "".join(res.output.split())  # Rich wraps a long temp path anywhere, even inside a word
    assert (
        "1 jobs" not in flat and "one.parquet:1job(parquet)" in squashed and "one.parquet:1job," in squashed
    )
    job_id = str(pq.read_table(trace).column("job_id")[0])
    res = runner.invoke(app, ["simulate", str(trace), "--nodes", "1", "-p", "fifo", "--explain", job_id])
    assert res.exit_code == 0 and "scheduling pass while" in " ".join(res.output.split()), res.output
    res = runner.invoke(
        app,
        [
            "sweep",
            str(trace),
            "--nodes",
            "1",
            "-p",
            "fifo",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--load",
            "natural",
        ],
    )
    flat = " ".join(res.output.split())
    assert res.exit_code == 0 and "1 job; 1 simulation on a local Dask cluster of 1 process " in flat + " ", (
        res.output
    )
    res = runner.invoke(app, ["ingest", str(trace), "--db", str(tmp_path / "s.duckdb")])
    assert res.exit_code == 0 and "1 job in the store." in res.output, res.output


def test_copies_replay_every_job_again_under_its_own_id(trace: Path) -> None:
    """`--copies N` replays each job N times (copy k's id ends in #k), as a heavier workload with the
    same arrival pattern; --explain finds a copy by its id, and the Helios reference is not offered."""
    base = ["simulate", str(trace), *CLUSTER, "--policy", "fifo", "--json"]
    one = json.loads(runner.invoke(app, base).stdout)
    res = runner.invoke(app, [*base, "--copies", "3", "--explain", "synth-7#3"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["trace"]["copies"] == 3 and one["trace"]["copies"] == 1
    assert doc["policies"]["fifo"]["jobs"] == 3 * one["policies"]["fifo"]["jobs"]
    assert doc["explain"]["fifo"]["job"]["job_id"] == "synth-7#3"
    assert doc["policies"]["fifo"]["queue_delay_mean"] > one["policies"]["fifo"]["queue_delay_mean"]
    bad = runner.invoke(app, [*base, "--copies", "0"])
    assert bad.exit_code != 0 and "--copies" in bad.output
