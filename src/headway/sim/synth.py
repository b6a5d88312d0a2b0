"""Synthetic GPU-cluster job logs for scale tests, calibrated to public GPU-cluster traces (Philly, Alibaba).

Everything is vectorised numpy so a million jobs take a few seconds. The shape of a trace:

- submissions come in bursts (a user's sweep: several jobs with the same name and size, seconds apart);
  bursts arrive as a Poisson process whose rate gives the profile's mean inter-arrival time per job;
- users differ a lot in activity (lognormal weights) and in how often their jobs fail (a Beta-distributed
  failure propensity per user, U-shaped as in Philly: many users almost never fail, many almost always do);
- a share of failures are early (within minutes: bad config, import error, OOM at start); the rest fail
  after a heavy-tailed time; successful runtimes are lognormal with a Pareto tail;
- GPU counts follow the profile's weights; time limits round a padded runtime up to the usual wall-time
  values, and a share of late failures are timeouts that hit their limit.

Calibration targets (the numbers the generated statistics must land near, checked by tests/test_synth.py)
come from the traces' published statistics and from measurements on those files:
Philly (Jeon et al., ATC '19; DRE re-published sample): failed = 46.3% of jobs, median runtime 179 min for
failed vs 558 min for passed jobs, 11.5% of failures within 10 min, mean inter-arrival 1,257 s,
per-user failure rate mean 0.49 with standard deviation 0.35, GPU counts as in that sample.
Alibaba (Weng et al., ATC '23, cluster-trace-gpu-v2023): 71% of failures within 10 min, failed pods'
median runtime 3.6 min against 65.7 min for succeeded ones.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA

# Wall-time limits users typically pick (seconds): a padded runtime is rounded up to one of these.
_LIMITS = np.array(
    [3600, 4 * 3600, 12 * 3600, 24 * 3600, 48 * 3600, 72 * 3600, 7 * 86400, 14 * 86400, 30 * 86400]
)
_CLASSES = pa.array(["low", "normal", "high", "urgent"])
_STATES = pa.array(["COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT"])


@dataclass(frozen=True, slots=True)
class Calibration:
    """What a profile is calibrated to, with the source of each figure (checked by the tests)."""

    source: str
    failed_share: float  # waste-class jobs / all jobs
    median_runtime_failed_min: float
    median_runtime_passed_min: float
    early_failure_share: float  # failures within 10 minutes / failures
    mean_interarrival_s: float | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    """Knobs of the generator; the two named profiles below set them to match a real trace."""

    name: str
    calibration: Calibration
    gpu_weights: dict[float, float]
    mean_interarrival_s: float
    burst_mean: float = 1.5  # mean jobs per burst (geometric); Philly: 25% of gaps < 19 s
    burst_gap_s: float = 15.0  # mean seconds between jobs of one burst
    user_activity_sigma: float = 1.6  # lognormal sigma of users' activity weights
    fail_beta: tuple[float, float] = (0.45, 0.52)  # per-user failure propensity ~ Beta(a, b)
    early_failure_share: float = 0.115
    early_failure_median_s: float = 180.0
    late_failure_median_s: float = 300 * 60.0
    late_failure_sigma: float = 1.5
    passed_median_s: float = 558 * 60.0
    passed_sigma: float = 2.0
    pareto_share: float = 0.03  # share of passed jobs drawn from the Pareto tail instead
    pareto_alpha: float = 1.3
    max_runtime_s: float = 30 * 86400.0
    min_runtime_s: float = 10.0
    timeout_share: float = 0.08  # share of late failures that are TIMEOUTs at their limit
    oom_share: float = 0.15  # share of early failures that are OUT_OF_MEMORY
    class_weights: tuple[float, float, float, float] = (0.1, 0.8, 0.08, 0.02)
    fractional_share: float = 0.0  # share of 1-GPU jobs asking for a fraction of a GPU
    tags: dict[str, str] = field(default_factory=dict)


PHILLY_CALIBRATION = Calibration(
    source="Philly DRE sample (Jeon et al. ATC '19)",
    failed_share=0.463,
    median_runtime_failed_min=179.0,
    median_runtime_passed_min=558.0,
    early_failure_share=0.115,
    mean_interarrival_s=1257.0,
)
ALIBABA_CALIBRATION = Calibration(
    source="Alibaba cluster-trace-gpu-v2023 (Weng et al. ATC '23)",
    failed_share=0.463,  # Alibaba's pod phases do not give a usable failure share; keep Philly's
    median_runtime_failed_min=3.6,
    median_runtime_passed_min=65.7,
    early_failure_share=0.71,
)

PROFILES: dict[str, Profile] = {
    "philly": Profile(
        name="philly",
        calibration=PHILLY_CALIBRATION,
        # GPU counts of the Philly sample (2: 8.6%, 4: 43.5%, 8: 40.0%, 16: 5.7%, 32+: 2.2%), plus
        # single-GPU jobs, which the re-publisher filtered out but real clusters run most of.
        gpu_weights={1: 0.30, 2: 0.06, 4: 0.30, 8: 0.28, 16: 0.04, 32: 0.014, 64: 0.004, 128: 0.002},
        mean_interarrival_s=1257.0,
        # A failed job is early (minutes) or late: the late part's median sets the failed median to 179 min.
        early_failure_share=0.115,
        early_failure_median_s=240.0,
        late_failure_median_s=240 * 60.0,
        late_failure_sigma=1.6,
        passed_median_s=520 * 60.0,
        passed_sigma=2.1,
    ),
    "alibaba": Profile(
        name="alibaba",
        calibration=ALIBABA_CALIBRATION,
        # Alibaba v2023 pods: 1 GPU 98.9%, 2: 0.2%, 4: 0.2%, 8: 0.6%; half ask for a GPU share.
        gpu_weights={1: 0.989, 2: 0.002, 4: 0.003, 8: 0.006},
        mean_interarrival_s=300.0,
        early_failure_share=0.69,
        early_failure_median_s=150.0,
        late_failure_median_s=60 * 60.0,
        late_failure_sigma=1.5,
        passed_median_s=62 * 60.0,
        passed_sigma=1.8,
        fractional_share=0.5,
    ),
}


def _gpu_sizes(p: Profile) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    sizes = np.array(list(p.gpu_weights), dtype=np.float64)
    w = np.array(list(p.gpu_weights.values()), dtype=np.float64)
    return sizes, w / w.sum()


def _calibrated(
    prop: npt.NDArray[np.float64], weight: npt.NDArray[np.float64], target: float
) -> npt.NDArray[np.float64]:
    """Shift users' propensities (in logit space) so the activity-weighted failure share hits `target`.

    With a few very active users, the raw Beta draws would make the trace's failure share swing by tens
    of points between seeds; the shift keeps the U shape and the spread between users.
    """
    logit = np.log(np.clip(prop, 1e-6, 1 - 1e-6) / np.clip(1 - prop, 1e-6, 1.0))
    w = weight / weight.sum()
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        share = float(np.dot(w, 1.0 / (1.0 + np.exp(-(logit + mid)))))
        lo, hi = (mid, hi) if share < target else (lo, mid)
    out: npt.NDArray[np.float64] = 1.0 / (1.0 + np.exp(-(logit + (lo + hi) / 2)))
    return out


def generate(
    n: int,
    seed: int = 0,
    *,
    users: int = 160,
    profile: str | Profile = "philly",
    start: dt.datetime | None = None,
    mean_interarrival_s: float | None = None,
    source: str = "synth",
) -> pa.Table:
    """`n` synthetic ended jobs in JOB_SCHEMA, sorted by submit time; same seed, same table."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if users < 1:
        raise ValueError("users must be >= 1")
    p = PROFILES[profile] if isinstance(profile, str) else profile
    if mean_interarrival_s is not None:
        p = replace(p, mean_interarrival_s=mean_interarrival_s)
    rng = np.random.default_rng(seed)
    t0 = start or dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    # The steps draw from `rng` in this order; the same seed gives the same table only if it stays so.
    burst_of, submit = _submissions(rng, p, n)
    activity, user, gpus, pclass, name_idx = _burst_traits(rng, p, users, burst_of)
    failed, early, runtime = _outcomes(rng, p, activity, user)
    limit, runtime, state, exit_code = _time_limits(rng, p, runtime, failed, early)
    wait = np.round(rng.lognormal(np.log(60.0), 1.5, n))  # a logged wait (the simulator computes its own)
    jobs = _Jobs(user, gpus, pclass, name_idx, submit, wait, runtime, limit, state, exit_code)
    return _table(jobs, users, t0, source)


@dataclass(frozen=True, slots=True)
class _Jobs:
    """The generated jobs' columns, in generation order."""

    user: npt.NDArray[np.int64]  # user index
    gpus: npt.NDArray[np.float64]
    pclass: npt.NDArray[np.int64]  # index into _CLASSES
    name_idx: npt.NDArray[np.int64]  # the user's n-th recurring job name
    submit: npt.NDArray[np.float64]  # seconds from the start
    wait: npt.NDArray[np.float64]
    runtime: npt.NDArray[np.float64]
    limit: npt.NDArray[np.int64]
    state: npt.NDArray[np.int64]  # index into _STATES
    exit_code: npt.NDArray[np.int32]


def _submissions(
    rng: np.random.Generator, p: Profile, n: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(burst of each job, submit seconds): geometric burst sizes, bursts as a Poisson process whose rate
    gives the profile's mean inter-arrival time per job, jobs of a burst seconds apart."""
    sizes = rng.geometric(1.0 / max(p.burst_mean, 1.0), size=max(n, 1))
    ends = np.cumsum(sizes)
    n_bursts = int(np.searchsorted(ends, n) + 1) if n else 0
    sizes = sizes[:n_bursts]
    if n_bursts:
        sizes[-1] -= int(ends[n_bursts - 1] - n)
    burst_of = np.repeat(np.arange(n_bursts), sizes)
    first_of_burst = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if n_bursts else np.zeros(0, np.int64)

    burst_gap = rng.exponential(p.mean_interarrival_s * max(sizes.mean() if n_bursts else 1.0, 1.0), n_bursts)
    burst_t = np.cumsum(burst_gap) - (burst_gap[0] if n_bursts else 0.0)
    in_gap = rng.exponential(p.burst_gap_s, n)
    in_gap[first_of_burst] = 0.0
    csum = np.cumsum(in_gap)
    offset = csum - csum[first_of_burst][burst_of] if n else csum
    return burst_of, burst_t[burst_of] + offset


def _burst_traits(
    rng: np.random.Generator, p: Profile, users: int, burst_of: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[Any], ...]:
    """(users' activity weights, then per job: user, GPUs, priority class, name index). A burst's jobs
    share all four, but for the profile's share of fractional GPUs, drawn per job."""
    n, n_bursts = len(burst_of), int(burst_of[-1]) + 1 if len(burst_of) else 0
    activity = rng.lognormal(0.0, p.user_activity_sigma, users)
    burst_user = rng.choice(users, size=n_bursts, p=activity / activity.sum())
    gpu_sizes, gpu_w = _gpu_sizes(p)
    gpus = gpu_sizes[rng.choice(len(gpu_sizes), size=n_bursts, p=gpu_w)][burst_of]
    if p.fractional_share > 0:
        frac = (gpus == 1.0) & (rng.random(n) < p.fractional_share)
        gpus = np.where(frac, rng.choice(np.array([0.25, 0.5, 0.75]), size=n), gpus)
    cls_w = np.array(p.class_weights) / sum(p.class_weights)
    pclass = rng.choice(len(_CLASSES), size=n_bursts, p=cls_w)[burst_of]
    name_idx = rng.geometric(0.3, size=n_bursts)[burst_of]  # a few recurring names per user
    return activity, burst_user[burst_of], gpus, pclass, name_idx


def _outcomes(
    rng: np.random.Generator, p: Profile, activity: npt.NDArray[np.float64], user: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    """(failed, failed early, runtime): failures from a per-user propensity, early (minutes) or late;
    heavy-tailed successful runtimes."""
    n = len(user)
    propensity = _calibrated(rng.beta(*p.fail_beta, size=len(activity)), activity, p.calibration.failed_share)
    failed = rng.random(n) < propensity[user]
    early = failed & (rng.random(n) < p.early_failure_share)
    late = failed & ~early
    runtime = np.empty(n)
    runtime[early] = np.minimum(rng.lognormal(np.log(p.early_failure_median_s), 0.8, int(early.sum())), 600.0)
    runtime[late] = rng.lognormal(np.log(p.late_failure_median_s), p.late_failure_sigma, int(late.sum()))
    passed = ~failed
    n_pass = int(passed.sum())
    body = rng.lognormal(np.log(p.passed_median_s), p.passed_sigma, n_pass)
    tail = p.passed_median_s * (1.0 + rng.pareto(p.pareto_alpha, n_pass))
    runtime[passed] = np.where(rng.random(n_pass) < p.pareto_share, tail, body)
    return failed, early, np.clip(np.round(runtime), p.min_runtime_s, p.max_runtime_s)


def _time_limits(
    rng: np.random.Generator,
    p: Profile,
    runtime: npt.NDArray[np.float64],
    failed: npt.NDArray[np.bool_],
    early: npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[Any], ...]:
    """(time limit, runtime, state, exit code): the runtime padded by 1.2-4x, rounded up to a usual limit;
    a share of late failures are timeouts that hit theirs (their runtime becomes it), a share of early
    ones out-of-memory kills."""
    n = len(runtime)
    late = failed & ~early
    padded = runtime * rng.uniform(1.2, 4.0, n)
    li = np.minimum(np.searchsorted(_LIMITS, padded), len(_LIMITS) - 1)
    limit = _LIMITS[li].astype(np.int64)
    timeout = late & (rng.random(n) < p.timeout_share)
    limit = np.where(timeout, _LIMITS[np.maximum(np.searchsorted(_LIMITS, runtime) - 1, 0)], limit)
    runtime = np.where(timeout, limit.astype(np.float64), np.minimum(runtime, limit))
    oom = early & (rng.random(n) < p.oom_share)
    # State codes index _STATES: 0 COMPLETED, 1 FAILED, 2 OUT_OF_MEMORY, 3 TIMEOUT.
    state = np.zeros(n, dtype=np.int64)
    state[failed] = 1
    state[oom] = 2
    state[timeout] = 3
    exit_code = np.where(~failed, 0, np.where(oom, 137, np.where(timeout, 0, 1))).astype(np.int32)
    return limit, runtime, state, exit_code


def _table(j: _Jobs, users: int, t0: dt.datetime, source: str) -> pa.Table:
    """The jobs as a JOB_SCHEMA table in submit order, with user, group, job and name strings."""
    n = len(j.user)
    order = np.argsort(j.submit, kind="stable")
    base_us = int(t0.timestamp() * 1_000_000)
    sub_us = base_us + np.round(j.submit * 1e6).astype(np.int64)
    start_us = sub_us + (j.wait * 1e6).astype(np.int64)
    end_us = start_us + (j.runtime * 1e6).astype(np.int64)
    user, gpus = j.user[order], j.gpus[order]

    width = max(len(str(users - 1)), 3)
    user_names = pa.array([f"user{u:0{width}d}" for u in range(users)])
    group_names = pa.array([f"team{u % max(users // 8, 1):02d}" for u in range(users)])
    as_str = lambda a: pc.cast(pa.array(a), pa.string())  # noqa: E731 (C++ int->str, fast)
    names = pc.binary_join_element_wise("job-u", as_str(user), as_str(j.name_idx[order]), "-")
    names = pc.replace_substring(names, "job-u-", "job-u")
    ts = pa.timestamp("us", tz="UTC")
    cols = {
        "job_id": pc.binary_join_element_wise(f"{source}", as_str(np.arange(1, n + 1)), "-"),
        "user": pc.take(user_names, pa.array(user)),
        "group": pc.take(group_names, pa.array(user)),
        "name": names,
        "partition": pa.repeat(pa.scalar("gpu"), n),
        "priority_class": pc.take(_CLASSES, pa.array(j.pclass[order])),
        "submit_time": pa.array(sub_us[order], ts),
        "start_time": pa.array(start_us[order], ts),
        "end_time": pa.array(end_us[order], ts),
        "gpus": pa.array(gpus, pa.float64()),
        "nodes": pa.array(np.maximum(np.ceil(gpus / 8.0), 1).astype(np.int32), pa.int32()),
        "cpus": pa.array((np.ceil(gpus) * 8).astype(np.int64), pa.int64()),
        "mem_mb": pa.array((np.ceil(gpus) * 64_000).astype(np.int64), pa.int64()),
        "time_limit": pa.array(j.limit[order], pa.int64()),
        "state": pc.take(_STATES, pa.array(j.state[order])),
        "exit_code": pa.array(j.exit_code[order], pa.int32()),
        "source": pa.repeat(pa.scalar(source), n),
        "preemptible": pa.nulls(n, pa.bool_()),
        "checkpoint_every": pa.nulls(n, pa.int64()),
    }
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)


def write_sacct(table: pa.Table, path: str) -> None:
    """Write jobs as `sacct -a -X -P` text (UTC times) so `headway ingest --format sacct` reads them."""
    gpus = table.column("gpus").to_numpy(zero_copy_only=False)
    if np.any(gpus != np.floor(gpus)):
        raise ValueError("sacct cannot express fractional GPUs; write parquet or csv instead")
    header = (
        "JobID|JobName|User|Account|Partition|State|ExitCode|Submit|Start|End|ElapsedRaw|TimelimitRaw|"
        "AllocTRES|NNodes|NodeList|Priority|QOS|ReqTRES"
    )
    fmt = "%Y-%m-%dT%H:%M:%S"

    def iso(col: str) -> list[str]:
        return [s.replace(" ", "T")[:19] for s in pc.strftime(table.column(col), format=fmt).to_pylist()]

    sub, st, en = iso("submit_time"), iso("start_time"), iso("end_time")
    d = table.select(
        [
            "job_id",
            "name",
            "user",
            "group",
            "partition",
            "state",
            "exit_code",
            "gpus",
            "nodes",
            "cpus",
            "mem_mb",
            "time_limit",
            "priority_class",
        ]
    ).to_pydict()
    el = (
        pc.divide(
            pc.subtract(table.column("end_time"), table.column("start_time")).cast(pa.int64()), 1_000_000
        )
        .cast(pa.int64())
        .to_pylist()
    )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(header + "\n")
        for i in range(table.num_rows):
            g = int(d["gpus"][i])
            nn = d["nodes"][i]
            mem = f"mem={d['mem_mb'][i]}M," if d["mem_mb"][i] is not None else ""
            tres = f"billing={d['cpus'][i]},cpu={d['cpus'][i]},gres/gpu={g},{mem}node={nn}"
            nodelist = "n1" if nn == 1 else f"n[1-{nn}]"
            limit_min = (d["time_limit"][i] + 59) // 60 if d["time_limit"][i] is not None else ""
            fh.write(
                f"{d['job_id'][i]}|{d['name'][i]}|{d['user'][i]}|{d['group'][i]}|{d['partition'][i]}|"
                f"{d['state'][i]}|{d['exit_code'][i]}:0|{sub[i]}|{st[i]}|{en[i]}|{el[i]}|{limit_min}|{tres}|"
                f"{nn}|{nodelist}|1|{d['priority_class'][i]}|{tres}\n"
            )
