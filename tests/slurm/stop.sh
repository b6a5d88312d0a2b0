#!/usr/bin/env bash
# Stop the private Slurm test cluster started by tests/slurm/start.sh DIR (all its daemons and jobs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -eq 1 ] || { echo "usage: stop.sh DIR" >&2; exit 2; }
py="${PYTHON:-$here/../../.venv/bin/python}"
[ -x "$py" ] || py=python3
"$py" "$here/slurm_cluster.py" stop "$1"
