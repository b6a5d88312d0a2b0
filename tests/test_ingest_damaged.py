"""Real job logs as sites export them: a slurmdbd job table after pandas, a notebook's astype(float) and a
spreadsheet gives the clean table's jobs, states and GPU-hours; each kind of bad value does what
docs/formats.md says (one test per row of its tables); ingest's exit status is one a cron job can trust.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from damage import JOB_TABLE, VARIANTS, truth

HEADWAY = [sys.executable, "-m", "headway.cli"]
HEADER = (
    "id_job,id_array_job,id_array_task,id_user,job_name,state,exit_code,timelimit,time_submit,time_start,"
    "time_end,cpus_req,mem_req,nodes_alloc,tres_alloc\n"
)
GOOD = '{id},0,4294967294,1001,train,3,0,10,1796150637,1796150640,1796150700,2,64000,1,"1=2,1001=4"\n'


def headway(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """The `headway` command as a user runs it: its own process, exit status and both streams."""
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1"}
    res = subprocess.run([*HEADWAY, *args], capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def ingest_json(db: Path, *files: Path, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, object]]:
    res = headway("ingest", "--db", str(db), "--json", *extra, *map(str, files))
    return res.returncode, json.loads(res.stdout)


def store_figures(db: Path) -> dict[str, object]:
    """What the store holds, in the shape of `damage.truth`."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        ids = sorted(r[0] for r in con.execute("SELECT job_id FROM jobs").fetchall())
        rows = con.execute("SELECT state, count(*), sum(gpu_hours) FROM jobs_v GROUP BY state").fetchall()
    finally:
        con.close()
    return {
        "ids": ids,
        "jobs": {s: n for s, n, _ in rows},
        "gpu_hours": {s: round(h, 6) for s, _, h in rows if h},
    }


def one_row_file(tmp_path: Path, **values: str) -> Path:
    """A job-table export of two good jobs and one whose columns are `values` (line 3)."""
    row = GOOD.format(id=2)
    cols = HEADER.strip().split(",")
    cells = next(iter(__import__("csv").reader([row.strip()])))
    for k, v in values.items():
        cells[cols.index(k)] = v
    quoted = ",".join(f'"{c}"' if "," in c else c for c in cells)
    p = tmp_path / "table.csv"
    p.write_text(HEADER + GOOD.format(id=1) + quoted + "\n" + GOOD.format(id=3))
    return p


def job(db: Path, job_id: str) -> dict[str, object]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM jobs WHERE job_id = ?", [job_id])
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
    finally:
        con.close()
    assert row is not None, f"job {job_id} was not stored"
    return dict(zip(names, row, strict=True))


# ------------------------------------------------------------------------------------- damaged variants


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_each_damaged_export_gives_the_clean_tables_jobs_states_and_gpu_hours(
    tmp_path: Path, variant: str
) -> None:
    damaged = VARIANTS[variant](tmp_path / f"{variant}.csv")
    assert damaged.read_text() != JOB_TABLE.read_text()
    code, summary = ingest_json(tmp_path / "s.duckdb", damaged)
    assert code == 0
    (entry,) = summary["files"]  # type: ignore[misc]
    assert entry["format"] == "slurmdb" and entry["bad_rows"] == 0  # --format auto detected it
    assert store_figures(tmp_path / "s.duckdb") == truth()
    notes = " ".join(entry["notes"])
    # what was repaired is said: integers written as decimals, and sentinels in their damaged form
    assert "integers written as decimals" in notes and "read as integers" in notes
    assert re.search(
        r"NO_VAL or INFINITE .*: id_array_task 193 \((4294967294\.0|4\.29497E\+09|4294967294)\)", notes
    )


def test_the_clean_table_matches_the_truth_read_without_headway(tmp_path: Path) -> None:
    code, summary = ingest_json(tmp_path / "s.duckdb", JOB_TABLE)
    assert code == 0 and summary["files"][0]["bad_rows"] == 0  # type: ignore[index]
    assert store_figures(tmp_path / "s.duckdb") == truth()


@pytest.mark.shared
def test_the_whole_real_job_table_survives_a_pandas_round_trip_with_gaps(
    tmp_path: Path, shared_traces: Path
) -> None:
    """All 592 jobs of the real table, through pandas with gaps: the issue's export stored nothing."""
    import pandas as pd

    real = shared_traces / "slurm-22.05" / "slurmdb_job_table.csv"
    df = pd.read_csv(real)
    df.loc[df.index[::5], ["id_array_job", "mem_req", "cpus_req"]] = float("nan")
    damaged = tmp_path / "export.csv"
    df.to_csv(damaged, index=False)
    assert ingest_json(tmp_path / "clean.duckdb", real)[0] == 0
    code, summary = ingest_json(tmp_path / "damaged.duckdb", damaged)
    assert code == 0 and summary["files"][0]["jobs_stored"] == 592  # type: ignore[index]
    assert store_figures(tmp_path / "damaged.duckdb") == store_figures(tmp_path / "clean.duckdb")
    assert store_figures(tmp_path / "clean.duckdb") == truth(real)


# ------------------------------------------------------------- docs/formats.md: what each bad value does


@pytest.mark.parametrize(
    ("written", "stored"),
    [("1003.0", 1003), ("7.49399e+13", 74939900000000), ("1.0E+03", 1000), ("1003", 1003)],
)
def test_an_integer_written_as_a_float_is_read_as_the_integer_with_a_note(
    tmp_path: Path, written: str, stored: int
) -> None:
    p = one_row_file(tmp_path, id_array_job=written, id_array_task="5")
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    assert code == 0
    assert job(tmp_path / "s.duckdb", f"{stored}_5")["job_id"] == f"{stored}_5"  # the array task's id
    notes = " ".join(summary["files"][0]["notes"])  # type: ignore[index]
    if written != "1003":
        assert "integers written as decimals" in notes and "id_array_job 1 (" in notes


def test_a_fraction_in_an_integer_column_is_stored_as_null_and_the_job_kept(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, cpus_req="2.5", exit_code="256.7")
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    assert code == 0 and summary["files"][0]["jobs_stored"] == 3  # type: ignore[index]
    stored = job(tmp_path / "s.duckdb", "2")
    # the CPUs come from tres_alloc (cpu=2) when cpus_req cannot be read, as for an empty cpus_req
    assert stored["cpus"] == 2 and stored["exit_code"] is None
    problems = {(p["column"], p["reason"], p["effect"], p["count"]) for p in summary["files"][0]["problems"]}  # type: ignore[index]
    assert ("cpus_req", "not an integer", "stored as null", 1) in problems
    assert ("exit_code", "not an integer", "stored as null", 1) in problems


@pytest.mark.parametrize(
    "sentinel",
    [
        "4294967294",
        "4294967295",
        "4.29497E+09",
        "4294967295.0",
        "18446744073709551614",
        "18446744073709551615",
        "1.84467e+19",
        "9223372036854775807",
        "9.22337e+18",
    ],
)
def test_slurms_no_val_and_infinite_are_null_with_a_note_never_a_bad_row(
    tmp_path: Path, sentinel: str
) -> None:
    p = one_row_file(tmp_path, timelimit=sentinel, nodes_alloc=sentinel)
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    entry = summary["files"][0]  # type: ignore[index]
    assert code == 0 and entry["bad_rows"] == 0 and entry["values_nulled"] == 0
    stored = job(tmp_path / "s.duckdb", "2")
    assert stored["time_limit"] is None and stored["nodes"] is None
    assert any("NO_VAL or INFINITE" in n and "timelimit 1" in n for n in entry["notes"])


@pytest.mark.parametrize("word", ["UNLIMITED", "Partition_Limit", "Unknown", "None"])
def test_slurms_words_for_no_value_are_null_with_a_note(tmp_path: Path, word: str) -> None:
    p = one_row_file(tmp_path, timelimit=word)
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    entry = summary["files"][0]  # type: ignore[index]
    assert code == 0 and entry["bad_rows"] == 0
    assert job(tmp_path / "s.duckdb", "2")["time_limit"] is None
    assert any(f"timelimit 1 ('{word}')" in n for n in entry["notes"])


def test_mem_req_with_the_mem_per_cpu_flag_is_mb_per_cpu_times_the_cpus(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, mem_req=str(2**63 + 4000), cpus_req="2")
    assert ingest_json(tmp_path / "s.duckdb", p)[0] == 0
    assert job(tmp_path / "s.duckdb", "2")["mem_mb"] == 8000
    assert job(tmp_path / "s.duckdb", "1")["mem_mb"] == 64000


def test_a_float_rounded_mem_req_has_lost_its_low_bits_and_is_stored_as_null_saying_so(
    tmp_path: Path,
) -> None:
    """`9.22337e+18` (2**63 + 4000 through a spreadsheet): neither the flag nor the MB can be told."""
    p = one_row_file(tmp_path, mem_req="9.22337e+18", cpus_req="2")
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    assert code == 0 and job(tmp_path / "s.duckdb", "2")["mem_mb"] is None
    (problem,) = summary["files"][0]["problems"]  # type: ignore[index]
    assert problem["column"] == "mem_req" and "lost" in problem["reason"]
    assert problem["effect"] == "stored as null" and problem["examples"] == [f"{p}:3: '9.22337e+18'"]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("mem_req", "lots"),
        ("cpus_req", "two"),
        ("id_array_job", "x1"),
        ("exit_code", "n/a?"),
        ("timelimit", "10m"),
        ("time_start", "yesterday"),
        ("time_end", "1e99"),
    ],
)
def test_an_unreadable_value_the_job_can_do_without_is_null_counted_and_the_job_kept(
    tmp_path: Path, column: str, value: str
) -> None:
    p = one_row_file(tmp_path, **{column: value})
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    entry = summary["files"][0]  # type: ignore[index]
    assert code == 0 and entry["jobs_stored"] == 3 and entry["bad_rows"] == 0 and entry["values_nulled"] == 1
    (problem,) = entry["problems"]
    assert problem["column"] == column and problem["effect"] == "stored as null" and problem["count"] == 1
    assert problem["examples"] == [f"{p}:3: {value!r}"]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("id_job", ""),
        ("state", "zz"),
        ("state", "3.5"),
        ("time_submit", "yesterday"),
        ("tres_alloc", "1001=x"),
    ],
)
def test_an_unreadable_job_id_state_submit_time_or_gpu_count_skips_the_row(
    tmp_path: Path, column: str, value: str
) -> None:
    p = one_row_file(tmp_path, **{column: value})
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    entry = summary["files"][0]  # type: ignore[index]
    assert code == 0 and entry["jobs_stored"] == 2 and entry["bad_rows"] == 1
    (problem,) = entry["problems"]
    assert problem["column"] == column and problem["effect"] == "row skipped"
    assert problem["examples"][0].startswith(f"{p}:3")


def test_a_row_with_several_bad_fields_names_them_all(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, state="zz", mem_req="lots", time_start="soon")
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    entry = summary["files"][0]  # type: ignore[index]
    assert code == 0 and entry["bad_rows"] == 1
    (bad,) = entry["bad_row_examples"]
    assert bad.startswith(f"{p}:3: ") and all(c in bad for c in ("state:", "mem_req:", "time_start:"))


def test_control_characters_in_text_are_replaced_and_counted(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, job_name="ev\x1b[2Jil\x07name")
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    assert code == 0
    assert job(tmp_path / "s.duckdb", "2")["name"] == "ev\ufffd[2Jil\ufffdname"
    assert any("control characters" in n and "name 1" in n for n in summary["files"][0]["notes"])  # type: ignore[index]


def test_a_nul_byte_in_a_quoted_csv_is_read_as_a_replacement_and_said(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes((HEADER + GOOD.format(id=1)).encode().replace(b"train", b'"tr\x00ain"'))
    code, summary = ingest_json(tmp_path / "s.duckdb", p)
    assert code == 0 and job(tmp_path / "s.duckdb", "1")["name"] == "tr\ufffdain"
    assert any("NUL" in n for n in summary["files"][0]["notes"])  # type: ignore[index]


def test_strict_makes_an_unreadable_optional_value_fatal_too(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, mem_req="lots")
    res = headway("ingest", "--db", str(tmp_path / "s.duckdb"), "--strict", str(p))
    assert res.returncode == 1 and f"{p}:3: mem_req: not an integer ('lots')" in " ".join(res.stderr.split())


# ------------------------------------------------------------------------- the summary and exit status


def test_problems_are_one_table_after_the_files_table_with_three_examples_and_show_bad_for_more(
    tmp_path: Path,
) -> None:
    rows = [GOOD.format(id=i).replace(",64000,", ",lots,") for i in range(1, 8)]
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "".join(rows))
    res = headway("ingest", "--db", str(tmp_path / "s.duckdb"), str(p))
    assert res.returncode == 0
    assert not re.search(r"t\.csv:\d", res.stderr)  # nothing line by line
    out = res.stdout
    assert out.index("ingested into") < out.index("unreadable values")
    assert [int(m) for m in re.findall(r"t\.csv:(\d+): 'lots'", out)] == [2, 3, 4]
    assert "4 more" in out and "--show-bad N" in out
    more = headway("ingest", "--db", str(tmp_path / "s.duckdb"), "--show-bad", "10", str(p)).stdout
    assert [int(m) for m in re.findall(r"t\.csv:(\d+): 'lots'", more)] == list(range(2, 9))


def test_exit_0_when_every_file_is_read_and_stored_even_with_nulled_values(tmp_path: Path) -> None:
    p = one_row_file(tmp_path, mem_req="lots")
    assert headway("ingest", "--db", str(tmp_path / "s.duckdb"), str(p)).returncode == 0


def test_exit_0_for_a_file_with_no_rows_said_as_such(tmp_path: Path) -> None:
    p = tmp_path / "empty.csv"
    p.write_text(HEADER)
    res = headway("ingest", "--db", str(tmp_path / "s.duckdb"), str(p))
    assert res.returncode == 0 and "no jobs in it (no rows)" in res.stdout


def test_exit_1_when_a_file_had_rows_and_none_were_stored_with_the_reasons_shown(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(
        HEADER + GOOD.format(id=1).replace(",3,0,", ",zz,0,") + GOOD.format(id=2).replace(",3,0,", ",?,0,")
    )
    res = headway("ingest", "--db", str(tmp_path / "s.duckdb"), str(p))
    assert res.returncode == 1
    assert "none of its 2 rows could be read as a job" in " ".join(res.stderr.split())
    assert "state" in res.stdout and "not an integer" in res.stdout  # the problems table says why


def test_a_missing_or_unparseable_path_never_stops_the_others_and_exits_1(tmp_path: Path) -> None:
    good = one_row_file(tmp_path)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01 not a log")
    res = headway(
        "ingest", "--db", str(tmp_path / "s.duckdb"), str(tmp_path / "gone.csv"), str(junk), str(good)
    )
    flat = " ".join(res.stderr.split())
    assert res.returncode == 1 and "gone.csv: no such file" in flat and "junk.bin" in flat
    assert "the other 1 was stored" in flat
    assert store_figures(tmp_path / "s.duckdb")["ids"] == ["1", "2", "3"]


def test_an_unreadable_file_gets_one_line_not_a_usage_box_and_the_others_are_stored(tmp_path: Path) -> None:
    """Read by a process that lacks root's override of file permissions, as an ordinary user is."""
    import pwd
    import shutil

    try:
        owner = pwd.getpwnam("hw-alice")
    except KeyError:
        pytest.skip("test user hw-alice not present (tests/setup/users.sh)")
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the permission override")
    good = one_row_file(tmp_path)
    private = tmp_path / "private.csv"
    private.write_text(good.read_text())
    os.chown(private, owner.pw_uid, owner.pw_gid)
    private.chmod(0o600)
    no_override = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    db = tmp_path / "s.duckdb"
    res = subprocess.run(
        [*no_override, *HEADWAY, "ingest", "--db", str(db), str(private), str(good)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1 and "Usage:" not in res.stderr and "╭" not in res.stderr
    assert f"{private}: cannot read: Permission denied" in " ".join(res.stderr.split())
    assert store_figures(db)["ids"] == ["1", "2", "3"]
    alone = subprocess.run(
        [*no_override, *HEADWAY, "ingest", "--db", str(db), str(private)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        alone.returncode == 1
        and alone.stderr.strip().count("\n") == 0
        and "Permission denied" in alone.stderr
    )
