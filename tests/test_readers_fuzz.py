"""Property tests: every reader, fed mangled real files, ends in a ReadResult or a one-line BadInputError.

Seeds are the real traces (../shared/traces, via the shared_traces fixture) and the bundled samples in
tests/data. Mutations: truncated files, truncated lines, byte flips, wrong types in a column, a missing
column, binary junk and an empty file. Any other exception (a traceback for the user) fails the test.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headway.schema import JOB_SCHEMA
from headway.traces.base import BadInputError, Reader, ReadOptions, ReadResult
from headway.traces.registry import READER_MODULES, get_reader, sniff

DATA = Path(__file__).parent / "data"
MAPPING = DATA / "lsf_like_mapping.toml"
SEED_BYTES = 24 * 1024  # a slice of each real file keeps every example fast
SHARED_SEEDS = (
    "slurm-22.05/sacct_allocations.txt",
    "slurm-22.05/sacct_with_steps.txt",
    "slurm-22.05/sacct.json",
    "philly-dre/philly_jobs.json",
    "alibaba-fgd-2023/openb_pod_list_default.csv",
    "alibaba-fgd-2023/openb_node_list_gpu_node.csv",
)
BUNDLED_SEEDS = (
    "sacct_edge_cases.txt",
    "slurmdb_job_table.csv",
    "slurmdb_edge_cases.tsv",
    "helios_cluster_log.csv",
    "acme_trace_seren.csv",
    "lsf_like_jobs.csv",
)
FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _available_readers() -> list[str]:
    names = []
    for name in READER_MODULES:
        try:
            importlib.import_module(READER_MODULES[name])
        except ImportError:
            continue  # another engineer's reader that does not exist yet
        names.append(name)
    return names


READERS = _available_readers()


class Seeds(list[tuple[str, bytes]]):
    """The seed files; a short repr keeps hypothesis' failure reports readable."""

    def __repr__(self) -> str:
        return f"<{len(self)} seed files: {', '.join(name for name, _ in self)}>"


@pytest.fixture(scope="module")
def seeds(shared_traces: Path) -> Seeds:
    out = Seeds()
    out += [
        (s, (shared_traces / s).read_bytes()[:SEED_BYTES])
        for s in SHARED_SEEDS
        if (shared_traces / s).exists()
    ]
    out += [(s, (DATA / s).read_bytes()[:SEED_BYTES]) for s in BUNDLED_SEEDS]
    return out


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _truncate_file(draw: st.DrawFn, data: bytes) -> bytes:
    return data[: draw(st.integers(0, len(data)))]


def _truncate_line(draw: st.DrawFn, data: bytes) -> bytes:
    lines = _lines(data)
    i = draw(st.integers(0, len(lines) - 1))
    lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
    return b"\n".join(lines)


def _flip_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    if not data:
        return data
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 12))):
        buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    return bytes(buf)


def _wrong_type(draw: st.DrawFn, data: bytes) -> bytes:
    """Replace one field in some data lines with text of the wrong kind."""
    lines = _lines(data)
    junk = draw(
        st.sampled_from(
            [b"abc", b"-1", b"1e999", b"", b"NaN", b"9" * 30, b"2026-13-45T99:99:99", b"\xff\xfe"]
        )
    )
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(lines) - 1))
        sep = b"|" if b"|" in lines[i] else (b"\t" if b"\t" in lines[i] else b",")
        fields = lines[i].split(sep)
        fields[draw(st.integers(0, len(fields) - 1))] = junk
        lines[i] = sep.join(fields)
    return b"\n".join(lines)


def _drop_column(draw: st.DrawFn, data: bytes) -> bytes:
    lines = _lines(data)
    sep = b"|" if b"|" in lines[0] else (b"\t" if b"\t" in lines[0] else b",")
    k = draw(st.integers(0, max(0, lines[0].count(sep))))
    out = []
    for ln in lines:
        fields = ln.split(sep)
        if k < len(fields):
            del fields[k]
        out.append(sep.join(fields))
    return b"\n".join(out)


def _junk(draw: st.DrawFn, data: bytes) -> bytes:
    return draw(st.binary(min_size=1, max_size=2048))


def _empty(draw: st.DrawFn, data: bytes) -> bytes:
    return draw(st.sampled_from([b"", b"\n\n", b"   \n", b"\x00"]))


MUTATIONS: dict[str, Callable[[st.DrawFn, bytes], bytes]] = {
    "truncated file": _truncate_file,
    "truncated line": _truncate_line,
    "byte flips": _flip_bytes,
    "wrong type": _wrong_type,
    "missing column": _drop_column,
    "binary junk": _junk,
    "empty file": _empty,
}


def _read_must_end_cleanly(reader: Reader, path: Path) -> None:
    opts = ReadOptions(mapping=MAPPING, tz="UTC")
    try:
        res = reader.read(path, opts)
    except BadInputError as e:
        msg = str(e)
        assert msg and "\n" not in msg, f"error is not one line: {msg!r}"
        return
    assert isinstance(res, ReadResult)
    assert res.table.schema == JOB_SCHEMA
    assert res.bad_row_count >= len(res.bad_rows)
    assert None not in res.table.column("job_id").to_pylist()
    assert None not in res.table.column("state").to_pylist()


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("reader_name", READERS)
@FUZZ
@given(data=st.data())
def test_mangled_real_files_never_raise_anything_but_bad_input(
    seeds: list[tuple[str, bytes]], reader_name: str, mutation: str, data: st.DataObject
) -> None:
    reader = get_reader(reader_name)
    _, seed = data.draw(st.sampled_from(seeds), label="seed")
    mangled = data.draw(st.composite(lambda draw: MUTATIONS[mutation](draw, seed))(), label=mutation)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "input"
        path.write_bytes(mangled)
        _read_must_end_cleanly(reader, path)
        # --format auto must also either choose a format or say it cannot, in one line.
        try:
            sniff(path)
        except BadInputError as e:
            assert "\n" not in str(e)


@pytest.mark.shared
@pytest.mark.parametrize("reader_name", READERS)
def test_unmangled_seeds_also_end_cleanly_in_every_reader(
    seeds: list[tuple[str, bytes]], reader_name: str
) -> None:
    reader = get_reader(reader_name)
    with tempfile.TemporaryDirectory() as d:
        for name, seed in seeds:
            path = Path(d) / Path(name).name
            path.write_bytes(seed)
            _read_must_end_cleanly(reader, path)


def test_ingest_of_junk_exits_nonzero_with_one_error_line_and_no_traceback(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(256)) * 8)
    for fmt in ["auto", *READERS]:
        args = [
            sys.executable,
            "-m",
            "headway.cli",
            "ingest",
            str(junk),
            "--format",
            fmt,
            "--db",
            str(tmp_path / "j.db"),
        ]
        if fmt == "csv":
            args += ["--mapping", str(MAPPING)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode != 0, (fmt, proc.stdout)
        assert "Traceback" not in proc.stderr, (fmt, proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (fmt, proc.stderr)


@pytest.mark.shared
def test_auto_detection_picks_the_right_reader_for_every_real_and_bundled_file(shared_traces: Path) -> None:
    expected = {
        shared_traces / "slurm-22.05" / "sacct_allocations.txt": "sacct",
        shared_traces / "slurm-22.05" / "sacct_with_steps.txt": "sacct",
        shared_traces / "philly-dre" / "philly_jobs.json": "philly",
        shared_traces / "alibaba-fgd-2023" / "openb_pod_list_default.csv": "alibaba",
        DATA / "sacct_edge_cases.txt": "sacct",
        DATA / "slurmdb_job_table.csv": "slurmdb",
        DATA / "slurmdb_edge_cases.tsv": "slurmdb",
        DATA / "helios_cluster_log.csv": "helios",
        DATA / "acme_trace_seren.csv": "helios",
    }
    for path, fmt in expected.items():
        if fmt in READERS:
            assert sniff(path) == fmt, path
