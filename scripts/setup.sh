#!/usr/bin/env bash
# Installs the Debian 12 packages that flashvk needs to build, test and run the viewer, builds
# glslang 15 and unpacks Vulkan headers 1.4 where the system's are older (below), and unpacks
# Mesa 25's RADV for the pipeline report (below). Does nothing when all are present. Needs root
# or sudo only when something is missing. A failure to fetch glslang or the headers is an error
# (the build needs them); a failure to fetch Mesa 25 (offline, no sudo, another distribution) is
# a warning, never a failed build.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

packages=(
  build-essential cmake pkg-config git python3
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
mesa_dir="$root/build/mesa25"
mesa_debs=(mesa-vulkan-drivers libdrm-amdgpu1 libdrm2)

# The kernels need glslang 15 or later (GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2)
# and Vulkan headers 1.4; Debian 12 has glslang 12.0 and headers 1.3.239. Where the system's are
# older, trixie's source packages are taken through the machine's own Debian source (a deb-src
# entry: trixie is never used for binary packages): glslang's, built (upstream's source without
# Debian's packaging patches, which want SPIRV-Tools) into build/glslang15, and vulkan-loader's,
# whose source carries the Vulkan headers, unpacked into build/vulkan-headers. cmake/Glslang.cmake
# takes them from there. Building glslang takes about 2 minutes on 2 cores, once.
glslang_dir="$root/build/glslang15"
headers_dir="$root/build/vulkan-headers"
glslang_version=15.1.0+1.4.309.0-1  # trixie's
loader_version=1.4.309.0-1           # trixie's vulkan-loader: Vulkan-Headers 1.4.309
trixie_src=/etc/apt/sources.list.d/flashvk-trixie-src.sources
need_glslang=0
need_headers=0
check_toolchain() {
  local major minor
  major=$(glslangValidator --version 2>/dev/null |
            sed -n 's/^Glslang Version: [0-9]*:\([0-9]*\)\..*/\1/p' || true)
  minor=$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, *1, *\([0-9]*\),.*/\1/p' \
            /usr/include/vulkan/vulkan_core.h 2>/dev/null || true)
  need_glslang=0
  need_headers=0
  if [ "${major:-0}" -lt 15 ] && [ ! -x "$glslang_dir/bin/glslangValidator" ]; then need_glslang=1; fi
  if [ "${minor:-0}" -lt 4 ] && [ ! -f "$headers_dir/include/vulkan/vulkan_core.h" ]; then
    need_headers=1
  fi
}
check_toolchain

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
backports=/etc/apt/sources.list.d/flashvk-backports.sources
need_mesa=0
[ -f "$mesa_dir/radeon_icd.json" ] || need_mesa=1
[ ${#missing[@]} -eq 0 ] && [ $need_mesa -eq 0 ] && [ $need_glslang -eq 0 ] &&
  [ $need_headers -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "flashvk setup: installing ${missing[*]}"
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  check_toolchain  # glslang-tools and libvulkan-dev were among them
fi
# Mesa 25 is for the pipeline report alone: if it cannot be fetched, say so and go on. The
# backports suite is added beside the machine's own Debian source (its URI, whatever mirror that
# is), at the default priority of backports, so that nothing else is upgraded from it.
mesa_version=25.0.7-2~bpo12+1  # the compiler docs/performance.md's tables were made with
# The machine's own Debian source (its URI, whatever mirror that is), for the suites added here.
debian_uri() {
  local uri
  uri=$(grep -hoE '^(URIs:|deb) +[a-z]+://[^ ]+' /etc/apt/sources.list.d/*.sources \
          /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2}' |
          grep -m1 -E '/debian/?$' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}
unpack_mesa() {
  [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || return 1
  if [ ! -f "$backports" ]; then
    local uri
    uri=$(debian_uri)
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
if [ $need_mesa -eq 1 ] && ! unpack_mesa; then
  echo "flashvk setup: warning: Mesa $mesa_version could not be fetched from bookworm-backports;" \
    "scripts/pipelines.sh (AMD's compiler) will not run, everything else will" >&2
fi
[ $need_glslang -eq 0 ] && [ $need_headers -eq 0 ] && exit 0

# glslang 15 and the Vulkan headers: the sources are fetched (apt-get source --download-only,
# no build-dep: glslang needs cmake, a C++ compiler and python3), glslang is built with its own
# flags (Release, static libraries, no SPIRV-Tools, no HLSL, no tests) and each is installed
# beside its final place, then moved there, so that an interrupted set-up leaves no half of one.
log="$root/build/toolchain-setup.log"
fail() {
  echo "flashvk setup: error: $1 (see $log); or install glslang >= 15 and Vulkan headers >= 1.4" \
    "(the Vulkan SDK's are fine)" >&2
  exit 1
}
mkdir -p "$root/build"
: > "$log"
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] ||
  fail "no /usr/share/keyrings/debian-archive-keyring.gpg to fetch trixie's glslang source with"
if [ ! -f "$trixie_src" ]; then
  uri=$(debian_uri)
  echo "flashvk setup: adding trixie's sources (deb-src only, $uri) for glslang 15 and Vulkan 1.4"
  printf 'Types: deb-src\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' \
    "$uri" /usr/share/keyrings/debian-archive-keyring.gpg | $sudo tee "$trixie_src" > /dev/null ||
    fail "could not write $trixie_src"
fi
$sudo apt-get update -qq >> "$log" 2>&1 || fail "apt-get update failed"
tmp=$(mktemp -d "$root/build/.toolchain-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sources=()
[ $need_glslang -eq 1 ] && sources+=("glslang=$glslang_version")
[ $need_headers -eq 1 ] && sources+=("vulkan-loader=$loader_version")
(cd "$tmp" && apt-get source -qq --download-only "${sources[@]}") >> "$log" 2>&1 ||
  fail "could not fetch ${sources[*]} from trixie's sources"
if [ $need_headers -eq 1 ]; then
  echo "flashvk setup: unpacking Vulkan headers $loader_version (trixie) into $headers_dir"
  tar -xJf "$tmp"/vulkan-loader_*.orig.tar.xz -C "$tmp" --wildcards '*/vulkan-headers/include/*' \
    >> "$log" 2>&1 || fail "could not unpack vulkan-loader $loader_version"
  rm -rf "$headers_dir" "$headers_dir.partial" && mkdir -p "$headers_dir.partial"
  mv "$(find "$tmp" -type d -path '*/vulkan-headers/include' | head -1)" "$headers_dir.partial/include"
  mv "$headers_dir.partial" "$headers_dir"
fi
if [ $need_glslang -eq 1 ]; then
  echo "flashvk setup: building glslang $glslang_version (trixie) into $glslang_dir"
  tar -xzf "$tmp"/glslang_*.orig.tar.gz -C "$tmp" >> "$log" 2>&1 ||
    fail "could not unpack glslang $glslang_version"
  src=$(find "$tmp" -maxdepth 1 -type d -name 'glslang-*' | head -1)
  rm -rf "$glslang_dir" "$glslang_dir.partial"
  { cmake -S "$src" -B "$tmp/glslang-build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$glslang_dir.partial" -DCMAKE_INSTALL_LIBDIR=lib \
      -DBUILD_SHARED_LIBS=OFF -DBUILD_EXTERNAL=OFF -DENABLE_OPT=OFF -DENABLE_HLSL=OFF \
      -DENABLE_SPVREMAPPER=OFF -DGLSLANG_TESTS=OFF -DENABLE_GLSLANG_BINARIES=ON &&
    cmake --build "$tmp/glslang-build" -j "$(nproc)" &&
    cmake --install "$tmp/glslang-build"; } >> "$log" 2>&1 ||
    fail "glslang $glslang_version did not build"
  mv "$glslang_dir.partial" "$glslang_dir"
fi
exit 0
