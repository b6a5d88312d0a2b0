"""What a user gets wrong, or a log gets wrong, is caught with one clear line and loses nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.audit import audit_report
from headway.cli import app
from headway.schema import JobRecord, State, records_to_table
from headway.store import JobStore, StoreError

HEADER = (
    "State|JobID|User|Account|JobName|Partition|QOS|ExitCode|Submit|Start|End|Elapsed|Timelimit|AllocTRES"
)
TRES = "billing=4,cpu=4,gres/gpu=2,mem=32G,node=1"


def sacct_row(
    state: str, job_id: str, start: str = "10:00:00", end: str = "11:00:00", user: str = "ann"
) -> str:
    day = "2026-03-02T"
    return (
        f"{state}|{job_id}|{user}|ml|train|gpu|normal|0:0|{day}09:00:00|{day}{start}|{day}{end}|01:00:00|"
        f"02:00:00|{TRES}"
    )


def write(path: Path, *rows: str) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_a_data_file_given_as_the_store_is_refused_instead_of_opened_in_memory(tmp_path: Path) -> None:
    log = write(tmp_path / "log.txt", sacct_row("COMPLETED", "1"))
    csv = tmp_path / "jobs.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(StoreError, match="not a headway job store"):
        JobStore(csv)
    code, _, err = run("ingest", str(log), "--db", str(csv))
    assert code == 1 and "not a headway job store" in err
    assert csv.read_text() == "a,b\n1,2\n"
    code, _, err = run("export", "--db", str(csv), "--parquet", str(tmp_path / "out.parquet"))
    assert code == 1 and "not a headway job store" in err


def test_export_to_an_unwritable_place_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert (
        run("ingest", str(write(tmp_path / "log.txt", sacct_row("COMPLETED", "1"))), "--db", str(db))[0] == 0
    )
    code, _, err = run("export", "--db", str(db), "--parquet", str(tmp_path / "no" / "such" / "x.parquet"))
    assert code == 1 and "no such directory" in err and "Traceback" not in err


def test_export_onto_a_job_log_is_refused_and_an_earlier_export_is_replaced(tmp_path: Path) -> None:
    """`export --parquet jobs.csv` (a slip for jobs.parquet) replaced the log itself without a word."""
    log = write(tmp_path / "log.txt", sacct_row("COMPLETED", "1"))
    db = tmp_path / "s.duckdb"
    assert run("ingest", str(log), "--db", str(db))[0] == 0
    before = log.read_bytes()
    code, _, err = run("export", "--db", str(db), "--parquet", str(log))
    assert code == 1 and "is not an earlier export" in err and "Traceback" not in err
    assert log.read_bytes() == before
    own = tmp_path / "log.parquet"  # a log kept as Parquet, with other columns
    pq.write_table(pa.table({"id": ["1"], "state": ["COMPLETED"]}), own)
    before = own.read_bytes()
    assert run("export", "--db", str(db), "--parquet", str(own))[0] == 1
    assert own.read_bytes() == before
    out = tmp_path / "jobs.parquet"
    for _ in range(2):  # the second export replaces the first
        assert run("export", "--db", str(db), "--parquet", str(out))[0] == 0
    assert pq.read_table(out).num_rows == 1


def test_a_job_that_ends_before_it_starts_is_a_bad_row_in_every_tabular_format(tmp_path: Path) -> None:
    log = write(
        tmp_path / "log.txt",
        sacct_row("COMPLETED", "1"),
        sacct_row("FAILED", "2", start="10:00:00", end="09:40:00"),
    )
    db = tmp_path / "s.duckdb"
    code, out, err = run("ingest", str(log), "--db", str(db), "--json")
    assert code == 0, err
    f = json.loads(out)["files"][0]
    assert f["jobs_stored"] == 1 and f["bad_rows"] == 1
    assert "end time is before start time" in f["bad_row_examples"][0]


def test_a_negative_gpu_count_from_a_column_mapping_is_a_bad_row(tmp_path: Path) -> None:
    data = tmp_path / "jobs.csv"
    data.write_text(
        "id,st,sub,s,e,g\n"
        "1,ok,2026-01-01 09:00:00,2026-01-01 09:00:10,2026-01-01 10:00:10,2\n"
        "2,ok,2026-01-01 09:00:00,2026-01-01 09:00:10,2026-01-01 10:00:10,-2\n"
    )
    mapping = tmp_path / "m.toml"
    mapping.write_text(
        '[format]\ntime_format = "%Y-%m-%d %H:%M:%S"\ntimezone = "UTC"\n'
        '[fields]\njob_id = "id"\nstate = "st"\nsubmit_time = "sub"\nstart_time = "s"\nend_time = "e"\n'
        'gpus = "g"\n[states]\nok = "COMPLETED"\n'
    )
    code, out, err = run(
        "ingest",
        str(data),
        "--format",
        "csv",
        "--mapping",
        str(mapping),
        "--db",
        str(tmp_path / "s.duckdb"),
        "--json",
    )
    assert code == 0, err
    f = json.loads(out)["files"][0]
    assert f["jobs_stored"] == 1 and "GPU count is negative" in f["bad_row_examples"][0]


def test_the_unknown_state_note_counts_only_rows_that_were_stored(tmp_path: Path) -> None:
    log = write(
        tmp_path / "log.txt",
        sacct_row("WEIRD", "1"),
        sacct_row("WEIRD", "2", start="10:00:00", end="09:00:00"),  # skipped: ends before it starts
        sacct_row("COMPLETED", "3"),
    )
    code, out, _ = run("ingest", str(log), "--db", str(tmp_path / "s.duckdb"), "--json")
    notes = json.loads(out)["files"][0]["notes"]
    assert code == 0 and any(n.startswith("1 rows with an unrecognised State ['WEIRD']") for n in notes), (
        notes
    )


def test_rows_repeating_a_job_id_are_noted_and_the_last_one_is_kept(tmp_path: Path) -> None:
    log = write(
        tmp_path / "log.txt",
        sacct_row("FAILED", "7"),
        sacct_row("COMPLETED", "7"),
        sacct_row("COMPLETED", "8"),
    )
    db = tmp_path / "s.duckdb"
    code, out, _ = run("ingest", str(log), "--db", str(db), "--json")
    f = json.loads(out)["files"][0]
    assert code == 0 and f["jobs_stored"] == 2
    assert any("1 rows repeat a job id" in n for n in f["notes"])
    with JobStore(db, read_only=True) as s:
        assert s.con.execute("SELECT state FROM jobs WHERE job_id = '7'").fetchall() == [("COMPLETED",)]


def test_one_unreadable_file_of_several_stores_the_others_says_which_and_exits_1(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", sacct_row("COMPLETED", "1"), sacct_row("FAILED", "2"))
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\nworld\n")
    db = tmp_path / "s.duckdb"
    code, out, err = run("ingest", str(junk), str(good), "--db", str(db), "--json")
    assert code == 1
    files = json.loads(out)["files"]
    assert "cannot tell the format" in files[0]["error"] and files[1]["jobs_stored"] == 2
    code, out, err = run("ingest", str(good), str(junk), "--db", str(db))
    assert code == 1 and "1 of 2 files could not be read" in err and "the other 1 was stored" in err
    with JobStore(db, read_only=True) as s:
        assert s.count() == 2
    # A file that is not there is named, and never stops the others (a cron job's glob that lost a file).
    db2 = tmp_path / "s2.duckdb"
    code, _, err = run("ingest", str(tmp_path / "missing.txt"), str(good), "--db", str(db2))
    assert code == 1 and "missing.txt: no such file" in err and "the other 1 was stored" in err
    with JobStore(db2, read_only=True) as s:
        assert s.count() == 2


def test_an_unknown_time_zone_is_refused_for_every_format(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "sacct_22.05_sample.json"
    code, _, err = run("ingest", str(data), "--tz", "Mars/Olympus", "--db", str(tmp_path / "s.duckdb"))
    assert code == 1 and "unknown time zone 'Mars/Olympus'" in err


def rec(job_id: str, *, user: str, source: str, gpus: float, days: float) -> JobRecord:
    t0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC) + dt.timedelta(days=days)
    return JobRecord(
        job_id=job_id,
        user=user,
        submit_time=t0,
        start_time=t0,
        end_time=t0 + dt.timedelta(hours=1),
        gpus=gpus,
        state=State.COMPLETED if int(days) % 3 else State.FAILED,
        source=source,
    )


@pytest.fixture
def two_clusters(tmp_path: Path) -> Path:
    db = tmp_path / "two.duckdb"
    jobs = [rec(str(i), user=f"a{i % 4}", source="clusterA", gpus=2, days=i / 8) for i in range(80)]
    jobs += [rec(str(i), user=f"b{i % 3}", source="clusterB", gpus=4, days=i / 8) for i in range(40)]
    jobs += [rec("cpu-1", user="a1", source="clusterA", gpus=0, days=5)]
    with JobStore(db) as s:
        s.upsert(records_to_table(jobs))
    return db


def test_audit_of_one_source_counts_only_its_jobs(two_clusters: Path) -> None:
    with JobStore(two_clusters, read_only=True) as s:
        a = audit_report(s.con, source="clusterA")
        both = audit_report(s.con)
    assert a["source"] == "clusterA" and a["totals"]["gpu_jobs"] == 80 and both["totals"]["gpu_jobs"] == 120
    code, out, _ = run("audit", "--db", str(two_clusters), "--source", "clusterB", "--json")
    assert code == 0 and json.loads(out)["totals"]["gpu_hours"] == pytest.approx(40 * 4.0)
    code, _, err = run("audit", "--db", str(two_clusters), "--source", "clusterC")
    assert code == 1 and "it has clusterA, clusterB" in err


def test_predict_show_asks_which_source_when_a_job_id_is_in_two(two_clusters: Path, tmp_path: Path) -> None:
    model = str(tmp_path / "none.json")
    code, _, err = run("predict", "show", "5", "--db", str(two_clusters), "--model", model)
    assert code == 1 and "is in 2 sources (clusterA, clusterB); pass --source" in err
    code, _, err = run("predict", "show", "cpu-1", "--db", str(two_clusters), "--model", model)
    assert code == 1 and "CPU-only jobs unless --include-cpu" in err
    code, _, err = run("predict", "show", "--user", "a1", "--time-limit", "0", "--db", str(two_clusters))
    assert code == 1 and "--time-limit: must be more than 0 seconds" in err


def test_evaluate_with_nothing_ended_before_the_test_period_says_so(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    t0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
    jobs = [  # every job runs past the submission of the last ones: nothing to train on at the split
        JobRecord(
            job_id=str(i),
            user="u",
            submit_time=t0 + dt.timedelta(minutes=i),
            start_time=t0 + dt.timedelta(minutes=i),
            end_time=t0 + dt.timedelta(days=2),
            gpus=1,
            state=State.COMPLETED,
            source="s",
        )
        for i in range(20)
    ]
    with JobStore(db) as s:
        s.upsert(records_to_table(jobs))
    for cmd in ("evaluate", "validate"):
        code, _, err = run("predict", cmd, "--db", str(db))
        assert code == 1 and "nothing to train on" in err, (cmd, err)


def test_jobs_without_a_submit_time_are_counted_in_a_note_beside_the_weekly_series(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    jobs = [rec(str(i), user="u", source="s", gpus=1, days=i) for i in range(3)]
    jobs[0] = dataclasses.replace(jobs[0], submit_time=None)
    with JobStore(db) as s:
        s.upsert(records_to_table(jobs))
    with JobStore(db, read_only=True) as s:
        r = audit_report(s.con)
    assert sum(w["jobs"] for w in r["weekly"]) == 2 and r["totals"]["audited_jobs"] == 3
    assert "1 job has no submit time: it counts in the totals" in " ".join(r["notes"])


def test_an_unreadable_gpu_count_is_a_bad_row_not_a_cpu_job(tmp_path: Path) -> None:
    row = sacct_row("COMPLETED", "2").replace("gres/gpu=2", "gres/gpu=x")
    log = write(tmp_path / "log.txt", sacct_row("COMPLETED", "1"), row)
    code, out, _ = run("ingest", str(log), "--db", str(tmp_path / "s.duckdb"), "--json")
    f = json.loads(out)["files"][0]
    assert code == 0 and f["jobs_stored"] == 1
    assert "AllocTRES: a gres/gpu count is not a number ('" in f["bad_row_examples"][0]


def test_bytes_that_are_not_utf8_are_read_and_noted(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    text = "\n".join([HEADER, sacct_row("COMPLETED", "1", user="alice")]) + "\n"
    log.write_bytes(text.encode().replace(b"alice", b"al\xe9ice"))  # Latin-1, not UTF-8
    db = tmp_path / "s.duckdb"
    code, out, _ = run("ingest", str(log), "--db", str(db), "--json")
    f = json.loads(out)["files"][0]
    assert code == 0 and f["jobs_stored"] == 1
    assert any("1 bytes are not UTF-8" in n for n in f["notes"]), f["notes"]
    with JobStore(db, read_only=True) as s:
        assert s.con.execute('SELECT "user" FROM jobs').fetchall() == [("al\ufffdice",)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grace", "nan"], "--grace must be a number of seconds >= 0"),
        (["--db", "/nonexistent-dir/jobs.duckdb"], "no such directory /nonexistent-dir"),
    ],
)
def test_daemon_options_that_would_fail_later_fail_at_start(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, _, err = run("daemon", "--state-dir", str(tmp_path / "state"), "--gpus", "1", *args)
    assert code == 1 and message in err and not (tmp_path / "state").exists()


def test_without_multifactor_the_ratios_are_to_the_first_policy() -> None:
    from headway.sim.compare import comparison_table

    metrics = {"impact": {"time_to_success_mean": 200.0}, "impact-oracle": {"time_to_success_mean": 100.0}}
    table = comparison_table(metrics, "t")
    assert table.caption is not None and "ratio to impact" in str(table.caption)
    cells = [str(c) for c in table.columns[1].cells]
    assert "0.50x" in cells[1] and "\n" not in cells[0]  # the baseline's own cell has no ratio line


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"headway {version('headway')}"


def test_an_ingest_that_stores_nothing_leaves_no_empty_store_behind(tmp_path: Path) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("not a job log\n")
    db = tmp_path / "new.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(junk), "--db", str(db)])
    assert res.exit_code == 1 and not db.exists()
    audit = CliRunner().invoke(app, ["audit", "--db", str(db)])
    assert audit.exit_code == 1 and "no job store here yet" in audit.stderr


def test_a_strict_ingest_that_fails_on_a_later_file_keeps_what_it_stored(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text(
        "JobID|State|Submit|Start|End|AllocTRES\n1|COMPLETED|2026-01-01T00:00:00|"
        + ("2026-01-01T00:00:00|2026-01-01T01:00:00|gres/gpu=1\n")
    )
    bad = tmp_path / "bad.txt"
    bad.write_text("JobID|State\n1|garbage|x|y\n")
    db = tmp_path / "new.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(good), str(bad), "--db", str(db), "--strict", "--tz", "UTC"])
    assert res.exit_code == 1 and db.exists()
    with JobStore(db, read_only=True) as store:
        assert store.count() == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs (the tests run as root); skipped where mounting is not permitted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True)
    except OSError:
        pytest.skip("no mount command")
    if ok.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: " + ok.stderr.decode(errors="replace").strip())
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_fails_one_file_with_one_line_and_the_others_are_still_stored(
    tmp_path: Path, small_disk: Path
) -> None:
    db = small_disk / "s.duckdb"
    first = write(tmp_path / "first.txt", *(sacct_row("COMPLETED", str(i)) for i in range(1, 50)))
    big = write(tmp_path / "big.txt", *(sacct_row("COMPLETED", str(i)) for i in range(100, 20100)))
    last = write(tmp_path / "last.txt", *(sacct_row("COMPLETED", str(i)) for i in range(900000, 900050)))
    assert run("ingest", str(first), "--db", str(db), "--tz", "UTC")[0] == 0
    # Leave about 200 KB: the big file's rows fit in memory, its commit's write-ahead log does not.
    st = os.statvfs(small_disk)
    (small_disk / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - 200_000))
    code, out, err = run("ingest", str(big), str(last), "--db", str(db), "--tz", "UTC")
    assert code == 1
    line = " ".join(err.split())  # rich wraps long lines
    assert f"error: STORE: disk full while storing {big}; nothing from it was stored" in line
    assert "Traceback" not in err + out and "last.txt" in out
    with JobStore(db, read_only=True) as store:
        assert store.count() == 49 + 50


def test_ctrl_c_during_ingest_is_one_line_saying_whether_the_file_was_stored_and_exits_130(
    tmp_path: Path,
) -> None:
    n = 100_000
    log = write(tmp_path / "big.txt", *(sacct_row("COMPLETED", str(i)) for i in range(1, n + 1)))
    db = tmp_path / "s.duckdb"
    headway = str(Path(sys.executable).with_name("headway"))
    p = subprocess.Popen(
        [headway, "ingest", str(log), "--db", str(db), "--tz", "UTC"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background shell ignores it
    )
    assert p.stderr is not None
    said = p.stderr.readline()  # "FILE: detected format sacct": it is reading now, storing next
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    said += p.stderr.read()
    assert p.wait(timeout=60) == 130, said
    line = " ".join(said.split())
    assert (
        "Traceback" not in said
        and "error: interrupted: " in line
        and "running the same ingest again is safe" in line
    )
    if f"the jobs of {log} were stored" in line:
        with JobStore(db, read_only=True) as store:
            assert store.count() == n
    else:
        assert f"nothing from {log} was stored" in line
        assert not db.exists()  # a new store left empty is removed


def test_an_export_killed_midway_leaves_no_half_written_parquet_under_its_name(tmp_path: Path) -> None:
    db, out = tmp_path / "s.duckdb", tmp_path / "jobs.parquet"
    n = 100_000
    rows = (sacct_row("COMPLETED", str(i), user=f"u{i}") for i in range(1, n + 1))
    assert run("ingest", str(write(tmp_path / "log.txt", *rows)), "--db", str(db), "--tz", "UTC")[0] == 0
    headway = str(Path(sys.executable).with_name("headway"))
    p = subprocess.Popen(
        [headway, "export", "--db", str(db), "--parquet", str(out)], stdout=subprocess.DEVNULL
    )
    while p.poll() is None and not out.exists():
        time.sleep(0.001)
    p.kill()  # as soon as the name exists: before, that was the moment DuckDB began writing it
    p.wait()
    assert not out.exists() or pq.read_metadata(out).num_rows == n


def test_exporting_a_database_without_the_job_view_says_it_is_not_a_job_store(tmp_path: Path) -> None:
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE jobs (job_id VARCHAR)")
    con.close()
    code, _, err = run("export", "--db", str(db), "--parquet", str(tmp_path / "out.parquet"))
    line = " ".join(err.split())
    assert code == 1 and "its jobs table is not the layout of this headway" in line
    assert "Catalog Error" not in line


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_an_export_through_a_link_or_a_fifo_keeps_it_and_a_new_file_follows_the_umask(tmp_path: Path) -> None:
    """The temp-file-and-rename export replaced a symlink (its target untouched) and a FIFO with plain
    files, and made every export world-readable whatever the umask."""
    demo_store = tmp_path / "s.duckdb"
    rows = (sacct_row("COMPLETED", str(i)) for i in range(1, 6))
    assert (
        run("ingest", str(write(tmp_path / "log.txt", *rows)), "--db", str(demo_store), "--tz", "UTC")[0] == 0
    )
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link.parquet"
    link.symlink_to(real / "t.parquet")
    assert run("export", "--db", str(demo_store), "--parquet", str(link))[0] == 0
    assert link.is_symlink() and pq.read_table(real / "t.parquet").num_rows == 5
    fifo = tmp_path / "f.parquet"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert run("export", "--db", str(demo_store), "--parquet", str(fifo))[0] == 0
    reader.join(30)
    assert got and got[0][:4] == b"PAR1" and stat.S_ISFIFO(fifo.stat().st_mode)
    with _umask(0o077):
        assert run("export", "--db", str(demo_store), "--parquet", str(tmp_path / "u.parquet"))[0] == 0
    assert (tmp_path / "u.parquet").stat().st_mode & 0o777 == 0o600


def _store_of_five(tmp_path: Path) -> Path:
    store = tmp_path / "s.duckdb"
    rows = (sacct_row("COMPLETED", str(i)) for i in range(1, 6))
    assert run("ingest", str(write(tmp_path / "log.txt", *rows)), "--db", str(store), "--tz", "UTC")[0] == 0
    return store


def test_audit_html_through_a_link_or_a_fifo_keeps_it_and_a_new_file_follows_the_umask(
    tmp_path: Path,
) -> None:
    """`audit --html` (and `demo --html`) wrote a temp file and renamed it over the path given: a symlink
    was replaced by a plain file (its target kept the old report), a FIFO by a plain file its reader
    never saw (as root, `--html /dev/stdout` replaced the device node), and every page was 0644 whatever
    the umask. It now writes as export does, through one helper."""
    store = _store_of_five(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    (real / "r.html").write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(real / "r.html")
    assert run("audit", "--db", str(store), "--html", str(link))[0] == 0
    assert link.is_symlink() and (real / "r.html").read_text().startswith("<!DOCTYPE html>")
    fifo = tmp_path / "f.html"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code = run("audit", "--db", str(store), "--html", str(fifo))[0]
    reader.join(30)  # the reader appends only after the writer closed: wait for it, not check at once
    if reader.is_alive():  # the old code never opened the FIFO: let the reader go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert code == 0 and stat.S_ISFIFO(fifo.stat().st_mode)
    assert got and got[0].startswith(b"<!DOCTYPE html>")
    with _umask(0o077):
        assert run("audit", "--db", str(store), "--html", str(tmp_path / "u.html"))[0] == 0
    assert (tmp_path / "u.html").stat().st_mode & 0o777 == 0o600


def test_a_replaced_output_keeps_the_mode_and_owner_of_the_file_it_replaces(tmp_path: Path) -> None:
    """The audit page became 0644 and a model file took the umask's mode, whatever the file they
    replaced had (a 0600 report of who wastes what became world-readable); run as root, export, the
    audit and the model file took root's ownership of a user's file, which the user could then no
    longer rewrite."""
    from test_predict_cli import make_history

    store = _store_of_five(tmp_path)
    with JobStore(tmp_path / "hist.duckdb") as s:
        s.upsert(make_history(400, seed=3, users=4, days=4))
    outs = {
        "audit": (tmp_path / "a.html", ["audit", "--db", str(store), "--html"]),
        "export": (tmp_path / "e.parquet", ["export", "--db", str(store), "--parquet"]),
        "model": (tmp_path / "m.json", ["predict", "train", "--db", str(tmp_path / "hist.duckdb"), "--out"]),
    }
    other = os.geteuid() == 0  # only root can give a file to someone else
    for name, (path, args) in outs.items():
        if name == "export":  # export replaces only an earlier export
            assert run(*args, str(path))[0] == 0
        else:
            path.write_text('{"format": "headway-predictor"}')  # the model guard wants a model file there
        path.chmod(0o640)
        if other:
            os.chown(path, 4321, 4322)
        code, _, err = run(*args, str(path))
        assert code == 0, (name, err)
        st = path.stat()
        assert st.st_mode & 0o777 == 0o640, name
        if other:
            assert (st.st_uid, st.st_gid) == (4321, 4322), name


def test_train_leaves_a_file_named_like_its_old_temp_file_alone(tmp_path: Path) -> None:
    """The model was written to `--out` plus `.tmp`, a fixed name: a file of that name (`m.json.tmp`, a
    user's own) was overwritten and then renamed away, and two trainings into one directory wrote the
    same temp file."""
    from test_predict_cli import make_history

    with JobStore(tmp_path / "hist.duckdb") as s:
        s.upsert(make_history(400, seed=3, users=4, days=4))
    mine = tmp_path / "m.json.tmp"
    mine.write_text("my notes")
    code, _, err = run(
        "predict", "train", "--db", str(tmp_path / "hist.duckdb"), "--out", str(tmp_path / "m.json")
    )
    assert code == 0, err
    assert mine.read_text() == "my notes"
    assert "boosters" in json.loads((tmp_path / "m.json").read_text())


def test_ingest_of_a_header_only_file_says_nothing_was_stored_instead_of_0_jobs_in_the_store(
    tmp_path: Path,
) -> None:
    """A log with its header and no rows printed '0 jobs in the store.', but no store was created (an empty
    one is removed). It says the file held no jobs and that no store was made, and exits 0 as a Parquet
    file of no rows does (test_trace_checks)."""
    db = tmp_path / "s.duckdb"
    head = write(tmp_path / "head.txt")
    assert head.read_text().count("\n") == 1  # the header line alone
    code, out, _ = run("ingest", str(head), "--db", str(db))
    flat = " ".join(out.split())
    assert code == 0 and "jobs in the store" not in out and not db.exists()
    assert f"note ({head}): no jobs in it (no rows); nothing stored" in flat
    assert f"no jobs stored; {db} was not created" in flat
    rows = write(tmp_path / "log.txt", sacct_row("COMPLETED", "1"))
    code, out, _ = run("ingest", str(rows), str(head), "--db", str(db))
    flat = " ".join(out.split())
    assert code == 0 and re.search(r"\b1 jobs? in the store", out) and db.exists()
    assert f"note ({head}): no jobs in it" in flat and f"note ({rows})" not in flat
