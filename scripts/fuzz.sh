#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer) and runs
# each for SECONDS (default 60) from the seed corpus in fuzz/corpus. Fails on any crash, leak or
# sanitizer report. Usage: bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
bash "$root/scripts/setup.sh"
out="$root/build-fuzz"
mkdir -p "$out"
flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -I"$root/engine/include" -I"$root/cli")
common=("$root/cli/npy.cpp" "$root/cli/args.cpp" "$root/engine/src/host_tensor.cpp" "$root/engine/src/error.cpp")
for target in npy args; do
  clang++ "${flags[@]}" "$root/fuzz/${target}_fuzz.cpp" "${common[@]}" -o "$out/${target}_fuzz"
  corpus="$out/corpus_$target"
  mkdir -p "$corpus"
  cp -n "$root/fuzz/corpus/$target/"* "$corpus/" 2>/dev/null || true
  echo "fuzz: $target for ${seconds}s"
  "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/${target}_" \
    "$corpus" 2>&1 | tail -n 12
done
