"""Ingest speed of sacct output: the reader alone and `headway ingest` end to end (reader + store).

Generates N realistic `sacct -a -X -P` rows (varied states, typed and untyped GPU TRES, pending jobs with
Unknown times, UNLIMITED limits, CANCELLED by UID) into a temporary file, then times each path three times
and reports the median rows/s. Target (issue 2): >= 200k sacct rows/s.

    .venv/bin/python benchmarks/bench_ingest.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.traces.base import ReadOptions
from headway.traces.sacct import READER

HEADER = (
    "JobID|JobName|User|Account|Partition|State|ExitCode|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
    "AllocTRES|NNodes|NodeList|Priority|QOS|ReqTRES"
)
STATES = np.array(
    [
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "CANCELLED by 1001",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "RUNNING",
        "PENDING",
    ]
)
STATE_P = np.array([0.55, 0.18, 0.06, 0.1, 0.03, 0.01, 0.04, 0.03])
GPU_TYPES = np.array(["a100", "v100", "h100"])


def generate(path: Path, n: int, seed: int = 7) -> None:
    """Write n sacct rows; vectorized so generating does not dominate the benchmark's wall time."""
    rng = np.random.default_rng(seed)
    t0 = np.datetime64("2026-01-01T00:00:00")
    submit = t0 + np.sort(rng.integers(0, 90 * 86400, n)).astype("timedelta64[s]")
    wait = rng.exponential(600, n).astype(np.int64)
    run = rng.lognormal(7.5, 1.6, n).astype(np.int64) + 1
    limit_min = rng.choice(np.array([60, 240, 1440, 4320]), n)
    state = STATES[rng.choice(len(STATES), n, p=STATE_P)]
    gpus = rng.choice(np.array([0, 1, 2, 4, 8, 16]), n, p=[0.1, 0.4, 0.15, 0.15, 0.15, 0.05])
    nodes = np.maximum(1, gpus // 8)
    gtype = GPU_TYPES[rng.integers(0, 3, n)]
    users = np.char.add("u", rng.integers(0, 400, n).astype(str))
    names = np.char.add("job-", rng.integers(0, 5000, n).astype(str))
    pending = state == "PENDING"
    running = state == "RUNNING"
    start = submit + wait.astype("timedelta64[s]")
    end = start + run.astype("timedelta64[s]")

    def text(values: np.ndarray) -> pa.Array:
        return pa.array(values.astype(str), pa.string())

    def stamp(values: np.ndarray, unknown: np.ndarray) -> pa.Array:
        strs = pc.strftime(pa.array(values.astype("datetime64[s]")), format="%Y-%m-%dT%H:%M:%S")
        return pc.if_else(pa.array(unknown), "Unknown", strs)

    g = text(gpus)
    one = text(np.maximum(gpus, 1))
    cpu = text(4 * np.maximum(gpus, 1))
    mem = text(16 * np.maximum(gpus, 1))
    node = text(nodes)
    gres = pc.if_else(
        pa.array(gpus > 0),
        pc.binary_join_element_wise(",gres/gpu:", text(gtype), "=", g, ",gres/gpu=", g, ""),
        "",
    )
    alloc = pc.binary_join_element_wise(
        "billing=", one, ",cpu=", cpu, gres, ",mem=", mem, "G,node=", node, ""
    )
    alloc = pc.if_else(pa.array(pending), "", alloc)
    req = pc.binary_join_element_wise(
        "billing=", one, ",cpu=", cpu, ",gres/gpu=", g, ",mem=", mem, "G,node=", node, ""
    )
    idx = np.arange(n)
    limit = pc.if_else(pa.array(idx % 97 == 0), "UNLIMITED", text(limit_min))
    code = np.where(state == "FAILED", "1:0", np.where(state == "OUT_OF_MEMORY", "0:9", "0:0"))
    columns = [
        text(1000 + idx),
        text(names),
        text(users),
        text(np.char.add("acct", (idx % 13).astype(str))),
        "gpu",
        text(state),
        text(code),
        stamp(submit, np.zeros(n, dtype=bool)),
        stamp(start, pending),
        stamp(end, pending | running),
        text(np.where(pending, 0, run)),
        limit,
        alloc,
        node,
        pc.binary_join_element_wise("n[1-", node, "]", ""),
        "10000",
        "normal",
        req,
    ]
    lines = pc.binary_join_element_wise(*columns, "|")
    with open(path, "w") as fh:
        fh.write(HEADER + "\n")
        for i in range(0, n, 100_000):
            fh.write("\n".join(lines.slice(i, 100_000).to_pylist()) + "\n")


def median_rate(fn: Callable[[], None], n: int, runs: int = 3) -> tuple[float, list[float], float]:
    """Median rows/s over `runs` wall-clock timings, and rows per CPU-second (this process and its
    children), which stays meaningful on a busy machine where wall time is shared with others."""
    times = []
    cpu = []
    for _ in range(runs):
        r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(
            (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            + (c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
        )
    return n / statistics.median(times), times, n / statistics.median(cpu)


def _runs(times: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    n = args.rows
    with tempfile.TemporaryDirectory(prefix="headway-bench-") as d:
        path = Path(d) / "sacct.txt"
        t = time.perf_counter()
        generate(path, n)
        gen_s = time.perf_counter() - t
        size_mb = path.stat().st_size / 1e6
        print(f"generated {n:,} sacct rows ({size_mb:.0f} MB) in {gen_s:.1f} s")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

        def reader_only() -> None:
            res = READER.read(path, ReadOptions(tz="UTC"))
            assert res.table.num_rows == n, (res.table.num_rows, res.bad_row_count)

        reader_rate, reader_times, reader_cpu_rate = median_rate(reader_only, n)
        print(f"reader alone:   {reader_rate:>12,.0f} rows/s  (runs: {_runs(reader_times)} s)")

        headway = str(Path(sys.executable).with_name("headway"))

        def end_to_end() -> None:
            db = Path(d) / "jobs.duckdb"
            db.unlink(missing_ok=True)
            subprocess.run(
                [headway, "ingest", str(path), "--format", "sacct", "--tz", "UTC", "--db", str(db), "--json"],
                check=True,
                stdout=subprocess.DEVNULL,
            )

        e2e_rate, e2e_times, e2e_cpu_rate = median_rate(end_to_end, n)
        print(f"headway ingest: {e2e_rate:>12,.0f} rows/s  (runs: {_runs(e2e_times)} s)")
        target = 200_000
        print(f"target >= {target:,} rows/s end to end: {'met' if e2e_rate >= target else 'NOT met'}")
        print(
            json.dumps(
                {
                    "bench": "ingest_sacct",
                    "rows": n,
                    "file_mb": round(size_mb, 1),
                    "reader_rows_per_s": round(reader_rate),
                    "ingest_rows_per_s": round(e2e_rate),
                    "reader_rows_per_cpu_s": round(reader_cpu_rate),
                    "ingest_rows_per_cpu_s": round(e2e_cpu_rate),
                    "load_avg_1m": round(os.getloadavg()[0], 2),
                    "cpus": os.cpu_count(),
                    "reader_runs_s": [round(x, 3) for x in reader_times],
                    "ingest_runs_s": [round(x, 3) for x in e2e_times],
                    "target_rows_per_s": target,
                }
            )
        )


if __name__ == "__main__":
    main()
