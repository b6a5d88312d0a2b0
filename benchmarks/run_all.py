"""Run every benchmark in this folder, one after another, and print their JSON result lines.

Usage: .venv/bin/python benchmarks/run_all.py [NAME ...]   (names like `ingest`, `audit`; default: all)
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        wanted = {f"bench_{a.removeprefix('bench_').removesuffix('.py')}.py" for a in argv}
        scripts = [s for s in scripts if s.name in wanted]
    failed = 0
    results: list[object] = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            failed += 1
            sys.stdout.write(proc.stderr[-4000:])
            print(f"!! {script.name} exited {proc.returncode}")
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    results.append(json.loads(line))
    print(json.dumps({"benchmarks": results}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
