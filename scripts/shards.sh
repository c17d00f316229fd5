#!/usr/bin/env bash
# Runs GoogleTest binaries as shard processes (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX), JOBS at a
# time. One process runs many tests and they share its Vulkan instance, device and pipelines
# (tests/test_util.cpp), where CTest starts a process a test: on lavapipe the suite takes half
# the time so warm, and under the sanitizers 40% less (docs/reliability.md). The one home of how
# scripts/suite.sh (the README's test command, the sanitizers') and scripts/gpu_check.sh run
# the suite.
#
# Usage: scripts/shards.sh OUT [NAME=VALUE ...] BINARY[:SHARDS[:TESTS]] ...
#   NAME=VALUE   set for the test processes only (as env(1) does), not for this script's tools
#   SHARDS       processes for that binary (default 1)
#   TESTS        the tests it must run in all (e.g. CTest's count); unchecked where not given
# Environment: JOBS (processes at once, default the cores), SHARD_TIMEOUT (seconds a process may
# take, default 1800).
# Writes, as each process ends:
#   OUT/<binary>-<i>.txt    its GoogleTest output, test by test
#   OUT/summary.txt         a line a process, then the failed tests and the slowest
#   OUT/rerun-<binary>.txt  the tests that failed, and the one a process crashed or was cut off in
# and prints the summary lines, with each failed test's output, and a line a minute of how many
# tests are done. Exits 1 when a process failed or a binary ran other than its TESTS.
set -uo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/shards.sh OUT [NAME=VALUE ...] BINARY[:SHARDS[:TESTS]] ..." >&2
  exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
shift
jobs="${JOBS:-$(nproc)}"
timeout_s="${SHARD_TIMEOUT:-1800}"
assigns=()
while [[ $# -gt 0 && "$1" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
  assigns+=("$1")
  shift
done
queue=()  # "index total path"
binaries=()
declare -A expect_of=()  # a binary's TESTS, by its name
expected=0               # the TESTS of them all, or empty where one has none
for spec in "$@"; do
  path="$spec" total=1 tests=""
  if [[ "$spec" =~ ^(.*):([0-9]+):([0-9]+)$ ]]; then
    path="${BASH_REMATCH[1]}" total="${BASH_REMATCH[2]}" tests="${BASH_REMATCH[3]}"
  elif [[ "$spec" =~ ^(.*):([0-9]+)$ ]]; then
    path="${BASH_REMATCH[1]}" total="${BASH_REMATCH[2]}"
  fi
  if [[ ! -x "$path" ]] || ((total == 0)); then
    echo "shards: '$spec' is not an executable test binary and a shard count" >&2
    exit 2
  fi
  binaries+=("$(basename "$path")")
  expect_of[$(basename "$path")]="$tests"
  [[ -n "$tests" && -n "$expected" ]] && expected=$((expected + tests)) || expected=""
  for ((i = 0; i < total; ++i)); do queue+=("$i $total $path"); done
done
rm -f "$out"/*.txt "$out"/*.status
summary="$out/summary.txt"
: >"$summary"

timed='\([0-9]+ ms\)$'
verdict="^\[ +(OK|FAILED|SKIPPED) +\] .* $timed"
failed_shards=0
# The test a process was in when it ended, if it never finished it (crashed or cut off).
unfinished() {
  awk 'index($0, "[ RUN      ] ") == 1 {t = substr($0, 14); done = 0}
       t != "" && (index($0, "[       OK ] " t " (") == 1 || index($0, "[  FAILED  ] " t " (") == 1 ||
                   index($0, "[  FAILED  ] " t ", ") == 1 || index($0, "[  SKIPPED ] " t " (") == 1) {done = 1}
       END {if (t != "" && !done) print t}' "$1"
}
# Lines of FILE from test T's start: to its verdict (AWK's until), or to the end.
test_output() {
  awk -v t="$2" -v until="$3" '$0 == "[ RUN      ] " t {p = 1}
    p {print "    " $0; if (until != "" && index($0, "[  FAILED  ] " t) == 1) exit}' "$1" | head -200
}
# One process's line, its failed tests' output, and the tests to rerun.
report() {
  local name="$1" status="$2" seconds="$3" file="$out/$1.txt" binary="${1%-*}" last line
  local passed failed skipped
  passed=$(grep -cE "^\[       OK \] .* $timed" "$file")
  failed=$(grep -cE "^\[  FAILED  \] .* $timed" "$file")
  skipped=$(grep -cE "^\[  SKIPPED \] .* $timed" "$file")
  line="$name: $passed passed, $failed failed"
  ((skipped)) && line+=", $skipped skipped"
  line+=", $seconds s"
  last=$(unfinished "$file")
  if [[ -n "$last" ]]; then
    ((status == 124)) && line+=", cut off at $timeout_s s in $last" || line+=", ended in $last"
    ((status == 0)) && status=1
  fi
  ((status != 0)) && line+=", exit $status"
  echo "$line" | tee -a "$summary"
  local failed_tests
  failed_tests=$(grep -E "^\[  FAILED  \] .* $timed" "$file" | sed -E 's/^\[  FAILED  \] ([^ ,]+).*/\1/')
  for t in $failed_tests; do
    echo "$t" >>"$out/rerun-$binary.txt"
    test_output "$file" "$t" until
  done
  if [[ -n "$last" ]]; then
    echo "$last" >>"$out/rerun-$binary.txt"
    test_output "$file" "$last" ""
  elif ((status != 0 && failed == 0)); then
    tail -n 60 "$file" | sed 's/^/    /'  # failed outside any test: at start or at exit
  fi
  ((status != 0)) && failed_shards=$((failed_shards + 1))
}

start=$SECONDS
progress_at=$SECONDS
next=0
running=0
done_count=0
declare -A pid_of=() begin_of=()
while ((done_count < ${#queue[@]})); do
  while ((running < jobs && next < ${#queue[@]})); do
    read -r index total path <<<"${queue[$next]}"
    name="$(basename "$path")-$index"
    (
      begin=$SECONDS
      cd "$(dirname "$path")" &&
        GTEST_TOTAL_SHARDS=$total GTEST_SHARD_INDEX=$index GTEST_COLOR=no GTEST_BRIEF=0 \
          GTEST_PRINT_TIME=1 timeout -k 30 "$timeout_s" env "${assigns[@]}" "./$(basename "$path")" \
          >"$out/$name.txt" 2>&1
      echo "$? $((SECONDS - begin))" >"$out/$name.status.tmp"
      mv "$out/$name.status.tmp" "$out/$name.status"
    ) &
    pid_of[$name]=$!
    begin_of[$name]=$SECONDS
    next=$((next + 1))
    running=$((running + 1))
  done
  sleep 1
  for name in "${!pid_of[@]}"; do
    f="$out/$name.status"
    if [[ -e "$f" ]]; then
      read -r status seconds <"$f"
      [[ "$status" =~ ^[0-9]+$ ]] || status=255  # unreadable (a full disk): failed
    elif ! kill -0 "${pid_of[$name]}" 2>/dev/null && [[ ! -e "$f" ]]; then
      echo "$name: ended without an exit status" >>"$out/$name.txt"  # lost: failed
      status=255 seconds=$((SECONDS - begin_of[$name]))
    else
      continue
    fi
    rm -f "$f"
    unset "pid_of[$name]"
    report "$name" "$status" "${seconds:-0}"
    running=$((running - 1))
    done_count=$((done_count + 1))
  done
  if ((SECONDS - progress_at >= 60 && done_count < ${#queue[@]})); then  # a line a minute
    progress_at=$SECONDS
    echo "shards: $(cat "$out"/*-[0-9]*.txt | grep -cE "$verdict")${expected:+ of $expected}" \
      "tests done ($((SECONDS - start)) s, $running running)"
  fi
done
wait

bad_counts=0
final="$out/final.tmp"
{
  for binary in "${binaries[@]}"; do
    ran=$(cat "$out/$binary"-[0-9]*.txt | grep -cE "$verdict")
    if [[ -n "${expect_of[$binary]}" && "${expect_of[$binary]}" != "$ran" ]]; then
      echo "$binary ran $ran tests, not the ${expect_of[$binary]} expected"
      bad_counts=$((bad_counts + 1))
    fi
  done
  echo "shards: $(cat "$out"/*-[0-9]*.txt | grep -cE "$verdict") tests in ${#queue[@]}" \
    "processes, $((SECONDS - start)) s; $failed_shards process(es) failed"
  if ((failed_shards)); then
    echo "failed processes:"
    grep ', exit [0-9]*$' "$summary" | sed 's/^/  /'
    echo "failed tests (and those a process ended in):"
    cat "$out"/rerun-*.txt 2>/dev/null | sed 's/^/  /'
  fi
  echo "slowest:"
  cat "$out"/*-[0-9]*.txt | grep -hE "$verdict" |
    sed -E 's/, where GetParam\(\) = .* \(/ (/; s/^\[ +[A-Z]+ +\] (.*) \(([0-9]+) ms\)$/\2 \1/' |
    sort -rn | head -10 |
    awk '{printf "  %8.1f s  %s\n", $1 / 1000, $2}'
} >"$final"
tee -a "$summary" <"$final"
rm -f "$final"
((failed_shards == 0 && bad_counts == 0))
