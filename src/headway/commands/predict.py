"""`headway predict train | evaluate | show`: completion probability and runtime from the job store."""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from headway.console import (
    check_output_file,
    err,
    fail,
    fail_unknown_source,
    out,
    plain,
    print_json,
    print_table,
    printable,
    safe_escape,
)
from headway.schema import MAX_GPUS
from headway.store_lock import DEFAULT_WAIT, WAIT_ENV, WAIT_HELP

if TYPE_CHECKING:
    from headway.predict.features import FeatureFrame

app = typer.Typer(
    help="Predict, at submit time, whether jobs will complete and how long they will run. "
    "Features only use jobs that ended before a job was submitted.",
    no_args_is_help=True,
)

DEFAULT_MODEL = "headway-model.json"
DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="DuckDB job store (default ./headway.duckdb, or $HEADWAY_DB).", show_default=False
    ),
]
SourceOpt = Annotated[
    str | None,
    typer.Option(
        help="Only jobs of this source (as stored by `headway ingest --source`).", show_default=False
    ),
]
CpuOpt = Annotated[bool, typer.Option("--include-cpu", help="Also use CPU-only jobs (ignored by default).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON only (no table, no progress).")]
ModelOpt = Annotated[Path, typer.Option("--model", help="Model file written by `headway predict train`.")]
WaitOpt = Annotated[
    float, typer.Option("--wait", help=WAIT_HELP, envvar=WAIT_ENV, min=0.0, metavar="SECONDS")
]


@contextmanager
def _step(desc: str, quiet: bool) -> Iterator[None]:
    """A spinner on stderr while one long step runs (silent under --json, and when stderr is not a
    terminal, where rich would leave a blank line)."""
    if quiet or not err.is_terminal:
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True
    ) as progress:
        progress.add_task(desc, total=None)
        yield


def _load(
    db: Path | None, source: str | None, include_cpu: bool, quiet: bool, wait: float = DEFAULT_WAIT
) -> tuple[FeatureFrame, list[str]]:
    """The store's features, and the sources they come from."""
    import pyarrow.compute as pc

    from headway.predict.features import build_features
    from headway.store import JobStore, StoreError

    try:
        with _step("reading jobs", quiet), JobStore(db, read_only=True, wait=wait) as store:
            table = store.table("source = ?", [source]) if source else store.table()
    except StoreError as e:
        fail(str(e))
    if table.num_rows == 0 and source:
        with JobStore(db, read_only=True, wait=wait) as store:
            fail_unknown_source(source, store.path, store.sources())
    if table.num_rows == 0:
        fail("no jobs in the store; run `headway ingest` first")
    names = sorted(str(s) for s in pc.unique(table.column("source")).to_pylist())
    if source is None and len(names) > 1:  # their histories interleave as one cluster's: rarely meant
        err.print(
            f"note: the store holds {len(names)} sources ({safe_escape(', '.join(names))}), taken here as "
            "one cluster's history; --source NAME uses one"
        )
    with _step(f"computing causal features for {table.num_rows:,} jobs", quiet):
        frame = build_features(table, include_cpu=include_cpu)
    if len(frame) == 0:
        fail("no GPU jobs with a submit time in the store (pass --include-cpu to use CPU-only jobs)")
    return frame, names


@app.command("train")
def train(
    db: DbOpt = None,
    out_path: Annotated[
        Path, typer.Option("--out", help="Where to write the model file (never over a file that is not one).")
    ] = Path(DEFAULT_MODEL),
    source: SourceOpt = None,
    include_cpu: CpuOpt = False,
    calibration: Annotated[
        str, typer.Option(help="auto, isotonic or platt (auto: isotonic from 5,000 calibration jobs).")
    ] = "auto",
    as_json: JsonOpt = False,
    wait: WaitOpt = DEFAULT_WAIT,
) -> None:
    """Train on every ended job in the store and write one model file (JSON, LightGBM text models inside).

    The latest 20% of jobs by submit time calibrate the completion probability; recent jobs weigh more
    (half weight 3 days back), so the model follows a drifting success rate.
    """
    from headway.predict.model import Predictor, TrainConfig

    if calibration not in ("auto", "isotonic", "platt"):
        fail(f"--calibration: expected auto, isotonic or platt, got {calibration!r}")
    check_output_file(out_path, "--out")
    _check_replaces_a_model(out_path)
    frame, sources = _load(db, source, include_cpu, as_json, wait)
    n_ended = int(frame.ended.sum())
    if n_ended < 50:
        fail(f"only {n_ended} ended jobs in the store; need at least 50 to train")
    t0 = time.perf_counter()
    with _step(f"training on {n_ended:,} ended jobs", as_json):
        model = Predictor.fit(frame, config=TrainConfig(calibration=calibration))
    seconds = time.perf_counter() - t0
    model.meta["sources"] = sources  # so that using it on another cluster's jobs can be flagged
    try:
        model.save(out_path)
    except OSError as e:
        fail(f"{out_path}: cannot write the model file: {e.strerror}")
    summary = {
        "model": str(out_path),
        "jobs": len(frame),
        "ended_jobs": n_ended,
        "seconds": seconds,
        **model.meta,
    }
    if as_json:
        print_json(summary)
        return
    out.print(
        f"trained on {n_ended:,} ended jobs in {seconds:.1f}s: "
        f"models {', '.join(model.meta['models']) or 'none'}, calibration {model.meta['calibration']}"
    )
    missing = {"p_success", "runtime_q90", "ttf_q50"} - set(model.meta["models"])
    rate, fit_rate = model.meta.get("success_rate"), model.meta.get("fit_success_rate")
    if "p_success" in missing and rate in (0.0, 1.0):  # not too few examples: nothing to tell apart
        missing.discard("p_success")
        out.print(
            f"every ended job {'completed' if rate == 1.0 else 'failed'}: no completion model "
            "(the smoothed success rates are the probability)"
        )
    elif "p_success" in missing and fit_rate in (0.0, 1.0):  # the other outcome only among the latest
        missing.discard("p_success")
        out.print(
            f"every job the completion model would fit on {'completed' if fit_rate == 1.0 else 'failed'} "
            f"(the other outcome only among the latest {model.meta['calibration_rows']:,}, kept to "
            "calibrate): no completion model (the smoothed success rates are the probability)"
        )
    if missing:
        out.print(f"too few examples for {', '.join(sorted(missing))}: those use running medians / rates")
    out.print(plain(f"wrote {out_path}"))


def _check_replaces_a_model(path: Path) -> None:
    """Fail unless `path` is new, empty, or a model file (damaged ones included): `--out` given a job log
    or a report silently replaced it with the model, and a log may be all that is left of those jobs."""
    if path.exists() and not path.is_file():  # a FIFO, /dev/stdout: reading one would wait for ever
        fail(
            f"--out {path}: is not a regular file (the model file is written beside it and renamed over it); "
            "give a file name"
        )
    if not path.is_file():
        return
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:  # unreadable: the write reports its own error
        return
    if head.strip() and not _is_model_file(path, head):
        fail(
            f"--out {path}: exists and is not a headway model file; writing would replace it; give another "
            "file name (or remove it first)"
        )


def _is_model_file(path: Path, head: bytes) -> bool:
    """Whether a file is a headway model file, a damaged or truncated one included: it starts with the
    format key as `save` writes it, or (a BOM or an editor ahead of it, its keys in another order) it reads
    as a JSON object of that format."""
    from headway.predict.model import MODEL_FORMAT

    head = head.removeprefix(b"\xef\xbb\xbf")
    if re.match(rb'\s*\{\s*"format"\s*:\s*"' + MODEL_FORMAT.encode() + rb'"', head):
        return True
    if not head.lstrip().startswith(b"{"):
        return False
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("format") == MODEL_FORMAT


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


@app.command("evaluate")
def evaluate(
    db: DbOpt = None,
    test_fraction: Annotated[
        float, typer.Option(help="Share of ended jobs, the latest by submit time, held out as the test set.")
    ] = 0.3,
    source: SourceOpt = None,
    include_cpu: CpuOpt = False,
    retrain: Annotated[
        str,
        typer.Option(
            help="daily: retrain at the start of each test day on every job ended by then; schedule: "
            "retrain when the online predictor would (new ends reach a tenth of the last fit's rows, "
            "or its P(complete) drifts from the outcomes, or a month passed; at most hourly; on the "
            "latest 50,000 ends); none: one model frozen at the split. --json also scores `none` "
            "(or, with none, `daily`) under other_mode."
        ),
    ] = "daily",
    as_json: JsonOpt = False,
    wait: WaitOpt = DEFAULT_WAIT,
) -> None:
    """Temporal split: train on the past, score the latest jobs, side by side with the simple baselines.

    Baselines: the user's smoothed success rate, and the user's median runtime. Every prediction uses
    only jobs that ended before the test job (by default the day) began.
    """
    from headway.predict.evaluate import evaluate as run_eval

    if not 0.0 < test_fraction < 1.0:
        fail(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    if retrain not in ("daily", "schedule", "none"):
        fail(f"--retrain: expected daily, schedule or none, got {retrain!r}")
    frame, _ = _load(db, source, include_cpu, as_json, wait)
    try:
        with _step("training on the past and scoring the test jobs", as_json):
            report = run_eval(frame, test_fraction, retrain=retrain)
    except ValueError as e:
        fail(str(e))
    if as_json:
        print_json(report)
        return
    sp = report["split"]
    out.print(
        f"test: {sp['test_jobs']:,} jobs submitted {sp['test_from'][:10]} .. {sp['test_to'][:10]} "
        f"(success rate {sp['test_success_rate']:.1%}); "
        f"trained on {sp['train_jobs']:,} jobs that ended before"
        + (
            ""
            if report["retrain"] == "none"
            else f"; {sp['retrainings']} fits (--retrain {report['retrain']})"
        )
    )
    for w in report.get("warnings", []):
        out.print(plain(f"warning: {w}"))
    b = report["baseline"]
    t = Table(title="completion: model vs baseline (smoothed per-user success rate)")
    for col in ("metric", "model", "baseline", "better"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for key, higher in (("auc", True), ("brier", False), ("log_loss", False), ("ece", False)):
        mv, bv = report[key], b[key]
        t.add_row(key, _fmt(mv), _fmt(bv), _better(mv, bv, higher))
    print_table(t)
    r = Table(title="reliability (10 bins)")
    for col in (
        "bin",
        "jobs",
        "model predicted",
        "observed",
        "baseline jobs",
        "baseline predicted",
        "observed ",
    ):
        r.add_column(col, justify="right")
    for m_row, b_row in zip(report["reliability"], b["reliability"], strict=True):
        r.add_row(
            m_row["bin"],
            str(m_row["jobs"]),
            _fmt(m_row["predicted"], 2),
            _fmt(m_row["observed"], 2),
            str(b_row["jobs"]),
            _fmt(b_row["predicted"], 2),
            _fmt(b_row["observed"], 2),
        )
    print_table(r)
    rt = Table(title="runtime if it completes / time to failure (model vs user's median)")
    for col in ("metric", "runtime model", "runtime baseline", "ttf model", "ttf baseline"):
        rt.add_column(col, justify="left" if col == "metric" else "right")
    for key in (
        "jobs",
        "median_abs_log_error",
        "within_10pct",
        "within_50pct",
        "within_100pct",
        "within_10x",
    ):
        rt.add_row(
            key,
            _fmt(report["runtime"][key]),
            _fmt(b["runtime"][key]),
            _fmt(report["time_to_failure"][key]),
            _fmt(b["time_to_failure"][key]),
        )
    print_table(rt)
    o = report["other_mode"]
    out.print(
        f"with --retrain {o['retrain']}: auc {_fmt(o['auc'])}, brier {_fmt(o['brier'])}, "
        f"ece {_fmt(o['ece'])}, runtime within 50% {_fmt(o['runtime_within_50pct'])}"
    )
    cover = report["runtime"]["p90_coverage"]
    if _fmt(cover) == "-":
        out.print("p90 runtime coverage: no completed test job")
    else:
        out.print(f"p90 runtime covers {cover:.1%} of completed test jobs")
    nz = report.get("noise")
    if nz:
        out.print(
            f"chance on {sp['test_jobs']:,} test jobs (bootstrap, 90%): auc gain "
            f"{_interval(nz['auc_gain'])}, brier gain {_interval(nz['brier_gain'])}, ece "
            f"{_interval(nz['ece'], signed=False)}, runtime within 50% gain {_interval(nz['runtime_gain'])}; "
            f"a perfectly calibrated model would show ece {nz['ece_floor']['mean']:.3f} here "
            "if jobs were independent"
        )
        bl = nz.get("by_user_day")
        if bl and bl["blocks"] < sp["test_jobs"]:  # with no users each job is its own block: said above
            out.print(
                f"resampling whole user-days instead ({bl['blocks']:,}; a user's jobs of one day tend to "
                f"succeed or fail together): auc gain {_interval(bl['auc_gain'])}, brier gain "
                f"{_interval(bl['brier_gain'])}, ece {_interval(bl['ece'], signed=False)}, "
                f"runtime within 50% gain {_interval(bl['runtime_gain'])}"
            )
            fl = bl.get("ece_floor")
            if fl:
                out.print(
                    f"their outcomes move together (correlation {bl['correlation']:.2f} within a user-day), "
                    f"so even a perfectly calibrated model would show ece {fl['mean']:.3f} here "
                    f"(90%: {fl['p05']:.3f}..{fl['p95']:.3f})"
                )


def _better(model: Any, baseline: Any, higher: bool) -> str:
    """Which side wins a metric, or "-" when either is undefined: a comparison with NaN is False, which
    named the baseline the winner of an AUC that neither has (a test set of one outcome)."""
    if _fmt(model) == "-" or _fmt(baseline) == "-":
        return "-"
    return "model" if (model > baseline if higher else model < baseline) else "baseline"


def _percent(p: float) -> str:
    """Whole percents, but never a flat 0% or 100% for a probability that is neither."""
    if 0 < p < 0.005:
        return "<1%"
    if 0.995 <= p < 1:
        return ">99%"
    return f"{p:.0%}"


def _interval(iv: dict[str, float] | None, *, signed: bool = True) -> str:
    """A 90% interval; gains carry their sign, a level (ece) does not."""
    if iv is None:
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{iv['p05']:{f}}..{iv['p95']:{f}}"


@app.command("validate")
def validate(
    db: DbOpt = None,
    test_fraction: Annotated[
        float, typer.Option(help="The test share `evaluate` holds out; validation never reads those jobs.")
    ] = 0.3,
    source: SourceOpt = None,
    include_cpu: CpuOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = DEFAULT_WAIT,
) -> None:
    """Rolling-origin validation inside the training period: the numbers settings are chosen on.

    The jobs that ended before the test split are cut into three blocks (55-70%, 70-85%, 85-100% by
    submit time); each is predicted as `evaluate` predicts the test (retrained daily on what had ended)
    and compared with the same baselines. The test jobs' outcomes are never read.
    """
    from headway.predict.evaluate import validation_folds

    if not 0.0 < test_fraction < 1.0:
        fail(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    frame, _ = _load(db, source, include_cpu, as_json, wait)
    try:
        with _step("validating on blocks of the training period", as_json):
            report = validation_folds(frame, test_fraction)
    except ValueError as e:
        fail(str(e))
    if as_json:
        print_json(report)
        return
    t = Table(
        title=f"validation folds ({report['training_jobs']:,} training-period jobs; "
        "gain: how far the model beats the baseline)"
    )
    cols = (
        "fold",
        "jobs",
        "success rate",
        "auc gain",
        "brier gain",
        "ece",
        "calibrated model's ece",
        "baseline ece",
        "runtime ±50% gain",
    )
    for col in cols:
        t.add_column(col, justify="right")
    keys = ("auc_gain", "brier_gain", "ece", "ece_floor_user_day", "baseline_ece", "runtime_gain")
    for r in report["folds"]:
        t.add_row(r["fold"], str(r["jobs"]), _fmt(r["success_rate"]), *(_fmt(r[k]) for k in keys))
    m = report["mean"]
    t.add_row("mean", "", "", *(_fmt(m[k]) for k in keys))
    print_table(t)
    out.print(
        "calibrated model's ece: what a perfectly calibrated model would show on the fold, with its "
        "outcomes as correlated within a user-day as the fold's (independent in a log without users)"
    )


def _check_job(
    db: Path | None, job_id: str, source: str | None, include_cpu: bool, wait: float = DEFAULT_WAIT
) -> None:
    """A clear error when `job_id` is in no source, in several (ids repeat across clusters: --source
    picks one), or is a CPU-only job without --include-cpu."""
    from headway.store import JobStore, StoreError

    sql = "SELECT source, coalesce(gpus, 0) > 0, submit_time IS NOT NULL FROM jobs WHERE job_id = ?"
    params: list[object] = [job_id]
    if source:
        sql += " AND source = ?"
        params.append(source)
    try:
        with JobStore(db, read_only=True, wait=wait) as store:
            found = store.con.execute(sql + " ORDER BY source", params).fetchall()
            known = store.sources() if source and not found else []
            where = store.path
    except StoreError as e:
        fail(str(e))
    if source and not found and source not in known:  # the source is wrong, not the job id
        fail_unknown_source(source, where, known)
    if not found:
        fail(f"job {job_id!r} is not in the store{f' (source {source})' if source else ''}")
    if len(found) > 1:
        names = ", ".join(str(r[0]) for r in found)
        fail(f"job {job_id!r} is in {len(found)} sources ({names}); pass --source to pick one")
    if not found[0][1] and not include_cpu:
        fail(f"job {job_id!r} asks for no GPU: predict ignores CPU-only jobs unless --include-cpu")
    if not found[0][2]:
        fail(
            f"job {job_id!r} has no submit time in the store: nothing says what was known when it was "
            "submitted"
        )


def parse_time_limit(text: str) -> float:
    """Seconds from '3600', '90m', '4h', '2d', or Slurm's 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM',
    'D-HH:MM:SS' (a bare number is seconds here). A field out of range ('1-25:99:00', '5:99') is refused,
    not added up."""
    from headway.local.durations import slurm_clock_seconds

    s = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if s and s[-1] in units:
            return float(s[:-1]) * units[s[-1]]
        if ":" not in s:
            return float(s)
    except ValueError:
        pass
    if ":" in s or "-" in s:  # D-HH has no colon
        try:
            return slurm_clock_seconds(s)
        except ValueError as e:
            if "out of range" in str(e):
                raise ValueError(f"--time-limit: {str(e).split(': ', 1)[1]} in {text!r}") from None
    raise ValueError(f"--time-limit: cannot read {text!r} (try 3600, 90m, 4h or 1-00:00:00)")


MIN_SUGGESTED_S = 300.0


def limit_advice(p90_s: float, requested_s: float | None, suggested_s: float, margin: float = 1.25) -> str:
    """What `show` says about the time limit, with the reason that holds: below the 5-minute floor it is
    the floor, not the p90 runtime + 25%, that keeps a short limit or sets the suggestion (a 3-minute
    limit with a p90 of 27 s read "keep it (the p90 runtime + 25% reaches it)")."""
    from headway.predict.explain import duration

    floor = p90_s * margin < MIN_SUGGESTED_S
    if requested_s is not None and suggested_s >= requested_s:
        if floor and p90_s * margin < requested_s:
            return f"keep it (no limit under {duration(MIN_SUGGESTED_S)} is suggested)"
        if p90_s * margin < requested_s:  # the rounding up to a 5/15/60-minute step reaches it, not the p90
            return f"keep it (the p90 runtime + 25% is {duration(p90_s * margin)}; rounded up, it reaches it)"
        return "keep it (the p90 runtime + 25% reaches it)"
    if floor:
        return (
            f"suggested {duration(suggested_s)} (the shortest suggested; "
            f"the p90 runtime + 25% is {duration(p90_s * margin)})"
        )
    return f"suggested {duration(suggested_s)} (p90 runtime + 25%)"


def suggest_time_limit(p90_s: float, requested_s: float | None = None, margin: float = 1.25) -> float:
    """The p90 runtime with a margin, rounded up to a step that grows with it (5 minutes below an hour,
    15 below a day, an hour beyond), and never above the limit asked for: every prediction is capped by
    it, since a job ends there, so a longer limit would be a guess past anything the model saw."""
    x = max(p90_s * margin, MIN_SUGGESTED_S)
    step = 300.0 if x <= 3600.0 else 900.0 if x <= 86400.0 else 3600.0
    out = math.ceil(x / step - 1e-9) * step
    return out if requested_s is None else min(out, requested_s)


@app.command("show")
def show(
    job_id: Annotated[
        str | None, typer.Argument(help="A stored job's id; omit it and describe a pending job instead.")
    ] = None,
    db: DbOpt = None,
    model_path: ModelOpt = Path(DEFAULT_MODEL),
    source: SourceOpt = None,
    user: Annotated[str | None, typer.Option(help="Pending job: its user.")] = None,
    name: Annotated[str | None, typer.Option(help="Pending job: its name.")] = None,
    group: Annotated[str | None, typer.Option(help="Pending job: its account / group.")] = None,
    gpus: Annotated[float | None, typer.Option(help="Pending job: GPUs requested.", min=0.0)] = None,
    nodes: Annotated[int, typer.Option(help="Pending job: nodes requested.", min=1)] = 1,
    time_limit: Annotated[
        str | None, typer.Option("--time-limit", help="Pending job: time limit (3600, 90m, 4h, 1-00:00:00).")
    ] = None,
    partition: Annotated[str | None, typer.Option(help="Pending job: partition.")] = None,
    priority_class: Annotated[str | None, typer.Option(help="Pending job: priority class.")] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="Pending job: when it is submitted, an ISO time (UTC unless it says) or `last` (just after "
            "the store's last job ended, for an old log). Default: now.",
        ),
    ] = None,
    include_cpu: CpuOpt = False,
    as_json: JsonOpt = False,
    wait: WaitOpt = DEFAULT_WAIT,
) -> None:
    """The three predictions for one job, what drove them, and a suggested time limit.

    For a stored job the features are those it had at its submit time. For a pending job
    (--user, --gpus, ...) they come from every job in the store that ended before it is submitted
    (now, or --at).
    """
    import numpy as np

    from headway.predict.explain import (
        duration,
        explain_prediction,
        feature_values,
        pending_job_features,
        stored_job_features,
    )
    from headway.predict.model import ModelFileError, Predictor

    spec = any(v is not None for v in (user, name, group, gpus, time_limit, partition, priority_class))
    if job_id is None and not spec:
        fail("give a JOBID, or describe a pending job with --user/--name/--gpus/--time-limit")
    if job_id is not None and spec:
        fail("give either a JOBID or a pending job's options, not both")
    if job_id is not None and at is not None:
        fail("--at is for a pending job: a stored job is shown as of its own submit time")
    if job_id is not None:
        _check_job(db, job_id, source, include_cpu, wait)
    model: Predictor | None = None
    note = None
    try:
        model = Predictor.load(model_path)
    except ModelFileError as e:
        if model_path != Path(DEFAULT_MODEL) or "no model file" not in str(e):
            fail(str(e))
        note = f"no model file at {model_path}: cold-start estimates from running rates and medians"
    frame, sources = _load(db, source, include_cpu, as_json, wait)
    trained_on = model.meta.get("sources") if model is not None else None
    if trained_on and not set(trained_on) & set(sources):
        note = (
            f"the model was trained on jobs of {', '.join(trained_on)}, these are of {', '.join(sources)}: "
            "another cluster's habits (train one on this store with `headway predict train`)"
        )
    seen: bool | None = False  # whether the model was trained on this job's own outcome
    if job_id is not None:
        hits = np.flatnonzero(frame.job_id == job_id)
        if len(hits) == 0:
            fail(f"job {job_id!r} is not in the store{f' (source {source})' if source else ''}")
        i = int(hits[-1])
        feats = stored_job_features(frame, i)
        if (
            model is not None
            and bool(frame.ended[i])
            and not (trained_on and not set(trained_on) & set(sources))
        ):
            seen, seen_note = _in_training_data(
                model.meta, job_id, float(frame.submit[i]), float(frame.end[i])
            )
            note = "; ".join(n for n in (note, seen_note) if n) or None
    else:
        try:
            tl_s = parse_time_limit(time_limit) if time_limit is not None else math.nan
        except ValueError as e:
            fail(str(e))
        if time_limit is not None and not 0 < tl_s < 1e9:  # nan, inf and 1e400 included
            fail(f"--time-limit: must be more than 0 seconds and under 30 years, got {time_limit!r}")
        if gpus is not None and not math.isfinite(gpus):  # min=0 lets nan through: nan < 0 is False
            fail(f"--gpus: must be a number of GPUs, got {gpus}")
        if gpus is not None and gpus > MAX_GPUS:  # the bound every reader stores jobs under
            fail(f"--gpus: at most {MAX_GPUS:,} (no stored job asks for more), got {gpus:g}")
        if gpus == 0 and not include_cpu:
            fail("--gpus 0 is a CPU-only job: predict ignores those unless --include-cpu")
        now, at_note = _submit_time(at, frame.end)
        note = "; ".join(n for n in (note, at_note) if n) or None
        feats = pending_job_features(
            frame,
            now,
            user=user,
            name=name,
            group=group,
            gpus=float(gpus if gpus is not None else 1.0),
            nodes=nodes,
            time_limit_s=tl_s,
            partition=partition,
            priority_class=priority_class,
        )
    job, tl = feats.job, feats.tl
    pred, reasons = explain_prediction(model, feats)
    p90 = float(pred.runtime_p90[0])
    p_s, rt_s, ttf_s = float(pred.p_success[0]), float(pred.runtime[0]), float(pred.time_to_failure[0])
    req = None if math.isnan(tl[0]) else float(tl[0])
    suggested = suggest_time_limit(p90, req)
    result: dict[str, Any] = {
        "job": job,
        "p_success": p_s,
        "runtime_s": rt_s,
        "runtime_p90_s": p90,
        "time_to_failure_s": ttf_s,
        "requested_time_limit_s": req,
        "suggested_time_limit_s": suggested,
        "reasons": reasons,
        "model": str(model_path) if model is not None else None,
        "note": note,
        "in_training_data": seen,
        "features": feature_values(feats),
    }
    if as_json:
        print_json(result)
        return
    who = f"job {job_id}" if job_id else "pending job"
    # the id, user and name as stored or given (`--name '[/]'`), never read as markup
    user, name = (job[k] if job[k] not in (None, "") else "-" for k in ("user", "name"))
    line = printable(f" user={user} name={name} gpus={job['gpus']:g}")
    out.print(Text.assemble((printable(who), "bold"), line))
    if note:
        out.print(plain(note))
    out.print(f"  P(completes)          {_percent(p_s)}")
    out.print(f"  runtime if it does    {duration(rt_s)} (p90 {duration(p90)})")
    out.print(f"  time to failure       {duration(ttf_s)}")
    advice = limit_advice(p90, req, suggested)
    out.print(f"  time limit            requested {duration(req) if req else 'none'}, {advice}")
    titles = {
        "p_success": "completion",
        "runtime_q50": "runtime",
        "runtime_q90": "p90 runtime",
        "ttf_q50": "time to failure",
    }
    for key, rs in reasons.items():
        out.print(f"[bold]what drove the {titles[key]} prediction[/]", markup=True)
        for r in rs:
            out.print(plain(f"  - {r['words']} ({r['direction']})"))  # words quote a partition or group
    if job_id is not None and job.get("state"):
        ran = job.get("runtime")
        out.print(
            plain(f"what happened: {job['state']}" + (f" after {duration(ran)}" if ran is not None else ""))
        )


STALE_STORE_S = 30 * 86400.0


def _in_training_data(
    meta: dict[str, Any], job_id: str, submit: float, end: float
) -> tuple[bool | None, str | None]:
    """Whether a model was trained on this ended job's own outcome (it trains on the ended jobs it was
    given, the latest by submit time), and the note that says so: a past job's figures are then partly
    its own result read back, not a forecast. None when the model file records no training span (one
    written before headway recorded it)."""
    until, since = meta.get("trained_until"), meta.get("trained_from_submit")
    if not isinstance(until, int | float):
        return None, (
            "the model file records no training end (retrain to record it): "
            f"job {job_id}'s own outcome may be in its training data"
        )
    if end <= until and (not isinstance(since, int | float) or submit >= since):
        return True, (
            f"job {job_id} ended {_iso(end)}, before the model's training data ends ({_iso(until)}): "
            "its own outcome was in the training data, so this is no blind forecast"
        )
    return False, None


def _submit_time(at: str | None, ends: Any) -> tuple[float, str | None]:
    """A pending job's submit time from --at (epoch seconds), and a note when the store's history stops
    long before it (time-since features then count the gap)."""
    import numpy as np

    done = ends[np.isfinite(ends)]
    last = float(done.max()) if len(done) else None
    if at is None:
        now = time.time()
    elif at.strip().lower() == "last":
        if last is None:
            fail("--at last: no job in the store has ended")
        now = last + 1.0
    else:
        try:
            when = dt.datetime.fromisoformat(at.strip())
        except ValueError:
            fail(f"--at {at!r}: expected an ISO time such as 2026-01-31T09:00 or `last`")
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        now = when.timestamp()
    first = float(done.min()) if len(done) else None
    if first is not None and now <= first:  # replay_state sees no ended job: every rate is its prior
        return now, (
            f"no job in the store had ended by {_iso(now)} (the first ended {_iso(first)}): the prediction "
            "has no history behind it (no success rate or runtime of this user, name or cluster yet)"
        )
    if last is not None and now - last > STALE_STORE_S:
        days = (now - last) / 86400.0
        return now, (
            f"the store's last job ended {_iso(last)}, {days:,.0f} days before this job's submit time: "
            "times since the user's last failure and success count that gap (--at last asks as of then)"
        )
    return now, None


def _iso(t: float) -> str:
    from headway.predict.explain import iso_utc

    return iso_utc(t)
