"""Which readers exist, and how `--format auto` picks one."""

from __future__ import annotations

import importlib
from pathlib import Path

from headway.traces.base import BadInputError, Reader, ReadOptions, ReadResult
from headway.traces.checks import tidy

# format name -> module path holding a module-level `READER`
READER_MODULES: dict[str, str] = {
    "sacct": "headway.traces.sacct",
    "slurmdb": "headway.traces.slurmdb",
    "philly": "headway.traces.philly",
    "alibaba": "headway.traces.alibaba",
    "helios": "headway.traces.helios",
    "csv": "headway.traces.csvmap",
    "parquet": "headway.traces.parquet",
}
FORMATS: tuple[str, ...] = ("auto", *READER_MODULES)
# `auto` tries these in order; `csv` needs a mapping, and is chosen whenever one is given.
SNIFF_ORDER: tuple[str, ...] = ("parquet", "sacct", "philly", "slurmdb", "alibaba", "helios")


def get_reader(name: str) -> Reader:
    if name not in READER_MODULES:
        raise BadInputError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
    module = importlib.import_module(READER_MODULES[name])
    reader: Reader = module.READER
    return reader


def read(name: str, path: Path, options: ReadOptions) -> ReadResult:
    """Read `path` with the named reader, then apply the rules every format shares."""
    return tidy(get_reader(name).read(path, options))


def sniff(path: Path, *, has_mapping: bool = False) -> str:
    """The format name for `path`, from its first bytes; a clear error when none fits."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 * 1024)
    except OSError as e:
        raise BadInputError(f"{path}: cannot read: {e.strerror}") from e
    if not head.strip():
        raise BadInputError(f"{path}: empty file")
    # The user said how to read the columns: a mapping is for the csv reader, whatever the header looks
    # like; a Parquet or JSON file has its own structure and keeps its reader.
    if (
        has_mapping
        and not head.startswith(b"PAR1")
        and head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] not in (b"[", b"{")
    ):
        return "csv"
    for name in SNIFF_ORDER:
        if get_reader(name).sniff(path, head):
            return name
    raise BadInputError(
        f"{path}: cannot tell the format from its first lines; pass --format "
        f"({', '.join(READER_MODULES)}), or --format csv --mapping FILE for another CSV"
    )
