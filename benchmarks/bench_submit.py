"""Submission throughput of the local queue: 1,000 submissions from parallel client processes.

Starts `headway daemon --gpus 4` on a fresh state dir, holds all GPUs with one blocker job so every
submission stays pending (the daemon ranks the whole queue after each burst), then has P client processes
submit N jobs in total, one connection per submission, as `headway submit` does. Reports the rate and the
per-request latency, and checks that every submission was accepted and recorded in the queue's database.

    .venv/bin/python benchmarks/bench_submit.py [--jobs 1000] [--clients 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from headway.local.client import ClientError, pages, request


def _client(args: tuple[str, int, int]) -> list[tuple[int, float]]:
    state_dir, first, count = args
    out = []
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for k in range(count):
        t = time.perf_counter()
        reply = request(
            Path(state_dir),
            {"op": "submit", "argv": ["true"], "cwd": "/", "env": env, "gpus": 1, "name": f"b{first + k}"},
        )
        out.append((int(reply["id"]), time.perf_counter() - t))
    return out


@contextmanager
def bench_daemon(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`headway daemon --quiet --grace 1 ARGS` on `state`, ready (its predictor loaded); on leaving, the
    jobs left are cancelled (they outlive their daemon by design: pending first, running last) and the
    daemon stopped. bench_client.py uses it too."""
    cmd = [
        sys.executable,
        "-m",
        "headway.cli",
        "daemon",
        "--quiet",
        "--grace",
        "1",
        "--state-dir",
        str(state),
    ]
    daemon = subprocess.Popen([*cmd, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if request(state, {"op": "ping"}, timeout=5)["ready"]:
                    break
            except ClientError:
                if time.time() > deadline or daemon.poll() is not None:
                    raise SystemExit("daemon did not start") from None
                time.sleep(0.1)
        yield daemon
    finally:
        try:
            for j in reversed([j for page in pages(state, {"op": "queue"}) for j in page["jobs"]]):
                request(state, {"op": "cancel", "id": j["id"]})
            deadline = time.time() + 15
            while time.time() < deadline and request(state, {"op": "queue"})["jobs"]:
                time.sleep(0.1)
        except ClientError:
            pass
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--policy", default="impact")
    a = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="headway-bench-")) / "state"
    with bench_daemon(state, "--gpus", "4", "--policy", a.policy):
        env = {"PATH": "/usr/bin:/bin"}
        blocker = request(
            state, {"op": "submit", "argv": ["sleep", "600"], "cwd": "/", "env": env, "gpus": 4}
        )["id"]
        while request(state, {"op": "queue"})["jobs"][0]["state"] != "RUNNING":
            time.sleep(0.05)  # the blocker holds all GPUs: every submission below stays pending
        per = [a.jobs // a.clients + (1 if i < a.jobs % a.clients else 0) for i in range(a.clients)]
        starts = [sum(per[:i]) for i in range(a.clients)]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(a.clients) as pool:
            results = list(pool.map(_client, [(str(state), s, n) for s, n in zip(starts, per, strict=True)]))
        wall = time.perf_counter() - t0
        ids = [i for r in results for i, _ in r]
        lat = sorted(x for r in results for _, x in r)
        time.sleep(0.5)
        con = sqlite3.connect(state / "queue.sqlite")
        recorded = con.execute(
            "SELECT count(*) FROM jobs WHERE id != ? AND state = 'PENDING'", (blocker,)
        ).fetchone()[0]
        con.close()
        queue = [j for page in pages(state, {"op": "queue"}) for j in page["jobs"]]  # 500 a page
        ranked = sum(1 for j in queue if j.get("rank"))
        res = {
            "bench": "submit",
            "jobs": a.jobs,
            "clients": a.clients,
            "policy": a.policy,
            "accepted": len(set(ids)),
            "recorded": int(recorded),
            "ranked_in_queue": ranked,
            "wall_s": round(wall, 3),
            "rate_per_s": round(a.jobs / wall, 1),
            "latency_median_ms": round(1000 * statistics.median(lat), 2),
            "latency_p95_ms": round(1000 * lat[int(0.95 * (len(lat) - 1))], 2),
            "latency_max_ms": round(1000 * lat[-1], 2),
        }
        print(
            f"{a.jobs} submissions from {a.clients} parallel clients in {wall:.2f} s: {res['rate_per_s']}/s"
        )
        print(
            f"latency median {res['latency_median_ms']} ms, p95 {res['latency_p95_ms']} ms, "
            f"max {res['latency_max_ms']} ms"
        )
        print(f"accepted {res['accepted']}, recorded {res['recorded']}, ranked {ranked}")
        print(json.dumps(res))
        if res["accepted"] != a.jobs or res["recorded"] != a.jobs:
            raise SystemExit("some submissions were lost")


if __name__ == "__main__":
    main()
