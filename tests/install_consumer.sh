#!/usr/bin/env bash
# install_consumer.sh - an install tree serves programs outside the kvstage
# tree: `cmake --install` of the build into a fresh temporary prefix, then
#   - the tiny consumers of tests/consumer/ built through pkg-config
#     (kvstage, kvstage-sim) and through find_package(kvstage)
#     (kvstage::kvstage, kvstage::kvstage_static, kvstage::sim), run, and
#     their numbers compared with the installed CLI's `plan --json` and
#     `sim --json` for the same inputs; the static one must not need
#     libkvstage.so at run time;
#   - the installed Python package, with only PYTHONPATH set, finds the
#     installed library by itself, plans and simulates.
#
# usage: install_consumer.sh BUILD_DIR C_COMPILER CMAKE LIBDIR PYTHON_DIR [PRELOAD]
#   LIBDIR, PYTHON_DIR: CMAKE_INSTALL_LIBDIR and KVS_PYTHON_INSTALL_DIR;
#   PRELOAD: a sanitizer runtime Python needs first (instrumented builds).
# Prints one line per check; exits 1 naming the first that fails.
set -euo pipefail
build=$(cd "$1" && pwd)
cc=$2
cmake=$3
libdir=$4
pydir=$5
preload=${6:-}
src=$(cd "$(dirname "$0")/consumer" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvstage-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() {
  echo "install_consumer: FAILED: $*" >&2
  exit 1
}
pass() {
  echo "install_consumer: ok: $*"
}
# Value of a top-level key of one JSON object on stdin.
json_get() {
  python3 -c 'import json, sys; v = json.load(sys.stdin)[sys.argv[1]]; print(v)' "$1"
}

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install $build --prefix $prefix"; }
for f in "bin/kvstage" "$libdir/libkvstage.so" "$libdir/libkvstage.a" \
         "$libdir/libkvstage_sim.so" "include/kvstage/kvstage.h" \
         "include/kvstage/backend.h" "include/kvstage/sim.h" \
         "$libdir/pkgconfig/kvstage.pc" "$libdir/pkgconfig/kvstage-sim.pc" \
         "$libdir/cmake/kvstage/kvstageConfig.cmake" \
         "$libdir/cmake/kvstage/kvstageConfigVersion.cmake" \
         "$pydir/kvstage/__init__.py" "$pydir/kvstage/_libdir.py"; do
  [ -e "$prefix/$f" ] || fail "the install tree lacks $f"
done
pass "installed files"

# What the installed CLI says for the consumers' inputs.
plan_expect=$("$prefix/bin/kvstage" plan --model llama-3.1-70b --prefill-tp 8 \
                --decode-tp 2 --prefill-pp 3 --decode-pp 3 --json | json_get max_region_bytes)
sim_json=$("$prefix/bin/kvstage" sim --model llama-3.1-8b --layers 4 --prefill-tp 4 \
             --decode-tp 2 --page-size 16 --chunk-tokens 512 --requests 4 \
             --prompt-tokens 64:256 --ring-mib 64 --rate 0 --json)
sim_expect="requests_ok 4 of 4, bytes_verified $(echo "$sim_json" | json_get bytes_verified)"
sim_expect="$sim_expect, violations 0, digest $(echo "$sim_json" | json_get digest)"
[ "$plan_expect" -gt 0 ] || fail "kvstage plan --json gave max_region_bytes '$plan_expect'"

check_plan() { # name binary
  local out
  out=$("$2") || fail "$1 exited $?"
  [ "$out" = "max_region_bytes $plan_expect" ] ||
    fail "$1 printed '$out', kvstage plan --json says max_region_bytes $plan_expect"
  pass "$1: max_region_bytes $plan_expect"
}
check_sim() { # name binary
  local out
  out=$("$2") || fail "$1 exited $?"
  [ "$out" = "$sim_expect" ] || fail "$1 printed '$out', kvstage sim --json says '$sim_expect'"
  out=$("$2" bad) && fail "$1 bad exited 0: '$out'"
  case $out in
    "error KVS_EHEAD_SPLIT: "*"decode TP 3"*) ;;
    *) fail "$1 bad printed '$out', not the KVS_EHEAD_SPLIT detail naming decode TP 3" ;;
  esac
  pass "$1: $sim_expect; a bad TP size reports KVS_EHEAD_SPLIT"
}

# ---- pkg-config ----
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
pc_version=$(pkg-config --modversion kvstage) || fail "pkg-config --modversion kvstage"
[ "$(pkg-config --modversion kvstage-sim)" = "$pc_version" ] || fail "kvstage-sim.pc version"
# shellcheck disable=SC2046 # pkg-config output is a list of flags
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/plan_pc" "$src/plan_consumer.c" \
  $(pkg-config --cflags --libs kvstage) || fail "building plan_consumer with pkg-config kvstage"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Wextra -Werror -o "$work/sim_pc" "$src/sim_consumer.c" \
  $(pkg-config --cflags --libs kvstage-sim) ||
  fail "building sim_consumer with pkg-config kvstage-sim"
LD_LIBRARY_PATH=$prefix/$libdir check_plan "pkg-config kvstage" "$work/plan_pc"
LD_LIBRARY_PATH=$prefix/$libdir check_sim "pkg-config kvstage-sim" "$work/sim_pc"

# ---- find_package ----
"$cmake" -S "$src" -B "$work/cmake" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configuring tests/consumer with find_package(kvstage)"; }
"$cmake" --build "$work/cmake" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "building tests/consumer against kvstage's imported targets"; }
check_plan "find_package kvstage::kvstage" "$work/cmake/plan_shared"
check_plan "find_package kvstage::kvstage_static" "$work/cmake/plan_static"
check_sim "find_package kvstage::sim" "$work/cmake/sim_shared"
# Linked against the imported shared targets, not copies from the build tree.
# (Outputs are captured first: with pipefail, `ldd | grep -q` fails when
# grep stops reading early.)
for exe in plan_shared sim_shared; do
  deps=$(ldd "$work/cmake/$exe") || fail "ldd $exe"
  grep -q "$prefix/$libdir/libkvstage.so" <<<"$deps" ||
    fail "$exe does not load libkvstage.so from the install tree: $deps"
done
dynamic=$(readelf -d "$work/cmake/plan_static") || fail "readelf -d plan_static"
if grep -q 'NEEDED.*libkvstage' <<<"$dynamic"; then
  fail "plan_static (kvstage::kvstage_static) still needs a shared libkvstage"
fi
pass "find_package: shared targets load the install tree's libraries; the static one needs none"

# ---- the installed Python package finds its library by itself ----
py_out=$(env -u KVSTAGE_LIBRARY PYTHONPATH="$prefix/$pydir" \
           ${preload:+LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0} \
           python3 -c '
import kvstage
p = kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1,
                 prefill_pp=3, decode_pp=3)
r = kvstage.simulate(model="llama-3.1-8b", layers=4, prefill_tp=4, decode_tp=2,
                     page_size=16, chunk_tokens=512, requests=4,
                     prompt_min_tokens=64, prompt_max_tokens=256, ring_bytes=64 << 20)
print(kvstage.library_path())
print("max_region_bytes %d" % p["max_region_bytes"])
print("requests_ok %d of %d, bytes_verified %d, violations %d, digest %016x" % (
    r["requests_ok"], r["requests_total"], r["bytes_verified"], r["violations"],
    r["digest"]))
') || fail "the installed Python package (PYTHONPATH=$prefix/$pydir)"
mapfile -t py_lines <<<"$py_out"
[ "$(readlink -f "${py_lines[0]}")" = "$(readlink -f "$prefix/$libdir/libkvstage_sim.so")" ] ||
  fail "Python loaded ${py_lines[0]}, not $prefix/$libdir/libkvstage_sim.so"
[ "${py_lines[1]}" = "max_region_bytes $plan_expect" ] ||
  fail "Python plan printed '${py_lines[1]}', kvstage plan says $plan_expect"
[ "${py_lines[2]}" = "$sim_expect" ] ||
  fail "Python simulate printed '${py_lines[2]}', kvstage sim --json says '$sim_expect'"
pass "Python from the install tree: ${py_lines[0]}; plan and simulate agree with the CLI"
echo "install_consumer: all checks passed"
