# shellcheck shell=bash
# Sourced by .ci/run and scripts/test: `phase NAME COMMAND...` runs COMMAND as one timed part
# of the run, then prints `phase NAME SECONDS` (and appends it to the file PHASE_LOG names, when
# set: .ci/run's closing table is made of those lines). COMMAND runs as a plain command, so
# `set -e` holds inside it (within `if` or `||` bash would drop it): a failure ends the run,
# and an EXIT trap that calls `phase_unfinished` says which part it ended in.
phase() {
    PHASE_NAME=$1 PHASE_START=$SECONDS
    shift
    echo "== $PHASE_NAME"
    "$@"
    _phase_line "phase $PHASE_NAME $((SECONDS - PHASE_START))"
    PHASE_NAME=
}

# For an EXIT trap: the part that was running when the run stopped, as failed.
phase_unfinished() {
    if [ -n "${PHASE_NAME:-}" ]; then
        _phase_line "phase $PHASE_NAME $((SECONDS - PHASE_START)) failed"
        PHASE_NAME=
    fi
}

_phase_line() {
    echo "$1"
    if [ -n "${PHASE_LOG:-}" ]; then
        echo "$1" >>"$PHASE_LOG"
    fi
}
