#!/usr/bin/env bash
# The README's test command: set-up, build, then every test with the Vulkan validation layers on
# (scripts/suite.sh: GoogleTest's binaries as shard processes, then CTest's other tests).
# Arguments pick tests as CTest's do (e.g. -R MatrixTest); those then run through CTest, a
# process a test.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/build.sh"
# Validation on, whatever the caller's environment says.
bash "$root/scripts/suite.sh" "$root/build" FLASHVK_VALIDATION=1 -- "$@"
