#!/usr/bin/env bash
# The README's main command: set-up, build, then the viewer. With a display it opens the window;
# without one it renders a frame headless to out/viewer.png and prints a summary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/build.sh"
mkdir -p "$root/out"
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ -z "${CI:-}" ]; then
  exec "$root/build/flashvk-viewer" "$@"
fi
"$root/build/flashvk-viewer" --headless --screenshot "$root/out/viewer.png" "$@"
echo "open out/viewer.png to see the frame; flashvk-viewer --help lists presets and options"
