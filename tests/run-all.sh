#!/usr/bin/env bash
# run-all.sh - every test on a fresh machine: installs what is needed, builds
# with AddressSanitizer + UndefinedBehaviorSanitizer, runs ctest, runs ctest
# again in a gcov build without sanitizers and prints src/ line and branch
# coverage (fails under 90% of either), checks that the
# tree also builds warning-free with clang, runs the unit tests under
# valgrind memcheck, and runs each libFuzzer target
# (fuzz/fuzz_*.c, clang + ASan + UBSan, build-clang/) for KVS_FUZZ_SECONDS
# (default 15) from its seed corpus. The verbs tests (ctest label rxe) run
# in a soft-RoCE qemu VM (tests/rxe/run-in-vm.sh), in the background beside
# the coverage, valgrind and fuzz phases.
# Every build here is made with -DKVS_WERROR=ON (gcc and clang, tests
# included), and the test install_as_documented fails on any warning of
# the documented Release build: warnings fail CI, never a user's build,
# where KVS_WERROR is off.
# Set KVS_SKIP_DEPS=1 to skip the package install on a machine that has them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
# Each phase's heading shows the seconds since the start: CI's time is a
# budget (docs/testing.md), and this is where it goes.
phase() {
  echo "== $* [${SECONDS}s]"
}

if [ "${KVS_SKIP_DEPS:-0}" != 1 ]; then
  tools/install-deps.sh
fi

phase "build: gcc, ASan+UBSan"
rm -rf build-test
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON -DKVS_WERROR=ON
cmake --build build-test -j"$jobs"

# gcc's Release build (-O3, the main job's: its value ranges find warnings
# no other build shows) is the test install_as_documented's, run as
# docs/install.md writes it: it fails on any compiler warning.

fuzz_seconds=${KVS_FUZZ_SECONDS:-15}
if ! [[ $fuzz_seconds =~ ^[1-9][0-9]*$ ]]; then
  # libFuzzer reads -max_total_time=0 as "forever"
  echo "run-all: KVS_FUZZ_SECONDS must be a positive number of seconds" >&2
  exit 2
fi
# One clang build serves twice: every file (tests included) compiled with
# -Werror, and the libFuzzer targets (fuzz/fuzz_*.c, ASan+UBSan) run in
# the fuzz phase below.
phase "build: clang -Werror, ASan+UBSan, the libFuzzer targets"
rm -rf build-clang
CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_SANITIZE=ON \
  -DKVS_FUZZ=ON -DKVS_WERROR=ON -DKVS_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
cmake --build build-clang -j"$jobs"

phase "ctest (ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
(cd build-test && ctest -j"$jobs" -LE rxe --output-on-failure) 2>&1 | tee build-test/ctest.log || status=$?

# The verbs tests (ctest label rxe) on a real RDMA stack: tests/rxe/run-in-vm.sh
# boots Debian's kernel with rdma_rxe in qemu (or runs them directly where
# this machine has an RDMA device). KVS_RXE_REQUIRED=1: a VM that cannot
# start fails the run instead of skipping. They run one at a time in the
# background while the coverage, valgrind and fuzz phases run: a VM's
# tests keep about one core busy of two (measured: 111% CPU for
# test_serve), and CI's time is a budget. Their log is printed, and counted,
# after the fuzz phase.
phase "rxe (soft-RoCE in qemu): started in the background"
(cd build-test && KVS_RXE_REQUIRED=1 ctest -L rxe --output-on-failure) >build-test/rxe.log 2>&1 &
rxe_pid=$!
# Leaving early (set -e) leaves no run behind (qemu itself is under
# run-in-vm.sh's time limit).
trap 'kill "$rxe_pid" 2>/dev/null || true' EXIT

# Coverage comes from its own build: UBSan's checks (division, shift,
# overflow, bool loads, nonnull arguments) compile to branches gcov counts
# and that no passing test can take (about 300 of src/'s branches), and
# assert() conditions are invariants, not behaviour to cover.
phase "coverage of src/ (gcc Debug + gcov, no sanitizers; gcovr)"
rm -rf build-cov
cmake -S . -B build-cov -DCMAKE_BUILD_TYPE=Debug -DKVS_COVERAGE=ON -DKVS_WERROR=ON >/dev/null
cmake --build build-cov -j"$jobs"
# (label build: tests that build a tree of their own, nothing to count here;
# label nocov: tests measured to add no src/ line or branch, CMakeLists.txt)
if ! (cd build-cov && ctest -j"$jobs" -LE 'rxe|build|nocov' --output-on-failure) >build-cov/ctest.log 2>&1; then
  status=1
  echo "run-all: ctest failed in the coverage build: see build-cov/ctest.log"
fi
gcovr -r "$root" --filter "$root/src/" --object-directory build-cov \
  --exclude-branches-by-pattern '.*\bassert\(' \
  --print-summary --fail-under-line 90 --fail-under-branch 90 build-cov || status=$?

# The tests built by gcc with optimization (-O2 -g): the warnings that need
# the optimizer's value ranges (format-truncation: the one that stopped
# docs/install.md's build) show only there, and valgrind runs it faster than
# a Debug build. assert() stays on (CMakeLists.txt).
phase "valgrind memcheck (unit tests, gcc RelWithDebInfo -O2 -Werror)"
rm -rf build-valgrind
cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_WERROR=ON >/dev/null
cmake --build build-valgrind -j"$jobs"
# Valgrind serialises a process's threads onto one core, so the tests run
# $jobs at a time (xargs -P), each with its own log and result file.
vg_one() {
  local t=$1 name
  name=$(basename "$t")
  # Every run has a time limit: a hang fails the run instead of stalling
  # it (valgrind's serialised threads once exposed a lost wake-up in
  # hw/host this way).
  if timeout 900 valgrind --error-exitcode=9 --leak-check=full \
       --errors-for-leak-kinds=definite,indirect \
       -q "$t" >/dev/null 2>"build-valgrind/$name.memcheck.log"; then
    echo ok >"build-valgrind/$name.vg"
  else
    echo failed >"build-valgrind/$name.vg"
  fi
}
export -f vg_one
vg_tests=()
for t in build-valgrind/test_*; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  name=$(basename "$t")
  # test_sim_protocol and test_sim_faults move real KV bytes end to end: minutes under
  # valgrind; ASan+UBSan cover it above.
  [ "$name" = test_sim_protocol ] || [ "$name" = test_sim_faults ] && continue
  # test_verbs_fabric needs an RDMA device: it runs in the rxe phase's VM.
  [ "$name" = test_verbs_fabric ] && continue
  rm -f "build-valgrind/$name.vg"
  vg_tests+=("$t")
done
printf '%s\n' "${vg_tests[@]}" | xargs -P "$jobs" -I{} bash -c 'vg_one "$1"' _ {}
vg_passed=0 vg_failed=0
for t in "${vg_tests[@]}"; do
  name=$(basename "$t")
  if [ "$(cat "build-valgrind/$name.vg" 2>/dev/null)" = ok ]; then
    vg_passed=$((vg_passed + 1))
  else
    vg_failed=$((vg_failed + 1))
    status=1
    echo "valgrind: $name FAILED:"
    tail -n 30 "build-valgrind/$name.memcheck.log"
  fi
done

phase "fuzz (libFuzzer, clang, ASan+UBSan, ${fuzz_seconds}s each)"
(cd build-clang && ctest -L fuzz -j"$jobs" --output-on-failure) 2>&1 |
  tee build-clang/fuzz.log || status=1

phase "rxe (soft-RoCE in qemu): waiting for the background run"
rxe_failed=0
if ! wait "$rxe_pid"; then
  rxe_failed=1
  status=1
fi
cat build-test/rxe.log
rxe_passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' build-test/rxe.log || true)
[ "$rxe_passed" -gt 0 ] || { rxe_failed=1; status=1; echo "rxe: no test passed" >&2; }

# "N tests passed ... out of M" of a ctest log -> "passed failed".
ctest_counts() {
  local summary total failed
  summary=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$1" | tail -n 1 || true)
  [ -n "$summary" ] || return 1
  total=$(echo "$summary" | sed -E 's/.*out of ([0-9]+).*/\1/')
  failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) tests? failed.*/\1/')
  echo "$((total - failed)) $failed"
}
if ! counts=$(ctest_counts build-test/ctest.log); then
  echo "run-all: ctest printed no summary" >&2
  exit 1
fi
read -r passed failed <<<"$counts"
echo "ctest: $passed passed, $failed failed"
if fuzz_counts=$(ctest_counts build-clang/fuzz.log); then
  read -r fuzz_passed fuzz_failed <<<"$fuzz_counts"
  echo "fuzz: $fuzz_passed passed, $fuzz_failed failed"
else
  # no summary: count the fuzz phase as one failure, never as a pass
  fuzz_passed=0 fuzz_failed=1 status=1
  echo "fuzz: ctest printed no summary"
fi
echo "valgrind: $vg_passed passed, $vg_failed failed"
echo "rxe: $rxe_passed passed, $rxe_failed failed"
echo "run-all: ${SECONDS}s in all"
echo "$((passed + fuzz_passed + vg_passed + rxe_passed)) passed, $((failed + fuzz_failed + vg_failed + rxe_failed)) failed"
exit "$status"
