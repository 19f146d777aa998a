#!/usr/bin/env bash
# The system services some tests use, installed where this machine allows; `make test` runs it once per .venv (CI
# runs nothing else). Never fails and never waits long: where a service cannot be had (not root, no apt-get, no
# network) it says so, and the tests that need it skip with the reason.
#   redis-server         the Redis transport tests and the SLURM launcher's Redis job
#   slurm-wlm + munge    the SLURM launcher tests (they start a throwaway slurmctld/slurmd/munged on localhost)
# FTIS_PROVISION=0 skips every install (only reports what is missing).
set -u

can_install() {
    [ "${FTIS_PROVISION:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
}

apt_install() {  # packages...; a temporary policy-rc.d keeps postinst scripts from starting system daemons
    local made_policy=0 status=0
    [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
        && chmod 755 /usr/sbin/policy-rc.d && made_policy=1; }
    if [ -z "${APT_UPDATED:-}" ]; then
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -qq >/dev/null 2>&1 && APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 \
        || status=1
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    return "$status"
}

provide() {  # program, what skips without it, packages...
    local program=$1 skipped=$2
    shift 2
    if command -v "$program" >/dev/null 2>&1; then
        echo "test services: $program found"
    elif can_install && apt_install "$@" && command -v "$program" >/dev/null 2>&1; then
        echo "test services: installed $*"
    else
        echo "test services: $program unavailable (needs root, apt-get and the network to install $*): $skipped will be skipped"
    fi
}

provide redis-server "the Redis transport and SLURM launcher tests" redis-server
provide slurmctld "the SLURM launcher tests" slurm-wlm munge
exit 0
