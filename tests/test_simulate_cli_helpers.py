"""Pieces of `headway simulate` that need no engine: reference figures, option parsing, loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer

from headway.commands.simulate import _parse_loads, _parse_policies, load_jobs
from headway.sim.compare import helios_reference, reference_for, reference_rows
from headway.sim.synth import generate


def test_helios_reference_has_the_issue_figures() -> None:
    figs = {(f.policy, f.load, f.metric): f.value for f in helios_reference()}
    assert figs[("fifo", "natural", "time_to_success_mean")] == 126_008
    assert figs[("sjf-oracle", "1.0", "time_to_success_mean")] == 167_159
    assert figs[("qssf", "1.0", "queue_delay_p99")] == 3_608_957
    assert len(figs) == 8


def test_reference_matches_the_load_asked_for() -> None:
    assert {f.load for f in reference_for(None)} == {"natural"}
    assert {f.load for f in reference_for(1.0)} == {"1.0"}
    assert reference_for(0.8) == []


def test_reference_rows_put_impact_beside_helios_qssf() -> None:
    ours = {"qssf": {"time_to_success_mean": 90_000.0}, "impact": {"time_to_success_mean": 80_000.0}}
    rows = reference_rows(reference_for(None), ours)
    q = next(r for r in rows if r["policy"] == "qssf" and r["metric"] == "time_to_success_mean")
    assert q["helios"] == 104_075
    assert q["headway"] == 90_000.0
    assert q["headway_impact"] == 80_000.0
    assert q["impact_ratio"] == pytest.approx(80_000 / 104_075)
    assert not any("beats" in k for r in rows for k in r)  # figures side by side, no verdict


def _bench_goals() -> Any:
    """benchmarks/bench_goals.py, where the project's goals moved from the command's output."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_goals.py"
    spec = importlib.util.spec_from_file_location("bench_goals", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_judges_impact_against_the_goals_simulate_no_longer_prints() -> None:
    m = {
        "impact": {"time_to_success_mean": 60.0, "queue_delay_p99": 200.0, "utilisation": 0.80},
        "multifactor": {"time_to_success_mean": 100.0, "queue_delay_p99": 100.0, "utilisation": 0.805},
        "fifo": {"time_to_success_mean": 200.0, "queue_delay_p99": 50.0, "utilisation": 0.79},
    }
    rows = reference_rows(reference_for(None), {**m, "qssf": {"time_to_success_mean": 1.0}})
    g = {x["goal"]: x for x in _bench_goals().simulate_goals({"policies": m, "reference": {"rows": rows}})}
    assert g["impact time_to_success_mean <= 0.7x multifactor"]["met"]
    assert g["impact time_to_success_mean <= 0.5x fifo"]["value"] == "0.30x"
    assert not g["impact queue_delay_p99 <= 1.5x multifactor"]["met"]
    assert g["impact utilisation no more than 1 point below multifactor's"]["met"]
    assert g["impact time_to_success_mean below Helios QSSF's (104,075 s, load natural)"]["met"]
    assert _bench_goals().simulate_goals({"policies": {"fifo": {}}}) == []


def test_option_parsing_rejects_unknown_policies_and_bad_loads() -> None:
    assert _parse_policies("fifo, impact,fifo") == ["fifo", "impact"]
    assert _parse_loads("0.6,natural,1") == [0.6, None, 1.0]
    with pytest.raises(typer.Exit):
        _parse_policies("fifo,magic")
    with pytest.raises(typer.Exit):
        _parse_loads("0.5,lots")
    with pytest.raises(typer.Exit):
        _parse_loads("-1")


def test_load_jobs_reads_a_synth_parquet_file(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    p = tmp_path / "t.parquet"
    pq.write_table(generate(100, seed=1), p)
    table, info = load_jobs(p, "auto", None)
    assert table.num_rows == 100
    assert info.format == "parquet"
    assert info.sources == ["synth"]


def test_load_jobs_refuses_a_missing_file_and_both_inputs(tmp_path: Path) -> None:
    with pytest.raises(typer.Exit):
        load_jobs(tmp_path / "none.json", "auto", None)
    with pytest.raises(typer.Exit):
        load_jobs(tmp_path / "none.json", "auto", tmp_path / "db.duckdb")


def test_load_jobs_reads_the_philly_sample(shared_traces: Path) -> None:
    _table, info = load_jobs(shared_traces / "philly-dre" / "philly_jobs.json", "auto", None)
    assert info.format == "philly"
    assert info.jobs == 5910


def test_explain_groups_passes_into_stretches_and_keeps_the_last_ones() -> None:
    from headway.sim.explain import stretch_rows, wait_segments
    from headway.sim.result import WaitRecord

    def rec(t: float, rank: int, tier: str = "normal", resv: float | None = None) -> WaitRecord:
        return WaitRecord(t, rank, 9, 1.0 / t, f"{tier}; score {1.0 / t:.3g} (waited_h={t / 3600:.3g})", resv)

    recs = [rec(t, 5) for t in range(1, 101)] + [rec(101.0, 2, resv=500.0), rec(102.0, 1, "starved")]
    segs = wait_segments(recs)  # the waited time in every reason does not split a stretch
    assert [len(s) for s in segs] == [100, 1, 1]
    rows = stretch_rows(recs)
    assert [r[2] for r in rows] == ["100", "1", "1"] and rows[0][3] == "5/9->5/9"
    assert rows[1][4] != "-" and rows[2][5].startswith("starved")
    # Many stretches: the first and the last are shown, so the pass that ended the wait is there.
    many = [rec(float(t), 3, "normal" if t % 2 else "held") for t in range(1, 200)]
    rows = stretch_rows(many, most=40)
    assert len(rows) == 41 and rows[15] == ("...", "", "", "", "", "159 more stretches")
    assert rows[-1][5] == many[-1].reason and rows[0][5] == many[0].reason
