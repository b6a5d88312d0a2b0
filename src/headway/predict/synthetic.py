"""A generated job history with learnable structure, for tests and benchmarks of the predictor.

Users differ in reliability, each user's job names (repeats of the same experiment) differ again, users go
through bad spells (a failure makes the next failure likelier), big jobs fail a little more, and runtimes
are log-normal around a per-name median. Nothing here is real data; real-data claims use real traces.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from headway.schema import JOB_SCHEMA

EPOCH_2024 = 1_704_067_200.0


def make_history(n: int, *, seed: int = 0, users: int | None = None, days: float | None = None) -> pa.Table:
    """`n` GPU jobs in JOB_SCHEMA (all ended) over `days` days, deterministic for a given seed."""
    rng = np.random.default_rng(seed)
    n_users = users or max(5, n // 250)
    span = (days or max(7.0, n / 2000.0)) * 86400.0
    user = rng.integers(0, n_users, n)
    user_skill = rng.normal(0.6, 1.0, n_users)
    names_per_user = 8
    name_local = rng.integers(0, names_per_user, n)
    name_id = user * names_per_user + name_local
    name_effect = rng.normal(0.0, 1.0, n_users * names_per_user)
    name_log_rt = rng.normal(8.0, 1.3, n_users * names_per_user)  # median ~ 50 min, wide spread
    gpus = 2.0 ** rng.integers(0, 4, n)
    group = user % max(2, n_users // 10)
    submit = np.sort(rng.uniform(0.0, span, n))
    # A per-user bad spell that drifts slowly in time: makes recent outcomes informative.
    phase = rng.uniform(0, 2 * np.pi, n_users)
    spell = 1.2 * np.sin(submit / (3 * 86400.0) + phase[user])
    logit = user_skill[user] + name_effect[name_id] - 0.25 * np.log2(gpus) + spell
    success = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    log_rt = name_log_rt[name_id] + rng.normal(0.0, 0.35, n)
    # Failures happen early in the run: a fraction of the would-be runtime.
    frac = np.where(success, 1.0, rng.beta(0.7, 2.5, n))
    runtime = np.exp(log_rt) * frac
    wait = rng.exponential(600.0, n)
    start = submit + wait
    end = start + runtime
    time_limit = np.ceil(np.exp(name_log_rt[name_id]) * 2.5 / 900.0) * 900.0
    over = runtime > time_limit
    runtime = np.minimum(runtime, time_limit)
    end = start + runtime
    state = np.where(success & ~over, "COMPLETED", np.where(over, "TIMEOUT", "FAILED"))
    cancelled = rng.random(n) < 0.03
    state = np.where(cancelled, "CANCELLED", state)
    to_us = lambda a: ((EPOCH_2024 + a) * 1e6).astype("int64")  # noqa: E731
    cols = {
        "job_id": pa.array([str(i) for i in range(n)]),
        "user": pa.array([f"u{u}" for u in user.tolist()]),
        "group": pa.array([f"g{g}" for g in group.tolist()]),
        "name": pa.array([f"exp{k}" for k in name_local.tolist()]),
        "partition": pa.array(np.where(gpus >= 8, "big", "gpu").tolist()),
        "priority_class": pa.array(np.where(user % 5 == 0, "high", "normal").tolist()),
        "submit_time": pa.array(to_us(submit), type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "start_time": pa.array(to_us(start), type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "end_time": pa.array(to_us(end), type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "gpus": pa.array(gpus),
        "nodes": pa.array(np.maximum(1, gpus // 8).astype("int32")),
        "cpus": pa.nulls(n, pa.int64()),
        "mem_mb": pa.nulls(n, pa.int64()),
        "time_limit": pa.array(time_limit.astype("int64")),
        "state": pa.array(state.tolist()),
        "exit_code": pa.nulls(n, pa.int32()),
        "source": pa.array(["synthetic"] * n),
        "preemptible": pa.nulls(n, pa.bool_()),
        "checkpoint_every": pa.nulls(n, pa.int64()),
    }
    return pa.Table.from_pydict(cols, schema=JOB_SCHEMA)
