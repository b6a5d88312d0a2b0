#!/usr/bin/env bash
# Test users for the local queue's isolation tests: two real Unix accounts, hw-alice and hw-bob.
#
# Idempotent (an existing account is left alone). Needs root and useradd; without them it explains and
# skips (the isolation tests then skip too), unless HEADWAY_REQUIRE_SERVICES=1 (CI), where it fails.
set -euo pipefail

require="${HEADWAY_REQUIRE_SERVICES:-0}"
users=(hw-alice hw-bob)

give_up() {
    if [ "$require" = "1" ]; then
        echo "users: $1 (HEADWAY_REQUIRE_SERVICES=1, so this is an error)" >&2
        exit 1
    fi
    echo "users: $1; the local-queue isolation tests will be skipped" >&2
    exit 0
}

missing=()
for u in "${users[@]}"; do
    id -u "$u" >/dev/null 2>&1 || missing+=("$u")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "users: ${users[*]} present"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    give_up "creating ${missing[*]} needs root (run: sudo bash tests/setup/users.sh)"
fi
if ! command -v useradd >/dev/null 2>&1; then
    give_up "useradd is not available to create ${missing[*]}"
fi
for u in "${missing[@]}"; do
    # No password, no login shell: these accounts only run test jobs through runuser.
    useradd --no-create-home --shell /usr/sbin/nologin --home-dir /nonexistent "$u" \
        || give_up "useradd $u failed"
done
echo "users: created ${missing[*]}"
