"""`simulate --class-mix`: the spec's parse errors, a seeded draw that respects GPU ranges, and the
preemption metrics the JSON report gives per policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.sim.classmix import DEFAULT_MIX, apply_mix, parse_mix
from headway.sim.synth import generate

runner = CliRunner()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("vip=5%", "cannot read 'vip=5%'"),
        ("urgent=5", "cannot read 'urgent=5'"),
        ("urgent=60%,low=50%", "add up to 110%"),
        ("urgent=5%@64-16", "the GPU range is empty"),
    ],
)
def test_a_bad_spec_says_which_entry_is_at_fault(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mix(spec)


def test_default_is_urgent_gangs_and_preemptible_low_jobs() -> None:
    urgent, low = parse_mix("default")
    assert (urgent.klass, urgent.share, urgent.gpus_min, urgent.gpus_max, urgent.preemptible) == (
        "urgent",
        0.05,
        16.0,
        64.0,
        False,
    )
    assert (low.klass, low.share, low.preemptible) == ("low", 0.2, True)
    assert parse_mix(DEFAULT_MIX) == [urgent, low]


def gangs(n: int = 400) -> pa.Table:
    """A trace with every GPU count from 1 to 64 represented."""
    t = generate(n, seed=3)
    sizes = [float([1, 2, 4, 8, 16, 32, 64][i % 7]) for i in range(n)]
    return t.set_column(t.schema.get_field_index("gpus"), "gpus", pa.array(sizes, pa.float64()))


def drawn(t: pa.Table) -> list[tuple[str, bool]]:
    return list(zip(t.column("priority_class").to_pylist(), t.column("preemptible").to_pylist(), strict=True))


def test_the_default_draw_is_reproducible_for_a_seed_and_changes_with_it() -> None:
    t = gangs()
    a, sa = apply_mix(t, "default", 1)
    b, _ = apply_mix(t, "default", 1)
    c, _ = apply_mix(t, "default", 2)
    assert drawn(a) == drawn(b) and drawn(a) != drawn(c)
    assert sa.counts == {"urgent": 20, "low": 80, "normal": 300}
    assert sa.preemptible == 80 and sa.short == {}


def test_entries_take_only_jobs_within_their_gpu_range() -> None:
    t, summary = apply_mix(gangs(), "urgent=5%@16-64,high=10%@1-2,low=20%:preemptible", 0)
    for klass, pre, g in zip(
        t.column("priority_class").to_pylist(),
        t.column("preemptible").to_pylist(),
        t.column("gpus").to_pylist(),
        strict=True,
    ):
        if klass == "urgent":
            assert 16 <= g <= 64 and not pre
        if klass == "high":
            assert 1 <= g <= 2 and not pre
        assert pre == (klass == "low")
    assert summary.counts["urgent"] == 20 and summary.counts["high"] == 40


def test_an_entry_with_too_few_jobs_in_its_range_takes_them_all_and_says_so() -> None:
    t = gangs(70)  # 10 jobs of each size: 10 of 64 GPUs, fewer than 50% of 70
    _, summary = apply_mix(t, "urgent=50%@64-64", 0)
    assert summary.counts["urgent"] == 10
    assert summary.short == {"urgent=50%": 10}
    assert summary.as_dict()["short_of_share"] == {"urgent=50%": 10}


# --- end to end ------------------------------------------------------------------------------------------

CLUSTER = ["--nodes", "4", "--gpus-per-node", "8", "--nodes-per-rack", "2"]
METRICS = (
    "urgent_queue_delay_mean",
    "urgent_queue_delay_p95",
    "preempted_gpu_hours",
    "failure_signal_delay_mean",
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = generate(300, seed=5)
    sizes = [float([1, 1, 2, 4, 8, 16][i % 6]) for i in range(t.num_rows)]
    t = t.set_column(t.schema.get_field_index("gpus"), "gpus", pa.array(sizes, pa.float64()))
    p = tmp_path_factory.mktemp("mix") / "trace.parquet"
    pq.write_table(t, p)
    return p


def simulate(trace: Path, *extra: str) -> dict[str, Any]:
    res = runner.invoke(
        app,
        [
            "simulate",
            str(trace),
            *CLUSTER,
            "--policy",
            "impact,multifactor-preempt",
            "--load",
            "1.0",
            "--class-mix",
            "default",
            "--json",
            *extra,
        ],
    )
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_simulate_reports_the_preemption_metrics_per_policy_and_the_mix(trace: Path) -> None:
    doc = simulate(trace)
    assert list(doc["policies"]) == ["impact", "multifactor-preempt"]
    for m in doc["policies"].values():
        for name in METRICS:
            assert name in m, name
        assert m["jobs_urgent"] == doc["class_mix"]["jobs_per_class"]["urgent"] > 0
        assert m["urgent_queue_delay_mean"] >= 0 and m["urgent_queue_delay_p95"] >= 0
        assert m["preempted_gpu_hours"] >= 0 and m["failure_signal_delay_mean"] > 0
    mix = doc["class_mix"]
    assert mix["seed"] == 0 and mix["preemptible_jobs"] == mix["jobs_per_class"]["low"] > 0
    assert doc["preemption"] is True
    assert doc["policies"]["multifactor-preempt"]["preempted_gpu_hours"] > 0


def test_no_preemption_gives_impact_no_preempted_gpu_hours(trace: Path) -> None:
    doc = simulate(trace, "--no-preemption")
    assert doc["preemption"] is False
    assert doc["policies"]["impact"]["preempted_gpu_hours"] == 0


def test_a_bad_mix_fails_with_the_parse_message(trace: Path) -> None:
    res = runner.invoke(app, ["simulate", str(trace), *CLUSTER, "--class-mix", "vip=5%", "--json"])
    assert res.exit_code != 0
    assert "cannot read 'vip=5%'" in res.output
