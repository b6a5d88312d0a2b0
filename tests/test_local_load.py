"""Load: many parallel clients submitting at once are all accepted, each gets its own id, all recorded.

A lighter version of benchmarks/bench_submit.py (which submits 1,000 and reports the rate)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from headway.local.client import request
from test_local_support import DaemonProc, start_daemon, wait_until

__all__ = ["start_daemon"]

N_CLIENTS = 6
PER_CLIENT = 50


def _submit_many(args: tuple[str, int]) -> list[int]:
    state_dir, client = args
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return [
        int(
            request(
                Path(state_dir),
                {"op": "submit", "argv": ["true"], "cwd": "/", "env": env, "name": f"c{client}-{k}"},
            )["id"]
        )
        for k in range(PER_CLIENT)
    ]


def test_parallel_clients_submissions_are_all_accepted_and_recorded(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="2")
    blocker = d.submit(["sleep", "60"], gpus=2)  # keeps everything else pending while we count
    wait_until(lambda: d.ask({"op": "queue"})["jobs"][0]["state"] == "RUNNING", 20, "the blocker to run")
    with ProcessPoolExecutor(N_CLIENTS) as pool:
        ids = [
            i
            for got in pool.map(_submit_many, [(str(d.state_dir), c) for c in range(N_CLIENTS)])
            for i in got
        ]
    assert len(ids) == N_CLIENTS * PER_CLIENT and len(set(ids)) == len(ids)
    queue = d.ask({"op": "queue"})["jobs"]
    pending = {j["id"] for j in queue if j["state"] == "PENDING"}
    assert pending == set(ids)
    names = {j["name"] for j in queue if j["id"] in pending}
    assert names == {f"c{c}-{k}" for c in range(N_CLIENTS) for k in range(PER_CLIENT)}
    # Recorded durably: a daemon killed right now comes back with every one of them.
    d.kill()
    d.start()
    again = {j["id"] for j in d.ask({"op": "queue"})["jobs"] if j["state"] == "PENDING"}
    assert again == set(ids)
    d.ask({"op": "cancel", "id": blocker})
