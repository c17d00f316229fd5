#!/usr/bin/env bash
# The GPU measurements docs/performance.md still lacks, most wanted first, for a session that is
# lent a GPU for a while: every step's table goes to OUT/log.txt as it finishes, so a lease that
# ends early keeps what ran. Files:
#   log.txt             every table, each under the command that printed it, and its exit status
# in the order they are made (issue #43's first):
#   prefill_f16_D.json  fp16 prefill, flash2 and flashd, N=4096, at d = D: 64, 128 and 256;
#                       causal in prefill_f16_D_causal.json; prefill_nv2_f16_D*.json the same
#                       through --matrix-api nv2 (d <= 128), where the device has it
#   sdpa.json           PyTorch's SDPA (flash and cuDNN backends) on those shapes, and flashvk's
#                       time over theirs (scripts/sdpa_bench.py; where python3 has torch and CUDA)
#   pipelines_f16_D.json  the driver's statistics of those shapes' pipelines (registers: what
#                       bounds the matrix kernels' occupancy on NVIDIA); pipelines_nv2_f16_D.json
#                       through nv2
#   modifiers_f16.json  bench --suite modifiers in fp16 at N=4096 (the matrix path's modifier
#                       costs, and its skip of hidden tiles: the sparse-mask row)
#   prefill_as_built_f16_D.json  flash2's full shapes (d <= 128) with the SPIR-V as glslang
#                       built it (FLASHVK_SPIRV_AS_BUILT=1)
#   tiles_API_D_KEYS.json  the matrix kernel at 16, 32 and 64 KEYS a tile (--block-keys),
#                       flash2 at d = 64 and 128, in the default API and nv2 (API)
#   rows_D_32.json      flash2's matrix kernel with its row blocks split over two groups
#                       (--block-rows 32), at d = 64 and 128; rows_D_128.json with 128 rows a
#                       workgroup (--block-rows 128), and pipelines_rows_D_128.json their registers;
#                       groups_D_R.json with 32 rows a group (--group-rows 32), R a workgroup,
#                       and pipelines_groups_D.json their registers
#   skip_D_PHASES.json  flash2's matrix kernel at d = D with PHASES left out (FLASHVK_MATRIX_SKIP,
#                       its commas as +; none: nothing, the whole kernel); pipelines_skip_D_
#                       PHASES.json: the registers of those that keep the results (queries)
#   targets.txt         issue #43's targets, each measured and met or not; nv2, the SPIR-V as
#                       built and the tiles against the default; the phases' share
#                       (gpu_targets.py, run once the files it reads are written)
#   prefill_kv_f16.json flash2 at d = 128 (N=4096) with K and V in f16, q8_0 and q4_0 on the
#                       matrix units (vs_base: the cost of decoding blocks as tiles are staged)
#   decode_cold.json,   decoding (H=32, Hkv=8, d=128, f16) over 4096, 16384 and 65536 keys, caches
#   decode_warm.json    flushed before each run, and back to back (--warm-cache); sdpa_decode.json
#                       PyTorch's SDPA on them
#   decode_kv.json      decoding over 65536 keys with K and V in f16, q8_0 and q4_0 (vs_base)
#   modifiers_f32.json  the same in fp32, at the suite's N=2048
#   suite.json          bench --suite standard --peak (register blocks and fp16 arithmetic
#                       included where the engine picks them)
#   pipelines.json      flashvk pipelines --suite kernels: the driver's statistics
#                       (pipelines_nv2.json: with --matrix-api nv2, where the device has it)
# Usage: scripts/gpu_bench.sh [--tiny] [OUT]   (OUT defaults to out/gpu). --tiny: small shapes
# and none of the fixed suites, a dry run of the script on any device (lavapipe) in a minute.
# Environment: $FLASHVK the binary (default build/flashvk); $STEP_TIMEOUT the seconds one step
# may take (default 600); $BUDGET the seconds the whole script may take (default: no limit):
# a step gets what is left, and steps are skipped, said so in the log, once less than 10 s is.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tiny=0
if [[ "${1:-}" == "--tiny" ]]; then
  tiny=1
  shift
fi
out="${1:-$root/out/gpu}"
bin="${FLASHVK:-$root/build/flashvk}"
limit="${STEP_TIMEOUT:-600}"
budget="${BUDGET:-0}"
if [[ ! -x "$bin" ]]; then
  echo "gpu_bench: no flashvk binary at $bin (build it, or set FLASHVK)" >&2
  exit 1
fi
mkdir -p "$out"
log="$out/log.txt"
: >"$log"
# What an earlier run wrote here, so that nothing of it is read as this run's.
rm -f "$out"/{prefill,tiles,rows,skip,decode,modifiers,sdpa,suite,pipelines}*.json "$out/targets.txt"
echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u)" >>"$log"

failed=0
skipped=0
# Seconds a step may take now: the step limit, within what is left of the budget (0: none left).
step_limit() {
  local left
  if [[ "$budget" -le 0 ]]; then
    echo "$limit"
    return
  fi
  left=$((budget - SECONDS))
  if ((left < 10)); then
    echo 0
  elif ((left < limit)); then
    echo "$left"
  else
    echo "$limit"
  fi
}
# Runs a command under the step's time limit, its output into the log.
run_step() {
  local title="$1" t start status
  shift
  t=$(step_limit)
  if [[ "$t" -eq 0 ]]; then
    echo "== skipped (out of time): $title" | tee -a "$log"
    skipped=$((skipped + 1))
    return
  fi
  echo "== $title" | tee -a "$log"
  start=$SECONDS
  timeout "$t" "$@" >>"$log" 2>&1
  status=$?
  [[ $status -ne 0 ]] && failed=$((failed + 1))
  echo "== exit $status after $((SECONDS - start)) s" | tee -a "$log"
}
step() { run_step "flashvk $*" "$bin" "$@"; }

if ((tiny)); then
  decode=(--nq 1 --heads 4 --kv-heads 2 --d 64 --repeat 3)
  decode_keys=(256 1024)
  prefill_dims=(--heads 2 --nq 128)
  prefill_shape=("${prefill_dims[@]}" --repeat 3)
  prefill_d=(64)
  shape=(--nq 64 --d 16 --repeat 2)  # for the modifiers suite
  peak=()                            # llvmpipe's calibrations take longer than the runs
else
  decode=(--nq 1 --heads 32 --kv-heads 8 --d 128 --repeat 9)
  decode_keys=(4096 16384 65536)
  prefill_dims=(--heads 8 --nq 4096)
  prefill_shape=("${prefill_dims[@]}" --repeat 9)
  prefill_d=(64 128 256)  # 256: the matrix kernel's split row blocks (Gemma's head dim)
  shape=(--nq 4096)  # issue #43's targets' N
  peak=(--peak)
fi
prefill=(--variant flash2,flashd "${prefill_shape[@]}")
longest=${decode_keys[${#decode_keys[@]}-1]}

step devices
json_files=()
# Issue #43's shapes: flash2 and flashd (within 5%), full and causal (<= 0.6x full's time).
for d in "${prefill_d[@]}"; do
  for mask in full causal; do
    file="$out/prefill_f16_$d.json"
    flags=()
    [[ $mask == causal ]] && file="$out/prefill_f16_${d}_causal.json" && flags=(--causal)
    step bench "${prefill[@]}" --d "$d" --dtype f16 "${flags[@]}" "${peak[@]}" --json "$file"
    json_files+=("$file")
  done
done
# Issue #43: NVIDIA's second extension (--matrix-api nv2: the softmax kept in matrices) on the
# same shapes where the device has it (`flashvk devices`), for gpu_targets.py to set against
# khr's (the default): the engine takes nv2 only where asked until it wins.
has_nv2=0
if "$bin" devices 2>/dev/null | grep -q "nv2 (--matrix-api nv2)"; then
  has_nv2=1
  for d in "${prefill_d[@]}"; do
    ((d > 128)) && continue  # past 128, khr's kernel anyway
    for mask in full causal; do
      file="$out/prefill_nv2_f16_$d.json"
      flags=()
      [[ $mask == causal ]] && file="$out/prefill_nv2_f16_${d}_causal.json" && flags=(--causal)
      step bench "${prefill[@]}" --d "$d" --dtype f16 --matrix-api nv2 "${flags[@]}" \
        --json "$file"
    done
  done
else
  echo "== nv2: skipped: the device lacks VK_NV_cooperative_matrix2 (flashvk devices)" |
    tee -a "$log"
fi
# PyTorch's SDPA (flash and cuDNN) on the shapes of those of the files (after OUT) that were
# written, where there is torch and CUDA (scripts/sdpa_bench.py), into OUT.
sdpa_step() {
  local json="$1" present=() f
  shift
  if ! command -v python3 >/dev/null; then
    echo "== sdpa_bench: skipped: no python3" | tee -a "$log"
    return
  fi
  for f in "$@"; do [[ -s "$f" ]] && present+=("$f"); done
  ((${#present[@]})) || return
  run_step "sdpa_bench.py (PyTorch SDPA on the same shapes; flashvk's time over theirs)" \
    python3 "$root/scripts/sdpa_bench.py" "${present[@]}" --json "$json"
}
# Issue #43: the anchor, FlashAttention-2, on the prefill shapes.
sdpa_step "$out/sdpa.json" "${json_files[@]}"
# The prefill shapes' pipelines as the driver reports them, built without running (NVIDIA's
# registers, which bound the matrix kernels' occupancy; nv2's beside them where present).
for d in "${prefill_d[@]}"; do
  step pipelines --variant flash2,flashd "${prefill_dims[@]}" --d "$d" --dtype f16 \
    --json "$out/pipelines_f16_$d.json"
  ((has_nv2 && d <= 128)) && step pipelines --variant flash2,flashd "${prefill_dims[@]}" \
    --d "$d" --dtype f16 --matrix-api nv2 --json "$out/pipelines_nv2_f16_$d.json"
done
# Issue #19: the modifiers on the matrix path (softcap and the mask read +100% at 2adeeba), and
# q8_0 decoding against fp16 at the longest length (targets: q8_0 <= 0.7x, q4_0 <= 0.5x fp16).
step bench --suite modifiers --dtype f16 "${shape[@]}" --json "$out/modifiers_f16.json"
# Issue #43: what engine/src/spirv.hpp's rewrite of the matrix kernels (shared memory coherent at
# barriers, not at each access) is worth on this driver: the full shapes again with the SPIR-V
# as glslang built it (FLASHVK_SPIRV_AS_BUILT=1), flash2 alone, for gpu_targets.py to set
# against the default's.
for d in "${prefill_d[@]}"; do
  ((d > 128)) && continue
  run_step "FLASHVK_SPIRV_AS_BUILT=1 flashvk bench ... --d $d (the SPIR-V as built)" \
    env FLASHVK_SPIRV_AS_BUILT=1 "$bin" bench --variant flash2 "${prefill_shape[@]}" --d "$d" \
    --dtype f16 --json "$out/prefill_as_built_f16_$d.json"
done
# Issue #43: the matrix kernel's tiles, which this GPU's default should take: flash2 at 16, 32
# and 64 keys a tile (--layout coopmat --block-keys), d <= 128, in the context's own API (khr on
# NVIDIA) and nv2's where the device has it; where the K and V^T tiles do not fit beside each
# other (khr at d = 128, 64 keys, in 48 KiB) V^T takes K's place after the scores (V_IN_K). A
# size the shared memory cannot hold is refused by the engine and said so here, not counted as
# failed. gpu_targets.py sets each against the
# engine's own choice.
for api in default nv2; do
  [[ $api == nv2 ]] && ((!has_nv2)) && continue
  api_flags=()
  [[ $api == nv2 ]] && api_flags=(--matrix-api nv2)
  for d in "${prefill_d[@]}"; do
    ((d > 128)) && continue
    for keys in 16 32 64; do
      file="$out/tiles_${api}_${d}_$keys.json"
      step bench --variant flash2 "${prefill_shape[@]}" --d "$d" --dtype f16 --layout coopmat \
        --block-keys "$keys" "${api_flags[@]}" --json "$file"
      if [[ ! -s "$file" ]] && tail -n 3 "$log" | grep -q "bytes of shared memory with $keys keys"
      then
        failed=$((failed - 1))  # refused: it does not fit (the log says so)
        echo "== ($api, d=$d: $keys keys do not fit this device's shared memory)" | tee -a "$log"
      fi
    done
  done
done
# Issue #43: the matrix kernel's row blocks split over two groups (--block-rows 32: half the head
# dims a group, a lane's queries and output halved, 32 rows a workgroup; 1.55-1.63x the time on
# the H200 at 9811b21), and workgroups of 128 rows (--block-rows 128: 8 groups, each K/V tile
# staged and fetched once for twice the rows, half the next tile's registers an invocation),
# which gpu_targets.py sets against the engine's 64 rows; the 128-row kernel's registers too.
for d in "${prefill_d[@]}"; do
  ((d > 128)) && continue  # split anyway
  for rows in 128 32; do
    step bench --variant flash2 "${prefill_shape[@]}" --d "$d" --dtype f16 --layout coopmat \
      --block-rows "$rows" --json "$out/rows_${d}_$rows.json"
  done
  step pipelines --variant flash2 "${prefill_dims[@]}" --d "$d" --dtype f16 --layout coopmat \
    --block-rows 128 --json "$out/pipelines_rows_${d}_128.json"
done
# Issue #43: two row matrices a group (--group-rows 32: each K and V matrix read from shared
# memory feeds two products, twice a lane's output registers; RADV navi31: no spill), at d = 64
# in 128-row workgroups (4 groups) and 64-row ones (2), at d = 128 in 64-row ones with the
# queries read from shared memory at each tile, which gpu_targets.py sets against the engine's
# 16 rows a group; their registers too.
for d in "${prefill_d[@]}"; do
  ((d > 128)) && continue
  rows_list=(128 64)
  ((d > 64)) && rows_list=(64)
  for rows in "${rows_list[@]}"; do
    step bench --variant flash2 "${prefill_shape[@]}" --d "$d" --dtype f16 --layout coopmat \
      --group-rows 32 --block-rows "$rows" --json "$out/groups_${d}_$rows.json"
  done
  step pipelines --variant flash2 "${prefill_dims[@]}" --d "$d" --dtype f16 --layout coopmat \
    --group-rows 32 --json "$out/pipelines_groups_${d}.json"
done
# Issue #43: where the matrix kernel's time goes: flash2 (the engine's tiles) with phases left
# out (FLASHVK_MATRIX_SKIP, flash_cm.comp's SKIP_*: staging K and V, the Q K^T products, the
# softmax, the P V products; the last run all four, the loop's skeleton), for gpu_targets.py to
# set against the whole kernel's time (none: the same run with nothing left out). Then two that
# keep the results and free registers (NVIDIA's compiler gave this kernel 255 and spilled at
# 9811b21): Q read from shared memory at each tile (queries), and the next tile not fetched
# during this one (prefetch; 1.16x at 9811b21), each with its pipelines' registers.
for d in "${prefill_d[@]}"; do
  ((d > 128)) && continue
  for phases in none staging scores softmax pv scores,pv staging,scores,softmax,pv queries \
    queries,prefetch; do
    skip="$phases"
    [[ $phases == none ]] && skip=""  # the whole kernel, with the same flags
    run_step "FLASHVK_MATRIX_SKIP=$skip flashvk bench ... --d $d (a timing diagnostic)" \
      env FLASHVK_MATRIX_SKIP="$skip" "$bin" bench --variant flash2 "${prefill_shape[@]}" \
      --d "$d" --dtype f16 --layout coopmat --json "$out/skip_${d}_${phases//,/+}.json"
    [[ $phases == queries* ]] || continue
    if tail -n 8 "$log" | grep -q "queries: the matrix kernel needs up to"; then
      failed=$((failed - 1))  # refused: Q's array does not fit (lavapipe's 32 KiB; the log says so)
      continue
    fi
    run_step "FLASHVK_MATRIX_SKIP=$skip flashvk pipelines ... --d $d (their registers)" \
      env FLASHVK_MATRIX_SKIP="$skip" "$bin" pipelines --variant flash2 "${prefill_dims[@]}" \
      --d "$d" --dtype f16 --layout coopmat --json "$out/pipelines_skip_${d}_${phases//,/+}.json"
  done
done
# Issue #43's targets, judged from the files so far: prefill, sdpa, modifiers_f16, the tiles and
# the phases (targets.txt).
if command -v python3 >/dev/null; then
  run_step "gpu_targets.py (issue #43's targets: measured, met or not)" \
    python3 "$root/scripts/gpu_targets.py" "$out" --out "$out/targets.txt"
fi
# Issue #43: K and V in block formats where the engine takes the matrix kernels (decoded to fp16
# as each tile is staged), against fp16 K and V in the same rounds ("vs base"), at d = 128.
kv_d=${prefill_d[1]:-${prefill_d[0]}}  # 128 (--tiny: 64)
step bench --variant flash2 "${prefill_shape[@]}" --d "$kv_d" --dtype f16 \
  --kv-dtype f16,q8_0,q4_0 --json "$out/prefill_kv_f16.json"
# Issue #44: decoding against ggml's 15 and 43 us at 4096 and 16384 keys (warm, back to back),
# 80% of the read bandwidth at 65536 keys; cold (caches flushed) and warm, each shape's rows into
# one JSON, for sdpa_bench.py to time PyTorch on the same shapes.
decode_files=()
for cache in cold warm; do
  rows=()
  for nk in "${decode_keys[@]}"; do
    flags=(--variant splitkv --nk "$nk" "${decode[@]}" --dtype f16 "${peak[@]}"
      --json "$out/decode_${cache}_$nk.json")
    [[ $cache == warm ]] && flags+=(--warm-cache)
    [[ $cache == cold && $nk == "${decode_keys[0]}" ]] && flags+=(--check)  # and its error
    step bench "${flags[@]}"
    rows+=("$out/decode_${cache}_$nk.json")
  done
  # The shapes' rows in one file (decode_cold.json, decode_warm.json).
  if command -v python3 >/dev/null; then
    python3 - "$out/decode_$cache.json" "${rows[@]}" <<'EOF' && rm -f "${rows[@]}"
import json, sys
docs = [json.load(open(p)) for p in sys.argv[2:]]
docs[0]["results"] = [r for d in docs for r in d["results"]]
json.dump(docs[0], open(sys.argv[1], "w"), indent=1)
EOF
    decode_files+=("$out/decode_$cache.json")
  fi
done
sdpa_step "$out/sdpa_decode.json" "${decode_files[@]}"
step bench --variant splitkv --nk "$longest" "${decode[@]}" --dtype f16 --kv-dtype f16,q8_0,q4_0 \
  --json "$out/decode_kv.json"
# Issue #34: a document mask written as a mask_mod, 8 documents of 512 at N=4096 (causal within
# each) on one head, against causal N=512 over 8 heads, the same visible pairs (target >= 70% of
# its throughput); ALiBi as a score_mod is in the modifiers suites (target <= 10% over ALiBi).
if ((!tiny)); then
  printf '%s\n' 'bool mask_mod(int b, int h, int q_idx, int kv_idx) {' \
    '  int q_pos = q_idx + FLEX_NK - FLEX_NQ;' \
    '  return kv_idx <= q_pos && kv_idx / 512 == q_pos / 512;' '}' >"$out/documents512.glsl"
  step bench --variant flash2,flashd --heads 1 --nq 4096 --mask-mod "$out/documents512.glsl" \
    --repeat 9
  step bench --variant flash2,flashd --heads 8 --nq 512 --causal --repeat 9
  # Issue #20: register blocks against the FMA peak (target >= 30% at N=4096), fp32 and fp16
  # arithmetic, d=64 and 128.
  for d in 64 128; do
    step bench --variant flash2 --nq 4096 --d "$d" --layout blocks --peak --repeat 5
    step bench --variant flash2 --nq 4096 --d "$d" --layout blocks --peak --repeat 5 \
      --fp16-arithmetic
  done
  step bench --suite modifiers --json "$out/modifiers_f32.json"
  step bench --suite standard --peak --json "$out/suite.json"
  # What the driver compiled (NVIDIA's driver has VK_KHR_pipeline_executable_properties).
  step pipelines --suite kernels --json "$out/pipelines.json"
  # nv2's kernels too: their registers, the softmax in accumulators beside O.
  ((has_nv2)) && step pipelines --suite kernels --matrix-api nv2 --json "$out/pipelines_nv2.json"
fi
echo "gpu_bench: $failed step(s) failed, $skipped skipped for time; tables in $log" | tee -a "$log"
exit $((failed > 0))
