"""The public Helios (SenseTime, SC '21) and Acme (Shanghai AI Lab, NSDI '24) job trace CSVs.

Helios `cluster_log.csv`: job_id, user, vc, [jobname,] gpu_num, cpu_num, node_num, state, submit_time,
start_time, end_time, duration, queue. Acme `trace_seren.csv` / `trace_kalos.csv` have the same core plus
type, gpu_time (and on Kalos mem_per_pod_GB, fail_time, stop_time). States are Slurm names. `queue` is the
queueing delay in seconds, not a queue name, and `duration` is derived from the times, so neither is stored.
Naive times (Helios) are taken as Asia/Shanghai, where both traces were collected, unless `--tz` says
otherwise; Acme times carry their offset. Plain numbers in a time column are read as epoch seconds.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from headway.traces import tabular as tb
from headway.traces.base import BadInputError, ReadOptions, ReadResult
from headway.traces.sacct import STATE_MAP

DEFAULT_TZ = "Asia/Shanghai"
TIME_FORMATS = ("%Y-%m-%d %H:%M:%S%z", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")
_SIGNATURE = ("job_id", "gpu_num", "state", "submit_time")


class HeliosReader:
    name = "helios"

    def sniff(self, path: Path, head: bytes) -> bool:
        fields = tb.head_fields(head, ",")
        return all(c in fields for c in _SIGNATURE)

    def read(self, path: Path, options: ReadOptions) -> ReadResult:
        tz = tb.check_tz(options.tz or DEFAULT_TZ)
        raw = tb.read_delimited(path, ",", quoting=True, progress=options.progress)
        lacking = [c for c in ("job_id", "state") if not raw.has(c)]
        if lacking:
            raise BadInputError(
                f"{path}: not a Helios/Acme trace: no {lacking[0]} column "
                f"(found {', '.join(raw.names[:8]) or 'nothing'})"
            )
        f = tb.Frame(raw)
        provided: set[str] = {"job_id", "state"}
        cols: dict[str, pa.Array] = {"job_id": f.text(raw.get("job_id"))}
        f.flag(pc.is_null(cols["job_id"]), "job_id: empty")
        words = tb.first_word_upper(f.text(raw.get("state")))
        f.flag(pc.is_null(words), "state: empty")
        cols["state"] = f.states(words, STATE_MAP, "state")

        for field_name, names in (("user", ("user",)), ("group", ("vc",)), ("name", ("jobname", "job_name"))):
            v = raw.get(*names)
            if v is not None:
                cols[field_name] = f.text(v)
                provided.add(field_name)
        for field_name, col in (
            ("submit_time", "submit_time"),
            ("start_time", "start_time"),
            ("end_time", "end_time"),
        ):
            v = raw.get(col)
            if v is not None:
                cols[field_name] = f.timestamp(
                    v, col, TIME_FORMATS, tz, epoch_unit="s", required=col == "submit_time"
                )
                provided.add(field_name)
        g = raw.get("gpu_num")
        if g is not None:
            gpus = f.number(g, "gpu_num", required=True)
            f.flag(pc.less(gpus, 0.0), "gpu_num: negative", g)
            cols["gpus"] = gpus
            provided.add("gpus")
        for field_name, col in (("cpus", "cpu_num"), ("nodes", "node_num")):
            v = raw.get(col)
            if v is not None:
                # Acme writes some counts as floats ("8.0"); read as numbers, keep whole values.
                cols[field_name] = f.whole(f.number(v, col), col, v)
                provided.add(field_name)
        table, sink = f.finish(cols, options, self.name)
        notes = []
        if options.tz is None and "submit_time" in provided:
            notes.append(f"times without an offset were read as {DEFAULT_TZ} (use --tz to change)")
        return tb.result(table, self.name, f, sink, provided, notes)


READER = HeliosReader()
