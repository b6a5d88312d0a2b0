"""Simulator throughput: a synthetic trace on a large cluster under one policy (default impact).

    .venv/bin/python benchmarks/bench_sim.py [--jobs 1000000] [--nodes 1024] [--policy impact]

Prints jobs/s, events, passes and peak memory, then one JSON line. The predictor is a causal
rolling mean per user (O(1) per call) unless --predictor online asks for the project's predictor.
Goal (issue 24): 1M jobs on 1,024 x 8 GPUs under impact in <= 60 s on one core, in plain Python.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import psutil

from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.run import default_predictor_factory, run_simulation


@dataclass
class UserMeanPredictor:
    """Per-user rolling success rate and mean runtimes from ended jobs only (causal, O(1) per job).

    One list per user ([ended, completed, completed seconds, failed seconds]) and the scalar path
    (`predict_one`) for the usual single arrival: the stand-in should cost the simulator as little as a
    cache lookup."""

    stats: dict[str, list[float]] = field(default_factory=dict)

    def _one(self, user: str) -> tuple[float, float, float]:
        st = self.stats.get(user)
        if st is None:
            return 0.5, 3600.0, 600.0
        n, ok, rt_ok, rt_bad = st
        return (ok + 1) / (n + 2), rt_ok / ok if ok else 3600.0, rt_bad / (n - ok) if n > ok else 600.0

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        rows = np.array([self._one(j.user or "") for j in jobs], dtype=np.float64).reshape(-1, 3)
        p, r, f = rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy()
        return Predictions(p, r, 2 * r, f)

    def predict_one(self, job: SubmittedJob, now: float) -> tuple[float, float, float, float]:
        """`predict([job], now)`'s four numbers as floats (api.ScalarPredictor)."""
        p, r, f = self._one(job.user or "")
        return p, r, 2 * r, f

    def observe_end(self, ended: EndedJob) -> None:
        st = self.stats.setdefault(ended.job.user or "", [0.0, 0.0, 0.0, 0.0])
        st[0] += 1
        if ended.state == "COMPLETED":
            st[1] += 1
            st[2] += ended.runtime
        else:
            st[3] += ended.runtime

    def maybe_retrain(self, now: float) -> bool:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--policy", default="impact")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--predictor", choices=("mean", "online"), default="mean")
    ap.add_argument("--profile", action="store_true", help="run under cProfile and print the top entries")
    a = ap.parse_args()

    from headway.sim.synth import generate

    t0 = time.perf_counter()
    jobs = generate(a.jobs, a.seed)
    t_gen = time.perf_counter() - t0
    spec = ClusterSpec.from_flags(a.nodes, a.gpus_per_node, 8)
    factory = UserMeanPredictor if a.predictor == "mean" else default_predictor_factory
    opts = EngineOptions()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t1 = time.perf_counter()
    c1 = time.process_time()
    if a.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        res = prof.runcall(
            run_simulation,
            jobs,
            spec,
            policy=a.policy,
            load=a.load,
            predictor_factory=factory,
            engine_options=opts,
        )
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        res = run_simulation(
            jobs,
            spec,
            policy=a.policy,
            load=a.load,
            seed=a.seed,
            predictor_factory=factory,
            engine_options=opts,
        )
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1
    rss = proc.memory_info().rss
    n = res.jobs.num_rows
    out = {
        "bench": "sim",
        "jobs": n,
        "policy": a.policy,
        "placement": res.placement,
        "cluster_gpus": res.capacity_gpus,
        "load": res.load,
        "wall_s": round(wall, 2),
        "engine_s": round(res.wall_seconds, 2),
        "cpu_s": round(cpu, 2),
        "jobs_per_s": round(n / wall),
        "jobs_per_cpu_s": round(n / cpu),
        "load_avg_1m": round(psutil.getloadavg()[0], 2),
        "events": res.events,
        "passes": res.passes,
        "generate_s": round(t_gen, 2),
        "rss_mb": round(rss / 2**20),
        "rss_growth_mb": round((rss - rss0) / 2**20),
        # The process's peak (Linux reports KiB).
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "predictor": a.predictor,
    }
    gpus = int(res.capacity_gpus)
    print(f"{n:,} jobs under {a.policy} ({res.placement}) on {gpus:,} GPUs at load {res.load:.2f}")
    print(f"  {wall:.1f} s wall ({cpu:.1f} s CPU), {n / wall:,.0f} jobs/s ({n / cpu:,.0f} per CPU-second)")
    print(f"  {res.events:,} events, {res.passes:,} scheduling passes; machine load {out['load_avg_1m']}")
    rss_line = f"{out['rss_mb']} MB RSS ({out['rss_growth_mb']} MB during the run)"
    print(f"  memory: {rss_line}, peak {out['peak_rss_mb']} MB")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
