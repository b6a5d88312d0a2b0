"""Vectorized reading of delimited job logs: split lines into string columns, convert whole columns.

Python never loops over rows. Unquoted files (sacct -P) are split by pyarrow's multi-threaded CSV parser
while a numpy pass over the bytes gives each row its line number; other files are read in chunks split by
pyarrow.compute (or by the C csv module when a chunk has quotes). Rows with the wrong number of fields are
bad rows. Every column stays a string array until a converter here turns it into numbers or timestamps
in one call; low-cardinality columns are converted once per distinct value. A converter that fails on a
non-empty value flags the row; `Frame.finish` reports each flagged row once, with its file:line and the
first reason, and drops it.
"""

from __future__ import annotations

import csv
import io
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA, MAX_GPUS, State, conform
from headway.traces.base import (
    EXAMPLES_KEPT,
    ROW_SKIPPED,
    SELDOM_FIELDS,
    STORED_NULL,
    BadInputError,
    BadRow,
    BadRowSink,
    ReadOptions,
    ReadResult,
    split_reason,
)

CHUNK_BYTES = 16 * 1024 * 1024
EPOCH_LIMIT_US = 1e17  # epoch times beyond +-3,168 years (in microseconds) are not times
# Values that mean "no value" in the logs we read (sacct, MySQL dumps, pandas exports).
NULL_WORDS: tuple[str, ...] = ("", "Unknown", "None", "NULL", "null", "\\N", "N/A", "NaN", "nan", "NaT")
# ... and in a numeric column, Slurm's words for no limit or none set.
NUMBER_NULLS: tuple[str, ...] = (*NULL_WORDS, "UNLIMITED", "Partition_Limit", "INVALID")

# A yes/no field (`preemptible`): these words, in any case; an empty cell or a null word is not said.
TRUE_WORDS: tuple[str, ...] = ("true", "yes", "1")
FALSE_WORDS: tuple[str, ...] = ("false", "no", "0")

INT_RE = r"^[+-]?[0-9]+$"
FLOAT_RE = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


def local_tz_name() -> str:
    """The machine's time zone as Arrow understands it: $TZ, /etc/localtime, or the current UTC offset."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    try:
        target = os.path.realpath("/etc/localtime")
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for tz in candidates:
        if tz:
            try:
                return check_tz(tz)
            except BadInputError:
                continue
    off = time.localtime().tm_gmtoff
    sign = "+" if off >= 0 else "-"
    off = abs(off)
    return f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}"


def check_tz(tz: str) -> str:
    """Fail early with one line on a time zone Arrow does not know (`utc` is UTC, as people write it)."""
    if tz.strip().upper() == "UTC":
        return "UTC"
    try:
        pc.assume_timezone(pa.array([0], pa.timestamp("s")), timezone=tz)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
        raise BadInputError(f"unknown time zone {tz!r} (use a name like Europe/Berlin, or UTC)") from e
    return tz


# ---------------------------------------------------------------------------------------------- splitting


class RawColumns:
    """A delimited file as string columns (built on first use), one entry per well-formed data row."""

    def __init__(
        self,
        file: str,
        header: list[str],
        pieces: list[tuple[pa.Array | None, list[Any] | None, int]],
        lines: np.ndarray | Callable[[], np.ndarray],
        bad: list[tuple[int, str]],
        num_rows: int | None = None,
    ) -> None:
        self.file = file
        self.header = header
        # 1-based line number of each row, or a function computing them when first needed (bad rows only).
        self._lines = lines
        self._num_rows = num_rows if num_rows is not None else len(lines)  # type: ignore[arg-type]
        self.bad = bad  # rows with the wrong number of fields: (line, reason)
        # Each piece is (flat values of rows with len(header) fields, None, rows) or (None, columns, rows).
        self._pieces = pieces
        self._cache: dict[int, pa.Array] = {}
        self.notes: list[str] = []  # things the reader of the bytes wants known (e.g. bytes not UTF-8)
        self._index: dict[str, int] = {}
        for i, name in enumerate(header):
            if name:
                self._index.setdefault(name.lower(), i)

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def lines(self) -> np.ndarray:
        if callable(self._lines):
            self._lines = self._lines()
        return self._lines

    @property
    def names(self) -> list[str]:
        return [h for h in self.header if h]

    def column(self, i: int) -> pa.Array:
        if i not in self._cache:
            k = len(self.header)
            parts: list[pa.Array] = []
            for flat, cols, n in self._pieces:
                if flat is not None:
                    parts.append(flat.take(pa.array(np.arange(i, n * k, k, dtype=np.int64))))
                elif cols is not None:
                    col = cols[i]
                    parts.extend(col.chunks if isinstance(col, pa.ChunkedArray) else [col])
            self._cache[i] = pa.concat_arrays(parts) if parts else pa.array([], pa.string())
        return self._cache[i]

    def get(self, *names: str) -> pa.Array | None:
        """The first of `names` present in the header (case-insensitive), or None."""
        for n in names:
            i = self._index.get(n.lower())
            if i is not None:
                return self.column(i)
        return None

    def has(self, *names: str) -> bool:
        return any(n.lower() in self._index for n in names)


def _chunks(path: Path, progress: Callable[[int], None] | None, quoting: bool) -> Iterator[tuple[bytes, int]]:
    """Yield (bytes ending at a line boundary, lines before it); quoted newlines stay in one chunk."""
    done = 0
    line_no = 0
    rest = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK_BYTES)
            data = rest + block
            if not block:
                if data:
                    yield data, line_no
                    done += len(data)
                    if progress:
                        progress(done)
                return
            cut = data.rfind(b"\n") + 1
            # Keep an odd number of quotes (a quoted field spanning lines) together with what follows.
            while quoting and cut > 0 and data.count(b'"', 0, cut) % 2:
                cut = data.rfind(b"\n", 0, cut - 1) + 1
            if cut == 0:
                rest = data
                continue
            chunk, rest = data[:cut], data[cut:]
            yield chunk, line_no
            line_no += chunk.count(b"\n")
            done += len(chunk)
            if progress:
                progress(done)


def _split_lines(text: str) -> pa.Array:
    arr = pa.array([text], pa.large_string())
    lines = pc.split_pattern(arr, "\n").flatten()
    if "\r" in text:
        lines = pc.utf8_rtrim(lines, characters="\r")
    return lines.cast(pa.string())


def _split_simple(lines: pa.Array, sep: str, ncols: int) -> tuple[pa.Array, int, np.ndarray]:
    """Split lines on `sep` (no quoting): flat values of rows with `ncols` fields, their count, all counts."""
    parts = pc.split_pattern(lines, sep)
    counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    ok = counts == ncols
    good = parts if ok.all() else parts.filter(pa.array(ok))
    return good.flatten(), len(good), counts


def _split_quoted(text: str, sep: str) -> Iterator[tuple[int, list[str]]]:
    """(line offset of the row's first line, fields) for CSV text with quotes; C csv module does the work."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep, strict=False)
    start = 0
    try:
        for row in reader:
            yield start, row
            start = reader.line_num
    except csv.Error as e:
        yield start, [f"\x00csv error: {e}"]


def read_delimited(
    path: Path,
    sep: str | None,
    *,
    quoting: bool,
    progress: Callable[[int], None] | None = None,
    comment: str | None = None,
) -> RawColumns:
    """Split `path` into string columns by its header line; `sep=None` picks ',' or tab from the header."""
    if not quoting and sep is not None and comment is None:
        fast = _read_unquoted_fast(path, sep, progress)
        if fast is not None:
            return fast
    file = str(path)
    header: list[str] | None = None
    ncols = 0
    pieces: list[tuple[pa.Array | None, list[pa.Array] | None, int]] = []
    line_parts: list[np.ndarray] = []
    bad: list[tuple[int, str]] = []
    not_utf8 = nul = 0
    first_chunk = True
    for raw, first_line in _chunks(path, progress, quoting):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # read on, but say so: names with such bytes are stored altered
            text = raw.decode("utf-8", errors="replace")
            not_utf8 += text.count("\ufffd")
        if "\x00" in text:  # the csv module stops a field at a NUL: read as U+FFFD, and said
            nul += text.count("\x00")
            text = text.replace("\x00", "\ufffd")
        if first_chunk:
            text = text.removeprefix("\ufeff")  # a BOM before a comment line hid the comment mark
            first_chunk = False
        if header is None:
            # The header is the first non-blank (non-comment) line.
            offset = 0
            for ln in text.split("\n"):
                offset += 1
                s = ln.rstrip("\r")
                if s.strip() and not (comment and s.startswith(comment)):
                    if sep is None:
                        sep = "\t" if "\t" in s and "," not in s else ","
                    row = _header_fields(s, sep, quoting)
                    header = [h.strip().lstrip("\ufeff") for h in row]
                    break
            if header is None:
                continue
            ncols = len(header)
            if ncols < 2:
                raise BadInputError(
                    f"{file}:{first_line + offset}: not a delimited table (no {sep!r} in the header)"
                )
            text = text.split("\n", offset)[offset] if text.count("\n") >= offset else ""
            first_line += offset
        assert sep is not None
        if quoting and '"' in text:
            rows: list[list[str]] = []
            nums: list[int] = []
            for start, fields in _split_quoted(text, sep):
                row_line = first_line + start + 1
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if comment and fields[0].startswith(comment):
                    continue
                if len(fields) != ncols:
                    bad.append((row_line, _count_reason(len(fields), ncols)))
                    continue
                rows.append(fields)
                nums.append(row_line)
            if rows:
                cols = [pa.array(col, pa.string()) for col in zip(*rows, strict=True)]
                pieces.append((None, cols, len(rows)))
                line_parts.append(np.asarray(nums, dtype=np.int64))
            continue
        lines = _split_lines(text)
        if len(lines) and text.endswith("\n"):
            lines = lines.slice(0, len(lines) - 1)  # the empty string after the last newline
        numbers = np.arange(first_line + 1, first_line + 1 + len(lines), dtype=np.int64)
        if comment:
            keep = pc.invert(pc.starts_with(lines, comment)).to_numpy(zero_copy_only=False)
            lines = lines.filter(pa.array(keep))
            numbers = numbers[keep]
        flat, n_good, counts = _split_simple(lines, sep, ncols)
        wrong = counts != ncols
        if wrong.any():
            # Blank lines are not rows; only the few lines with a wrong field count are looked at here.
            for idx in np.nonzero(wrong)[0].tolist():
                if counts[idx] == 1 and not str(lines[idx].as_py() or "").strip():
                    continue
                bad.append((int(numbers[idx]), _count_reason(int(counts[idx]), ncols)))
        pieces.append((flat, None, n_good))
        line_parts.append(numbers[~wrong])
    if header is None:
        raise BadInputError(f"{file}: empty file")
    lines_all = np.concatenate(line_parts) if line_parts else np.zeros(0, dtype=np.int64)
    out = RawColumns(file, header, pieces, lines_all, bad)
    if not_utf8:
        out.notes.append(f"{not_utf8:,} bytes are not UTF-8: they were read as U+FFFD (\ufffd)")
    if nul:
        out.notes.append(f"{nul:,} NUL bytes: they were read as U+FFFD (\ufffd)")
    return out


class _CountingFile(io.RawIOBase):
    """A read-only file that reports the bytes handed out so far (progress for pyarrow's reader)."""

    def __init__(self, path: Path, progress: Callable[[int], None]) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._progress = progress
        self._done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._fh.readinto(b)
        self._done += n or 0
        self._progress(self._done)
        return n or 0

    def close(self) -> None:
        self._fh.close()
        super().close()


def _line_table(path: Path, sep: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes] | None:
    """Per line of an unquoted file: (1-based number, length without CR, separator count) and the first
    line; None when the file has bare CRs (which pyarrow would treat as line ends)."""
    sep_byte = ord(sep)
    numbers: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    seps: list[np.ndarray] = []
    first = b""
    line_no = 0
    carry = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK_BYTES)
            data = carry + block
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if block else len(data)
            if cut == 0:
                carry = data
                continue
            part, carry = data[:cut], data[cut:]
            if b"\r" in part and part.count(b"\r") != part.count(b"\r\n"):
                return None
            if not first:
                first = part[: part.find(b"\n")] if b"\n" in part else part
            arr = np.frombuffer(part, dtype=np.uint8)
            ends = np.flatnonzero(arr == 10)
            if not part.endswith(b"\n"):
                ends = np.append(ends, len(part))
            starts = np.concatenate(([0], ends[:-1] + 1))
            sep_pos = np.flatnonzero(arr == sep_byte)
            count = np.searchsorted(sep_pos, ends) - np.searchsorted(sep_pos, starts)
            length = ends - starts
            has_cr = np.zeros(len(ends), dtype=bool)
            nz = length > 0
            has_cr[nz] = arr[ends[nz] - 1] == 13
            numbers.append(np.arange(line_no + 1, line_no + 1 + len(ends), dtype=np.int64))
            lengths.append(length - has_cr)
            seps.append(count)
            line_no += len(ends)
            if not block:
                break
    if not numbers:
        return None
    return np.concatenate(numbers), np.concatenate(lengths), np.concatenate(seps), first


def _read_unquoted_fast(path: Path, sep: str, progress: Callable[[int], None] | None) -> RawColumns | None:
    """The fast path for unquoted files (sacct -P): pyarrow's multi-threaded CSV parser does the splitting.
    Line numbers come from a numpy pass over the bytes, made only when some row turns out bad.
    None means: use the general path."""
    import pyarrow.csv as pacsv

    with open(path, "rb") as fh:
        head = fh.read(64 * 1024)
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    if not first.strip():
        return None  # empty file, or blank lines before the header: the general path handles them
    try:
        header_text = first.decode("utf-8")
    except UnicodeDecodeError:
        return None
    header = [h.strip().lstrip("\ufeff") for h in header_text.split(sep)]
    ncols = len(header)
    if ncols < 2:
        return None
    invalid: list[int] = []

    def on_invalid(row: Any) -> str:
        invalid.append(row.actual_columns)
        return "skip"

    names = [f"c{i}" for i in range(ncols)]
    source: Any = _CountingFile(path, progress) if progress else str(path)
    # A bad row that is not valid UTF-8 makes pyarrow fail while building what it hands `on_invalid`;
    # that error would reach the user's terminal as "Exception ignored in ...". Catch it for the
    # duration of the read, and let the general path (which reports such rows) take the file.
    unshown: list[Any] = []
    hook = sys.unraisablehook
    sys.unraisablehook = unshown.append
    try:
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, block_size=8 << 20),
            parse_options=pacsv.ParseOptions(
                delimiter=sep,
                quote_char=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
                invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, OSError):
        return None  # e.g. invalid UTF-8: the general path replaces it and reports rows
    finally:
        sys.unraisablehook = hook
        if progress:
            source.close()
    if unshown:
        return None
    n = table.num_rows
    pieces: list[tuple[pa.Array | None, list[Any] | None, int]] = [(None, table.columns, n)]

    def numbering() -> tuple[np.ndarray, list[tuple[int, str]]] | None:
        lt = _line_table(path, sep)
        if lt is None:
            return None
        numbers, length, nsep, _ = lt
        nonblank = length[1:] > 0
        valid = nonblank & (nsep[1:] == ncols - 1)
        wrong = nonblank & ~valid
        bad = [
            (int(k), _count_reason(int(c) + 1, ncols))
            for k, c in zip(numbers[1:][wrong], nsep[1:][wrong], strict=True)
        ]
        rows = numbers[1:][valid]
        return (rows, bad) if len(rows) == n else None

    if invalid:
        # Some rows have the wrong number of fields: number every line now to report them.
        got = numbering()
        if got is None:
            return None
        return RawColumns(str(path), header, pieces, got[0], got[1])

    def lazy_lines() -> np.ndarray:
        got = numbering()
        # Without bad field counts, rows are the non-blank lines after the header, in order.
        return got[0] if got is not None else np.arange(2, n + 2, dtype=np.int64)

    return RawColumns(str(path), header, pieces, lazy_lines, [], num_rows=n)


def _header_fields(line: str, sep: str, quoting: bool) -> list[str]:
    if quoting:
        try:
            return next(csv.reader([line], delimiter=sep))
        except (csv.Error, StopIteration):
            pass
    return line.split(sep)


def _count_reason(found: int, expected: int) -> str:
    more = " (a separator inside a value, such as a job name?)" if found > expected else ""
    return f"expected {expected} fields, found {found}{more}"


def head_fields(head: bytes, sep: str) -> list[str]:
    """Lower-cased header fields of the first non-blank line of `head` (for sniffing)."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    for ln in text.splitlines():
        if ln.strip():
            return [f.strip().strip('"').lower() for f in ln.split(sep)]
    return []


# ---------------------------------------------------------------------------------------------- converting


# Slurm's NO_VAL and INFINITE in 32 and 64 bits (slurm.h), and INT64_MAX that some fields use for none.
SLURM_SENTINELS: tuple[int, ...] = (
    4294967294,
    4294967295,
    18446744073709551614,
    18446744073709551615,
    9223372036854775807,
)
_INT64_SENTINELS = pa.array([v for v in SLURM_SENTINELS if v < 2**63], pa.int64())
# A float-rounded sentinel keeps six significant digits at least (`1.84467e+19` from a spreadsheet).
SENTINEL_REL_TOLERANCE = 5e-6


def _is_sentinel(num: pa.Array) -> pa.Array:
    """Whether each value is one of SLURM_SENTINELS: exactly for integers, to six significant digits
    for floats (the form pandas and spreadsheets leave them in)."""
    if pa.types.is_integer(num.type):
        return pc.is_in(num, value_set=_INT64_SENTINELS)
    hit = pa.array(np.zeros(len(num), dtype=bool))
    for v in SLURM_SENTINELS:
        near = pc.less_equal(pc.abs(pc.subtract(num, float(v))), float(v) * SENTINEL_REL_TOLERANCE)
        hit = pc.or_(hit, pc.fill_null(near, False))
    return hit


def _shown(v: object) -> str | None:
    if v is None:
        return None
    text = str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _with_value(message: str, values: pa.Array | None, i: int) -> str:
    if values is None:
        return message
    return f"{message} ({_shown(values[i].as_py())!r})"


def _mask(mask: pa.Array | np.ndarray) -> np.ndarray:
    if isinstance(mask, np.ndarray):
        return mask
    out: np.ndarray = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    return out


def count_true(mask: pa.Array) -> int:
    return int(pc.sum(pc.fill_null(mask, False)).as_py() or 0)


def with_nulls(values: pa.Array, null_mask: pa.Array) -> pa.Array:
    """`values` with nulls where `null_mask` is true, sharing the string data (no copy)."""
    valid = pc.and_(pc.invert(pc.fill_null(null_mask, False)), pc.is_valid(values))
    if not isinstance(values, pa.StringArray) or values.offset != 0 or valid.offset != 0:
        return pc.if_else(valid, values, pa.scalar(None, values.type))
    bufs = values.buffers()
    return pa.Array.from_buffers(values.type, len(values), [valid.buffers()[1], bufs[1], bufs[2]])


class Frame:
    """Converts the columns of one RawColumns and remembers, per row, the first conversion that failed.

    Converters take raw string columns; low-cardinality ones (states, TRES, limits, exit codes) are
    converted once per distinct value and spread back with `take`, which is what makes big logs fast.
    """

    def __init__(self, raw: RawColumns, *, trim: bool = True) -> None:
        self.raw = raw
        self.n = raw.num_rows
        self.trim = trim
        self._fail = np.full(self.n, -1, dtype=np.int32)  # index into _reasons, -1 = fine
        self._reasons: list[tuple[str, pa.Array | None]] = []  # (message, raw values to quote)
        # Every problem with its rows: those that skip a row (`flag`) and values stored as null (`soft`).
        self._hard: list[tuple[np.ndarray, str, pa.Array | None]] = []
        self._soft: list[tuple[np.ndarray, str, pa.Array | None]] = []
        # Values read as what they mean, per kind: (column, rows, examples), told in one note per kind.
        self._read_as: dict[str, list[tuple[str, int, list[str]]]] = {}
        self._clean: dict[tuple[int, tuple[str, ...]], tuple[pa.Array, pa.Array]] = {}
        self.notes: list[str] = []
        self.skip = np.zeros(self.n, dtype=bool)  # rows dropped silently (e.g. job steps)
        self.notes.extend(raw.notes)
        self._unknown: list[tuple[np.ndarray, pa.Array, str]] = []  # (rows, words, what) for `finish`'s note
        self._flag_repeated_header()

    def _flag_repeated_header(self) -> None:
        """A row that repeats the header (logs joined with `cat`) was stored as a job named after it."""
        named = [(i, h) for i, h in enumerate(self.raw.header) if h]
        if not self.n or len(named) < 2:
            return
        same = None
        for k, (i, h) in enumerate(named):
            col = pc.utf8_trim_whitespace(self.raw.column(i))
            if k == 0:  # each joined file may start with its own BOM
                col = pc.utf8_ltrim(col, characters="\ufeff")
            eq = pc.fill_null(pc.equal(col, h), False)
            same = eq if same is None else pc.and_(same, eq)
            if not pc.any(same).as_py():
                return
        assert same is not None
        self.flag(same, "a repeated header line (logs joined together?)")

    def flag(self, mask: pa.Array | np.ndarray, message: str, values: pa.Array | None = None) -> None:
        """Mark rows where `mask` is true as bad with `message` (`column: why`) and the offending raw
        value: for what the job record cannot do without (its id, submit time, state, GPU count)."""
        m = _mask(mask) & ~self.skip
        if m.any():
            self._hard.append((m, message, values))
            first = m & (self._fail < 0)
            if first.any():
                self._reasons.append((message, values))
                self._fail[first] = len(self._reasons) - 1

    def soft(self, mask: pa.Array | np.ndarray, message: str, values: pa.Array | None = None) -> None:
        """Count rows where `mask` is true as having an unreadable value that is stored as null: the job
        is kept (a memory figure or an array id the record can do without never costs the job)."""
        m = _mask(mask) & ~self.skip
        if m.any():
            self._soft.append((m, message, values))

    def bad(self, mask: pa.Array | np.ndarray, message: str, values: pa.Array | None, required: bool) -> None:
        """`flag` for a required field, `soft` for any other."""
        (self.flag if required else self.soft)(mask, message, values)

    def count_words(self, values: pa.Array, nulls: Sequence[str], what: str) -> None:
        """A note for the words that mean no value (UNLIMITED, Unknown, None...) in a numeric column."""
        words = [w for w in nulls if w]
        s = pc.utf8_trim_whitespace(values) if self.trim else values
        hit = pc.is_in(s, value_set=pa.array(words, pa.string()))
        if not pc.any(hit).as_py():
            return
        counts = pc.value_counts(s.filter(pc.and_(hit, pa.array(~self.skip)))).to_pylist()
        if counts:
            total = sum(int(c["counts"]) for c in counts)
            self._tell("words", what, total, [repr(c["values"]) for c in counts])

    def _sentinels(self, num: pa.Array, what: str, values: pa.Array) -> pa.Array:
        """Slurm's NO_VAL and INFINITE (32 and 64 bits, also float-rounded) as null, with a note."""
        hit = pc.fill_null(_is_sentinel(num), False)
        if not pc.any(hit).as_py():
            return num
        self.note_sentinels(hit, what, values)
        return pc.if_else(hit, pa.scalar(None, num.type), num)

    def note_sentinels(self, hit: pa.Array, what: str, values: pa.Array) -> None:
        k = count_true(pc.and_(hit, pa.array(~self.skip)))
        if k:
            shown = pc.unique(pc.utf8_trim_whitespace(values.filter(hit).slice(0, 200))).to_pylist()
            self._tell("sentinels", what, k, sorted(str(v) for v in shown))

    def _tell(self, kind: str, what: str, rows: int, examples: list[str]) -> None:
        self._read_as.setdefault(kind, []).append((what, rows, examples))

    def _read_as_notes(self) -> list[str]:
        """One note per kind of value read as what it means, naming each column with its count."""
        intro = {
            "decimals": "integers written as decimals (pandas, R or a spreadsheet wrote the column as "
            "floats), read as integers",
            "sentinels": "Slurm's NO_VAL or INFINITE (not set, no limit), read as no value",
            "words": "words for no value, read as no value",
        }
        notes = []
        for kind, entries in self._read_as.items():
            parts = [f"{what} {rows:,} ({', '.join(ex[:3])})" for what, rows, ex in entries]
            notes.append(f"{intro[kind]}: {'; '.join(parts)}")
        return notes

    def clean(self, values: pa.Array, nulls: Sequence[str] = NULL_WORDS) -> pa.Array:
        """Strings with surrounding blanks removed and null words as null (cached per column)."""
        key = (id(values), tuple(nulls))
        hit = self._clean.get(key)
        # The array is kept with its result: an id alone is reused once a temporary array is freed.
        if hit is None or hit[0] is not values:
            s = pc.utf8_trim_whitespace(values) if self.trim else values
            is_null = pc.is_in(s, value_set=pa.array(list(nulls), pa.string()))
            hit = self._clean[key] = (values, with_nulls(s, is_null))
        return hit[1]

    def text(self, values: pa.Array | None) -> pa.Array:
        """A string field: trimmed, null words as null."""
        if values is None:
            return pa.nulls(self.n, pa.string())
        return self.clean(values)

    def integer(
        self,
        values: pa.Array | None,
        what: str,
        *,
        nulls: Sequence[str] = NUMBER_NULLS,
        required: bool = False,
        sentinels: bool = True,
    ) -> pa.Array:
        """int64 column. Integers written as floats (`1003.0`, `7.49399e+13`: pandas, R and spreadsheets
        write integer columns so when they have a gap) are read as integers, with a note; Slurm's NO_VAL
        and INFINITE are null (`sentinels`); any other value is unreadable: `bad` (null, or a skipped row
        when `required`)."""
        if values is None:
            return pa.nulls(self.n, pa.int64())
        s = self.clean(values, nulls)
        self.count_words(values, nulls, what)
        try:
            out = s.cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out = None
        if out is not None:
            return self._sentinels(out, what, values) if sentinels else out
        is_int = pc.fill_null(pc.match_substring_regex(s, INT_RE), False)
        short = pc.fill_null(pc.less_equal(pc.utf8_length(pc.utf8_ltrim(s, characters="+-0")), 18), False)
        exact = pc.and_(is_int, short)
        ints = pc.if_else(exact, s, pa.scalar(None, pa.string())).cast(pa.int64())
        is_float = pc.and_(pc.fill_null(pc.match_substring_regex(s, FLOAT_RE), False), pc.invert(exact))
        num = pc.if_else(is_float, s, pa.scalar(None, pa.string())).cast(pa.float64())
        sentinel = pa.array(np.zeros(self.n, dtype=bool))
        if sentinels:
            sentinel = pc.or_(pc.fill_null(_is_sentinel(ints), False), pc.fill_null(_is_sentinel(num), False))
            self.note_sentinels(sentinel, what, values)
            ints = pc.if_else(sentinel, pa.scalar(None, pa.int64()), ints)
            num = pc.if_else(sentinel, pa.scalar(None, pa.float64()), num)
        integral = pc.fill_null(pc.equal(num, pc.floor(num)), False)
        fits = pc.fill_null(pc.less_equal(pc.abs(num), 2.0**53), False)
        repaired = pc.and_(integral, fits)
        k = count_true(pc.and_(repaired, pa.array(~self.skip)))
        if k:
            self._tell("decimals", what, k, sorted({str(v) for v in s.filter(repaired).to_pylist()[:50]}))
        lost = pc.and_(integral, pc.invert(fits))
        self.bad(
            lost,
            f"{what}: a float too large to hold an exact integer (rounded by a spreadsheet?)",
            values,
            required,
        )
        readable = pc.or_(pc.or_(pc.or_(exact, repaired), pc.invert(pc.is_valid(s))), sentinel)
        self.bad(pc.and_(pc.invert(readable), pc.invert(lost)), f"{what}: not an integer", values, required)
        from_float = pc.if_else(repaired, num, pa.scalar(None, pa.float64())).cast(pa.int64())
        return pc.coalesce(ints, from_float)

    def number(
        self,
        values: pa.Array | None,
        what: str,
        *,
        nulls: Sequence[str] = NUMBER_NULLS,
        required: bool = False,
        sentinels: bool = True,
    ) -> pa.Array:
        """float64 column; a non-empty value that is not a finite number is unreadable (`bad`); Slurm's
        NO_VAL and INFINITE are null (`sentinels`)."""
        if values is None:
            return pa.nulls(self.n, pa.float64())
        s = self.clean(values, nulls)
        self.count_words(values, nulls, what)
        try:
            out = s.cast(pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            ok = pc.fill_null(pc.match_substring_regex(s, FLOAT_RE), False)
            self.bad(pc.and_(pc.is_valid(s), pc.invert(ok)), f"{what}: not a number", values, required)
            out = pc.if_else(ok, s, pa.scalar(None, pa.string())).cast(pa.float64())
        finite = pc.fill_null(pc.is_finite(out), True)
        if not pc.all(finite).as_py():
            self.bad(pc.invert(finite), f"{what}: not a finite number", values, required)
            out = pc.if_else(finite, out, pa.scalar(None, pa.float64()))
        return self._sentinels(out, what, values) if sentinels else out

    def boolean(self, values: pa.Array | None, what: str) -> pa.Array:
        """bool column from true/false, yes/no or 1/0 in any case (TRUE_WORDS, FALSE_WORDS); an empty cell
        or a null word is null, any other value unreadable: stored as null and counted (`soft`), since no
        yes/no field is one the job record cannot do without."""
        if values is None:
            return pa.nulls(self.n, pa.bool_())
        s = pc.utf8_lower(self.clean(values))
        yes = pc.is_in(s, value_set=pa.array(TRUE_WORDS, pa.string()))
        no = pc.is_in(s, value_set=pa.array(FALSE_WORDS, pa.string()))
        self.soft(
            pc.and_(pc.is_valid(s), pc.invert(pc.or_(yes, no))),
            f"{what}: not true/false, yes/no or 1/0",
            values,
        )
        return pc.if_else(yes, True, pc.if_else(no, False, pa.scalar(None, pa.bool_())))

    def whole(
        self, num: pa.Array, what: str, values: pa.Array | None = None, *, required: bool = False
    ) -> pa.Array:
        """int64 from float64 counts; a fraction or a value beyond 2**53 is unreadable (`bad`)."""
        ok = pc.and_(pc.equal(num, pc.floor(num)), pc.less_equal(pc.abs(num), 2.0**53))
        self.bad(
            pc.and_(pc.is_valid(num), pc.invert(pc.fill_null(ok, False))),
            f"{what}: not a whole number",
            values,
            required,
        )
        return pc.if_else(pc.fill_null(ok, False), num, pa.scalar(None, pa.float64())).cast(pa.int64())

    def timestamp(
        self,
        values: pa.Array | None,
        what: str,
        formats: Sequence[str],
        tz: str | None,
        epoch_unit: str | None = None,
        *,
        ambiguous: str = "earliest",
        check: bool = True,
        required: bool = False,
    ) -> pa.Array:
        """UTC timestamps from strings in one of `formats` (tried in order); naive ones are in `tz`.

        With `epoch_unit`, plain numbers are read as epoch times in that unit (s, ms, us) as well. A
        local time repeated when clocks go back is read as its `ambiguous` ("earliest" or "latest")
        occurrence; `check=False` reads again without flagging rows (a second reading of one column).
        """
        if values is None:
            return pa.nulls(self.n, pa.timestamp("us", tz="UTC"))
        s = self.clean(values)
        out: pa.Array | None = None
        told = pa.array(np.zeros(self.n, dtype=bool))  # values already found bad as epoch numbers
        if epoch_unit is not None:
            numeric = pc.fill_null(pc.match_substring_regex(s, r"^[0-9]{1,16}(\.[0-9]*)?$"), False)
            if pc.any(numeric).as_py():
                nums = pc.if_else(numeric, s, pa.scalar(None, pa.string())).cast(pa.float64())
                us = pc.round(pc.multiply(nums, {"s": 1e6, "ms": 1e3, "us": 1.0}[epoch_unit]))
                in_range = pc.fill_null(pc.less(us, EPOCH_LIMIT_US), True)  # the pattern has no minus sign
                if check:
                    unit = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}[epoch_unit]
                    self.bad(
                        pc.invert(in_range),
                        f"{what}: epoch time out of range (read as {unit})",
                        values,
                        required,
                    )
                told = pc.invert(in_range)
                us = pc.if_else(in_range, us, pa.scalar(None, pa.float64()))
                out = us.cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        for fmt in formats:
            todo = s if out is None else pc.if_else(pc.is_null(out), s, pa.scalar(None, pa.string()))
            if out is not None and not pc.any(pc.is_valid(todo)).as_py():
                break
            parsed = pc.strptime(todo, format=fmt, unit="us", error_is_null=True)
            if "%z" not in fmt and tz is not None and tz != "UTC":
                parsed = pc.assume_timezone(parsed, timezone=tz, ambiguous=ambiguous, nonexistent="latest")
            parsed = parsed.cast(pa.timestamp("us", tz="UTC"))
            out = parsed if out is None else pc.coalesce(out, parsed)
        assert out is not None
        if check:
            self.bad(
                pc.and_(pc.and_(pc.is_valid(s), pc.is_null(out)), pc.invert(told)),
                f"{what}: not a time in the expected format",
                values,
                required,
            )
        return out

    def epoch(
        self,
        values: pa.Array | None,
        what: str,
        unit: str = "s",
        zero_is_null: bool = True,
        *,
        required: bool = False,
    ) -> pa.Array:
        """UTC timestamps from epoch numbers in `unit` (s, ms, us); 0 means unset unless told otherwise."""
        nums = self.number(values, what, required=required)
        if zero_is_null:
            nums = pc.if_else(pc.equal(nums, 0.0), pa.scalar(None, pa.float64()), nums)
        scale = {"s": 1_000_000.0, "ms": 1_000.0, "us": 1.0}[unit]
        us = pc.multiply(nums, scale)
        in_range = pc.and_(pc.greater(us, -EPOCH_LIMIT_US), pc.less(us, EPOCH_LIMIT_US))
        self.bad(pc.invert(in_range), f"{what}: epoch time out of range", values, required)
        us = pc.if_else(in_range, pc.round(us), pa.scalar(None, pa.float64()))
        return us.cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))

    def per_distinct(
        self,
        values: pa.Array,
        convert: Callable[[pa.Array], tuple[pa.Array, pa.Array | None]],
        what: str,
        *,
        required: bool = False,
    ) -> pa.Array:
        """Apply `convert(distinct values) -> (result, bad mask)` once per distinct value, spread to rows;
        a value that `convert` finds bad is null in the result (or skips its row when `required`)."""
        enc = pc.dictionary_encode(values)
        result_d, bad_d = convert(enc.dictionary)
        if bad_d is None:
            return pc.take(result_d, enc.indices)
        bad = pc.take(bad_d, enc.indices)
        self.bad(bad, what, values, required)
        return pc.if_else(
            pc.fill_null(bad, False), pa.scalar(None, result_d.type), pc.take(result_d, enc.indices)
        )

    def states(self, words: pa.Array, mapping: dict[str, State], what: str) -> pa.Array:
        """Map words to State values; unmapped non-empty words become UNKNOWN with a note."""
        keys = list(mapping)
        enc = pc.dictionary_encode(words)
        idx = pc.index_in(enc.dictionary, value_set=pa.array(keys, pa.string()))
        vals = pa.array([mapping[k].value for k in keys], pa.string())
        mapped_d = pc.fill_null(pc.take(vals, idx), State.UNKNOWN.value)
        unknown_d = pc.is_null(idx)
        unknown = (
            pc.fill_null(pc.take(unknown_d, enc.indices), False).to_numpy(zero_copy_only=False) & ~self.skip
        )
        if unknown.any():  # noted in `finish`, counting only the rows that are stored
            self._unknown.append((unknown, words, what))
        return pc.fill_null(pc.take(mapped_d, enc.indices), State.UNKNOWN.value)

    def _check_job(self, columns: dict[str, pa.Array]) -> None:
        """What every format must satisfy, whatever its reader checked: a job cannot end before it
        started, nor ask for a negative number of GPUs (the audit would count such a job as an early
        failure with negative hours)."""
        start, end = columns.get("start_time"), columns.get("end_time")
        if start is not None and end is not None:
            self.flag(pc.less(end, start), "end time is before start time")
        gpus = columns.get("gpus")
        if gpus is not None:
            self.flag(pc.less(gpus, 0), "GPU count is negative")
            self.flag(pc.greater(gpus, MAX_GPUS), f"GPU count is over {MAX_GPUS:,}")

    def _report(self, sink: BadRowSink) -> None:
        """Bad rows to the sink in line order, each naming all its problems; every problem counted per
        column and reason with its first examples (`file:line: value`)."""
        file, lines = self.raw.file, None
        keep = (self._fail < 0) & ~self.skip
        failed = np.nonzero(self._fail >= 0)[0]
        if len(failed) or self.raw.bad or self._soft:
            lines = self.raw.lines
        bad_rows: list[BadRow] = [BadRow(file, ln, why) for ln, why in self.raw.bad]
        for ln, why in self.raw.bad:
            sink.problem("(row)", why, ROW_SKIPPED, 1, [(file, ln, None)])
        every = [*self._hard, *self._soft]
        for i in failed[: sink.keep + 1].tolist():
            reasons = [_with_value(message, values, i) for m, message, values in every if m[i]]
            bad_rows.append(BadRow(file, int(lines[i]), "; ".join(reasons)))  # type: ignore[index]
        bad_rows.sort(key=lambda b: b.line)
        for b in bad_rows:
            sink.row(b)
        # Rows past the kept examples are only counted.
        sink.count += max(0, len(failed) - (sink.keep + 1))
        for effect, entries in ((ROW_SKIPPED, self._hard), (STORED_NULL, self._soft)):
            for m, message, values in entries:
                rows = m if effect == ROW_SKIPPED else m & keep
                k = int(rows.sum())
                if not k:
                    continue
                column, why = split_reason(message)
                idx = np.nonzero(rows)[0][:EXAMPLES_KEPT]
                shown: list[str | None] = (
                    [_shown(v) for v in values.take(pa.array(idx)).to_pylist()]
                    if values is not None
                    else [None] * len(idx)
                )
                examples = [(file, int(lines[j]), v) for j, v in zip(idx.tolist(), shown, strict=True)]  # type: ignore[index]
                sink.problem(column, why, effect, k, examples)

    def finish(
        self, columns: dict[str, pa.Array], options: ReadOptions, fmt: str, sink: BadRowSink | None = None
    ) -> tuple[pa.Table, BadRowSink]:
        """Drop bad and skipped rows, send bad rows to the sink in line order, return the schema table."""
        sink = sink or BadRowSink(options.strict)
        self._check_job(columns)
        for name, col in columns.items():
            if (
                name in JOB_SCHEMA.names
                and JOB_SCHEMA.field(name).type == pa.int32()
                and col.type != pa.int32()
            ):
                fits = pc.and_(pc.greater_equal(col, -(2**31)), pc.less(col, 2**31))
                self.soft(pc.invert(fits), f"{name}: value too large")
                columns[name] = pc.if_else(fits, col, pa.scalar(None, col.type))
        self._report(sink)
        self.notes.extend(self._read_as_notes())
        keep = (self._fail < 0) & ~self.skip
        for unknown, words, what in self._unknown:
            stored = unknown & keep
            if stored.any():
                seen = sorted({str(w) for w in pc.unique(words.filter(pa.array(stored))).to_pylist()})[:5]
                self.notes.append(
                    f"{int(stored.sum())} rows with an unrecognised {what} {seen} stored as UNKNOWN"
                )
        mask = pa.array(keep)
        everything = bool(keep.all())
        cols = {k: (v if everything else v.filter(mask)) for k, v in columns.items() if k in JOB_SCHEMA.names}
        n = self.n if everything else int(keep.sum())
        cols["source"] = pa.array([options.source or fmt], pa.string()).take(pa.array(np.zeros(n, np.int64)))
        return conform(pa.table(cols)), sink


def result(
    table: pa.Table,
    fmt: str,
    frame: Frame,
    sink: BadRowSink,
    provided: set[str],
    extra_notes: Sequence[str] = (),
) -> ReadResult:
    """The ReadResult of a tabular reader; `provided` are the schema fields the input had."""
    missing = [f for f in JOB_SCHEMA.names if f not in provided and f != "source" and f not in SELDOM_FIELDS]
    rows_read = int((~frame.skip).sum()) + len(frame.raw.bad)
    return ReadResult(
        table=table,
        format=fmt,
        rows_read=rows_read,
        bad_rows=sink.rows,
        bad_row_count=sink.count,
        missing_fields=missing,
        notes=[*frame.notes, *extra_notes],
        problems=sink.problems,
    )


# ---------------------------------------------------------------------------------------------- helpers


def first_word_upper(values: pa.Array) -> pa.Array:
    """'CANCELLED by 1001' -> 'CANCELLED' (upper-cased); nulls stay null. Works per distinct value."""
    enc = pc.dictionary_encode(values)
    d = pc.utf8_upper(pc.replace_substring_regex(pc.utf8_trim_whitespace(enc.dictionary), r"\s.*$", ""))
    return pc.take(d, enc.indices)


DURATION_NULLS = NUMBER_NULLS
_DURATION_RE = (
    r"^(?:(?P<d>[0-9]{1,6})-)?(?P<a>[0-9]{1,9})(?::(?P<b>[0-9]{1,9}))?(?::(?P<c>[0-9]{1,9}(?:\.[0-9]+)?))?$"
)


def _durations(s: pa.Array) -> tuple[pa.Array, pa.Array]:
    parts = pc.extract_regex(s, _DURATION_RE)

    def part(name: str) -> pa.Array:
        f = pc.struct_field(parts, name)
        return pc.fill_null(pc.if_else(pc.equal(f, ""), pa.scalar("0"), f), "0").cast(pa.float64())

    d, a, b, c = part("d"), part("a"), part("b"), part("c")
    colons = pc.fill_null(pc.count_substring(s, ":"), 0)
    days = pc.fill_null(pc.not_equal(pc.struct_field(parts, "d"), ""), False)
    # Slurm: HH:MM:SS with two colons, MM:SS with one, bare minutes with none; after D- the first field is
    # hours: D-HH:MM:SS, D-HH:MM, D-HH (D-HH was read as D days and HH minutes, D-HH:MM as minutes:seconds).
    no_days = pc.if_else(
        pc.greater_equal(colons, 2),
        pc.add(pc.add(pc.multiply(a, 3600.0), pc.multiply(b, 60.0)), c),
        pc.if_else(pc.equal(colons, 1), pc.add(pc.multiply(a, 60.0), b), pc.multiply(a, 60.0)),
    )
    with_days = pc.add(pc.add(pc.multiply(a, 3600.0), pc.multiply(b, 60.0)), c)
    total = pc.add(pc.multiply(d, 86400.0), pc.if_else(days, with_days, no_days))
    # Every field but the leading one is in range (90:00 is 90 minutes; 5:99 and 1-25:99:00 are no time).
    out_of_range = pc.or_(
        pc.or_(pc.greater(b, 59.0), pc.greater_equal(c, 60.0)), pc.and_(days, pc.greater(a, 23.0))
    )
    ok = pc.and_(pc.is_valid(parts), pc.invert(pc.fill_null(out_of_range, False)))
    bad = pc.and_(pc.is_valid(s), pc.invert(pc.fill_null(ok, False)))
    return pc.if_else(ok, pc.round(total), pa.scalar(None, pa.float64())).cast(pa.int64()), bad


def duration_seconds(frame: Frame, values: pa.Array | None, what: str) -> pa.Array:
    """Slurm durations `[D-]HH:MM:SS`, `MM:SS`, `MM` (minutes), `D-HH`, `D-HH:MM` to seconds; UNLIMITED etc.
    are null. A field out of range is unreadable, as text that is no duration is (null, the job kept)."""
    if values is None:
        return pa.nulls(frame.n, pa.int64())
    frame.count_words(values, DURATION_NULLS, what)
    s = frame.clean(values, DURATION_NULLS)
    return frame.per_distinct(
        s,
        _durations,
        f"{what}: not a duration like 1-02:03:04 (hours 0-23 after days; minutes, seconds 0-59)",
    )


@dataclass(slots=True)
class KeyValues:
    """A `k=v,k=v` column (TRES strings) exploded: one entry per pair, with the row it came from."""

    row: np.ndarray  # index of the distinct string each pair came from
    key: pa.Array
    value: pa.Array  # float64, null where the value is not a number
    rows_of: np.ndarray  # for each input row, the index of its distinct string
    distinct: int
    text: pa.Array | None = None  # each pair as written (trimmed)

    def unreadable(self, prefix: str) -> np.ndarray:
        """Per input row: whether a pair whose key starts with `prefix` has no number as its value
        (`gres/gpu=x`), which would otherwise be skipped as if it were absent."""
        if self.text is None:
            return np.zeros(len(self.rows_of), dtype=bool)
        bad = pc.and_(pc.starts_with(self.text, prefix), pc.is_null(self.value))
        m = pc.fill_null(bad, False).to_numpy(zero_copy_only=False)
        hit = np.bincount(self.row[m], minlength=self.distinct) > 0
        out: np.ndarray = hit[self.rows_of]
        return out


MEM_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024, "P": 1024.0**3}


def unit_scale(units: pa.Array) -> pa.Array:
    """MB per unit for K/M/G/T/P suffixes (no suffix: MB)."""
    keys = pa.array(list(MEM_UNITS), pa.string())
    vals = pa.array(list(MEM_UNITS.values()), pa.float64())
    return pc.fill_null(pc.take(vals, pc.index_in(units, value_set=keys)), 1.0)


def explode_pairs(values: pa.Array) -> KeyValues:
    """Explode TRES-like `key=value,...` strings; values may carry a K/M/G/T suffix (kept as MB).

    Rows index the distinct strings (`KeyValues.rows_of` maps them back), since TRES strings repeat a lot.
    """
    enc = pc.dictionary_encode(pc.fill_null(values, ""))
    items = pc.split_pattern(enc.dictionary, ",")
    rows = pc.list_parent_indices(items).to_numpy(zero_copy_only=False)
    flat = pc.utf8_trim_whitespace(items.flatten())
    kv = pc.extract_regex(flat, r"^(?P<k>[^=]+)=(?P<v>[0-9.]+)(?P<u>[KMGTP]?)$")
    key = pc.struct_field(kv, "k")
    num = pc.struct_field(kv, "v")
    num = pc.if_else(pc.match_substring_regex(num, FLOAT_RE), num, pa.scalar(None, pa.string()))
    val = pc.multiply(num.cast(pa.float64()), unit_scale(pc.struct_field(kv, "u")))
    return KeyValues(rows, key, val, enc.indices.to_numpy(zero_copy_only=False), len(enc.dictionary), flat)


def sum_where(kv: KeyValues, mask: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per input row: (sum of values whose key matches `mask`, whether any matched)."""
    m = pc.fill_null(pc.and_(mask, pc.is_valid(kv.value)), False).to_numpy(zero_copy_only=False)
    vals = pc.fill_null(kv.value, 0.0).to_numpy(zero_copy_only=False)
    sums = np.bincount(kv.row[m], weights=vals[m], minlength=kv.distinct).astype(np.float64)
    hit = np.bincount(kv.row[m], minlength=kv.distinct) > 0
    return sums[kv.rows_of], hit[kv.rows_of]


def masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    """An Arrow array from numpy values, null where `valid` is false."""
    return pa.array(values, mask=~valid).cast(typ)


def is_step_id(job_ids: pa.Array) -> pa.Array:
    """Slurm job-step ids (`12.batch`, `12.0`, `12_3.extern`, `12+0.0`)."""
    return pc.fill_null(pc.match_substring(job_ids, "."), False)


def ident(name: str) -> str:
    """A column header as a Python-like identifier (for expressions)."""
    return re.sub(r"\W", "_", name)
