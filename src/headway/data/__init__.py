"""Small real samples shipped with headway (see ATTRIBUTION.md), for `headway demo`, docs and tests."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# name -> what it is; every file here is listed, with its origin, in ATTRIBUTION.md.
SAMPLES: dict[str, str] = {
    "philly_jobs.json.gz": "Microsoft Philly job log, 5,910 multi-GPU jobs (DRE subset), format philly",
    "slurm-22.05-sacct.txt": "sacct -a -X -P output of a Slurm 22.05.8 test cluster, 23 jobs, format sacct",
    "slurm-22.05-sacct-steps.txt": "the same sacct output with job steps (no -X), format sacct",
}


def sample_path(name: str) -> Path:
    """The installed path of a bundled sample; a clear error naming the samples when `name` is not one."""
    if name not in SAMPLES:
        raise FileNotFoundError(f"no bundled sample {name!r}; samples: {', '.join(SAMPLES)}")
    path = Path(str(files(__name__).joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"bundled sample {name!r} is missing from the installed package ({path})")
    return path
