from __future__ import annotations

import csv
import datetime as dt
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway.schema import JOB_SCHEMA, State
from headway.store import JobStore
from headway.traces.alibaba import (
    DEFAULT_EPOCH,
    POD_COLUMNS,
    READER,
    AlibabaNode,
    AlibabaReader,
    read_alibaba_nodes,
)
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.registry import sniff

HEADER = ",".join(POD_COLUMNS)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def _pods(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    p = tmp_path / "openb_pod_list_test.csv"
    p.write_text("\n".join([header, *lines]) + "\n")
    return p


def _rows(path: Path, **kw: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = READER.read(path, ReadOptions(**kw)).table.to_pylist()
    return rows


def test_pod_fields_map_into_the_job_schema(tmp_path: Path) -> None:
    p = _pods(tmp_path, "pod-1,3152,5600,1,460,,BE,Succeeded,100,460,160")
    res = READER.read(p, ReadOptions())
    assert res.table.schema == JOB_SCHEMA
    [row] = res.table.to_pylist()
    assert row["job_id"] == "pod-1" and row["name"] is None and row["user"] is None
    assert row["gpus"] == pytest.approx(0.46)
    assert row["cpus"] == 4  # 3.152 cores need 4 whole ones
    assert row["mem_mb"] == 5600 and row["priority_class"] == "BE" and row["nodes"] == 1
    assert row["submit_time"] == DEFAULT_EPOCH + dt.timedelta(seconds=100)
    assert row["start_time"] == DEFAULT_EPOCH + dt.timedelta(seconds=160)
    assert row["end_time"] == DEFAULT_EPOCH + dt.timedelta(seconds=460)
    assert row["state"] == "COMPLETED" and row["source"] == "alibaba"
    assert {"user", "group", "name", "time_limit", "exit_code"} <= set(res.missing_fields)


def test_whole_and_multi_gpu_pods_and_cpu_only_pods(tmp_path: Path) -> None:
    p = _pods(
        tmp_path,
        "eight,64000,100,8,1000,,LS,Failed,0,10,5",
        "cpu,8000,100,0,0,,LS,Failed,0,10,5",
    )
    gpus = {r["job_id"]: r["gpus"] for r in _rows(p)}
    assert gpus == {"eight": 8.0, "cpu": 0.0}


@pytest.mark.parametrize(
    ("phase", "state"),
    [
        ("Succeeded", State.COMPLETED),
        ("Failed", State.FAILED),
        ("Running", State.UNKNOWN),  # deleted while running: ended, outcome not known
        ("Pending", State.PENDING),
    ],
)
def test_pod_phases_map_to_schema_states(tmp_path: Path, phase: str, state: State) -> None:
    [row] = _rows(_pods(tmp_path, f"p,1000,100,1,1000,,LS,{phase},0,50,10"))
    assert row["state"] == state.value


def test_pending_pod_was_never_started_so_it_has_no_gpu_hours(tmp_db: Path, tmp_path: Path) -> None:
    p = _pods(tmp_path, "p,1000,100,1,1000,,LS,Pending,0,7200,")
    res = READER.read(p, ReadOptions())
    [row] = res.table.to_pylist()
    assert row["start_time"] is None and row["end_time"] == DEFAULT_EPOCH + dt.timedelta(hours=2)
    with JobStore(tmp_db) as store:
        store.upsert(res.table)
        assert store.con.execute("SELECT runtime, gpu_hours FROM jobs_v").fetchone() == (None, 0.0)


def test_epoch_and_source_can_be_chosen(tmp_path: Path) -> None:
    start = dt.datetime(2020, 6, 1, 12, tzinfo=dt.UTC)
    p = _pods(tmp_path, "p,1000,100,1,1000,,LS,Failed,60,120,60")
    [row] = AlibabaReader(epoch=start).read(p, ReadOptions(source="ali-prod")).table.to_pylist()
    assert row["submit_time"] == start + dt.timedelta(minutes=1) and row["source"] == "ali-prod"


def test_bad_rows_are_skipped_with_their_line_number(tmp_path: Path) -> None:
    p = _pods(
        tmp_path,
        "ok,1000,100,1,1000,,LS,Failed,0,10,5",
        "phase,1000,100,1,1000,,LS,Exploded,0,10,5",
        "gpus,1000,100,one,1000,,LS,Failed,0,10,5",
        "short,1000,100",
        "backwards,1000,100,1,1000,,LS,Failed,0,10,50",
        "milli,1000,100,1,1500,,LS,Failed,0,10,5",
        "huge,99999999999999999999999,100,1,1000,,LS,Failed,0,10,5",
        "ok2,1000,100,1,1000,,LS,Failed,0,10,5",
    )
    res = READER.read(p, ReadOptions())
    assert [r["job_id"] for r in res.table.to_pylist()] == ["ok", "ok2"]
    assert res.rows_read == 8 and res.bad_row_count == 6
    assert [b.line for b in res.bad_rows] == [3, 4, 5, 6, 7, 8]
    assert "pod_phase" in res.bad_rows[0].reason and "num_gpu" in res.bad_rows[1].reason
    with pytest.raises(BadInputError, match=r":3: pod_phase"):
        READER.read(p, ReadOptions(strict=True))


def test_empty_times_are_null_and_absent_columns_are_reported(tmp_path: Path) -> None:
    p = _pods(tmp_path, "p,Succeeded,,", header="name,pod_phase,creation_time,deletion_time")
    res = READER.read(p, ReadOptions())
    [row] = res.table.to_pylist()
    assert row["submit_time"] is None and row["end_time"] is None and row["gpus"] is None
    assert {"gpus", "cpus", "start_time", "priority_class"} <= set(res.missing_fields)
    assert "submit_time" not in res.missing_fields


def test_node_list_is_refused_by_ingest_with_a_pointer_to_simulate(tmp_path: Path) -> None:
    p = tmp_path / "openb_node_list_gpu_node.csv"
    p.write_text(f"{NODE_HEADER}\nn0,64000,262144,2,P100\n")
    assert READER.sniff(p, p.read_bytes())
    with pytest.raises(
        BadInputError, match="this is a node list, not jobs; pass it to simulate --nodes-file"
    ):
        READER.read(p, ReadOptions())


def test_node_list_reads_into_nodes(tmp_path: Path) -> None:
    p = tmp_path / "nodes.csv"
    p.write_text(f"{NODE_HEADER}\nn0,64000,262144,2,P100\nn1,32000,131072,0,\n")
    assert read_alibaba_nodes(p) == [
        AlibabaNode("n0", 2, "P100", 64000, 262144),
        AlibabaNode("n1", 0, None, 32000, 131072),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("n0,1,1,two,P100\n", r"nodes\.csv:2: gpu"),
        ("n0,1,1,2,P100\nn0,1,1,2,P100\n", "listed twice"),
        ("", "no nodes"),
    ],
)
def test_bad_node_list_is_one_clear_error(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "nodes.csv"
    p.write_text(f"{NODE_HEADER}\n{body}")
    with pytest.raises(BadInputError, match=message):
        read_alibaba_nodes(p)


def test_pod_list_given_as_nodes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="pod list"):
        read_alibaba_nodes(_pods(tmp_path, "p,1000,100,1,1000,,LS,Failed,0,10,5"))


def test_other_csvs_are_not_claimed(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("JobID|JobName|State\n1|a|COMPLETED\n")
    q = tmp_path / "y.csv"
    q.write_text("name,state,gpus\na,ok,1\n")
    assert not READER.sniff(p, p.read_bytes()) and not READER.sniff(q, q.read_bytes())


def test_real_pod_list_matches_an_independent_count(shared_traces: Path, tmp_db: Path) -> None:
    path = shared_traces / "alibaba-fgd-2023" / "openb_pod_list_default.csv"
    with open(path, newline="") as fh:
        raw = list(csv.DictReader(fh))
    res = READER.read(path, ReadOptions())
    assert res.rows_read == len(raw) == 8152 and res.bad_row_count == 0
    gpu_pods = [r for r in raw if int(r["num_gpu"]) > 0]
    assert len(gpu_pods) == 7064  # traces README
    expect = sum(int(r["num_gpu"]) * int(r["gpu_milli"]) / 1000 for r in raw)
    assert sum(res.table.column("gpus").to_pylist()) == pytest.approx(expect)
    with JobStore(tmp_db) as store:
        store.upsert(res.table)
        by_state = dict(
            store.con.execute("SELECT state, count(*) FROM jobs_v WHERE gpus > 0 GROUP BY 1").fetchall()
        )
        medians = dict(
            store.con.execute(
                "SELECT state, median(runtime) / 60 FROM jobs_v WHERE gpus > 0 AND state IN "
                "('FAILED', 'COMPLETED') GROUP BY 1"
            ).fetchall()
        )
    # traces README: Running 58.7%, Failed 26.5%, Pending 12.2%, Succeeded 2.6% of GPU pods
    shares = {s: round(100 * n / len(gpu_pods), 1) for s, n in by_state.items()}
    assert shares == {"UNKNOWN": 58.7, "FAILED": 26.5, "PENDING": 12.2, "COMPLETED": 2.6}
    assert round(medians["FAILED"], 1) == 3.6 and round(medians["COMPLETED"], 1) == 65.7
    raw_failed = sorted(
        (int(r["deletion_time"]) - int(r["scheduled_time"])) / 60
        for r in gpu_pods
        if r["pod_phase"] == "Failed"
    )
    assert medians["FAILED"] == pytest.approx(statistics.median(raw_failed))


def test_real_node_lists_read_whole(shared_traces: Path) -> None:
    folder = shared_traces / "alibaba-fgd-2023"
    gpu_nodes = read_alibaba_nodes(folder / "openb_node_list_gpu_node.csv")
    all_nodes = read_alibaba_nodes(folder / "openb_node_list_all_node.csv")
    assert len(gpu_nodes) == 1213 and len(all_nodes) == 1523
    assert all(n.gpus > 0 and n.model for n in gpu_nodes)
    assert sum(n.gpus for n in all_nodes) == sum(n.gpus for n in gpu_nodes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=6000), junk=st.binary(max_size=30))
def test_damaged_real_file_never_raises_anything_but_a_clear_error(
    shared_traces: Path, tmp_path: Path, cut: int, junk: bytes
) -> None:
    text = (shared_traces / "alibaba-fgd-2023" / "openb_pod_list_default.csv").read_bytes()[:6000]
    p = tmp_path / "damaged.csv"
    p.write_bytes(text[:cut] + junk + text[cut + len(junk) :])
    try:
        res = READER.read(p, ReadOptions())
    except BadInputError as e:
        assert str(e).startswith(str(p))
    else:
        assert res.table.schema == JOB_SCHEMA
        assert res.rows_read == res.table.num_rows + res.bad_row_count


def test_ingest_auto_detects_alibaba_and_explains_a_node_list(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from headway.cli import app

    pods = _pods(tmp_path, "p,1000,100,1,500,,LS,Succeeded,0,10,5")
    nodes = tmp_path / "openb_node_list_gpu_node.csv"
    nodes.write_text(f"{NODE_HEADER}\nn0,64000,262144,2,P100\n")
    assert sniff(pods) == "alibaba" and sniff(nodes) == "alibaba"
    db = str(tmp_path / "j.duckdb")
    ok = CliRunner().invoke(app, ["ingest", "--db", db, "--json", str(pods)])
    assert ok.exit_code == 0, ok.output
    assert '"format": "alibaba"' in ok.stdout
    refused = CliRunner().invoke(app, ["ingest", "--db", db, str(nodes)])
    assert refused.exit_code == 1
    assert "this is a node list, not jobs; pass it to simulate --nodes-file" in " ".join(
        refused.output.split()
    )
