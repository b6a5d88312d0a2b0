"""`run_simulation`: a job table, a cluster and a policy in; a SimResult out (the CLI's entry point)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from headway.policy.inputs import StreakKey, streak_key
from headway.policy.placement import fits_empty, max_nodes_for
from headway.policy.registry import get_policy
from headway.predict.api import EndedJob, OnlinePredictor, Predictions, SubmittedJob
from headway.schema import conform, submit_order
from headway.sim.cluster import Cluster, ClusterSpec
from headway.sim.engine import Engine, EngineOptions, JobArrays, Truth
from headway.sim.result import UNKNOWN_USER, SimResult

NEVER_RAN = "never started or never ended in the trace"
CPU_ONLY = "CPU-only (0 GPUs)"
TOO_BIG = "larger than the cluster"
NO_SUBMIT = "no submit time"
NO_GPUS = "no GPU count in the trace"
REPEATED = "listed again later in the trace (the last listing is replayed, as the store keeps it)"


def copies_of(jobs: pa.Table, n: int) -> pa.Table:
    """The log n times over, for a cluster its own jobs never fill: Alibaba's pods all fit their node
    list at once, so they never queue and no placement can fragment anything (the FGD paper inflates
    that workload the same way). Copy k >= 2 of a job is the same job submitted again at the same time,
    its id suffixed `#k`; `--load` then rescales the arrivals of all of them."""
    if n < 1:
        raise ValueError(f"copies must be at least 1, not {n}")
    if n == 1:
        return jobs
    at = jobs.schema.get_field_index("job_id")
    field, ids = jobs.schema.field(at), jobs.column(at)
    copies = (pc.binary_join_element_wise(ids, f"#{k}", "") for k in range(2, n + 1))
    return pa.concat_tables([jobs, *(jobs.set_column(at, field, c) for c in copies)])


def default_predictor_factory(seed: int = 0) -> OnlinePredictor:
    """The project's online predictor; `seed` shifts the seed of its LightGBM training (row and feature
    sampling), and seed 0 is the predictor's own default."""
    from dataclasses import replace

    from headway.predict.online import ONLINE_CONFIG
    from headway.predict.online import OnlinePredictor as Online

    return Online(config=replace(ONLINE_CONFIG, seed=ONLINE_CONFIG.seed + seed))


class NoPredictor:
    """For a policy that never reads predictions: no model to train, NaN predictions (what the replay
    records as the predictions that policy saw)."""

    def predict(self, jobs: Sequence[SubmittedJob], now: float) -> Predictions:
        nan = np.full(len(jobs), np.nan)
        return Predictions(nan, nan, nan, nan)

    def predict_one(self, job: SubmittedJob, now: float) -> tuple[float, float, float, float]:
        return math.nan, math.nan, math.nan, math.nan

    def observe_end(self, ended: EndedJob) -> None:
        pass

    def maybe_retrain(self, now: float) -> bool:
        return False


def _seconds(col: pa.ChunkedArray) -> np.ndarray:
    arr = col.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return np.asarray(arr, dtype=np.float64) / 1e6


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(
        col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False), dtype=np.float64
    )


def _codes(col: pa.ChunkedArray) -> tuple[npt.NDArray[np.int64], list[Any]]:
    """Each row's value as an integer code (-1 for a null), and the value of each code."""
    enc = pa.compute.dictionary_encode(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))
    codes = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes, enc.dictionary.to_pylist()


def _objects(col: pa.ChunkedArray) -> np.ndarray:
    """Python objects (str, None for a null): what the engine hands to the predictor and the result."""
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)


def _listed_again(t: pa.Table) -> npt.NDArray[np.bool_]:
    """Rows whose (source, job id) comes again further down: the store keeps the last of them. (No Acero
    group-by here: tables a Dask worker unpickles have unaligned buffers, and Acero warns on each.)"""
    n = t.num_rows
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    if pa.compute.count_distinct(t.column("job_id"), mode="all").as_py() == n:
        return out  # no job id twice, so no (source, job id) twice: the usual trace, without the join
    keys = pa.compute.binary_join_element_wise(
        t.column("source").cast(pa.string()), t.column("job_id").cast(pa.string()), "\x1f"
    )
    if pa.compute.count_distinct(keys, mode="all").as_py() == n:
        return out
    seen: set[object] = set()
    for i, k in zip(range(n - 1, -1, -1), reversed(keys.to_pylist()), strict=True):
        out[i] = k in seen
        seen.add(k)
    return out


def prepare(
    jobs: pa.Table, spec: ClusterSpec, *, load: float | None = None, include_cpu: bool = False
) -> tuple[JobArrays, Truth, list[str], dict[str, int], float, float]:
    """Job arrays (sorted by submit time, then source and job id; times in seconds from the first
    arrival), the hidden truth, what was left out and why, the natural load and the load after rescaling."""
    t = conform(jobs)
    keep, counts = _replayable(t, include_cpu)
    excluded = _too_big(t, spec, keep, counts)
    counts = {k: v for k, v in counts.items() if v}
    idx = np.flatnonzero(keep)
    keys = t.select(["source", "job_id"]).take(pa.array(idx))
    order = idx[submit_order(_seconds(t.column("submit_time").take(pa.array(idx))), keys)]
    tt = t.take(pa.array(order))
    submit = _seconds(tt.column("submit_time"))
    runtime = np.maximum(_seconds(tt.column("end_time")) - _seconds(tt.column("start_time")), 0.0)
    g = np.nan_to_num(_floats(tt.column("gpus")), nan=0.0)
    epoch0 = float(submit[0]) if len(submit) else 0.0
    rel, natural, final = _rescaled(submit - epoch0, g, runtime, float(spec.capacity_gpus), load)
    arrays = _job_arrays(tt, rel, g, epoch0)
    truth = Truth(runtime=runtime, state=_objects(tt.column("state")))
    return arrays, truth, excluded, counts, natural, final


def _replayable(t: pa.Table, include_cpu: bool) -> tuple[npt.NDArray[np.bool_], dict[str, int]]:
    """The rows a replay can use, and how many were left out for each reason."""
    has_submit = np.asarray(t.column("submit_time").is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    ran = pa.compute.and_(t.column("start_time").is_valid(), t.column("end_time").is_valid())
    ran_a = np.asarray(ran.to_numpy(zero_copy_only=False), dtype=bool)
    raw_gpus = _floats(t.column("gpus"))
    counts: dict[str, int] = {}
    keep = ~_listed_again(t)
    counts[REPEATED] = int((~keep).sum())
    counts[NO_SUBMIT] = int((keep & ~has_submit).sum())
    keep &= has_submit
    unknown_gpus = keep & np.isnan(raw_gpus)
    counts[NO_GPUS] = int(unknown_gpus.sum())
    keep &= ~unknown_gpus
    counts[NEVER_RAN] = int((keep & ~ran_a).sum())
    keep &= ran_a
    cpu = keep & (np.nan_to_num(raw_gpus, nan=0.0) <= 0)
    if not include_cpu:
        counts[CPU_ONLY] = int(cpu.sum())
        keep &= ~cpu
    return keep, counts


def _too_big(
    t: pa.Table, spec: ClusterSpec, keep: npt.NDArray[np.bool_], counts: dict[str, int]
) -> list[str]:
    """Leave out (in `keep`) the jobs the cluster could not hold even when empty; one line for each."""
    gpus = np.nan_to_num(_floats(t.column("gpus")), nan=0.0)
    nodes = np.nan_to_num(_floats(t.column("nodes")), nan=1.0).astype(np.int64)
    node_gpus = np.array([nd.gpus for nd in spec.nodes], dtype=np.int64)
    max_gpn, cap_total = spec.max_node_gpus, spec.capacity_gpus
    # One verdict per distinct (GPUs, nodes) request: a million jobs ask for a few dozen shapes.
    asks = np.flatnonzero(keep & (gpus > 0))
    # (GPUs, nodes) as one complex key: np.unique of a 1-D array, ten times faster than by rows.
    shapes, shape_of = np.unique(gpus[asks] + 1j * nodes[asks], return_inverse=True)
    too_big = np.zeros(len(shapes), dtype=bool)
    span_of: list[int] = []
    for s_i, (g_s, n_s) in enumerate(zip(shapes.real.tolist(), shapes.imag.tolist(), strict=True)):
        m = max_nodes_for(g_s, int(n_s), max_gpn)
        span_of.append(m)
        too_big[s_i] = not (g_s <= cap_total and fits_empty(node_gpus, g_s, m))
    excluded: list[str] = []
    if too_big.any():
        ids = t.column("job_id").to_pylist()
        for i, s_i in zip(asks.tolist(), shape_of.reshape(-1).tolist(), strict=True):
            if too_big[s_i]:
                excluded.append(
                    f"{ids[i]}: needs {float(gpus[i]):g} GPUs on at most {span_of[s_i]} nodes, cluster has "
                    f"{cap_total} GPUs ({max_gpn} per node at most)"
                )
                keep[i] = False
    counts[TOO_BIG] = len(excluded)
    return excluded


def _rescaled(
    rel: npt.NDArray[np.float64],
    g: npt.NDArray[np.float64],
    runtime: npt.NDArray[np.float64],
    cap: float,
    load: float | None,
) -> tuple[npt.NDArray[np.float64], float, float]:
    """Arrival times stretched so offered GPU-hours / capacity = `load` (None: as they are), the natural
    load and the load after."""
    span = float(rel[-1]) if len(rel) else 0.0
    offered = float((g * runtime).sum())
    # No arrival rate (every job submitted in the same second, or none ran): no offered load to speak of.
    natural = offered / (cap * span) if span > 0 and cap > 0 and offered > 0 else math.nan
    if load is None:
        return rel, natural, natural
    if not load > 0 or not math.isfinite(load):
        raise ValueError("load must be a positive number")
    if not len(rel):
        return rel, natural, natural
    if math.isnan(natural):
        why = (
            "every job was submitted in the same second, so it has no arrival rate to stretch"
            if span <= 0
            else "its jobs offer no GPU-hours (they ask for no GPUs, or none ran for any time)"
        )
        raise ValueError(f"--load cannot rescale this trace: {why}")
    return rel * (natural / load), natural, load


def _job_arrays(
    tt: pa.Table, rel: npt.NDArray[np.float64], g: npt.NDArray[np.float64], epoch0: float
) -> JobArrays:
    users_raw = [u if u is not None else UNKNOWN_USER for u in tt.column("user").to_pylist()]
    user_names = sorted(set(users_raw))
    ucode = {u: i for i, u in enumerate(user_names)}
    classes_raw = [c if c else "normal" for c in tt.column("priority_class").to_pylist()]
    class_names = sorted(set(classes_raw)) or ["normal"]
    ccode = {c: i for i, c in enumerate(class_names)}
    user_codes = np.array([ucode[u] for u in users_raw], dtype=np.int64)
    streak, streak_keys = _streak_keys(tt, user_codes, user_names)
    return JobArrays(
        job_id=_objects(tt.column("job_id")),
        user=user_codes,
        group=_objects(tt.column("group")),
        name=_objects(tt.column("name")),
        streak_key=streak,
        klass=np.array([ccode[c] for c in classes_raw], dtype=np.int64),
        partition=_objects(tt.column("partition")),
        submit=rel.astype(np.float64),
        gpus=g,
        nodes=np.maximum(np.nan_to_num(_floats(tt.column("nodes")), nan=1.0), 1).astype(np.int64),
        time_limit=_floats(tt.column("time_limit")),
        users=user_names,
        classes=class_names,
        epoch0=epoch0,
        streak_keys=streak_keys,
        preemptible=np.asarray(
            tt.column("preemptible").fill_null(False).to_numpy(zero_copy_only=False), dtype=bool
        ),
        checkpoint_every=_floats(tt.column("checkpoint_every")),
    )


def _streak_keys(
    tt: pa.Table, user_codes: npt.NDArray[np.int64], user_names: list[str]
) -> tuple[npt.NDArray[np.int64], list[StreakKey]]:
    """Each job's failure-streak key (`policy.inputs.streak_key`, the rule the hold and the audit share),
    as an index into the distinct keys. The rule is applied once per distinct (user, name, group): a
    million jobs have a few thousand."""
    (nm_code, nm_l), (gr_code, gr_l) = _codes(tt.column("name")), _codes(tt.column("group"))
    log_has_names = (nm_code >= 0).any() or (gr_code >= 0).any()
    triples = (
        np.stack([user_codes, nm_code, gr_code], axis=1) if len(user_codes) else np.zeros((0, 3), np.int64)
    )
    distinct, of = np.unique(triples, axis=0, return_inverse=True)
    keys: list[StreakKey] = []
    index: dict[StreakKey, int] = {}
    code = np.full(len(distinct), -1, dtype=np.int64)
    for i, (u, nm, gr) in enumerate(distinct.tolist()):
        user = user_names[u]
        name, group = (nm_l[nm] if nm >= 0 else None), (gr_l[gr] if gr >= 0 else None)
        k = streak_key(None if user == UNKNOWN_USER else user, name, group, log_has_names=bool(log_has_names))
        if k is not None:
            code[i] = index.setdefault(k, len(keys))
            if code[i] == len(keys):
                keys.append(k)
    return code[of.reshape(-1)], keys


def run_simulation(
    jobs: pa.Table,
    cluster_spec: ClusterSpec,
    *,
    policy: str,
    placement: str | None = None,
    load: float | None = None,
    seed: int = 0,
    predictor_factory: Callable[[], OnlinePredictor] | None = None,
    explain: set[str] | frozenset[str] = frozenset(),
    include_cpu: bool = False,
    progress: Callable[[int, int], None] | None = None,
    policy_options: dict[str, Any] | None = None,
    engine_options: EngineOptions | None = None,
) -> SimResult:
    """Replay `jobs` (JOB_SCHEMA) on the cluster under one policy.

    `seed` seeds the default predictor's training (and numpy's global generator, for a predictor given
    here that draws random numbers); the engine and the policies are deterministic (ties break by submit
    order and event sequence), so a policy that reads no predictions gives the same result for any seed.
    `progress(done, total)` is called as jobs end. Raises ValueError for an unknown policy or placement,
    or a bad load.

    `predictor_factory` None: the project's online predictor for a policy that reads predictions, none
    for one that never does (`Policy.uses_predictions`; its decisions are the same either way). A
    predictor given explicitly is always consulted.
    """
    pol = get_policy(policy, placement, **(policy_options or {}))
    if predictor_factory is None:
        predictor_factory = partial(default_predictor_factory, seed) if pol.uses_predictions else NoPredictor
    arrays, truth, excluded, counts, natural, final = prepare(
        jobs, cluster_spec, load=load, include_cpu=include_cpu
    )
    np.random.seed(seed)
    opts = engine_options or EngineOptions()
    opts.explain = frozenset(explain)
    opts.progress = progress
    engine = Engine(arrays, truth, Cluster(cluster_spec), pol, predictor_factory(), opts)
    res = engine.run()
    res.load = final
    res.natural_load = natural
    res.excluded = excluded
    res.excluded_counts = counts
    return res
