"""`sacct --json` through the sacct reader: real Slurm 22.05 output, the 23.02+ shape of the same jobs,
auto-detection and bad input (tests/test_slurm_live.py compares it with `sacct -P` on a live cluster)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.schema import JOB_SCHEMA, JobRecord, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.registry import sniff
from headway.traces.sacct import READER

SAMPLE = Path(__file__).parent / "data" / "sacct_22.05_sample.json"
COMPARED = (
    "name",
    "partition",
    "priority_class",
    "state",
    "gpus",
    "nodes",
    "submit_time",
    "start_time",
    "end_time",
    "time_limit",
)


def _by_id(path: Path, **opts: Any) -> dict[str, JobRecord]:
    return {r.job_id: r for r in table_to_records(READER.read(path, ReadOptions(**opts)).table)}


@pytest.mark.shared
def test_real_sacct_json_gives_the_same_jobs_as_the_same_clusters_sacct_p(shared_traces: Path) -> None:
    base = shared_traces / "slurm-22.05"
    res = READER.read(base / "sacct.json", ReadOptions())
    assert res.table.schema == JOB_SCHEMA and res.format == "sacct"
    assert res.rows_read == 23 and res.table.num_rows == 23 and res.bad_row_count == 0
    js = {r.job_id: r for r in table_to_records(res.table)}
    text = _by_id(base / "sacct_allocations.txt", tz="UTC")  # that cluster's local zone was UTC
    assert js.keys() == text.keys()
    for job_id, t in text.items():
        j = js[job_id]
        assert {f: getattr(j, f) for f in COMPARED} == {f: getattr(t, f) for f in COMPARED}, job_id
        # 22.05's JSON says 0 for jobs that exited 1 or 2: kept only where the job completed
        assert j.exit_code == (0 if t.state == "COMPLETED" else None)
    assert text["4"].exit_code == 1 and js["23"].gpus == 16 and js["23"].nodes == 2
    assert any("exit code 0 for jobs that failed" in n for n in res.notes)
    assert any("23 jobs have no user" in n for n in res.notes) and "user" in res.missing_fields


def test_bundled_22_05_sample_reads_failed_timeout_cancelled_and_two_node_jobs() -> None:
    res = READER.read(SAMPLE, ReadOptions())
    assert res.table.num_rows == 4 and res.bad_row_count == 0
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert {k: j.state for k, j in jobs.items()} == {
        "4": "FAILED",
        "21": "TIMEOUT",
        "22": "CANCELLED",
        "23": "COMPLETED",
    }
    assert jobs["23"].gpus == 16 and jobs["23"].nodes == 2  # untyped gres/gpu, not plus the typed a100
    assert jobs["21"].time_limit == 60 and jobs["4"].gpus == 4 and jobs["4"].exit_code is None
    assert jobs["23"].exit_code == 0 and jobs["23"].cpus == 2 and jobs["23"].mem_mb == 128000
    assert jobs["21"].runtime == 73.0
    assert any("Slurm 22.05.8" in n for n in res.notes)


def _as_23(doc: dict[str, Any]) -> dict[str, Any]:
    """The same jobs in the shape Slurm 23.02+ prints (data_parser v0.0.39+): numbers wrapped in
    {set, infinite, number}, state and exit status as lists of flags, user and account filled in."""

    def num(v: Any) -> dict[str, Any]:
        return {"set": v is not None, "infinite": False, "number": v or 0}

    out = copy.deepcopy(doc)
    out["meta"] = {"plugin": {"data_parser": "data_parser/v0.0.40"}, "slurm": {"release": "23.11.4"}}
    for j in out["jobs"]:
        t = j["time"]
        t["limit"] = num(t["limit"])
        j["state"]["current"] = [j["state"]["current"]]
        code = 3 if j["state"]["current"] == ["FAILED"] else 0
        j["exit_code"] = {"status": ["ERROR" if code else "SUCCESS"], "return_code": num(code)}
        j["priority"] = num(j["priority"])
        j["user"] = None
        j["account"] = None
        j["association"] = {"account": "ml", "cluster": "lab", "partition": None, "user": j["group"]}
        j["array"]["task_id"] = num(None)
        j["het"]["job_offset"] = num(None)
        for kind in ("allocated", "requested"):
            for tres in j["tres"][kind]:
                tres["count"] = tres["count"] if tres["count"] is not None else 0
    first, second = out["jobs"][0], out["jobs"][1]
    first["array"]["job_id"], first["array"]["task_id"] = 100, num(3)
    second["het"]["job_id"], second["het"]["job_offset"] = 200, num(1)
    return out


def test_the_23_02_and_later_shape_of_the_same_jobs_reads_the_same(tmp_path: Path) -> None:
    doc = json.loads(SAMPLE.read_text())
    p = tmp_path / "sacct23.json"
    p.write_text(json.dumps(_as_23(doc)))
    res = READER.read(p, ReadOptions())
    assert res.bad_row_count == 0 and res.missing_fields == []
    new = {r.job_id: r for r in table_to_records(res.table)}
    old = _by_id(SAMPLE)
    assert set(new) == {"100_3", "200+1", "22", "23"}  # array task and het component ids as sacct -P
    for o_id, n_id in (("4", "100_3"), ("21", "200+1"), ("22", "22"), ("23", "23")):
        assert {f: getattr(new[n_id], f) for f in COMPARED} == {f: getattr(old[o_id], f) for f in COMPARED}
    assert new["100_3"].exit_code == 3 and new["23"].exit_code == 0  # 23.02+ exit codes are kept
    assert new["23"].user == "dave" and new["23"].group == "ml"
    assert not any("22.05" in n for n in res.notes[1:])


def test_auto_detection_and_ingest_take_sacct_json(tmp_path: Path) -> None:
    assert sniff(SAMPLE) == "sacct"
    db = tmp_path / "j.duckdb"
    out = CliRunner().invoke(app, ["ingest", str(SAMPLE), "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    (f,) = json.loads(out.stdout)["files"]
    assert (f["format"], f["jobs_stored"], f["bad_rows"]) == ("sacct", 4, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"meta": {}, "jobs": [', "invalid JSON at line 1"),
        ('{"meta": {}, "errors": []}', "no `jobs` list"),
        ('{"jobs": {"job_id": 1}}', "no `jobs` list"),
    ],
)
def test_unreadable_json_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(BadInputError, match=message):
        READER.read(p, ReadOptions())


def test_a_bad_job_record_is_reported_by_number_and_an_unreadable_start_is_stored_as_null(
    tmp_path: Path,
) -> None:
    """A record that is no job, or whose GPU count is no number, is skipped; a start time the job record
    can do without is stored as null, counted per column, and the job kept."""
    doc = json.loads(SAMPLE.read_text())
    doc["jobs"][1]["time"]["start"] = "yesterday"
    doc["jobs"][2] = ["not", "a", "job"]
    p = tmp_path / "mixed.json"
    text = json.dumps(doc).replace('"count": 16', '"count": NaN', 1)  # Python's json writes and reads NaN
    p.write_text(text)
    res = READER.read(p, ReadOptions())
    assert res.table.num_rows == 2 and res.bad_row_count == 2
    assert [(b.line, b.reason) for b in res.bad_rows] == [
        (3, "expected a job object, got list"),
        (4, "tres gres/gpu count: nan is not a finite number"),
    ]
    kept = res.table.to_pylist()[1]
    assert kept["job_id"] == str(doc["jobs"][1]["job_id"]) and kept["start_time"] is None
    nulled = [p for p in res.problems if p.effect == "stored as null"]
    assert [(p.column, p.reason, p.count, p.examples[0][1]) for p in nulled] == [
        ("time.start", "expected a number, got str", 1, 2)
    ]
    with pytest.raises(BadInputError, match=r"mixed.json:2: time.start"):
        READER.read(p, ReadOptions(strict=True))


def test_squeue_json_is_named_as_the_queue_not_read_as_accounting(tmp_path: Path) -> None:
    p = tmp_path / "queue.json"
    p.write_text(json.dumps({"meta": {}, "jobs": [{"job_id": 5, "job_state": "PENDING", "submit_time": 1}]}))
    assert sniff(p) == "sacct"
    with pytest.raises(BadInputError, match=r"this is `squeue --json` output"):
        READER.read(p, ReadOptions())


@pytest.mark.shared
def test_real_squeue_json_is_refused_with_the_command_to_use(shared_traces: Path) -> None:
    with pytest.raises(BadInputError, match=r"sacct -a -X --json"):
        READER.read(shared_traces / "slurm-22.05" / "squeue_pending.json", ReadOptions())


def test_an_arrays_tasks_that_never_started_get_the_id_sacct_p_prints(tmp_path: Path) -> None:
    """Tasks of an array cancelled before they started are one record: `sacct -P` names it `22_[3,7]`
    (`35_[1-3%1]` with a throttle), and Slurm 22.05's JSON gives the same tasks as a hex bitmap (as a
    live cluster printed them: `0x88`, `0xE` with limits.max.running.tasks 1)."""
    doc = json.loads(SAMPLE.read_text())
    by_id = {j["job_id"]: j for j in doc["jobs"]}
    limits = {"max": {"running": {"tasks": 0}}}
    by_id[22]["array"] = {"job_id": 22, "limits": limits, "task": "0x88", "task_id": None}
    throttled = {"max": {"running": {"tasks": 1}}}
    by_id[21]["array"] = {"job_id": 21, "limits": throttled, "task": "0xE", "task_id": None}
    by_id[4]["array"] = {"job_id": 4, "limits": limits, "task": "0x3F0", "task_id": None}
    by_id[23]["array"] = {"job_id": 20, "limits": limits, "task": None, "task_id": 5}
    p = tmp_path / "arrays.json"
    p.write_text(json.dumps(doc))
    assert set(_by_id(p)) == {"22_[3,7]", "21_[1-3%1]", "4_[4-9]", "20_5"}


def test_gpu_counts_and_times_no_scheduler_writes_are_bad_records_as_in_every_format(tmp_path: Path) -> None:
    """A negative or absurd GPU count cancelled real GPU-hours in the audit (and 1e30 broke it); a time in
    milliseconds was nulled silently; an id with a fraction was cut to another job's id."""

    def job(jid: object, gpus: float, submit: float = 1700000000) -> dict[str, Any]:
        return {
            "job_id": jid,
            "user": "a",
            "state": {"current": "FAILED"},
            "time": {"submission": submit, "start": 1700000000, "end": 1700003600},
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": gpus}]},
        }

    jobs = [job(1, -8), job(2, 1e30), job(3, 1, 1700000000000), job(6.7, 1), job(5, 8), job(6, 1, 4294967294)]
    p = tmp_path / "odd.json"
    p.write_text(json.dumps({"meta": {}, "jobs": jobs}))
    res = READER.read(p, ReadOptions())
    assert [r.job_id for r in table_to_records(res.table)] == ["5", "6"]
    assert table_to_records(res.table)[1].submit_time is None  # NO_VAL: unset, not a bad record
    assert [(b.line, b.reason.split(" (")[0]) for b in res.bad_rows] == [
        (1, "gpus: negative"),
        (2, "gpus: over 1,000,000"),
        (3, "time.submission: 1700000000000 is not a time in epoch seconds"),
        (4, "job_id: 6.7 is not a job id"),
    ]
