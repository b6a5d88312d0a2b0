"""The figures docs/simulate.md, docs/policies.md and docs/predict.md quote, measured on the bundled samples.

    .venv/bin/python benchmarks/docs_figures.py [--trace FILE] [--seeds 0,1,2] [--save FILE]
        [--from FILE] [--shared DIR] [--skip-simulate] [--skip-predict]

It runs the commands the docs name and reads their --json:

- `headway simulate TRACE --policy <all eight> --reference helios-philly --json`, at the trace's own
  arrivals ("natural") and at `--load 1.0`, on the default 64 x 8 GPUs;
- `headway simulate TRACE --policy impact --seed S` at both loads for each further seed (the spread
  over the predictor's training noise);
- `headway simulate TRACE --policy fifo --cluster from-log` (the cluster a log gives, and its
  offered-load note), and the same for the bundled Slurm 22.05 export on 64 x 8 and from its log;
- where `--shared` (default ../shared/traces) holds them: the same offered-load check for the Slurm
  22.05 test cluster's slurmdbd job table, and Alibaba's pods on their own node list
  (`--policy impact,multifactor,fifo --load 10 --copies 2 --nodes-file ...`, both placements), and
  `predict evaluate` and `predict validate` on Alibaba's pods;
- `headway ingest TRACE` into a fresh store, then `headway predict evaluate --json` and
  `headway predict validate --json`.

It prints one row per figure: the doc and section that quotes it, the figure, its value. `--save FILE`
keeps the commands' JSON; `--from FILE` prints the table again from a saved file without running
anything. On the shared 2-core development machine the whole run takes about 3-4 minutes (the two
eight-policy replays, about a minute each, are most of it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_goals import headway_json
from headway.data import sample_path

POLICIES = "fifo,multifactor,qssf,las,impact,sjf-oracle,impact-oracle,fifo-skip"
LOADS = ("natural", "1.0")


def _headway(args: Sequence[str]) -> dict[str, Any]:
    """bench_goals' runner, with how long each command took on stderr."""
    t0 = time.perf_counter()
    doc = headway_json(args)
    print(f"  headway {' '.join(args)}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return doc


def _load_args(load: str) -> list[str]:
    return [] if load == "natural" else ["--load", load]


def run_shared(shared: Path) -> dict[str, Any]:
    """The figures of traces that are not bundled: the Slurm 22.05 test cluster's slurmdbd job table and
    Alibaba's pods on their own node list (two copies at load 10, both placements)."""
    out: dict[str, Any] = {}
    table = shared / "slurm-22.05" / "slurmdb_job_table.csv"
    if table.exists():
        out["slurmdb_default"] = _headway(["simulate", str(table), "--policy", "fifo", "--json"])
        out["slurmdb_from_log"] = _headway(
            ["simulate", str(table), "--policy", "fifo", "--cluster", "from-log", "--json"]
        )
    pods = shared / "alibaba-fgd-2023" / "openb_pod_list_default.csv"
    nodes = shared / "alibaba-fgd-2023" / "openb_node_list_gpu_node.csv"
    if pods.exists() and nodes.exists():
        for placement in ("first-fit", "topology"):
            out[f"alibaba_{placement}"] = _headway(
                [
                    "simulate",
                    str(pods),
                    "--policy",
                    "impact,multifactor,fifo",
                    "--load",
                    "10",
                    "--copies",
                    "2",
                    "--nodes-file",
                    str(nodes),
                    "--placement",
                    placement,
                    "--json",
                ]
            )
        with tempfile.TemporaryDirectory(prefix="headway-docs-figures-") as tmp:
            db = str(Path(tmp) / "jobs.duckdb")
            _headway(["ingest", str(pods), "--db", db, "--json"])
            out["alibaba_evaluate"] = _headway(["predict", "evaluate", "--db", db, "--json"])
            out["alibaba_validate"] = _headway(["predict", "validate", "--db", db, "--json"])
    return out


def run_all(
    trace: Path, seeds: Sequence[int], simulate: bool, predict: bool, shared: Path | None
) -> dict[str, Any]:
    raw: dict[str, Any] = {"trace": str(trace), "seeds": list(seeds)}
    if simulate and shared is not None and shared.is_dir():
        raw["shared"] = run_shared(shared)
    if simulate:
        raw["simulate"] = {}
        for load in LOADS:
            raw["simulate"][load] = _headway(
                [
                    "simulate",
                    str(trace),
                    "--policy",
                    POLICIES,
                    "--reference",
                    "helios-philly",
                    *_load_args(load),
                    "--seed",
                    str(seeds[0]),
                    "--json",
                ]
            )
        raw["impact_seeds"] = {load: {} for load in LOADS}
        for seed in seeds[1:]:
            for load in LOADS:
                doc = _headway(
                    [
                        "simulate",
                        str(trace),
                        "--policy",
                        "impact",
                        *_load_args(load),
                        "--seed",
                        str(seed),
                        "--json",
                    ]
                )
                raw["impact_seeds"][load][str(seed)] = doc["policies"]["impact"]
        raw["from_log"] = _headway(
            ["simulate", str(trace), "--policy", "fifo", "--cluster", "from-log", "--json"]
        )
        slurm = sample_path("slurm-22.05-sacct.txt")
        raw["slurm_default"] = _headway(["simulate", str(slurm), "--policy", "fifo", "--json"])
        raw["slurm_from_log"] = _headway(
            ["simulate", str(slurm), "--policy", "fifo", "--cluster", "from-log", "--json"]
        )
    if predict:
        with tempfile.TemporaryDirectory(prefix="headway-docs-figures-") as tmp:
            db = str(Path(tmp) / "jobs.duckdb")
            _headway(["ingest", str(trace), "--db", db, "--json"])
            raw["predict_evaluate"] = _headway(["predict", "evaluate", "--db", db, "--json"])
            raw["predict_validate"] = _headway(["predict", "validate", "--db", db, "--json"])
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=sample_path("philly_jobs.json.gz"))
    ap.add_argument("--seeds", default="0,1,2", help="predictor seeds for impact (the first for all)")
    ap.add_argument("--save", type=Path, help="write the commands' JSON here")
    ap.add_argument("--from", dest="from_file", type=Path, help="print from a file --save wrote")
    ap.add_argument(
        "--shared",
        type=Path,
        default=Path(__file__).resolve().parents[1].parent / "shared" / "traces",
        help="folder of the traces that are not bundled (slurm-22.05/, alibaba-fgd-2023/); "
        "skipped when absent",
    )
    ap.add_argument("--skip-simulate", action="store_true")
    ap.add_argument("--skip-predict", action="store_true")
    a = ap.parse_args()
    if a.from_file:
        raw = json.loads(a.from_file.read_text())
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
        raw = run_all(a.trace, seeds, not a.skip_simulate, not a.skip_predict, a.shared)
        if a.save:
            a.save.write_text(json.dumps(raw))
    print_table(raw)


SIM_DOC = "docs/simulate.md"
PRED_DOC = "docs/predict.md"
TABLE_METRICS = (
    ("TTS mean", "time_to_success_mean", "s"),
    ("TTS p50", "time_to_success_p50", "n"),
    ("TTS p95", "time_to_success_p95", "n"),
    ("wait mean", "queue_delay_mean", "n"),
    ("wait p99", "queue_delay_p99", "n"),
    ("wait max", "queue_delay_max", "n"),
    ("BSLD mean", "bounded_slowdown_mean", "f2"),
    ("util", "utilisation", "pct"),
    ("frag GPU-h", "fragmented_gpu_hours", "n"),
    ("Jain", "jain_fairness", "f2"),
)


def _fmt(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "s":
        return f"{v:,.0f} s"
    if kind == "n":
        return f"{v:,.0f}"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind.startswith("f"):
        return f"{v:.{int(kind[1:])}f}"
    return str(v)


def _section(title: str) -> None:
    print(f"\n## {title}\n")


def _rows(rows: Sequence[tuple[str, str]]) -> None:
    print("| figure | value |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def _load_name(load: str) -> str:
    return "natural load" if load == "natural" else f"load {load}"


def print_simulate(raw: dict[str, Any]) -> None:
    sims = raw["simulate"]
    for load in LOADS:
        doc = sims[load]
        pol = doc["policies"]
        title = "Natural load" if load == "natural" else f"Load {load}"
        _section(
            f"{SIM_DOC}, Measured: {title} ({doc['trace']['jobs']:,} jobs; offered load "
            f"{doc['load_check']['offered_load']:.2f} at the log's own arrivals; "
            f"{doc['cluster']['description']}; jobs left out: "
            f"{sum((doc.get('excluded_counts') or {}).values())})"
        )
        print("| policy | " + " | ".join(h for h, _, _ in TABLE_METRICS) + " |")
        print("|---|" + "---:|" * len(TABLE_METRICS))
        for name, m in pol.items():
            print(f"| {name} | " + " | ".join(_fmt(m.get(k), f) for _, k, f in TABLE_METRICS) + " |")

    _section(f"{SIM_DOC}, Goals of issue 4 for impact, and the peer (seed {raw['seeds'][0]})")
    rows: list[tuple[str, str]] = []
    for load in LOADS:
        pol = sims[load]["policies"]
        imp, mf, ff = pol["impact"], pol["multifactor"], pol["fifo"]
        ln = _load_name(load)
        rows += [
            (
                f"{ln}: impact / multifactor mean TTS",
                f"{imp['time_to_success_mean'] / mf['time_to_success_mean']:.2f}x",
            ),
            (
                f"{ln}: impact / fifo mean TTS",
                f"{imp['time_to_success_mean'] / ff['time_to_success_mean']:.2f}x",
            ),
            (
                f"{ln}: impact / multifactor p99 wait",
                f"{imp['queue_delay_p99'] / mf['queue_delay_p99']:.2f}x",
            ),
            (
                f"{ln}: impact - multifactor utilisation",
                f"{100 * (imp['utilisation'] - mf['utilisation']):+.1f} points",
            ),
            (
                f"{ln}: impact-oracle / multifactor mean TTS",
                f"{pol['impact-oracle']['time_to_success_mean'] / mf['time_to_success_mean']:.2f}x",
            ),
        ]
        waits = [m["queue_delay_mean"] for m in pol.values()]
        tts = [m["time_to_success_mean"] for m in pol.values()]
        rows += [
            (f"{ln}: mean wait, range over policies", f"{min(waits):,.0f} .. {max(waits):,.0f} s"),
            (f"{ln}: mean TTS, range over policies", f"{min(tts):,.0f} .. {max(tts):,.0f} s"),
        ]
    _rows(rows)

    _section(f"{SIM_DOC}, Beside a peer: the Helios simulator (--reference helios-philly)")
    rows = []
    for load in LOADS:
        doc = sims[load]
        for r in (doc.get("reference") or {}).get("rows", []):
            if (
                r.get("load") != ("natural" if load == "natural" else float(load))
                and str(r.get("load")) != load
            ):
                continue
            name = f"{_load_name(load)}: {r['policy']} {r['metric']}"
            ours = r.get("headway")
            txt = f"Helios {r['helios']:,.0f} s"
            if ours is not None:
                txt += (
                    f", headway {ours:,.0f} s ({100 * (ours / r['helios'] - 1):+.1f}%; "
                    f"{ours / 86400:.2f} d against {r['helios'] / 86400:.2f} d, "
                    f"{ours / 3600:.1f} h against {r['helios'] / 3600:.1f} h)"
                )
            if r.get("headway_impact") is not None:
                txt += f", headway impact {r['headway_impact']:,.0f} s ({r['impact_ratio']:.2f}x)"
            rows.append((name, txt))
    _rows(rows)

    _section(f"{SIM_DOC}, Sweeps on Dask: impact over predictor seeds (one run each)")
    rows = []
    for load in LOADS:
        pol = sims[load]["policies"]
        per_seed = {str(raw["seeds"][0]): pol["impact"], **raw.get("impact_seeds", {}).get(load, {})}
        mf = pol["multifactor"]["time_to_success_mean"]
        for seed, m in per_seed.items():
            rows.append(
                (
                    f"{_load_name(load)}, seed {seed}: impact mean TTS / p99 wait / util",
                    f"{m['time_to_success_mean']:,.0f} s ({m['time_to_success_mean'] / mf:.2f}x multifactor)"
                    f" / {m['queue_delay_p99']:,.0f} s / {100 * m['utilisation']:.1f}%",
                )
            )
    _rows(rows)

    _section(f"{SIM_DOC}, Your own cluster and the offered-load note")
    rows = []
    for label, key in (
        ("Philly sample, default 64 x 8", None),
        ("Philly sample, --cluster from-log", "from_log"),
        ("Slurm 22.05 sample, default 64 x 8", "slurm_default"),
        ("Slurm 22.05 sample, --cluster from-log", "slurm_from_log"),
    ):
        doc = sims["natural"] if key is None else raw[key]
        lc = doc["load_check"]
        rows.append((f"{label}: offered load ({lc['window']})", f"{lc['offered_load']:.3f}"))
        rows.append((f"{label}: note", lc["note"] or "none"))
        fl = (doc["cluster"] or {}).get("from_log")
        if fl:
            sizes: dict[int, int] = {}
            for g in fl["node_gpus"].values():
                sizes[g] = sizes.get(g, 0) + 1
            dist = ", ".join(f"{n} with {g}" for g, n in sorted(sizes.items(), key=lambda x: -x[1]))
            rows.append(
                (
                    f"{label}: nodes, GPUs",
                    f"{len(fl['node_gpus'])} nodes, {sum(fl['node_gpus'].values()):,} GPUs ({dist})",
                )
            )
    _rows(rows)


def _iv(d: dict[str, Any], digits: int = 3) -> str:
    return f"{d['p05']:+.{digits}f} .. {d['p95']:+.{digits}f}"


def print_shared(sh: dict[str, Any]) -> None:
    if "slurmdb_default" in sh:
        _section(f"{SIM_DOC}, The offered-load note: the slurmdbd job table (--shared)")
        rows: list[tuple[str, str]] = []
        for label, key in (("default 64 x 8", "slurmdb_default"), ("--cluster from-log", "slurmdb_from_log")):
            doc = sh[key]
            lc = doc["load_check"]
            m = doc["policies"]["fifo"]
            rows.append(
                (
                    f"{label}: jobs replayed, GPU-hours, window",
                    f"{m['jobs']} jobs, {lc['gpu_hours']:.1f} GPU-hours over "
                    f"{lc['window_s'] / 60:.1f} min ({lc['window']}); trace {doc['trace']['jobs']} jobs",
                )
            )
            rows.append((f"{label}: offered load", f"{lc['offered_load']:.3f}"))
            rows.append((f"{label}: note", lc["note"] or "none"))
        _rows(rows)
    if "alibaba_first-fit" in sh:
        _section(f"{SIM_DOC}, --copies: Alibaba's pods, 2 copies at load 10 (--shared)")
        ff, tp = sh["alibaba_first-fit"], sh["alibaba_topology"]
        print("| fragmented GPU-hours | first-fit | topology |\n|---|---:|---:|")
        for pol in ff["policies"]:
            print(
                f"| {pol} | {ff['policies'][pol]['fragmented_gpu_hours']:,.1f} | "
                f"{tp['policies'][pol]['fragmented_gpu_hours']:,.1f} |"
            )
        print()
        rows = []
        for pol in ff["policies"]:
            a, b = ff["policies"][pol], tp["policies"][pol]
            rows.append(
                (
                    f"{pol}: mean wait first-fit / topology",
                    f"{a['queue_delay_mean']:,.0f} s / {b['queue_delay_mean']:,.0f} s",
                )
            )
            rows.append(
                (
                    f"{pol}: p99 wait first-fit / topology",
                    f"{a['queue_delay_p99'] / 60:.1f} / {b['queue_delay_p99'] / 60:.1f} min",
                )
            )
            rows.append(
                (
                    f"{pol}: mean TTS first-fit / topology",
                    f"{a['time_to_success_mean'] / 3600:.1f} / {b['time_to_success_mean'] / 3600:.1f} h",
                )
            )
        rows.append(("cluster", ff["cluster"]["description"]))
        _rows(rows)


def print_predict(raw: dict[str, Any]) -> None:
    print_evaluate(raw["predict_evaluate"], "Philly")
    if "predict_validate" in raw:
        print_validate(raw["predict_validate"], "Philly")
    sh = raw.get("shared") or {}
    if "alibaba_evaluate" in sh:
        print_evaluate(sh["alibaba_evaluate"], "Alibaba")
        print_validate(sh["alibaba_validate"], "Alibaba")


def print_evaluate(r: dict[str, Any], trace: str) -> None:
    b, sp, om, noise = r["baseline"], r["split"], r["other_mode"], r["noise"]
    rt, brt, ttf, bttf = r["runtime"], b["runtime"], r["time_to_failure"], b["time_to_failure"]
    _section(f"{PRED_DOC}, Results on real traces: {trace} (predict evaluate --json, --retrain daily)")
    _rows(
        [
            (
                "test jobs, dates, days",
                f"{sp['test_jobs']:,} jobs, {sp['test_from'][:10]} to "
                f"{sp['test_to'][:10]}, {sp['test_days']} days",
            ),
            (
                "test success rate / training success rate",
                f"{100 * sp['test_success_rate']:.1f}% / {100 * r['model']['success_rate']:.1f}%",
            ),
            ("AUC: daily / frozen / baseline", f"{r['auc']:.3f} / {om['auc']:.3f} / {b['auc']:.3f}"),
            ("Brier: daily / frozen / baseline", f"{r['brier']:.3f} / {om['brier']:.3f} / {b['brier']:.3f}"),
            (
                "log loss: daily / frozen / baseline",
                f"{r['log_loss']:.3f} / {om['log_loss']:.3f} / {b['log_loss']:.3f}",
            ),
            ("ECE: daily / frozen / baseline", f"{r['ece']:.3f} / {om['ece']:.3f} / {b['ece']:.3f}"),
            (
                "ECE floor (independent jobs): mean, p95",
                f"{noise['ece_floor']['mean']:.3f}, {noise['ece_floor']['p95']:.3f}",
            ),
            (
                f"runtime within ±50% ({rt['jobs']} completed): daily / frozen / baseline",
                f"{rt['within_50pct']:.3f} / {om['runtime_within_50pct']:.3f} / {brt['within_50pct']:.3f}",
            ),
            (
                "runtime within ±100%: daily / baseline",
                f"{rt['within_100pct']:.3f} / {brt['within_100pct']:.3f}",
            ),
            (
                "runtime median abs log error: daily / baseline",
                f"{rt['median_abs_log_error']:.3f} / {brt['median_abs_log_error']:.3f}",
            ),
            ("runtime within 10x: daily / baseline", f"{rt['within_10x']:.3f} / {brt['within_10x']:.3f}"),
            ("p90 runtime covers", f"{100 * rt['p90_coverage']:.1f}% of completed jobs"),
            (
                f"time to failure within ±50% ({ttf['jobs']} jobs): daily / baseline",
                f"{ttf['within_50pct']:.3f} / {bttf['within_50pct']:.3f}",
            ),
            (
                "frozen model's runtime start, and each candidate's share within ±50%",
                f"{r['model']['runtime_start']}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in r["model"]["runtime_start_scores"].items()),
            ),
            ("AUC gain over the baseline", f"{r['auc'] - b['auc']:+.3f}"),
            ("Brier gain (baseline - model)", f"{b['brier'] - r['brier']:+.4f}"),
            ("runtime within ±50% gain", f"{rt['within_50pct'] - brt['within_50pct']:+.3f}"),
        ]
    )
    print("\n| reliability bin | jobs | predicted | observed |\n|---|---:|---:|---:|")
    for row in r["reliability"]:
        print(f"| {row['bin']} | {row['jobs']} | {_num(row['predicted'], 3)} | {_num(row['observed'], 3)} |")
    ud = noise.get("by_user_day") or {}
    if ud.get("correlation") is None:
        _section(f"{PRED_DOC}, Evaluation: Noise, {trace} (predict evaluate --json, noise)")
        _rows(
            [
                (f"{k}, 90% interval", _iv(noise[k], 4 if k == "brier_gain" else 3))
                for k in ("auc_gain", "brier_gain", "runtime_gain")
            ]
            + [("ECE, 90% interval", f"{noise['ece']['p05']:.3f} .. {noise['ece']['p95']:.3f}")]
        )
        return
    _section(
        f"{PRED_DOC}, Evaluation: Noise and correlated outcomes, {trace} (predict evaluate --json, noise)"
    )
    _rows(
        [
            (
                "AUC gain, 90% interval: job-level / user-day",
                f"{_iv(noise['auc_gain'])} / {_iv(ud['auc_gain'])}",
            ),
            (
                "Brier gain, 90% interval: job-level / user-day",
                f"{_iv(noise['brier_gain'], 4)} / {_iv(ud['brier_gain'], 4)}",
            ),
            (
                "ECE, 90% interval: job-level / user-day",
                f"{noise['ece']['p05']:.3f} .. {noise['ece']['p95']:.3f} / "
                f"{ud['ece']['p05']:.3f} .. {ud['ece']['p95']:.3f}",
            ),
            (
                "runtime ±50% gain, 90% interval: job-level / user-day",
                f"{_iv(noise['runtime_gain'])} / {_iv(ud['runtime_gain'])}",
            ),
            ("user-day blocks", f"{ud['blocks']}"),
            ("within-user-day correlation", f"{ud['correlation']:.2f}"),
            (
                "ECE of a calibrated model with these bursts: mean (90%)",
                f"{ud['ece_floor']['mean']:.3f} "
                f"({ud['ece_floor']['p05']:.3f} .. {ud['ece_floor']['p95']:.3f})",
            ),
        ]
    )


def print_validate(v: dict[str, Any], trace: str) -> None:
    _section(
        f"{PRED_DOC}, How the settings were chosen: the chosen settings, fold by fold, {trace} "
        "(predict validate --json)"
    )
    print(
        f"| {trace} fold | jobs | success rate | AUC gain | Brier gain | ECE (floor) | "
        "calibrated model's ECE | baseline ECE | runtime ±50% gain | user-day correlation |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in v["folds"]:
        print(
            f"| {f['fold']} | {f['jobs']} | {f['success_rate']:.3f} | {f['auc_gain']:+.3f} | "
            f"{f['brier_gain']:+.3f} | {f['ece']:.3f} ({f['ece_floor']:.3f}) | "
            f"{f['ece_floor_user_day']:.3f} | {f['baseline_ece']:.3f} | {f['runtime_gain']:+.3f} | "
            f"{_num(f.get('user_day_correlation'))} |"
        )
    m = v["mean"]
    print(
        f"| mean | | | {m['auc_gain']:+.3f} | {m['brier_gain']:+.3f} | {m['ece']:.3f} "
        f"({m['ece_floor']:.3f}) | {m['ece_floor_user_day']:.3f} | {m['baseline_ece']:.3f} | "
        f"{m['runtime_gain']:+.3f} | |"
    )


def _num(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(raw: dict[str, Any]) -> None:
    print(f"# Figures quoted by the docs ({raw['trace']})")
    if "simulate" in raw:
        print_simulate(raw)
    if "shared" in raw:
        print_shared(raw["shared"])
    if "predict_evaluate" in raw:
        print_predict(raw)


if __name__ == "__main__":
    main()
