#!/usr/bin/env bash
# install_without_cmocka.sh - the library alone on a machine without cmocka:
# configures this source tree as docs/install.md says (Release, no other
# option) with cmocka hidden from CMake's search (CMAKE_IGNORE_PATH on the
# folders where this build found cmocka.h and libcmocka; that hides what
# else lives there too, libibverbs among it on Debian), builds it, installs
# it into a temporary prefix, and checks that
#   - configuring succeeds without a CMake error or warning, and says in
#     exactly one line that the tests are skipped and that libcmocka-dev
#     brings them (every optional piece missing gets one line of its own);
#   - no test is built or registered;
#   - the install tree holds the libraries, headers, CLI and package files,
#     and a program built through its pkg-config file runs.
#
# usage: install_without_cmocka.sh SOURCE_DIR C_COMPILER CMAKE CMOCKA_INCLUDE_DIR
#                                  CMOCKA_LIBRARY LIBDIR NETTLE_INCLUDE_DIR NETTLE_LIBRARY
# (nettle, which the library requires, is given by the paths this build
# found: hiding cmocka's folders hides it too on Debian)
# Prints one line per check; exits 1 naming the first that fails.
set -euo pipefail
src=$(cd "$1" && pwd)
cc=$2
cmake=$3
cmocka_inc=$4
cmocka_lib=$5
libdir=$6
nettle_inc=$7
nettle_lib=$8
work=$(mktemp -d "${TMPDIR:-/tmp}/kvstage-libonly.XXXXXX")
trap 'rm -rf "$work"' EXIT
build=$work/build
prefix=$work/prefix

fail() {
  echo "install_without_cmocka: FAILED: $*" >&2
  exit 1
}
pass() {
  echo "install_without_cmocka: ok: $*"
}

# The folders to hide, as found and with links resolved.
hide=()
for d in "$cmocka_inc" "$(dirname "$cmocka_lib")"; do
  hide+=("$d" "$(readlink -f "$d")")
done
ignore=$(printf '%s;' "${hide[@]}")
ignore=${ignore%;}

if ! "$cmake" -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
       -DCMAKE_IGNORE_PATH="$ignore" -DNETTLE_INCLUDE_DIR="$nettle_inc" \
       -DNETTLE_LIBRARY="$nettle_lib" >"$work/configure.log" 2>&1; then
  cat "$work/configure.log"
  fail "configuring without cmocka (CMAKE_IGNORE_PATH=$ignore) failed: it must skip the tests"
fi
grep -qE '^CMOCKA_[A-Z_]+:[A-Z]+=.*-NOTFOUND$' "$build/CMakeCache.txt" ||
  fail "cmocka was still found ($(grep '^CMOCKA_' "$build/CMakeCache.txt" | tr '\n' ' ')):" \
       "hiding $ignore is not enough on this machine"
if grep -nE 'CMake (Error|Warning)' "$work/configure.log"; then
  fail "configuring without cmocka printed a CMake error or warning (above)"
fi
cmocka_lines=$(grep -ci cmocka "$work/configure.log" || true)
[ "$cmocka_lines" = 1 ] ||
  { grep -i cmocka "$work/configure.log" || true
    fail "configure mentions cmocka in $cmocka_lines lines, not exactly one"; }
line=$(grep -i cmocka "$work/configure.log")
case $line in
  "kvstage: SKIPPED the tests: "*libcmocka-dev*) ;;
  *) fail "the cmocka line '$line' does not say the tests are skipped and name libcmocka-dev" ;;
esac
pass "configure says, once: $line"
while IFS= read -r other; do
  pass "also skipped, in one line: $other"
done < <(grep '^kvstage: SKIPPED' "$work/configure.log" | grep -vi cmocka || true)

"$cmake" --build "$build" -j2 >"$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log"; fail "building without cmocka"; }
tests_built=$(find "$build" -maxdepth 1 -name 'test_*' -type f | head -n 3)
[ -z "$tests_built" ] || fail "tests were built without cmocka: $tests_built"
[ ! -e "$build/CTestTestfile.cmake" ] || fail "tests were registered without cmocka"
pass "the library and CLI build; no test is built or registered"

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install $build --prefix $prefix"; }
for f in "bin/kvstage" "$libdir/libkvstage.so" "$libdir/libkvstage.a" \
         "$libdir/libkvstage_sim.so" "include/kvstage/kvstage.h" \
         "include/kvstage/backend.h" "include/kvstage/sim.h" \
         "$libdir/pkgconfig/kvstage.pc" "$libdir/pkgconfig/kvstage-sim.pc" \
         "$libdir/cmake/kvstage/kvstageConfig.cmake"; do
  [ -e "$prefix/$f" ] || fail "the install tree lacks $f"
done
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
# shellcheck disable=SC2046 # pkg-config output is a list of flags
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/plan_pc" "$src/tests/consumer/plan_consumer.c" \
  $(pkg-config --cflags --libs kvstage) || fail "building plan_consumer with pkg-config kvstage"
out=$(LD_LIBRARY_PATH=$prefix/$libdir "$work/plan_pc") || fail "plan_consumer exited $?"
case $out in
  "max_region_bytes "[1-9]*) ;;
  *) fail "plan_consumer against the install tree printed '$out'" ;;
esac
pass "installed; plan_consumer built through pkg-config runs: $out"
echo "install_without_cmocka: all checks passed"
