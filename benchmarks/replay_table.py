"""Every policy's replay of the bundled Philly sample and of a synthetic trace, as one table.

    .venv/bin/python benchmarks/replay_table.py [--save FILE]
    .venv/bin/python benchmarks/replay_table.py --compare BEFORE.json AFTER.json

The first form runs `headway simulate --json` for all eight policies on the bundled Philly sample at
`--load 1.0` (64 x 8 GPUs) and on `headway synth --jobs 20000 --seed 7` at `--load 0.9` (32 x 8
GPUs), and prints each policy's headline figures. `--compare` prints two saved runs side by side
(before | after | change) and marks every figure that moved by more than 1%: a change to the scheduling
core is checked against this table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_goals import headway_json
from headway.data import sample_path

POLICIES = "fifo,multifactor,qssf,las,impact,sjf-oracle,impact-oracle,fifo-skip"
FIGURES = (
    "time_to_success_mean",
    "jct_mean",
    "queue_delay_mean",
    "queue_delay_p95",
    "bounded_slowdown_mean",
    "utilisation",
    "goodput_gpu_hours",
    "wasted_gpu_hours",
    "jain_fairness",
    "preemptions",
)
MOVED = 0.01


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        synth = Path(tmp) / "synth.parquet"
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from headway.cli import main; main()",
                "synth",
                "--jobs",
                "20000",
                "--seed",
                "7",
                "-o",
                str(synth),
            ],
            check=True,
            capture_output=True,
        )
        traces = {
            "philly (load 1.0, 64x8)": [str(sample_path("philly_jobs.json.gz")), "--load", "1.0"],
            "synth 20k seed 7 (load 0.9, 32x8)": [str(synth), "--nodes", "32", "--load", "0.9"],
        }
        out: dict[str, Any] = {}
        for name, args in traces.items():
            doc = headway_json(["simulate", *args, "--policy", POLICIES, "--json"])
            out[name] = {p: {f: m.get(f) for f in FIGURES} for p, m in doc["policies"].items()}
        return out


def show(doc: dict[str, Any]) -> None:
    for trace, pols in doc.items():
        print(f"\n## {trace}")
        print("policy".ljust(14) + "".join(f[:14].rjust(16) for f in FIGURES))
        for p, m in pols.items():
            print(p.ljust(14) + "".join(_fmt(m[f]).rjust(16) for f in FIGURES))


def compare(before: dict[str, Any], after: dict[str, Any]) -> None:
    for trace, pols in after.items():
        print(f"\n## {trace}: before | after | change (* moved more than {MOVED:.0%})")
        for p, m in pols.items():
            was = before.get(trace, {}).get(p, {})
            cells = []
            for f in FIGURES:
                a, b = was.get(f), m.get(f)
                ch = (
                    (b - a) / abs(a)
                    if isinstance(a, int | float) and isinstance(b, int | float) and a
                    else 0.0
                )
                mark = "*" if abs(ch) > MOVED or (a is None) != (b is None) else " "
                cells.append(f"{f}: {_fmt(a)} | {_fmt(b)} | {ch:+.1%}{mark}")
            print(f"{p}:\n    " + "\n    ".join(cells))


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.0f}"
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    if a.compare:
        compare(json.loads(a.compare[0].read_text()), json.loads(a.compare[1].read_text()))
        return
    doc = run()
    show(doc)
    if a.save:
        a.save.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
