"""What the retraining schedule costs in accuracy: `predict evaluate --retrain daily` against
`--retrain schedule` (the online predictor's, predict/schedule.py) on the same split of each trace.

    .venv/bin/python benchmarks/schedule_accuracy.py [--json]

Traces: the bundled Philly sample; Alibaba's pods (../shared/traces, skipped without it); two
`headway synth` traces of 20,000 jobs (seed 1, Philly profile; seed 2, Alibaba profile). Each is
ingested into a fresh store and evaluated by the `headway` command with `--json`. Prints, per trace and
mode: fits, AUC, Brier, ECE, the share of completed jobs whose runtime is within +-50%, and the CPU
seconds the evaluation took; beside them the 5-95% bootstrap interval of the model's AUC gain over the
baseline, to read the differences against.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_goals import headway_json
from headway.data import sample_path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
ALIBABA = SHARED / "alibaba-fgd-2023" / "openb_pod_list_default.csv"
MODES = ("daily", "schedule")


def _headway(*args: str) -> None:
    subprocess.run([sys.executable, "-c", "from headway.cli import main; main()", *args], check=True,
                   capture_output=True)  # fmt: skip


def traces(tmp: Path) -> dict[str, Path]:
    out = {"philly": sample_path("philly_jobs.json.gz")}
    if ALIBABA.exists():
        out["alibaba"] = ALIBABA
    for seed, profile in ((1, "philly"), (2, "alibaba")):
        path = tmp / f"synth-{seed}.parquet"
        _headway("synth", "--jobs", "20000", "--seed", str(seed), "--profile", profile, "-o", str(path))
        out[f"synth-{seed} ({profile})"] = path
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON only")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in traces(Path(tmp)).items():
            db = Path(tmp) / f"{len(rows)}.duckdb"
            _headway("ingest", "--db", str(db), str(path))
            for mode in MODES:
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = headway_json(["predict", "evaluate", "--db", str(db), "--retrain", mode, "--json"])
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
                gain = r["noise"]["auc_gain"]
                rows.append(
                    {
                        "trace": name,
                        "retrain": mode,
                        "fits": r["split"]["retrainings"],
                        "test_jobs": r["split"]["test_jobs"],
                        "test_days": r["split"]["test_days"],
                        "auc": r["auc"],
                        "brier": r["brier"],
                        "ece": r["ece"],
                        "runtime_within_50pct": r["runtime"]["within_50pct"],
                        "auc_gain_p05_p95": [gain["p05"], gain["p95"]],
                        "cpu_s": cpu,
                    }
                )
                if not a.json:
                    x = rows[-1]
                    print(
                        f"{name:24s} {mode:9s} fits {x['fits']:3d}  auc {x['auc']:.4f}  "
                        f"brier {x['brier']:.4f}  ece {x['ece']:.4f}  "
                        f"runtime +-50% {x['runtime_within_50pct']:.4f}  "
                        f"(auc gain 5-95%: {gain['p05']:+.3f}..{gain['p95']:+.3f}; {cpu:.0f} s CPU)",
                        flush=True,
                    )
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
