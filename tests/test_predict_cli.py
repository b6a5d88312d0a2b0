"""`headway predict train | evaluate | show` from the command line, including bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from headway.cli import app
from headway.commands.predict import parse_time_limit, suggest_time_limit
from headway.predict.synthetic import make_history
from headway.store import JobStore

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("predict") / "jobs.duckdb"
    with JobStore(path) as store:
        store.upsert(make_history(2500, seed=8, users=12, days=8))
    return path


def _json(args: list[str]) -> dict[str, object]:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    out: dict[str, object] = json.loads(res.stdout)
    return out


def test_validate_json_reports_folds_of_the_training_period(db: Path) -> None:
    r = _json(["predict", "validate", "--db", str(db), "--json"])
    folds = r["folds"]
    assert isinstance(folds, list) and [f["fold"] for f in folds] == ["55%-70%", "70%-85%", "85%-100%"]
    mean = r["mean"]
    assert (
        isinstance(mean, dict)
        and {"auc_gain", "brier_gain", "ece", "ece_floor", "ece_floor_user_day", "runtime_gain"}
        <= mean.keys()
    )
    res = runner.invoke(app, ["predict", "validate", "--db", str(db)])
    assert res.exit_code == 0 and "calibrated model's ece" in res.stdout


def test_evaluate_json_has_the_agreed_keys_and_no_goal_verdicts(db: Path) -> None:
    r = _json(["predict", "evaluate", "--db", str(db), "--json"])
    assert "claims" not in r  # the project's goals (AUC +0.03, ECE <= 0.03) live in benchmarks/bench_goals.py
    for key in ("auc", "brier", "ece", "log_loss", "reliability"):
        assert key in r
    base = r["baseline"]
    assert isinstance(base, dict) and {"auc", "brier", "ece"} <= base.keys()
    assert "within_50pct" in base["runtime"]
    assert "within_50pct" in r["runtime"]  # type: ignore[operator]
    assert r["split"]["test_fraction"] == 0.3  # type: ignore[index]
    floor = r["noise"]["by_user_day"]["ece_floor"]  # type: ignore[index]
    assert 0 < floor["mean"] < 1 and set(floor) == {"mean", "p05", "p95"}
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(db)])
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0 and "even a perfectly calibrated model would show ece" in text


def test_evaluate_prints_figures_on_a_users_log_but_no_development_goal(db: Path) -> None:
    """`no auc_gain_at_least_0.03` and `at most 0.03 in 8% of such test sets` judged a user's own log
    against this project's targets; the figures and the baseline stay, the verdicts are gone."""
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(db)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "completion: model vs baseline" in text and "auc gain" in text
    for verdict in ("at_least", "at_most", "goal", "claim", "of such test sets", "yes ", "n/a "):
        assert verdict not in text, verdict


def test_train_then_show_a_stored_job_and_a_pending_spec(db: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    t = _json(["predict", "train", "--db", str(db), "--out", str(model), "--json"])
    assert model.exists() and t["ended_jobs"] == 2500
    s = _json(["predict", "show", "42", "--db", str(db), "--model", str(model), "--json"])
    assert 0 < s["p_success"] < 1  # type: ignore[operator]
    assert s["runtime_p90_s"] >= s["runtime_s"]  # type: ignore[operator]
    assert s["suggested_time_limit_s"] >= s["runtime_p90_s"]  # type: ignore[operator]
    assert s["reasons"]["p_success"]  # type: ignore[index]
    pend = _json(
        [
            "predict",
            "show",
            "--db",
            str(db),
            "--model",
            str(model),
            "--user",
            "u3",
            "--name",
            "exp1",
            "--gpus",
            "4",
            "--time-limit",
            "2h",
            "--json",
        ]
    )
    assert pend["requested_time_limit_s"] == 7200.0
    assert pend["runtime_s"] <= 7200.0  # type: ignore[operator]
    text = runner.invoke(app, ["predict", "show", "42", "--db", str(db), "--model", str(model)])
    assert text.exit_code == 0 and "what drove" in text.stdout
    assert ("suggested" in text.stdout) or ("keep it" in text.stdout)
    if s["requested_time_limit_s"] is not None:
        assert s["suggested_time_limit_s"] <= s["requested_time_limit_s"]  # type: ignore[operator]


def test_show_without_a_model_file_uses_cold_start_estimates(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = _json(["predict", "show", "7", "--db", str(db), "--json"])
    assert s["model"] is None and "cold-start" in str(s["note"])


def test_a_pending_job_on_an_old_log_is_shown_as_of_its_end_with_at_last(db: Path) -> None:
    base = ["predict", "show", "--db", str(db), "--user", "u3", "--gpus", "4", "--json"]
    now, last = _json(base), _json([*base, "--at", "last"])
    assert "days before this job's submit time" in str(now["note"])  # the generated log ended long ago
    assert "days before" not in str(last["note"])
    f_now, f_last = now["features"], last["features"]
    assert isinstance(f_now, dict) and isinstance(f_last, dict)
    # as of the log's end the hours since u3's last success are those of the log, not years of silence
    assert f_last["user_hours_since_success"] < 8 * 24 < f_now["user_hours_since_success"]
    at = _json([*base, "--at", str(last["job"]["submit_time"])])  # type: ignore[index]
    assert at["p_success"] == pytest.approx(last["p_success"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "evaluate", "--db", "nope.duckdb"], "no job store"),
        (["predict", "evaluate", "--test-fraction", "1.5"], "between 0 and 1"),
        (["predict", "validate", "--test-fraction", "0"], "between 0 and 1"),
        (["predict", "show"], "give a JOBID"),
        (["predict", "show", "no-such-job"], "not in the store"),
        (["predict", "show", "--user", "a", "--time-limit", "soon"], "cannot read"),
        (["predict", "show", "1", "--model", "missing.json"], "no model file"),
        (["predict", "show", "--user", "a", "--at", "yesterday"], "expected an ISO time"),
        (["predict", "show", "42", "--at", "last"], "--at is for a pending job"),
        (["predict", "show", "--user", "a", "--gpus", "nan"], "--gpus: must be a number of GPUs"),
        (["predict", "show", "--user", "a", "--gpus", "inf"], "--gpus: must be a number of GPUs"),
        (["predict", "show", "--user", "a", "--gpus", "1e300"], "--gpus: at most 1,000,000"),
        (["predict", "show", "--user", "a", "--time-limit", "1-25:99:00"], "hours 25 out of range (0-23)"),
        (["predict", "show", "--user", "a", "--time-limit", "5:99"], "seconds 99 out of range (0-59)"),
    ],
)
def test_bad_input_gives_one_clear_line(
    db: Path, args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if "--db" not in args:
        args = [*args, "--db", str(db)]
    res = runner.invoke(app, args)
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output


def test_time_limits_parse_and_suggestions_round_up() -> None:
    assert parse_time_limit("3600") == 3600
    assert parse_time_limit("90m") == 5400
    assert parse_time_limit("1-02:00:00") == 93600
    assert parse_time_limit("30:00") == 1800
    assert suggest_time_limit(3600) == 4500  # 1.25 h, already on a 15-minute step
    assert suggest_time_limit(10) == 300  # five minutes at least
    assert suggest_time_limit(1000) == 1500  # 1,250 s up to the next 5 minutes
    assert suggest_time_limit(30 * 3600) == 38 * 3600  # 37.5 h up to the next hour
    assert suggest_time_limit(3000, requested_s=3600) == 3600  # never above the limit asked for
    assert suggest_time_limit(600, requested_s=3600) == 900


def test_evaluate_scores_the_retraining_schedule_beside_a_frozen_model(db: Path) -> None:
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(db), "--json", "--retrain", "schedule"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["retrain"] == "schedule" and report["other_mode"]["retrain"] == "none"
    assert report["split"]["retrainings"] >= 1 and 0.5 < report["auc"] <= 1.0
    bad = runner.invoke(app, ["predict", "evaluate", "--db", str(db), "--retrain", "weekly"])
    assert bad.exit_code != 0 and "expected daily, schedule or none" in bad.output


def test_a_store_of_two_clusters_is_named_and_the_split_counts_days_not_trainings(tmp_path: Path) -> None:
    import pyarrow as pa

    path = tmp_path / "two.duckdb"
    a, b = make_history(600, seed=1, users=5, days=4), make_history(600, seed=2, users=5, days=4)
    b = b.set_column(b.schema.get_field_index("source"), "source", pa.array(["other"] * b.num_rows))
    with JobStore(path) as store:
        store.upsert(a)
        store.upsert(b)
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert "the store holds 2 sources" in res.stderr and "--source NAME" in res.stderr
    split = json.loads(res.stdout)["split"]
    assert split["test_days"] >= 1 and split["retrainings"] >= 1
    one = runner.invoke(app, ["predict", "evaluate", "--db", str(path), "--json", "--source", "other"])
    assert one.exit_code == 0 and "sources" not in one.stderr


def test_a_model_of_another_cluster_is_named_when_shown(db: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    model = tmp_path / "m.json"
    trained = _json(["predict", "train", "--db", str(db), "--out", str(model), "--json"])
    assert trained["sources"] == ["synthetic"]
    other = tmp_path / "other.duckdb"
    jobs = make_history(300, seed=3, users=4, days=3)
    jobs = jobs.set_column(jobs.schema.get_field_index("source"), "source", pa.array(["lab"] * jobs.num_rows))
    with JobStore(other) as store:
        store.upsert(jobs)
    args = ["predict", "show", "--model", str(model), "--gpus", "2", "--at", "last", "--json"]
    elsewhere = _json([*args, "--db", str(other)])
    assert "trained on jobs of synthetic, these are of lab" in str(elsewhere["note"])
    home = _json([*args, "--db", str(db)])
    assert "trained on jobs of" not in str(home["note"])


def test_show_refuses_an_endless_time_limit_and_a_job_without_a_submit_time(db: Path, tmp_path: Path) -> None:
    for limit in ("inf", "1e400", "nan"):
        res = runner.invoke(app, ["predict", "show", "--db", str(db), "--user", "u1", "--time-limit", limit])
        assert res.exit_code == 1 and "--time-limit: must be more than 0 seconds" in res.output, limit
    store_path = tmp_path / "nosubmit.duckdb"
    table = make_history(300, seed=2, users=3, days=2)
    import pyarrow as pa
    import pyarrow.compute as pc

    first = pc.equal(pa.array(range(table.num_rows)), 0)
    col = pc.if_else(
        first, pa.scalar(None, table.schema.field("submit_time").type), table.column("submit_time")
    )
    table = table.set_column(table.schema.get_field_index("submit_time"), "submit_time", col)
    with JobStore(store_path) as store:
        store.upsert(table)
    jid = table.column("job_id")[0].as_py()
    res = runner.invoke(app, ["predict", "show", jid, "--db", str(store_path)])
    assert res.exit_code == 1 and "has no submit time in the store" in " ".join(res.output.split())


def test_an_unknown_source_is_named_with_the_sources_the_store_has(db: Path) -> None:
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(db), "--source", "nope"])
    assert res.exit_code == 1
    text = " ".join(res.output.split())
    assert "--source 'nope': no such source in" in text and text.endswith("jobs.duckdb; it has synthetic")


def test_show_of_a_job_id_with_an_unknown_source_names_the_source_not_the_job(db: Path) -> None:
    """`show 42 --source nope` said "job '42' is not in the store (source nope)" though job 42 is there."""
    res = runner.invoke(app, ["predict", "show", "42", "--db", str(db), "--source", "nope"])
    assert res.exit_code == 1
    text = " ".join(res.output.split())
    assert "--source 'nope': no such source in" in text and text.endswith("it has synthetic")
    assert "not in the store" not in text


def test_evaluate_on_a_store_where_every_job_failed_shows_dashes_not_nan(tmp_path: Path) -> None:
    """With one outcome only, AUC is undefined and no job completed: the table named the baseline the
    winner on AUC, and the text said "auc nan" and "covers nan%"."""
    import pyarrow as pa

    path = tmp_path / "failed.duckdb"
    t = make_history(600, seed=4, users=5, days=4)
    t = t.set_column(t.schema.get_field_index("state"), "state", pa.array(["FAILED"] * t.num_rows))
    with JobStore(path) as store:
        store.upsert(t)
    r = _json(["predict", "evaluate", "--db", str(path), "--json"])
    assert "claims" not in r
    # benchmarks/bench_goals.py, where the goals went, calls what this test set cannot tell unknown
    import importlib.util

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_goals.py"
    spec = importlib.util.spec_from_file_location("bench_goals", bench)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    met = {g["goal"].split()[0]: g["met"] for g in mod.predict_goals(r)}
    assert met["completion"] is None and met["runtime"] is None
    assert isinstance(met["Brier"], bool) and isinstance(met["ECE"], bool)
    res = runner.invoke(app, ["predict", "evaluate", "--db", str(path)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "nan" not in text
    assert "│ auc │ - │ - │ - │" in text
    assert "auc_gain" not in text


def test_train_does_not_write_its_model_over_a_file_that_is_not_a_model(db: Path, tmp_path: Path) -> None:
    """`--out jobs.txt` replaced a job log with the model file (only a DuckDB store was protected)."""
    log = tmp_path / "sacct.txt"
    log.write_text("JobID|JobName|User|State\n1|train|alice|COMPLETED\n")
    res = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(log)])
    assert res.exit_code == 1 and "is not a headway model file" in res.output
    assert log.read_text() == "JobID|JobName|User|State\n1|train|alice|COMPLETED\n"
    model = tmp_path / "m.json"
    for _ in range(2):  # a new file, then the model file it wrote is replaced
        again = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(model), "--json"])
        assert again.exit_code == 0, again.output
    assert json.loads(model.read_text())["format"] == "headway-predictor"


def test_a_short_limit_kept_by_the_five_minute_floor_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs of about 20 s, a 3-minute limit: `show` said "keep it (the p90 runtime + 25% reaches it)",
    but the p90 runtime + 25% is about 25 s; it is the 5-minute floor of the suggestion that keeps it."""
    import datetime as dt

    import pyarrow as pa

    t = make_history(300, seed=5, users=3, days=3)
    start = t.column("start_time").to_pylist()
    end = pa.array([s + dt.timedelta(seconds=20) for s in start], type=t.schema.field("end_time").type)
    t = t.set_column(t.schema.get_field_index("end_time"), "end_time", end)
    path = tmp_path / "short.duckdb"
    with JobStore(path) as store:
        store.upsert(t)
    user = str(t.column("user")[0])
    monkeypatch.chdir(tmp_path)  # no model file here: cold-start estimates
    args = ["predict", "show", "--db", str(path), "--user", user, "--at", "last"]
    kept = runner.invoke(app, [*args, "--time-limit", "3m", "--json"])
    assert kept.exit_code == 0, kept.output
    r = json.loads(kept.stdout)
    assert r["runtime_p90_s"] * 1.25 < 180 and r["suggested_time_limit_s"] == 180
    text = " ".join(runner.invoke(app, [*args, "--time-limit", "3m"]).stdout.split())
    assert "keep it (no limit under 5m is suggested)" in text and "reaches it" not in text
    unasked = " ".join(runner.invoke(app, args).stdout.split())
    assert "suggested 5m (the shortest suggested; the p90 runtime + 25% is" in unasked


def _train_with_states(tmp_path: Path, states: Callable[[list[Any]], list[str]]) -> str:
    """`predict train` on 600 generated jobs whose states `states` gives from their submit times; its
    output on one line."""
    import pyarrow as pa

    t = make_history(600, seed=4, users=5, days=4)
    state = states(t.column("submit_time").to_pylist())
    t = t.set_column(t.schema.get_field_index("state"), "state", pa.array(state))
    path = tmp_path / "h.duckdb"
    with JobStore(path) as store:
        store.upsert(t)
    res = runner.invoke(app, ["predict", "train", "--db", str(path), "--out", str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    return " ".join(res.stdout.split())


def test_train_on_a_store_where_every_job_completed_says_so_instead_of_too_few_examples(
    tmp_path: Path,
) -> None:
    """600 completed jobs trained no completion model and the output blamed "too few examples for
    p_success"; the reason is that there is no failure to tell apart."""
    text = _train_with_states(tmp_path, lambda submits: ["COMPLETED"] * len(submits))
    assert "every ended job completed: no completion model" in text
    assert "p_success" not in text.split("too few examples for", 1)[-1]


def test_train_replaces_a_model_file_with_a_bom_or_its_keys_in_another_order(
    db: Path, tmp_path: Path
) -> None:
    """The `--out` guard matched the first bytes only: a model file re-saved by an editor (a BOM ahead of
    it) or by a tool that sorts keys (`"boosters"` first) was refused as "not a headway model file"."""
    model = tmp_path / "m.json"
    first = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(model), "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(model.read_text())
    model.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc, sort_keys=True, indent=1).encode())
    again = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(model), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(model.read_text())["format"] == "headway-predictor"
    other = tmp_path / "other.json"
    other.write_bytes(b"\xef\xbb\xbf" + json.dumps({"format": "something-else", "x": 1}).encode())
    refused = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(other)])
    assert refused.exit_code == 1 and "is not a headway model file" in refused.output


def test_train_out_to_a_fifo_is_refused_before_training_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """The `--out` guard opened the path to read its first bytes: a FIFO (or /dev/stdout on a pipe) made
    `headway predict train` wait for ever before training; and the model file, written beside the path and
    renamed over it, replaced the FIFO (as root, /dev/stdout itself) with a regular file."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results: list[object] = []
    args = ["predict", "train", "--db", str(tmp_path / "none.duckdb"), "--out", str(fifo)]
    t = threading.Thread(target=lambda: results.append(runner.invoke(app, args)), daemon=True)
    t.start()
    t.join(20)
    waited = t.is_alive()
    if waited:  # let the stuck reader go: a writer that closes at once gives it end-of-file
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
    assert not waited, "train waited for a writer on the FIFO"
    text = " ".join(getattr(results[0], "output", "").split()) if results else ""
    assert "is not a regular file" in text and "no job store here" not in text


def test_train_out_to_a_symlink_updates_the_model_file_it_points_to(db: Path, tmp_path: Path) -> None:
    """The model file was written beside `--out` and renamed over it: a symlink to the model file (kept in
    another directory) was replaced by a regular file and the file it pointed to kept the old model."""
    (tmp_path / "models").mkdir()
    target = tmp_path / "models" / "m.json"
    target.write_text('{"format": "headway-predictor"}')
    link = tmp_path / "current.json"
    link.symlink_to(target)
    res = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(link), "--json"])
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert "boosters" in json.loads(target.read_text())


def test_train_where_only_the_calibration_slice_has_failures_says_so_instead_of_too_few_examples(
    tmp_path: Path,
) -> None:
    """600 jobs whose failures are all among the latest 20% (the calibration slice): the completion model
    had 480 jobs to fit on, all completed, and the output still blamed "too few examples for p_success"."""

    def late_failures(submits: list[Any]) -> list[str]:
        cut = sorted(submits)[int(len(submits) * 0.9)]
        return ["FAILED" if s >= cut else "COMPLETED" for s in submits]

    text = _train_with_states(tmp_path, late_failures)
    assert "every job the completion model would fit on completed" in text
    assert "p_success" not in text.split("too few examples for", 1)[-1]


def test_time_limits_in_slurms_day_hour_forms_read_as_slurm_reads_them() -> None:
    """`1-02:30` (D-HH:MM) read as a day and 150 seconds, and `1-02` (D-HH) was refused."""
    assert parse_time_limit("1-02") == 86400 + 2 * 3600
    assert parse_time_limit("1-02:30") == 86400 + 2 * 3600 + 30 * 60
    assert parse_time_limit("90:00") == 90 * 60  # the leading field may run over
    for bad in ("1-25:99:00", "5:99", "1-24", "1:60:00"):
        with pytest.raises(ValueError, match="out of range"):
            parse_time_limit(bad)


def test_show_of_a_job_the_model_was_trained_on_says_its_outcome_was_in_the_training_data(
    db: Path, tmp_path: Path
) -> None:
    """`show JOBID` of an ended job used a model trained on that job's own outcome and said nothing; a
    model file written before the training span was recorded still loads, and says it cannot tell."""
    model = tmp_path / "m.json"
    res = runner.invoke(app, ["predict", "train", "--db", str(db), "--out", str(model), "--json"])
    assert res.exit_code == 0, res.output
    args = ["predict", "show", "42", "--db", str(db), "--model", str(model)]
    r = _json([*args, "--json"])
    job = r["job"]
    assert isinstance(job, dict) and job["state"] in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")
    assert r["in_training_data"] is True and "its own outcome was in the training data" in str(r["note"])
    text = " ".join(runner.invoke(app, args).stdout.split())
    assert "job 42 ended" in text and "its own outcome was in the training data" in text
    doc = json.loads(model.read_text())
    del doc["meta"]["trained_until"], doc["meta"]["trained_from_submit"]
    model.write_text(json.dumps(doc))
    old = _json([*args, "--json"])
    assert old["in_training_data"] is None and "records no training end" in str(old["note"])
    pending = _json(["predict", "show", "--db", str(db), "--model", str(model), "--user", "a", "--json"])
    assert pending["in_training_data"] is False


def test_show_at_a_time_before_the_stores_history_says_the_prediction_has_no_history(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`show --at 2001-01-01` on a store whose jobs start years later printed a prediction as if it had a
    history behind it; no job had ended then, so every rate was its prior."""
    monkeypatch.chdir(tmp_path)  # no model file here: cold-start estimates
    args = ["predict", "show", "--db", str(db), "--user", "a", "--at", "2001-01-01"]
    r = _json([*args, "--json"])
    assert "has no history behind it" in str(r["note"])
    text = " ".join(runner.invoke(app, args).stdout.split())
    assert "no job in the store had ended by 2001-01-01T00:00:00+00:00" in text
    later = _json(["predict", "show", "--db", str(db), "--user", "a", "--at", "last", "--json"])
    assert "no history" not in str(later["note"])


def test_a_job_with_no_time_limit_is_described_as_none_given_not_none_yet() -> None:
    """A reason read "the requested time limit: none yet", as if the limit were history still to come."""
    import math

    from headway.predict.explain import describe_value

    assert describe_value("log_time_limit", math.nan, {}) == "none given"
    assert describe_value("user_success_rate", math.nan, {}) == "none yet"
    assert describe_value("log_time_limit", math.log(3600.0), {}) == "60m"


def test_show_prints_a_dash_for_a_pending_job_with_no_user_or_name(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`show --gpus 4` printed "user=None name=None"."""
    monkeypatch.chdir(tmp_path)  # no model file here: cold-start estimates
    res = runner.invoke(app, ["predict", "show", "--db", str(db), "--gpus", "4", "--at", "last"])
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert "user=- name=- gpus=4" in first and "None" not in first


def test_evaluate_on_a_tiny_store_warns_that_its_figures_mean_little(db: Path, tmp_path: Path) -> None:
    """5 jobs: trained on 3, tested on 2, and the figures (an AUC of 1.0 on some stores) came with no word
    that they are chance."""
    path = tmp_path / "tiny.duckdb"
    with JobStore(path) as store:
        store.upsert(make_history(5, seed=4, users=2, days=4))
    r = _json(["predict", "evaluate", "--db", str(path), "--json"])
    warnings = r["warnings"]
    assert isinstance(warnings, list) and len(warnings) == 2
    assert "fewer than the 50" in warnings[0] and "fewer than 30 of either" in warnings[1]
    text = " ".join(runner.invoke(app, ["predict", "evaluate", "--db", str(path)]).stdout.split())
    assert "warning: trained on" in text and "AUC and calibration figures are mostly chance" in text
    assert _json(["predict", "evaluate", "--db", str(db), "--json"])["warnings"] == []


def test_a_limit_kept_only_by_rounding_the_suggestion_up_does_not_say_the_p90_reaches_it() -> None:
    """p90 runtime + 25% of 61 minutes is rounded up to 75 and capped at a 70-minute limit: `show` said
    "keep it (the p90 runtime + 25% reaches it)", but 61 minutes does not reach 70."""
    from headway.commands.predict import limit_advice

    p90, req = 61 * 60 / 1.25, 70 * 60.0
    suggested = suggest_time_limit(p90, req)
    assert suggested >= req  # kept
    advice = limit_advice(p90, req, suggested)
    assert advice.startswith("keep it") and "25% reaches it" not in advice
    assert "the p90 runtime + 25% is 61m; rounded up, it reaches it" in advice
    reached = 80 * 60 / 1.25  # 80 minutes does reach a 70-minute limit
    assert (
        limit_advice(reached, req, suggest_time_limit(reached, req))
        == "keep it (the p90 runtime + 25% reaches it)"
    )
