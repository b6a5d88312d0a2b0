"""What every reader returns, and how it reports bad rows."""

from __future__ import annotations

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


@dataclass(slots=True)
class ReadResult:
    table: pa.Table  # in headway.schema.JOB_SCHEMA
    format: str  # the reader that produced it
    rows_read: int  # data rows seen (good + bad)
    bad_rows: list[BadRow] = field(default_factory=list)
    bad_row_count: int = 0  # may exceed len(bad_rows) when the list is capped
    missing_fields: list[str] = field(default_factory=list)  # schema fields this input does not provide
    notes: list[str] = field(default_factory=list)  # things the user should know (e.g. "typed GPUs")


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
    """Collects bad rows: fatal under --strict, else counted (and the first few kept for display)."""

    def __init__(self, strict: bool, keep: int = 1000) -> None:
        self.strict = strict
        self.keep = keep
        self.rows: list[BadRow] = []
        self.count = 0

    def add(self, file: str, line: int, reason: str) -> None:
        bad = BadRow(file, line, reason)
        if self.strict:
            raise BadInputError(str(bad))
        self.count += 1
        if len(self.rows) < self.keep:
            self.rows.append(bad)
