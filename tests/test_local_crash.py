"""Crash safety: SIGKILL the daemon again and again while 200 jobs run; nothing is lost or run twice."""

from __future__ import annotations

import itertools
import random
import signal
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from test_local_support import DaemonProc, start_daemon, wait_until

__all__ = ["start_daemon"]

N_JOBS = 200
N_KILLS = 10


def _script(marker: Path, kind: str, seconds: float) -> list[str]:
    """A job that logs its start (with its GPUs and its own clock) and its end to a shared marker file."""
    code = {"ok": 0, "fail": 3, "timeout": 0}[kind]
    body = (
        f'echo "$HEADWAY_JOB_ID start $CUDA_VISIBLE_DEVICES $(date +%s.%N)" >> {marker}; '
        f"sleep {seconds}; "
        f'echo "$HEADWAY_JOB_ID end" >> {marker}; exit {code}'
    )
    return ["sh", "-c", body]


@pytest.mark.slow
def test_sigkilled_daemon_loses_nothing_runs_nothing_twice_and_never_shares_a_gpu(
    start_daemon: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    rng = random.Random(5)
    marker = tmp_path / "marker.txt"
    d = start_daemon(gpus="4", grace=0.2)
    expected: dict[int, str] = {}
    for i in range(N_JOBS):
        kind = ("ok", "ok", "ok", "fail", "timeout")[i % 5]
        gpus = rng.choice([1, 1, 1, 2])
        if kind == "timeout":
            jid = d.submit(_script(marker, kind, 30), gpus=gpus, time_limit=0.25)
        else:
            jid = d.submit(_script(marker, kind, rng.uniform(0.02, 0.15)), gpus=gpus)
        expected[jid] = {"ok": "COMPLETED", "fail": "FAILED", "timeout": "TIMEOUT"}[kind]

    def n_ended() -> int:
        return len(d.ask({"op": "history", "limit": 100_000})["jobs"])

    kills = 0
    while kills < N_KILLS:
        time.sleep(rng.uniform(0.2, 1.0))
        d.kill(signal.SIGKILL)
        kills += 1
        time.sleep(rng.uniform(0.0, 0.4))  # jobs keep running and ending while no daemon watches
        d.start()
    assert n_ended() < N_JOBS, "the kills came after the work was done; slow them down"
    wait_until(lambda: n_ended() == N_JOBS, 90, "all jobs to end after the last restart")

    hist = {j["id"]: j for j in d.ask({"op": "history", "limit": 100_000})["jobs"]}
    # Every job ended exactly once, in the state its command called for.
    assert set(hist) == set(expected)
    assert {i: hist[i]["state"] for i in hist} == expected
    assert all(hist[i]["exit_code"] == 3 for i, s in expected.items() if s == "FAILED")
    # Its end was recorded once: one 'ended' event per job in the daemon's durable event log.
    con = sqlite3.connect(d.state_dir / "queue.sqlite")
    ends = Counter(r[0] for r in con.execute("SELECT job_id FROM events WHERE kind = 'ended'"))
    con.close()
    assert set(ends) == set(expected) and set(ends.values()) == {1}
    # No job ran twice: exactly one start line each in the marker file.
    starts: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for line in marker.read_text().splitlines():
        parts = line.split()
        if parts[1] == "start":
            starts[int(parts[0])].append((parts[2], float(parts[3])))
    assert set(starts) == set(expected)
    twice = {k: v for k, v in starts.items() if len(v) != 1}
    assert not twice, f"jobs started more than once: {twice}"
    # No GPU held by two jobs at once: per GPU, the recorded [start, end] intervals never overlap,
    # and each job's own start time (its clock, from the marker) lies inside its recorded interval.
    by_gpu: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for jid, j in hist.items():
        cuda, t_job = starts[jid][0]
        assert sorted(int(g) for g in cuda.split(",")) == sorted(j["gpu_ids"])
        assert len(j["gpu_ids"]) >= 1
        assert j["start_ts"] <= t_job <= j["end_ts"]
        for g in j["gpu_ids"]:
            by_gpu[g].append((j["start_ts"], j["end_ts"], jid))
    for g, spans in by_gpu.items():
        spans.sort()
        for (_s1, e1, j1), (s2, _e2, j2) in itertools.pairwise(spans):
            assert e1 <= s2, f"GPU {g}: job {j1} ran until {e1}, job {j2} started at {s2}"
    # The job store holds every job once, with the same states.
    wait_until(lambda: _stored(d.state_dir) == expected, 30, "the job store to catch up")


def _stored(state_dir: Path) -> dict[int, str]:
    try:
        con = duckdb.connect(str(state_dir / "jobs.duckdb"), read_only=True)
    except duckdb.Error:
        return {}
    try:
        return {
            int(a): b
            for a, b in con.execute("SELECT job_id, state FROM jobs WHERE source = 'local'").fetchall()
        }
    finally:
        con.close()
