#!/usr/bin/env bash
# Builds and runs examples/decode_loop the ways an application takes flashvk (README, "In your
# project"): against an installed prefix with find_package, from source with add_subdirectory
# (Release, clang: a consumer's build must not fail on flashvk's warnings), with FetchContent
# (a clone of this checkout's HEAD commit), and a compile and link through pkg-config. Fails if any build fails or the example's outputs are
# off. Usage: bash scripts/consumer.sh   (after scripts/setup.sh; builds into build-consumer/)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
out="$root/build-consumer"
rm -rf "$out"
mkdir -p "$out"
jobs="$(nproc)"

echo "consumer: install flashvk (library only) into $out/prefix"
# Configured for the default prefix and installed elsewhere: the CMake package and flashvk.pc
# must find their files from where they are.
cmake -S "$root" -B "$out/flashvk" -DCMAKE_BUILD_TYPE=Release -DFLASHVK_CLI=OFF \
  -DFLASHVK_VIEWER=OFF -DFLASHVK_TESTS=OFF >/dev/null
cmake --build "$out/flashvk" -j "$jobs" >/dev/null
cmake --install "$out/flashvk" --prefix "$out/prefix" >/dev/null

echo "consumer: find_package(flashvk CONFIG) from the installed prefix"
cmake -S "$root/examples/decode_loop" -B "$out/find_package" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null
cmake --build "$out/find_package" -j "$jobs" >/dev/null
"$out/find_package/decode_loop" | tail -n 1

if [[ -f "$out/prefix/lib/libflashvk_flex.a" || -f "$out/prefix/lib64/libflashvk_flex.a" ]] ||
   compgen -G "$out/prefix/lib/*/libflashvk_flex.a" >/dev/null; then
  echo "consumer: flashvk::flex (a document mask in GLSL) from the installed prefix"
  cmake -S "$root/examples/document_mask" -B "$out/flex" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null
  cmake --build "$out/flex" -j "$jobs" >/dev/null
  "$out/flex/document_mask" | tail -n 1
fi

echo "consumer: add_subdirectory(flashvk), Release, clang++"
CXX=clang++ cmake -S "$root/examples/decode_loop" -B "$out/add_subdirectory" \
  -DCMAKE_BUILD_TYPE=Release -DFLASHVK_SOURCE_DIR="$root" >/dev/null
cmake --build "$out/add_subdirectory" -j "$jobs" >/dev/null
"$out/add_subdirectory/decode_loop" | tail -n 1

echo "consumer: FetchContent from a clone of this checkout's HEAD"
# A clone has no build/glslang15 or build/vulkan-headers of its own: where the system's glslang or
# Vulkan headers are too old (Debian 12), it is given this checkout's, as an application names
# the ones it has (cmake/Glslang.cmake).
toolchain=()
[ -d "$root/build/glslang15" ] && toolchain+=("-DFLASHVK_GLSLANG_ROOT=$root/build/glslang15")
[ -d "$root/build/vulkan-headers" ] &&
  toolchain+=("-DFLASHVK_VULKAN_HEADERS=$root/build/vulkan-headers/include")
cmake -S "$root/examples/decode_loop" -B "$out/fetch_content" -DCMAKE_BUILD_TYPE=Release \
  -DFLASHVK_GIT_REPOSITORY="file://$root" -DFLASHVK_GIT_TAG="$(git -C "$root" rev-parse HEAD)" \
  "${toolchain[@]}" >/dev/null
cmake --build "$out/fetch_content" -j "$jobs" >/dev/null
"$out/fetch_content/decode_loop" | tail -n 1

echo "consumer: pkg-config --cflags --libs flashvk"
export PKG_CONFIG_PATH="$out/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
g++ -std=c++20 -O2 "$root/examples/decode_loop/main.cpp" -o "$out/pkg_config_decode_loop" \
  $(pkg-config --cflags --libs flashvk)
"$out/pkg_config_decode_loop" | tail -n 1
echo "consumer: every build ran"
