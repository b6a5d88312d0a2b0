"""Any CSV job log plus a TOML mapping that says which column is which field (docs/csv-mapping.md).

The mapping names schema fields and where each comes from: a column, an arithmetic expression over
numeric columns (`gpu_per_node * nodes`), a count inside a Slurm TRES string column
(`{ column = "tres_alloc", tres = "gres/gpu" }`), or a constant. It also gives the delimiter, the time
format (strftime, or epoch seconds/ms/us), the time zone of naive times, units, the names of numeric TRES
ids, and a state value map. Every mapping error names the mapping file and the key.
"""

from __future__ import annotations

import ast
import csv
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA, State
from headway.traces import tabular as tb
from headway.traces.base import BadInputError, ReadOptions, ReadResult
from headway.traces.sacct import STATE_MAP

TEXT_FIELDS = ("job_id", "user", "group", "name", "partition", "priority_class")
TIME_FIELDS = ("submit_time", "start_time", "end_time")
NUMBER_FIELDS = ("gpus", "nodes", "cpus", "mem_mb", "time_limit", "exit_code", "checkpoint_every")
INT_FIELDS = ("nodes", "cpus", "mem_mb", "time_limit", "exit_code", "checkpoint_every")
# Yes/no fields: a column of true/false, yes/no or 1/0 (any case), or a TOML true/false constant.
BOOL_FIELDS = ("preemptible",)
EPOCH_UNITS = ("s", "ms", "us")
TIME_LIMIT_UNITS = {"s": 1, "min": 60, "h": 3600}
MEM_UNITS = {"kb": 1 / 1024, "mb": 1, "gb": 1024, "tb": 1024 * 1024}
_FORMAT_KEYS = {
    "delimiter",
    "time_format",
    "epoch_unit",
    "timezone",
    "time_limit_unit",
    "mem_unit",
    "comment",
    "tres_ids",
}
_FIELD_KEYS = {"column", "time_format", "epoch_unit", "tres", "null_values"}
# Fields that can be read as a count inside a TRES string (`tres = "gres/gpu"`).
TRES_FIELDS = ("gpus", "cpus", "mem_mb", "nodes")
# Slurm's fixed TRES ids (src/common/slurmdb_defs.h: TRES_CPU = 1 ... TRES_PAGES = 8); gres, license and
# burst-buffer TRES get site-specific ids from 1001 on, which only the cluster's tres_table can name.
SLURM_TRES_IDS: dict[str, str] = {
    "1": "cpu",
    "2": "mem",
    "3": "energy",
    "4": "node",
    "5": "billing",
    "6": "fs/disk",
    "7": "vmem",
    "8": "pages",
}
# Slurm's 64-bit NO_VAL (0xfffffffffffffffe) and INFINITE: "not set", not a count; any value this big is.
TRES_NO_VALUE = 2.0**63
_TRES_NULLS = ("", "NULL", "null", "\\N", "None")


@dataclass(slots=True)
class FieldSource:
    column: str | None = None
    expr: ast.expr | None = None
    constant: Any = None
    time_format: str | None = None
    epoch_unit: str | None = None
    tres: str | None = None  # read the count of this TRES (lower case) from the column's TRES string
    columns: tuple[str, ...] = ()  # with `tres`: every column to look in, first listed first
    null_values: tuple[str, ...] = ()  # raw values (after trimming) that mean "no value" in this column


@dataclass(slots=True)
class Mapping:
    path: Path
    delimiter: str | None = None
    comment: str | None = None
    time_format: str = "%Y-%m-%d %H:%M:%S"
    epoch_unit: str = "s"
    timezone: str = "UTC"
    time_limit_unit: str = "s"
    mem_unit: str = "mb"
    fields: dict[str, FieldSource] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict)
    unmapped_state: State = State.UNKNOWN
    tres_ids: dict[str, str] = field(default_factory=lambda: dict(SLURM_TRES_IDS))  # id -> TRES name


def _err(m_path: Path, key: str, msg: str) -> BadInputError:
    return BadInputError(f"{m_path}: {key}: {msg}")


def load_mapping(path: Path) -> Mapping:
    """Parse and check a mapping file; raise BadInputError naming the file and key on any problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the mapping: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: not valid TOML: {e}") from e
    m = Mapping(path)
    unknown_sections = set(data) - {"format", "fields", "states", "constants"}
    if unknown_sections:
        raise _err(
            path,
            sorted(unknown_sections)[0],
            "unknown section (use [format], [fields], [states], [constants])",
        )
    fmt = data.get("format", {})
    if not isinstance(fmt, dict):
        raise _err(path, "format", "must be a table")
    for key, value in fmt.items():
        if key not in _FORMAT_KEYS:
            raise _err(path, f"format.{key}", f"unknown key (known: {', '.join(sorted(_FORMAT_KEYS))})")
        if key == "tres_ids":
            m.tres_ids.update(_tres_ids(path, value))
        elif not isinstance(value, str):
            raise _err(path, f"format.{key}", "must be a string")
    if "delimiter" in fmt:
        d = fmt["delimiter"].replace("\\t", "\t")
        if len(d) != 1:
            raise _err(path, "format.delimiter", f"must be one character, got {fmt['delimiter']!r}")
        m.delimiter = d
    m.comment = fmt.get("comment") or None
    m.time_format = fmt.get("time_format", m.time_format)
    m.epoch_unit = fmt.get("epoch_unit", m.epoch_unit)
    if m.epoch_unit not in EPOCH_UNITS:
        raise _err(path, "format.epoch_unit", f"must be one of {', '.join(EPOCH_UNITS)}")
    tz = fmt.get("timezone", m.timezone)
    try:
        m.timezone = tb.check_tz(tz)
    except BadInputError as e:
        raise _err(path, "format.timezone", str(e)) from e
    m.time_limit_unit = fmt.get("time_limit_unit", m.time_limit_unit)
    if m.time_limit_unit not in TIME_LIMIT_UNITS:
        raise _err(path, "format.time_limit_unit", f"must be one of {', '.join(TIME_LIMIT_UNITS)}")
    m.mem_unit = fmt.get("mem_unit", m.mem_unit).lower()
    if m.mem_unit not in MEM_UNITS:
        raise _err(path, "format.mem_unit", f"must be one of {', '.join(MEM_UNITS)}")

    fields = data.get("fields", {})
    if not isinstance(fields, dict):
        raise _err(path, "fields", "must be a table of field = column")
    for name, spec in fields.items():
        key = f"fields.{name}"
        if name not in JOB_SCHEMA.names or name == "source":
            raise _err(
                path,
                key,
                f"not a job field (fields: {', '.join(n for n in JOB_SCHEMA.names if n != 'source')})",
            )
        m.fields[name] = _field_source(path, key, name, spec)
    constants = data.get("constants", {})
    if not isinstance(constants, dict):
        raise _err(path, "constants", "must be a table of field = value")
    for name, value in constants.items():
        key = f"constants.{name}"
        if name not in JOB_SCHEMA.names or name == "source":
            raise _err(path, key, "not a job field")
        if name in m.fields:
            raise _err(path, key, f"{name} is already mapped in [fields]")
        if isinstance(value, dict | list):
            raise _err(path, key, "must be a single value")
        if name in NUMBER_FIELDS and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _err(path, key, "must be a number")
        if name in BOOL_FIELDS and not isinstance(value, bool):
            raise _err(path, key, "must be true or false")
        if name in TIME_FIELDS:
            raise _err(path, key, "times cannot be constants")
        if name == "state":
            value = _state(path, key, value)
        m.fields[name] = FieldSource(constant=value)

    states = data.get("states", {})
    if not isinstance(states, dict):
        raise _err(path, "states", "must be a table of raw value = state")
    for raw_value, target in states.items():
        if raw_value == "_other":
            m.unmapped_state = _state(path, "states._other", target)
        else:
            m.states[str(raw_value).strip().upper()] = _state(path, f"states.{raw_value}", target)
    for required in ("job_id", "state"):
        if required not in m.fields:
            raise _err(path, f"fields.{required}", "required: name the column that holds it")
    return m


def _state(path: Path, key: str, value: Any) -> State:
    try:
        return State(str(value).upper())
    except ValueError:
        raise _err(path, key, f"{value!r} is not a state ({', '.join(s.value for s in State)})") from None


def _field_source(path: Path, key: str, name: str, spec: Any) -> FieldSource:
    if isinstance(spec, dict):
        extra = set(spec) - _FIELD_KEYS
        if extra:
            raise _err(
                path, f"{key}.{sorted(extra)[0]}", f"unknown key (known: {', '.join(sorted(_FIELD_KEYS))})"
            )
        col = spec.get("column")
        tres = spec.get("tres")
        if tres is not None:
            if name not in TRES_FIELDS:
                raise _err(
                    path, f"{key}.tres", f"only {', '.join(TRES_FIELDS)} can be read from TRES strings"
                )
            if not isinstance(tres, str) or not tres.strip() or "=" in tres or "," in tres:
                raise _err(path, f"{key}.tres", 'must name one TRES, such as "gres/gpu", "cpu" or "mem"')
        given = col if isinstance(col, list) and tres is not None else [col]
        cols = [c for c in given if isinstance(c, str) and c]
        if not cols or len(cols) != len(given):
            hint = " (a list of columns only with tres)" if isinstance(col, list) else ""
            raise _err(path, f"{key}.column", f"must name a column{hint}")
        src = FieldSource(column=cols[0])
        if tres is not None:
            src.tres = tres.strip().lower()
            src.columns = tuple(cols)
        if "null_values" in spec:
            nv = spec["null_values"]
            if not isinstance(nv, list) or not all(isinstance(v, str | int | float) for v in nv):
                raise _err(path, f"{key}.null_values", 'must be a list of values, such as ["0", "-1"]')
            src.null_values = tuple(str(v).strip() for v in nv)
        if "time_format" in spec or "epoch_unit" in spec:
            if name not in TIME_FIELDS:
                raise _err(path, key, "time_format/epoch_unit only apply to time fields")
            src.time_format = str(spec.get("time_format", "epoch" if "epoch_unit" in spec else ""))
            src.epoch_unit = spec.get("epoch_unit")
            if src.epoch_unit is not None and src.epoch_unit not in EPOCH_UNITS:
                raise _err(path, f"{key}.epoch_unit", f"must be one of {', '.join(EPOCH_UNITS)}")
        return src
    if not isinstance(spec, str) or not spec.strip():
        raise _err(path, key, "must be a column name (string) or a table {column = ...}")
    return FieldSource(column=spec)


def _tres_ids(path: Path, spec: Any) -> dict[str, str]:
    """TRES id -> name, from an inline table `{ 1001 = "gres/gpu" }` or a file path: numeric TRES strings
    (`1001=8`, as slurmdbd stores them) mean nothing without the cluster's own id table."""
    key = "format.tres_ids"
    if isinstance(spec, dict):
        out: dict[str, str] = {}
        for k, v in spec.items():
            if not re.fullmatch(r"[0-9]{1,9}", k):
                raise _err(path, f"{key}.{k}", "a TRES id is a number")
            if not isinstance(v, str) or not v.strip():
                raise _err(path, f"{key}.{k}", 'must be a TRES name, such as "gres/gpu:a100"')
            out[str(int(k))] = v.strip().lower()
        return out
    if not isinstance(spec, str) or not spec.strip():
        raise _err(path, key, "must be a table { id = name } or the path of a tres_table export")
    return _tres_table(path, key, path.parent / Path(spec).expanduser())


def _tres_table(m_path: Path, key: str, table: Path) -> dict[str, str]:
    """Read slurmdbd's `tres_table` as exported (CSV or tab-separated, columns id, type, name): the
    name of a TRES is `type/name` (`gres/gpu:a100`), or `type` alone when name is empty (`cpu`)."""
    try:
        text = table.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise _err(m_path, key, f"cannot read the TRES id table {table}: {why}") from e
    first = text.split("\n", 1)[0]
    sep = "\t" if "\t" in first and "," not in first else ","
    rows = csv.reader(text.splitlines(), delimiter=sep)
    header = [h.strip().lower() for h in next(rows, [])]
    lacking = [c for c in ("id", "type") if c not in header]
    if lacking:
        raise _err(m_path, key, f"{table}: no {lacking[0]} column (a tres_table has id, type, name)")
    i_id, i_type = header.index("id"), header.index("type")
    i_name = header.index("name") if "name" in header else None
    out = {}
    for line, row in enumerate(rows, start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise _err(m_path, key, f"{table}:{line}: expected {len(header)} fields, found {len(row)}")
        ident, typ = row[i_id].strip(), row[i_type].strip().lower()
        whole = re.fullmatch(r"([0-9]{1,9})(\.0*)?", ident)  # a spreadsheet may write 1001 as 1001.0
        if whole is None:
            raise _err(m_path, key, f"{table}:{line}: id {ident!r} is not a number")
        if not typ:
            raise _err(m_path, key, f"{table}:{line}: empty type")
        name = row[i_name].strip() if i_name is not None else ""
        out[str(int(whole.group(1)))] = f"{typ}/{name.lower()}" if name not in _TRES_NULLS else typ
    return out


def _expression(path: Path, key: str, text: str) -> ast.expr:
    """Parse `a * b`, `gpus_per_node * nodes / 2`, `(x + y)`; only numbers, names and + - * /."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise _err(path, key, f"cannot parse expression {text!r}: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(
            node,
            ast.BinOp
            | ast.UnaryOp
            | ast.Name
            | ast.Constant
            | ast.Load
            | ast.Add
            | ast.Sub
            | ast.Mult
            | ast.Div
            | ast.USub
            | ast.UAdd,
        ):
            raise _err(path, key, f"expression {text!r}: only column names, numbers and + - * / are allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise _err(path, key, f"expression {text!r}: only numbers may be literal")
    return tree


class CsvMapReader:
    name = "csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        return False  # needs a mapping: chosen by --format csv, or by auto when --mapping is given

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        if options.mapping is None:
            raise BadInputError(f"{path}: --format csv needs --mapping FILE (see docs/csv-mapping.md)")
        m = load_mapping(options.mapping)
        tz = tb.check_tz(options.tz) if options.tz else m.timezone
        raw = tb.read_delimited(path, m.delimiter, quoting=True, progress=options.progress, comment=m.comment)
        by_lower = {h.lower(): h for h in raw.names}
        by_ident = {tb.ident(h): h for h in raw.names}

        # Columns with a field's null_values applied, kept for the whole read: Frame caches conversions by
        # the array's id, which a freed array's successor could otherwise reuse.
        nulled: dict[tuple[str, tuple[str, ...]], pa.Array] = {}

        def column(key: str, name: str, null_values: tuple[str, ...] = ()) -> pa.Array:
            v = raw.get(name)
            if v is None:
                raise _err(
                    m.path, key, f"no column {name!r} in {path} (columns: {', '.join(raw.names[:20])})"
                )
            if not null_values:
                return v
            if (name, null_values) not in nulled:
                is_null = pc.is_in(pc.utf8_trim_whitespace(v), value_set=pa.array(null_values, pa.string()))
                nulled[name, null_values] = tb.with_nulls(v, is_null)
            return nulled[name, null_values]

        f = tb.Frame(raw)
        cols: dict[str, pa.Array] = {}
        tres = _TresColumns(f, m.tres_ids)
        for fname, src in m.fields.items():
            key = f"fields.{fname}"
            if src.constant is not None:
                value = src.constant.value if isinstance(src.constant, State) else src.constant
                typ = JOB_SCHEMA.field(fname).type
                if fname == "time_limit":
                    value = float(value) * TIME_LIMIT_UNITS[m.time_limit_unit]
                if fname == "mem_mb":
                    value = float(value) * MEM_UNITS[m.mem_unit]
                cols[fname] = pa.array([value] * f.n).cast(typ if typ != pa.int32() else pa.int64())
                continue
            assert src.column is not None
            name = src.column
            is_column = name.lower() in by_lower
            if src.tres is not None:
                found = [(c, column(key, c, src.null_values)) for c in src.columns]
                gpus = fname == "gpus"
                num = tres.count(found, src.tres, zero_if_absent=gpus, required=gpus)
                cols[fname] = f.whole(pc.round(num), name) if fname in INT_FIELDS else num
            elif fname in TEXT_FIELDS:
                cols[fname] = f.text(column(key, name, src.null_values))
                if fname == "job_id":
                    f.flag(pc.is_null(cols[fname]), f"{name}: empty job id")
            elif fname in TIME_FIELDS:
                v = column(key, name, src.null_values)
                tf = src.time_format or m.time_format
                unit = src.epoch_unit or m.epoch_unit
                need = fname == "submit_time"  # the one time the job record cannot do without
                if tf == "epoch":
                    cols[fname] = f.epoch(v, name, unit, zero_is_null=False, required=need)
                else:
                    cols[fname] = f.timestamp(v, name, (tf,), tz, required=need)
            elif fname in BOOL_FIELDS:
                if not is_column:
                    raise _err(
                        m.path, key, f"no column {name!r} in {path} (a yes/no field is read from a column)"
                    )
                cols[fname] = f.boolean(column(key, name, src.null_values), name)
            elif fname == "state":
                words = pc.utf8_upper(f.text(column(key, name, src.null_values)))
                f.flag(pc.is_null(words), f"{name}: empty state")
                mapping = dict(STATE_MAP) if not m.states else {}
                mapping.update({s.value: s for s in State})
                mapping.update(m.states)
                if m.unmapped_state is not State.UNKNOWN:
                    keys = pc.is_in(words, value_set=pa.array(list(mapping), pa.string()))
                    words = pc.if_else(keys, words, pa.scalar(m.unmapped_state.value))
                cols["state"] = f.states(words, mapping, f"state in column {name!r} (map it in [states])")
            else:
                need = fname == "gpus"  # without it the job's GPU-hours are unknown: a bad row
                if is_column:
                    num = f.number(column(key, name, src.null_values), name, required=need)
                else:
                    num = self._evaluate(f, m.path, key, name, by_ident, by_lower, required=need)
                if fname == "time_limit":
                    num = pc.multiply(num, float(TIME_LIMIT_UNITS[m.time_limit_unit]))
                if fname == "mem_mb":
                    num = pc.multiply(num, float(MEM_UNITS[m.mem_unit]))
                if fname in INT_FIELDS:
                    num = f.whole(pc.round(num), name, required=need)
                    if fname == "exit_code":
                        num = f.whole(
                            pc.if_else(pc.less(pc.abs(num), 2**31), num, pa.scalar(None, pa.int64())), name
                        )
                cols[fname] = num
        provided = set(cols) | {"job_id", "state"}
        if "state" not in cols:
            raise _err(m.path, "fields.state", "required")
        table, sink = f.finish(cols, options, self.name)
        return tb.result(table, self.name, f, sink, provided, tres.notes)

    @staticmethod
    def _evaluate(
        f: tb.Frame,
        m_path: Path,
        key: str,
        text: str,
        by_ident: dict[str, str],
        by_lower: dict[str, str],
        *,
        required: bool = False,
    ) -> pa.Array:
        """Evaluate a numeric expression over columns, vectorized; a bad value makes the result null (and
        flags the row when the field is `required`)."""
        tree = _expression(m_path, key, text)

        def ev(node: ast.expr) -> pa.Array | float:
            if isinstance(node, ast.Constant):
                return float(cast(float, node.value))  # _expression allows only numbers
            if isinstance(node, ast.Name):
                col = by_ident.get(node.id) or by_lower.get(node.id.lower())
                if col is None:
                    raise _err(m_path, key, f"expression {text!r}: no column named {node.id!r}")
                values = f.raw.get(col)
                assert values is not None
                return f.number(values, col, required=required)
            if isinstance(node, ast.UnaryOp):
                inner = ev(node.operand)
                return pc.negate(inner) if isinstance(node.op, ast.USub) else inner
            if isinstance(node, ast.BinOp):
                a, b = ev(node.left), ev(node.right)
                if isinstance(node.op, ast.Add):
                    return pc.add(a, b)
                if isinstance(node.op, ast.Sub):
                    return pc.subtract(a, b)
                if isinstance(node.op, ast.Mult):
                    return pc.multiply(a, b)
                if isinstance(node.op, ast.Div):
                    bb = b if not isinstance(b, float) else pa.scalar(b)
                    safe = pc.if_else(pc.equal(bb, 0.0), pa.scalar(None, pa.float64()), bb)
                    return pc.divide(a, safe)
            raise _err(m_path, key, f"expression {text!r}: unsupported")

        out = ev(tree)
        if isinstance(out, float):
            return pa.array([out] * f.n, pa.float64())
        return out.cast(pa.float64())


class _TresColumns:
    """Counts read from Slurm TRES string columns (`cpu=8,gres/gpu:a100=8,gres/gpu=8,mem=62.50G` or, as
    slurmdbd stores them, `1=8,1001=8,1002=8,2=64000`). Each column is exploded once, per distinct string,
    however many fields read it; numeric ids are named through the mapping's TRES id table."""

    def __init__(self, frame: tb.Frame, ids: dict[str, str]) -> None:
        self.frame = frame
        self.ids = ids
        self.notes: list[str] = []
        # (column, id of its values) -> (values, pairs, names); holding the values keeps their id unique.
        self._cache: dict[tuple[str, int], tuple[pa.Array, tb.KeyValues, pa.Array]] = {}

    def _pairs(self, name: str, values: pa.Array) -> tuple[tb.KeyValues, pa.Array]:
        """The column's pairs and each pair's TRES name (lower case, ids replaced by their names)."""
        ck = (name, id(values))
        if ck not in self._cache:
            kv = tb.explode_pairs(self.frame.text(values))
            text = kv.text if kv.text is not None else kv.key
            # The key as written, also for pairs whose value is no number (those have no kv.key).
            key = pc.utf8_lower(pc.utf8_trim_whitespace(pc.replace_substring_regex(text, r"=.*$", "")))
            idx = pc.index_in(key, value_set=pa.array(list(self.ids), pa.string()))
            named = pc.take(pa.array(list(self.ids.values()), pa.string()), idx)
            unnamed = pc.and_(pc.is_null(idx), pc.match_substring_regex(key, r"^[0-9]+$"))
            if pc.any(unnamed).as_py():
                shown = sorted(pc.unique(key.filter(unnamed)).to_pylist(), key=int)
                more = ", ..." if len(shown) > 5 else ""
                self.notes.append(
                    f"{name}: TRES ids {', '.join(shown[:5])}{more} have no name (give them one in "
                    "format.tres_ids); their counts were not read"
                )
            self._cache[ck] = (values, kv, pc.coalesce(named, key))
        _, kv, names = self._cache[ck]
        return kv, names

    def count(
        self, columns: list[tuple[str, pa.Array]], want: str, *, zero_if_absent: bool, required: bool
    ) -> pa.Array:
        """Per row, the count of TRES `want` from the first column that lists it (float64).

        Slurm lists a GPU twice, untyped and typed (`gres/gpu=8,gres/gpu:a100=8`): the exact name is
        taken when present, else the sum of its typed forms (`want:*`), so it is counted once. A value
        that is Slurm's NO_VAL is no count. A listed entry whose value is not a number is not read as
        absent: it flags the row when `required` (the GPU count, without which the job's GPU-hours are
        wrong), else it is null with a note. Rows where no column lists it are null, or 0 with
        `zero_if_absent` (a TRES string without a GPU means the job got none, as the sacct reader says).
        """
        f = self.frame
        out = np.zeros(f.n, dtype=np.float64)
        found = np.zeros(f.n, dtype=bool)
        for name, values in columns:
            kv, names = self._pairs(name, values)
            exact = pc.fill_null(pc.equal(names, want), False)
            typed = pc.fill_null(pc.starts_with(names, want + ":"), False)
            usable = pc.invert(pc.fill_null(pc.greater_equal(kv.value, TRES_NO_VALUE), False))
            untyped_n, has_untyped = tb.sum_where(kv, pc.and_(exact, usable))
            typed_n, has_typed = tb.sum_where(kv, pc.and_(typed, usable))
            unreadable = pc.and_(pc.or_(exact, typed), pc.is_null(kv.value)).to_numpy(zero_copy_only=False)
            bad = (np.bincount(kv.row[unreadable], minlength=kv.distinct) > 0)[kv.rows_of]
            bad &= ~found
            if required:
                f.flag(bad, f"{name}: the {want} count is not a number", values)
            elif bad.any():
                self.notes.append(f"{name}: {int(bad.sum()):,} rows whose {want} count is not a number: null")
            hit = (has_untyped | has_typed) & ~found
            out[hit] = np.where(has_untyped, untyped_n, typed_n)[hit]
            found |= hit
        if zero_if_absent:
            found[:] = True
        return tb.masked(out, found, pa.float64())


READER = CsvMapReader()
