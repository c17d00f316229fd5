#!/usr/bin/env bash
# Installs the Debian 12 packages that flashvk needs to build, test and run the viewer, and
# unpacks Mesa 25's RADV for the pipeline report (below). Does nothing when all are present.
# Needs root or sudo only when something is missing; a failure to fetch Mesa 25 (offline, no
# sudo, another distribution) is a warning, never a failed build.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libvulkan-dev vulkan-tools glslang-tools glslang-dev spirv-tools
  mesa-vulkan-drivers vulkan-validationlayers
  libglfw3-dev libimgui-dev libstb-dev libpng-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  xvfb xauth clang-format clang libclang-rt-14-dev
)

# AMD's shader compiler for `flashvk pipelines` (scripts/pipelines.sh): Mesa 25's RADV, whose
# null device (RADV_FORCE_FAMILY) compiles for an AMD GPU on any machine. Debian 12 ships Mesa
# 22.3; bookworm-backports has 25.0. Its packages are unpacked into build/mesa25 and used by the
# report alone: lavapipe, which runs the tests and the benchmark, stays Debian 12's own (the
# figures and CI time of docs/ were measured on it).
mesa_dir="$(cd "$(dirname "$0")/.." && pwd)/build/mesa25"
mesa_debs=(mesa-vulkan-drivers libdrm-amdgpu1 libdrm2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
backports=/etc/apt/sources.list.d/flashvk-backports.sources
need_mesa=0
[ -f "$mesa_dir/radeon_icd.json" ] || need_mesa=1
[ ${#missing[@]} -eq 0 ] && [ $need_mesa -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "flashvk setup: installing ${missing[*]}"
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ $need_mesa -eq 0 ] && exit 0
# Mesa 25 is for the pipeline report alone: if it cannot be fetched, say so and go on. The
# backports suite is added beside the machine's own Debian source (its URI, whatever mirror that
# is), at the default priority of backports, so that nothing else is upgraded from it.
mesa_version=25.0.7-2~bpo12+1  # the compiler docs/performance.md's tables were made with
unpack_mesa() {
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || return 1
  if [ ! -f "$backports" ]; then
    local uri
    uri=$(grep -hoE '^(URIs:|deb) +[a-z]+://[^ ]+' /etc/apt/sources.list.d/*.sources \
            /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2}' |
            grep -m1 -E '/debian/?$' || true)
    uri=${uri:-http://deb.debian.org/debian}
    echo "flashvk setup: adding bookworm-backports ($uri) for Mesa 25's RADV"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
      "$uri" /usr/share/keyrings/debian-archive-keyring.gpg | $sudo tee "$backports" > /dev/null ||
      return 1
  fi
  $sudo apt-get update -q || return 1
  echo "flashvk setup: unpacking Mesa $mesa_version (bookworm-backports) into $mesa_dir"
  local tmp lib
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -q "mesa-vulkan-drivers=$mesa_version" \
     libdrm-amdgpu1/bookworm-backports libdrm2/bookworm-backports 2>&1 |
     grep -v "^W: Download is performed unsandboxed") || true
  ls "$tmp"/mesa-vulkan-drivers_*.deb > /dev/null 2>&1 || { rm -rf "$tmp"; return 1; }
  rm -rf "$mesa_dir" && mkdir -p "$mesa_dir"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$mesa_dir/root"; done
  rm -rf "$tmp"
  lib=$(dirname "$(find "$mesa_dir/root" -name libvulkan_radeon.so | head -1)")
  sed "s#\"library_path\": \"[^\"]*\"#\"library_path\": \"$lib/libvulkan_radeon.so\"#" \
    "$mesa_dir/root/usr/share/vulkan/icd.d/radeon_icd.json" > "$mesa_dir/radeon_icd.json"
}
if ! unpack_mesa; then
  echo "flashvk setup: warning: Mesa $mesa_version could not be fetched from bookworm-backports;" \
    "scripts/pipelines.sh (AMD's compiler) will not run, everything else will" >&2
fi
exit 0
