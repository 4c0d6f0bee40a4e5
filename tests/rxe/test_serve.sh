#!/usr/bin/env bash
# test_serve.sh - `kvstage serve` end to end over RDMA: prefill processes and
# a decode process (separate processes, each running all ranks of one
# instance) move a seeded workload through the kvstage protocol and the
# decode checks every byte against the pattern the prefill wrote. 23 runs:
#   1. P=2 -> D=1 (two writers per decode region), all requests ok
#   2. P=1 -> D=2 (one prefill rank feeding two decode ranks), all ok
#   3. P=2 -> D=1 with the prefill's 3rd RDMA write spoiled (bad remote key):
#      exactly one request fails, on both sides the same room, the others
#      are ok and verified, and both processes finish normally.
#   4. P=2 x PP 2 -> D=1 x PP 1: four prefill ranks, each stage holding one
#      of the two layers; the decode rank holds both, so its regions wait
#      for 2 TP x 2 stage writers, each writing its own layer's slots; each
#      prefill rank is given its device (--device, a list of four) and logs
#      it (KVS_LOG_LEVEL=info) as named by the caller
#   5. P=1 x PP 2 -> D=2 x PP 2: decode stage s takes stage s's layer from
#      its one prefill rank (which feeds two decode ranks), all ok
#   6. the two processes given different --prefill-pp: both stop at once
#      (the registration is refused, no time-out), exit 1 and name the flag
#   7. the same shape with different --seed (other prompt lengths): refused
#      the same way, naming --seed, instead of failing requests
#   8. two prefill instances as two processes, TP 2 x PP 2 and TP 1 x PP 1,
#      feeding one decode at TP 1 (one staging pair and one direct pair in
#      the same decode): the router pairs room i with instance i % 2, each
#      prefill serves its own rooms, the decode verifies every byte of all
#   9. a prefill told --instances 2 against a decode given one instance
#      (--peer): refused by name (--instances), as for a workload mismatch
#  10. two prefill instances at TP 2 and TP 4 (both staging, one shared ring)
#      into decode TP 1; instance 1 holds its rooms from room 5 on
#      (--fault hold-from:5) and is killed (kill -9) once it says so: on the
#      decode, every room of instance 0 is ok and verified, every failed room
#      is instance 1's with KVS_EPEER, its held rooms all failed (none hung),
#      and the decode exits 0 under --expect-lost 1
#  11. a cluster secret: the prefill reads it from a file (--secret-file),
#      the decode from the environment (--secret-env); all ok and verified
#  12. the prefill has the secret and the decode none: the decode stops at
#      once (KVS_EAUTH, naming the flags), before any key is sent; the
#      prefill logs the refusal with the peer's address and keeps serving
#  13. the decode has the secret and the prefill none: the decode refuses
#      the prefill's answer and stops the same way
#  14. --no-verify (the benchmarks' transfer alone): all ok, every byte
#      received and nothing checked, said so in the report
#  15. P=2 -> D=1 with the prefill's 3rd RDMA write made hostile (--fault
#      hostile-write:3: the key it was given, 256 KiB past its place, outside
#      its region): exactly that request fails, every other is ok and
#      verified, 0 corrupt bytes, 0 ring bytes leaked, and the decode granted
#      region-scoped keys. Only on a fabric that scopes keys (verbs: type-2
#      memory windows; ofi with the tcp provider, hw/ofi/grant.c);
#      elsewhere the write would land in another request's region, so the
#      run is skipped, saying why.
#  16. P=2 -> D=1 with the prefill's 3rd RDMA write kept and posted again,
#      unchanged, once the rank's rooms are over and their regions freed
#      (--fault stale-write:3: the stale writer of the field): the decode's
#      NIC refuses it with a remote access error (KVS_EREMOTE, its key was
#      revoked), every request is ok and verified, 0 corrupt bytes, 0 ring
#      bytes leaked. Skipped where run 15 is, for the same reason.
#  17. a cluster secret on both sides, and the decode replays its rank 0's
#      registration at the end (--fault replay-registration: what it sent
#      on its first connection until registered, HELLO and REGISTER, byte
#      for byte on a new connection): the prefill refuses it (auth_refused
#      1, logged with the peer's address: the proof answers the old
#      connection's challenge), every request is ok and verified.
#  18. P=2 -> D=1 with --metrics on both processes (port 0: the kernel's
#      pick, read from stderr) and --metrics-hold-ms: curl scrapes each
#      endpoint until the decode's ended rooms reach --requests; the
#      Prometheus project's parser (python3-prometheus-client) reads both
#      texts (each sample once), and their numbers agree with the JSON
#      reports: rooms ended KVS_OK per side, the transfer histograms' counts
#      and byte sums equal to each side's payload bytes, the prefill ranks'
#      writes; a path other than /metrics gets 404.
#  19. run 10 found through etcd (--discovery; etcd started here on the
#      test's ports): no address on the decode's command line (--instances 2),
#      instance 1 started after the decode (found when it publishes), holding
#      its rooms from room 5 on, then frozen (SIGSTOP: its sockets stay up,
#      its lease stops being renewed) instead of killed: its lease lapses,
#      the decode fails its rooms (KVS_EPEER) as run 10 requires, says the
#      lease lapsed, and ends long before the 60 s stall timeout would.
#  20. run 8 with prefill context parallelism (--prefill-cp 2 on every
#      process, docs/kinds/context-parallel.md): instance 0 runs TP 2 x PP 2
#      x CP 2 ranks, instance 1 TP 1 x CP 2, each CP rank filling its pool
#      for its own token range only; every room ok, every byte verified,
#      and every report names CP 2 for each instance.
#  21. a CP 2 prefill against a decode given no --prefill-cp: both stop at
#      once (the registration is refused), exit 1 and name --prefill-cp.
#  22. run 18 with --prefill-cp 2 (four prefill ranks, two of each TP rank):
#      the same checks, each sample once, and every prefill sample labelled
#      with its CP rank (cp_rank 0 and 1; the decode's with none).
#  23. run 19 with --prefill-cp 2 on every process: each CP rank's record
#      carries its cp_rank and cp_size, the decode orders the addresses by
#      CP rank and declares each instance with CP 2; the same outcome.
# Every run that moves KV also checks that the decode's ring holds 0 live
# bytes at the end (every room ended, so anything live leaked).
# Usage: test_serve.sh KVSTAGE_BINARY   (needs an RDMA device: ctest runs it
# through run-in-vm.sh; KVS_VERBS_ADDR is the address to use, default the
# VM's 192.0.2.1). Exits 0 when every check passes.
# The same runs over another fabric: KVS_SERVE_FABRIC holds the flags every
# process gets (e.g. "--fabric ofi --provider tcp", with KVS_VERBS_ADDR
# 127.0.0.1: no RDMA device needed; run 4 then names no device), and
# KVS_SERVE_PORT_OFFSET moves every port (runs side by side).
# On verbs (no KVS_SERVE_FABRIC) the decode must scope its writers' keys
# (memory windows: keys_granted > 0 in runs p2d1 to pp2d2); set
# KVS_SERVE_EXPECT_GRANTS=0 on a device without type-2 memory windows.
set -uo pipefail
kvstage=${1:?usage: test_serve.sh KVSTAGE_BINARY}
addr=${KVS_VERBS_ADDR:-192.0.2.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
shape=(--kv-heads 4 --head-dim 32 --layers 2 --page-size 16 --chunk-tokens 64
       --requests 12 --prompt-tokens 32:192 --ring-mib 1 --timeout-s 60 --json)
fabric=${KVS_SERVE_FABRIC:-}
# shellcheck disable=SC2206
[ -n "$fabric" ] && shape+=($fabric)
# Fabrics that scope keys (verbs: memory windows; ofi: the tcp provider)
# must grant them in every run that moves KV; elsewhere none is expected.
scopes=0
case " $fabric " in
  "  " | *" --fabric ofi "*"--provider tcp "*) scopes=1 ;;
esac
expect_grants=${KVS_SERVE_EXPECT_GRANTS:-$scopes}
off=${KVS_SERVE_PORT_OFFSET:-0}
seed=(--seed 7) # run() passes it to both; refused() takes each side's own
wait_s=${KVS_TEST_WAIT_S:-60} # bound of a wait inside the test (a hang fails it)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
# KVS_SERVE_ONLY="kill noverify": run just the runs so named (a loop that
# chases one failure); every run counts as passed when skipped.
skipped() { [ -n "${KVS_SERVE_ONLY:-}" ] && [[ " $KVS_SERVE_ONLY " != *" $1 "* ]]; }

# run NAME PORT "PREFILL FLAGS" "DECODE FLAGS" EXPECT_FAILED
run() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) pflags=$3 dflags=$4 expect=$5 t0 prc drc
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
  if ! python3 - "$work/$name.prefill.json" "$work/$name.decode.json" "$expect" "$prc" "$drc" \
      "$expect_grants" "${KVS_SERVE_RUN_NEEDS:-}" <<'PY'
import json, sys
p, d = (json.load(open(f)) for f in sys.argv[1:3])
expect, prc, drc, grants = (int(x) for x in sys.argv[3:7])
bad = []
if grants and d["keys_granted"] == 0: bad.append("decode granted no region-scoped key (the fabric fell back to the whole ring's key)")
if prc != 0 or drc != 0: bad.append("exit codes %d/%d" % (prc, drc))
for side in (p, d):
    if side["requests_failed"] != expect or side["requests_unfinished"] != 0:
        bad.append("%s: %d failed, %d unfinished" % (side["role"], side["requests_failed"], side["requests_unfinished"]))
    if side["requests_ok"] + expect != side["requests"]:
        bad.append("%s: %d ok of %d" % (side["role"], side["requests_ok"], side["requests"]))
    if not side["pass"]: bad.append("%s did not pass" % side["role"])
if d["ring_live_bytes"] != 0: bad.append("decode: %d ring bytes still live at the end (leaked)" % d["ring_live_bytes"])
if d["corrupt_bytes"] != 0 or d["bytes_verified"] != d["bytes_expected"] or d["bytes_verified"] == 0:
    bad.append("decode verified %d of %d bytes, %d corrupt" % (d["bytes_verified"], d["bytes_expected"], d["corrupt_bytes"]))
rooms = lambda s: sorted(int(r.split(":")[0]) for r in s["failed_rooms"])
if rooms(p) != rooms(d): bad.append("failed rooms differ: prefill %s, decode %s" % (p["failed_rooms"], d["failed_rooms"]))
if expect and p["spoiled_writes"] != 1: bad.append("the fault was not injected")
if sys.argv[7] in ("scoped", "stale") and d["keys_granted"] == 0:
    bad.append("decode granted no region-scoped keys: the run proves nothing")
if sys.argv[7] == "replay":
    if d["replayed"] < 2 or d["replay_answers"] == 0:
        bad.append("decode replayed %d messages, %d answered: no replay was made" % (d["replayed"], d["replay_answers"]))
    if p["auth_refused"] != 1: bad.append("prefill refused %d registrations, not the 1 replayed" % p["auth_refused"])
    err = open(sys.argv[1].replace(".json", ".err")).read()
    if "refused the registration of the peer at" not in err:
        bad.append("prefill did not log the refusal with the peer's address")
elif p["auth_refused"] != 0 or d["auth_refused"] != 0:
    bad.append("%d/%d registrations refused in a run with no stranger" % (p["auth_refused"], d["auth_refused"]))
if sys.argv[7] == "stale" and (p["spoiled_writes"] != 1 or p["stale_write"] != "KVS_EREMOTE"):
    bad.append("the write posted after its region was freed ended with %s (%d posted), not "
               "the remote access error KVS_EREMOTE" % (p["stale_write"], p["spoiled_writes"]))
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
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) pflags=$3 dflags=$4 flag=$5 t0 prc drc bad=""
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
# Run 4 names each prefill rank's device (--device, one per rank) and the
# decode's (one for all), and every prefill rank must log it as named: the
# device the tests are told to use, else the only one there is (on a host
# of several, it runs on automatic choices instead).
dev=${KVS_VERBS_DEVICE:-}
[ -n "$fabric" ] && dev="" # --device names devices of the verbs fabric only
[ -n "$fabric" ] || [ -n "$dev" ] || [ "$(ls /sys/class/infiniband 2>/dev/null | wc -l)" != 1 ] ||
  dev=$(ls /sys/class/infiniband)
if [ -n "$dev" ] && ! skipped pp2d1; then
  KVS_LOG_LEVEL=info run pp2d1 18575 "$pp21 --device $dev,$dev,$dev,$dev" "$pp21 --device $dev" 0
  named=0
  for rank in "0 stage 0" "1 stage 0" "0 stage 1" "1 stage 1"; do
    grep -q "prefill rank $rank: verbs fabric: RDMA device $dev .*: named by the caller$" \
      "$work/pp2d1.prefill.err" && named=$((named + 1))
  done
  if [ "$named" != 4 ]; then
    echo "  pp2d1: $named of the 4 prefill ranks logged device $dev as named by the caller"
    failures=$((failures + 1))
  fi
else
  run pp2d1 18575 "$pp21" "$pp21" 0
fi
pp22="--prefill-tp 1 --decode-tp 2 --prefill-pp 2 --decode-pp 2"
run pp2d2 18595 "$pp22" "$pp22" 0
refused ppdiffer 18615 "$pp21 --seed 7" "--prefill-tp 2 --decode-tp 1 --seed 7" --prefill-pp
# Same shape, another workload: refused by name, not as failed requests.
refused workdiffer 18635 "--prefill-tp 2 --decode-tp 1 --seed 1" \
  "--prefill-tp 2 --decode-tp 1 --seed 2" --seed

# cluster NAME PORT "COMMON FLAGS" TP,PP [TP,PP...]: one prefill process per
# TP,PP (instance k listens on PORT + 10k), then the decode naming each
# with --prefill-instance. Every process must pass with every room ok.
cluster() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) common=$3 t0 k=0 drc spec inst=() pids=() rcs=()
  shift 3
  local n=$#
  t0=$(date +%s.%N)
  for spec in "$@"; do
    # shellcheck disable=SC2086
    "$kvstage" serve --role prefill --listen "$addr:$((port + 10 * k))" --instance "$k" \
      --instances "$n" --prefill-tp "${spec%,*}" --prefill-pp "${spec#*,}" "${shape[@]}" \
      "${seed[@]}" $common >"$work/$name.prefill$k.json" 2>"$work/$name.prefill$k.err" &
    pids+=($!)
    inst+=(--prefill-instance "$k=$addr:$((port + 10 * k)),$spec")
    k=$((k + 1))
  done
  # shellcheck disable=SC2086
  "$kvstage" serve --role decode "${inst[@]}" "${shape[@]}" "${seed[@]}" $common \
    >"$work/$name.decode.json" 2>"$work/$name.decode.err"
  drc=$?
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    rcs+=($?)
  done
  echo "test_serve: $name: prefill exits ${rcs[*]}, decode exit $drc, $(elapsed "$t0") s"
  for side in $(seq -f 'prefill%g' 0 $((n - 1))) decode; do
    echo "  $side: $(cat "$work/$name.$side.json")"
    [ -s "$work/$name.$side.err" ] && sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
  done
  if ! python3 - "$work/$name" "$n" "$drc" "${rcs[@]}" "$@" <<'PY'
import json, sys
base, n, drc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rcs = [int(x) for x in sys.argv[4:4 + n]]
specs = [tuple(int(v) for v in s.split(",")) for s in sys.argv[4 + n:]]
d = json.load(open(base + ".decode.json"))
ps = [json.load(open("%s.prefill%d.json" % (base, k))) for k in range(n)]
bad = []
if drc != 0 or any(rcs): bad.append("exit codes %s/%d" % (rcs, drc))
for name, side in [("prefill%d" % k, p) for k, p in enumerate(ps)] + [("decode", d)]:
    if not side["pass"] or side["requests_failed"] or side["requests_unfinished"] or \
            side["requests_ok"] != side["requests"]:
        bad.append("%s: %d ok of %d, %d failed, %d unfinished" % (name, side["requests_ok"],
                   side["requests"], side["requests_failed"], side["requests_unfinished"]))
if d["requests"] != sum(p["requests"] for p in ps):
    bad.append("decode served %d rooms, the prefills %s" % (d["requests"], [p["requests"] for p in ps]))
for k, (p, (tp, pp)) in enumerate(zip(ps, specs)):
    di = d["instances"][k]
    if (di["id"], di["tp"], di["pp"], di["requests_ok"]) != (k, tp, pp, p["requests_ok"]) or \
            p["instances"][0]["id"] != k or p["requests"] != (d["requests"] + n - 1 - k) // n:
        bad.append("instance %d: decode sees %s, its prefill %s" % (k, di, p["instances"]))
    if p["prefill_cp"] != d["prefill_cp"] or p["instances"][0]["cp"] != di["cp"] or \
            di["cp"] != d["prefill_cp"]:
        bad.append("instance %d: the decode's CP size %d (%d), its prefill's %d (%d)"
                   % (k, d["prefill_cp"], di["cp"], p["prefill_cp"], p["instances"][0]["cp"]))
if d["ring_live_bytes"] != 0: bad.append("decode: %d ring bytes still live at the end (leaked)" % d["ring_live_bytes"])
if d["corrupt_bytes"] != 0 or d["bytes_verified"] != d["bytes_expected"] or d["bytes_verified"] == 0:
    bad.append("decode verified %d of %d bytes, %d corrupt" % (d["bytes_verified"], d["bytes_expected"], d["corrupt_bytes"]))
print("  " + ("; ".join(bad) if bad else "ok"))
sys.exit(1 if bad else 0)
PY
  then
    failures=$((failures + 1))
  fi
}

# lost NAME PORT HOLD "COMMON FLAGS" TP0 TP1: prefill instances 0 (TP0) and
# 1 (TP1); instance 1 holds its rooms from room HOLD on and is killed with
# SIGKILL once it says so. The decode runs under --expect-lost 1.
# wait_held ERR PID: until the prefill says it holds its rooms (its stderr
# ERR), it exits, or wait_s passed. Upper bound only: a prefill that never
# holds fails the run's checks.
# wait_bounded PID SECONDS NAME: PID's exit status, or 124 when it is still
# running after SECONDS: then what each of its threads waits on is printed
# (a hang then says where it stuck instead of eating the ctest timeout) and
# it is killed. Once, over ofi shm under a loaded run, the decode of run
# `kill` never exited after instance 1 was killed.
wait_bounded() {
  local pid=$1 limit=$2 name=$3 waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((limit * 10)) ]; then
      echo "test_serve: $name: still running after ${limit} s: hung; its threads wait in:"
      for t in /proc/"$pid"/task/*; do
        echo "  thread ${t##*/}: $(cat "$t/comm" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null)" \
          "state $(awk '/^State/ {print $2}' "$t/status" 2>/dev/null)"
        [ -r "$t/stack" ] && sed 's/^/    /' "$t/stack" 2>/dev/null | head -8
      done
      kill -9 "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$pid"
}

wait_held() {
  local waited=0
  until grep -q "holding its rooms" "$1"; do
    if [ "$waited" -ge $((wait_s * 10)) ] || ! kill -0 "$2" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# lost_check NAME HOLD DECODE_RC PREFILL0_RC PREFILL1_RC: runs 10 and 19:
# instance 1 lost mid-run, its held rooms (and only its) failed with
# KVS_EPEER, instance 0 untouched, nothing hung or leaked.
lost_check() {
  if ! python3 - "$work/$1" "$2" "$3" "$4" "$5" <<'PY'
import json, sys
base, hold, drc, rc0, rc1 = sys.argv[1], *(int(x) for x in sys.argv[2:6])
bad = []
held = "holding its rooms" in open(base + ".prefill1.err").read()
if not held: bad.append("instance 1 never said it holds its rooms")
if (drc, rc0, rc1) != (0, 0, 137): bad.append("exit codes decode %d, prefill %d/%d (want 0, 0/137)" % (drc, rc0, rc1))
d = json.load(open(base + ".decode.json"))
p0 = json.load(open(base + ".prefill0.json"))
if not p0["pass"] or p0["requests_ok"] != p0["requests"]:
    bad.append("prefill 0: %d ok of %d" % (p0["requests_ok"], p0["requests"]))
i0, i1 = d["instances"]
failed = {int(r.split(":")[0]): r.split(":")[1] for r in d["failed_rooms"]}
if d["requests_unfinished"]: bad.append("decode: %d rooms hung" % d["requests_unfinished"])
if i0["requests_failed"] or i0["requests_ok"] != i0["requests"] or i0["requests_ok"] != p0["requests_ok"]:
    bad.append("instance 0 (alive): %s" % i0)
other = sorted(r for r in failed if r % 2 != 1 or failed[r] != "KVS_EPEER")
if other: bad.append("failed rooms not of instance 1 or not KVS_EPEER: %s" % other)
hung = [r for r in range(hold, d["requests"]) if r % 2 == 1 and r not in failed]
if hung: bad.append("held rooms of instance 1 that did not fail: %s" % hung)
if i1["requests_failed"] != len(failed) or i1["requests_ok"] + i1["requests_failed"] != i1["requests"]:
    bad.append("instance 1: %s" % i1)
if d["ring_live_bytes"] != 0: bad.append("decode: %d ring bytes still live at the end (leaked)" % d["ring_live_bytes"])
if d["corrupt_bytes"] != 0 or d["bytes_verified"] != d["bytes_expected"] or d["bytes_verified"] == 0:
    bad.append("decode verified %d of %d bytes, %d corrupt" % (d["bytes_verified"], d["bytes_expected"], d["corrupt_bytes"]))
if not d["pass"]: bad.append("decode did not pass under --expect-lost 1")
print("  " + ("; ".join(bad) if bad else "ok (instance 1: %d ok, failed %s)" % (i1["requests_ok"], i1["failed_rooms"])))
sys.exit(1 if bad else 0)
PY
  then
    failures=$((failures + 1))
  fi
}

lost() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) hold=$3 common=$4 tp0=$5 tp1=$6 t0 p0 p1 dpid drc rc0 rc1
  t0=$(date +%s.%N)
  # The ranks' warnings (peers lost, rooms failed) go to stderr, printed
  # below: a room failed that should not have is then explained.
  local -x KVS_LOG_LEVEL=${KVS_LOG_LEVEL:-warn}
  # shellcheck disable=SC2086
  "$kvstage" serve --role prefill --listen "$addr:$port" --instance 0 --instances 2 \
    --prefill-tp "$tp0" "${shape[@]}" "${seed[@]}" $common \
    >"$work/$name.prefill0.json" 2>"$work/$name.prefill0.err" &
  p0=$!
  # shellcheck disable=SC2086
  "$kvstage" serve --role prefill --listen "$addr:$((port + 10))" --instance 1 --instances 2 \
    --prefill-tp "$tp1" --fault "hold-from:$hold" "${shape[@]}" "${seed[@]}" $common \
    >"$work/$name.prefill1.json" 2>"$work/$name.prefill1.err" &
  p1=$!
  # shellcheck disable=SC2086
  "$kvstage" serve --role decode --prefill-instance "0=$addr:$port,$tp0" \
    --prefill-instance "1=$addr:$((port + 10)),$tp1" --expect-lost 1 "${shape[@]}" \
    "${seed[@]}" $common >"$work/$name.decode.json" 2>"$work/$name.decode.err" &
  dpid=$!
  wait_held "$work/$name.prefill1.err" "$p1"
  local killed_at
  killed_at=$(elapsed "$t0")
  kill -9 "$p1" 2>/dev/null
  # libfabric's shm leaves a killed process's regions behind (named PID:*)
  [ -n "$fabric" ] && rm -f /dev/shm/"$p1":* 2>/dev/null
  wait "$p1" 2>/dev/null # bash's "Killed" notice: the kill is the point
  rc1=$?
  # the decode fails instance 1's rooms within --stall-timeout-ms (60 s)
  wait_bounded "$dpid" 150 "$name: decode"
  drc=$?
  wait_bounded "$p0" 60 "$name: prefill 0"
  rc0=$?
  echo "test_serve: $name: prefill exits $rc0/$rc1 (instance 1 killed at $killed_at s), decode exit $drc, $(elapsed "$t0") s"
  for side in prefill0 prefill1 decode; do
    echo "  $side: $(cat "$work/$name.$side.json")"
    [ -s "$work/$name.$side.err" ] && sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
  done
  lost_check "$name" "$hold" "$drc" "$rc0" "$rc1"
}

# unauth NAME PORT "PREFILL FLAGS" "DECODE FLAGS" PREFILL_LOG: the secrets
# differ. The decode must exit 1 at once with KVS_EAUTH naming the secret
# flags; the prefill must still be running (a refused peer does not stop
# it: it is then killed) and its stderr must show PREFILL_LOG (if given).
unauth() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) pflags=$3 dflags=$4 plog=$5 t0 ppid drc bad=""
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" "${seed[@]}" $pflags \
    >"$work/$name.prefill.json" 2>"$work/$name.prefill.err" &
  ppid=$!
  # shellcheck disable=SC2086
  timeout "$wait_s" "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" \
    "${seed[@]}" $dflags >"$work/$name.decode.json" 2>"$work/$name.decode.err"
  drc=$?
  sleep 0.2
  kill -0 "$ppid" 2>/dev/null || bad="$bad; the prefill stopped after refusing a peer"
  kill "$ppid" 2>/dev/null
  wait "$ppid" 2>/dev/null
  echo "test_serve: $name: decode exit $drc, $(elapsed "$t0") s"
  for side in prefill decode; do
    sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
  done
  [ "$drc" = 1 ] || bad="$bad; decode exit $drc, want 1"
  grep -q "(KVS_EAUTH)" "$work/$name.decode.err" || bad="$bad; the decode did not stop on KVS_EAUTH"
  grep -q -- "--secret-file or --secret-env" "$work/$name.decode.err" ||
    bad="$bad; the decode does not name the secret flags"
  [ -z "$plog" ] || grep -q -- "$plog" "$work/$name.prefill.err" ||
    bad="$bad; prefill stderr lacks '$plog'"
  if [ -n "$bad" ]; then
    echo "  ${bad#; }"
    failures=$((failures + 1))
  else
    echo "  ok"
  fi
}

# transfer_only NAME PORT: both sides --no-verify; all rooms ok, the
# decode received the whole payload, verified none and says so.
transfer_only() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) t0 prc drc
  t0=$(date +%s.%N)
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" "${seed[@]}" \
    --prefill-tp 2 --decode-tp 1 --no-verify >"$work/$name.prefill.json" 2>"$work/$name.prefill.err" &
  local ppid=$!
  "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" "${seed[@]}" \
    --prefill-tp 2 --decode-tp 1 --no-verify >"$work/$name.decode.json" 2>"$work/$name.decode.err"
  drc=$?
  wait "$ppid"
  prc=$?
  echo "test_serve: $name: prefill exit $prc, decode exit $drc, $(elapsed "$t0") s"
  if ! python3 - "$work/$name.prefill.json" "$work/$name.decode.json" "$prc" "$drc" <<'PY'
import json, sys
p, d = (json.load(open(f)) for f in sys.argv[1:3])
bad = []
if sys.argv[3:5] != ["0", "0"]: bad.append("exit codes %s" % sys.argv[3:5])
for s in (p, d):
    if not s["pass"] or s["requests_ok"] != s["requests"] or s["verified"]:
        bad.append("%s: pass %s, %d ok of %d, verified %s" % (s["role"], s["pass"], s["requests_ok"], s["requests"], s["verified"]))
if d["bytes_verified"] != 0 or d["payload_bytes"] != p["payload_bytes"] or d["payload_bytes"] == 0:
    bad.append("decode received %d of %d bytes, verified %d" % (d["payload_bytes"], p["payload_bytes"], d["bytes_verified"]))
if d["ring_live_bytes"] != 0: bad.append("decode: %d ring bytes leaked" % d["ring_live_bytes"])
print("  " + ("; ".join(bad) if bad else "ok"))
sys.exit(1 if bad else 0)
PY
  then
    failures=$((failures + 1))
  fi
}

cluster two 18655 "--decode-tp 1" 2,2 1,1
# The router is part of the workload: a prefill that splits the rooms with
# another instance, against a decode that knows one, is refused by name.
refused instdiffer 18695 "--prefill-tp 2 --decode-tp 1 --seed 7 --instances 2" \
  "--prefill-tp 2 --decode-tp 1 --seed 7" --instances
lost kill 18715 5 "--decode-tp 1 --stall-timeout-ms 60000" 2 4
# The cluster secret (never on a command line: a file or a variable).
printf 'kvstage test secret %s\n' "$$" >"$work/secret"
export KVS_SERVE_SECRET
KVS_SERVE_SECRET=$(head -n 1 "$work/secret")
run secret 18755 "--prefill-tp 2 --decode-tp 1 --secret-file $work/secret" \
  "--prefill-tp 2 --decode-tp 1 --secret-env KVS_SERVE_SECRET" 0
unauth nosecret 18775 "--prefill-tp 2 --decode-tp 1 --secret-file $work/secret" \
  "--prefill-tp 2 --decode-tp 1" "refused the registration of the peer at"
unauth impostor 18795 "--prefill-tp 2 --decode-tp 1" \
  "--prefill-tp 2 --decode-tp 1 --secret-env KVS_SERVE_SECRET" ""
transfer_only noverify 18815
KVS_SERVE_RUN_NEEDS=replay run replay 18875 "--prefill-tp 2 --decode-tp 1 --secret-file $work/secret" \
  "--prefill-tp 2 --decode-tp 1 --secret-env KVS_SERVE_SECRET --fault replay-registration" 0
# Runs 15 and 16 need region-scoped keys (verbs memory windows; ofi: the tcp
# provider only, hw/ofi/grant.c's verified list).
if [ "$expect_grants" = 1 ]; then
  KVS_SERVE_RUN_NEEDS=scoped run hostile 18835 \
    "--prefill-tp 2 --decode-tp 1 --fault hostile-write:3" "--prefill-tp 2 --decode-tp 1" 1
  KVS_SERVE_RUN_NEEDS=stale run stale 18855 \
    "--prefill-tp 2 --decode-tp 1 --fault stale-write:3" "--prefill-tp 2 --decode-tp 1" 0
else
  echo "test_serve: hostile, stale: SKIPPED: fabric '${fabric:---fabric verbs}' cannot scope" \
       "remote keys (ofi: grants only on the tcp provider; verbs without type-2 memory" \
       "windows), so these writes would land in another request's region (docs/security.md)"
  n_skipped=2
fi
# metrics NAME PORT [CP]: run 18 (above); CP > 1: run 22, its prefill
# instance of CP x TP 2 ranks, each CP rank's samples labelled cp_rank.
metrics() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) cp=${3:-1} t0 prc drc dport pport bad="" i
  t0=$(date +%s.%N)
  # The Python that has Debian's python3-prometheus-client (a python3
  # earlier on PATH, pyenv's say, may not).
  local py=""
  for py in python3 /usr/bin/python3 ""; do
    [ -n "$py" ] && "$py" -c 'import prometheus_client' 2>/dev/null && break
  done
  if [ -z "$py" ]; then
    echo "test_serve: $name: FAILED: no python3 can import prometheus_client: install" \
         "python3-prometheus-client (tools/install-deps.sh does)"
    failures=$((failures + 1))
    return 0
  fi
  local flags=(--prefill-tp 2 --decode-tp 1 --prefill-cp "$cp" --metrics "$addr:0"
               --metrics-hold-ms 5000)
  "$kvstage" serve --role prefill --listen "$addr:$port" "${shape[@]}" "${seed[@]}" \
    "${flags[@]}" >"$work/$name.prefill.json" 2>"$work/$name.prefill.err" &
  local ppid=$!
  "$kvstage" serve --role decode --peer "$addr:$port" "${shape[@]}" "${seed[@]}" \
    "${flags[@]}" >"$work/$name.decode.json" 2>"$work/$name.decode.err" &
  local dpid=$!
  endpoint() { sed -n 's|^kvstage serve: metrics at \(http://.*/metrics\)$|\1|p' "$1"; }
  for ((i = 0; i < wait_s * 10; i++)); do
    dport=$(endpoint "$work/$name.decode.err")
    pport=$(endpoint "$work/$name.prefill.err")
    [ -n "$dport" ] && [ -n "$pport" ] && break
    sleep 0.1
  done
  # Scrape each endpoint until its ranks have ended every room (rooms
  # ended, summed over the ranks: the decode's 1 rank x --requests, the
  # prefill's CP x 2 ranks x --requests); the holds keep them up meanwhile.
  local requests="" notfound="" dok=0 pok=0
  for ((i = 0; i < ${#shape[@]}; i++)); do
    [ "${shape[$i]}" = --requests ] && requests=${shape[$((i + 1))]}
  done
  complete() { # FILE N: the text's rooms_ended_total samples add up to N
    awk -v n="$2" '/^kvstage_rooms_ended_total[{]/ { s += $NF } END { exit !(s >= n) }' "$1"
  }
  for ((i = 0; i < wait_s * 10 && (dok == 0 || pok == 0); i++)); do
    if [ "$dok" = 0 ] && curl -sf "$dport" >"$work/$name.decode.prom" 2>/dev/null; then
      [ -n "$notfound" ] ||
        notfound=$(curl -s -o /dev/null -w '%{http_code}' "${dport%/metrics}/other")
      complete "$work/$name.decode.prom" "$requests" && dok=1
    fi
    if [ "$pok" = 0 ] && curl -sf "$pport" >"$work/$name.prefill.prom" 2>/dev/null; then
      complete "$work/$name.prefill.prom" $((2 * cp * requests)) && pok=1
    fi
    [ "$dok" = 1 ] && [ "$pok" = 1 ] || sleep 0.1
  done
  [ "$dok" = 1 ] || bad="$bad; the decode's metrics never showed its $requests rooms ended"
  [ "$pok" = 1 ] || bad="$bad; the prefill's metrics never showed its rooms ended"
  [ "$notfound" = 404 ] || bad="$bad; GET /other answered '$notfound', not 404"
  wait "$dpid"
  drc=$?
  wait "$ppid"
  prc=$?
  echo "test_serve: $name: prefill exit $prc, decode exit $drc, $(elapsed "$t0") s"
  [ "$prc" = 0 ] && [ "$drc" = 0 ] || bad="$bad; exit codes $prc/$drc"
  if ! "$py" - "$work/$name" "$cp" <<'PY'
import json, sys
from prometheus_client.parser import text_string_to_metric_families
base, cp = sys.argv[1], int(sys.argv[2])
bad = []
def samples(side):
    out = {}
    for fam in text_string_to_metric_families(open(base + "." + side + ".prom").read()):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            if key in out:
                bad.append("%s: sample %s twice" % (side, key))
            out[key] = s.value
    return out
def total(m, name, **want):
    return sum(v for (n, labels), v in m.items() if n == name
               and all(dict(labels).get(k) == w for k, w in want.items()))
for side in ("decode", "prefill"):
    rep = json.load(open(base + "." + side + ".json"))
    m = samples(side)
    ok = total(m, "kvstage_rooms_ended_total", role=side, status="KVS_OK")
    ranks = rep["ranks"]
    if ok != rep["requests_ok"] * ranks or ok == 0:
        bad.append("%s: %d rooms ended KVS_OK in the metrics, %d ok x %d ranks in its report"
                   % (side, ok, rep["requests_ok"], ranks))
    if total(m, "kvstage_room_transfer_seconds_count", role=side) != ok:
        bad.append("%s: the transfer-time histogram counts %d rooms, not %d"
                   % (side, total(m, "kvstage_room_transfer_seconds_count", role=side), ok))
    if total(m, "kvstage_room_transfer_bytes_sum", role=side) != rep["payload_bytes"]:
        bad.append("%s: %d bytes in the histogram, %d in its report" % (
            side, total(m, "kvstage_room_transfer_bytes_sum", role=side), rep["payload_bytes"]))
    if side == "prefill" and total(m, "kvstage_rdma_writes_total") != rep["rdma_writes"]:
        bad.append("prefill: %d writes in the metrics, %d in its report"
                   % (total(m, "kvstage_rdma_writes_total"), rep["rdma_writes"]))
    # With CP each prefill rank's samples say its CP rank; without, none.
    labelled = {dict(labels).get("cp_rank") for (n, labels) in m
                if n == "kvstage_rdma_writes_total"}
    want = {str(c) for c in range(cp)} if side == "prefill" and cp > 1 else {None}
    if labelled != want:
        bad.append("%s: cp_rank labels %s, want %s" % (side, sorted(map(str, labelled)),
                                                       sorted(map(str, want))))
    print("  %s: %d samples, %d rooms ok, %d bytes" % (side, len(m), ok, rep["payload_bytes"]))
print("  " + ("; ".join(bad) if bad else "ok"))
sys.exit(1 if bad else 0)
PY
  then
    bad="$bad; the metrics disagree with the reports (above)"
  fi
  if [ -n "$bad" ]; then
    echo "  ${bad#; }"
    for side in prefill decode; do sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"; done
    failures=$((failures + 1))
  fi
}
metrics metrics 18895
metrics metricscp 19015 2

# discovered NAME PORT HOLD: run 19 (above).
# discovered NAME PORT HOLD [FLAGS]: run 19 (above); FLAGS (run 23: --prefill-cp
# 2) go to every process.
discovered() {
  skipped "$1" && return 0
  local name=$1 port=$(($2 + off)) hold=$3 t0 p0 p1 dpid drc rc0 rc1 e waited=0
  local -a more
  read -r -a more <<<"${4:-}"
  t0=$(date +%s.%N)
  if ! command -v etcd >/dev/null; then
    echo "test_serve: $name: FAILED: etcd is not installed: install etcd-server" \
         "(tools/install-deps.sh does)"
    failures=$((failures + 1))
    return 0
  fi
  local client="$addr:$((port + 40))"
  etcd --data-dir "$work/$name.etcd" --name kvs --listen-client-urls "http://$client" \
    --advertise-client-urls "http://$client" --listen-peer-urls "http://$addr:$((port + 41))" \
    --initial-advertise-peer-urls "http://$addr:$((port + 41))" \
    --initial-cluster "kvs=http://$addr:$((port + 41))" >"$work/$name.etcd.log" 2>&1 &
  e=$!
  until curl -sf "http://$client/health" >/dev/null 2>&1; do
    if [ "$waited" -ge $((wait_s * 10)) ] || ! kill -0 "$e" 2>/dev/null; then
      echo "test_serve: $name: FAILED: etcd did not start:"
      sed 's/^/  etcd: /' "$work/$name.etcd.log" | tail -n 20
      failures=$((failures + 1))
      kill "$e" 2>/dev/null
      return 0
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  local -x KVS_LOG_LEVEL=${KVS_LOG_LEVEL:-warn}
  local disc=(--discovery "etcd://$client" --discovery-ttl-s 2 --stall-timeout-ms 60000
              "${more[@]}")
  "$kvstage" serve --role prefill --listen "$addr:$port" --instance 0 --instances 2 \
    --prefill-tp 2 "${shape[@]}" "${seed[@]}" "${disc[@]}" \
    >"$work/$name.prefill0.json" 2>"$work/$name.prefill0.err" &
  p0=$!
  "$kvstage" serve --role decode --instances 2 --expect-lost 1 "${shape[@]}" "${seed[@]}" \
    "${disc[@]}" >"$work/$name.decode.json" 2>"$work/$name.decode.err" &
  dpid=$!
  sleep 1 # instance 1 joins after the decode started
  "$kvstage" serve --role prefill --listen "$addr:$((port + 10))" --instance 1 --instances 2 \
    --prefill-tp 1 --fault "hold-from:$hold" "${shape[@]}" "${seed[@]}" "${disc[@]}" \
    >"$work/$name.prefill1.json" 2>"$work/$name.prefill1.err" &
  p1=$!
  wait_held "$work/$name.prefill1.err" "$p1"
  kill -STOP "$p1" 2>/dev/null
  local frozen
  frozen=$(date +%s.%N)
  wait "$dpid"
  drc=$?
  local took
  took=$(elapsed "$frozen")
  wait "$p0"
  rc0=$?
  kill -9 "$p1" 2>/dev/null
  [ -n "$fabric" ] && rm -f /dev/shm/"$p1":* 2>/dev/null
  wait "$p1" 2>/dev/null
  rc1=$?
  kill "$e" 2>/dev/null
  wait "$e" 2>/dev/null
  echo "test_serve: $name: prefill exits $rc0/$rc1, decode exit $drc $took s after instance 1 froze, $(elapsed "$t0") s"
  for side in prefill0 prefill1 decode; do
    echo "  $side: $(cat "$work/$name.$side.json")"
    [ -s "$work/$name.$side.err" ] && sed 's/^/  '"$side"' stderr: /' "$work/$name.$side.err"
  done
  local bad=""
  grep -q "prefill instance 1 is gone (its lease lapsed)" "$work/$name.decode.err" ||
    bad="the decode never said instance 1's lease lapsed"
  awk -v t="$took" 'BEGIN { exit !(t < 20) }' ||
    bad="${bad:+$bad; }the decode ended $took s after the freeze: as late as the stall timeout"
  if [ -n "$bad" ]; then
    echo "  $bad"
    failures=$((failures + 1))
  fi
  lost_check "$name" "$hold" "$drc" "$rc0" "$rc1"
}
discovered discovery 18915 5
# Prefill context parallelism: run 8's instances with two CP ranks each
# (instance 0's 8 ranks take PORT..PORT + 7, instance 1's PORT + 10..), and
# a decode that expects none refused by name.
cluster twocp 18975 "--decode-tp 1 --prefill-cp 2" 2,2 1,1
refused cpdiffer 18995 "--prefill-tp 2 --decode-tp 1 --prefill-cp 2 --seed 7" \
  "--prefill-tp 2 --decode-tp 1 --seed 7" --prefill-cp
# Run 19 with two CP ranks per instance, found through etcd (instance 0's
# 4 ranks at PORT.., instance 1's 2 at PORT + 10..).
discovered discoverycp 19035 5 "--prefill-cp 2"

echo "test_serve: $failures of 23 runs failed${n_skipped:+, $n_skipped skipped}"
[ "$failures" = 0 ]
