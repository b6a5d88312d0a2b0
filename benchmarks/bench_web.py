"""Response times of `headway serve` on a generated 1M-job store: the overview page, /api/summary, /metrics.

Builds the store with bench_audit's generator, starts `headway serve` on a free loopback port as a child
process, waits for /healthz, then requests each endpoint once (reported as the first load: it fills the
server's cache, and the overview's summary is the one /api/summary serves, so its first load is already
warm) and N more times, reporting the median and max of those. Also reports the machine's load
and the server's CPU seconds, since on a shared box wall time partly measures the neighbours.
Goals (issue): overview and /api/summary <= 1 s after the first load; /metrics <= 100 ms.

    .venv/bin/python benchmarks/bench_web.py [--jobs 1000000] [--requests 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench_audit import generate

HEADWAY = str(Path(sys.executable).with_name("headway"))
ENDPOINTS: dict[str, tuple[str, float]] = {  # name: (path, goal seconds after the first load)
    "overview": ("/", 1.0),
    "api_summary": ("/api/summary", 1.0),
    "metrics": ("/metrics", 0.1),
}


@dataclass
class Timing:
    first_s: float
    runs: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs)

    @property
    def max_s(self) -> float:
        return max(self.runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str, timeout: float = 120.0) -> float:
    """Seconds for one full GET (body read); a non-200 answer stops the benchmark."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"GET {url} answered {resp.status}")
    return time.perf_counter() - t


def wait_healthy(base: str, proc: subprocess.Popen[bytes], limit_s: float = 60.0) -> float:
    t = time.perf_counter()
    while time.perf_counter() - t < limit_s:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"headway serve exited {proc.returncode}: {err[-2000:]}")
        try:
            get(base + "/healthz", timeout=2.0)
            return time.perf_counter() - t
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise SystemExit(f"headway serve did not answer /healthz within {limit_s:.0f} s")


def bench(db: Path, requests: int) -> dict[str, object]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [HEADWAY, "serve", "--db", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        startup_s = wait_healthy(base, proc)
        timings = {name: Timing(first_s=get(base + path)) for name, (path, _goal) in ENDPOINTS.items()}
        for _ in range(requests):
            for name, (path, _goal) in ENDPOINTS.items():
                timings[name].runs.append(get(base + path))
        cpu = psutil.Process(proc.pid).cpu_times()
        server_cpu_s = cpu.user + cpu.system
    finally:
        proc.kill()
        proc.wait()
    out: dict[str, object] = {"startup_s": startup_s, "server_cpu_s": server_cpu_s}
    for name, t in timings.items():
        out[f"{name}_first_s"] = t.first_s
        out[f"{name}_median_s"] = t.median_s
        out[f"{name}_max_s"] = t.max_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=20, help="timed requests per endpoint after the first")
    ap.add_argument("--json", action="store_true", help="print only the JSON result line")
    args = ap.parse_args()
    if args.requests < 1:
        raise SystemExit("--requests must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="headway-bench-web-"))
    try:
        db = tmp / "jobs.duckdb"
        gen_s = generate(db, args.jobs)
        results: dict[str, object] = {"bench": "web", "jobs": args.jobs, "requests": args.requests}
        results["generate_s"] = gen_s
        results.update(bench(db, args.requests))
        results["load_avg"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.json:
        print(
            f"generated {args.jobs:,} jobs in {gen_s:.1f} s; server answered /healthz after "
            f"{results['startup_s']:.2f} s"
        )
        print(f"{'endpoint':<14}{'first load':>12}{'median':>10}{'max':>10}{'goal':>10}")
        for name, (path, goal) in ENDPOINTS.items():
            print(
                f"{path:<14}{results[f'{name}_first_s']:>11.3f}s{results[f'{name}_median_s']:>9.3f}s"
                f"{results[f'{name}_max_s']:>9.3f}s{'<= ' + format(goal, 'g') + ' s':>10}"
            )
        print(
            f"server CPU {results['server_cpu_s']:.1f} s; load average {results['load_avg']:.2f} "
            f"({os.cpu_count()} CPUs); {args.requests} requests per endpoint after the first"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
