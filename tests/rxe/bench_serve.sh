#!/usr/bin/env bash
# bench_serve.sh - the staged transfer of `kvstage serve` against perftest's
# ib_write_bw at the same message size, side by side in one VM run
# (docs/rxe.md records the results and the commands).
#
# Shape: Llama-like 8 KV heads x 128 dims, bf16, 4 layers, page 16; prefill
# TP 2 -> decode TP 1 with 128-token chunks, so each prefill rank's write
# into the decode's staging region is exactly 1 MiB (2 writers per region).
# Workload: 8 requests of 512 tokens, 64 MiB of KV to the decode.
# ib_write_bw moves 64 x 1 MiB over one QP. Alternates the two REPS times.
#
# Usage: tests/rxe/bench_serve.sh KVSTAGE_BINARY [RESULT_DIR]  (a release
# build: sanitizers slow the copies). Boots the VM through run-in-vm.sh, or
# runs directly where an RDMA device is.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --inside ]; then
  kvstage=$(cd "$(dirname "${1:?usage: bench_serve.sh KVSTAGE_BINARY [RESULT_DIR]}")" && pwd)/$(basename "$1")
  out=${2:-$here/../../build-rxe/bench-serve}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  echo "bench_serve: host load before the VM: $(cat /proc/loadavg)"
  exec "$here/run-in-vm.sh" "$out" bash "$here/bench_serve.sh" --inside "$kvstage" "$out"
fi
kvstage=$2
out=$3
dev=${KVS_RXE_DEVICE:-rxe0}
addr=${KVS_VERBS_ADDR:-192.0.2.1}
reps=${KVS_BENCH_REPS:-2}
size=1048576
shape=(--kv-heads 8 --head-dim 128 --layers 4 --page-size 16 --chunk-tokens 128
       --prefill-tp 2 --decode-tp 1 --requests 8 --prompt-tokens 512:512 --seed 1
       --ring-mib 16 --timeout-s 120 --json)
port=18700
for rep in $(seq 1 "$reps"); do
  port=$((port + 10))
  timeout 60 ib_write_bw -d "$dev" -R -s "$size" -n 64 -p "$port" >"$out/bw-server-$rep.log" 2>&1 &
  sleep 3
  timeout 60 ib_write_bw -d "$dev" -R -s "$size" -n 64 -p "$port" "$addr" >"$out/bw-client-$rep.log" 2>&1
  wait
  echo "ib_write_bw rep $rep: $(awk -v s="$size" '$1 == s && NF >= 5 {print $4 " MB/s (average)"; exit}' "$out/bw-client-$rep.log")"
  port=$((port + 10))
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" >"$out/serve-prefill-$rep.json" 2>&1 &
  "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" >"$out/serve-decode-$rep.json" 2>&1
  wait
  echo "serve rep $rep: prefill $(cat "$out/serve-prefill-$rep.json")"
  echo "serve rep $rep: decode  $(cat "$out/serve-decode-$rep.json")"
done
