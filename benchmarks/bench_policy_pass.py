"""One ranking + placement pass (policy.decide) over 10k pending jobs on 1,250 x 8 GPUs.

    .venv/bin/python benchmarks/bench_policy_pass.py [--pending 10000] [--nodes 1250] [--repeat 200]

The cluster is ~90% busy with running jobs (so the head needs a reservation and backfill is tried).
Prints p50/p99 milliseconds per pass (wall, and CPU time of this process, which a loaded machine
inflates less) for each policy and the memory one pass allocates, then one JSON
line. Target (issue 4): p99 <= 50 ms for impact.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np
import psutil

from headway.policy import get_policy
from headway.policy.snapshot import FULL_SHARE, ClusterView, PendingJobs, RunningJobs, Snapshot


def build(pending: int, nodes: int, gpn: int, seed: int) -> Snapshot:
    rng = np.random.default_rng(seed)
    n_users = 200
    now = 30 * 86400.0
    gpus = rng.choice([1, 1, 1, 2, 4, 8, 16, 0.5], size=pending).astype(np.float64)
    max_nodes = np.maximum(1, np.ceil(gpus / gpn)).astype(np.int64)
    runtime = rng.lognormal(8, 1.5, pending)
    p = PendingJobs(
        key=np.arange(pending, dtype=np.int64),
        job_id=np.array([f"p{i}" for i in range(pending)], dtype=object),
        user=rng.integers(0, n_users, pending),
        klass=rng.integers(0, 2, pending),
        submit=now - rng.exponential(6 * 3600, pending),
        gpus=gpus,
        max_nodes=max_nodes,
        time_limit=np.where(rng.random(pending) < 0.5, runtime * 3, np.nan),
        p_success=rng.random(pending),
        runtime=runtime,
        runtime_p90=runtime * 2,
        time_to_failure=runtime / 4,
        attained=np.zeros(pending),
        last_stop=np.zeros(pending),
        fail_streak=rng.integers(0, 4, pending),
    )
    # Fill ~90% of GPUs with running jobs of 1..8 GPUs, node by node.
    share = np.full((nodes, gpn), FULL_SHARE, dtype=np.int64)
    owner = np.full((nodes, gpn), -1, dtype=np.int64)
    rows = []
    for nd in range(nodes):
        g = 0
        while g < gpn and rng.random() < 0.9:
            k = int(min(gpn - g, rng.choice([1, 2, 4, 8])))
            share[nd, g : g + k] = 0
            owner[nd, g : g + k] = len(rows)
            rows.append(k)
            g += k
    r_n = len(rows)
    rt = rng.lognormal(8, 1.5, r_n)
    running = RunningJobs(
        key=np.arange(pending, pending + r_n, dtype=np.int64),
        job_id=np.array([f"r{i}" for i in range(r_n)], dtype=object),
        user=rng.integers(0, n_users, r_n),
        klass=np.zeros(r_n, dtype=np.int64),
        gpus=np.array(rows, dtype=np.float64),
        start=now - rng.exponential(3600, r_n),
        time_limit=np.where(rng.random(r_n) < 0.5, rt * 3, np.nan),
        runtime=rt,
        runtime_p90=rt * 2,
        attained=np.zeros(r_n),
        preemptible=np.ones(r_n, dtype=bool),
    )
    free = (share == FULL_SHARE).sum(axis=1).astype(np.int64)
    view = ClusterView(
        share,
        free,
        owner,
        np.full(nodes, gpn, dtype=np.int64),
        np.arange(nodes, dtype=np.int64) // 8,
        (nodes + 7) // 8,
    )
    return Snapshot(
        now,
        1,
        p,
        running,
        view,
        [f"u{i}" for i in range(n_users)],
        ["normal", "high"],
        rng.exponential(1e5, n_users),
        np.full(n_users, 1.0 / n_users),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--policies", default="impact,multifactor,fifo,qssf,las")
    a = ap.parse_args()
    snap = build(a.pending, a.nodes, a.gpus_per_node, 0)
    free_gpus = int(snap.cluster.free.sum())
    results = {}
    for name in a.policies.split(","):
        pol = get_policy(name)
        pol.decide(snap)  # warm up
        times, cpu_times = [], []
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            dec = pol.decide(snap)
            times.append((time.perf_counter() - t0) * 1000)
            cpu_times.append((time.process_time() - c0) * 1000)
        tracemalloc.start()
        pol.decide(snap)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ms, cpu = np.array(times), np.array(cpu_times)
        results[name] = {
            "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 2),
            "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "max_ms": round(float(ms.max()), 2),
            "pass_alloc_mb": round(peak / 2**20, 2),
            "started": len(dec.start),
            "reservation": dec.reservation is not None,
        }
        r = results[name]
        print(
            f"{name:12s} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  max {r['max_ms']:7.2f} ms  "
            f"(CPU p50 {r['cpu_p50_ms']:.2f}, p99 {r['cpu_p99_ms']:.2f})  "
            f"alloc {r['pass_alloc_mb']:.1f} MB  started {r['started']}  reservation {r['reservation']}"
        )
    out = {
        "bench": "policy_pass",
        "pending": a.pending,
        "running": len(snap.running),
        "cluster_gpus": a.nodes * a.gpus_per_node,
        "free_gpus": free_gpus,
        "repeat": a.repeat,
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20),
        "load_avg_1m": round(psutil.getloadavg()[0], 2),
        "policies": results,
    }
    total = a.nodes * a.gpus_per_node
    print(f"{a.pending:,} pending, {len(snap.running):,} running, {free_gpus:,} of {total:,} GPUs free")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
