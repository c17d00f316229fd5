#!/usr/bin/env bash
# scripts/shards.sh, which runs the suite (the README's test command, the sanitizers' and a GPU
# machine's), on made-up GoogleTest binaries whose outcome is known: it must pass what passed and
# fail, naming the test, whatever failed, crashed, hung or leaked, so that CI is never green on a
# broken suite. Usage: tests/shards_test.sh (exits 1 on the first wrong outcome).
set -uo pipefail
shards="$(cd "$(dirname "$0")/.." && pwd)/scripts/shards.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# A binary of tests A<i> and B<i> for shard i, in GoogleTest's output; MODE says what goes wrong
# in shard 1: fail (B1 fails, parameterised), crash (in B1), hang (in B1), leak (exit 1 after all
# passed, as LeakSanitizer does), lost (shards.sh's own subshell killed: no exit status), none.
make_binary() {
  cat >"$tmp/$1" <<EOF
#!/usr/bin/env bash
i=\${GTEST_SHARD_INDEX:-0}
[[ "\${GTEST_TOTAL_SHARDS:-}" == 3 ]] || { echo "no shard count"; exit 3; }
[[ "\${ONLY_FOR_TESTS:-}" == yes ]] || { echo "no NAME=VALUE"; exit 3; }
echo "[ RUN      ] Made/Up.A\$i/0"
echo "[       OK ] Made/Up.A\$i/0 (2 ms)"
echo "[ RUN      ] Made/Up.B\$i/0"
if [[ \$i == 1 ]]; then
  case "$2" in
    fail) echo "expected 1, got 2"
          echo "[  FAILED  ] Made/Up.B1/0, where GetParam() = 4 (3 ms)"
          echo "[  FAILED  ] Made/Up.B1/0, where GetParam() = 4"; exit 1 ;;
    crash) echo "AddressSanitizer: heap-buffer-overflow"; kill -SEGV \$\$ ;;
    hang) sleep 30 ;;
    lost) kill -9 "\$(awk '{print \$4}' /proc/\$PPID/stat)"; sleep 2 ;;  # the subshell above timeout
  esac
fi
echo "[       OK ] Made/Up.B\$i/0 (1 ms)"
[[ \$i == 1 && "$2" == leak ]] && { echo "LeakSanitizer: detected memory leaks"; exit 1; }
exit 0
EOF
  chmod +x "$tmp/$1"
}

failures=0
# expect WANT_STATUS MODE PATTERN...: runs the binary of MODE in 3 shards; the exit status and
# each PATTERN in the output must be as given.
expect() {
  local want="$1" mode="$2" name="made_$2" out status
  shift 2
  make_binary "$name" "$mode"
  out="$(JOBS=3 SHARD_TIMEOUT=3 bash "$shards" "$tmp/out-$mode" ONLY_FOR_TESTS=yes \
           "$tmp/$name:3:6" 2>&1)"
  status=$?
  if [[ $status != "$want" ]]; then
    echo "FAILED: $mode: exit $status, not $want"$'\n'"$out"
    failures=$((failures + 1))
  fi
  for pattern in "$@"; do
    if ! grep -qF -- "$pattern" <<<"$out"; then
      echo "FAILED: $mode: no '$pattern' in"$'\n'"$out"
      failures=$((failures + 1))
    fi
  done
}

expect 0 none "shards: 6 tests in 3 processes" "made_none-1: 2 passed, 0 failed"
expect 1 fail "made_fail-1: 1 passed, 1 failed" "expected 1, got 2" "  Made/Up.B1/0"
expect 1 crash "ended in Made/Up.B1/0, exit 139" "heap-buffer-overflow" "  Made/Up.B1/0"
expect 1 hang "cut off at 3 s in Made/Up.B1/0, exit 124" "  Made/Up.B1/0"
expect 1 leak "made_leak-1: 2 passed, 0 failed" "exit 1" "detected memory leaks"
expect 1 lost "ended without an exit status" "exit 255"
# The rerun list names exactly the tests to run again.
if [[ "$(cat "$tmp/out-fail/rerun-made_fail.txt")" != "Made/Up.B1/0" ]]; then
  echo "FAILED: the rerun list is '$(cat "$tmp/out-fail/rerun-made_fail.txt")'"
  failures=$((failures + 1))
fi
# A count that does not match fails a run whose tests all passed.
make_binary made_count none
if bash "$shards" "$tmp/out-count" ONLY_FOR_TESTS=yes "$tmp/made_count:3:7" >/dev/null 2>&1; then
  echo "FAILED: 6 tests passed where 7 were expected"
  failures=$((failures + 1))
fi
((failures == 0)) && echo "shards.sh: every outcome as expected"
exit $((failures > 0))
