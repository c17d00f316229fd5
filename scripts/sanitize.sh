#!/usr/bin/env bash
# The engine, CLI and their tests built with AddressSanitizer + UndefinedBehaviorSanitizer
# (build-asan/), then run with LeakSanitizer on.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
# -O1 and line tables (-g1), as the sanitizers' own docs advise: stacks keep files and lines, and
# the build takes about 2.4x less compile time than -O2 -g (CI time).
cmake -S "$root" -B "$root/build-asan" -DFLASHVK_SANITIZE=ON -DFLASHVK_WERROR=ON -DFLASHVK_VIEWER=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build "$root/build-asan" -j "$(nproc)"

# The Vulkan loader unloads drivers and layers before LeakSanitizer runs at exit, so their leaks
# would show as "<unknown module>" and could not be told from ours. Preloading them keeps them
# mapped: every report then names its module, and scripts/lsan.supp drops the driver stack's own.
# libasan must come first in the preload list.
preload="$(gcc -print-file-name=libasan.so)"
for lib in $(sed -n 's/.*"library_path": *"\([^"]*\)".*/\1/p' \
               /usr/share/vulkan/icd.d/*.json /usr/share/vulkan/implicit_layer.d/*.json \
               /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json 2>/dev/null); do
  case "$lib" in /*) ;; *) lib="$(gcc -print-file-name="$lib")" ;; esac
  [ -f "$lib" ] && preload="$preload:$lib"
done
# For the tests only (scripts/suite.sh), not for the scripts' own tools. Arguments pick tests as
# CTest's do (e.g. -R MatrixTest); those then run through CTest, a process a test.
options=(FLASHVK_VALIDATION=1 LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
         LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
         UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1)
bash "$root/scripts/suite.sh" "$root/build-asan" "${options[@]}" -- "$@"
