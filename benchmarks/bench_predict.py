"""Predictor speed: features + training on a generated 1M-job history (target <= 60 s), and predicting
10k pending jobs (target <= 100 ms); also the features of the bundled Philly sample and of a 200k-job
`headway synth` trace, and one new job's prediction (the simulator's arrival).
Run: .venv/bin/python benchmarks/bench_predict.py [--jobs N]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from headway.predict.api import SubmittedJob
from headway.predict.features import FeatureFrame, build_features
from headway.predict.model import Predictor
from headway.predict.online import OnlinePredictor
from headway.predict.synthetic import make_history


def _median_s(fn: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def other_tables() -> dict[str, float]:
    """build_features on the bundled Philly sample and on a 200k-job synthetic trace (medians of 3)."""
    from headway.data import sample_path
    from headway.sim.synth import generate
    from headway.traces.base import ReadOptions
    from headway.traces.registry import get_reader

    philly = get_reader("philly").read(sample_path("philly_jobs.json.gz"), ReadOptions()).table
    synth = generate(200_000, 1)
    return {
        "features_philly_sample_s_median": _median_s(lambda: build_features(philly)),
        "features_synth_200k_s_median": _median_s(lambda: build_features(synth)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of features + training (median reported)")
    args = ap.parse_args()

    t = time.perf_counter()
    table = make_history(args.jobs, seed=1)
    print(f"generated {args.jobs:,} jobs in {time.perf_counter() - t:.1f}s (not counted)")

    feat_s, train_s, cpu_s = [], [], []
    model = None
    frame = None
    for _ in range(args.repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        frame = build_features(table)
        t1 = time.perf_counter()
        model = Predictor.fit(frame)
        t2 = time.perf_counter()
        cpu_s.append(time.process_time() - c0)
        feat_s.append(t1 - t0)
        train_s.append(t2 - t1)
        print(f"features {t1 - t0:.1f}s + training {t2 - t1:.1f}s = {t2 - t0:.1f}s ({model.meta['models']})")
    assert model is not None and frame is not None
    total = [a + b for a, b in zip(feat_s, train_s, strict=True)]

    # 10k pending jobs: (a) the models on prepared feature rows; (b) the online path with new jobs
    # (feature rows from the rolling state, then the models); (c) the same jobs asked again (cached).
    rng = np.random.default_rng(0)
    idx = rng.choice(len(frame), args.pending, replace=False)
    sub = frame.take(idx)
    Xd = model.design(sub.X, sub.cats)
    model_ms, model_cpu_ms = [], []
    for _ in range(7):
        c = time.process_time()
        t = time.perf_counter()
        model.predict_design(Xd, sub.time_limit)
        model_ms.append((time.perf_counter() - t) * 1000)
        model_cpu_ms.append((time.process_time() - c) * 1000)

    online = OnlinePredictor(model)
    recent = frame.take(np.arange(max(0, len(frame) - 100_000), len(frame)))
    from headway.predict.api import EndedJob

    for k in np.flatnonzero(recent.ended).tolist():
        j = SubmittedJob(
            recent.job_id[k],
            recent.user[k],
            recent.cats["group"][k],
            recent.name[k],
            None,
            None,
            float(recent.submit[k]),
            float(recent.gpus[k]),
            1,
            None,
        )
        online.observe_end(EndedJob(j, float(recent.start[k]), float(recent.end[k]), recent.state[k]))
    now = float(np.nanmax(recent.end)) + 1.0
    online.predict([], now)  # fold the reported ends into the rolling state first (not timed)
    # (d) a queue of 10k new jobs from 300 users (the usual shape of a busy queue: many jobs per user)
    users = rng.choice(np.unique(frame.user.astype(str)), 300, replace=False)
    few = frame.take(rng.choice(np.flatnonzero(np.isin(frame.user.astype(str), users)), args.pending))

    def batch(src: FeatureFrame, tag: str) -> list[SubmittedJob]:
        return [
            SubmittedJob(
                f"{tag}-{i}",
                src.user[i],
                src.cats["group"][i],
                src.name[i],
                src.cats["partition"][i],
                src.cats["priority_class"][i],
                now,
                float(src.gpus[i]),
                1,
                None if np.isnan(src.time_limit[i]) else float(src.time_limit[i]),
            )
            for i in range(len(src))
        ]

    # (e) one new job at a time, as the simulator asks at each arrival
    one_us = []
    for k, j in enumerate(batch(sub.take(np.arange(min(2000, len(sub)))), "one")):
        t = time.perf_counter()
        online.predict([j], now + k)
        one_us.append((time.perf_counter() - t) * 1e6)
    now += len(one_us)

    online_ms, online_cpu_ms, cached_ms, few_ms = [], [], [], []
    for rep in range(7):
        few_jobs = batch(few, f"f{rep}")
        t = time.perf_counter()
        online.predict(few_jobs, now)
        few_ms.append((time.perf_counter() - t) * 1000)
        jobs = batch(sub, f"p{rep}")
        c = time.process_time()
        t = time.perf_counter()
        online.predict(jobs, now)
        online_ms.append((time.perf_counter() - t) * 1000)
        online_cpu_ms.append((time.process_time() - c) * 1000)
        t = time.perf_counter()
        online.predict(jobs, now)
        cached_ms.append((time.perf_counter() - t) * 1000)

    res = {
        "jobs": args.jobs,
        "features_s_median": statistics.median(feat_s),
        "training_s_median": statistics.median(train_s),
        "features_plus_training_s_median": statistics.median(total),
        "features_plus_training_cpu_s_median": statistics.median(cpu_s),
        "load_average_1m": os.getloadavg()[0],
        "target_features_plus_training_s": 60,
        "pending": args.pending,
        "predict_model_ms_median": statistics.median(model_ms),
        "predict_model_cpu_ms_median": statistics.median(model_cpu_ms),
        "trees": {k: b.current_iteration() for k, b in model.boosters.items()},
        "predict_online_new_jobs_ms_median": statistics.median(online_ms),
        "predict_online_new_jobs_cpu_ms_median": statistics.median(online_cpu_ms),
        "predict_online_new_jobs_ms_min": min(online_ms),
        "predict_online_cached_ms_median": statistics.median(cached_ms),
        "predict_online_new_jobs_300_users_ms_median": statistics.median(few_ms),
        "target_predict_ms": 100,
        "predict_online_one_new_job_us_median": statistics.median(one_us),
        **other_tables(),
    }
    print(
        f"features + training: median {res['features_plus_training_s_median']:.1f}s wall, "
        f"{res['features_plus_training_cpu_s_median']:.1f}s CPU (target <= 60s; "
        f"load average {res['load_average_1m']:.1f} on {os.cpu_count()} cores)"
    )
    print(
        f"predict {args.pending:,} pending: models {res['predict_model_ms_median']:.0f} ms "
        f"({res['predict_model_cpu_ms_median']:.0f} ms CPU), online with new "
        f"feature rows {res['predict_online_new_jobs_ms_median']:.0f} ms "
        f"({res['predict_online_new_jobs_cpu_ms_median']:.0f} ms CPU, best "
        f"{res['predict_online_new_jobs_ms_min']:.0f} ms), online with new jobs of 300 users "
        f"{res['predict_online_new_jobs_300_users_ms_median']:.0f} ms, online cached "
        f"{res['predict_online_cached_ms_median']:.0f} ms (target <= 100 ms); one new job "
        f"{res['predict_online_one_new_job_us_median']:.0f} us"
    )
    print(
        f"features: Philly sample {res['features_philly_sample_s_median']:.2f}s, 200k-job synth trace "
        f"{res['features_synth_200k_s_median']:.2f}s (medians of 3)"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
