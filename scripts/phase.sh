# shellcheck shell=bash
# Sourced by .ci/run and scripts/test: `phase NAME COMMAND...` runs COMMAND as one timed part
# of the run, then prints `phase NAME SECONDS` (also when it fails, with its status), the
# line .ci/run's closing table is made of.
phase() {
    local name=$1 start=$SECONDS rc=0
    shift
    echo "== $name"
    "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "phase $name $((SECONDS - start))"
    else
        echo "phase $name $((SECONDS - start)) failed($rc)"
    fi
    return "$rc"
}
