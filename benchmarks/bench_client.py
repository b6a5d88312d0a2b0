"""Wall time of one local-queue client call, as a shell loop of `headway submit` pays it.

Starts `headway daemon --gpus 1` on a fresh state dir, holds its GPU with one blocker job so the jobs
submitted here stay pending, then times each client command as a whole process (`headway submit`,
`queue`, `why`, `cancel`), N runs each, interleaved with `python3 -c pass` run the same way, so the
ratio to the interpreter's own start-up is measured on the same machine in the same minute. Reports
the median, p90 and max of each.

    .venv/bin/python benchmarks/bench_client.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_submit import bench_daemon
from headway.local.client import request

HEADWAY = str(Path(sys.executable).with_name("headway"))


def _time(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="headway-bench-")) / "state"
    env = {**os.environ, "HEADWAY_STATE_DIR": str(state)}
    with bench_daemon(state, "--gpus", "1", env=env):
        subprocess.run(
            [HEADWAY, "submit", "--gpus", "1", "--", "sleep", "600"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        times: dict[str, list[float]] = {
            k: [] for k in ("python -c pass", "submit", "queue", "why", "cancel")
        }
        for k in range(a.runs):
            times["python -c pass"].append(_time([sys.executable, "-c", "pass"], env))
            times["submit"].append(
                _time([HEADWAY, "submit", "--gpus", "1", "--name", f"b{k}", "--", "true"], env)
            )
            jid = str(max(j["id"] for j in request(state, {"op": "queue"})["jobs"]))
            times["queue"].append(_time([HEADWAY, "queue"], env))
            times["why"].append(_time([HEADWAY, "why", jid], env))
            times["cancel"].append(_time([HEADWAY, "cancel", jid], env))
        base = statistics.median(times["python -c pass"])
        res: dict[str, object] = {"bench": "client", "runs": a.runs, "load": round(os.getloadavg()[0], 2)}
        for name, ts in times.items():
            ts.sort()
            med = statistics.median(ts)
            res[name] = {
                "median_ms": round(1000 * med, 1),
                "p90_ms": round(1000 * ts[int(0.9 * (len(ts) - 1))], 1),
                "max_ms": round(1000 * ts[-1], 1),
                "x_python": round(med / base, 1),
            }
            print(f"{name:>15}: median {1000 * med:6.1f} ms  ({med / base:4.1f}x python -c pass)")
        print(json.dumps(res))


if __name__ == "__main__":
    main()
