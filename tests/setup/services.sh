#!/usr/bin/env bash
# Test services, run by `make test` before pytest:
# - test users of the local queue (tests/setup/users.sh);
# - Debian's headless `chromium`, used by tests/test_report_browser.py to prove that the HTML audit
#   report's charts draw in a real browser;
# - the Slurm test cluster's packages (tests/slurm/setup.sh).
#
# Idempotent and quick when everything is installed. Without root or apt-get each step explains and
# skips (its tests then skip too), unless HEADWAY_REQUIRE_SERVICES=1 (CI), where that is a failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
require="${HEADWAY_REQUIRE_SERVICES:-0}"

bash "$here/users.sh"

have_chromium() {
    command -v chromium >/dev/null 2>&1 && chromium --version >/dev/null 2>&1
}

# Prints why chromium could not be set up; fatal only when services are required.
chromium_unavailable() {
    if [ "$require" = "1" ]; then
        echo "services: $1 (HEADWAY_REQUIRE_SERVICES=1, so this is an error)" >&2
        exit 1
    fi
    echo "services: $1; the browser test will be skipped" >&2
}

install_chromium() {
    if have_chromium; then
        echo "services: $(chromium --version 2>/dev/null | head -n 1) present"
        return 0
    fi
    if [ "$(id -u)" != "0" ]; then
        chromium_unavailable "chromium is missing and installing it needs root (run: sudo apt-get install chromium)"
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        chromium_unavailable "chromium is missing and there is no apt-get here to install it"
        return 0
    fi
    echo "services: installing chromium (Debian package) ..."
    if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq; then
        chromium_unavailable "apt-get update failed"
        return 0
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
        chromium_unavailable "apt-get install chromium failed"
        return 0
    fi
    if ! have_chromium; then
        chromium_unavailable "chromium was installed but does not run"
        return 0
    fi
    echo "services: $(chromium --version 2>/dev/null | head -n 1) installed"
}

install_chromium

if [ -f "$here/../slurm/setup.sh" ]; then
    bash "$here/../slurm/setup.sh"
fi
