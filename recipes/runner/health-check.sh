#!/bin/sh
# Runner health check: this box may take pinwheel GPU jobs only while
# `pinwheel preflight --selftest` passes (driver, GPUs, arch, P2P copy test).
# Runs before every job (ACTIONS_RUNNER_HOOK_JOB_STARTED, set by register.sh)
# and by hand: recipes/runner/health-check.sh [extra preflight options]
# Exit status: preflight's own (0 healthy; see `pinwheel --help` for the codes).
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# PINWHEEL: the pinwheel command to use; default: this checkout's launcher.
pinwheel=${PINWHEEL:-$repo/tools/replay}
# The hook runs in whatever directory the runner is in: name the manifest.
manifest=${PINWHEEL_MANIFEST:-$repo/manifest.toml}

"$pinwheel" --manifest "$manifest" preflight --selftest "$@"
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "runner health check FAILED: pinwheel preflight --selftest exited $rc" >&2
    echo "  next: fix what preflight named above, then run $0" >&2
fi
exit "$rc"
