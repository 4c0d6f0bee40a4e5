#!/usr/bin/env bash
# install_as_documented.sh - docs/install.md's commands, run as a user runs
# them: the shell block under "## Install" (configure with default options,
# tests included, build, install) is read from the doc and run word for
# word in a copy of this source tree, then the doc's "From C: pkg-config"
# line builds a program against the install tree, which runs. Nothing is
# rewritten: the install goes under $DESTDIR (CMake's standard staging
# variable, set in the environment) so the doc's /opt prefix stays as
# written and the machine's /opt is left alone.
#
# A warning must never stop this build (KVS_WERROR is off by default); a
# warning it prints fails this test instead (CI's check for -O3 warnings),
# and tests/run-all.sh builds everything else with -DKVS_WERROR=ON.
#
# usage: install_as_documented.sh SOURCE_DIR
# Prints one line per check; exits 1 naming the first that fails.
set -euo pipefail
src=$(cd "$1" && pwd)
doc=$src/docs/install.md
work=$(mktemp -d "${TMPDIR:-/tmp}/kvstage-documented.XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "install_as_documented: FAILED: $*" >&2
  exit 1
}
pass() {
  echo "install_as_documented: ok: $*"
}

# The lines of the first ```sh block after the heading $1 ("## Install").
doc_block() {
  awk -v head="$1" '
    $0 == head { inside = 1; next }
    inside && /^```sh$/ { grab = 1; next }
    grab && /^```$/ { exit }
    grab { print }
  ' "$doc"
}

install_cmds=$(doc_block "## Install")
[ -n "$install_cmds" ] || fail "$doc has no \`\`\`sh block under '## Install'"
pkg_cmds=$(doc_block "## From C: pkg-config")
[ -n "$pkg_cmds" ] || fail "$doc has no \`\`\`sh block under '## From C: pkg-config'"
# The doc's prefix, from its install line (cmake --install build --prefix P).
prefix=$(sed -nE 's/.*cmake --install build --prefix ([^ ]+).*/\1/p' <<<"$install_cmds")
[ -n "$prefix" ] || fail "the install block names no 'cmake --install build --prefix P'"

# A fresh copy of the source: the files git knows (tracked, and untracked
# but not ignored), or the whole folder less build trees outside a checkout.
mkdir "$work/kvstage"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
     tar --null -T - -cf -) | tar -xf - -C "$work/kvstage"
else
  tar -C "$src" --exclude='./build*' -cf - . | tar -xf - -C "$work/kvstage"
fi
[ -f "$work/kvstage/CMakeLists.txt" ] || fail "copying $src left no CMakeLists.txt"

export DESTDIR=$work/dest
echo "install_as_documented: running, in a copy of the tree:"
sed 's/^/  /' <<<"$install_cmds"
if ! (cd "$work/kvstage" && bash -euo pipefail -c "$install_cmds") >"$work/install.log" 2>&1; then
  tail -n 40 "$work/install.log"
  fail "docs/install.md's install commands (log above, last 40 lines)"
fi
pass "configured with default options, built and installed"
# Warnings never stop this build, but the documented build prints none: it
# is gcc's Release (-O3), whose value ranges find warnings (format-truncation
# once) that no other build of tests/run-all.sh shows, so this check is
# where CI fails on them (the compiler's "file:line:col: warning:" lines).
if grep -E ':[0-9]+:[0-9]+: warning: ' "$work/install.log" >"$work/warnings.log"; then
  head -n 20 "$work/warnings.log"
  fail "the documented Release build printed $(wc -l <"$work/warnings.log") compiler warning(s), above: fix them (tests/run-all.sh fails on any)"
fi
pass "the documented Release build printed no compiler warning"

build=$work/kvstage/build
grep -q '^KVS_WERROR:BOOL=OFF$' "$build/CMakeCache.txt" ||
  fail "KVS_WERROR is not OFF by default: $(grep '^KVS_WERROR' "$build/CMakeCache.txt")"
[ -x "$build/test_layout" ] && [ -x "$build/test_status" ] ||
  fail "the default configure built no tests (test_layout, test_status missing in $build)"
"$build/test_status" >"$work/test_status.log" 2>&1 ||
  { cat "$work/test_status.log"; fail "test_status from the documented build"; }
pass "tests built by default (KVS_WERROR off); test_status passes"

root=$DESTDIR$prefix
for f in bin/kvstage include/kvstage/kvstage.h; do
  [ -e "$root/$f" ] || fail "the install lacks $prefix/$f (under DESTDIR)"
done
pcdir=$(dirname "$(find "$root" -name kvstage.pc -print -quit)")
[ -n "$pcdir" ] && [ -f "$pcdir/kvstage.pc" ] || fail "no kvstage.pc under $root"
# What tests/consumer/plan_consumer.c plans, as the installed CLI plans it.
want=$("$root/bin/kvstage" plan --model llama-3.1-70b --prefill-tp 8 --decode-tp 2 \
         --prefill-pp 3 --decode-pp 3 --json |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["max_region_bytes"])') ||
  fail "the installed kvstage plan --json"
pass "installed under $prefix: kvstage, headers, kvstage.pc"

# The doc's pkg-config lines, with app.c a real program and the doc's
# PKG_CONFIG_PATH pointed into DESTDIR (the .pc file is relocatable).
cp "$src/tests/consumer/plan_consumer.c" "$work/app.c"
pkg_cmds=${pkg_cmds//"$prefix"/"$root"}
if ! (cd "$work" && bash -euo pipefail -c "$pkg_cmds") >"$work/link.log" 2>&1; then
  cat "$work/link.log"
  fail "docs/install.md's pkg-config lines did not build app.c"
fi
[ -x "$work/a.out" ] || fail "the pkg-config lines made no a.out"
out=$(LD_LIBRARY_PATH=$(dirname "$pcdir") "$work/a.out") || fail "the linked program exited $?"
[ "$out" = "max_region_bytes $want" ] ||
  fail "the linked program printed '$out', the installed kvstage plan says $want"
pass "a program built with the doc's pkg-config line runs: $out"
echo "install_as_documented: all checks passed"
