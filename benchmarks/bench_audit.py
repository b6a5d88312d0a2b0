"""Audit of a generated 10M-job store: wall time and peak RSS of `headway audit --json` and `--html`.

Generates the jobs directly in DuckDB SQL (skewed users and job names, 40% waste-class states, heavy-tailed
runtimes and waits, time limits on most jobs) into a temporary store, then runs each audit in its own
subprocess and reads that process's peak RSS from getrusage. Target (issue 2): <= 30 s and <= 4 GB RSS.

    .venv/bin/python benchmarks/bench_audit.py [--jobs 10000000] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from headway.store import JobStore

# Runs `argv` and prints its wall seconds and the peak RSS (KiB on Linux) of that child alone.
_MEASURE = """
import json, os, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
load = os.getloadavg()[0]
print(json.dumps({"rc": rc, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "max_rss_kib": ru.ru_maxrss,
                  "load": load}))
"""

# One row per job; r1..r6 are independent uniforms. States: 52% success, 40% waste, the rest other.
GENERATE_SQL = """
INSERT INTO jobs
SELECT
    CAST(i AS VARCHAR) AS job_id,
    'u' || CAST(floor(pow(r1, 3) * 3000) AS BIGINT) AS "user",
    'g' || (CAST(floor(pow(r1, 3) * 3000) AS BIGINT) % 60) AS "group",
    -- each user reruns a skewed handful of their own job names (as people do); 5% have no name
    CASE WHEN r6 < 0.05 THEN NULL
         ELSE 'job-' || CAST(floor(pow(r1, 3) * 3000) AS BIGINT) || '-'
              || CAST(floor(pow(r2, 2) * 100) AS BIGINT) END AS name,
    ['gpu', 'gpu-large', 'debug', 'preempt'][1 + CAST(floor(r3 * 4) AS INTEGER)] AS partition,
    NULL AS priority_class,
    submit AS submit_time,
    CASE WHEN state = 'PENDING' THEN NULL ELSE submit + to_seconds(CAST(wait_s AS BIGINT)) END AS start_time,
    CASE WHEN state IN ('PENDING', 'RUNNING') THEN NULL
         ELSE submit + to_seconds(CAST(wait_s + run_s AS BIGINT)) END AS end_time,
    gpus,
    CAST(greatest(1, gpus // 8) AS INTEGER) AS nodes,
    CAST(gpus * 8 AS BIGINT) AS cpus,
    NULL AS mem_mb,
    time_limit,
    state,
    CASE WHEN state = 'COMPLETED' THEN 0 WHEN state = 'FAILED' THEN 1 ELSE NULL END AS exit_code,
    'bench' AS source,
    NULL AS preemptible,
    NULL AS checkpoint_every
FROM (
    SELECT *,
        CASE WHEN state = 'TIMEOUT' THEN coalesce(time_limit, 86400)
             WHEN time_limit IS NOT NULL THEN least(raw_run, time_limit)
             ELSE raw_run END AS run_s
    FROM (
        SELECT i, r1, r2, r3, r6,
            TIMESTAMPTZ '2026-01-01 00:00:00+00' + to_seconds(CAST(r4 * 90 * 86400 AS BIGINT)) AS submit,
            -- heavy tails: a Pareto-like wait, a log-normal-like runtime (sum of uniforms as a normal)
            60 * (pow(1 - random(), -1.2) - 1) AS wait_s,
            exp(7.5 + 1.8 * (random() + random() + random() + random() - 2)) AS raw_run,
            [1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 32, 64][1 + CAST(floor(random() * 14) AS INTEGER)] AS gpus,
            CASE WHEN r6 < 0.7
                 THEN [3600, 14400, 86400, 172800, 259200][1 + CAST(floor(random() * 5) AS INTEGER)]
                 ELSE NULL END AS time_limit,
            CASE WHEN r5 < 0.52 THEN 'COMPLETED' WHEN r5 < 0.84 THEN 'FAILED' WHEN r5 < 0.88 THEN 'TIMEOUT'
                 WHEN r5 < 0.90 THEN 'OUT_OF_MEMORY' WHEN r5 < 0.92 THEN 'NODE_FAIL'
                 WHEN r5 < 0.97 THEN 'CANCELLED' WHEN r5 < 0.985 THEN 'PREEMPTED'
                 WHEN r5 < 0.995 THEN 'RUNNING' ELSE 'PENDING' END AS state
        FROM (SELECT range AS i, random() AS r1, random() AS r2, random() AS r3, random() AS r4,
                     random() AS r5, random() AS r6 FROM range($n))
    )
)
"""


def generate(db: Path, n: int) -> float:
    t = time.perf_counter()
    with JobStore(db) as store:
        store.con.execute("SET memory_limit = '3GB'")
        store.con.execute("SELECT setseed(0.42)")
        store.con.execute(GENERATE_SQL, {"n": n})
        store.con.execute("CHECKPOINT")
        assert store.count() == n
    return time.perf_counter() - t


def measure(argv: list[str]) -> dict[str, float]:
    res = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, check=True)
    m = json.loads(res.stdout.strip().splitlines()[-1])
    if m["rc"] != 0:
        raise SystemExit(f"audit failed: {res.stderr[-2000:]}")
    return {
        "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"],
        "rss_gb": m["max_rss_kib"] / 1024 / 1024,
        "load": m["load"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=1, help="runs of each audit; the median is reported")
    args = ap.parse_args()
    headway = str(Path(sys.executable).with_name("headway"))
    tmp = Path(tempfile.mkdtemp(prefix="headway-bench-audit-"))
    try:
        db = tmp / "jobs.duckdb"
        gen_s = generate(db, args.jobs)
        size_gb = db.stat().st_size / 1e9
        print(f"generated {args.jobs:,} jobs in {gen_s:.1f} s ({size_gb:.2f} GB store)")
        results: dict[str, object] = {
            "bench": "audit",
            "jobs": args.jobs,
            "generate_s": gen_s,
            "db_gb": size_gb,
        }
        for label, extra in (("json", ["--json"]), ("html", ["--html", str(tmp / "report.html")])):
            runs = [measure([headway, "audit", "--db", str(db), *extra]) for _ in range(args.runs)]
            wall = statistics.median(r["wall_s"] for r in runs)
            rss = max(r["rss_gb"] for r in runs)
            cpu = statistics.median(r["cpu_s"] for r in runs)
            load = max(r["load"] for r in runs)
            results[f"{label}_wall_s"] = wall
            results[f"{label}_cpu_s"] = cpu
            results[f"{label}_peak_rss_gb"] = rss
            results[f"{label}_load_avg"] = load
            # On a busy machine wall time measures the neighbours; CPU seconds say what the audit costs.
            print(
                f"audit --{label}: {wall:.1f} s wall (median of {args.runs}), {cpu:.1f} s CPU, "
                f"peak RSS {rss:.2f} GB, load average {load:.1f} on {os.cpu_count()} CPUs"
            )
        html = tmp / "report.html"
        results["html_mb"] = html.stat().st_size / 1e6 if html.exists() else None
        ok = all(
            float(results[f"{k}_wall_s"]) <= 30 and float(results[f"{k}_peak_rss_gb"]) <= 4  # type: ignore[arg-type]
            for k in ("json", "html")
        )
        results["target"] = "<= 30 s and <= 4 GB RSS"
        results["meets_target"] = ok
        results["cpus"] = os.cpu_count()
        print(json.dumps(results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
