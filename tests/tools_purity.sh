#!/usr/bin/env bash
# tools_purity.sh - the kvstage CLI (tools/) is a user of the library like
# any other: it includes its own headers and the public <kvstage/...> ones,
# never a header of sim/, src/ or hw/, so what it needs of the library is
# public API and one front door stays one. Fails (exit 1, naming each
# offence) on a quoted include of anything but a header in tools/, or any
# include that reaches into sim/, src/ or hw/. Given the CLI's include
# directories (colon-separated, as ctest passes them), also fails when one
# is not include/: the compiler then refuses such an include by itself.
# usage: tools_purity.sh [ROOT [INCLUDE_DIRS]]
set -u
root=${1:-$(dirname "$0")/..}
dirs=${2-}
cd "$root" || exit 2
bad=0
n=0
for f in tools/*.[ch]; do
  n=$((n + 1))
  while IFS=: read -r line text; do
    name=$(printf '%s\n' "$text" | sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]*)[">].*/\1/')
    quoted=0
    case $text in *'"'*) quoted=1 ;; esac
    case $name in
      sim/*|src/*|hw/*|*/sim/*|*/src/*|*/hw/*|../*)
        echo "$f:$line: $text: a header of the library's internals"
        bad=1
        continue ;;
    esac
    if [ "$quoted" = 1 ] && { case $name in */*) true ;; *) false ;; esac || [ ! -f "tools/$name" ]; }; then
      echo "$f:$line: $text: not a header of tools/ (use the public <kvstage/...> headers)"
      bad=1
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f")
done
if [ -n "$dirs" ]; then
  IFS=: read -r -a list <<< "$dirs"
  for d in "${list[@]}"; do
    [ -z "$d" ] && continue
    if [ "$(cd "$d" 2>/dev/null && pwd -P)" != "$(cd include && pwd -P)" ]; then
      echo "tools_purity: the CLI's include path holds $d: only include/ belongs there"
      bad=1
    fi
  done
fi
if [ "$bad" = 0 ]; then
  echo "tools_purity: $n tools/ files include their own headers and <kvstage/...> only"
else
  echo "tools_purity: tools/ must use the library's public headers (include/kvstage/) only"
fi
exit "$bad"
