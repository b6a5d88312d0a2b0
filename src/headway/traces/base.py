"""What every reader returns, and how it reports bad rows."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa


class BadInputError(ValueError):
    """Input that cannot be read at all, or a bad row under --strict; str() is the one-line message."""


@dataclass(frozen=True, slots=True)
class BadRow:
    file: str
    line: int  # 1-based line number (or record number for JSON inputs)
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


ROW_SKIPPED = "row skipped"
STORED_NULL = "stored as null"
# Job fields almost no log carries (preemption, issue 27: whether a job may be stopped and requeued, how
# often it saves its progress): null when a log lacks them (not said: the policies' documented default),
# and not listed among a read's missing fields, which name what the audit and a replay lose for lack of them.
SELDOM_FIELDS: tuple[str, ...] = ("preemptible", "checkpoint_every")
# A reason written as `column: what is wrong` names its column; other reasons concern the whole row.
_COLUMN_REASON = re.compile(r"^(?P<col>[A-Za-z0-9_/ .#-]{1,64}): (?P<why>.+)$")
EXAMPLES_KEPT = 1000  # examples kept per problem (what --show-bad can ask for)


@dataclass(slots=True)
class Problem:
    """One kind of unreadable value in one input column, counted over the file: what a user fixes once
    for all its rows, where a stream of per-line messages made them find problems one at a time."""

    column: str  # the input column, or "(row)" for a row that is wrong as a whole
    reason: str
    effect: str  # ROW_SKIPPED (a value the job record cannot do without) or STORED_NULL (the job is kept)
    count: int = 0
    examples: list[tuple[str, int, str | None]] = field(default_factory=list)  # (file, line, value)

    def example_lines(self, n: int) -> list[str]:
        return [f"{f}:{ln}: {v!r}" if v is not None else f"{f}:{ln}" for f, ln, v in self.examples[:n]]

    def as_dict(self, n: int) -> dict[str, object]:
        return {
            "column": self.column,
            "reason": self.reason,
            "effect": self.effect,
            "count": self.count,
            "examples": self.example_lines(n),
        }


def split_reason(reason: str) -> tuple[str, str]:
    """(column, reason) of a message `column: reason`; ("(row)", message) otherwise."""
    m = _COLUMN_REASON.match(reason)
    return (m["col"], m["why"]) if m else ("(row)", reason)


_QUOTED_VALUE = re.compile(r"^(?P<why>.*?) \((?P<q>['\"])(?P<v>.*)(?P=q)\)$")


def split_value(reason: str) -> tuple[str, str | None]:
    """(reason, value) of `reason ('value')`, so rows that differ only in their value count as one kind."""
    m = _QUOTED_VALUE.match(reason)
    return (m["why"], m["v"]) if m else (reason, None)


@dataclass(slots=True)
class ReadResult:
    table: pa.Table  # in headway.schema.JOB_SCHEMA
    format: str  # the reader that produced it
    rows_read: int  # data rows seen (good + bad)
    bad_rows: list[BadRow] = field(default_factory=list)
    bad_row_count: int = 0  # may exceed len(bad_rows) when the list is capped
    missing_fields: list[str] = field(default_factory=list)  # schema fields this input does not provide
    notes: list[str] = field(default_factory=list)  # things the user should know (e.g. "typed GPUs")
    problems: list[Problem] = field(default_factory=list)  # unreadable values per column and reason

    @property
    def nulled_values(self) -> int:
        """Unreadable values stored as null (their jobs kept)."""
        return sum(p.count for p in self.problems if p.effect == STORED_NULL)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    strict: bool = False
    source: str | None = None  # overrides the stored `source` (default: the format name)
    mapping: Path | None = None  # csv: the TOML mapping file
    gpu_tres_ids: tuple[int, ...] | None = None  # slurmdb: tres ids that are GPUs (default >= 1001)
    tz: str | None = None  # timezone of naive timestamps (default: the reader's documented one)
    progress: Callable[[int], None] | None = None  # called with bytes (or records) consumed


class Reader(Protocol):
    name: str

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when the first bytes of `path` look like this format."""
        ...

    def read(self, path: Path, options: ReadOptions) -> ReadResult: ...


class BadRowSink:
    """Collects bad rows and unreadable values: fatal under --strict, else counted per column and reason
    (`problems`), with the first rows kept for display."""

    def __init__(self, strict: bool, keep: int = 1000) -> None:
        self.strict = strict
        self.keep = keep
        self.rows: list[BadRow] = []
        self.count = 0
        self._problems: dict[tuple[str, str, str], Problem] = {}

    @property
    def problems(self) -> list[Problem]:
        """Row-skipping problems first, then by count."""
        return sorted(self._problems.values(), key=lambda p: (p.effect != ROW_SKIPPED, -p.count, p.column))

    def add(self, file: str, line: int, reason: str) -> None:
        """A row that is skipped; `reason` is `column: why (value)` (or a whole-row reason)."""
        self.row(BadRow(file, line, reason))
        column, why = split_reason(reason)
        why, value = split_value(why)
        self.problem(column, why, ROW_SKIPPED, 1, [(file, line, value)])

    def row(self, bad: BadRow) -> None:
        """A skipped row, counted and kept for display; its problems are counted by the caller."""
        if self.strict:
            raise BadInputError(str(bad))
        self.count += 1
        if len(self.rows) < self.keep:
            self.rows.append(bad)

    def problem(
        self, column: str, reason: str, effect: str, count: int, examples: list[tuple[str, int, str | None]]
    ) -> None:
        """Count `count` values of one kind (each row once per kind), keeping the first examples."""
        if self.strict and effect == STORED_NULL and examples:
            f, ln, v = examples[0]
            raise BadInputError(f"{f}:{ln}: {column}: {reason}" + (f" ({v!r})" if v is not None else ""))
        p = self._problems.setdefault((column, reason, effect), Problem(column, reason, effect))
        p.count += count
        room = EXAMPLES_KEPT - len(p.examples)
        if room > 0:
            p.examples.extend(examples[:room])
