"""Wall time of headway's simulator beside the Helios artifact's, replaying the same trace.

    .venv/bin/python benchmarks/bench_vs_helios.py --helios ~/src/HeliosArtifact [--repeats 3] [--policy fifo]

The trace is the Philly sample bundled with headway (src/headway/data/philly_jobs.json.gz, 5,910 GPU
jobs), replayed on one cluster of 64 nodes x 8 GPUs (`--nodes`) at its own arrival times:

- headway: `headway simulate <sample> --policy fifo --nodes 64 --gpus-per-node 8 --json`;
- Helios (Hu et al., SC '21; github.com/S-Lab-System-Group/HeliosArtifact): the simulator of its
  `framework/QSSF Service/` (`simulator.py -e Philly -s fifo -p consolidate -j 1`) on one virtual
  cluster of the same 64 nodes, with its consolidate placer.

`--helios DIR` is the user's own checkout of the artifact (its root, or `framework/QSSF Service`
itself); nothing of it is copied here, and it is only read: its simulator runs as a subprocess of this
Python (it needs pandas, which headway's environment has) with every file it writes in a temporary
directory. Its input is written by `write_helios_input` below: `cluster_log.csv` (one row per GPU job:
job_id, user, vc, jobname, gpu_num, state, submit_time, duration) and `vc_dict_homo.pkl` (a pickled
dict: one VC, `philly`, of `--nodes` nodes). The jobs are those headway's Philly reader gives (the same
table `headway simulate` replays); the runtime is end - start in whole seconds, the job id stands in
for the job name (the sample has none), and submit times are moved, all by the same offset, so that
the first is 2017-10-01 00:00:00, where Helios's Philly loader starts (it keeps jobs from that day on
and counts time from the first submission, so the offset changes nothing it replays). The simulator is
run with TZ=UTC, as it reads the naive times in the local zone.

Three things the stock `simulator.py` cannot do on this trace are changed from outside, in the small
driver (`DRIVER`) that imports it; its scheduling and placement code runs untouched:
- its Philly loader keeps only jobs submitted in the 61 days of 2017-10-01..11-30; the sample spans 86
  days, so the driver widens that window (`HELIOS_WINDOW_END`) to keep all of them;
- after the replay it compares the logs of all four of its policies (`utils.cluster_analysis`), which
  fails when only one was run; the driver skips that comparison (the replay's own log is written);
- it builds its QSSF estimator for every Philly run, reading `./estimators/Philly_lgb.csv` (its
  estimates for the full Philly trace, not this sample); FIFO and SJF never consult it, so the driver
  runs in a temporary directory that holds a header-only stand-in, and Helios's time does not include
  reading the real one.

What is timed: the whole process, for both, from start to exit: interpreter and imports, reading the
trace (headway's Philly reader on the gzipped JSON; Helios's pandas on the CSV, written beforehand and
not timed), the replay and writing results (headway's JSON to a pipe; Helios's per-job log and
per-minute cluster sequence CSVs). The two alternate, `--repeats` times each (the order flips each
round), and the medians are compared: ratio = Helios / headway. Beside wall time, each process's CPU
time (user + system, with the children it waited for: Helios replays in a multiprocessing worker),
which a busy machine disturbs less, and headway's own `sim_wall_seconds` (the replay alone, from its
JSON). Each replay's job count (checked to be the count written), mean JCT and mean queueing delay
are printed too, as a sign that both replayed the same jobs; the means are not expected to agree
exactly, as the placers differ (docs/simulate.md, "Beside a peer"). The machine's load average is
printed before and after: other work on a shared machine slows both.

Ends with one JSON line. Goal (the issue's figure): headway's replay at least 40x faster (`--goal`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import headway
from headway.traces.base import ReadOptions
from headway.traces.registry import read

SAMPLE = Path(headway.__file__).parent / "data" / "philly_jobs.json.gz"
VC = "philly"
GPUS_PER_NODE = 8  # Helios's consolidate placer handles 8-GPU nodes only
HELIOS_START = datetime(2017, 10, 1)  # where Helios's Philly loader starts (utils.trace_philly_process)
HELIOS_WINDOW_END = "2018-12-31 23:59:00"  # in place of its 2017-11-30 23:59:00
# headway's policy of the same name as each Helios one (Helios's sjf ranks by the true duration).
POLICIES = {"fifo": "fifo", "sjf": "sjf-oracle"}

# Run as `python -c DRIVER SIM_DIR WINDOW_END simulator-args...` in the temporary working directory.
DRIVER = """
import runpy, sys
sim_dir, window_end = sys.argv[1], sys.argv[2]
sys.argv = [sim_dir + "/simulator.py", *sys.argv[3:]]
sys.path.insert(0, sim_dir)
import utils
_load = utils.trace_philly_process
utils.trace_philly_process = lambda d, r: _load(d, (r[0], window_end))
utils.cluster_analysis = lambda *a, **k: None
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass
class Replay:
    wall_s: float
    cpu_s: float
    jobs: int
    jct_mean: float
    queue_mean: float
    sim_wall_s: float | None = None


def find_simulator(helios: Path) -> Path:
    """The directory of Helios's `simulator.py`: `framework/QSSF Service` of a checkout, or DIR itself."""
    for d in (helios / "framework" / "QSSF Service", helios):
        if (d / "simulator.py").is_file() and (d / "policies").is_dir() and (d / "cluster.py").is_file():
            return d
    raise SystemExit(f"{helios}: no Helios simulator (framework/QSSF Service/simulator.py) found")


def write_helios_input(table: pa.Table, trace_dir: Path, nodes: int) -> int:
    """Write `table` (headway's job schema) as Helios's simulator input in `trace_dir`; returns the job count.

    `cluster_log.csv`: the jobs with a GPU count above 0 and both start and end times, in submission
    order; `duration` = end - start in whole seconds (at least 1: Helios's per-second clock ends a job
    when the clock equals its end, so a 0 s job would never end). `vc_dict_homo.pkl`: {VC: nodes}."""
    keep = pc.and_(
        pc.greater(pc.fill_null(table["gpus"], 0.0), 0.0),
        pc.and_(pc.is_valid(table["start_time"]), pc.is_valid(table["end_time"])),
    )
    jobs = table.filter(keep).sort_by([("submit_time", "ascending")])
    if jobs.num_rows == 0:
        raise SystemExit("no GPU job with start and end times in the trace")
    cols = ["job_id", "user", "gpus", "state", "submit_time", "start_time", "end_time"]
    rows = jobs.select(cols).to_pylist()
    first: datetime = rows[0]["submit_time"]
    trace_dir.mkdir(parents=True, exist_ok=True)
    with open(trace_dir / "cluster_log.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job_id", "user", "vc", "jobname", "gpu_num", "state", "submit_time", "duration"])
        for r in rows:
            submit = HELIOS_START + timedelta(seconds=round((r["submit_time"] - first).total_seconds()))
            duration = max(1, round((r["end_time"] - r["start_time"]).total_seconds()))
            w.writerow(
                [
                    r["job_id"],
                    r["user"] or "",
                    VC,
                    r["job_id"],
                    int(r["gpus"]),
                    r["state"],
                    submit.strftime("%Y-%m-%d %H:%M:%S"),
                    duration,
                ]
            )
    with open(trace_dir / "vc_dict_homo.pkl", "wb") as fh:
        pickle.dump({VC: nodes}, fh)
    return len(rows)


def _timed(
    cmd: list[str], timeout_s: float, **kw: Any
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run `cmd`; its wall time and the CPU time (user + system) of it and the children it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kw)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.splitlines()[-lines:])


def run_helios(sim_dir: Path, work: Path, policy: str, timeout_s: float) -> Replay:
    """One replay by Helios's simulator, in `work` (which holds `trace/` and the stand-in estimator)."""
    log_dir = work / "log"
    shutil.rmtree(log_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-c",
        DRIVER,
        str(sim_dir),
        HELIOS_WINDOW_END,
        "-e",
        "Philly",
        "-t",
        str(work / "trace"),
        "-l",
        str(log_dir),
        "-s",
        policy,
        "-p",
        "consolidate",
        "-j",
        "1",
        "--num_gpus_per_node",
        str(GPUS_PER_NODE),
    ]
    env = {**os.environ, "TZ": "UTC"}
    proc, wall, cpu = _timed(cmd, timeout_s, cwd=work, env=env)
    log = log_dir / "Philly" / VC / f"{policy}_consolidate_{VC}_log.csv"
    if proc.returncode != 0 or not log.is_file():
        out = _tail(proc.stderr + proc.stdout)
        raise SystemExit(f"Helios's simulator failed (exit {proc.returncode}):\n{out}")
    with open(log, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return Replay(
        wall_s=wall,
        cpu_s=cpu,
        jobs=len(rows),
        jct_mean=statistics.fmean(float(r["jct"]) for r in rows),
        queue_mean=statistics.fmean(float(r["queue"]) for r in rows),
    )


def run_headway(trace: Path, policy: str, nodes: int, timeout_s: float) -> Replay:
    """One replay by `headway simulate ... --json`, a fresh process like Helios's."""
    cmd = [
        sys.executable,
        "-c",
        "from headway.cli import main; main()",
        "simulate",
        str(trace),
        "--policy",
        policy,
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(GPUS_PER_NODE),
        "--json",
    ]
    proc, wall, cpu = _timed(cmd, timeout_s)
    if proc.returncode != 0:
        out = _tail(proc.stderr + proc.stdout)
        raise SystemExit(f"headway simulate failed (exit {proc.returncode}):\n{out}")
    p: dict[str, Any] = json.loads(proc.stdout)["policies"][policy]
    return Replay(
        wall_s=wall,
        cpu_s=cpu,
        jobs=int(p["jobs"]),
        jct_mean=float(p["jct_mean"]),
        queue_mean=float(p["queue_delay_mean"]),
        sim_wall_s=float(p["sim_wall_seconds"]),
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--helios", type=Path, required=True, help="a checkout of HeliosArtifact (yours)")
    ap.add_argument("--repeats", type=int, default=3, help="replays of each simulator (default 3)")
    ap.add_argument(
        "--policy", choices=sorted(POLICIES), default="fifo", help="Helios's name (sjf: headway's sjf-oracle)"
    )
    ap.add_argument("--nodes", type=int, default=64, help="nodes of 8 GPUs (default 64)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for one replay (default 1800)")
    ap.add_argument("--goal", type=float, default=40.0, help="ratio Helios / headway to meet (default 40)")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.nodes < 1:
        ap.error("--repeats and --nodes must be at least 1")
    sim_dir = find_simulator(args.helios.expanduser().resolve())
    ours = POLICIES[args.policy]

    load_before = _load()
    table = read("philly", SAMPLE, ReadOptions()).table
    with tempfile.TemporaryDirectory(prefix="bench_vs_helios_") as tmp:
        work = Path(tmp)
        n_jobs = write_helios_input(table, work / "trace", args.nodes)
        (work / "estimators").mkdir()
        (work / "estimators" / "Philly_lgb.csv").write_text("jobname,priority\n")
        print(f"trace: {SAMPLE.name}, {n_jobs:,} GPU jobs; cluster {args.nodes} x {GPUS_PER_NODE} GPUs")
        print(f"helios: {sim_dir}; policy: Helios {args.policy}, headway {ours}")
        print(f"load average before: {load_before} ({os.cpu_count()} CPUs)")
        helios: list[Replay] = []
        ourruns: list[Replay] = []
        for i in range(args.repeats):
            order = ("headway", "helios") if i % 2 == 0 else ("helios", "headway")
            for who in order:
                if who == "helios":
                    r = run_helios(sim_dir, work, args.policy, args.timeout)
                    helios.append(r)
                else:
                    r = run_headway(SAMPLE, ours, args.nodes, args.timeout)
                    ourruns.append(r)
                extra = f", sim_wall {r.sim_wall_s:.3f} s" if r.sim_wall_s is not None else ""
                print(
                    f"  round {i + 1} {who:8s} {r.wall_s:8.2f} s (CPU {r.cpu_s:.2f} s; {r.jobs:,} jobs, "
                    f"mean JCT {r.jct_mean:,.0f} s, mean queue {r.queue_mean:,.0f} s{extra})",
                    flush=True,
                )
    load_after = _load()
    for name, runs in (("helios", helios), ("headway", ourruns)):
        if runs[0].jobs != n_jobs:
            raise SystemExit(f"{name} replayed {runs[0].jobs:,} jobs, not the {n_jobs:,} written")

    h = statistics.median(r.wall_s for r in helios)
    w = statistics.median(r.wall_s for r in ourruns)
    sim = statistics.median(r.sim_wall_s for r in ourruns if r.sim_wall_s is not None)
    ratio = h / w
    hc = statistics.median(r.cpu_s for r in helios)
    wc = statistics.median(r.cpu_s for r in ourruns)
    met = ratio >= args.goal
    print(f"median wall time, whole process: headway {w:.2f} s, Helios {h:.2f} s")
    print(f"ratio Helios / headway: {ratio:.1f}x (goal >= {args.goal:g}x: {'met' if met else 'NOT met'})")
    print(f"median CPU time (user + system): headway {wc:.2f} s, Helios {hc:.2f} s; ratio {hc / wc:.1f}x")
    print(f"headway sim_wall_seconds (replay alone), median: {sim:.3f} s")
    print(f"load average after: {load_after}")
    print(
        json.dumps(
            {
                "bench": "vs_helios",
                "trace": SAMPLE.name,
                "jobs": n_jobs,
                "nodes": args.nodes,
                "gpus_per_node": GPUS_PER_NODE,
                "policy": {"helios": args.policy, "headway": ours},
                "repeats": args.repeats,
                "headway_wall_s": [round(r.wall_s, 3) for r in ourruns],
                "helios_wall_s": [round(r.wall_s, 3) for r in helios],
                "headway_median_s": round(w, 3),
                "helios_median_s": round(h, 3),
                "ratio": round(ratio, 2),
                "headway_cpu_median_s": round(wc, 3),
                "helios_cpu_median_s": round(hc, 3),
                "cpu_ratio": round(hc / wc, 2),
                "headway_sim_wall_s": round(sim, 3),
                "headway_jct_mean": round(ourruns[0].jct_mean, 1),
                "helios_jct_mean": round(helios[0].jct_mean, 1),
                "goal": args.goal,
                "met": met,
                "load_before": load_before,
                "load_after": load_after,
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
