"""Any CSV plus a TOML mapping: columns, expressions, constants, state maps, units, time zones."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from headway.schema import JOB_SCHEMA, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.csvmap import READER, load_mapping
from headway.traces.registry import sniff

DATA = Path(__file__).parent / "data"
CSV = DATA / "lsf_like_jobs.csv"
MAPPING = DATA / "lsf_like_mapping.toml"
DOC = Path(__file__).parent.parent / "docs" / "csv-mapping.md"


def test_mapped_csv_reads_columns_expressions_constants_and_state_map() -> None:
    res = READER.read(CSV, ReadOptions(mapping=MAPPING))
    assert res.table.schema == JOB_SCHEMA and res.table.num_rows == 5
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    a1 = jobs["a-1"]
    assert a1.gpus == 8 and a1.nodes == 2  # GpusPerNode * NodeCount
    assert a1.time_limit == 7200 and a1.priority_class == "normal" and a1.group == "vision"
    assert a1.submit_time == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # epoch ms
    assert a1.start_time == dt.datetime(2026, 1, 1, 8, 0, 10, tzinfo=dt.UTC)  # Europe/Berlin naive time
    assert jobs["a-2"].state == "FAILED" and jobs["a-2"].exit_code == 137
    assert jobs["a-3"].state == "CANCELLED" and jobs["a-3"].start_time is None
    assert jobs["a-4"].state == "PENDING"
    assert jobs["a-6"].state == "UNKNOWN" and any("WEIRD" in n for n in res.notes)
    assert set(res.missing_fields) == {"name", "cpus", "mem_mb"}


def test_bad_value_in_an_expression_column_is_a_bad_row() -> None:
    res = READER.read(CSV, ReadOptions(mapping=MAPPING))
    assert res.bad_row_count == 1
    assert str(res.bad_rows[0]) == f"{CSV}:7: GpusPerNode: not a number ('two')"


def test_other_state_catches_unmapped_values(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text(MAPPING.read_text().replace('Pend = "PENDING"', 'Pend = "PENDING"\n_other = "FAILED"'))
    jobs = {r.job_id: r for r in table_to_records(READER.read(CSV, ReadOptions(mapping=m)).table)}
    assert jobs["a-6"].state == "FAILED"


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (('job_id = "JobId"', 'job_id = "JobNumber"'), "fields.job_id"),
        (('gpus = "GpusPerNode * NodeCount"', 'gpus = "GpusPerNode * Nodez"'), "fields.gpus"),
        (('gpus = "GpusPerNode * NodeCount"', 'gpus = "__import__(1)"'), "fields.gpus"),
        (('Done = "COMPLETED"', 'Done = "FINISHED"'), "states.Done"),
        (('timezone = "Europe/Berlin"', 'timezone = "Mars/Olympus"'), "format.timezone"),
        (('time_limit_unit = "min"', 'time_limit_unit = "fortnight"'), "format.time_limit_unit"),
        (('user = "Owner"', 'usr = "Owner"'), "fields.usr"),
        (('state = "Status"', ""), "fields.state"),
    ],
)
def test_mapping_errors_name_the_mapping_file_and_key(
    tmp_path: Path, edit: tuple[str, str], key: str
) -> None:
    m = tmp_path / "bad.toml"
    text = MAPPING.read_text()
    assert edit[0] in text
    m.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(BadInputError) as exc:
        READER.read(CSV, ReadOptions(mapping=m))
    assert str(exc.value).startswith(f"{m}: {key}:")
    assert "\n" not in str(exc.value)


def test_invalid_toml_and_missing_mapping_are_one_line_errors(tmp_path: Path) -> None:
    m = tmp_path / "broken.toml"
    m.write_text("[fields\njob_id = 1")
    with pytest.raises(BadInputError, match="not valid TOML"):
        load_mapping(m)
    with pytest.raises(BadInputError, match="needs --mapping"):
        READER.read(CSV, ReadOptions())


def test_auto_chooses_csv_only_when_a_mapping_is_given() -> None:
    with pytest.raises(BadInputError, match="cannot tell the format"):
        sniff(CSV)
    assert sniff(CSV, has_mapping=True) == "csv"


def test_the_documented_example_mapping_works(tmp_path: Path) -> None:
    """docs/csv-mapping.md's example CSV and mapping, taken from the page itself."""
    text = DOC.read_text()
    csv_part = text.split("```csv\n", 1)[1].split("```", 1)[0]
    toml_part = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "jobs.csv").write_text(csv_part)
    (tmp_path / "jobs.toml").write_text(toml_part)
    res = READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=tmp_path / "jobs.toml"))
    assert res.bad_row_count == 0 and res.table.num_rows == 3
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert jobs["17"].gpus == 16 and jobs["17"].state == "COMPLETED" and jobs["17"].time_limit == 86400
    assert jobs["18"].state == "FAILED" and jobs["19"].state == "CANCELLED"


def test_a_mapping_is_used_even_when_the_header_looks_like_a_built_in_format(tmp_path: Path) -> None:
    """A Helios-like header with the user's own mapping was read as Helios: its states, GPU expression
    and epoch unit were dropped without a word."""
    from typer.testing import CliRunner

    from headway.cli import app
    from headway.store import JobStore

    log = tmp_path / "amb.csv"
    log.write_text("job_id,user,gpu_num,state,submit_time\n1,a,2,ok,1767258000000\n")
    mapping = tmp_path / "amb.toml"
    mapping.write_text(
        '[format]\ntime_format="epoch"\nepoch_unit="ms"\n'
        '[fields]\njob_id="job_id"\nstate="state"\nsubmit_time="submit_time"\ngpus="gpu_num * 4"\n'
        '[states]\nok="COMPLETED"\n'
    )
    db = tmp_path / "j.duckdb"
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", "--db", str(db), "--mapping", str(mapping), str(log)])
    assert res.exit_code == 0, res.output
    assert "detected format csv" in " ".join(res.output.split())
    with JobStore(db, read_only=True) as store:
        rows = store.con.execute("SELECT gpus, state, year(submit_time) FROM jobs").fetchall()
    assert rows == [(8.0, "COMPLETED", 2026)]
    res = runner.invoke(
        app, ["ingest", "--db", str(db), "--mapping", str(mapping), "--format", "sacct", str(log)]
    )
    assert res.exit_code == 1 and "--mapping is for --format csv" in res.output


def test_a_bom_before_a_comment_line_still_reads_the_file(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    for sep in (",", "|"):
        log = tmp_path / "bom.csv"
        log.write_bytes(f"\ufeff# exported by a tool\nid{sep}status\n1{sep}COMPLETED\n".encode())
        delim = f'delimiter="{sep}"\n' if sep != "," else ""
        m.write_text(f'[format]\ncomment="#"\n{delim}[fields]\njob_id="id"\nstate="status"\n')
        jobs = table_to_records(READER.read(log, ReadOptions(mapping=m)).table)
        assert [(j.job_id, j.state) for j in jobs] == [("1", "COMPLETED")]


def test_a_header_repeated_inside_the_log_is_a_bad_row_not_a_job(tmp_path: Path) -> None:
    """Logs joined with `cat` repeat the header; it was stored as a job `id` in state UNKNOWN."""
    log = tmp_path / "joined.csv"
    log.write_text("\ufeffid,status\n1,COMPLETED\n\ufeffid,status\n2,FAILED\n")  # each file had a BOM
    m = tmp_path / "m.toml"
    m.write_text('[fields]\njob_id="id"\nstate="status"\n')
    res = READER.read(log, ReadOptions(mapping=m))
    assert [j.job_id for j in table_to_records(res.table)] == ["1", "2"]
    assert [(b.line, b.reason) for b in res.bad_rows] == [
        (3, "a repeated header line (logs joined together?)")
    ]


def test_a_mapping_leaves_parquet_files_to_their_own_reader(tmp_path: Path) -> None:
    """With --mapping, every file went to the csv reader: a Parquet file beside the CSV failed, its
    binary header printed as column names."""
    from typer.testing import CliRunner

    from headway.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["synth", "-n", "20", "-o", str(tmp_path / "c.csv"), "--format", "csv"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["synth", "-n", "30", "-o", str(tmp_path / "p.parquet"), "--seed", "2"])
    assert res.exit_code == 0, res.output
    db = tmp_path / "j.duckdb"
    args = ["ingest", "--db", str(db), "--json", "--source", "mixed"]
    res = runner.invoke(
        app, [*args, "--mapping", str(tmp_path / "c.mapping.toml"), str(tmp_path / "p.parquet")]
    )
    assert res.exit_code == 0, res.output
