"""P(complete | ran t) and the expected remaining runtime: the mixture of two log-normals that impact's
preemption and reservation planning read (policy/survival.py)."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from headway.policy.factors import Z90
from headway.policy.survival import FAILURE_SIGMA, expected_remaining, p_complete_after

HOUR = 3600.0


def arr(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float64)


def one(f: object, t: float, p: float, r: float, r90: float, fail: float) -> float:
    """The function at one job's values, as a plain float."""
    out = f(arr(t), arr(p), arr(r), arr(r90), arr(fail))  # type: ignore[operator]
    return float(np.asarray(out)[0])


def test_a_job_that_has_not_run_keeps_its_predicted_chance() -> None:
    p = arr(0.0, 0.1, 0.5, 0.9, 1.0)
    n = len(p)
    got = p_complete_after(np.zeros(n), p, np.full(n, HOUR), np.full(n, 2 * HOUR), np.full(n, 600.0))
    assert np.allclose(got, p)


def test_surviving_past_early_failures_makes_completion_more_likely() -> None:
    """Failures come early (F = 60 s, R = 1 h): each minute survived rules out more of them."""
    t = arr(0, 30, 60, 300, 1200, 3000)
    n = len(t)
    got = p_complete_after(t, np.full(n, 0.5), np.full(n, HOUR), np.full(n, 2 * HOUR), np.full(n, 60.0))
    assert np.all(np.diff(got) > 0)
    assert got[0] == pytest.approx(0.5) and got[-1] > 0.99


def test_running_far_past_the_typical_runtime_makes_a_late_failure_more_likely() -> None:
    """Success runs take ~1 min, failures ~10 h: a job still going after an hour is likely failing."""
    t = arr(0, 60, 600, 3600)
    n = len(t)
    got = p_complete_after(t, np.full(n, 0.9), np.full(n, 60.0), np.full(n, 120.0), np.full(n, 10 * HOUR))
    assert np.all(np.diff(got) < 0)
    assert got[-1] < 0.01


def test_certain_outcomes_stay_certain_whatever_the_job_has_run() -> None:
    t = arr(0, 10, 1e4, 1e8)
    n = len(t)
    r, r90, f = np.full(n, HOUR), np.full(n, 2 * HOUR), np.full(n, 60.0)
    assert np.all(p_complete_after(t, np.ones(n), r, r90, f) == 1.0)
    assert np.all(p_complete_after(t, np.zeros(n), r, r90, f) == 0.0)


def test_expected_remaining_at_the_start_is_the_mixture_mean() -> None:
    """At t = 0 the job has survived nothing: p E[R] + (1 - p) E[F] of the two log-normals (R through
    its median and p90, F through its median with the failure spread)."""
    p, r, r90, f = 0.7, HOUR, 3 * HOUR, 900.0
    sigma_r = math.log(r90 / r) / Z90
    mean_r = r * math.exp(0.5 * sigma_r**2)
    mean_f = f * math.exp(0.5 * FAILURE_SIGMA**2)
    want = p * mean_r + (1 - p) * mean_f
    assert one(expected_remaining, 0.0, p, r, r90, f) == pytest.approx(want, rel=1e-9)


def test_unknown_predictions_give_unknown_answers() -> None:
    nan = math.nan
    for p, r, f in [(nan, HOUR, 60.0), (0.5, nan, 60.0), (0.5, HOUR, nan)]:
        assert math.isnan(one(p_complete_after, 100.0, p, r, 2 * HOUR, f))
        assert math.isnan(one(expected_remaining, 100.0, p, r, 2 * HOUR, f))


def test_an_unknown_p90_falls_back_to_the_default_spread() -> None:
    got = one(expected_remaining, 100.0, 0.5, HOUR, math.nan, 60.0)
    assert math.isfinite(got) and got > 0


def test_remaining_stays_positive_and_finite_far_in_the_tail() -> None:
    """Past every plausible end (1e5..1e9 s on a 1 h job) the mean residual is computed in log space:
    never negative, never NaN, never below a second."""
    t = arr(1e5, 1e6, 1e7, 1e9)
    n = len(t)
    for p in (0.0, 0.3, 1.0):
        rem = expected_remaining(t, np.full(n, p), np.full(n, HOUR), np.full(n, 2 * HOUR), np.full(n, 600.0))
        assert np.all(np.isfinite(rem)) and np.all(rem >= 1.0)


def test_a_job_past_its_runtime_is_expected_to_run_on_by_a_share_of_what_it_ran() -> None:
    """Heavy-tailed runtimes: the longer it has run, the longer it is still expected to run."""
    t = arr(2 * HOUR, 4 * HOUR, 16 * HOUR)
    n = len(t)
    rem = expected_remaining(t, np.ones(n), np.full(n, HOUR), np.full(n, 4 * HOUR), np.full(n, 600.0))
    assert np.all(np.diff(rem) > 0)


@settings(max_examples=200, deadline=None)
@given(
    t=st.floats(0, 1e8),
    p=st.floats(0, 1),
    r=st.floats(1, 1e6),
    spread=st.floats(1, 100),
    f=st.floats(1, 1e6),
)
def test_the_chance_is_a_probability_and_the_remaining_time_at_least_a_second(
    t: float, p: float, r: float, spread: float, f: float
) -> None:
    pc = one(p_complete_after, t, p, r, r * spread, f)
    rem = one(expected_remaining, t, p, r, r * spread, f)
    assert 0.0 <= pc <= 1.0
    assert math.isfinite(rem) and rem >= 1.0 - 1e-9
