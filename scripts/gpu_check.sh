#!/usr/bin/env bash
# The whole test suite and then gpu_bench.sh on a machine with a GPU and no build tools, from
# binaries built elsewhere (docs/performance.md, "On a GPU": build, strip, xz and carry them).
# The suite runs sharded over the machine's cores (GoogleTest's GTEST_TOTAL_SHARDS /
# GTEST_SHARD_INDEX, one process a core, FLASHVK_VALIDATION=0: such machines have no validation
# layers); on an H200 it needs more than 16 shards of 200 s (NVIDIA's compiler). Everything goes
# to OUT as it happens, so a lease cut short keeps what ran:
#   OUT/system.txt               the GPU (nvidia-smi), the libraries used and `flashvk devices`
#   OUT/tests/<binary>-<i>.txt   each shard's GoogleTest output, test by test (scripts/shards.sh)
#   OUT/tests/summary.txt        as each shard ends: its counts and exit status (and the test it
#                                ended in, if it crashed or was cut off); then every failed test
#                                and the slowest
#   OUT/tests.txt                the same once the suite has run, and the reruns' counts
#   OUT/rerun/<binary>-<run>.txt the failed tests again, with the SPIR-V as glslang built it
#                                (as-built) and as they ran (control)
#   OUT/bench/                   gpu_bench.sh's log.txt and JSON, in the time that is left
# Usage: scripts/gpu_check.sh BIN OUT
#   BIN holds flashvk, flashvk_tests and flashvk_cli_tests (each may be .xz), and optionally
#   .debs of the Vulkan loader and libglvnd (libvulkan1 libglvnd0 libegl1 libgl1 libglx0
#   libopengl0 libgles2: NVIDIA's Vulkan driver, libGLX_nvidia, finds no device without the
#   GLX and EGL dispatchers), unpacked into BIN/lib and used only where the system lacks them.
# Environment: SHARDS (processes, default the cores), TEST_TIMEOUT (seconds the suite may take,
# default 210), BUDGET (seconds for the whole script, default 340), BENCH=0 to skip gpu_bench.sh,
# SUITE=0 to skip the suite (a lease's first call, BUDGET=380: the measurements first; then
# BENCH=0 with GTEST_FILTER naming the tests that matter: the whole suite outlasts a lease),
# PACK=FILE.tgz to pack OUT into FILE.tgz every 10 s and at the end (for a machine that hands
# back a few files: a lease cut short keeps the last pack),
# TINY=1 for its small shapes (a dry run on lavapipe, with GTEST_FILTER naming a few tests).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [[ $# -ne 2 ]]; then
  echo "usage: scripts/gpu_check.sh BIN OUT" >&2
  exit 2
fi
bin="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
shards="${SHARDS:-$(nproc)}"
test_timeout="${TEST_TIMEOUT:-210}"
budget="${BUDGET:-340}"

# The binaries, unpacked where they came as .xz.
for f in "$bin"/*.xz; do
  [[ -e "$f" ]] || continue
  [[ -e "${f%.xz}" ]] || xz -dkc "$f" >"${f%.xz}"
  chmod +x "${f%.xz}"
done
for b in flashvk flashvk_tests flashvk_cli_tests; do
  if [[ ! -x "$bin/$b" ]]; then
    echo "gpu_check: $bin/$b is missing (docs/performance.md, \"On a GPU\")" >&2
    exit 1
  fi
done
# The Vulkan loader and libGLdispatch from the carried .debs, where the system has none.
lib="$bin/lib"
for deb in "$bin"/*.deb; do
  [[ -e "$deb" ]] || continue
  tmp="$(mktemp -d)"
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$tmp"
  else
    (cd "$tmp" && ar x "$deb" && tar xf data.tar.*)
  fi
  mkdir -p "$lib"
  find "$tmp" -name 'lib*.so*' \( -type f -o -type l \) -exec cp -P {} "$lib/" \;
  rm -rf "$tmp"
done
if [[ -d "$lib" ]]; then
  for so in "$lib"/lib*.so.[0-9]; do  # each library by its soname, where the system has it
    [[ -e "$so" ]] || continue
    base="$(basename "$so")"
    if ldconfig -p 2>/dev/null | awk '{print $1}' | grep -qx "$base"; then rm -f "$lib/${base%%.so*}.so"*; fi
  done
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NVIDIA's manifest where the loader would not look (containers with the driver mounted there).
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [[ -z "${VK_DRIVER_FILES:-}" && -e "$nvidia_icd" && ! -e /usr/share/vulkan/icd.d/nvidia_icd.json ]]; then
  export VK_DRIVER_FILES="$nvidia_icd"
fi
export FLASHVK_VALIDATION=0 FLASHVK_CLI="$bin/flashvk"
if [[ -n "${PACK:-}" ]]; then
  # Each packer writes a file of its own (a tar still running when the loop is killed at exit
  # cannot overwrite the last pack), and leaves PACK's files out where PACK is inside OUT.
  pack() {
    local part="$PACK.$BASHPID"
    tar czf "$part" --exclude="$(basename "$PACK")*" -C "$(dirname "$out")" "$(basename "$out")" &&
      mv -f "$part" "$PACK"
  }
  (while sleep 10; do pack 2>/dev/null; done) &
  packer=$!
  trap 'kill $packer 2>/dev/null; pack' EXIT
fi

{
  echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u)"
  echo "$(nproc) cores, $shards shards, LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader
  ldd "$bin/flashvk_tests" | grep -E 'vulkan|GLdispatch|not found'
  "$bin/flashvk" devices
} >"$out/system.txt" 2>&1
cat "$out/system.txt"

suite_status=0
summary="$out/tests.txt"
if [[ "${SUITE:-1}" == 0 ]]; then
  echo "gpu_check: the suite skipped (SUITE=0)"
else
  # The suite (scripts/shards.sh): flashvk_tests over most cores, the CLI's tests (each starts
  # flashvk processes) over a quarter, all at once.
  rm -rf "$out/tests" "$out/rerun"  # an earlier run's shards and reruns
  cli_shards=$(((shards + 3) / 4))
  engine_shards=$((shards > cli_shards ? shards - cli_shards : 1))
  echo "gpu_check: $((engine_shards + cli_shards)) test processes, at most $test_timeout s"
  JOBS=$((engine_shards + cli_shards)) SHARD_TIMEOUT="$test_timeout" \
    bash "$root/scripts/shards.sh" \
    "$out/tests" "$bin/flashvk_tests:$engine_shards" "$bin/flashvk_cli_tests:$cli_shards"
  suite_status=$?
  cp "$out/tests/summary.txt" "$summary"

  # Failed tests again (shards.sh's rerun lists: a crashed or cut-off process gives the test it
  # ended in too), each binary's in one process, twice: with the SPIR-V as glslang built it
  # (FLASHVK_SPIRV_AS_BUILT=1: no coherence_at_barriers, engine/src/spirv.hpp), then as they ran
  # (the control: alone on the GPU now). Passing as built and failing as they ran puts the fault
  # on the rewrite. A run takes at most 120 s, and half of what is left of the budget (none under
  # 15 s).
  mkdir -p "$out/rerun"
  for binary in flashvk_tests flashvk_cli_tests; do
    [[ -s "$out/tests/rerun-$binary.txt" ]] || continue
    filter=$(sort -u "$out/tests/rerun-$binary.txt" | paste -sd: -)
    for run in as-built control; do
      t=$(((budget - SECONDS - 5) / 2))
      ((t > 120)) && t=120
      if ((t < 15)); then
        echo "$binary's failed tests, $run: skipped, out of time" | tee -a "$summary"
        continue
      fi
      rerun="$out/rerun/$binary-$run.txt"
      env_as_built=()
      [[ $run == as-built ]] && env_as_built=(FLASHVK_SPIRV_AS_BUILT=1)
      env "${env_as_built[@]}" timeout "$t" "$bin/$binary" --gtest_filter="$filter" >"$rerun" 2>&1
      status=$?
      echo "$binary's failed tests, $run${env_as_built[*]:+ (${env_as_built[*]})}: exit $status," \
        "$(grep -c '^\[       OK \]' "$rerun") passed," \
        "$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$rerun") failed ($rerun)" |
        tee -a "$summary"
    done
  done

fi

# The measurements, in what is left of the budget.
left=$((budget - SECONDS))
if [[ "${BENCH:-1}" == 0 ]]; then
  echo "gpu_check: gpu_bench.sh skipped (BENCH=0)"
elif ((left < 30)); then
  echo "gpu_check: gpu_bench.sh skipped: $left s left of $budget" | tee -a "$summary"
else
  tiny=()
  [[ "${TINY:-0}" == 1 ]] && tiny=(--tiny)
  FLASHVK="$bin/flashvk" BUDGET=$left bash "$root/scripts/gpu_bench.sh" "${tiny[@]}" "$out/bench"
fi
if [[ "${SUITE:-1}" == 0 ]]; then
  echo "gpu_check: the suite skipped; $out/bench/log.txt"
else
  echo "gpu_check: the suite $( ((suite_status == 0)) && echo passed || echo failed);" \
    "$out/tests.txt, $out/bench/log.txt"
fi
exit $((suite_status != 0))
