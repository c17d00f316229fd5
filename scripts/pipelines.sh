#!/usr/bin/env bash
# The pipeline report through AMD's real shader compiler, on any machine: Mesa 25's RADV null
# device (unpacked by scripts/setup.sh into build/mesa25) compiles every kernel the engine picks
# (`flashvk pipelines --suite kernels`) for RDNA2 (vangogh, the Steam Deck), RDNA3 (navi31) and
# RDNA3.5 (gfx1150, a laptop APU). Writes build/pipelines/<family>.txt and .json, and fails if
# any pipeline spills a register or uses scratch memory. Extra arguments go to
# `flashvk pipelines` instead of --suite kernels (e.g. --variant flash2 --d 128 --dtype f16).
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
status=0
for family in vangogh navi31 gfx1150; do
  echo "== $family"
  # RADV alone (VK_ICD_FILENAMES), with Mesa 25's libdrm, and without Debian 12's Mesa device
  # selection layer, which belongs to the other Mesa.
  if ! env VK_ICD_FILENAMES="$mesa/radeon_icd.json" LD_LIBRARY_PATH="$lib" NODEVICE_SELECT=1 \
      RADV_FORCE_FAMILY="$family" "$root/build/flashvk" pipelines "${args[@]}" --check \
      --json "$out/$family.json" > "$out/$family.txt" 2> "$out/$family.err"; then
    status=1
  fi
  grep -v -e "^ac_compute_device_uuid" -e "is not a recognized processor" "$out/$family.err" >&2 || true
  head -2 "$out/$family.txt"
  tail -1 "$out/$family.txt"
done
[ $status -eq 0 ] && echo "no pipeline spills on any family (tables: $out/*.txt)" ||
  echo "pipelines spill (see the SPILLS rows of $out/*.txt)" >&2
exit $status
