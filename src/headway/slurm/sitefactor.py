"""Turning a ranking into SiteFactor values, and deciding which `scontrol update` calls to make."""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import re
import select
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from headway.slurm.runner import Runner, SlurmDenied, SlurmDown, classify

_RANGE = re.compile(r"^\s*(-?\d+)\s*:\s*(-?\d+)\s*$")


@dataclass(frozen=True, slots=True)
class FactorRange:
    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> FactorRange:
        """`LO:HI`, e.g. `0:100000` or `-5000:5000`; raises ValueError with a one-line reason."""
        m = _RANGE.match(text)
        if not m:
            raise ValueError(f"--range {text!r}: expected LO:HI with integers, e.g. 0:100000")
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo >= hi:
            raise ValueError(f"--range {text!r}: LO must be below HI")
        # Slurm stores SiteFactor as a signed 32-bit value around NICE_OFFSET; stay well inside it.
        if lo < -SITE_FACTOR_LIMIT or hi > SITE_FACTOR_LIMIT:
            raise ValueError(f"--range {text!r}: keep both ends within +-{SITE_FACTOR_LIMIT:,}")
        return cls(lo, hi)


SITE_FACTOR_LIMIT = 1_000_000_000  # Slurm keeps SiteFactor as a signed 32-bit value: stay well inside it


def map_ranks(order: Sequence[str], rng: FactorRange) -> dict[str, int]:
    """SiteFactor per job from its place in `order` (best first): best gets HI, worst LO, evenly spaced.

    Ranks, not raw scores, go into Slurm: scores span orders of magnitude and would squash most jobs
    onto the same value; evenly spaced ranks keep headway's order exact in `sprio`.
    """
    n = len(order)
    if n == 0:
        return {}
    if n == 1:
        return {order[0]: rng.hi}
    span = rng.hi - rng.lo
    return {job: rng.hi - round(i * span / (n - 1)) for i, job in enumerate(order)}


def _longest_descending(vals: Sequence[int | None]) -> list[int]:
    """Positions of a longest strictly decreasing run of the known values, in order (O(n log n))."""
    tails: list[int] = []  # tails[k]: the smallest negated value that ends a run of length k + 1
    tail_pos: list[int] = []
    back: dict[int, int] = {}
    for i, v in enumerate(vals):
        if v is None:
            continue
        k = bisect.bisect_left(tails, -v)
        if k == len(tails):
            tails.append(-v)
            tail_pos.append(i)
        else:
            tails[k], tail_pos[k] = -v, i
        back[i] = tail_pos[k - 1] if k else -1
    out: list[int] = []
    i = tail_pos[-1] if tail_pos else -1
    while i >= 0:
        out.append(i)
        i = back[i]
    return out[::-1]


def place_ranks(order: Sequence[str], current: Mapping[str, int], rng: FactorRange) -> dict[str, int]:
    """SiteFactors that put `order` (best first) exactly in order while rewriting as few jobs as it can.

    Slurm ranks by the values, not by how evenly they are spread, so a job whose value already sits in
    order keeps it: the longest run of such jobs stays, and every other job (new, or moved) goes between
    its kept neighbours. Spreading every pass from scratch rewrote nearly the whole queue at each start or
    end (451 of 452 jobs on the live test cluster after one start). A fresh spread uses the middle three
    quarters of the range, leaving room at both ends for jobs that arrive best or worst. Where the jobs
    to place would sit closer than a quarter of the usual spacing, the stretch widens over its kept
    neighbours, one at a time, until they fit, and those are placed again too: a burst of arrivals at one
    rank moves a few neighbours, not the queue. Only when an end of the range runs out of room (jobs
    leaving at the top and arriving at the bottom make the queue drift) is it spread afresh. Every value
    lies in (LO, HI]: LO is kept for held jobs, so the last ranked job never ties with them."""
    n = len(order)
    if n == 0:
        return {}
    # LO itself is what held jobs are reset to (and, in a range from 0, what jobs asking for no GPUs
    # keep): a ranked job always sits strictly above it, or the last one would tie with them.
    floor = rng.lo + 1
    ranked = FactorRange(floor, rng.hi)
    span = rng.hi - rng.lo
    margin = span // 8
    band = FactorRange(rng.lo + margin, rng.hi - margin) if margin and span - 2 * margin >= n else ranked

    def fresh() -> dict[str, int]:
        return map_ranks(order, band)

    # 0 is Slurm's default, what every job has before headway wrote anything: not a place to keep.
    vals = [v if (v := current.get(j)) and floor <= v <= rng.hi else None for j in order]
    kept = _longest_descending(vals)
    if not kept:
        return fresh()
    value = {i: v for i in kept if (v := vals[i]) is not None}
    nominal = max((band.hi - band.lo) / max(n - 1, 1), 1.0)
    min_gap = max(nominal / 4, 1.0)
    anchors = [-1, *kept, n]  # -1 and n: the ends of the range, not jobs

    def step_between(a: int, b: int) -> float:
        """The spacing the jobs strictly between anchors a and b would get (inf: the whole queue)."""
        k = b - a - 1
        upper, lower = value.get(a), value.get(b)
        if upper is not None and lower is not None:
            return (upper - lower) / (k + 1)
        if lower is not None:  # above the best kept job: at the usual spacing, or what room there is
            return min(nominal, (rng.hi - lower) / k)
        if upper is not None:  # below the worst kept job: at the usual spacing, or the room above LO
            return min(nominal, (upper - floor) / k)
        return math.inf

    out = {order[i]: v for i, v in value.items()}
    i = 0
    while i < len(anchors) - 1:
        lo_i, hi_i = i, i + 1
        if anchors[hi_i] - anchors[lo_i] == 1:
            i += 1
            continue
        widen_down = True
        while step_between(anchors[lo_i], anchors[hi_i]) < min_gap:
            if lo_i == 0 or hi_i == len(anchors) - 1:
                # Out of room at an end of the range: the queue has drifted (jobs leave at one end and
                # arrive at the other), and only spreading it afresh gives the room back.
                return fresh()
            if widen_down:  # one kept neighbour more, below and above in turn
                hi_i += 1
            else:
                lo_i -= 1
            widen_down = not widen_down
        a, b = anchors[lo_i], anchors[hi_i]
        step = step_between(a, b)
        upper, lower = value.get(a), value.get(b)
        todo = range(a + 1, b)
        k = len(todo)
        if upper is not None:
            placed = [upper - math.floor((m + 1) * step) for m in range(k)]
        else:
            assert lower is not None
            placed = [lower + math.floor(step * (k - m)) for m in range(k)]
        out.update((order[j], v) for j, v in zip(todo, placed, strict=True))
        i = hi_i
    return out


@dataclass(frozen=True, slots=True)
class Change:
    job_id: str
    old: int | None  # None: unknown (sprio did not list it)
    new: int


def plan_changes(target: Mapping[str, int], current: Mapping[str, int]) -> list[Change]:
    """Only jobs whose SiteFactor differs from what Slurm has now."""
    return [Change(j, current.get(j), v) for j, v in target.items() if current.get(j) != v]


@dataclass(slots=True)
class ApplyReport:
    """What a pass's writes did, counted update by update as scontrol answers each one, so that a pass
    cut off mid-way (slurmctld stopped, no answer, Ctrl-C) still says exactly what was written."""

    applied: list[Change] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # job id -> one-line reason
    commands: int = 0  # scontrol processes run
    aborted: str | None = None  # why the writing stopped early; the rest was not attempted
    not_attempted: list[Change] = field(default_factory=list)  # never sent, or never read by scontrol

    def counts(self) -> str:
        """`written N, failed M, not attempted K`, as the table and the error line say it."""
        return write_counts(len(self.applied), len(self.failed), len(self.not_attempted))

    def give_up_on(self, changes: Sequence[Change]) -> None:
        """Every change in `changes` not yet written or failed counts as not attempted."""
        done = {c.job_id for c in self.applied} | set(self.failed) | {c.job_id for c in self.not_attempted}
        self.not_attempted.extend(c for c in changes if c.job_id not in done)


def write_counts(written: int, failed: int, not_attempted: int) -> str:
    """The one wording of what a pass's writes did, for the table, the error line and the docs."""
    return f"written {written}, failed {failed}, not attempted {not_attempted}"


Progress = Callable[[int, int], None]  # (updates answered so far, updates planned), after each answer

_FOR_JOB = re.compile(r"for job (\d+(?:[_+]\d+)?)", re.IGNORECASE)
_PROMPT = "scontrol:"
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
# scontrol reads its commands through readline, which prints its prompt and echoes each command as it
# reads it, also when stdin is a pipe: that echo and the next prompt are how each update's answer is told
# apart. A plain terminal, no user's key bindings and wide lines keep the echo exactly the command.
SCONTROL_ENV = {"TERM": "dumb", "INPUTRC": "/dev/null", "COLUMNS": "1000"}
FIRST_ECHO_S = 2.0  # no echo of the first update by then: a build without readline, fed in one go


def apply_changes(
    runner: Runner,
    changes: Sequence[Change],
    batch: int = 256,
    on_progress: Progress | None = None,
    report: ApplyReport | None = None,
) -> ApplyReport:
    """`scontrol update JobId=N SiteFactor=X` for each change, up to `batch` per scontrol process, fed on
    its stdin one at a time: the next line goes once scontrol has answered the last, so each answer is
    that update's, and a failure names its job (`Invalid job id specified for job 99`) without stopping
    the others.

    If slurmctld stops answering, nothing further is sent (values computed before it went away may be
    stale): the updates answered before count as written, the one it did not answer as failed, the
    rest as not attempted. The same holds for no answer within the runner's timeout, and for Ctrl-C (the
    report passed in is filled as the answers come; the KeyboardInterrupt then goes on). Raises
    SlurmDenied when Slurm refuses the update itself (not root or SlurmUser): every later write would be
    refused too.
    """
    report = report if report is not None else ApplyReport()
    try:
        for i in range(0, len(changes), batch):
            chunk = changes[i : i + batch]
            if report.aborted is not None:
                break
            _Scontrol(runner, chunk, report, on_progress, len(changes)).run()
    finally:
        report.give_up_on(changes)
    return report


class _Scontrol:
    """One scontrol process and what it has printed for each update it was given."""

    def __init__(
        self,
        runner: Runner,
        chunk: Sequence[Change],
        report: ApplyReport,
        on_progress: Progress | None,
        total: int,
    ) -> None:
        self.runner, self.chunk, self.report = runner, chunk, report
        self.on_progress, self.total = on_progress, total
        self.lines = [f"update JobId={c.job_id} SiteFactor={c.new}" for c in chunk]
        self.sent = 0  # lines written to scontrol's stdin
        self.begun = 0  # updates scontrol has echoed, i.e. begun
        self.settled = 0  # updates decided, in order: written or failed
        self.said: list[list[str]] = [[] for _ in chunk]  # what it printed for each update
        self.before: list[str] = []  # printed before any update began
        self.buf = b""
        self.eof = False
        self.prompt_after = -1  # a bare prompt line came after this many updates had begun

    # ------------------------------------------------------------------ output
    def _read(self, timeout: float) -> bool:
        """Read what scontrol has printed, waiting up to `timeout` for something; False if nothing came."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        wait = timeout
        got = False
        while not self.eof:
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                break
            data = os.read(fd, 65536)
            got = True
            if not data:
                self.eof = True
                break
            self.buf += data
            wait = 0.0  # and whatever else is there already, so the tail is the latest
        self._lines()
        return got

    def _lines(self) -> None:
        while b"\n" in self.buf:
            raw, self.buf = self.buf.split(b"\n", 1)
            text = _TERMINAL_CODES.sub("", raw.decode(errors="replace")).strip()
            begins = self.begun < self.sent and text.startswith(_PROMPT)
            if begins and text[len(_PROMPT) :].strip() == self.lines[self.begun]:
                self.begun += 1  # the echo of the next update: scontrol has begun it
                continue
            if text == _PROMPT:  # its prompt on a line of its own: at the end, when stdin closed
                self.prompt_after = self.begun
                continue
            if not text:
                continue
            (self.said[self.begun - 1] if self.begun else self.before).append(text)

    def _at_prompt(self) -> bool:
        """scontrol waits for its next command: its prompt is the last thing it printed."""
        tail = _TERMINAL_CODES.sub("", self.buf.decode(errors="replace"))
        return tail.strip() == _PROMPT

    def _answered(self) -> int:
        """How many updates scontrol has finished: all it began, bar the last until a prompt follows it."""
        if self.begun and (self._at_prompt() or self.prompt_after == self.begun):
            return self.begun
        return max(self.begun - 1, 0)

    # ------------------------------------------------------------------ input
    def _send(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((self.lines[self.sent] + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:  # it ended: reading its output to the end shows how
            pass
        self.sent += 1

    def _close_stdin(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.close()

    # ------------------------------------------------------------------ answers
    def _decide(self, upto: int) -> None:
        """Write down the answers to updates up to `upto` (an update that printed nothing was written)."""
        for k in range(self.settled, upto):
            c, said = self.chunk[k], self.said[k]
            self.settled = k + 1
            if not said:
                self.report.applied.append(c)
            else:
                err = classify("scontrol update", 1, "\n".join(said))
                if isinstance(err, SlurmDenied):
                    self.report.failed[c.job_id] = str(err)
                    raise err
                named = next((t for t in said if (m := _FOR_JOB.search(t)) and m.group(1) == c.job_id), None)
                if isinstance(err, SlurmDown):
                    self.report.failed[c.job_id] = named or str(err)
                    self.report.aborted = str(err)
                elif named or any("error" in t.lower() for t in said):
                    self.report.failed[c.job_id] = (named or said[0]).removeprefix("scontrol: ")
                else:  # something said in passing (a warning), not a failure
                    self.report.applied.append(c)
            if self.on_progress is not None:
                self.on_progress(len(self.report.applied) + len(self.report.failed), self.total)
            if self.report.aborted is not None:
                return

    def _unconfirmed(self, why: str) -> None:
        """Updates scontrol may have made without answering: the one it began (by its echo), or, from a
        scontrol that echoes nothing, every line it was sent. Those never begun count as not attempted."""
        upto = self.begun if self.begun else self.sent
        for c in self.chunk[self.settled : upto]:
            self.report.failed[c.job_id] = f"not confirmed: {why}"
        self.settled = max(self.settled, upto)

    def _without_echo(self, returncode: int) -> None:
        """A scontrol that echoed nothing (built without readline): only its exit status and the jobs its
        messages name tell the updates apart."""
        text = "\n".join(self.before).strip()
        sent = self.chunk[: self.sent]  # (all of them, unless it ended before taking the rest)
        self.settled = self.sent
        if returncode == 0:
            self.report.applied.extend(sent)
            return
        named: dict[str, str] = {}
        for line in text.splitlines():
            m = _FOR_JOB.search(line)
            if m:
                named[m.group(1)] = line.strip().removeprefix("scontrol: ")
        err = classify("scontrol update", returncode, text)
        if isinstance(err, SlurmDenied):
            raise err
        if isinstance(err, SlurmDown):
            self.report.aborted = str(err)
            for c in sent:  # some may have been written before it went away: not known which
                self.report.failed[c.job_id] = f"not confirmed: {err}"
            return
        for c in sent:
            if c.job_id in named:
                self.report.failed[c.job_id] = named[c.job_id]
            elif named:
                self.report.applied.append(c)  # scontrol names only the jobs that failed
            else:
                self.report.failed[c.job_id] = str(err)

    def run(self) -> None:
        self.proc = self.runner.start("scontrol", [], env=SCONTROL_ENV)
        self.report.commands += 1
        timeout = self.runner.timeout_s
        one_by_one = True  # the next line once the last is answered (off for a scontrol that echoes nothing)
        try:
            self._send()
            while True:
                self._decide(self._answered())
                if self.report.aborted is not None or self.settled == len(self.lines) or self.eof:
                    break
                if not self.begun and self.before:  # no echo yet: a controller gone shows all the same
                    err = classify("scontrol update", 1, "\n".join(self.before))
                    if isinstance(err, SlurmDenied):
                        raise err
                    if isinstance(err, SlurmDown):
                        self.report.aborted = str(err)
                        self._unconfirmed(str(err))
                        break
                if one_by_one and self.settled == self.sent == self.begun:
                    self._send()  # it has answered the last one: the next
                    continue
                wait = timeout if self.begun or not one_by_one else min(FIRST_ECHO_S, timeout)
                if self._read(wait):
                    continue
                if one_by_one and not self.begun:  # no echo: a build without readline, fed in one go
                    one_by_one = False
                    while self.sent < len(self.lines):
                        self._send()
                    self._close_stdin()
                    continue
                self.report.aborted = f"scontrol update: no answer within {timeout:.0f} s"
                self._unconfirmed(f"no answer within {timeout:.0f} s")
            self._close_stdin()
            if self.report.aborted is None and self.settled < len(self.lines):
                # It ended before answering everything: by its exit status alone if it echoed nothing.
                code = self.proc.wait(timeout)
                if self.begun == 0:
                    self._without_echo(code)
                else:
                    self.report.aborted = f"scontrol update: ended before all updates (exit status {code})"
                    self._unconfirmed(self.report.aborted)
        except BaseException as e:  # Ctrl-C, or a refusal: what scontrol had begun is not confirmed
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
            self._unconfirmed(why)
            if self.report.aborted is None:
                self.report.aborted = why
            raise
        finally:
            self._end(clean=self.report.aborted is None)

    def _end(self, clean: bool) -> None:
        """Let a scontrol that answered everything exit by itself (its stdin is closed); kill any other."""
        if self.proc.poll() is None:
            if clean:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
