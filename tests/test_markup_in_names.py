"""Names from the data are printed as written: a job, user, group or partition named like Rich markup
(`[/]`, `[red]x`, `[bold]`) neither crashes a report with a MarkupError nor loses its brackets, in the
audit, `predict`, `simulate` and the local queue."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headway.cli import app
from test_local_support import DaemonProc, cli, start_daemon, wait_until

__all__ = ["start_daemon"]

runner = CliRunner()
MARKUP = ["[/]", "[red]x", "[bold]"]
T0 = 1767225600  # 2026-01-01 00:00 UTC

MAPPING = """
[format]
delimiter = ","
time_format = "epoch"
time_limit_unit = "h"

[fields]
job_id = "id"
user = "owner"
group = "team"
partition = "queue"
name = "name"
state = "status"
submit_time = "submitted"
start_time = "started"
end_time = "finished"
gpus = "gpus"
time_limit = "limit_h"

[states]
ok = "COMPLETED"
error = "FAILED"
"""


def _log(path: Path) -> Path:
    """90 ended GPU jobs whose users, names, groups and partitions look like markup; user `[/]` fails job
    `[/]` three times in a row first (job ids `[/]`, `2`, `3`), then `[red]x` fails `[bold]` three
    times, and `ann` fails `[red]x` three times. The job with id `[red]9` waits behind others."""
    rows = ["id,owner,team,queue,name,status,submitted,started,finished,gpus,limit_h"]
    firsts = [("[/]", "[/]"), ("[red]x", "[bold]"), ("ann", "[red]x")]
    for i in range(90):
        if i < 9:
            user, name = firsts[i // 3]
            status = "error"
        else:
            user, name = ["[/]", "[red]x", "ann"][i % 3], MARKUP[(i // 3) % 3]
            status = "error" if i % 5 == 0 else "ok"
        jid = {0: "[/]", 8: "[red]9"}.get(i, str(i + 1))
        submit = T0 + 600 * i
        start = submit + 300 * (i % 4)
        end = start + 600 + (137 * i) % 3000
        team, queue = ["[bold]", "[/]", "ml"][i % 3], ["[red]gpu", "gpu"][i % 2]
        gpus = 8 if i in (6, 7) else 1 + i % 4  # two whole-node jobs just before `[red]9`: it waits
        rows.append(f"{jid},{user},{team},{queue},{name},{status},{submit},{start},{end},{gpus},24")
    path.write_text("\n".join(rows) + "\n")
    (path.parent / "jobs.toml").write_text(MAPPING)
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the file's own name looks like markup too: simulate's table title and messages name it
    return _log(tmp_path_factory.mktemp("markup") / "[bold]jobs.csv")


@pytest.fixture(scope="module")
def db(log: Path) -> Path:
    path = log.parent / "jobs.duckdb"
    args = ["ingest", str(log), "--mapping", str(log.parent / "jobs.toml"), "--db", str(path)]
    res = runner.invoke(app, [*args, "--source", "[red]lab"])
    assert res.exit_code == 0, res.output
    return path


def _ok(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


def _flat(text: str) -> str:
    """The text with its line breaks (Rich wraps at 80 columns off a terminal) and runs of spaces as one."""
    return " ".join(text.split())


def _squashed(text: str) -> str:
    """The text without any whitespace: Rich may wrap a long temp path inside a word."""
    return "".join(text.split())


def _section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def test_audit_shows_markup_like_users_and_names_as_written_in_every_table(db: Path) -> None:
    text = _ok(["audit", "--db", str(db), "--source", "[red]lab"])
    assert "jobs of source [red]lab submitted" in text
    repeats = _section(text, "Longest-burning repeat failures", "Early failures")
    lines = [" ".join(line.split()) for line in repeats.splitlines()]
    assert any(line.startswith("│ [/] │ [/] │ 3 │") for line in lines), repeats
    assert any(line.startswith("│ [red]x │ [bold] │ 3 │") for line in lines), repeats
    assert any(line.startswith("│ ann │ [red]x │ 3 │") for line in lines), repeats
    top = _section(text, "Top users by wasted GPU-hours", "Repeat failures")
    waiting = _section(text, "Queueing delay by user", "Weekly")
    for table in (top, waiting):
        assert "│ [/] " in table and "│ [red]x " in table, table
    assert "  [/]: your jobs use a median" in text  # the over-asking advice, user by user
    assert "  [red]x: your jobs use a median" in text


@pytest.mark.parametrize(
    ("by", "keys"), [("user", ["[/]", "[red]x"]), ("name", MARKUP), ("group", MARKUP[::2])]
)
def test_audit_by_a_markup_like_key_lists_it_as_written(db: Path, by: str, keys: list[str]) -> None:
    text = _ok(["audit", "--db", str(db), "--by", by])
    top = _section(text, "by wasted GPU-hours", "Repeat failures")
    for key in keys:
        assert f"│ {key} " in top, top


def test_audit_html_escapes_markup_like_names(db: Path, tmp_path: Path) -> None:
    html = tmp_path / "[red]report.html"
    text = _ok(["audit", "--db", str(db), "--by", "name", "--html", str(html)])
    assert _squashed(f"HTML report written to {html}") in _squashed(text)
    page = html.read_text()
    assert "<td>[/]</td>" in page and "<td>[red]x</td>" in page and "<td>[bold]</td>" in page


def test_predict_shows_a_stored_or_pending_job_with_markup_like_names_as_written(
    db: Path, tmp_path: Path
) -> None:
    model = tmp_path / "[red]model.json"
    assert _squashed(f"wrote {model}") in _squashed(
        _ok(["predict", "train", "--db", str(db), "--out", str(model)])
    )
    stored = _ok(["predict", "show", "[/]", "--db", str(db), "--model", str(model)])
    assert stored.startswith("job [/] user=[/] name=[/] gpus=1"), stored
    show = ["predict", "show", "--db", str(db), "--model", str(model)]
    spec = ["--group", "[/]", "--partition", "[/]", "--gpus", "2"]
    text = _ok([*show, "--user", "[bold]", "--name", "[red]x", *spec])
    assert text.startswith("pending job user=[bold] name=[red]x gpus=2"), text
    named = _ok([*show, "--user", "[red]x", "--name", "[/]"])
    assert named.startswith("pending job user=[red]x name=[/] gpus=1"), named


def test_simulate_explain_names_a_markup_like_job_id_and_trace_file_as_written(log: Path) -> None:
    args = ["simulate", str(log), "--mapping", str(log.parent / "jobs.toml"), "--nodes", "1"]
    res = runner.invoke(app, [*args, "--policy", "fifo,impact", "--explain", "[red]9"])
    assert res.exit_code == 0, res.output
    flat = _flat(res.stdout)
    assert "[bold]jobs.csv: 90 jobs, 8 GPUs" in flat, res.stdout
    for pol in ("fifo", "impact"):
        assert f"{pol}: job [red]9 submitted at" in flat, res.stdout


def test_local_queue_lists_and_explains_jobs_with_markup_like_names_as_written(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    d = start_daemon(gpus="1")
    ids = []
    for name in MARKUP:  # the first runs, the others wait for its GPU
        sub = cli("submit", "--name", name, "--", "sleep", "30", state_dir=d.state_dir)
        assert sub.returncode == 0 and not sub.stderr, sub.stderr
        ids.append(int(sub.stdout.split()[2]))
        assert sub.stdout == f"Submitted job {ids[-1]} ({name})\n"
    wait_until(lambda: d.ask({"op": "queue"})["jobs"][0]["state"] == "RUNNING", 20, "the first job to run")
    q = cli("queue", state_dir=d.state_dir)
    assert q.returncode == 0, q.stderr
    for jid, name in zip(ids, MARKUP, strict=True):
        assert any(line.split()[:2] == [str(jid), name] for line in q.stdout.splitlines()), q.stdout
        why = cli("why", str(jid), state_dir=d.state_dir)
        assert why.returncode == 0, why.stderr
        assert why.stdout.startswith(f"job {jid} ({name}, "), why.stdout
    c = cli("cancel", *map(str, ids), state_dir=d.state_dir)
    assert c.returncode == 0, c.stderr
    wait_until(lambda: len(d.ask({"op": "history"})["jobs"]) == 3, 30, "the three jobs to end")
    h = cli("history", state_dir=d.state_dir)
    assert h.returncode == 0, h.stderr
    for jid, name in zip(ids, MARKUP, strict=True):
        assert any(line.split()[:2] == [str(jid), name] for line in h.stdout.splitlines()), h.stdout
    js = json.loads(cli("history", "--json", state_dir=d.state_dir).stdout)
    assert sorted(j["name"] for j in js) == sorted(MARKUP)


EVIL = "\x1b]0;pwned\x07\x1b[31mmallory"  # sets the window title, turns the terminal red
STORED = EVIL.replace("\x1b", "\ufffd").replace("\x07", "\ufffd")  # as ingest stores it


def test_control_characters_in_names_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    """A job name or user is written by whoever submitted the job (`sbatch -J`): an ESC in it reached
    the terminal raw through the audit's tables and advice and simulate's --explain, where it is a
    command (the window title, colours). Ingest stores such characters as U+FFFD (and says so); what
    a user types with one (`--explain`) is shown as `\\x1b`."""
    rows = ["id,owner,team,queue,name,status,submitted,started,finished,gpus,limit_h"]
    for i in range(12):
        jid = EVIL if i == 5 else str(i + 1)
        status = "error" if i < 4 else "ok"
        submit = T0 + 600 * i
        rows.append(f"{jid},{EVIL},ml,gpu,{EVIL},{status},{submit},{submit + 60},{submit + 900},1,24")
    log = tmp_path / "evil.csv"
    log.write_text("\n".join(rows) + "\n")
    (tmp_path / "jobs.toml").write_text(MAPPING)
    db = tmp_path / "jobs.duckdb"
    text = _ok(["ingest", str(log), "--mapping", str(tmp_path / "jobs.toml"), "--db", str(db)])
    assert "control characters" in _flat(text) and "\x1b" not in text
    for args in (["audit", "--db", str(db)], ["audit", "--db", str(db), "--by", "name"]):
        text = _ok(args)
        assert "\x1b" not in text and "\x07" not in text
        assert STORED in text and f"{STORED}: your jobs use a median" in _flat(text)
    sim = ["simulate", "--db", str(db), "--nodes", "1", "--policy", "fifo", "--explain", STORED]
    text = _ok(sim)
    assert "\x1b" not in text and f"fifo: job {STORED} submitted at" in _flat(text)
    res = runner.invoke(app, ["simulate", "--db", str(db), "--explain", EVIL + "x"])
    shown = "\\x1b]0;pwned\\x07\\x1b[31mmallory"
    assert res.exit_code == 1 and "\x1b" not in res.stderr and f"no job '{shown}x'" in res.stderr


def _evil_store(tmp_path: Path) -> tuple[Path, Path]:
    rows = ["id,owner,team,queue,name,status,submitted,started,finished,gpus,limit_h"]
    for i in range(40):
        jid = EVIL if i == 5 else str(i + 1)
        status = "error" if i % 4 == 0 else "ok"
        submit = T0 + 600 * i
        rows.append(f"{jid},{EVIL},ml,gpu,{EVIL},{status},{submit},{submit + 60},{submit + 900 + i},1,24")
    log = tmp_path / f"evil{EVIL}.csv"  # the file's name too: ingest's table and notes name it
    log.write_text("\n".join(rows) + "\n")
    (tmp_path / "jobs.toml").write_text(MAPPING)
    return log, tmp_path / "jobs.duckdb"


def test_ingest_and_predict_show_never_print_control_characters_raw(tmp_path: Path) -> None:
    """ingest and predict called Rich's escape directly: an ESC or BEL in a file name, a user or a job
    name reached the terminal raw (`predict show` printed the id, user and name as they were stored).
    Ingest stores them as U+FFFD now; a file name keeps them and is shown as `\\x1b`."""
    log, db = _evil_store(tmp_path)
    shown = "\\x1b]0;pwned\\x07\\x1b[31mmallory"
    text = _ok(["ingest", str(log), "--mapping", str(tmp_path / "jobs.toml"), "--db", str(db)])
    assert "\x1b" not in text and "\x07" not in text and shown in _flat(text).replace(" ", "")
    show = _ok(["predict", "show", STORED, "--db", str(db)])  # no model file: cold-start estimates
    assert "\x1b" not in show and "\x07" not in show
    assert _flat(show).startswith(f"job {STORED} user={STORED} name={STORED} gpus=1"), show
    pending = _ok(["predict", "show", "--db", str(db), "--user", EVIL, "--name", EVIL])
    assert "\x1b" not in pending and _flat(pending).startswith(f"pending job user={shown} name={shown}"), (
        pending
    )
    raw = json.loads(_ok(["predict", "show", STORED, "--db", str(db), "--json"]))
    assert raw["job"]["job_id"] == raw["job"]["user"] == raw["job"]["name"] == STORED


def test_local_queue_prints_a_stored_name_with_control_characters_as_visible_escapes(
    start_daemon: Callable[..., DaemonProc],
) -> None:
    """The daemon refuses such a name now, but a queue kept from a headway that took any name holds them:
    `history` and `why` printed it raw (the why line through Text, the reasons unfiltered)."""
    import sqlite3

    d = start_daemon(gpus="1")
    sub = cli("submit", "--name", "ok", "--", "sh", "-c", "exit 3", state_dir=d.state_dir)
    assert sub.returncode == 0, sub.stderr
    jid = int(sub.stdout.split()[2])
    wait_until(lambda: len(d.ask({"op": "history"})["jobs"]) == 1, 30, "the job to end")
    con = sqlite3.connect(d.state_dir / "queue.sqlite")
    con.execute("UPDATE jobs SET name = ? WHERE id = ?", (EVIL, jid))
    con.commit()
    con.close()
    shown = "\\x1b]0;pwned\\x07\\x1b[31mmallory"
    why = cli("why", str(jid), state_dir=d.state_dir)
    assert why.returncode == 0, why.stderr
    assert "\x1b" not in why.stdout and why.stdout.startswith(f"job {jid} ({shown}, "), why.stdout
    h = cli("history", state_dir=d.state_dir)
    assert h.returncode == 0 and "\x1b" not in h.stdout and "\x07" not in h.stdout, h.stdout
    assert "\\x1b]0;" in h.stdout
    js = json.loads(cli("history", "--json", state_dir=d.state_dir).stdout)
    assert [j["name"] for j in js] == [EVIL]
