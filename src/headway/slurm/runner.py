"""Running Slurm's commands: argv lists with timeouts, and errors sorted into what a caller can act on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# stderr lines that mean "the controller (or daemon) did not answer": retry later, never write meanwhile.
_DOWN = re.compile(
    r"unable to contact slurm controller|connect(ion)? (failure|refused)|socket timed out|"
    r"zero bytes were transmitted|slurm_persist_conn_open|unexpected message received|"
    r"communication connection failure|slurmctld not responding|timed out",
    re.IGNORECASE,
)
_DENIED = re.compile(
    r"access/permission denied|permission denied|not authorized|only (root|slurmuser)|"
    r"user not authorized|invalid user id|access denied",
    re.IGNORECASE,
)

_NO_CONFIG = re.compile(
    r"could not establish a configuration source|resolve_ctls_from_dns_srv|"
    r"unable to (open|read) .*slurm\.conf|no such file.*slurm\.conf|s_p_parse_file: cannot stat file",
    re.IGNORECASE,
)


class SlurmError(RuntimeError):
    """A Slurm command failed; str() is one line for the user."""


class SlurmMissing(SlurmError):
    """A Slurm command is not installed here (not a login node, or PATH lacks it)."""


class SlurmDenied(SlurmError):
    """Slurm refused: the user may not do this (SiteFactor needs root or SlurmUser)."""


class SlurmDown(SlurmError):
    """The controller did not answer; the caller backs off and retries, and writes nothing meanwhile."""


class SlurmTimeout(SlurmDown):
    """A command gave no answer within the runner's timeout: maybe down, maybe asked for too much."""


@dataclass(frozen=True, slots=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def classify(cmd: str, returncode: int, stderr: str) -> SlurmError:
    """The error to raise for a failed command, from its stderr."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else f"exit status {returncode}"
    if _NO_CONFIG.search(stderr):
        return SlurmMissing(
            f"{cmd}: Slurm is not configured on this machine ({first}); run on a cluster node, or set "
            "SLURM_CONF to its slurm.conf"
        )
    if _DENIED.search(stderr):
        return SlurmDenied(
            f"{cmd}: not permitted: {first} (updating SiteFactor needs root or Slurm's SlurmUser)"
        )
    if _DOWN.search(stderr):
        daemon = "slurmdbd (accounting)" if cmd == "sacct" else "slurmctld"
        return SlurmDown(f"{cmd}: {daemon} is not answering: {first}")
    return SlurmError(f"{cmd} failed: {first}")


@dataclass
class Runner:
    """Runs Slurm commands; `env` lets tests point at a private cluster (SLURM_CONF)."""

    timeout_s: float = 30.0
    env: Mapping[str, str] | None = None

    def which(self, cmd: str) -> str:
        path = (self.env or os.environ).get("PATH")
        exe = shutil.which(cmd, path=path)
        if exe is None:
            raise SlurmMissing(
                f"{cmd} not found on PATH: run headway slurm on a Slurm login node "
                "(it needs squeue, sacct, sprio and scontrol)"
            )
        return exe

    def _env(self, env: Mapping[str, str] | None) -> Mapping[str, str] | None:
        """The runner's environment with `env` over it (None: this process's own)."""
        return {**(self.env if self.env is not None else os.environ), **env} if env else self.env

    def _check_conf(self) -> None:
        conf = (self.env or os.environ).get("SLURM_CONF")
        if conf and not os.path.isfile(conf):  # Slurm itself retries for a minute before it says so
            raise SlurmMissing(f"SLURM_CONF={conf}: no such file; point it at this cluster's slurm.conf")

    def start(
        self, cmd: str, args: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `cmd args...` with pipes on stdin and stdout (stderr joined to stdout, so what it prints
        stays in order): for a caller that talks to it line by line, as `apply_changes` does with
        scontrol, and must see each answer as it comes rather than all at once at the end."""
        argv = (self.which(cmd), *args)
        self._check_conf()
        run_env = self._env(env)
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(run_env) if run_env is not None else None,
            )
        except OSError as e:
            raise SlurmError(f"cannot run {cmd}: {e.strerror}") from e

    def run(
        self,
        cmd: str,
        args: Sequence[str],
        *,
        check: bool = True,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Result:
        """Run `cmd args...` (feeding `stdin`, with `env` over the runner's environment); with check, a
        non-zero exit raises the classified error."""
        argv = (self.which(cmd), *args)
        run_env = self._env(env)
        self._check_conf()
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                check=False,
                env=dict(run_env) if run_env is not None else None,
            )
        except subprocess.TimeoutExpired as e:
            said = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            if _NO_CONFIG.search(said):
                raise classify(cmd, -1, said) from None
            raise SlurmTimeout(f"{cmd}: no answer within {self.timeout_s:.0f} s") from None
        except OSError as e:
            raise SlurmError(f"cannot run {cmd}: {e.strerror}") from e
        res = Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise classify(cmd, proc.returncode, proc.stderr or proc.stdout)
        return res
