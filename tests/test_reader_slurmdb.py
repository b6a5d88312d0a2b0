"""The slurmdb job_table export reader: numeric states, epoch times, TRES ids, missing columns."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from headway.schema import JOB_SCHEMA, JobRecord, table_to_records
from headway.traces.base import BadInputError, ReadOptions
from headway.traces.registry import read, sniff
from headway.traces.sacct import READER as SACCT
from headway.traces.slurmdb import READER

DATA = Path(__file__).parent / "data"
TABLE = DATA / "slurmdb_job_table.csv"  # the 23 real slurm-22.05 jobs as a job_table export
EDGE = DATA / "slurmdb_edge_cases.tsv"


def _by_id(path: Path, **opts: object) -> dict[str, JobRecord]:
    res = READER.read(path, ReadOptions(**opts))  # type: ignore[arg-type]
    return {r.job_id: r for r in table_to_records(res.table)}


def test_export_of_the_real_jobs_reads_all_23_with_states_exit_codes_and_gpus() -> None:
    res = read("slurmdb", TABLE, ReadOptions())  # the reader and the shared rules
    assert res.table.schema == JOB_SCHEMA and res.table.num_rows == 23 and res.bad_row_count == 0
    assert res.missing_fields == ["group"]  # the test cluster has no accounts: empty throughout
    jobs = {r.job_id: r for r in table_to_records(res.table)}
    assert jobs["23"].gpus == 16 and jobs["23"].nodes == 2 and jobs["23"].cpus == 2
    assert jobs["4"].state == "FAILED" and jobs["4"].exit_code == 1  # raw wait status 256
    assert jobs["5"].exit_code == 2 and jobs["21"].state == "TIMEOUT" and jobs["22"].state == "CANCELLED"
    assert jobs["21"].time_limit == 60 and jobs["21"].runtime == 73
    assert jobs["1"].user == "1001" and jobs["1"].mem_mb == 64000
    assert jobs["1"].submit_time == dt.datetime(2026, 11, 29, 14, 37, 13, tzinfo=dt.UTC)


@pytest.mark.shared
def test_export_agrees_with_sacct_on_the_same_jobs(shared_traces: Path) -> None:
    sacct = {
        r.job_id: r
        for r in table_to_records(
            SACCT.read(shared_traces / "slurm-22.05" / "sacct_allocations.txt", ReadOptions(tz="UTC")).table
        )
    }
    db = _by_id(TABLE)
    assert set(db) == set(sacct)
    for jid, s in sacct.items():
        d = db[jid]
        assert (d.state, d.gpus, d.nodes, d.exit_code, d.time_limit) == (
            s.state,
            s.gpus,
            s.nodes,
            s.exit_code,
            s.time_limit,
        ), jid
        assert (d.submit_time, d.start_time, d.end_time) == (s.submit_time, s.start_time, s.end_time), jid


def test_edge_cases_pending_array_flags_oom_and_per_cpu_memory() -> None:
    jobs = _by_id(EDGE)
    pending = jobs["501"]
    assert pending.state == "PENDING" and pending.start_time is None and pending.end_time is None
    assert pending.time_limit is None  # 4294967295 = no limit
    assert pending.gpus == 4  # tres_req, since nothing is allocated yet
    array = jobs["500_3"]
    assert array.gpus == 2 and array.mem_mb == 16000  # MEM_PER_CPU flag: 4000 MB x 4 CPUs
    assert jobs["503"].state == "OUT_OF_MEMORY"
    assert jobs["504"].state == "CANCELLED"  # 1028 = CANCELLED with a flag bit set
    assert jobs["507"].exit_code == 3 and jobs["507"].mem_mb is None  # \N is null


def test_edge_cases_report_bad_rows_and_missing_fields() -> None:
    res = READER.read(EDGE, ReadOptions())
    assert res.table.num_rows == 5 and res.rows_read == 7 and res.bad_row_count == 2
    assert [b.line for b in res.bad_rows] == [6, 7]
    assert "time_submit" in res.bad_rows[0].reason and "yesterday" in res.bad_rows[0].reason
    assert {"group", "partition", "priority_class"} <= set(res.missing_fields)
    assert "some_site_column" not in str(res.missing_fields)


def test_explicit_gpu_tres_ids_are_summed() -> None:
    jobs = _by_id(EDGE, gpu_tres_ids=(1002, 1003))
    assert jobs["500_3"].gpus == 2 and jobs["503"].gpus == 1 and jobs["501"].gpus == 4
    both = _by_id(EDGE, gpu_tres_ids=(1001, 1002))
    assert both["500_3"].gpus == 4  # naming the untyped and typed ids double counts, as asked


def test_strict_stops_at_the_first_bad_row() -> None:
    with pytest.raises(BadInputError, match=r"slurmdb_edge_cases.tsv:6: time_submit"):
        READER.read(EDGE, ReadOptions(strict=True))


def test_a_csv_without_id_job_is_refused_with_one_line(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(BadInputError, match="no id_job column"):
        READER.read(p, ReadOptions())


def test_sniff_picks_slurmdb_for_comma_and_tab_exports() -> None:
    assert sniff(TABLE) == "slurmdb"
    assert sniff(EDGE) == "slurmdb"
