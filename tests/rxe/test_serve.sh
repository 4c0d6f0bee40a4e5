#!/usr/bin/env bash
# test_serve.sh - `kvstage serve` end to end over RDMA: a prefill process and
# a decode process (separate processes, each running all ranks of its side)
# move a seeded workload through the kvstage protocol and the decode checks
# every byte against the pattern the prefill wrote. Seven runs:
#   1. P=2 -> D=1 (two writers per decode region), all requests ok
#   2. P=1 -> D=2 (one prefill rank feeding two decode ranks), all ok
#   3. P=2 -> D=1 with the prefill's 3rd RDMA write spoiled (bad remote key):
#      exactly one request fails, on both sides the same room, the others
#      are ok and verified, and both processes finish normally.
#   4. P=2 x PP 2 -> D=1 x PP 1: four prefill ranks, each stage holding one
#      of the two layers; the decode rank holds both, so its regions wait
#      for 2 TP x 2 stage writers, each writing its own layer's slots
#   5. P=1 x PP 2 -> D=2 x PP 2: decode stage s takes stage s's layer from
#      its one prefill rank (which feeds two decode ranks), all ok
#   6. the two processes given different --prefill-pp: both stop at once
#      (the registration is refused, no time-out), exit 1 and name the flag
#   7. the same shape with different --seed (other prompt lengths): refused
#      the same way, naming --seed, instead of failing requests
# Usage: test_serve.sh KVSTAGE_BINARY   (needs an RDMA device: ctest runs it
# through run-in-vm.sh; KVS_VERBS_ADDR is the address to use, default the
# VM's 192.0.2.1). Exits 0 when every check passes.
set -uo pipefail
kvstage=${1:?usage: test_serve.sh KVSTAGE_BINARY}
addr=${KVS_VERBS_ADDR:-192.0.2.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
shape=(--kv-heads 4 --head-dim 32 --layers 2 --page-size 16 --chunk-tokens 64
       --requests 12 --prompt-tokens 32:192 --ring-mib 1 --timeout-s 60 --json)
seed=(--seed 7) # run() passes it to both; refused() takes each side's own

# run NAME PORT "PREFILL FLAGS" "DECODE FLAGS" EXPECT_FAILED
run() {
  local name=$1 port=$2 pflags=$3 dflags=$4 expect=$5 t0 prc drc
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" "${seed[@]}" $pflags \
    --expect-failed "$expect" >"$work/$name.prefill.json" 2>"$work/$name.prefill.err" &
  local ppid=$!
  # shellcheck disable=SC2086
  "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" "${seed[@]}" $dflags \
    --expect-failed "$expect" >"$work/$name.decode.json" 2>"$work/$name.decode.err"
  drc=$?
  wait "$ppid"
  prc=$?
  echo "test_serve: $name: prefill exit $prc, decode exit $drc, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
  for side in prefill decode; do
    echo "  $side: $(cat "$work/$name.$side.json")"
    [ -s "$work/$name.$side.err" ] && sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
  done
  if ! python3 - "$work/$name.prefill.json" "$work/$name.decode.json" "$expect" "$prc" "$drc" <<'PY'
import json, sys
p, d = (json.load(open(f)) for f in sys.argv[1:3])
expect, prc, drc = (int(x) for x in sys.argv[3:6])
bad = []
if prc != 0 or drc != 0: bad.append("exit codes %d/%d" % (prc, drc))
for side in (p, d):
    if side["requests_failed"] != expect or side["requests_unfinished"] != 0:
        bad.append("%s: %d failed, %d unfinished" % (side["role"], side["requests_failed"], side["requests_unfinished"]))
    if side["requests_ok"] + expect != side["requests"]:
        bad.append("%s: %d ok of %d" % (side["role"], side["requests_ok"], side["requests"]))
    if not side["pass"]: bad.append("%s did not pass" % side["role"])
if d["corrupt_bytes"] != 0 or d["bytes_verified"] != d["bytes_expected"] or d["bytes_verified"] == 0:
    bad.append("decode verified %d of %d bytes, %d corrupt" % (d["bytes_verified"], d["bytes_expected"], d["corrupt_bytes"]))
rooms = lambda s: sorted(int(r.split(":")[0]) for r in s["failed_rooms"])
if rooms(p) != rooms(d): bad.append("failed rooms differ: prefill %s, decode %s" % (p["failed_rooms"], d["failed_rooms"]))
if expect and p["spoiled_writes"] != 1: bad.append("the fault was not injected")
print("  " + ("; ".join(bad) if bad else "ok"))
sys.exit(1 if bad else 0)
PY
  then
    failures=$((failures + 1))
  fi
}

# refused NAME PORT "PREFILL FLAGS" "DECODE FLAGS" FLAG: the processes were
# given different shapes or workloads (each side's flags carry its --seed).
# Both must exit 1 with the refusal's status (KVS_EFINGERPRINT, not
# KVS_ETIMEDOUT: they stop at once) naming FLAG.
refused() {
  local name=$1 port=$2 pflags=$3 dflags=$4 flag=$5 t0 prc drc bad=""
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" $pflags \
    >"$work/$name.prefill.json" 2>"$work/$name.prefill.err" &
  local ppid=$!
  # shellcheck disable=SC2086
  "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" $dflags \
    >"$work/$name.decode.json" 2>"$work/$name.decode.err"
  drc=$?
  wait "$ppid"
  prc=$?
  echo "test_serve: $name: prefill exit $prc, decode exit $drc, $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
  for side in prefill decode; do
    sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
    grep -q -- "$flag" "$work/$name.$side.err" || bad="$bad; $side stderr does not name $flag"
    grep -q "(KVS_EFINGERPRINT)" "$work/$name.$side.err" ||
      bad="$bad; $side did not stop on the refusal (KVS_EFINGERPRINT)"
  done
  [ "$prc" = 1 ] && [ "$drc" = 1 ] || bad="$bad; exit codes $prc/$drc, want 1/1"
  if [ -n "$bad" ]; then
    echo "  ${bad#; }"
    failures=$((failures + 1))
  else
    echo "  ok"
  fi
}

run p2d1 18515 "--prefill-tp 2 --decode-tp 1" "--prefill-tp 2 --decode-tp 1" 0
run p1d2 18535 "--prefill-tp 1 --decode-tp 2" "--prefill-tp 1 --decode-tp 2" 0
run fault 18555 "--prefill-tp 2 --decode-tp 1 --fault write-error:3" \
  "--prefill-tp 2 --decode-tp 1" 1
pp21="--prefill-tp 2 --decode-tp 1 --prefill-pp 2 --decode-pp 1"
run pp2d1 18575 "$pp21" "$pp21" 0
pp22="--prefill-tp 1 --decode-tp 2 --prefill-pp 2 --decode-pp 2"
run pp2d2 18595 "$pp22" "$pp22" 0
refused ppdiffer 18615 "$pp21 --seed 7" "--prefill-tp 2 --decode-tp 1 --seed 7" --prefill-pp
# Same shape, another workload: refused by name, not as failed requests.
refused workdiffer 18635 "--prefill-tp 2 --decode-tp 1 --seed 1" \
  "--prefill-tp 2 --decode-tp 1 --seed 2" --seed
echo "test_serve: $failures of 7 runs failed"
[ "$failures" = 0 ]
