"""The synthetic trace generator: schema, determinism, and calibration to the real traces' statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from headway.schema import JOB_SCHEMA, WASTE_STATES, with_derived
from headway.sim.synth import PROFILES, generate, write_sacct


def stats(table: pa.Table) -> dict[str, float]:
    d = with_derived(table)
    rt_min = np.asarray(d.column("runtime").to_numpy(zero_copy_only=False)) / 60.0
    state = np.asarray(d.column("state").to_pylist(), dtype=object)
    failed = np.isin(state, [s.value for s in WASTE_STATES])
    submit = np.asarray(d.column("submit_time").cast(pa.int64()).to_numpy()) / 1e6
    return {
        "failed_share": float(failed.mean()),
        "median_failed": float(np.median(rt_min[failed])),
        "median_passed": float(np.median(rt_min[~failed])),
        "early_share": float((rt_min[failed] < 10).mean()),
        "mean_interarrival": float(np.diff(submit).mean()),
    }


def test_generate_returns_the_job_schema_sorted_by_submit() -> None:
    t = generate(5_000, seed=1)
    assert t.schema.equals(JOB_SCHEMA)
    assert t.num_rows == 5_000
    sub = t.column("submit_time").cast(pa.int64()).to_numpy()
    assert np.all(np.diff(sub) >= 0)
    assert pc.all(pc.greater_equal(t.column("end_time"), t.column("start_time"))).as_py()
    assert pc.all(pc.greater_equal(t.column("start_time"), t.column("submit_time"))).as_py()
    assert len(set(t.column("job_id").to_pylist())) == 5_000


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    assert generate(2_000, seed=7).equals(generate(2_000, seed=7))
    assert not generate(2_000, seed=7).equals(generate(2_000, seed=8))


def test_tiny_and_empty_traces() -> None:
    assert generate(0).num_rows == 0
    assert generate(1, seed=3).num_rows == 1
    with pytest.raises(ValueError):
        generate(-1)


@pytest.mark.parametrize("seed", [0, 1])
def test_philly_profile_lands_near_its_calibration_targets(seed: int) -> None:
    cal = PROFILES["philly"].calibration
    s = stats(generate(100_000, seed=seed, profile="philly"))
    assert s["failed_share"] == pytest.approx(cal.failed_share, abs=0.02)
    assert s["median_failed"] == pytest.approx(cal.median_runtime_failed_min, rel=0.12)
    assert s["median_passed"] == pytest.approx(cal.median_runtime_passed_min, rel=0.12)
    assert s["early_share"] == pytest.approx(cal.early_failure_share, abs=0.03)
    assert cal.mean_interarrival_s is not None
    assert s["mean_interarrival"] == pytest.approx(cal.mean_interarrival_s, rel=0.1)


def test_alibaba_profile_fails_early_like_alibaba() -> None:
    cal = PROFILES["alibaba"].calibration
    s = stats(generate(100_000, seed=2, profile="alibaba"))
    assert s["early_share"] == pytest.approx(cal.early_failure_share, abs=0.03)
    assert s["median_failed"] == pytest.approx(cal.median_runtime_failed_min, rel=0.25)
    assert s["median_passed"] == pytest.approx(cal.median_runtime_passed_min, rel=0.12)


def test_users_differ_in_failure_propensity() -> None:
    d = generate(50_000, seed=4, users=100).to_pandas()
    rate = d.assign(f=d.state != "COMPLETED").groupby("user").f.mean()
    # U-shaped Beta: some users almost always fail, others almost never.
    assert (rate < 0.15).sum() >= 5
    assert (rate > 0.85).sum() >= 5


def test_bursts_repeat_a_users_job_seconds_apart() -> None:
    d = generate(20_000, seed=5).to_pandas()
    gap = d.submit_time.diff().dt.total_seconds()
    same = (d.user == d.user.shift()) & (d.name == d.name.shift()) & (d.gpus == d.gpus.shift())
    assert (same & (gap < 60)).mean() > 0.15


def test_gpu_counts_are_heavy_on_small_jobs_with_rare_large_ones() -> None:
    g = generate(50_000, seed=6).column("gpus").to_numpy()
    assert set(np.unique(g)) <= {1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0}
    assert (g <= 8).mean() > 0.9
    assert (g >= 32).sum() > 0


def test_runtimes_are_heavy_tailed() -> None:
    d = with_derived(generate(50_000, seed=8))
    rt = np.asarray(d.column("runtime").to_numpy(zero_copy_only=False))
    assert np.percentile(rt, 99) / np.median(rt) > 20


def test_timeouts_run_to_their_limit() -> None:
    d = with_derived(generate(50_000, seed=9)).to_pandas()
    to = d[d.state == "TIMEOUT"]
    assert len(to) > 0
    assert np.allclose(to.runtime, to.time_limit)
    ok = d[d.state == "COMPLETED"]
    assert (ok.runtime <= ok.time_limit).all()


def test_sacct_output_has_one_line_per_job(tmp_path: Path) -> None:
    t = generate(50, seed=1)
    out = tmp_path / "jobs.txt"
    write_sacct(t, str(out))
    lines = out.read_text().splitlines()
    assert lines[0].startswith("JobID|JobName|User|")
    assert len(lines) == 51
    first = lines[1].split("|")
    assert first[0] == t.column("job_id")[0].as_py()
    assert first[5] == t.column("state")[0].as_py()


def test_sacct_refuses_fractional_gpus(tmp_path: Path) -> None:
    t = generate(2_000, seed=1, profile="alibaba")
    with pytest.raises(ValueError, match="fractional"):
        write_sacct(t, str(tmp_path / "x.txt"))
