#!/usr/bin/env bash
# Installs the Debian 12 packages that flashvk needs to build, test and run the viewer.
# Does nothing when they are all present. Needs root or sudo only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libvulkan-dev vulkan-tools glslang-tools spirv-tools
  mesa-vulkan-drivers vulkan-validationlayers
  libglfw3-dev libimgui-dev libstb-dev libpng-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  xvfb xauth clang-format clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "flashvk setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
