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
# Both targets at once (a fuzzer runs on one core), each printing when it is done.
fuzz_one() {
  local target=$1 corpus="$out/corpus_$1" rc=0
  mkdir -p "$corpus"
  cp -n "$root/fuzz/corpus/$target/"* "$corpus/" 2>/dev/null || true
  "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/${target}_" "$corpus" > "$out/$target.log" 2>&1 || rc=$?
  return $rc
}
echo "fuzz: npy and args, ${seconds}s each, side by side"
fuzz_one npy & npy=$!
fuzz_one args & args=$!
status=0
wait $npy || status=1
wait $args || status=1
for target in npy args; do
  echo "fuzz: $target for ${seconds}s"
  tail -n 12 "$out/$target.log"
done
exit $status
