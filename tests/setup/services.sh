#!/usr/bin/env bash
# Test services: Debian's headless `chromium`, used by tests/test_report_browser.py to prove that the
# HTML audit report's charts draw in a real browser.
#
# Idempotent and quick when chromium is already installed. Without root or apt-get it explains and
# skips (the browser test then skips too), unless HEADWAY_REQUIRE_SERVICES=1 (CI), where it fails.
set -euo pipefail

require="${HEADWAY_REQUIRE_SERVICES:-0}"
bash "$(dirname "$0")/users.sh"  # test users of the local queue (before the early exits below)

have_chromium() {
    command -v chromium >/dev/null 2>&1 && chromium --version >/dev/null 2>&1
}

give_up() {
    if [ "$require" = "1" ]; then
        echo "services: $1 (HEADWAY_REQUIRE_SERVICES=1, so this is an error)" >&2
        exit 1
    fi
    echo "services: $1; the browser test will be skipped" >&2
    exit 0
}

if have_chromium; then
    echo "services: $(chromium --version 2>/dev/null | head -n 1) present"
    exit 0
fi

if [ "$(id -u)" != "0" ]; then
    give_up "chromium is missing and installing it needs root (run: sudo apt-get install chromium)"
fi
if ! command -v apt-get >/dev/null 2>&1; then
    give_up "chromium is missing and there is no apt-get here to install it"
fi

echo "services: installing chromium (Debian package) ..."
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
    give_up "apt-get update failed"
fi
if ! apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    give_up "apt-get install chromium failed"
fi
if ! have_chromium; then
    give_up "chromium was installed but does not run"
fi
echo "services: $(chromium --version 2>/dev/null | head -n 1) installed"
bash "$(dirname "$0")/../slurm/setup.sh"  # Slurm test cluster packages (tests/slurm/setup.sh)
