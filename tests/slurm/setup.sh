#!/usr/bin/env bash
# Test services for the live Slurm tests (tests/test_slurm_live.py): Debian's Slurm 22.05 packages, munge,
# slurmdbd and MariaDB. Only installs packages and makes a munge key; the pytest fixture starts and stops
# a private cluster itself (config in a temp dir through SLURM_CONF, never in /etc).
#
# Idempotent and quick when everything is installed. Without root or apt-get it explains and skips (the
# Slurm tests then skip too), unless HEADWAY_REQUIRE_SERVICES=1 (CI), where it fails.
set -euo pipefail

require="${HEADWAY_REQUIRE_SERVICES:-0}"
PACKAGES="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"

give_up() {
    if [ "$require" = "1" ]; then
        echo "slurm services: $1 (HEADWAY_REQUIRE_SERVICES=1, so this is an error)" >&2
        exit 1
    fi
    echo "slurm services: $1; the live Slurm tests will be skipped" >&2
    exit 0
}

have_all() {
    for cmd in slurmctld slurmd slurmdbd sbatch squeue sacct sprio scontrol munged mariadbd mariadb-install-db; do
        command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin" command -v "$cmd" >/dev/null 2>&1 || return 1
    done
}

if ! have_all; then
    if [ "$(id -u)" != "0" ]; then
        give_up "Slurm is missing and installing it needs root (run: sudo apt-get install $PACKAGES)"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        give_up "Slurm is missing and there is no apt-get here to install it"
    fi
    echo "slurm services: installing $PACKAGES (Debian packages) ..."
    export DEBIAN_FRONTEND=noninteractive
    # Package scripts must not start daemons on the system: the tests run their own private ones.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        made_policy=1
    fi
    ok=1
    apt-get update -qq || ok=0
    if [ "$ok" = "1" ]; then
        apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null || ok=0
    fi
    if [ "$made_policy" = "1" ]; then rm -f "$policy"; fi
    [ "$ok" = "1" ] || give_up "apt-get install of $PACKAGES failed"
    have_all || give_up "Slurm packages were installed but some commands are still missing"
fi

if [ ! -s /etc/munge/munge.key ] && [ "$(id -u)" = "0" ]; then
    if command -v mungekey >/dev/null 2>&1 || [ -x /usr/sbin/mungekey ]; then
        PATH="$PATH:/usr/sbin" mungekey --create --keyfile=/etc/munge/munge.key
    else
        PATH="$PATH:/usr/sbin" create-munge-key -f
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
fi
echo "slurm services: $(PATH="$PATH:/usr/sbin" slurmctld -V 2>/dev/null) and munge present"
