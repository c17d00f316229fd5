#!/usr/bin/env bash
# Every test of a build: its GoogleTest binaries as shard processes (scripts/shards.sh), each
# binary's test count checked against CTest's list, then CTest's other tests (those not labelled
# gtest: tests/CMakeLists.txt). Used by scripts/test.sh and scripts/sanitize.sh.
# Usage: scripts/suite.sh BUILD [NAME=VALUE ...]
#   NAME=VALUE  set for the tests only (the sanitizers' preloads and options)
# Each process's output: BUILD/Testing/shards/. JOBS (default the cores) processes at once.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$1" && pwd)"
shift
for a in "$@"; do
  if ! [[ "$a" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
    echo "suite: '$a' is not NAME=VALUE (usage: scripts/suite.sh BUILD [NAME=VALUE ...])" >&2
    exit 2
  fi
done
jobs="${JOBS:-$(nproc)}"
cd "$build" || exit 1

# Each GoogleTest binary and its number of tests, as CTest lists them (but disabled ones, which
# a shard does not run).
declare -A count=()
while read -r binary; do
  count[$binary]=$((${count[$binary]:-0} + 1))
done < <(ctest -N -V -L '^gtest$' | grep -v -- '--gtest_filter=[^"]*DISABLED_' |
         sed -n 's/^[0-9]*: Test command: \(.*\) "--gtest_filter=.*/\1/p')
if ((${#count[@]} == 0)); then
  echo "suite: CTest lists no GoogleTest binary in $build" >&2
  exit 1
fi
total=0
for binary in "${!count[@]}"; do total=$((total + count[$binary])); done
# Every test CTest labels gtest is one of those: none left out of the run unseen.
listed=$(ctest -N -L '^gtest$' | sed -n 's/^Total Tests: //p')
disabled=$(ctest -N -L '^gtest$' | grep -c 'Test *#[0-9]*: .*DISABLED_')
if ((total != listed - disabled)); then
  echo "suite: CTest lists $listed GoogleTest tests ($disabled disabled), found $total binaries' runs" >&2
  exit 1
fi
# About eight processes a job, so that the last ones end close together (at four, cold on 2
# cores, the last ran alone for 150 s of 1037); the smallest binaries first (here the viewer's
# and the CLI's, whose tests start processes of their own and last longest).
per_shard=$(((total + 8 * jobs - 1) / (8 * jobs)))
specs=()
expect=()
while read -r n binary; do
  specs+=("$binary:$(((n + per_shard - 1) / per_shard))")
  name="$(basename "$binary")"
  expect+=("EXPECT_${name//[^A-Za-z0-9_]/_}=$n")
done < <(for binary in "${!count[@]}"; do echo "${count[$binary]} $binary"; done | sort -n)

# A process's time: ten minutes, and a minute a test (CTest gave a test 600 s or 1200 s).
status=0
env "${expect[@]}" JOBS="$jobs" SHARD_TIMEOUT="${SHARD_TIMEOUT:-$((600 + 60 * per_shard))}" bash "$root/scripts/shards.sh" "$build/Testing/shards" "$@" \
  "${specs[@]}" || status=1
if [[ -n "$(ctest -N -LE '^gtest$' | sed -n 's/^ *Test *#[0-9]*: //p')" ]]; then
  env "$@" ctest --output-on-failure -j "$jobs" -LE '^gtest$' || status=1
fi
exit $status
