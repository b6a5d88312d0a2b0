"""What a job that has already run for t seconds will still do: P(complete | ran t), expected remaining.

The predictor gives, per job, p (the chance to complete), the median R and 90th percentile R90 of its
runtime if it completes, and the median F of its time to failure if it does not. Read as a mixture of
two log-normals (the success runtime through R and R90; the failure time through F with spread
`FAILURE_SIGMA`), a job still running at t has survived every failure that would have come before t:

    P(complete | ran t) = p S_R(t) / (p S_R(t) + (1 - p) S_F(t))

with S the survival function of each part, and its expected remaining runtime is the mixture's mean
residual life at t. A job whose failures come early grows more likely to complete the longer it runs;
one past its typical runtime is expected to run on by a share of what it has run. Unknown predictions
(NaN) give NaN: the callers choose what an unknown means for them.
"""

from __future__ import annotations

import math

import numpy as np

from headway.policy.factors import Z90
from headway.policy.snapshot import F64

# Spread (log-space sigma) of the time to failure around its predicted median: the predictor gives a
# median only. 1.0 puts the middle 80% of failures between 0.28x and 3.6x the median.
FAILURE_SIGMA = 1.0
DEFAULT_SIGMA = 1.0  # the success runtime's spread where R90 is unknown
_MIN_SIGMA, _MAX_SIGMA = 0.05, 3.0
_MIN_REMAINING = 1.0  # seconds: a running job is never expected to end in the past


_ERFC = np.frompyfunc(math.erfc, 1, 1)
_TAIL = -20.0  # below this, erfc underflows toward 0: the asymptotic series instead
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def log_ndtr(x: F64) -> F64:
    """log of the standard normal CDF, accurate far into the lower tail (numpy has no erfc, and
    scipy's import alone costs every process that imports a policy 0.75 s)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    tail = x < _TAIL
    body = ~tail
    with np.errstate(divide="ignore"):
        out[body] = np.log(0.5 * np.asarray(_ERFC(-x[body] / math.sqrt(2.0)), dtype=np.float64))
    xt = x[tail]
    out[tail] = -0.5 * xt * xt - np.log(-xt) - _HALF_LOG_2PI + np.log1p(-1.0 / xt**2 + 3.0 / xt**4)
    return out


def _sigma(r: F64, r90: F64) -> F64:
    s = np.log(np.fmax(r90, r) / r) / Z90
    return np.clip(np.where(np.isfinite(s), s, DEFAULT_SIGMA), _MIN_SIGMA, _MAX_SIGMA)


def _log_survival(t: F64, mu: F64, sigma: F64 | float) -> F64:
    """log S(t) of a log-normal(mu, sigma); 0 at t <= 0."""
    z = (np.log(np.maximum(t, 1e-9)) - mu) / sigma
    return np.where(t > 0, log_ndtr(-z), 0.0)


def _mean_residual(t: F64, mu: F64, sigma: F64 | float) -> F64:
    """E[X - t | X > t] of a log-normal, computed in log space (stable far into the tail)."""
    lt = np.log(np.maximum(t, 1e-9))
    log_tail_mean = mu + 0.5 * sigma * sigma + log_ndtr((mu + sigma * sigma - lt) / sigma)
    ratio = np.exp(log_tail_mean - _log_survival(t, mu, sigma))
    return np.maximum(ratio - np.maximum(t, 0.0), _MIN_REMAINING)


def _weights(t: F64, p: F64, r: F64, r90: F64, f: F64) -> tuple[F64, F64, F64, F64]:
    """(P(complete | ran t), mu_R, sigma_R, mu_F): the mixture's weights given survival to t."""
    t = np.asarray(t, dtype=np.float64)
    mu_r, s_r, mu_f = np.log(r), _sigma(r, r90), np.log(f)
    pc = np.clip(p, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lw_r = np.log(pc) + _log_survival(t, mu_r, s_r)
        lw_f = np.log1p(-pc) + _log_survival(t, mu_f, FAILURE_SIGMA)
        out = np.exp(lw_r - np.logaddexp(lw_r, lw_f))
    # p of exactly 0 or 1 stays there; a NaN anywhere in the inputs stays unknown
    out = np.where(pc >= 1.0, 1.0, np.where(pc <= 0.0, 0.0, out))
    unknown = np.isnan(p) | np.isnan(r) | np.isnan(f)
    return np.where(unknown, np.nan, out), mu_r, s_r, mu_f


def p_complete_after(t: F64, p: F64, r: F64, r90: F64, f: F64) -> F64:
    """P(complete | ran t) per job (t in seconds of its own run time so far)."""
    return _weights(t, p, r, r90, f)[0]


def expected_remaining(t: F64, p: F64, r: F64, r90: F64, f: F64) -> F64:
    """Expected seconds still to run, given the job has run t without ending."""
    w, mu_r, s_r, mu_f = _weights(t, p, r, r90, f)
    t = np.asarray(t, dtype=np.float64)
    rem_r = _mean_residual(t, mu_r, s_r)
    with np.errstate(invalid="ignore"):
        rem_f = _mean_residual(t, mu_f, FAILURE_SIGMA)
        out = w * rem_r + (1.0 - w) * np.where(np.isfinite(rem_f), rem_f, 0.0)
    return np.asarray(out, dtype=np.float64)
