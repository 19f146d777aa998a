#!/usr/bin/env bash
# The system services some tests use, installed where this machine allows; `make test` runs it once per .venv (CI
# runs nothing else). Never fails and never waits long: where a service cannot be had (not root, no apt-get, no
# network) it says so, and the tests that need it skip with the reason.
#   redis-server         the Redis transport tests and the SLURM launcher's Redis job
#   slurm-wlm + munge    the SLURM launcher tests (they start a throwaway slurmctld/slurmd/munged on localhost)
# FTIS_PROVISION=0 skips every install (only reports what is missing).
# Usage: provision_services.sh [LOG]: apt's output goes to LOG (default .venv/test-services.log), which is kept.
#
# While it installs, a temporary policy-rc.d (FTIS_POLICY_RC_D, default /usr/sbin/policy-rc.d) keeps the packages'
# postinst scripts from starting system daemons. It is removed on every exit this script sees (success, failure,
# INT, TERM, HUP), and one left by an earlier run of this script that was killed outright (SIGKILL, a power cut) is
# recognised by its marker line and removed the next time this script runs. A policy-rc.d that is not ours is never
# touched.
set -u

POLICY=${FTIS_POLICY_RC_D:-/usr/sbin/policy-rc.d}
MARKER="# written by trl-ftis tests/provision_services.sh; safe to delete"
LOG=${1:-.venv/test-services.log}
made_policy=0
child=

remove_our_policy() {  # only a policy this script wrote (it carries MARKER), never an administrator's
    if [ -f "$POLICY" ] && grep -qxF "$MARKER" "$POLICY" 2>/dev/null; then
        rm -f "$POLICY"
    fi
}

cleanup() {
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; child=; fi
    if [ "$made_policy" = 1 ]; then remove_our_policy; made_policy=0; fi
}

on_signal() {  # signal name, exit status
    cleanup
    echo "test services: stopped by SIG$1; the temporary $POLICY was removed" >&2
    trap - EXIT
    exit "$2"
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

can_install() {
    [ "${FTIS_PROVISION:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
}

logged() {  # command...: run in the background and waited for, so that a signal's trap runs at once
    "$@" >>"$LOG" 2>&1 &
    child=$!
    wait "$child"
    local status=$?
    child=
    return "$status"
}

apt_install() {  # packages...
    local status=0
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e "$POLICY" ]; then
        printf '#!/bin/sh\n%s\nexit 101\n' "$MARKER" >"$POLICY" && chmod 755 "$POLICY" && made_policy=1
    fi
    mkdir -p "$(dirname "$LOG")" 2>/dev/null
    echo "test services: installing $* with apt-get (output in $LOG)"
    if [ -z "${APT_UPDATED:-}" ]; then
        logged timeout 300 apt-get update -qq && APT_UPDATED=1
    fi
    logged timeout 600 apt-get install -y -qq --no-install-recommends "$@" || status=1
    cleanup
    return "$status"
}

provide() {  # program, what skips without it, packages...
    local program=$1 skipped=$2
    shift 2
    if command -v "$program" >/dev/null 2>&1; then
        echo "test services: $program found"
    elif can_install && apt_install "$@" && command -v "$program" >/dev/null 2>&1; then
        echo "test services: installed $*"
    elif can_install; then
        echo "test services: installing $* failed (see $LOG): $skipped will be skipped"
    else
        echo "test services: $program unavailable (needs root, apt-get and the network to install $*): $skipped will be skipped"
    fi
}

# A policy left by an earlier run that was killed outright goes first, whatever is installed this time.
if [ -f "$POLICY" ] && grep -qxF "$MARKER" "$POLICY" 2>/dev/null; then
    if rm -f "$POLICY" 2>/dev/null && [ ! -e "$POLICY" ]; then
        echo "test services: removed $POLICY, left by an earlier, interrupted run of this script"
    else
        echo "test services: $POLICY, left by an earlier, interrupted run of this script, could not be removed (not root?): delete it as root, or package installs will not start their services" >&2
    fi
fi
provide redis-server "the Redis transport and SLURM launcher tests" redis-server
provide slurmctld "the SLURM launcher tests" slurm-wlm munge
exit 0
