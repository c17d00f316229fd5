#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds into build/.
# Extra arguments go to cmake's configure step, e.g. -DFLASHVK_VIEWER=OFF.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHVK_WERROR=ON "$@" >/dev/null
cmake --build "$root/build" -j "$(nproc)"
