#!/usr/bin/env bash
# calibrate.sh - measures the soft-RoCE link of the rxe VM with perftest
# (ib_write_bw over rdma_cm at several message sizes, ~32 MiB each;
# ib_write_lat) and fits the simulator's link model to it: time per write =
# per_op_ns + bytes / link_bytes_per_s (least squares on relative error over
# the sizes), one-way latency from ib_write_lat. docs/rxe.md records runs.
#
# Usage: tests/rxe/calibrate.sh [RESULT_DIR]   (default build-rxe/calibrate)
# Runs inside the VM through run-in-vm.sh (or directly on a machine with an
# RDMA device; KVS_RXE_DEVICE / KVS_VERBS_ADDR then pick device and IP).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" != --inside ]; then
  out=${1:-$here/../../build-rxe/calibrate}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  echo "calibrate: host load before the VM (its CPU is emulated: a busy host slows it): $(cat /proc/loadavg)"
  exec "$here/run-in-vm.sh" "$out" bash "$here/calibrate.sh" --inside "$out"
fi
out=$2
dev=${KVS_RXE_DEVICE:-rxe0}
addr=${KVS_VERBS_ADDR:-192.0.2.1}
sizes=${KVS_CAL_SIZES:-4096 16384 65536 262144 1048576}
port=18600
: >"$out/bw.txt"
# One perftest pair; a run that stalls (seen now and then under TCG) is cut
# at 40 s and tried again (up to 4 tries). perftest also gives up now and
# then under TCG ("Correlation coefficient r^2 < 0.9": its CPU clock
# estimate fails on the emulated TSC); a retry fixes that too.
pair() { # tool size iterations log-stem
  local try
  for try in 1 2 3 4; do
    port=$((port + 1))
    timeout 40 "$1" -d "$dev" -R -s "$2" -n "$3" -p "$port" >"$out/$4-server-$2.log" 2>&1 &
    sleep 3
    if timeout 40 "$1" -d "$dev" -R -s "$2" -n "$3" -p "$port" "$addr" \
         >"$out/$4-client-$2.log" 2>&1; then
      wait || true
      return 0
    fi
    wait || true
    echo "calibrate: $1 -s $2 failed or stalled (try $try)" >&2
  done
}
for s in $sizes; do
  n=$((32 * 1048576 / s))
  [ "$n" -le 5000 ] || n=5000
  [ "$n" -ge 32 ] || n=32
  pair ib_write_bw "$s" "$n" bw
  # "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
  awk -v s="$s" '$1 == s && NF >= 5 {print s, $4; exit}' "$out/bw-client-$s.log" >>"$out/bw.txt"
done
lat=""
for s in 8 4096; do
  pair ib_write_lat "$s" 2000 lat
  # "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (usec)
  lat="$lat $(awk -v s="$s" '$1 == s && NF >= 7 {print s ":" $5 ":" $6; exit}' "$out/lat-client-$s.log")"
done
echo "== ib_write_bw (MB/s = 1e6 bytes/s, 1 QP, tx depth 128)"
cat "$out/bw.txt"
echo "== ib_write_lat (usec: typical, average; one way = half a round trip)"
for l in $lat; do echo "$l" | tr ':' ' '; done
echo "== fit: time per write = per_op_ns + bytes / link_bytes_per_s"
# Least squares on relative error (weights 1/t^2, so that small messages
# count as much as large ones); a negative per-op cost (noise: under TCG
# the emulated CPU, not the request count, bounds rxe) is clamped to 0 and
# the line refitted through the origin.
awk '$2 > 0 {s = $1; t = s / ($2 * 1e6) * 1e9; w = 1 / (t * t); n++
             W += w; sx += w * s; sy += w * t; sxx += w * s * s; sxy += w * s * t}
     END {
       if (n < 2) { print "too few points"; exit 1 }
       b = (W * sxy - sx * sy) / (W * sxx - sx * sx); a = (sy - b * sx) / W
       if (a < 0 || b <= 0) { a = 0; b = sxy / sxx }
       printf "link_bytes_per_s %.0f (%.1f MB/s)\nper_op_ns %.0f\n", 1e9 / b, 1e3 / b, a
     }' "$out/bw.txt" | tee "$out/fit.txt"
awk 'NR == FNR {if ($1 == "link_bytes_per_s") L = $2; if ($1 == "per_op_ns") P = $2; next}
     $2 > 0 {s = $1; m = s / (P + s / L * 1e9) * 1e3; printf "%8d bytes: measured %8.2f MB/s, model %8.2f MB/s\n", s, $2, m}' \
  "$out/fit.txt" "$out/bw.txt"
rdma statistic show link "$dev/1" 2>/dev/null || true
