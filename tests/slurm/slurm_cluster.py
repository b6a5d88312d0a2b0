"""A private Slurm 22.05 test cluster on this host: 4 slurmd nodes, 24 fake GPUs, slurmdbd + MariaDB.

Everything lives in one directory (config through SLURM_CONF, state, logs, a private munged socket and a
private MariaDB on a TCP port), so nothing under /etc is touched. Used by the session fixture in
tests/test_slurm_live.py, and by hand: `python tests/slurm/slurm_cluster.py start DIR` / `stop DIR`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
NODES = ("n1", "n2", "n3", "n4")
NEEDED = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "munged",
    "mariadbd",
    "mariadb-install-db",
    "sbatch",
    "squeue",
    "sacct",
    "sprio",
    "scontrol",
    "scancel",
    "sacctmgr",
)


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here (not installed, not root); str() says why, for pytest.skip."""


def which(cmd: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
    return shutil.which(cmd, path=path)


def missing_reason() -> str | None:
    """Why the test cluster cannot start here, or None when it can."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "the Slurm test cluster needs Linux"
    missing = [c for c in NEEDED if which(c) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing); run `bash tests/slurm/setup.sh` "
            "as root (Debian packages slurmctld slurmd slurm-client munge slurmdbd mariadb-server)"
        )
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd and SiteFactor updates run as root)"
    if not Path("/etc/munge/munge.key").is_file():
        return "no munge key at /etc/munge/munge.key; run `bash tests/slurm/setup.sh` as root"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TestCluster:
    """A running (or stopped) private cluster; `env` is what client commands need (SLURM_CONF, PATH)."""

    dir: Path
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "") + os.pathsep + os.pathsep.join(SBIN)
        return env

    # ---------------------------------------------------------------- setup
    def render(self) -> None:
        for sub in ("etc", "state", "spool", "run", "log", "fakedev", "db", "work"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for n in NODES:
            (self.dir / "spool" / n).mkdir(exist_ok=True)
        (self.dir / "work").chmod(0o1777)  # jobs run as the test users
        for i in range(8):
            link = self.dir / "fakedev" / f"nvidia{i}"
            if not link.exists():
                link.symlink_to("/dev/null")
        if not self.ports:
            self.ports = {"ctld_port": free_port(), "dbd_port": free_port(), "db_port": free_port()}
            for n in NODES:
                self.ports[f"port_{n}"] = free_port()
        values = {"dir": str(self.dir), "munge_socket": str(self.dir / "run" / "munge.sock"), **self.ports}
        for name in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
            text = string.Template((HERE / f"{name}.in").read_text()).substitute(
                {k: str(v) for k, v in values.items()}
            )
            dest = self.dir / "etc" / name
            dest.write_text(text)
        os.chmod(self.dir / "etc" / "slurmdbd.conf", 0o600)
        (self.dir / "ports.json").write_text(json.dumps(self.ports))

    def _spawn(self, key: str, argv: list[str]) -> int:
        log = open(self.dir / "log" / f"{key}.out", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.dir,
        )
        log.close()
        self.pids[key] = proc.pid
        (self.dir / "pids.json").write_text(json.dumps(self.pids))
        return proc.pid

    def _wait(self, what: str, ok: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():  # type: ignore[operator]
                return
            time.sleep(0.2)
        logs = "\n".join(
            f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
            for p in sorted((self.dir / "log").iterdir())
        )
        raise RuntimeError(f"test cluster: {what} did not come up within {timeout:.0f}s\n{logs}")

    def _run(self, argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start_munge(self) -> None:
        sock = self.dir / "run" / "munge.sock"
        self._spawn(
            "munged",
            [
                which("munged") or "munged",
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--pid-file={self.dir / 'run' / 'munged.pid'}",
                f"--log-file={self.dir / 'log' / 'munged.log'}",
                f"--seed-file={self.dir / 'run' / 'munged.seed'}",
                "--key-file=/etc/munge/munge.key",
            ],
        )
        self._wait("munged", sock.exists, 10)

    def start_db(self) -> None:
        datadir = self.dir / "db"
        if not (datadir / "mysql").is_dir():
            r = self._run(
                [
                    which("mariadb-install-db") or "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                timeout=120,
            )
            if r.returncode != 0:
                raise RuntimeError(f"mariadb-install-db failed: {r.stdout[-800:]}{r.stderr[-800:]}")
        self._spawn(
            "mariadbd",
            [
                which("mariadbd") or "mariadbd",
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={self.ports['db_port']}",
                f"--socket={self.dir / 'run' / 'mysql.sock'}",
                f"--pid-file={self.dir / 'run' / 'mariadbd.pid'}",
                "--skip-grant-tables",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=64M",
                f"--log-error={self.dir / 'log' / 'mariadbd.log'}",
            ],
        )
        self._wait("mariadbd", lambda: _port_open(self.ports["db_port"]), 60)

    def start_dbd(self) -> None:
        self._spawn("slurmdbd", [which("slurmdbd") or "slurmdbd", "-D"])
        self._wait("slurmdbd", lambda: _port_open(self.ports["dbd_port"]), 60)

    def start_ctld(self) -> None:
        self._spawn("slurmctld", [which("slurmctld") or "slurmctld", "-D", "-i"])
        self._wait(
            "slurmctld", lambda: self._run(["scontrol", "ping"], timeout=10).stdout.count("UP") > 0, 30
        )

    def start_nodes(self) -> None:
        for n in NODES:
            self._spawn(f"slurmd-{n}", [which("slurmd") or "slurmd", "-D", "-N", n])

        def idle() -> bool:
            r = self._run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return len(states) == 4 and all(s in ("idle", "mix", "alloc") for s in states.values())

        self._wait("4 idle nodes", idle, 60)

    def start(self) -> None:
        """Start every daemon; raises RuntimeError with the logs when one does not come up."""
        reason = missing_reason()
        if reason:
            raise ClusterUnavailable(reason)
        self.render()
        self.start_munge()
        self.start_db()
        self.start_dbd()
        # The cluster must exist in the accounting database before slurmctld registers with it.
        self._run(["sacctmgr", "-i", "add", "cluster", "lab"], timeout=30)
        self.start_ctld()
        self.start_nodes()

    # ---------------------------------------------------------------- control
    def stop_ctld(self) -> None:
        """Stop only the controller (the nodes keep running), and wait until it is gone."""
        self._run(["scontrol", "shutdown", "slurmctld"], timeout=15)
        pid = self.pids.get("slurmctld")
        if pid:
            _wait_gone(pid, 20)

    def stop(self) -> None:
        """Stop everything this cluster started: Slurm through `scontrol shutdown`, then the rest by PID."""
        grace = 0.0
        if self.pids.get("slurmctld") and _alive(self.pids["slurmctld"]):
            jobs = list(self.squeue_states())
            if jobs:
                self._run(["scancel", *jobs], timeout=15)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and self.squeue_states():
                    time.sleep(0.2)
            self._run(["scontrol", "shutdown"], timeout=15)
            grace = 8.0
        slurm = [k for k in self.pids if k.startswith("slurmd-") or k == "slurmctld"]
        _terminate([self.pids[k] for k in slurm], grace=grace)
        _terminate([self.pids[k] for k in ("slurmdbd", "mariadbd", "munged") if k in self.pids], grace=0)
        # Job scripts run in their own sessions under slurmstepd; nothing of ours may outlive the test.
        for stepd in _processes_of(self.conf):
            with contextlib.suppress(ProcessLookupError):
                os.kill(stepd, signal.SIGKILL)

    # ---------------------------------------------------------------- jobs
    def sbatch(self, user: str, *args: str, script: str = "sleep 1") -> str:
        """Submit a batch job as `user` (as root: --uid/--gid); returns the job id."""
        argv = [
            "sbatch",
            "--parsable",
            f"--uid={user}",
            f"--gid={user}",
            f"--chdir={self.dir / 'work'}",
            "--output=/dev/null",
            "--error=/dev/null",
            *args,
            f"--wrap={script}",
        ]
        r = self._run(argv)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def squeue_states(self) -> dict[str, str]:
        r = self._run(["squeue", "-h", "-a", "-o", "%i %T"])
        return dict(line.split() for line in r.stdout.splitlines() if line.strip())


def ensure_users(users: tuple[str, ...]) -> None:
    """Create local test users (Slurm runs their jobs, so they must exist)."""
    import pwd

    for u in users:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(
                ["useradd", "--create-home", "--shell", "/bin/sh", u], check=True, capture_output=True
            )


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone once reaped
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def _terminate(pids: list[int], grace: float) -> None:
    """Wait `grace` s for the processes to exit by themselves, then SIGTERM their groups, then SIGKILL."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        live = [p for p in pids if _alive(p)]
        if not live:
            return
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in live):
            time.sleep(0.1)


def _processes_of(conf: Path) -> list[int]:
    """Processes (job scripts, slurmstepd) whose environment names this cluster's SLURM_CONF."""
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    spare = _ancestors()  # the shell that exported SLURM_CONF to run the stop script is not the cluster's
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in spare:
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(proc.name))
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: slurm_cluster.py start|stop DIR", file=sys.stderr)
        return 2
    cdir = Path(argv[1]).resolve()
    if argv[0] == "start":
        cluster = TestCluster(cdir)
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    cluster = TestCluster(
        cdir,
        ports=json.loads((cdir / "ports.json").read_text()),
        pids=json.loads((cdir / "pids.json").read_text()),
    )
    cluster.stop()
    return 0


def _ancestors() -> set[int]:
    """This process and its parents up to init."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
