"""Parquet files in the job schema: what `headway export` and `headway synth` write, read back.

Columns are matched by name (export's derived runtime, wait and gpu_hours are ignored: the store derives
them again). Each row keeps its own `source` (an export of several clusters stays several) unless
`--source` names one; a file without the column gets `parquet`. Rows are checked as every reader checks
them: an id and a known state, no end before its start, no negative GPU count.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA, MAX_GPUS, State, conform
from headway.traces.base import SELDOM_FIELDS, BadInputError, BadRowSink, ReadOptions, ReadResult

MAGIC = b"PAR1"
_STATES = pa.array([s.value for s in State], pa.string())


_LAST_YEAR = 9999  # Python's datetimes end there, and so does every report


def _beyond_calendar(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """Times past Python's last year (Arrow holds 292,000 years): a store with one broke every audit."""
    limit = pa.scalar(dt.datetime(_LAST_YEAR, 12, 31, 23, 59, 59, tzinfo=dt.UTC), col.type)
    first = pa.scalar(dt.datetime(1, 1, 1, tzinfo=dt.UTC), col.type)
    return pc.fill_null(pc.or_(pc.greater(col, limit), pc.less(col, first)), False)


class ParquetReader:
    name = "parquet"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head[:4] == MAGIC

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        import pyarrow.parquet as pq

        try:
            raw = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise BadInputError(f"{path}: not a readable Parquet file: {str(e).splitlines()[0]}") from None
        missing = [c for c in ("job_id", "state") if c not in raw.column_names]
        if missing:
            raise BadInputError(
                f"{path}: not a Parquet file in the job schema (what `headway export` writes): no "
                f"{missing[0]} column (found {', '.join(raw.column_names[:8]) or 'nothing'})"
            )
        n = raw.num_rows
        if options.source is not None or "source" not in raw.column_names:
            src = pa.array([options.source or self.name] * n, pa.string())
            raw = raw.drop_columns([c for c in ("source",) if c in raw.column_names]).append_column(
                "source", src
            )
        try:
            table = conform(raw)
        except (ValueError, pa.ArrowException) as e:  # a column of the wrong type for the schema
            raise BadInputError(
                f"{path}: not a Parquet file in the job schema: {str(e).splitlines()[0]}"
            ) from None
        table = table.set_column(
            table.schema.get_field_index("source"), "source", pc.fill_null(table.column("source"), self.name)
        )
        checks = (
            # '' too: three such rows would collapse into one job, as the text readers refuse them.
            (
                pc.fill_null(pc.equal(pc.utf8_trim_whitespace(table.column("job_id")), ""), True),
                "job_id: empty",
            ),
            (
                pc.invert(pc.fill_null(pc.is_in(table.column("state"), value_set=_STATES), False)),
                "state: not a job state",
            ),
            (
                pc.fill_null(pc.less(table.column("end_time"), table.column("start_time")), False),
                "ends before it starts",
            ),
            (pc.fill_null(pc.less(table.column("gpus"), 0.0), False), "gpus: negative"),
            (
                pc.fill_null(pc.greater(table.column("gpus"), float(MAX_GPUS)), False),
                f"gpus: over {MAX_GPUS:,}",
            ),
            *(
                (_beyond_calendar(table.column(c)), f"{c}: beyond year {_LAST_YEAR}")
                for c in ("submit_time", "start_time", "end_time")
            ),
        )
        bad = pa.array([False] * n, pa.bool_())
        found: dict[int, str] = {}  # row -> the first rule it breaks
        for mask, reason in checks:
            for i in pc.indices_nonzero(pc.and_(mask, pc.invert(bad))).to_pylist():
                found[i] = reason
            bad = pc.or_(bad, mask)
        sink = BadRowSink(options.strict)
        for i in sorted(found):
            sink.add(str(path), i + 1, found[i])  # the row's number in the file, 1-based
        table = table.filter(pc.invert(bad))
        absent = [
            f.name for f in JOB_SCHEMA if f.name not in raw.column_names and f.name not in SELDOM_FIELDS
        ]
        return ReadResult(
            table=table,
            format=self.name,
            rows_read=n,
            bad_rows=sink.rows,
            bad_row_count=sink.count,
            missing_fields=absent,
        )


READER = ParquetReader()
