"""The project's goals for the impact policy and the predictor (issue 4), checked on the Philly sample.

    .venv/bin/python benchmarks/bench_goals.py [--trace FILE] [--load 1.0|natural] [--skip-simulate]
        [--skip-predict]

Goals are targets of this project, not facts about a user's cluster, so the commands never print them:
`headway simulate` and `headway predict evaluate` give the figures, and this script reads their --json
and says, goal by goal, whether they are met. It runs `simulate` (fifo, multifactor, impact; default
load 1.0 on 64 x 8 GPUs, with the Helios figures beside) and `predict evaluate` on a fresh store of
the same trace, prints one line per goal, then one JSON line. The figures and the reasons for each
verdict are in docs/simulate.md ("Goals of issue 4 for impact, and the peer") and docs/predict.md.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headway.data import sample_path

# Impact against the other policies, as (metric, other policy, max ratio impact / other).
SIM_GOALS: tuple[tuple[str, str, float], ...] = (
    ("time_to_success_mean", "multifactor", 0.7),
    ("time_to_success_mean", "fifo", 0.5),
    ("queue_delay_p99", "multifactor", 1.5),
)
UTIL_GOAL_POINTS = 1.0  # impact's utilisation no more than 1 percentage point below multifactor's
AUC_GAIN_GOAL = 0.03  # the model's completion AUC at least this far above the per-user rate's
ECE_GOAL = 0.03  # the model's calibration error at most this


def simulate_goals(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each simulate goal with its measured ratio (or points) and whether it is met, from `simulate
    --json`; the peer's with `--reference helios-philly` (impact below Helios QSSF)."""
    metrics: Mapping[str, Mapping[str, Any]] = doc["policies"]
    imp = metrics.get("impact")
    if imp is None:
        return []
    res: list[dict[str, Any]] = []
    for metric, other, limit in SIM_GOALS:
        o = metrics.get(other)
        if o is None or imp.get(metric) is None or not o.get(metric):
            continue
        r = float(imp[metric]) / float(o[metric])
        res.append(
            {"goal": f"impact {metric} <= {limit:g}x {other}", "value": f"{r:.2f}x", "met": r <= limit}
        )
    mf = metrics.get("multifactor")
    if mf is not None and imp.get("utilisation") is not None and mf.get("utilisation") is not None:
        diff = 100 * (float(imp["utilisation"]) - float(mf["utilisation"]))
        res.append(
            {
                "goal": f"impact utilisation no more than {UTIL_GOAL_POINTS:g} point below multifactor's",
                "value": f"{diff:+.2f} points",
                "met": diff >= -UTIL_GOAL_POINTS,
            }
        )
    for row in (doc.get("reference") or {}).get("rows", []):
        ours = row.get("headway_impact")
        if row.get("policy") == "qssf" and ours is not None:
            peer = f"Helios QSSF's ({row['helios']:,.0f} s, load {row['load']})"
            res.append(
                {
                    "goal": f"impact {row['metric']} below {peer}",
                    "value": f"{ours:,.0f} s",
                    "met": ours < row["helios"],
                }
            )
    return res


def _known(*values: Any) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def predict_goals(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each predictor goal from `predict evaluate --json`; `met` is None when the test set cannot tell
    (AUC with one outcome only, runtime with no completed job: null in the JSON)."""
    b = report["baseline"]
    auc, b_auc = report["auc"], b["auc"]
    brier, b_brier, ece = report["brier"], b["brier"], report["ece"]
    rt, b_rt = report["runtime"]["within_50pct"], b["runtime"]["within_50pct"]

    def goal(name: str, fmt: str, test: Callable[..., bool], *values: Any) -> dict[str, Any]:
        if not _known(*values):
            return {"goal": name, "value": "-", "met": None}
        return {"goal": name, "value": fmt.format(*values), "met": bool(test(*values))}

    return [
        goal(
            f"completion AUC at least {AUC_GAIN_GOAL:g} above the baseline",
            "{0:.3f} vs {1:.3f}",
            lambda m, base: m - base >= AUC_GAIN_GOAL,
            auc,
            b_auc,
        ),
        goal(
            "Brier score below the baseline", "{0:.4f} vs {1:.4f}", lambda m, base: m < base, brier, b_brier
        ),
        goal(f"ECE at most {ECE_GOAL:g}", "{0:.3f}", lambda m: m <= ECE_GOAL, ece),
        goal(
            "runtime within ±50% more often than the baseline",
            "{0:.3f} vs {1:.3f}",
            lambda m, base: m > base,
            rt,
            b_rt,
        ),
    ]


def headway_json(args: Sequence[str]) -> dict[str, Any]:
    """Run the `headway` command in this interpreter and read its --json (docs_figures.py uses it too)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from headway.cli import main; main()", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"headway {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
        )
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _print(goals: Sequence[Mapping[str, Any]]) -> None:
    for g in goals:
        verdict = "met" if g["met"] else "n/a" if g["met"] is None else "NOT met"
        print(f"goal: {g['goal']}: {g['value']}, {verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=sample_path("philly_jobs.json.gz"))
    ap.add_argument("--load", default="1.0", help="offered load for simulate, or `natural`")
    ap.add_argument("--skip-simulate", action="store_true")
    ap.add_argument("--skip-predict", action="store_true")
    a = ap.parse_args()
    out: dict[str, Any] = {"bench": "goals", "trace": str(a.trace), "load": a.load}
    if not a.skip_simulate:
        t0 = time.perf_counter()
        args = [
            "simulate",
            str(a.trace),
            "--policy",
            "fifo,multifactor,impact",
            "--reference",
            "helios-philly",
        ]
        if a.load != "natural":
            args += ["--load", a.load]
        doc = headway_json([*args, "--json"])
        out["simulate_s"] = time.perf_counter() - t0
        out["simulate"] = simulate_goals(doc)
        print(f"simulate ({out['simulate_s']:.0f} s; {doc['cluster']['description']}, load {a.load}):")
        _print(out["simulate"])
    if not a.skip_predict:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="headway-bench-goals-") as tmp:
            db = str(Path(tmp) / "jobs.duckdb")
            headway_json(["ingest", str(a.trace), "--db", db, "--json"])
            report = headway_json(["predict", "evaluate", "--db", db, "--json"])
        out["predict_s"] = time.perf_counter() - t0
        out["predict"] = predict_goals(report)
        floor = ((report.get("noise") or {}).get("by_user_day") or {}).get("ece_floor")
        print(f"predict evaluate ({out['predict_s']:.0f} s; {report['split']['test_jobs']:,} test jobs):")
        _print(out["predict"])
        if floor:  # what the ECE goal can mean on this test set (docs/predict.md, correlated outcomes)
            print(
                f"  a perfectly calibrated model would show ece {floor['mean']:.3f} here "
                f"(90%: {floor['p05']:.3f}..{floor['p95']:.3f}) with this test set's user-day bursts"
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
