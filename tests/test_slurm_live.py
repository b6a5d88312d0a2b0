"""headway next to a real slurmctld: a private 4-node, 24-fake-GPU Slurm 22.05 cluster started here.

The session fixture starts the cluster (config through SLURM_CONF in a temp dir, never /etc) and stops
it at the end. Without Slurm or root these tests skip with the reason; with HEADWAY_REQUIRE_SERVICES=1
(CI) they fail instead. One `--time=1` job (killed by Slurm after ~80-90 s) runs alongside the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from headway.slurm.runner import SlurmDenied, classify

sys.path.insert(0, str(Path(__file__).resolve().parent / "slurm"))
from slurm_cluster import TestCluster, ensure_users, missing_reason

pytestmark = pytest.mark.slow
USERS = ("alice", "bob", "carol", "dave")
REQUIRE = os.environ.get("HEADWAY_REQUIRE_SERVICES") == "1"


@pytest.fixture(scope="session")
def cluster() -> Iterator[TestCluster]:
    reason = missing_reason()
    if reason and "not installed" in reason and os.geteuid() == 0:
        # `make test` installs the packages through tests/setup/services.sh; a bare pytest run does it here.
        subprocess.run(
            ["bash", str(Path(__file__).resolve().parent / "slurm" / "setup.sh")], check=False, timeout=900
        )
        reason = missing_reason()
    if reason:
        if REQUIRE:
            pytest.fail(f"HEADWAY_REQUIRE_SERVICES=1 but {reason}")
        pytest.skip(reason)
    ensure_users(USERS)
    # Jobs run as the test users, who must reach the job directory: pytest's own temp dirs are 0700.
    base = Path(tempfile.mkdtemp(prefix="headway-slurm-"))
    base.chmod(0o755)
    c = TestCluster(base)
    try:
        c.start()
    except Exception:
        c.stop()
        raise
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)


def wait_for(what: str, ok: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = ok()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def sacct_states(c: TestCluster, ids: list[str]) -> dict[str, str]:
    r = c._run(["sacct", "-X", "-P", "-n", "-o", "JobID,State", "-j", ",".join(ids)])
    return {
        line.split("|")[0]: line.split("|")[1].split()[0] for line in r.stdout.splitlines() if "|" in line
    }


def sacct_starts(c: TestCluster, ids: list[str]) -> dict[str, str]:
    r = c._run(["sacct", "-X", "-P", "-n", "-o", "JobID,Start", "-j", ",".join(ids)])
    return {line.split("|")[0]: line.split("|")[1] for line in r.stdout.splitlines() if "|" in line}


def site_factors(c: TestCluster) -> dict[str, int]:
    r = c._run(["sprio", "-h", "-o", "%i|%S"])
    return {a.strip(): int(b) for a, b in (ln.split("|") for ln in r.stdout.splitlines() if "|" in ln)}


def headway(c: TestCluster, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headway.cli", *args],
        env=c.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def history(cluster: TestCluster) -> dict[str, Any]:
    """Users whose history differs, plus one timeout and one cancelled job; waits for the short ones."""
    c = cluster
    jobs: dict[str, Any] = {
        "timeout": c.sbatch(
            "dave", "-J", "long-train", "--time=1", "-w", "n1", "--gres=gpu:1", script="sleep 300"
        )
    }
    jobs["cancelled"] = c.sbatch("carol", "-J", "notebook", "-w", "n2", "--gres=gpu:1", script="sleep 300")
    ok = [
        c.sbatch(u, "-J", "train", "--gres=gpu:1", script="sleep 1") for u in ("alice",) * 3 + ("carol",) * 2
    ]
    bad = [c.sbatch("bob", "-J", "train", "--gres=gpu:1", script="sleep 1; exit 3") for _ in range(3)]
    jobs["completed"], jobs["failed"] = ok, bad
    wait_for("the cancel target to start", lambda: c.squeue_states().get(jobs["cancelled"]) == "RUNNING", 30)
    c._run(["scancel", jobs["cancelled"]])
    short = [*ok, *bad, jobs["cancelled"]]
    wait_for(
        "short history jobs in sacct",
        lambda: (
            all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in sacct_states(c, short).values())
            and len(sacct_states(c, short)) == len(short)
        ),
        60,
    )
    jobs["db"] = str(c.dir / "headway.duckdb")
    return jobs


def test_slurm_starts_pending_jobs_in_headways_order(cluster: TestCluster, history: dict[str, Any]) -> None:
    c = cluster
    # Fill every GPU (n1 keeps 1 for the timeout job), then queue gang jobs that each need 4 GPUs on all
    # 4 nodes, so they can only run one after another: their start times show Slurm's order.
    blockers = [
        c.sbatch("root", "-J", "blocker", "-w", n, f"--gres=gpu:{g}", script="sleep 20")
        for n, g in (("n1", 7), ("n2", 8), ("n3", 4), ("n4", 4))
    ]
    wait_for("blockers running", lambda: all(c.squeue_states().get(b) == "RUNNING" for b in blockers), 30)
    submit_order = [
        c.sbatch(u, "-J", "train", "--nodes=4", "--ntasks-per-node=1", "--gres=gpu:4", script="sleep 3")
        for u in ("bob", "dave", "carol", "alice")
    ]
    before = site_factors(c)
    assert set(submit_order) <= set(before) and all(before[j] == 0 for j in submit_order)

    dry = headway(c, "slurm", "sync", "--once", "--json", "--db", history["db"])
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] and plan["applied"] == [] and plan["scontrol_calls"] == 0
    assert site_factors(c) == before  # a dry run changes nothing

    res = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--db", history["db"])
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    order = [j["job_id"] for j in sorted(report["jobs"], key=lambda j: j["rank"])]
    assert sorted(order) == sorted(submit_order)
    assert order != submit_order, "headway's order equals submission order: the test would prove nothing"
    assert report["failed"] == {} and len(report["applied"]) >= len(order) - 1
    planned = {j["job_id"]: j["site_factor_planned"] for j in report["jobs"]}
    now = site_factors(c)
    assert {j: now[j] for j in order} == planned  # sprio shows headway's SiteFactor
    sprio_long = c._run(["sprio", "-l", "-j", order[0]]).stdout
    assert str(planned[order[0]]) in sprio_long

    # Not root and not SlurmUser: Slurm refuses, and headway says so in one clear line.
    refused = subprocess.run(
        ["runuser", "-u", "alice", "--", "scontrol", "update", f"JobId={order[-1]}", "SiteFactor=1"],
        env=c.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert isinstance(classify("scontrol", refused.returncode, refused.stderr), SlurmDenied), refused.stderr
    assert site_factors(c)[order[-1]] == planned[order[-1]]

    why = headway(c, "slurm", "why", order[0], "--json", "--db", history["db"])
    assert why.returncode == 0, why.stderr
    w = json.loads(why.stdout)
    assert w["headway"]["rank"] == 1 and w["slurm"]["factors"]["site"] == planned[order[0]]

    done = wait_for(
        "the queued jobs to run",
        lambda: (s := sacct_states(c, order)) and all(v == "COMPLETED" for v in s.values()) and len(s) == 4,
        90,
        every=1.0,
    )
    assert done
    starts = sacct_starts(c, order)
    print("headway order", order, "submitted", submit_order, "starts", starts)
    print(
        "\n".join(
            f"{j['job_id']} {j['user']} rank {j['rank']} {j['tier']} {j['factors']}" for j in report["jobs"]
        )
    )
    assert sorted(order, key=lambda j: starts[j]) == order, f"start times {starts} vs headway order {order}"
    assert len(set(starts.values())) == 4  # one after another, not ties
    for gone in (order[0], "999999"):  # an ended job, and one that never existed
        why = headway(c, "slurm", "why", gone, "--db", history["db"])
        assert why.returncode == 1 and f"job {gone} is not in Slurm's queue" in why.stderr, why.stderr


def _json_stream(text: str) -> list[dict[str, Any]]:
    dec, i = json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # a pass still being written
        out.append(obj)


def test_sync_loop_survives_slurmctld_restart_and_writes_nothing_while_down(
    cluster: TestCluster, history: dict[str, Any], tmp_path: Path
) -> None:
    c = cluster
    blocker = c.sbatch("root", "-J", "blocker", "-w", "n3", "--gres=gpu:4", script="sleep 60")
    wait_for("blocker", lambda: c.squeue_states().get(blocker) == "RUNNING", 30)
    queued = [
        c.sbatch(u, "-J", "eval", "-w", "n3", "--gres=gpu:4", script="sleep 1") for u in ("bob", "alice")
    ]
    log = tmp_path / "loop.jsonl"
    with open(log, "w") as fh:
        loop = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headway.cli",
                "slurm",
                "sync",
                "--interval",
                "1s",
                "--apply",
                "--json",
                "--db",
                history["db"],
            ],
            env=c.env,
            stdout=fh,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        passes = lambda: _json_stream(log.read_text())  # noqa: E731
        wait_for("a first applied pass", lambda: any(p["ok"] and p["pending"] for p in passes()), 60)
        c.stop_ctld()
        down_from = len(passes())
        wait_for("failed passes while slurmctld is down", lambda: sum(not p["ok"] for p in passes()) >= 2, 30)
        assert loop.poll() is None, "the loop died while slurmctld was down"
        down = passes()[down_from:]
        c.start_ctld()
        newcomer = c.sbatch("carol", "-J", "eval", "-w", "n3", "--gres=gpu:4", script="sleep 1")
        wait_for(
            "the loop to write the newcomer's SiteFactor after the restart",
            lambda: any(any(a["job_id"] == newcomer for a in p["applied"]) for p in passes()),
            60,
        )
        assert loop.poll() is None
    finally:
        loop.terminate()
        loop.wait(timeout=20)
    failed = [p for p in down if not p["ok"]]
    assert failed and all(p["applied"] == [] and p["scontrol_calls"] == 0 for p in failed)
    assert all("not answering" in p["error"] for p in failed)
    after = site_factors(c)
    assert after.get(newcomer, 0) != 0 or any(after.get(q, 0) != 0 for q in queued)
    c._run(["scancel", blocker, *queued, newcomer])


def _wait_for_the_timeout(c: TestCluster, history: dict[str, Any]) -> None:
    wait_for(
        "the --time=1 job to time out",
        lambda: sacct_states(c, [history["timeout"]]).get(history["timeout"]) == "TIMEOUT",
        150,
        every=2.0,
    )


def test_ingest_and_audit_report_the_clusters_real_outcomes(
    cluster: TestCluster, history: dict[str, Any]
) -> None:
    c = cluster
    _wait_for_the_timeout(c, history)
    db = str(c.dir / "audit.duckdb")
    ing = headway(c, "ingest", "--from-slurm", "--since", "1d", "--db", db, "--json")
    assert ing.returncode == 0, ing.stderr
    assert json.loads(ing.stdout)["files"][0]["bad_rows"] == 0
    aud = headway(c, "audit", "--db", db, "--json")
    assert aud.returncode == 0, aud.stderr
    report = json.loads(aud.stdout)

    def find(obj: Any, key: str) -> Any:
        if isinstance(obj, dict):
            if key in obj:
                return obj[key]
            for v in obj.values():
                hit = find(v, key)
                if hit is not None:
                    return hit
        return None

    by_state = find(report, "by_state")
    assert by_state is not None, "audit JSON has no by_state"
    counts = {s: v["jobs"] if isinstance(v, dict) else v for s, v in by_state.items()}
    assert counts.get("FAILED", 0) >= len(history["failed"])  # bob's three exit-3 jobs
    assert counts.get("COMPLETED", 0) >= len(history["completed"])
    assert counts.get("TIMEOUT", 0) == 1 and counts.get("CANCELLED", 0) >= 1


def test_a_pending_array_is_ranked_once_under_slurms_name_and_its_tasks_take_the_written_factor(
    cluster: TestCluster, history: dict[str, Any]
) -> None:
    """An array's pending tasks are one squeue record sharing one priority: headway ranks it once, shows
    it as Slurm does (`N_[0-2]`, 3 tasks), finds it from a task id, and `scontrol update JobId=N` gives
    every pending task the factor. A throttled array's held tasks are left alone, and the record of its
    tasks cancelled before they started is ingested under sacct's name from `-P` and from `--json`."""
    c = cluster
    db = history["db"]
    # One GPU taken on each 4-GPU node: a task asking for 4 GPUs on each of the 4 nodes cannot start.
    blockers = [
        c.sbatch("root", "-J", "blocker", "-w", n, "--gres=gpu:1", script="sleep 60") for n in ("n3", "n4")
    ]
    wait_for("blockers running", lambda: all(c.squeue_states().get(b) == "RUNNING" for b in blockers), 30)
    gang = ("--nodes=4", "--ntasks-per-node=1", "--gres=gpu:4")
    arr = c.sbatch("alice", "-J", "sweep", "--array=0-2", *gang, script="sleep 1")
    single = c.sbatch("bob", "-J", "train", *gang, script="sleep 1")
    throttled = c.sbatch("carol", "-J", "thr", "--array=0-3%1", "--gres=gpu:1", "-w", "n1", script="sleep 60")
    wait_for("throttled task 0 running", lambda: c.squeue_states().get(f"{throttled}_0") == "RUNNING", 30)

    res = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--db", db)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    rows = {j["job_id"]: j for j in report["jobs"]}
    assert rows[arr]["slurm_id"] == f"{arr}_[0-2]" and rows[arr]["tasks"] == 3 and rows[arr]["gpus"] == 16
    assert rows[single]["slurm_id"] == single and rows[single]["tasks"] == 1
    assert report["skipped_waiting"].get(f"{throttled}_[1-3%1]") == "JobArrayTaskLimit"
    assert report["failed"] == {}
    assert site_factors(c)[arr] == rows[arr]["site_factor_planned"]  # one sprio line for the array
    for name in (f"{arr}_1", f"{arr}_[0-2]", arr):
        why = headway(c, "slurm", "why", name, "--json", "--db", db)
        assert why.returncode == 0, why.stderr
        w = json.loads(why.stdout)
        assert w["slurm_id"] == f"{arr}_[0-2]" and w["tasks"] == 3 and w["job_id"] == arr
    held = headway(c, "slurm", "why", f"{throttled}_2", "--db", db)
    assert held.returncode == 1 and "JobArrayTaskLimit" in held.stderr, held.stderr

    c._run(["scancel", throttled, single, arr, *blockers])
    wait_for(
        "the throttled array's pending record in sacct",
        lambda: (
            f"{throttled}_[1-3%1]"
            in c._run(["sacct", "-X", "-P", "-n", "-o", "JobID", "-j", throttled]).stdout
        ),
        30,
    )
    out = c._run(["sacct", "-a", "-X", "--json", "-j", throttled], timeout=60)
    assert out.returncode == 0, out.stderr
    path = c.dir / "sacct_array.json"
    path.write_text(out.stdout)
    adb = str(c.dir / "arrays.duckdb")
    ing = headway(c, "ingest", str(path), "--db", adb, "--json")
    assert ing.returncode == 0, ing.stderr
    con = duckdb.connect(adb, read_only=True)
    try:
        ids = {r[0] for r in con.execute("SELECT job_id FROM jobs").fetchall()}
    finally:
        con.close()
    assert ids == {f"{throttled}_0", f"{throttled}_[1-3%1]"}


def test_sacct_json_ingests_to_the_same_jobs_as_sacct_p(
    cluster: TestCluster, history: dict[str, Any]
) -> None:
    """`sacct --json` of the live cluster, ingested by auto-detection, gives the jobs `--from-slurm`
    (sacct -P) gives: ids, states, GPUs, nodes, times, names, limits; users and exit codes where Slurm's
    JSON has them."""
    c = cluster
    _wait_for_the_timeout(c, history)
    out = c._run(["sacct", "-a", "-X", "--json", "-S", "now-1days"], timeout=60)
    assert out.returncode == 0, out.stderr
    path = c.dir / "sacct_live.json"
    path.write_text(out.stdout)
    dbs = {"json": str(c.dir / "from_json.duckdb"), "text": str(c.dir / "from_text.duckdb")}
    ing = headway(c, "ingest", str(path), "--db", dbs["json"], "--json")
    assert ing.returncode == 0, ing.stderr
    (f,) = json.loads(ing.stdout)["files"]
    assert f["format"] == "sacct" and f["bad_rows"] == 0
    ing = headway(c, "ingest", "--from-slurm", "--since", "1d", "--db", dbs["text"], "--json")
    assert ing.returncode == 0, ing.stderr
    cols = (
        "job_id, name, partition, priority_class, state, gpus, nodes, submit_time, start_time, end_time, "
        "time_limit"
    )
    rows = {}
    codes = {}
    for k, db in dbs.items():
        con = duckdb.connect(db, read_only=True)
        try:
            rows[k] = con.execute(f"SELECT {cols} FROM jobs ORDER BY job_id").fetchall()
            codes[k] = {
                j: (code, user)
                for j, code, user in con.execute("SELECT job_id, exit_code, user FROM jobs").fetchall()
            }
        finally:
            con.close()
    assert len(rows["json"]) >= len(history["failed"]) + len(history["completed"]) + 1
    assert rows["json"] == rows["text"]
    for job_id, (code, user) in codes["json"].items():
        text_code, text_user = codes["text"][job_id]
        assert code is None or code == text_code  # 22.05's JSON: failed jobs' exit codes are unknown
        assert user is None or user == text_user  # 22.05's JSON: no user without an association
    assert all(codes["text"][j][0] == 3 for j in history["failed"])


# --------------------------------------------------------------------------- issue 23: exact on Slurm
def _reasons(c: TestCluster, ids: list[str]) -> dict[str, str]:
    r = c._run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%r"])
    return dict(line.split("|", 1) for line in r.stdout.splitlines() if "|" in line)


def _sprio_listing(c: TestCluster, ids: list[str]) -> dict[str, int] | None:
    """sprio's SiteFactors once it lists every job of `ids` (None until then)."""
    now = site_factors(c)
    return now if all(j in now for j in ids) else None


def _fill_n3(c: TestCluster, seconds: int = 120) -> str:
    """Every CPU and GPU of n3 taken, so jobs sent there (GPU or not) pend; returns the blocker's id."""
    blocker = c.sbatch(
        "root", "-J", "blocker", "-w", "n3", "-c", "16", "--gres=gpu:4", script=f"sleep {seconds}"
    )
    wait_for("the n3 blocker running", lambda: c.squeue_states().get(blocker) == "RUNNING", 30)
    return blocker


def test_a_held_job_goes_to_the_low_end_even_when_a_new_sync_process_finds_it_held(
    cluster: TestCluster, history: dict[str, Any]
) -> None:
    """Jobs ranked by one sync, then held (`scontrol hold`: JobHeldAdmin, `scontrol uhold`: JobHeldUser),
    are reset by the next sync process, which knows nothing of the first one's writes and cannot read
    their SiteFactor (sprio leaves held jobs out): released, they come back at the low end, not at the
    rank they had."""
    c, db = cluster, history["db"]
    blocker = _fill_n3(c)
    jobs = [
        c.sbatch(u, "-J", "eval", "-w", "n3", "--gres=gpu:2", script="sleep 1")
        for u in ("alice", "carol", "dave")
    ]
    try:
        first = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--db", db)
        assert first.returncode == 0, first.stderr
        planned = {j["job_id"]: j["site_factor_planned"] for j in json.loads(first.stdout)["jobs"]}
        assert all(planned[j] >= 12500 for j in jobs)
        assert {j: site_factors(c)[j] for j in jobs} == {j: planned[j] for j in jobs}
        admin_held, user_held, free = jobs
        c._run(["scontrol", "hold", admin_held])
        c._run(["scontrol", "uhold", user_held])
        assert _reasons(c, [admin_held, user_held]) == {admin_held: "JobHeldAdmin", user_held: "JobHeldUser"}
        assert admin_held not in site_factors(c) and user_held not in site_factors(c)  # sprio hides them

        second = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--db", db)  # a new process
        assert second.returncode == 0, second.stdout + second.stderr
        rep = json.loads(second.stdout)
        assert rep["ok"] and rep["failed"] == {}
        resets = {a["job_id"]: (a["old"], a["new"]) for a in rep["applied"] if a["job_id"] != free}
        assert resets == {admin_held: (None, 0), user_held: (None, 0)}  # old: unknown, as sprio hides it
        assert rep["skipped_waiting"] == {admin_held: "JobHeldAdmin", user_held: "JobHeldUser"}
        assert sorted(rep["reset_to_low_end"]) == sorted([admin_held, user_held])
        assert [j["job_id"] for j in rep["jobs"]] == [free]
        # Written while held, they stay held; released, Slurm weighs them with the low end.
        assert _reasons(c, [admin_held, user_held]) == {admin_held: "JobHeldAdmin", user_held: "JobHeldUser"}
        c._run(["scontrol", "release", admin_held, user_held])
        now = wait_for("the released jobs in sprio", lambda: _sprio_listing(c, jobs), 10)
        print("ranked before the hold", planned, "sprio after the release", {j: now[j] for j in jobs})
        assert now[admin_held] == now[user_held] == 0 < now[free] == planned[free]
    finally:
        c._run(["scancel", blocker, *jobs])


def test_the_last_ranked_new_job_gets_a_site_factor_above_held_and_cpu_only_jobs(
    cluster: TestCluster, history: dict[str, Any]
) -> None:
    """With fifo the newest GPU job ranks last: it arrives below two jobs already spread (87500, 12500)
    and must land strictly above 0, the value of jobs asking for no GPUs and of held jobs. It used to get
    0, was not even written (0 is Slurm's default), and tied with them in sprio."""
    c, db = cluster, history["db"]
    blocker = _fill_n3(c)
    cpu_only = c.sbatch("alice", "-J", "notes", "-w", "n3", script="sleep 1")
    older = [
        c.sbatch(u, "-J", "eval", "-w", "n3", "--gres=gpu:1", script="sleep 1") for u in ("carol", "dave")
    ]
    newest = ""
    try:
        first = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--policy", "fifo", "--db", db)
        assert first.returncode == 0, first.stderr
        spread = {j["job_id"]: j["site_factor_planned"] for j in json.loads(first.stdout)["jobs"]}
        assert spread == dict(zip(older, (87500, 12500), strict=True))
        newest = c.sbatch("bob", "-J", "eval", "-w", "n3", "--gres=gpu:1", script="sleep 1")
        second = headway(c, "slurm", "sync", "--once", "--apply", "--json", "--policy", "fifo", "--db", db)
        assert second.returncode == 0, second.stdout + second.stderr
        rep = json.loads(second.stdout)
        rows = {j["job_id"]: j for j in rep["jobs"]}
        assert rows[newest]["rank"] == 3 and rep["skipped_cpu_only"] == [cpu_only]
        assert [a["job_id"] for a in rep["applied"]] == [newest]  # the arrival, and only it, is written
        sprio = site_factors(c)
        print("sprio after the arrival", {j: sprio[j] for j in (*older, newest, cpu_only)})
        assert sprio[older[0]] > sprio[older[1]] > sprio[newest] > sprio[cpu_only] == 0
        assert sprio[newest] == rows[newest]["site_factor_planned"]
    finally:
        c._run(["scancel", blocker, cpu_only, *older, *([newest] if newest else [])])


def test_a_pass_cut_off_mid_write_reports_exactly_what_slurm_has(
    cluster: TestCluster, history: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """444 new jobs to write, slurmctld shut down after the 100th update was answered: the pass says
    written 100, failed 1 (the update it sent to the stopped controller), not attempted 343, in --json
    and in the table, and after the restart sprio shows exactly those 100 values. (It used to say written
    0, failed 0: scontrol timed out on the rest and the pass lost count of what had been written.)"""
    import io

    from rich.console import Console

    from headway.commands import slurm as cmd
    from headway.slurm.runner import Runner
    from headway.slurm.sync import SlurmSync, SyncOptions

    c = cluster
    blocker = _fill_n3(c, seconds=300)
    jobs = [
        c.sbatch("alice", "-J", "sweep", "-w", "n3", "--gres=gpu:1", script="sleep 1") for _ in range(444)
    ]
    down = False
    try:
        sync = SlurmSync(Runner(env=c.env), SyncOptions(apply=True, db=Path(history["db"])))

        def cut(answered: int, total: int) -> None:
            nonlocal down
            if answered == 100 and not down:
                down = True
                c.stop_ctld()  # the 101st update goes to a stopped controller

        sync.on_progress = cut
        report = sync.run_pass()
        assert down and report.plan is not None and not report.ok
        total = len(report.plan.changes)
        assert total == len(jobs)
        assert (len(report.applied), len(report.failed), len(report.not_attempted)) == (100, 1, 343)
        assert report.error is not None and "slurmctld is not answering" in report.error
        assert report.error.endswith("; written 100, failed 1, not attempted 343")
        (failed,) = report.failed
        doc = report.to_json()
        assert doc["writes"] == {"written": 100, "failed": 1, "not_attempted": 343}
        assert len(doc["applied"]) == 100 and len(doc["not_attempted"]) == 343  # type: ignore[arg-type]

        buf = io.StringIO()
        wide = Console(file=buf, width=250, highlight=False)
        for where in ("headway.commands.slurm.out", "headway.commands.slurm.err", "headway.console.out"):
            monkeypatch.setattr(where, wide)
        cmd._print_report(report, as_json=False, verbose=True)
        table = buf.getvalue()
        assert "444 to change, 0 unchanged; written 100, failed 1, not attempted 343" in table
        statuses = [ln.rstrip().rstrip("│").strip() for ln in table.splitlines() if ln.startswith("│")]
        assert sum(st.endswith(" written") for st in statuses) == 100
        assert sum(st.endswith(" not attempted") for st in statuses) == 343

        c.start_ctld()
        down = False
        now = wait_for("sprio after the restart", lambda: _sprio_listing(c, jobs), 30)
        written = {ch.job_id: ch.new for ch in report.applied}
        print(f"pass: {report.writes()}; sprio after the restart: {sum(now[j] != 0 for j in jobs)} jobs set")
        assert {j: now[j] for j in written} == written
        assert all(now[ch.job_id] == 0 for ch in report.not_attempted) and now[failed] == 0
    finally:
        if down:
            c.start_ctld()
        c._run(["scancel", blocker, *jobs], timeout=60)
