#!/usr/bin/env bash
# Start the private Slurm test cluster in DIR (default: a new temp dir) and print the SLURM_CONF to export.
# Stop it with tests/slurm/stop.sh DIR. Needs root and the packages from tests/slurm/setup.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-$(mktemp -d /tmp/headway-slurm-XXXXXX)}"
mkdir -p "$dir"
chmod 755 "$dir"
py="${PYTHON:-$here/../../.venv/bin/python}"
[ -x "$py" ] || py=python3
"$py" "$here/slurm_cluster.py" start "$dir"
echo "# stop with: bash tests/slurm/stop.sh $dir" >&2
