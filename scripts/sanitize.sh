#!/usr/bin/env bash
# The engine, CLI and their tests built with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/), then run. Leak detection is off: see docs/reliability.md ("Open").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
cmake -S "$root" -B "$root/build-asan" -DFLASHVK_SANITIZE=ON -DFLASHVK_VIEWER=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build-asan" -j "$(nproc)"
cd "$root/build-asan"
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --output-on-failure -j "$(nproc)" "$@"
