#!/usr/bin/env bash
# The README's test command: set-up, build, then every test with the Vulkan validation layers on.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" "$@"
