#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer) and runs
# each for SECONDS (default 60) from the seed corpus in fuzz/corpus. Fails on any crash, leak or
# sanitizer report. Usage: bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
bash "$root/scripts/setup.sh"
out="$root/build-fuzz"
# The fuzzers link the engine's libraries, built with clang, the fuzzer's instrumentation and
# ASan + UBSan (FLASHVK_FUZZ).
CXX=clang++ cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHVK_FUZZ=ON \
  -DFLASHVK_WERROR=ON -DFLASHVK_CLI=OFF -DFLASHVK_VIEWER=OFF -DFLASHVK_TESTS=OFF \
  -DFLASHVK_INSTALL=OFF >/dev/null
cmake --build "$out" -j "$(nproc)" --target npy_fuzz args_fuzz >/dev/null
for target in npy args; do
  corpus="$out/corpus_$target"
  mkdir -p "$corpus"
  cp -n "$root/fuzz/corpus/$target/"* "$corpus/" 2>/dev/null || true
  echo "fuzz: $target for ${seconds}s"
  "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/${target}_" \
    "$corpus" 2>&1 | tail -n 12
done
