"""Readers and a writer at once, with real processes: DuckDB lets one process write a store or any number
read it, and a command started meanwhile waits (--wait) instead of failing on DuckDB's lock message."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from headway.store import JobStore, StoreBusyError
from headway.store_lock import Holder, lock_holder
from test_input_checks import sacct_row, write

HEADWAY = str(Path(sys.executable).with_name("headway"))
PATIENCE_S = 60.0  # the most any step may take on a loaded machine; a passing run takes seconds

# Opens the store (to write, or read-only), says so by writing its PID to READY, and holds it until
# RELEASE exists (or PATIENCE_S, so a failed test leaves no process behind).
HOLDER = """
import os, sys, time
from pathlib import Path
from headway.store import JobStore
db, mode, ready, release, patience = sys.argv[1:]
store = JobStore(db, read_only=mode == "read")
Path(ready + ".tmp").write_text(str(os.getpid()))
os.replace(ready + ".tmp", ready)
end = time.monotonic() + float(patience)
while not Path(release).exists() and time.monotonic() < end:
    time.sleep(0.02)
store.close()
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("HEADWAY_WAIT", "HEADWAY_DB")}


def _until(done: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + PATIENCE_S
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


class Held:
    """A store held by another process; `release()` lets it go and waits for that process to end."""

    def __init__(self, proc: subprocess.Popen[bytes], pid: int, release: Path) -> None:
        self.proc, self.pid, self._release = proc, pid, release

    def release(self) -> None:
        self._release.touch()
        self.proc.wait(timeout=PATIENCE_S)


@contextmanager
def held(db: Path, mode: str, tmp: Path, patience: float = PATIENCE_S) -> Iterator[Held]:
    """`db` held by a child process, to write (`write`) or to read (`read`), for the `with` block (or
    `patience` seconds at most)."""
    ready, release = tmp / f"{mode}.ready", tmp / f"{mode}.release"
    ready.unlink(missing_ok=True)
    release.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db), mode, str(ready), str(release), str(patience)],
        env=_env(),
        stderr=subprocess.PIPE,
    )
    try:
        _until(lambda: ready.exists() or proc.poll() is not None, "the holder to open the store")
        if not ready.exists():
            raise AssertionError(f"the holder failed: {proc.communicate()[1].decode()}")
        h = Held(proc, int(ready.read_text()), release)
        yield h
    finally:
        release.touch()
        try:
            proc.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _store(path: Path) -> Path:
    """A small real job store: a few ended GPU jobs of one source."""
    t0 = dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC)
    n = 6
    rows = {
        "job_id": [str(i) for i in range(n)],
        "user": ["ann", "bob"] * (n // 2),
        "submit_time": [t0 + dt.timedelta(minutes=i) for i in range(n)],
        "start_time": [t0 + dt.timedelta(minutes=i + 1) for i in range(n)],
        "end_time": [t0 + dt.timedelta(minutes=i + 61) for i in range(n)],
        "gpus": [2.0] * n,
        "state": ["COMPLETED", "FAILED"] * (n // 2),
        "source": ["c"] * n,
    }
    with JobStore(path) as store:
        store.upsert(pa.table(rows))
    return path


def _headway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HEADWAY, *args], capture_output=True, text=True, env=env or _env(), timeout=PATIENCE_S
    )


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_a_reader_started_during_a_write_waits_says_so_once_and_succeeds_when_the_writer_is_done(
    tmp_path: Path,
) -> None:
    db = _store(tmp_path / "s.duckdb")
    err_file = tmp_path / "audit.err"
    with held(db, "write", tmp_path) as writer, err_file.open("w") as err:
        audit = subprocess.Popen(
            [HEADWAY, "audit", "--db", str(db), "--wait", str(PATIENCE_S), "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            env=_env(),
            text=True,
        )
        _until(lambda: "waiting for the store" in err_file.read_text(), "the audit to say it waits")
        time.sleep(0.3)  # a few retries while still locked
        assert audit.poll() is None  # still waiting, not failed
        writer.release()
        out, _ = audit.communicate(timeout=PATIENCE_S)
    said = err_file.read_text()
    assert audit.returncode == 0, said
    assert said.count("waiting for the store") == 1, said
    assert f"waiting for the store (being written by PID {writer.pid}), up to 60 s" in said
    assert json.loads(out)["db"] == str(db)


READ_COMMANDS: dict[str, list[str]] = {
    "audit": ["audit"],
    "export": ["export", "--parquet", "{tmp}/jobs.parquet"],
    "predict train": ["predict", "train", "--out", "{tmp}/model.json"],
    "predict evaluate": ["predict", "evaluate"],
    "predict validate": ["predict", "validate"],
    "predict show": ["predict", "show", "1"],
    "simulate": ["simulate"],
    "sweep": ["sweep"],
    "demo": ["demo", "--html", "{tmp}/report.html"],  # writes the sample into --db, then reads it
}


@pytest.fixture(scope="module")
def written_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """One store held by a writer for every command that is not to wait for it."""
    tmp = tmp_path_factory.mktemp("written")
    db = _store(tmp / "s.duckdb")
    with held(db, "write", tmp, patience=600.0) as writer:  # for the module's tests, however slow
        yield db, writer.pid


@pytest.mark.parametrize("command", list(READ_COMMANDS))
def test_a_command_told_not_to_wait_fails_at_once_in_one_line_naming_the_writer(
    command: str, written_store: tuple[Path, int], tmp_path: Path
) -> None:
    db, pid = written_store
    args = [a.format(tmp=tmp_path) for a in READ_COMMANDS[command]]
    started = time.monotonic()
    res = _headway(*args, "--db", str(db), "--wait", "0")
    assert res.returncode == 1, res.stderr
    line = _one_error_line(res.stderr)
    assert f"the job store is being written by PID {pid}" in line and "--wait SECONDS" in line, line
    assert "waiting for the store" not in res.stderr
    assert "Could not set lock" not in res.stderr
    assert time.monotonic() - started < PATIENCE_S / 2


def test_headway_wait_in_the_environment_is_the_default_wait(written_store: tuple[Path, int]) -> None:
    db, pid = written_store
    res = _headway("audit", "--db", str(db), env={**_env(), "HEADWAY_WAIT": "0"})
    assert res.returncode == 1 and f"being written by PID {pid}" in _one_error_line(res.stderr)


def test_a_short_wait_gives_up_after_it_with_one_error_line(written_store: tuple[Path, int]) -> None:
    db, pid = written_store
    started = time.monotonic()
    res = _headway("audit", "--db", str(db), "--wait", "0.5")
    assert time.monotonic() - started >= 0.5
    assert res.returncode == 1
    assert res.stderr.count(f"waiting for the store (being written by PID {pid}), up to 0.5 s") == 1
    line = _one_error_line(res.stderr)
    assert f"still being written by PID {pid} after waiting 0.5 s" in line and "longer --wait" in line


def test_readers_never_wait_for_each_other(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb")
    with held(db, "read", tmp_path):
        res = _headway("audit", "--db", str(db), "--wait", "0", "--json")
    assert res.returncode == 0, res.stderr
    assert "waiting" not in res.stderr and json.loads(res.stdout)["db"] == str(db)


def test_a_writer_waits_for_a_reader_naming_it_once_then_writes(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb")
    said: list[str] = []
    opened: list[JobStore] = []
    with held(db, "read", tmp_path) as reader:
        # In a thread, so this test can let the reader go once the writer waits for it.
        t = threading.Thread(target=lambda: opened.append(JobStore(db, wait=PATIENCE_S, on_wait=said.append)))
        t.start()
        _until(lambda: bool(said), "the writer to say it waits")
        assert not opened
        reader.release()
        t.join(timeout=PATIENCE_S)
    assert said == [f"waiting for the store (being read by PID {reader.pid}), up to 60 s"]
    with opened[0] as store:
        store.upsert(pa.table({"job_id": ["new"], "state": ["PENDING"], "source": ["c"]}))
        assert store.count() == 7


def test_a_writer_that_may_not_wait_raises_store_busy_naming_the_reader(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb")
    said: list[str] = []
    with held(db, "read", tmp_path) as reader, pytest.raises(StoreBusyError) as busy:
        JobStore(db, on_wait=said.append)  # wait=0, the library's default
    assert busy.value.pid == reader.pid and not said
    assert str(busy.value) == (
        f"{db}: the job store is being read by PID {reader.pid}; try again once it is done, or give "
        "--wait SECONDS to wait for it"
    )


def test_the_lock_holder_is_read_from_duckdbs_own_messages(tmp_path: Path) -> None:
    """What --wait rests on: DuckDB names the holder's PID, and tells a writer when only readers hold
    the file. A DuckDB upgrade that rewords its message fails here, not in a user's terminal."""
    db = _store(tmp_path / "s.duckdb")
    for mode, read_only in (("write", True), ("write", False), ("read", False)):
        with held(db, mode, tmp_path) as h, pytest.raises(duckdb.Error) as refused:
            duckdb.connect(str(db), read_only=read_only)
        assert lock_holder(refused.value) == Holder(h.pid, readers=mode == "read"), str(refused.value)
    assert lock_holder(duckdb.IOException("IO Error: No space left on device")) is None


def _ingest_waits() -> bool:
    from headway.commands.ingest import ingest

    return "wait" in inspect.signature(ingest).parameters


@pytest.mark.skipif(not _ingest_waits(), reason="`headway ingest --wait` is not wired into ingest yet")
def test_an_ingest_waits_for_a_reader_then_stores(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.duckdb")
    log = write(tmp_path / "more.txt", sacct_row("COMPLETED", "100"))
    err_file = tmp_path / "ingest.err"
    with held(db, "read", tmp_path) as reader, err_file.open("w") as err:
        ingest = subprocess.Popen(
            [HEADWAY, "ingest", str(log), "--tz", "UTC", "--db", str(db), "--wait", str(PATIENCE_S)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=_env(),
        )
        _until(lambda: "waiting for the store" in err_file.read_text(), "the ingest to say it waits")
        assert ingest.poll() is None
        reader.release()
        ingest.wait(timeout=PATIENCE_S)
    said = err_file.read_text()
    assert ingest.returncode == 0, said
    assert said.count(f"waiting for the store (being read by PID {reader.pid})") == 1, said
    with JobStore(db, read_only=True) as store:
        assert store.count() == 7
