#!/usr/bin/env bash
# run-all.sh - every test on a fresh machine: installs what is needed, builds
# with AddressSanitizer + UndefinedBehaviorSanitizer + gcov, runs ctest, prints
# src/ line and branch coverage (fails under 90% of lines), and checks that
# the tree also builds warning-free with clang.
# Set KVS_SKIP_DEPS=1 to skip the package install on a machine that has them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)

if [ "${KVS_SKIP_DEPS:-0}" != 1 ]; then
  tools/install-deps.sh
fi

echo "== build: gcc, ASan+UBSan, coverage"
rm -rf build-test
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Debug -DKVS_SANITIZE=ON -DKVS_COVERAGE=ON
cmake --build build-test -j"$jobs"

echo "== build: clang -Werror"
rm -rf build-clang
CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-clang -j"$jobs"

echo "== ctest (ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
(cd build-test && ctest -j"$jobs" --output-on-failure) 2>&1 | tee build-test/ctest.log || status=$?

echo "== coverage of src/ (gcovr)"
gcovr -r "$root" --filter "$root/src/" --object-directory build-test \
  --print-summary --fail-under-line 90 build-test || status=$?

summary=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' build-test/ctest.log | tail -n 1 || true)
total=$(echo "$summary" | sed -E 's/.*out of ([0-9]+).*/\1/')
failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) tests? failed.*/\1/')
if [ -z "$summary" ]; then
  echo "run-all: ctest printed no summary" >&2
  exit 1
fi
echo "$((total - failed)) passed, $failed failed"
exit "$status"
