"""The sacct reader against real Slurm 22.05 output and hand-written edge cases; `--from-slurm`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import stat
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.schema import JOB_SCHEMA, JobRecord, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.registry import read, sniff
from headway.traces.sacct import READER, SACCT_DELIMITER, fetch_from_slurm, parse_since, sacct_command

DATA = Path(__file__).parent / "data"
EDGE = DATA / "sacct_edge_cases.txt"


def _real(shared_traces: Path, name: str = "sacct_allocations.txt") -> Path:
    return shared_traces / "slurm-22.05" / name


def _by_id(path: Path, **opts: object) -> dict[str, JobRecord]:
    res = READER.read(path, ReadOptions(**opts))  # type: ignore[arg-type]
    return {r.job_id: r for r in table_to_records(res.table)}


@pytest.mark.shared
def test_real_sacct_output_gives_all_23_jobs_with_their_states(shared_traces: Path) -> None:
    res = read("sacct", _real(shared_traces), ReadOptions(tz="UTC"))  # the reader and the shared rules
    assert res.table.schema == JOB_SCHEMA
    assert res.rows_read == 23 and res.table.num_rows == 23 and res.bad_row_count == 0
    assert res.missing_fields == ["group"]  # the test cluster has no accounts: Account is empty throughout
    states = res.table.column("state").to_pylist()
    assert states.count("COMPLETED") == 14 and states.count("FAILED") == 7
    assert states.count("TIMEOUT") == 1 and states.count("CANCELLED") == 1
    assert set(res.table.column("source").to_pylist()) == {"sacct"}


@pytest.mark.shared
def test_real_two_node_job_counts_16_gpus_once_not_typed_plus_untyped(shared_traces: Path) -> None:
    jobs = _by_id(_real(shared_traces), tz="UTC")
    multi = jobs["23"]
    assert multi.gpus == 16 and multi.nodes == 2 and multi.cpus == 2
    assert jobs["1"].gpus == 8 and jobs["3"].gpus == 4
    assert sum(j.gpus for j in jobs.values()) == 76


@pytest.mark.shared
def test_real_exit_codes_limits_and_cancelled_by_uid(shared_traces: Path) -> None:
    jobs = _by_id(_real(shared_traces), tz="UTC")
    assert jobs["4"].exit_code == 1 and jobs["5"].exit_code == 2
    assert jobs["22"].state == "CANCELLED"  # "CANCELLED by 0"
    timeout = jobs["21"]
    assert timeout.state == "TIMEOUT" and timeout.time_limit == 60
    assert timeout.runtime == 73  # ElapsedRaw agrees with Start/End
    assert jobs["1"].mem_mb == 64000 and jobs["1"].priority_class == "normal"
    assert jobs["1"].submit_time == dt.datetime(2026, 11, 29, 14, 37, 13, tzinfo=dt.UTC)


@pytest.mark.shared
def test_file_with_job_steps_gives_the_same_jobs_as_the_allocations_file(shared_traces: Path) -> None:
    alloc = READER.read(_real(shared_traces), ReadOptions(tz="UTC"))
    steps = READER.read(_real(shared_traces, "sacct_with_steps.txt"), ReadOptions(tz="UTC"))
    assert steps.bad_row_count == 0
    assert steps.table.equals(alloc.table)
    assert any("job-step" in n for n in steps.notes)


@pytest.mark.shared
def test_naive_times_are_converted_from_the_given_time_zone(shared_traces: Path) -> None:
    utc = _by_id(_real(shared_traces), tz="UTC")
    berlin = _by_id(_real(shared_traces), tz="Europe/Berlin")
    assert utc["1"].submit_time - berlin["1"].submit_time == dt.timedelta(hours=1)


def test_edge_cases_pending_typed_only_array_het_and_unlimited() -> None:
    jobs = _by_id(EDGE, tz="UTC")
    pending = jobs["900"]
    assert pending.state == "PENDING" and pending.start_time is None and pending.end_time is None
    assert pending.gpus == 4  # from ReqTRES: AllocTRES is empty
    assert pending.time_limit == 86400 and pending.priority_class == "high"
    array = jobs["901_4"]
    assert array.gpus == 2 and array.time_limit is None  # typed only; UNLIMITED
    assert array.mem_mb == 8000  # 4000Mc x 2 CPUs
    het = jobs["902+0"]
    assert het.state == "CANCELLED" and het.gpus == 2 and het.time_limit is None
    assert jobs["903"].state == "OUT_OF_MEMORY" and jobs["903"].time_limit == 1800
    assert jobs["903"].gpus == 0
    assert jobs["906"].gpus == 8 and jobs["906"].time_limit == 216000
    assert "903.batch" not in jobs


def test_bad_rows_are_reported_with_file_line_and_reason_and_skipped() -> None:
    res = READER.read(EDGE, ReadOptions(tz="UTC"))
    assert res.table.num_rows == 5
    assert res.bad_row_count == 2
    texts = [str(b) for b in res.bad_rows]
    assert texts[0].startswith(f"{EDGE}:8: Submit") and "29/03/2026 01:00" in texts[0]
    assert texts[1] == f"{EDGE}:9: expected 18 fields, found 5"
    assert any("signal" in n for n in res.notes)


def test_strict_makes_the_first_bad_row_fatal() -> None:
    with pytest.raises(BadInputError, match=r"sacct_edge_cases.txt:8: Submit"):
        READER.read(EDGE, ReadOptions(strict=True, tz="UTC"))


def test_dst_change_is_handled_by_the_time_zone_not_by_offset_arithmetic() -> None:
    jobs = _by_id(EDGE, tz="Europe/Berlin")
    array = jobs["901_4"]  # 01:30 CET to 03:30 CEST on 2026-03-29 is one hour
    assert array.runtime == 3600
    assert array.start_time == dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.UTC)


def test_timelimit_and_elapsed_text_forms_fill_end_when_end_is_absent(tmp_path: Path) -> None:
    p = tmp_path / "s.txt"
    p.write_text(
        "JobID|State|Start|Elapsed|Timelimit\n"
        "1|COMPLETED|2026-01-01T00:00:00|1-01:00:00|2-00:00:00\n"
        "2|RUNNING|2026-01-01T00:00:00|00:10:00|30:00\n"
    )
    jobs = _by_id(p, tz="UTC")
    assert jobs["1"].runtime == 90000 and jobs["1"].time_limit == 172800
    assert jobs["2"].end_time is None and jobs["2"].time_limit == 1800


def test_missing_columns_are_listed_and_left_null(tmp_path: Path) -> None:
    p = tmp_path / "s.txt"
    p.write_text("JobID|State\n1|COMPLETED\n")
    res = READER.read(p, ReadOptions(tz="UTC"))
    assert res.table.num_rows == 1
    assert {"gpus", "submit_time", "user", "time_limit"} <= set(res.missing_fields)
    assert res.table.column("gpus").to_pylist() == [None]


def test_a_file_that_is_not_sacct_output_is_one_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("hello|world\n1|2\n")
    with pytest.raises(BadInputError, match="no JobID column"):
        READER.read(p, ReadOptions())


def test_sniff_claims_sacct_but_not_csv_exports() -> None:
    assert sniff(EDGE) == "sacct"
    assert not READER.sniff(DATA / "slurmdb_job_table.csv", (DATA / "slurmdb_job_table.csv").read_bytes())


def test_since_accepts_spans_and_dates() -> None:
    now = dt.datetime(2026, 3, 1, 12, 0)
    assert parse_since("30d", now) == dt.datetime(2026, 1, 30, 12, 0)
    assert parse_since("12h", now) == dt.datetime(2026, 3, 1, 0, 0)
    assert parse_since("2w", now) == dt.datetime(2026, 2, 15, 12, 0)
    assert parse_since("2026-01-01", now) == dt.datetime(2026, 1, 1)
    with pytest.raises(BadInputError, match="--since"):
        parse_since("last tuesday", now)
    argv = sacct_command(dt.datetime(2026, 1, 1, 8, 30, tzinfo=dt.UTC))
    assert argv[:4] == ["sacct", "-a", "-X", "-P"] and argv[-4:] == ["-S", "2026-01-01T08:30:00", "-E", "now"]


def test_the_sacct_headway_runs_is_asked_from_a_utc_start() -> None:
    chicago = dt.datetime(2026, 1, 1, 2, 30, tzinfo=ZoneInfo("America/Chicago"))
    assert sacct_command(chicago)[-4:-2] == ["-S", "2026-01-01T08:30:00"]


def test_from_slurm_without_sacct_on_path_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BadInputError, match="sacct not found"):
        fetch_from_slurm("30d")


def _fake_sacct(tmp_path: Path, body: str) -> None:
    exe = tmp_path / "sacct"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_from_slurm_reports_a_refused_sacct(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_sacct(tmp_path, "echo 'sacct: error: Permission denied' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(BadInputError, match="sacct failed: sacct: error: Permission denied"):
        fetch_from_slurm("1d")


def test_ingest_from_slurm_runs_sacct_and_stores_its_jobs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_sacct(tmp_path, f"cat '{EDGE}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    db = tmp_path / "jobs.duckdb"
    result = CliRunner().invoke(app, ["ingest", "--from-slurm", "--since", "7d", "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["jobs_in_store"] == 5 and summary["files"][0]["format"] == "sacct"


@pytest.mark.shared
def test_ingest_cli_auto_detects_sacct_and_stores_23_jobs(shared_traces: Path, tmp_path: Path) -> None:
    db = tmp_path / "jobs.duckdb"
    args = ["ingest", str(_real(shared_traces)), "--db", str(db), "--json", "--tz", "UTC"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(app, args)
    summary = json.loads(again.stdout)
    assert summary["jobs_in_store"] == 23 and summary["files"][0]["format"] == "sacct"


def test_fast_and_general_splitting_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from headway.traces import tabular

    fast = READER.read(EDGE, ReadOptions(tz="UTC"))
    monkeypatch.setattr(tabular, "_read_unquoted_fast", lambda *a, **k: None)
    general = READER.read(EDGE, ReadOptions(tz="UTC"))
    assert fast.table.equals(general.table)
    assert [str(b) for b in fast.bad_rows] == [str(b) for b in general.bad_rows]


def test_progress_is_reported_in_bytes(tmp_path: Path) -> None:
    seen: list[int] = []
    READER.read(EDGE, ReadOptions(tz="UTC", progress=seen.append))
    assert seen and seen[-1] == EDGE.stat().st_size and seen == sorted(seen)


def test_without_tz_naive_times_are_local_time_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    local = _by_id(EDGE)
    utc = _by_id(EDGE, tz="UTC")
    assert utc["900"].submit_time - local["900"].submit_time == dt.timedelta(hours=9)


def test_a_short_row_with_invalid_utf8_is_reported_without_noise_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pyarrow cannot even show such a row to its bad-row handler and reports that through
    # sys.unraisablehook ("Exception ignored in ..." on the user's terminal); the reader must keep it
    # quiet, still report the row, and keep the good rows.
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    head = "JobID|User|State|Submit|Start|End|AllocTRES\n"
    good = "1|alice|COMPLETED|2024-01-01T00:00:00|2024-01-01T00:01:00|2024-01-01T01:00:00|gres/gpu=1\n"
    path = tmp_path / "sacct.txt"
    bad = b"2|b\xf4b|FAILED\n"
    path.write_bytes(head.encode() + good.encode() + bad + good.replace("1|", "3|", 1).encode())
    res = READER.read(path, ReadOptions(tz="UTC"))
    assert res.table.num_rows == 2 and res.bad_row_count == 1
    assert res.bad_rows[0].line == 3
    assert unraisable == []


def test_times_in_the_repeated_autumn_hour_are_settled_by_elapsed(tmp_path: Path) -> None:
    f = tmp_path / "fallback.txt"
    f.write_text(
        "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES\n"
        "1|COMPLETED|2026-11-01T01:40:00|2026-11-01T01:50:00|2026-11-01T01:10:00|1200|gres/gpu=8\n"
        "2|COMPLETED|2026-11-01T00:30:00|2026-11-01T00:30:00|2026-11-01T01:30:00|7200|gres/gpu=8\n"
        "3|COMPLETED|2026-11-01T00:30:00|2026-11-01T00:30:00|2026-11-01T01:30:00|3600|gres/gpu=8\n"
    )
    res = READER.read(f, ReadOptions(tz="America/New_York"))
    assert res.bad_row_count == 0
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    runtimes = {}
    for k, r in jobs.items():
        assert r.start_time is not None and r.end_time is not None
        runtimes[k] = (r.end_time - r.start_time).total_seconds()
    assert runtimes == {"1": 1200.0, "2": 7200.0, "3": 3600.0}
    assert jobs["1"].end_time == dt.datetime(2026, 11, 1, 6, 10, tzinfo=dt.UTC)  # 01:10 EST


def test_the_runs_of_a_requeued_job_keep_their_gpu_hours(tmp_path: Path) -> None:
    """`sacct -D` as Slurm 22.05 printed it for an 8-GPU job requeued after 6 s, then cancelled pending."""
    f = tmp_path / "requeue.txt"
    f.write_text(
        "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES\n"
        "9|REQUEUED|2026-11-30T08:17:32|2026-11-30T08:17:34|2026-11-30T08:17:40|6|"
        "billing=1,cpu=1,gres/gpu:a100=8,gres/gpu=8,node=1\n"
        "9|CANCELLED by 0|2026-11-30T08:17:40|None|2026-11-30T08:17:58|0|\n"
        "10|COMPLETED|2026-11-30T08:17:32|2026-11-30T08:17:34|2026-11-30T08:17:40|6|gres/gpu=1\n"
    )
    res = READER.read(f, ReadOptions(tz="UTC"))
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert set(jobs) == {"9@20261130T081734Z", "9", "10"}  # a run is named by its start
    run = jobs["9@20261130T081734Z"]
    assert run.state.value == "PREEMPTED" and run.gpus == 8.0 and run.start_time is not None
    assert jobs["9"].state.value == "CANCELLED" and jobs["9"].start_time is None
    assert any("1 requeued runs" in n for n in res.notes)


def test_a_requeued_run_is_kept_while_its_job_waits_again(tmp_path: Path) -> None:
    """The job is pending again, so sacct -D has only the run: it is still a run of its own."""
    f = tmp_path / "requeue.txt"
    f.write_text(
        "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES\n"
        "9|REQUEUED|2026-11-30T08:17:32|2026-11-30T08:17:34|2026-11-30T08:17:40|6|gres/gpu=8\n"
    )
    (run,) = table_to_records(READER.read(f, ReadOptions(tz="UTC")).table)
    assert (run.job_id, run.state.value, run.gpus) == ("9@20261130T081734Z", "PREEMPTED", 8.0)


def test_a_later_window_of_sacct_names_each_requeued_run_as_the_first_did(tmp_path: Path) -> None:
    """An incremental read no longer lists the first run: the second must not take its name."""
    head = "JobID|State|Submit|Start|End|ElapsedRaw|AllocTRES\n"
    run1 = "100|REQUEUED|2026-11-30T09:00:00|2026-11-30T10:00:00|2026-11-30T11:00:00|3600|gres/gpu=4\n"
    run2 = "100|REQUEUED|2026-11-30T11:00:00|2026-11-30T12:00:00|2026-11-30T14:00:00|7200|gres/gpu=4\n"
    last = "100|COMPLETED|2026-11-30T14:00:00|2026-11-30T15:00:00|2026-11-30T18:00:00|10800|gres/gpu=4\n"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(head + run1 + run2 + last)
    b.write_text(head + run2 + last)
    ids_a = {r.job_id for r in table_to_records(READER.read(a, ReadOptions(tz="UTC")).table)}
    ids_b = {r.job_id for r in table_to_records(READER.read(b, ReadOptions(tz="UTC")).table)}
    assert ids_b < ids_a and ids_a - ids_b == {"100@20261130T100000Z"}


def test_a_header_repeated_inside_a_sacct_log_is_a_bad_row_not_a_job(tmp_path: Path) -> None:
    log = tmp_path / "joined.txt"
    log.write_text("JobID|User|State\n1|a|COMPLETED\nJobID|User|State\n2|b|FAILED\n")
    res = READER.read(log, ReadOptions())
    assert [r.job_id for r in table_to_records(res.table)] == ["1", "2"]
    assert [(b.line, b.reason) for b in res.bad_rows] == [
        (3, "a repeated header line (logs joined together?)")
    ]


_EPOCH = 1_800_000_000  # 2027-01-15 08:00:00 UTC


def test_ingest_from_slurm_refuses_tz_it_has_no_use_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_sacct(tmp_path, f"cat '{EDGE}'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    db = tmp_path / "jobs.duckdb"
    res = CliRunner().invoke(app, ["ingest", "--from-slurm", "--tz", "America/Chicago", "--db", str(db)])
    assert res.exit_code == 1 and "with --from-slurm headway runs sacct in UTC" in res.output, res.output
    assert not db.exists()


def test_from_slurm_times_are_sacct_own_whatever_the_zone_here_or_tz_for_the_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """sacct prints naive times in its TZ; headway runs it in UTC and reads UTC, while --tz still reads a
    file given alongside (Chicago times here) and this process's own zone (Tokyo) plays no part."""
    fields = "JobID|JobName|User|State|Submit|Start|End"
    _fake_sacct(
        tmp_path,
        f't=$(date -d @{_EPOCH} +%Y-%m-%dT%H:%M:%S)\necho "{fields}"\necho "77|a|alice|COMPLETED|$t|$t|$t"\n',
    )
    chicago = dt.datetime.fromtimestamp(_EPOCH, ZoneInfo("America/Chicago")).strftime("%Y-%m-%dT%H:%M:%S")
    (tmp_path / "chicago.txt").write_text(f"{fields}\n88|b|bob|COMPLETED|{chicago}|{chicago}|{chicago}\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    db = tmp_path / "jobs.duckdb"
    args = [
        "ingest",
        str(tmp_path / "chicago.txt"),
        "--from-slurm",
        "--tz",
        "America/Chicago",
        "--db",
        str(db),
    ]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    from headway.store import JobStore

    with JobStore(db, read_only=True) as store:
        ends = {r.job_id: r.end_time for r in table_to_records(store.table())}
    assert {j: t.timestamp() if t else None for j, t in ends.items()} == {"77": _EPOCH, "88": _EPOCH}


def _with_names(
    shared_traces: Path, tmp_path: Path, names: dict[str, str], header_extra: str = "", sep: str = "|"
) -> Path:
    """The real 22.05 sacct -P output with some jobs renamed (by id) as sacct prints such names: as is;
    `sep` as `sacct --delimiter` would print it."""
    lines = _real(shared_traces).read_text().splitlines()
    out = [sep.join(lines[0].split("|")) + header_extra]
    for ln in lines[1:]:
        f = ln.split("|")
        if f[0] in names:
            f[1] = names[f[0]]
        out.append(sep.join(f) + ("|note" if header_extra else ""))
    path = tmp_path / "sacct.txt"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.mark.shared
def test_a_job_name_holding_a_bar_reads_whole_with_headways_own_delimiter(
    shared_traces: Path, tmp_path: Path
) -> None:
    """headway runs sacct with `--delimiter` set to ASCII's unit separator, so `x|y` is one name."""
    plain = {
        r.job_id: r for r in table_to_records(READER.read(_real(shared_traces), ReadOptions(tz="UTC")).table)
    }
    renamed = {"1": "x|y", "2": "a|b|c"}
    path = _with_names(shared_traces, tmp_path, renamed, sep=SACCT_DELIMITER)
    assert READER.sniff(path, path.read_bytes()[:4096])
    res = READER.read(path, ReadOptions(tz="UTC"))
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert res.bad_row_count == 0 and len(jobs) == len(plain) == 23
    assert jobs == {j: dataclasses.replace(r, name=renamed.get(j, r.name)) for j, r in plain.items()}
    assert f"--delimiter={SACCT_DELIMITER}" in sacct_command(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


@pytest.mark.shared
def test_a_bar_inside_a_value_of_a_bar_separated_file_is_a_bad_row_not_a_guess(
    shared_traces: Path, tmp_path: Path
) -> None:
    """Which column holds the extra `|` cannot be told: joining it into JobName put a job submitted with
    `-A 'x|carol'` under user x. The row is refused, and the reason says why."""
    path = _with_names(shared_traces, tmp_path, {"1": "x|y"})
    res = READER.read(path, ReadOptions(tz="UTC"))
    assert res.bad_row_count == 1 and "a separator inside a value" in str(res.bad_rows[0])
    assert "1" not in {r.job_id for r in table_to_records(res.table)}


@pytest.mark.shared
def test_a_surplus_field_is_still_a_bad_row_when_two_columns_could_hold_it(
    shared_traces: Path, tmp_path: Path
) -> None:
    path = _with_names(shared_traces, tmp_path, {"1": "x|y"}, header_extra="|Comment")
    res = READER.read(path, ReadOptions(tz="UTC"))
    assert res.bad_row_count == 1 and "expected 19 fields, found 20" in str(res.bad_rows[0])


def test_bad_rows_of_from_slurm_name_the_sacct_window_not_a_temp_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_sacct(tmp_path, f"cat '{EDGE}'\necho '99|short'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = CliRunner().invoke(
        app,
        [
            "ingest",
            "--from-slurm",
            "--since",
            "2026-01-01T06:00:00+00:00",
            "--db",
            str(tmp_path / "j.duckdb"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    (f,) = json.loads(res.stdout)["files"]
    assert f["bad_row_examples"][-1].startswith("sacct -S 2026-01-01T06:00:00 (UTC):")
    assert not any("headway-sacct-" in b for b in f["bad_row_examples"])


def test_ingest_refuses_options_that_would_be_silently_ignored_or_misread(tmp_path: Path) -> None:
    db = tmp_path / "j.duckdb"
    since = CliRunner().invoke(app, ["ingest", str(EDGE), "--since", "7d", "--db", str(db)])
    assert since.exit_code == 1 and "--since is for --from-slurm" in since.output, since.output
    philly = CliRunner().invoke(app, ["ingest", "--from-slurm", "--format", "philly", "--db", str(db)])
    assert philly.exit_code == 1 and "--format philly is for files" in philly.output, philly.output
    assert "headway-sacct-" not in philly.output and not db.exists()


def test_timelimit_fields_out_of_range_are_unreadable_and_day_hour_forms_read_as_slurm_writes_them(
    tmp_path: Path,
) -> None:
    """`1-25:99:00` was stored as 182340 s and `5:99` as 399 s (the fields were added up whatever their
    range); `1-02` read as a day and 2 minutes, `1-02:30` as a day, 2 minutes and 30 seconds."""
    p = tmp_path / "s.txt"
    p.write_text(
        "JobID|State|Start|Elapsed|Timelimit\n"
        "1|COMPLETED|2026-01-01T00:00:00|00:10:00|1-25:99:00\n"
        "2|COMPLETED|2026-01-01T00:00:00|00:10:00|5:99\n"
        "3|COMPLETED|2026-01-01T00:00:00|00:10:00|1-02\n"
        "4|COMPLETED|2026-01-01T00:00:00|00:10:00|1-02:30\n"
        "5|COMPLETED|2026-01-01T00:00:00|00:10:00|90:00\n"
        "6|COMPLETED|2026-01-01T00:00:00|00:10:00|Partition_Limit\n"
    )
    res = READER.read(p, ReadOptions(tz="UTC"))
    # A time limit is not what the job record needs: the jobs are kept with no limit, and counted.
    assert res.bad_row_count == 0
    (problem,) = res.problems
    assert problem.column == "Timelimit" and problem.reason.startswith("not a duration")
    assert problem.effect == "stored as null" and problem.count == 2
    assert [(ln, v) for _, ln, v in problem.examples] == [(2, "1-25:99:00"), (3, "5:99")]
    jobs = _by_id(p, tz="UTC")
    assert set(jobs) == {"1", "2", "3", "4", "5", "6"}
    assert jobs["1"].time_limit is None and jobs["2"].time_limit is None
    assert jobs["3"].time_limit == 86400 + 2 * 3600 and jobs["4"].time_limit == 86400 + 2 * 3600 + 30 * 60
    assert jobs["5"].time_limit == 90 * 60 and jobs["6"].time_limit is None


def test_a_memory_figure_past_an_exabyte_is_stored_as_null_not_a_crash(tmp_path: Path) -> None:
    """ReqMem 999999999999999999999999999999 (MB) overflowed the int64 column: the whole read failed with
    Arrow's 'Float value ... was truncated'."""
    p = tmp_path / "s.txt"
    p.write_text(
        "JobID|State|Start|Elapsed|ReqMem\n"
        "1|COMPLETED|2026-01-01T00:00:00|00:10:00|999999999999999999999999999999\n"
        "2|COMPLETED|2026-01-01T00:00:00|00:10:00|32G\n"
    )
    res = READER.read(p, ReadOptions(tz="UTC"))
    assert res.bad_row_count == 0 and [(p.column, p.count) for p in res.problems] == [("memory", 1)]
    jobs = _by_id(p, tz="UTC")
    assert jobs["1"].mem_mb is None and jobs["2"].mem_mb == 32 * 1024
