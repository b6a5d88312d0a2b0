"""Simulator throughput with the predictor users get: a synthetic trace under one policy (default impact).

    .venv/bin/python benchmarks/bench_sim.py [--jobs 100000] [--nodes 64] [--policy impact]
        [--predictor online|mean] [--before DIR] [--profile]

`--predictor online` (the default) is the project's online predictor, retrained on its schedule as the
virtual clock advances: what `headway simulate` uses. `--predictor mean` swaps in a stand-in (a causal
rolling mean per user, O(1) per call) that measures the engine and policy alone; its figures are
labelled as the stand-in's. Prints wall and CPU time, jobs per CPU-second, events, passes, the
predictor's fits and the seconds spent in them, peak memory, then one JSON line.

`--before DIR` first runs the same benchmark on the source tree in DIR (a checkout of an earlier
commit: `git worktree add DIR REV`), in a subprocess, and then this one, and prints both and their
ratio: a before and after measured in one run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import psutil

from headway.predict.api import EndedJob, Predictions, SubmittedJob
from headway.sim.cluster import ClusterSpec
from headway.sim.engine import EngineOptions
from headway.sim.metrics import compute
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


class _FitClock:
    """Counts the predictor's fits and the CPU seconds they take (wrapping `Predictor.fit`)."""

    def __init__(self) -> None:
        from headway.predict import model

        self.fits, self.cpu_s = 0, 0.0
        inner = model.Predictor.fit.__func__  # type: ignore[attr-defined]

        def fit(cls: type, *args: object, **kw: object) -> object:
            c = time.process_time()
            try:
                return inner(cls, *args, **kw)
            finally:
                self.fits += 1
                self.cpu_s += time.process_time() - c

        model.Predictor.fit = classmethod(fit)  # type: ignore[method-assign, assignment]


def measure(a: argparse.Namespace) -> dict[str, object]:
    from headway.sim.synth import generate

    t0 = time.perf_counter()
    jobs = generate(a.jobs, a.seed)
    t_gen = time.perf_counter() - t0
    spec = ClusterSpec.from_flags(a.nodes, a.gpus_per_node, 8)
    factory = UserMeanPredictor if a.predictor == "mean" else default_predictor_factory
    fits = _FitClock()
    opts = EngineOptions()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t1 = time.perf_counter()
    c1 = time.process_time()
    kw = dict(policy=a.policy, load=a.load, seed=a.seed, predictor_factory=factory, engine_options=opts)
    if a.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        res = prof.runcall(run_simulation, jobs, spec, **kw)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    else:
        res = run_simulation(jobs, spec, **kw)
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1
    rss = proc.memory_info().rss
    n = res.jobs.num_rows
    return {
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
        "fits": fits.fits,
        "fit_cpu_s": round(fits.cpu_s, 2),
        "generate_s": round(t_gen, 2),
        "rss_mb": round(rss / 2**20),
        "rss_growth_mb": round((rss - rss0) / 2**20),
        # The process's peak (Linux reports KiB).
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "predictor": a.predictor,
        "time_to_success_mean": compute(res)["time_to_success_mean"],
    }


def report(out: dict[str, object], label: str) -> None:
    who = "the project's online predictor" if out["predictor"] == "online" else "the STAND-IN predictor"
    print(
        f"{label}: {out['jobs']:,} jobs under {out['policy']} ({out['placement']}) on "
        f"{int(out['cluster_gpus']):,} GPUs at load {out['load']:.2f}, with {who}"
    )  # type: ignore[str-format]
    print(f"  {out['wall_s']} s wall ({out['cpu_s']} s CPU), {out['jobs_per_cpu_s']:,} jobs per CPU-second")
    print(
        f"  {out['events']:,} events, {out['passes']:,} scheduling passes; machine load {out['load_avg_1m']}"
    )
    print(f"  predictor fits: {out['fits']} ({out['fit_cpu_s']} s CPU)")
    rss = f"{out['rss_mb']} MB RSS ({out['rss_growth_mb']} MB during the run)"
    print(f"  memory: {rss}, peak {out['peak_rss_mb']} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--policy", default="impact")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--predictor", choices=("online", "mean"), default="online")
    ap.add_argument(
        "--before", metavar="DIR", help="also run the source tree in DIR first, for a before/after"
    )
    ap.add_argument("--profile", action="store_true", help="run under cProfile and print the top entries")
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    before = None
    if a.before:
        argv = [x for i, x in enumerate(sys.argv[1:]) if x != "--before" and sys.argv[i] != "--before"]
        env = {**os.environ, "PYTHONPATH": str(os.path.join(a.before, "src"))}
        done = subprocess.run(
            [sys.executable, __file__, *argv, "--json-only"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        before = json.loads(done.stdout.strip().splitlines()[-1])
    out = measure(a)
    if a.json_only:
        print(json.dumps(out))
        return
    if before is not None:
        report(before, f"before ({a.before})")
    report(out, "this tree")
    if before is not None:
        print(f"  CPU time, this tree / before: {out['cpu_s'] / before['cpu_s']:.2f}x")  # type: ignore[operator]
        out = {**out, "before": before}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
