"""Preemption and the fail-fast lane, replayed from the `headway simulate` command (issue 27).

Part 1, per trace (the bundled Philly sample and three synthetic traces from `headway synth`, Philly's
profile: the alibaba profile has no gangs of 16-64 GPUs to make urgent), at its
natural arrivals and at load 1.0 on 64 x 8 GPUs with `--class-mix default` (seed 0): impact,
multifactor-preempt, impact `--no-preemption`, and impact placed first-fit as multifactor-preempt is (the
placement alone moves urgent waits), each in one run. Reports urgent time to start (mean,
p95), the other jobs' mean time to success, GPU-hours lost to preemption, and the ratios the issue
checks: urgent p95 / impact-without-preemption's (goal <= 0.2), urgent p95 vs multifactor-preempt's
(goal: below), others' TTS vs without preemption (goal: <= 5% worse), lost GPU-hours vs
multifactor-preempt's (goal: below).

Part 2, the fail-fast lane: impact with and without `--fail-fast` on the Philly sample, a synthetic trace
of each profile (the alibaba one has early failures), at natural load and 1.0, and, where ../shared/traces
holds it, Alibaba's pod list (load 1.0 on 64 x 8): time to the first failure signal (submit to failure)
and mean time to success.

    .venv/bin/python benchmarks/bench_preemption.py [--jobs 4000] [--json] [--part 1|2|all]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HEADWAY = str(Path(sys.executable).with_name("headway"))
ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT / "src" / "headway" / "data" / "philly_jobs.json.gz"
ALIBABA = ROOT.parent / "shared" / "traces" / "alibaba-fgd-2023" / "openb_pod_list_default.csv"
LOADS: tuple[str | None, ...] = (None, "1.0")


def simulate(trace: Path, policies: str, load: str | None, *extra: str) -> dict[str, Any]:
    cmd = [HEADWAY, "simulate", str(trace), "--policy", policies, "--json", "--workers", "1", *extra]
    if load is not None:
        cmd += ["--load", load]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    doc: dict[str, Any] = json.loads(out.stdout)
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def synth(out: Path, jobs: int, seed: int, profile: str) -> Path:
    cmd = [
        HEADWAY,
        "synth",
        "--jobs",
        str(jobs),
        "--out",
        str(out),
        "--seed",
        str(seed),
        "--profile",
        profile,
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if b == 0:
        return 0.0 if a == 0 else None
    return a / b


def preemption_case(trace: Path, load: str | None) -> dict[str, Any]:
    mix = ("--class-mix", "default", "--seed", "0")
    with ThreadPoolExecutor(2) as ex:
        both = ex.submit(simulate, trace, "impact,multifactor-preempt", load, *mix)
        off = ex.submit(simulate, trace, "impact", load, *mix, "--no-preemption")
        ff = ex.submit(simulate, trace, "impact", load, *mix, "--placement", "first-fit")
        on, no, first = both.result(), off.result(), ff.result()
    imp, mfp, nop = on["policies"]["impact"], on["policies"]["multifactor-preempt"], no["policies"]["impact"]
    keys = (
        "urgent_queue_delay_mean",
        "urgent_queue_delay_p95",
        "others_time_to_success_mean",
        "time_to_success_mean",
        "preempted_gpu_hours",
        "preemptions",
        "urgent_fragmented_arrivals",
        "jobs_urgent",
        "load",
    )
    row = {name: {k: m.get(k) for k in keys} for name, m in (("impact", imp), ("multifactor-preempt", mfp))}
    row["impact --no-preemption"] = {k: nop.get(k) for k in keys}
    # multifactor-preempt places first-fit (every peer's default): impact placed the same way, beside it
    row["impact --placement first-fit"] = {k: first["policies"]["impact"].get(k) for k in keys}
    u95, u95_no, u95_mf = (
        imp["urgent_queue_delay_p95"],
        nop["urgent_queue_delay_p95"],
        mfp["urgent_queue_delay_p95"],
    )
    checks = {
        "urgent_p95_vs_no_preemption": _ratio(u95, u95_no),
        "urgent_p95_below_multifactor_preempt": None if u95 is None or u95_mf is None else u95 <= u95_mf,
        "others_tts_vs_no_preemption": _ratio(
            imp["others_time_to_success_mean"], nop["others_time_to_success_mean"]
        ),
        "lost_gpu_h_vs_multifactor_preempt": _ratio(imp["preempted_gpu_hours"], mfp["preempted_gpu_hours"]),
    }
    return {"trace": trace.name, "load": load or "natural", "policies": row, "checks": checks}


def fail_fast_case(trace: Path, load: str | None, *extra: str) -> dict[str, Any]:
    with ThreadPoolExecutor(2) as ex:
        a = ex.submit(simulate, trace, "impact", load, *extra)
        b = ex.submit(simulate, trace, "impact", load, *extra, "--fail-fast")
        off, on = a.result()["policies"]["impact"], b.result()["policies"]["impact"]
    keys = (
        "failure_signal_delay_mean",
        "failure_signal_delay_p50",
        "time_to_success_mean",
        "probe_gpu_hours",
    )
    return {
        "trace": trace.name,
        "load": load or "natural",
        "without": {k: off.get(k) for k in keys},
        "with": {k: on.get(k) for k in keys},
        "failure_signal_ratio": _ratio(on["failure_signal_delay_mean"], off["failure_signal_delay_mean"]),
        "tts_ratio": _ratio(on["time_to_success_mean"], off["time_to_success_mean"]),
    }


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4000, help="jobs per synthetic trace")
    ap.add_argument("--part", choices=("1", "2", "all"), default="all")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0, cpu0 = time.perf_counter(), os.times()
    doc: dict[str, Any] = {"load_avg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        synths = [synth(tmp / f"synth-philly-{s}.parquet", args.jobs, s, "philly") for s in (1, 2, 3)]
        early = synth(tmp / "synth-alibaba-4.parquet", args.jobs, 4, "alibaba")
        if args.part in ("1", "all"):
            doc["preemption"] = [preemption_case(t, ld) for t in (PHILLY, *synths) for ld in LOADS]
        if args.part in ("2", "all"):
            cases = [fail_fast_case(t, ld) for t in (PHILLY, synths[0], early) for ld in LOADS]
            if ALIBABA.exists():
                cases.append(fail_fast_case(ALIBABA, "1.0"))
            doc["fail_fast"] = cases
    cpu1 = os.times()
    doc["wall_s"] = time.perf_counter() - t0
    doc["children_cpu_s"] = (cpu1.children_user + cpu1.children_system) - (
        cpu0.children_user + cpu0.children_system
    )
    doc["load_avg_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    for c in doc.get("preemption", []):
        print(f"\n{c['trace']} @ {c['load']}")
        for name, m in c["policies"].items():
            print(f"  {name:24s} " + " ".join(f"{k}={_fmt(v)}" for k, v in m.items()))
        print("  checks: " + ", ".join(f"{k}={_fmt(v)}" for k, v in c["checks"].items()))
    for c in doc.get("fail_fast", []):
        print(f"\nfail-fast {c['trace']} @ {c['load']}: without {c['without']} with {c['with']}")
        print(f"  failure signal ratio {_fmt(c['failure_signal_ratio'])}, TTS ratio {_fmt(c['tts_ratio'])}")
    cpu, load = doc["children_cpu_s"], doc["load_avg_start"]
    print(f"\nwall {doc['wall_s']:.0f} s, children CPU {cpu:.0f} s, load {load:.1f}")


if __name__ == "__main__":
    main()
