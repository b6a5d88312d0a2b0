"""Speed of the synthetic trace generator: jobs per second for 100k and 1M jobs (median of 3 runs).

Run: .venv/bin/python benchmarks/bench_synth.py
"""

from __future__ import annotations

import json
import resource
import statistics
import time

from headway.sim.synth import generate


def main() -> None:
    results: dict[str, float] = {}
    for n in (100_000, 1_000_000):
        times = []
        for seed in range(3):
            t0 = time.perf_counter()
            table = generate(n, seed)
            times.append(time.perf_counter() - t0)
            assert table.num_rows == n
        med = statistics.median(times)
        results[f"seconds_{n}"] = med
        results[f"jobs_per_s_{n}"] = n / med
        print(f"{n:>9,} jobs: median {med:.2f} s over 3 runs ({n / med:,.0f} jobs/s)")
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"peak resident memory: {results['peak_rss_mib']:.0f} MiB")
    print(json.dumps({"benchmark": "synth", **results}))


if __name__ == "__main__":
    main()
