"""Gzipped job logs (`sacct ... | gzip`, archived CSV exports): every reader gets a plain file.

The file is recognised by gzip's magic bytes (a renamed `.gz` still reads), decompressed in a stream to
a temporary file named like the original without `.gz`, and removed afterwards. Messages that name the
temporary file are given the original's name back, so a bad row still points into the user's file.
"""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from headway.traces.base import BadInputError, ReadResult

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False  # the reader says why it cannot open it


@contextmanager
def plain_file(path: Path) -> Iterator[Path]:
    """`path` itself, or for a gzip file a decompressed temporary copy; BadInputError names `path`."""
    if not is_gzip(path):
        yield path
        return
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    with tempfile.TemporaryDirectory(prefix="headway-gunzip-") as tmp:
        plain = Path(tmp) / (name or "log")
        try:
            with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, EOFError, zlib.error) as e:
            raise BadInputError(f"{path}: not a readable gzip file ({e})") from None
        try:
            yield plain
        except BadInputError as e:
            raise BadInputError(str(e).replace(str(plain), str(path))) from None


def relabel(
    res: ReadResult, plain: Path, path: Path | str, note: str | None = "decompressed from gzip"
) -> ReadResult:
    """The result with the temporary file's name replaced by the original's (or by what produced it) in
    bad rows and notes."""
    old, new = str(plain), str(path)
    if old == new:
        return res
    res.bad_rows = [dataclasses.replace(b, file=new) if b.file == old else b for b in res.bad_rows]
    res.notes = [n.replace(old, new) for n in res.notes]
    if note:
        res.notes.append(note)
    return res
