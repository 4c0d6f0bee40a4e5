#!/usr/bin/env bash
# net_purity.sh - hw/net/ is what the network fabrics (hw/verbs, hw/ofi)
# share, below both: it calls nothing above it, so no file of hw/net
# includes a header of hw/verbs or hw/ofi (hw_verbs.h, hw_ofi.h, or any
# path into those folders), and its quoted includes name headers of hw/net
# itself. Exit 1 naming each offence.
# usage: net_purity.sh [ROOT]
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
above=$(cd hw && ls verbs/*.h ofi/*.h 2>/dev/null | sed 's,.*/,,')
bad=0
n=0
for f in hw/net/*.[ch]; do
  n=$((n + 1))
  while IFS=: read -r line text; do
    name=$(printf '%s\n' "$text" | sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]*)[">].*/\1/')
    base=${name##*/}
    case $name in
      *verbs/*|*ofi/*|../*)
        echo "$f:$line: $text: a header of a fabric above hw/net"
        bad=1
        continue ;;
    esac
    if printf '%s\n' "$above" | grep -qxF "$base"; then
      echo "$f:$line: $text: a header of a fabric above hw/net"
      bad=1
      continue
    fi
    case $text in
      *'"'*)
        if [ ! -f "hw/net/$name" ]; then
          echo "$f:$line: $text: not a header of hw/net (hw/net includes its own and <kvstage/...> ones)"
          bad=1
        fi ;;
    esac
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f")
done
if [ "$bad" = 0 ]; then
  echo "net_purity: $n files of hw/net include nothing of hw/verbs or hw/ofi"
fi
exit "$bad"
