"""Ingesting into a store that already holds jobs: what replaces a stored job, and what must not."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import duckdb

from headway.store import JobStore
from headway.traces.base import ReadOptions
from headway.traces.registry import read, sniff
from test_input_checks import TRES, run, write


def row(
    state: str,
    job_id: str,
    user: str = "ann",
    submit: str = "2026-03-02T09:00:00",
    start: str = "2026-03-02T10:00:00",
    end: str = "2026-03-02T11:00:00",
    name: str = "train",
) -> str:
    return f"{state}|{job_id}|{user}|ml|{name}|gpu|normal|0:0|{submit}|{start}|{end}|01:00:00|02:00:00|{TRES}"


def ingest(db: Path, log: Path, *extra: str) -> tuple[int, str, str]:
    return run("ingest", str(log), "--format", "sacct", "--tz", "UTC", "--db", str(db), *extra)


def stored(db: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(source, job_id) -> (user, state) of every stored job."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute('SELECT source, job_id, "user", state FROM jobs').fetchall()
    finally:
        con.close()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def test_a_second_cluster_reusing_job_ids_is_refused_instead_of_replacing_the_first(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    a = write(tmp_path / "a.txt", row("COMPLETED", "1"), row("COMPLETED", "2"), row("FAILED", "3"))
    b = write(
        tmp_path / "b.txt",
        row("COMPLETED", "1", user="bob", submit="2026-04-01T09:00:00", start="2026-04-01T10:00:00",
            end="2026-04-01T11:00:00"),
        row("COMPLETED", "2", user="bob", submit="2026-04-01T09:00:00", start="2026-04-01T10:00:00",
            end="2026-04-01T11:00:00"),
        row("COMPLETED", "9", user="bob"),
    )  # fmt: skip
    assert ingest(db, a)[0] == 0
    code, _, err = ingest(db, b)
    assert code == 1
    line = " ".join(err.split())
    assert "2 job ids of source 'sacct' already stored belong to different jobs" in line
    assert (
        "job 1: stored submitted 2026-03-02 09:00:00Z by ann, incoming submitted 2026-04-01 09:00:00Z by bob"
        in line
    )
    assert "nothing from it was stored" in line and "--source" in line and "--replace" in line
    assert stored(db) == {
        ("sacct", i): ("ann", s) for i, s in (("1", "COMPLETED"), ("2", "COMPLETED"), ("3", "FAILED"))
    }
    # Named per cluster, both are kept; --replace is the way to let the stored jobs go.
    assert ingest(db, b, "--source", "beta")[0] == 0
    assert len(stored(db)) == 6
    assert ingest(db, b, "--replace")[0] == 0
    assert stored(db)[("sacct", "1")] == ("bob", "COMPLETED")


def test_one_reused_job_id_is_refused_in_a_singular_sentence(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    assert ingest(db, write(tmp_path / "a.txt", row("COMPLETED", "1")))[0] == 0
    b = write(tmp_path / "b.txt", row("COMPLETED", "1", user="bob", submit="2026-04-01T09:00:00",
                                      start="2026-04-01T10:00:00", end="2026-04-01T11:00:00"))  # fmt: skip
    code, _, err = ingest(db, b)
    line = " ".join(err.split())
    assert code == 1 and "1 job id of source 'sacct' already stored belongs to a different job" in line, line


def test_reingesting_a_newer_snapshot_updates_its_jobs_silently_and_says_how_many_were_new(
    tmp_path: Path,
) -> None:
    db = tmp_path / "s.duckdb"
    old = write(
        tmp_path / "old.txt",
        row("RUNNING", "1", end="Unknown"),
        row("PENDING", "2", start="Unknown", end="Unknown"),
    )
    new = write(tmp_path / "new.txt", row("COMPLETED", "1"), row("FAILED", "2"), row("COMPLETED", "3"))
    assert ingest(db, old)[0] == 0
    code, out, err = ingest(db, new, "--json")
    assert code == 0, err
    f = json.loads(out)["files"][0]
    assert (f["jobs_stored"], f["jobs_added"], f["jobs_updated"]) == (3, 1, 2)
    assert stored(db)[("sacct", "2")] == ("ann", "FAILED")
    code, out, _ = ingest(db, new)
    assert code == 0 and "updated" in out
    cells = next(c for c in out.splitlines() if "new.txt" in c).split("│")
    assert [c.strip() for c in cells[4:7]] == ["3", "0", "3"]  # jobs stored, new, updated


def test_a_requeued_job_whose_submit_time_slurm_reset_is_the_same_job(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    first = write(tmp_path / "1.txt", row("RUNNING", "7", end="Unknown"))
    # requeued at 10:30 after starting at 10:00: Slurm resets Submit, the job waits again
    again = write(
        tmp_path / "2.txt",
        row("PENDING", "7", submit="2026-03-02T10:30:00", start="Unknown", end="Unknown"),
    )
    assert ingest(db, first)[0] == 0
    code, _, err = ingest(db, again)
    assert code == 0, err
    assert stored(db) == {("sacct", "7"): ("ann", "PENDING")}


def test_reingesting_an_older_snapshot_keeps_the_jobs_that_had_ended(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    old = write(
        tmp_path / "old.txt",
        row("RUNNING", "1", end="Unknown"),
        row("PENDING", "2", start="Unknown", end="Unknown"),
        row("RUNNING", "3", end="Unknown"),
    )
    new = write(
        tmp_path / "new.txt", row("COMPLETED", "1"), row("TIMEOUT", "2"), row("RUNNING", "3", end="Unknown")
    )
    assert ingest(db, new)[0] == 0
    code, out, err = ingest(db, old, "--json")
    assert code == 0, err
    f = json.loads(out)["files"][0]
    assert (f["jobs_stored"], f["jobs_updated"], f["kept_ended"]) == (1, 1, 2)
    assert any("2 stored jobs had ended" in n and "stored rows were kept" in n for n in f["notes"])
    assert {k[1]: v[1] for k, v in stored(db).items()} == {"1": "COMPLETED", "2": "TIMEOUT", "3": "RUNNING"}


def test_the_same_jobs_under_another_source_are_noted_not_silently_doubled(tmp_path: Path) -> None:
    log = write(tmp_path / "a.txt", row("COMPLETED", "1"), row("FAILED", "2"))
    db = str(tmp_path / "s.duckdb")
    assert run("ingest", str(log), "--db", db, "--source", "clA", "--tz", "UTC")[0] == 0
    code, out, _ = run("ingest", str(log), "--db", db, "--tz", "UTC", "--json")
    assert code == 0
    (f,) = json.loads(out)["files"]
    assert any(
        "2 of these jobs (same id and submit time) are also stored under source 'clA'" in n
        for n in f["notes"]
    )


def test_an_older_snapshot_of_a_requeued_job_ingested_after_the_newer_one_is_kept_not_refused(
    tmp_path: Path,
) -> None:
    """Slurm reset job 100's submit time when it requeued it; the day before's snapshot (first run still
    running) was refused as another cluster's job, and --replace then lost the completed run."""
    db = tmp_path / "s.duckdb"
    day2 = write(
        tmp_path / "day2.txt",
        row(
            "COMPLETED",
            "100",
            submit="2026-03-02T11:00:00",
            start="2026-03-02T11:10:00",
            end="2026-03-02T12:00:00",
        ),
    )
    day1 = write(
        tmp_path / "day1.txt",
        row("RUNNING", "100", submit="2026-03-02T10:00:00", start="2026-03-02T10:05:00", end="Unknown"),
    )
    assert ingest(db, day2)[0] == 0
    code, out, err = ingest(db, day1, "--json")
    assert code == 0, err
    assert stored(db) == {("sacct", "100"): ("ann", "COMPLETED")}
    assert json.loads(out)["files"][0]["kept_ended"] == 1


def shifted(i: int, days: int, hours: int = 0) -> str:
    """Job i of a small day of jobs, moved by `days` and `hours`."""
    base = dt.datetime(2026, 3, 2, 8) + dt.timedelta(days=days, hours=hours, minutes=i)

    def at(m: int) -> str:
        return (base + dt.timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M:%S")

    return row("COMPLETED", str(i), submit=at(0), start=at(5), end=at(65))


def test_a_second_cluster_with_the_same_users_and_names_is_refused_when_most_ids_moved(
    tmp_path: Path,
) -> None:
    """Same users, same job names, times a week later: every shared id "looked like" a requeue, and all of
    the first cluster's jobs were replaced without a word. A requeued job here and there is an update;
    most ids moving is another cluster's log (or the same log read in another zone)."""
    db = tmp_path / "s.duckdb"
    a = write(tmp_path / "a.txt", *(shifted(i, 0) for i in range(12)))
    b = write(tmp_path / "b.txt", *(shifted(i, 7) for i in range(12)))
    assert ingest(db, a)[0] == 0
    code, _, err = ingest(db, b)
    line = " ".join(err.split())
    assert code == 1 and "12 job ids of source 'sacct' already stored belong to different jobs" in line
    assert "another --tz" in line
    assert len(stored(db)) == 12
    # The same log read with another --tz moves every id too.
    code, _, err = run("ingest", str(a), "--format", "sacct", "--tz", "America/New_York", "--db", str(db))
    assert code == 1 and "belong to different jobs" in " ".join(err.split())


def test_a_mass_requeue_read_with_sacct_D_is_the_same_jobs_in_either_order(tmp_path: Path) -> None:
    """An admin requeues every running job before maintenance: Slurm resets each one's Submit, so most ids
    the next day's file shares with the store moved, and that file was refused as another cluster's.
    `sacct -D` lists each earlier run (stored as ID@START): its submit time is the stored one."""
    running = [
        row("RUNNING", str(i), submit="2026-03-02T08:00:00", start="2026-03-02T08:10:00", end="Unknown")
        for i in range(12)
    ]
    requeued = [
        r
        for i in range(12)
        for r in (
            row(
                "REQUEUED",
                str(i),
                submit="2026-03-02T08:00:00",
                start="2026-03-02T08:10:00",
                end="2026-03-02T09:00:00",
            ),
            row(
                "COMPLETED",
                str(i),
                submit="2026-03-02T09:00:00",
                start="2026-03-02T09:30:00",
                end="2026-03-02T10:30:00",
            ),
        )
    ]
    day1, day2 = write(tmp_path / "day1.txt", *running), write(tmp_path / "day2.txt", *requeued)
    for order in ((day1, day2), (day2, day1)):
        db = tmp_path / f"{order[0].stem}.duckdb"
        for log in order:
            code, _, err = ingest(db, log)
            assert code == 0, err
        jobs = stored(db)
        assert len(jobs) == 24 and all(jobs[("sacct", str(i))] == ("ann", "COMPLETED") for i in range(12))


def known(db: Path) -> dict[str, tuple[str | None, int | None]]:
    """job_id -> (user, exit_code) of every stored job."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            r[0]: (r[1], r[2]) for r in con.execute('SELECT job_id, "user", exit_code FROM jobs').fetchall()
        }
    finally:
        con.close()


def test_sacct_json_after_sacct_p_keeps_the_users_and_exit_codes_only_sacct_p_knew(
    tmp_path: Path, shared_traces: Path
) -> None:
    """Real Slurm 22.05 output of the same 23 jobs: `sacct --json` has no users and no exit codes of
    failed jobs, and ingesting it after `sacct -P` turned 23 known users and 9 exit codes into nulls."""
    slurm = shared_traces / "slurm-22.05"
    db = tmp_path / "s.duckdb"
    headway = str(Path(sys.executable).with_name("headway"))

    def ingest_real(log: str) -> None:
        cmd = [headway, "ingest", "--db", str(db), "--source", "X", str(slurm / log)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr

    ingest_real("sacct_allocations.txt")
    first = known(db)
    assert len(first) == 23 and all(user is not None for user, _ in first.values())
    assert {code for _, code in first.values()} >= {0, 1, 2}
    ingest_real("sacct.json")
    assert known(db) == first


def test_the_store_counts_each_known_value_a_poorer_format_would_have_nulled(
    tmp_path: Path, shared_traces: Path
) -> None:
    slurm = shared_traces / "slurm-22.05"
    opts = ReadOptions(source="X")
    tables = [read(sniff(slurm / f), slurm / f, opts).table for f in ("sacct_allocations.txt", "sacct.json")]
    with JobStore(tmp_path / "s.duckdb") as store:
        store.upsert(tables[0], refuse_reused_ids=True)
        assert store.upsert(tables[1], refuse_reused_ids=True) == 23
        assert (store.last_updated, store.last_kept_ended) == (23, 0)
        assert store.last_kept_by_field == {"user": 23, "exit_code": 9}
        assert store.last_kept_values == 32
