"""Any CSV plus a TOML mapping: columns, expressions, constants, state maps, units, time zones."""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from headway.schema import JOB_SCHEMA, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.csvmap import READER, SLURM_TRES_IDS, load_mapping
from headway.traces.registry import read, sniff

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


# ------------------------------------------------------------------------------------- TRES strings

TRES = DATA / "csvmap_tres"  # real Slurm 22.05 test cluster output (see its README.md)
JOB_TABLE = TRES / "slurmdb_job_table.csv"
JOB_TABLE_MAPPING = TRES / "slurmdb_job_table.toml"
SACCT = TRES / "sacct_allocations.txt"
SACCT_MAPPING = TRES / "sacct_allocations.toml"
JOB_COLUMNS = "job_id, state, gpus, nodes, cpus, mem_mb, time_limit, submit_time, start_time, end_time"


def _ingest(db: Path, *args: str) -> dict[str, Any]:
    """`headway ingest --json` into `db`; the file's summary."""
    from typer.testing import CliRunner

    from headway.cli import app

    res = CliRunner().invoke(app, ["ingest", "--db", str(db), "--json", "--tz", "UTC", *args])
    assert res.exit_code == 0, res.output
    summary: dict[str, Any] = json.loads(res.output)["files"][0]
    return summary


def _by_state(db: Path) -> dict[str, tuple[int, float]]:
    """Jobs and GPU-hours per state, as the store derives them (jobs_v.gpu_hours)."""
    from headway.store import JobStore

    with JobStore(db, read_only=True) as store:
        rows = store.con.execute(
            "SELECT state, count(*), round(sum(gpu_hours), 6) FROM jobs_v GROUP BY state"
        ).fetchall()
    return {str(s): (int(n), float(h)) for s, n, h in rows}


def _jobs(db: Path, columns: str = JOB_COLUMNS) -> list[tuple[Any, ...]]:
    from headway.store import JobStore

    with JobStore(db, read_only=True) as store:
        return store.con.execute(f"SELECT {columns} FROM jobs ORDER BY job_id").fetchall()


def _tres_log(tmp_path: Path, rows: list[str], mapping: str, header: str = "id,tres") -> Path:
    """jobs.csv with TRES columns, and a mapping of `fields` for it (every job COMPLETED); its path."""
    log = tmp_path / "jobs.csv"
    log.write_text(header + "\n" + "\n".join(rows) + "\n")
    m = tmp_path / "m.toml"
    m.write_text('[fields]\njob_id = "id"\n' + mapping + '\n[constants]\nstate = "COMPLETED"\n')
    return m


def test_job_table_mapped_through_the_tres_id_table_gives_the_slurmdb_readers_gpu_hours(
    tmp_path: Path,
) -> None:
    """The job table read with a mapping (ids named by the tres_table export) and by the slurmdb reader
    store the same jobs: the same GPU-hours per state, GPU and node counts, memory, limits and times."""
    mapped = _ingest(
        tmp_path / "mapped.duckdb", "--format", "csv", "--mapping", str(JOB_TABLE_MAPPING), str(JOB_TABLE)
    )
    assert mapped["bad_rows"] == 0 and mapped["jobs_stored"] == 51 and not mapped["notes"]
    _ingest(tmp_path / "slurmdb.duckdb", "--format", "slurmdb", str(JOB_TABLE))
    expected = {
        "CANCELLED": (17, 7.222222),
        "COMPLETED": (16, 0.097778),
        "FAILED": (11, 0.061111),
        "TIMEOUT": (7, 0.4425),
    }
    assert _by_state(tmp_path / "mapped.duckdb") == _by_state(tmp_path / "slurmdb.duckdb") == expected
    same = JOB_COLUMNS.replace(" cpus,", "")  # slurmdb reads cpus_req (1); the mapping tres_alloc's cpu
    assert _jobs(tmp_path / "mapped.duckdb", same) == _jobs(tmp_path / "slurmdb.duckdb", same)
    jobs = {j[0]: j for j in _jobs(tmp_path / "mapped.duckdb")}
    assert jobs["588"][2:6] == (4.0, 1, 16, 64000)  # 1=16,...,1001=4,1003=4 alloc; 2=64000 from tres_req
    unstarted = [j for j in jobs.values() if j[1] == "CANCELLED" and j[8] is None]
    assert len(unstarted) == 6 and all(j[2] > 0 for j in unstarted)  # time_start 0; GPUs from tres_req


def test_named_alloc_tres_mapped_gives_the_sacct_readers_gpu_hours(tmp_path: Path) -> None:
    """`sacct -P` AllocTRES (`gres/gpu:a100=8,gres/gpu=8`) read through a mapping: a GPU listed typed
    and untyped counts once, and every job equals what the sacct reader stores."""
    mapped = _ingest(tmp_path / "m.duckdb", "--format", "csv", "--mapping", str(SACCT_MAPPING), str(SACCT))
    assert mapped["bad_rows"] == 0 and mapped["jobs_stored"] == 23
    _ingest(tmp_path / "s.duckdb", "--format", "sacct", str(SACCT))
    expected = {
        "CANCELLED": (1, 0.010556),
        "COMPLETED": (14, 0.319444),
        "FAILED": (7, 0.031111),
        "TIMEOUT": (1, 0.020278),
    }
    assert _by_state(tmp_path / "m.duckdb") == _by_state(tmp_path / "s.duckdb") == expected
    assert _jobs(tmp_path / "m.duckdb") == _jobs(tmp_path / "s.duckdb")
    jobs = {j[0]: j for j in _jobs(tmp_path / "m.duckdb")}
    assert jobs["1"][2:6] == (8.0, 1, 1, 64000)  # not 16 GPUs; mem=62.50G from ReqTRES
    assert jobs["23"][2:6] == (16.0, 2, 2, 128000)


def test_inline_tres_ids_read_numeric_tres_like_the_tres_table_export(tmp_path: Path) -> None:
    table = JOB_TABLE_MAPPING.read_text()
    line = 'tres_ids = "slurmdb_tres_table.csv"'
    assert line in table
    inline = tmp_path / "inline.toml"
    inline.write_text(
        table.replace(
            line, 'tres_ids = { 1001 = "gres/gpu", 1002 = "gres/gpu:a100", 1003 = "gres/gpu:v100" }'
        )
    )
    by_file = READER.read(JOB_TABLE, ReadOptions(mapping=JOB_TABLE_MAPPING)).table
    by_inline = READER.read(JOB_TABLE, ReadOptions(mapping=inline)).table
    assert by_inline.equals(by_file)
    assert sum(by_inline.column("gpus").to_pylist()) == 216


def test_a_gpu_is_counted_once_untyped_first_else_the_typed_ones_summed(tmp_path: Path) -> None:
    rows = [
        '1,"gres/gpu:a100=8,gres/gpu=8"',
        '2,"gres/gpu=8,gres/gpu:a100=4"',  # the untyped count wins even when the typed ones differ
        '3,"gres/gpu:a100=4,gres/gpu:v100=2"',  # typed only: summed
        '4,"cpu=4,mem=8G"',  # no GPU: none
        "5,",
        '6,"1001=2,1002=2"',
        '7,"1002=1,1003=3"',
    ]
    m = _tres_log(
        tmp_path,
        rows,
        'gpus = { column = "tres", tres = "gres/gpu" }\n'
        '[format]\ntres_ids = { 1001 = "gres/gpu", 1002 = "gres/gpu:a100", 1003 = "gres/gpu:v100" }',
    )
    res = READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=m))
    assert res.bad_row_count == 0
    assert {j.job_id: j.gpus for j in table_to_records(res.table)} == {
        "1": 8,
        "2": 8,
        "3": 6,
        "4": 0,
        "5": 0,
        "6": 2,
        "7": 4,
    }


def test_tres_memory_suffixes_read_as_mb_and_no_val_is_no_count(tmp_path: Path) -> None:
    no_val = "18446744073709551614"
    rows = [
        f'1,"cpu=2,mem=62.50G,node=1,energy={no_val}"',
        '2,"cpu=2,mem=512M,node=2"',
        '3,"mem=1T,mem=0.5K"',
        '4,"mem=2048"',  # no suffix: MB, as slurmdbd stores it
        f'5,"cpu={no_val},gres/gpu={no_val},gres/gpu:a100=2"',
    ]
    fields = "\n".join(
        f'{f} = {{ column = "tres", tres = "{t}" }}'
        for f, t in (("gpus", "gres/gpu"), ("cpus", "cpu"), ("mem_mb", "mem"), ("nodes", "node"))
    )
    res = READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=_tres_log(tmp_path, rows, fields)))
    assert res.bad_row_count == 0
    got = {j.job_id: (j.gpus, j.cpus, j.mem_mb, j.nodes) for j in table_to_records(res.table)}
    assert got["1"] == (0, 2, 64000, 1) and got["2"] == (0, 2, 512, 2)
    assert got["3"][2] == 1024 * 1024 and got["4"][2] == 2048
    assert got["5"][:3] == (2, None, None)  # NO_VAL is no count: the typed GPU count is taken


def test_an_unreadable_gpu_entry_in_a_tres_column_is_a_bad_row(tmp_path: Path) -> None:
    rows = ['1,"cpu=1,gres/gpu=x"', '2,"cpu=1,gres/gpu=2"', '3,"1=1,1001=eight"', '4,"cpu=1,mem=lots"']
    fields = (
        'gpus = { column = "tres", tres = "gres/gpu" }\nmem_mb = { column = "tres", tres = "mem" }\n'
        '[format]\ntres_ids = { 1001 = "gres/gpu" }'
    )
    res = READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=_tres_log(tmp_path, rows, fields)))
    assert [str(b) for b in res.bad_rows] == [
        f"{tmp_path / 'jobs.csv'}:2: tres: the gres/gpu count is not a number ('cpu=1,gres/gpu=x')",
        f"{tmp_path / 'jobs.csv'}:4: tres: the gres/gpu count is not a number ('1=1,1001=eight')",
    ]
    jobs = {j.job_id: j for j in table_to_records(res.table)}
    assert sorted(jobs) == ["2", "4"] and jobs["4"].mem_mb is None  # memory is not the GPU count: kept
    assert any("tres: 1 rows whose mem count is not a number" in n for n in res.notes)


def test_a_later_tres_column_is_read_only_where_the_first_lacks_the_tres(tmp_path: Path) -> None:
    rows = ['1,"gres/gpu=4",gres/gpu=1', "2,,gres/gpu=2", '3,"cpu=1","gres/gpu=3"']
    m = _tres_log(
        tmp_path, rows, 'gpus = { column = ["alloc", "req"], tres = "gres/gpu" }', header="id,alloc,req"
    )
    jobs = table_to_records(READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=m)).table)
    assert [j.gpus for j in jobs] == [4, 2, 3]


def test_numeric_tres_ids_without_a_name_are_noted_not_guessed(tmp_path: Path) -> None:
    rows = ['1,"1=4,4=1,1001=8,1002=8"']
    fields = 'gpus = { column = "tres", tres = "gres/gpu" }\ncpus = { column = "tres", tres = "cpu" }'
    res = READER.read(tmp_path / "jobs.csv", ReadOptions(mapping=_tres_log(tmp_path, rows, fields)))
    job = table_to_records(res.table)[0]
    assert job.gpus == 0 and job.cpus == 4  # Slurm's fixed ids (1 cpu, 2 mem, 4 node) need no table
    assert res.notes == [
        "tres: TRES ids 1001, 1002 have no name (give them one in format.tres_ids); "
        "their counts were not read"
    ]


def test_null_values_read_a_placeholder_as_no_value(tmp_path: Path) -> None:
    """slurmdbd writes 0 for a time not set and 4294967295 for no limit; a dump may say `nobody`."""
    log = tmp_path / "j.csv"
    log.write_text("id,who,start,lim\n1,nobody,0,4294967295\n2,ana,1767258000,60\n")
    m = tmp_path / "m.toml"
    m.write_text(
        '[format]\ntime_format = "epoch"\n[fields]\njob_id = "id"\n'
        'user = { column = "who", null_values = ["nobody"] }\n'
        'start_time = { column = "start", null_values = [0] }\n'
        'time_limit = { column = "lim", null_values = ["4294967295"] }\n'
        '[constants]\nstate = "COMPLETED"\n'
    )
    res = READER.read(log, ReadOptions(mapping=m))
    assert res.bad_row_count == 0
    assert [(j.user, j.start_time, j.time_limit) for j in table_to_records(res.table)] == [
        (None, None, None),
        ("ana", dt.datetime(2026, 1, 1, 9, tzinfo=dt.UTC), 60),
    ]


@pytest.mark.parametrize(
    ("field_line", "format_line", "key"),
    [
        ('partition = { column = "tres", tres = "gres/gpu" }', "", "fields.partition.tres"),
        ('gpus = { column = "tres", tres = "gres/gpu=1" }', "", "fields.gpus.tres"),
        ('gpus = { column = ["a", "b"] }', "", "fields.gpus.column"),
        ('gpus = { column = [], tres = "gres/gpu" }', "", "fields.gpus.column"),
        ('gpus = { column = "tres", null_values = "0" }', "", "fields.gpus.null_values"),
        (
            'gpus = { column = "tres", tres = "gres/gpu" }',
            'tres_ids = { gpu = "gres/gpu" }',
            "format.tres_ids.gpu",
        ),
        ('gpus = { column = "tres", tres = "gres/gpu" }', "tres_ids = { 1001 = 7 }", "format.tres_ids.1001"),
        ('gpus = { column = "tres", tres = "gres/gpu" }', 'tres_ids = "nowhere.csv"', "format.tres_ids"),
        ('gpus = { column = "tres", tres = "gres/gpu" }', 'tres_ids = "bad_ids.csv"', "format.tres_ids"),
        ('gpus = { column = "tres", tres = "gres/gpu" }', "tres_ids = 1001", "format.tres_ids"),
    ],
)
def test_tres_mapping_errors_name_the_mapping_file_and_key(
    tmp_path: Path, field_line: str, format_line: str, key: str
) -> None:
    (tmp_path / "bad_ids.csv").write_text("id,type,name\n1001,gres,gpu\nx,gres,gpu:a100\n")
    m = tmp_path / "bad.toml"
    m.write_text(f'[format]\n{format_line}\n[fields]\njob_id = "id"\nstate = "st"\n{field_line}\n')
    with pytest.raises(BadInputError) as exc:
        load_mapping(m)
    assert str(exc.value).startswith(f"{m}: {key}:")
    assert "\n" not in str(exc.value)


def test_the_documented_tres_example_is_the_mapping_the_cross_check_proves() -> None:
    """docs/csv-mapping.md's job-table mapping is the bundled one that
    test_job_table_mapped_through_the_tres_id_table_gives_the_slurmdb_readers_gpu_hours reads."""
    section = DOC.read_text().split("## Slurm TRES strings", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```toml\n")[1:]]
    assert JOB_TABLE_MAPPING.read_text() in blocks
    inline = tomllib.loads(blocks[1])["tres_ids"]  # the inline form the page shows names the same ids
    by_file = load_mapping(JOB_TABLE_MAPPING).tres_ids
    assert inline.items() <= by_file.items() and SLURM_TRES_IDS.items() <= by_file.items()
    assert by_file["1000"] == "dynamic_offset"  # a deleted row of the table is still named


def _preemption_log(tmp_path: Path, fields: str, constants: str = "") -> Path:
    """A log whose mapping reads the preemption fields (issue 27); returns the mapping's path."""
    (tmp_path / "p.csv").write_text(
        "id,st,spot,ckpt_min\n1,ok,TRUE,10\n2,ok,no,\n3,ok,1,0\n4,ok,,5\n5,ok,maybe,x\n6,ok,Yes,1.5\n"
    )
    m = tmp_path / "p.toml"
    m.write_text(f'[fields]\njob_id = "id"\nstate = "st"\n{fields}\n[states]\nok = "COMPLETED"\n{constants}')
    return m


def test_a_mapping_reads_preemptible_as_yes_or_no_and_checkpoint_every_as_seconds(tmp_path: Path) -> None:
    m = _preemption_log(tmp_path, 'preemptible = "spot"\ncheckpoint_every = "ckpt_min * 60"')
    res = read("csv", tmp_path / "p.csv", ReadOptions(mapping=m))  # the reader and the shared rules
    got = {r.job_id: (r.preemptible, r.checkpoint_every) for r in table_to_records(res.table)}
    assert got == {
        "1": (True, 600),
        "2": (False, None),
        "3": (True, 0),  # 0: it saves its progress when stopped (the policies lose nothing of it)
        "4": (None, 300),
        "5": (None, None),  # neither a yes/no nor a number: stored as null, the job kept
        "6": (True, 90),
    }
    assert res.bad_row_count == 0
    nulled = {(p.column, p.reason): p.count for p in res.problems}
    assert nulled == {("spot", "not true/false, yes/no or 1/0"): 1, ("ckpt_min", "not a number"): 1}
    assert "preemptible" not in res.missing_fields and "checkpoint_every" not in res.missing_fields


def test_preemption_fields_a_mapping_leaves_out_are_null_and_not_listed_as_missing(tmp_path: Path) -> None:
    """Almost no log says whether a job may be preempted: its lack is no gap in what the audit reads."""
    m = _preemption_log(tmp_path, "", "[constants]\npreemptible = true\n")
    res = read("csv", tmp_path / "p.csv", ReadOptions(mapping=m))
    records = table_to_records(res.table)
    assert {(r.preemptible, r.checkpoint_every) for r in records} == {(True, None)}
    assert "checkpoint_every" not in res.missing_fields and "user" in res.missing_fields


@pytest.mark.parametrize(
    ("lines", "key", "said"),
    [
        ('preemptible = "spot * 2"', "fields.preemptible", "a yes/no field is read from a column"),
        ('[constants]\npreemptible = "yes"', "constants.preemptible", "must be true or false"),
        ("[constants]\ncheckpoint_every = true", "constants.checkpoint_every", "must be a number"),
        ('preemptible = { column = "spot", tres = "gres/gpu" }', "fields.preemptible.tres", "only gpus"),
    ],
)
def test_preemption_mapping_errors_name_the_mapping_file_and_key(
    tmp_path: Path, lines: str, key: str, said: str
) -> None:
    (tmp_path / "p.csv").write_text("id,st,spot\n1,ok,yes\n")
    m = tmp_path / "p.toml"
    m.write_text(f'[fields]\njob_id = "id"\nstate = "st"\n{lines}\n')
    with pytest.raises(BadInputError) as exc:
        READER.read(tmp_path / "p.csv", ReadOptions(mapping=m))
    assert str(exc.value).startswith(f"{m}: {key}:") and said in str(exc.value)
