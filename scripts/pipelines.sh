#!/usr/bin/env bash
# The pipeline report through AMD's real shader compiler, on any machine: Mesa 25's RADV null
# device (unpacked by scripts/setup.sh into build/mesa25) compiles every kernel the engine picks
# (`flashvk pipelines --suite kernels`) for RDNA2 (vangogh, the Steam Deck), RDNA3 (navi31) and
# RDNA3.5 (gfx1150, a laptop APU), each at wave64 and wave32. Writes build/pipelines/<family>.txt
# and <family>-wave32.txt with their .json, and fails if any pipeline spills a register, uses
# scratch memory or runs at another subgroup size than it requires, or a matrix kernel's key
# loop has no v_wmma (RDNA3; LLVM 15 cannot disassemble RDNA3.5, whose loops go unchecked).
# Extra arguments go to `flashvk pipelines` instead of --suite kernels (e.g. --variant flash2
# --d 128 --dtype f16).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$root/build/flashvk" ] || bash "$root/scripts/build.sh"
bash "$root/scripts/setup.sh"
cmake --build "$root/build" -j "$(nproc)" --target flashvk_cli
mesa="$root/build/mesa25"
[ -f "$mesa/radeon_icd.json" ] || { echo "Mesa 25's RADV is missing from $mesa: scripts/setup.sh fetches it from bookworm-backports" >&2; exit 1; }
lib=$(dirname "$(find "$mesa/root" -name libvulkan_radeon.so | head -1)")
out="$root/build/pipelines"
mkdir -p "$out"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--suite kernels)

# Each family at RADV's own subgroup size for compute (64 lanes) and at 32 (wave32, which every
# RDNA family also allows): the subgroup kernels are built for the size and require it. One
# compiler process a run (ACO compiles one pipeline at a time), as many at once as there are
# cores; a run's tables are <family>.txt (wave64) and <family>-wave32.txt, with .json and .err.
# On fewer than 6 cores (CI has 2) a wave32 run leaves out what its family's wave64 run
# compiled (--skip-listed: the pipelines that require no size, or the matrix kernels' own,
# about a third), so it starts after it; with more, all six run at once.
jobs_max=$(nproc)
skip=$((jobs_max < 6))
runs=()
declare -A wave64
for family in vangogh navi31 gfx1150; do runs+=("$family:"); done
for family in vangogh navi31 gfx1150; do runs+=("$family:32"); done
one() {
  local family=${1%%:*} size=${1#*:} name=${1%%:*}
  local extra=()
  if [ -n "$size" ]; then
    extra=(--subgroup-size "$size")
    name="$family-wave$size"
    if [ "$skip" = 1 ]; then  # its wave64 run's report, once that run has ended
      while [ ! -f "$out/$family.status" ] && kill -0 "${wave64[$family]}" 2>/dev/null; do
        sleep 1
      done
      [ -s "$out/$family.json" ] && extra+=(--skip-listed "$out/$family.json")
    fi
  fi
  # RADV alone (VK_ICD_FILENAMES), with Mesa 25's libdrm, and without Debian 12's Mesa device
  # selection layer, which belongs to the other Mesa.
  local rc=0
  env VK_ICD_FILENAMES="$mesa/radeon_icd.json" LD_LIBRARY_PATH="$lib" NODEVICE_SELECT=1 \
    RADV_FORCE_FAMILY="$family" "$root/build/flashvk" pipelines "${args[@]}" "${extra[@]}" \
    --check --json "$out/$name.json" > "$out/$name.txt" 2> "$out/$name.err" || rc=$?
  echo "$rc" > "$out/$name.status"
}
rm -f "$out"/*.status "$out"/*.json  # a run that dies before writing its own leaves none
for run in "${runs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  one "$run" &
  [ -z "${run#*:}" ] && wave64[${run%%:*}]=$!
done
wait
status=0
for run in "${runs[@]}"; do
  family=${run%%:*} size=${run#*:}
  name=$family; [ -n "$size" ] && name="$family-wave$size"
  echo "== $name"
  [ "$(cat "$out/$name.status" 2>/dev/null)" = 0 ] || status=1
  grep -v -e "^ac_compute_device_uuid" -e "is not a recognized processor" "$out/$name.err" >&2 || true
  head -2 "$out/$name.txt"
  grep -E "pipelines spill|subgroup size than|matrix kernels without" "$out/$name.txt" || true
done
[ $status -eq 0 ] && echo "no pipeline spills or runs at a subgroup size it did not require, on any family at either size; every matrix key loop read has matrix instructions (tables: $out/*.txt)" ||
  echo "a run failed: see SPILLS, COMPILED AT and NO MATRIX in $out/*.txt, and $out/*.err" >&2
exit $status
