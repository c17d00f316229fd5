#!/usr/bin/env bash
# Every test of a build: its GoogleTest binaries as shard processes (scripts/shards.sh), each
# binary's test count checked against CTest's list, then CTest's other tests (those not labelled
# gtest: tests/CMakeLists.txt). Used by scripts/test.sh and scripts/sanitize.sh.
# Usage: scripts/suite.sh BUILD [NAME=VALUE ...] [-- CTEST_ARGUMENTS ...]
#   NAME=VALUE        set for the tests only (validation, the sanitizers' preloads and options)
#   CTEST_ARGUMENTS   instead, the tests CTest picks with them (e.g. -R MatrixTest), a process a
#                     test
# Each process's output: BUILD/Testing/shards/. JOBS (default the cores) processes at once.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$1" && pwd)"
shift
options=()
while (($#)) && [[ "$1" != "--" ]]; do
  if ! [[ "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
    echo "suite: '$1' is not NAME=VALUE (usage: scripts/suite.sh BUILD [NAME=VALUE ...]" \
      "[-- CTEST_ARGUMENTS ...])" >&2
    exit 2
  fi
  options+=("$1")
  shift
done
(($#)) && shift  # the --
jobs="${JOBS:-$(nproc)}"
cd "$build" || exit 1
if (($#)); then
  exec env "${options[@]}" ctest --output-on-failure -j "$jobs" "$@"
fi

# Each GoogleTest binary and its number of tests, as CTest lists them (every test labelled gtest
# runs one binary with --gtest_filter), but disabled ones, which a shard does not run.
listing="$(ctest -N -V -L '^gtest$')"
listed=$(sed -n 's/^Total Tests: //p' <<<"$listing")
commands="$(grep '^[0-9]*: Test command: .* "--gtest_filter=' <<<"$listing")"
if [[ -z "$commands" || "$(wc -l <<<"$commands")" != "$listed" ]]; then
  echo "suite: CTest lists $listed tests labelled gtest in $build, not each a GoogleTest" \
    "binary with --gtest_filter" >&2
  exit 1
fi
declare -A count=()
while read -r binary; do
  count[$binary]=$((${count[$binary]:-0} + 1))
done < <(grep -v -- '--gtest_filter=[^"]*DISABLED_' <<<"$commands" |
         sed 's/^[0-9]*: Test command: \(.*\) "--gtest_filter=.*/\1/')
total=0
for binary in "${!count[@]}"; do total=$((total + count[$binary])); done
# About eight processes a job, so that the last ones end close together (at four, cold on 2
# cores, the last ran alone for 150 s of 1037); the smallest binaries first (here the viewer's
# and the CLI's, whose tests start processes of their own and last longest).
per_shard=$(((total + 8 * jobs - 1) / (8 * jobs)))
specs=()
while read -r n binary; do
  specs+=("$binary:$(((n + per_shard - 1) / per_shard)):$n")
done < <(for binary in "${!count[@]}"; do echo "${count[$binary]} $binary"; done | sort -n)

# A process's time: ten minutes, and a minute a test (CTest gave a test 600 s or 1200 s).
status=0
JOBS="$jobs" SHARD_TIMEOUT="${SHARD_TIMEOUT:-$((600 + 60 * per_shard))}" \
  bash "$root/scripts/shards.sh" "$build/Testing/shards" "${options[@]}" "${specs[@]}" || status=1
if [[ -n "$(ctest -N -LE '^gtest$' | sed -n 's/^ *Test *#[0-9]*: //p')" ]]; then
  env "${options[@]}" ctest --output-on-failure -j "$jobs" -LE '^gtest$' || status=1
fi
exit $status
