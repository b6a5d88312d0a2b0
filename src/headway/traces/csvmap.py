"""Any CSV job log plus a TOML mapping that says which column is which field (docs/csv-mapping.md).

The mapping names schema fields and where each comes from: a column, an arithmetic expression over
numeric columns (`gpu_per_node * nodes`), or a constant. It also gives the delimiter, the time format
(strftime, or epoch seconds/ms/us), the time zone of naive times, units, and a state value map.
Every mapping error names the mapping file and the key.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from headway.schema import JOB_SCHEMA, State
from headway.traces import tabular as tb
from headway.traces.base import BadInputError, ReadOptions, ReadResult
from headway.traces.sacct import STATE_MAP

TEXT_FIELDS = ("job_id", "user", "group", "name", "partition", "priority_class")
TIME_FIELDS = ("submit_time", "start_time", "end_time")
NUMBER_FIELDS = ("gpus", "nodes", "cpus", "mem_mb", "time_limit", "exit_code")
INT_FIELDS = ("nodes", "cpus", "mem_mb", "time_limit", "exit_code")
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
}


@dataclass(slots=True)
class FieldSource:
    column: str | None = None
    expr: ast.expr | None = None
    constant: Any = None
    time_format: str | None = None
    epoch_unit: str | None = None


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
        if not isinstance(value, str):
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
        if name in NUMBER_FIELDS and not isinstance(value, int | float):
            raise _err(path, key, "must be a number")
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
        allowed = {"column", "time_format", "epoch_unit"}
        extra = set(spec) - allowed
        if extra:
            raise _err(
                path, f"{key}.{sorted(extra)[0]}", f"unknown key (known: {', '.join(sorted(allowed))})"
            )
        col = spec.get("column")
        if not isinstance(col, str) or not col:
            raise _err(path, f"{key}.column", "must name a column")
        src = FieldSource(column=col)
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

        def column(key: str, name: str) -> pa.Array:
            v = raw.get(name)
            if v is None:
                raise _err(
                    m.path, key, f"no column {name!r} in {path} (columns: {', '.join(raw.names[:20])})"
                )
            return v

        f = tb.Frame(raw)
        cols: dict[str, pa.Array] = {}
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
            if fname in TEXT_FIELDS:
                cols[fname] = f.text(column(key, name))
                if fname == "job_id":
                    f.flag(pc.is_null(cols[fname]), f"{name}: empty job id")
            elif fname in TIME_FIELDS:
                v = column(key, name)
                tf = src.time_format or m.time_format
                unit = src.epoch_unit or m.epoch_unit
                if tf == "epoch":
                    cols[fname] = f.epoch(v, name, unit, zero_is_null=False)
                else:
                    cols[fname] = f.timestamp(v, name, (tf,), tz)
            elif fname == "state":
                words = pc.utf8_upper(f.text(column(key, name)))
                f.flag(pc.is_null(words), f"{name}: empty state")
                mapping = dict(STATE_MAP) if not m.states else {}
                mapping.update({s.value: s for s in State})
                mapping.update(m.states)
                if m.unmapped_state is not State.UNKNOWN:
                    keys = pc.is_in(words, value_set=pa.array(list(mapping), pa.string()))
                    words = pc.if_else(keys, words, pa.scalar(m.unmapped_state.value))
                cols["state"] = f.states(words, mapping, f"state in column {name!r} (map it in [states])")
            else:
                if is_column:
                    num = f.number(column(key, name), name)
                else:
                    num = self._evaluate(f, m.path, key, name, by_ident, by_lower)
                if fname == "time_limit":
                    num = pc.multiply(num, float(TIME_LIMIT_UNITS[m.time_limit_unit]))
                if fname == "mem_mb":
                    num = pc.multiply(num, float(MEM_UNITS[m.mem_unit]))
                if fname in INT_FIELDS:
                    num = f.whole(pc.round(num), name)
                    if fname == "exit_code":
                        num = f.whole(
                            pc.if_else(pc.less(pc.abs(num), 2**31), num, pa.scalar(None, pa.int64())), name
                        )
                cols[fname] = num
        provided = set(cols) | {"job_id", "state"}
        if "state" not in cols:
            raise _err(m.path, "fields.state", "required")
        table, sink = f.finish(cols, options, self.name)
        return tb.result(table, self.name, f, sink, provided)

    @staticmethod
    def _evaluate(
        f: tb.Frame, m_path: Path, key: str, text: str, by_ident: dict[str, str], by_lower: dict[str, str]
    ) -> pa.Array:
        """Evaluate a numeric expression over columns, vectorized; a bad value flags the row."""
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
                return f.number(values, col)
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


READER = CsvMapReader()
