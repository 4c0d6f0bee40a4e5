#!/usr/bin/env bash
# run-in-vm.sh - runs a command where an RDMA device is: directly when this
# machine has one (/sys/class/infiniband is not empty), else inside a qemu
# VM (TCG, no KVM needed) running Debian's kernel with soft-RoCE (rdma_rxe)
# on a dummy netdev at 192.0.2.1 (tests/rxe/vm-init.sh).
#
# Usage: run-in-vm.sh RESULT_DIR COMMAND [ARGS...]
# RESULT_DIR (created, emptied) is the VM's one writable folder: it gets
# cmd.sh (what the VM runs), console.log, and status (the command's exit
# status). The host's / is shared read-only at the same paths, so
# host-built binaries run unchanged; the command runs as root in the
# current directory with KVS_*, FI_* (libfabric's settings),
# ASAN_/UBSAN_/LSAN_OPTIONS and CI copied in,
# plus KVS_RXE_REQUIRED=1 and KVS_VERBS_ADDR=192.0.2.1.
# Exits with the command's status. When the VM cannot be made or does not
# finish in KVS_RXE_TIMEOUT seconds (default 300) it says why and exits 1
# under CI=true or KVS_RXE_REQUIRED=1, else 77 (ctest's skip code).
# KVS_RXE_FORCE_VM=1 uses the VM even when this machine has a device;
# KVS_RXE_CACHE is where the kernel and initramfs are kept (default
# build-rxe/ in the source tree).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: run-in-vm.sh RESULT_DIR COMMAND [ARGS...]" >&2; exit 2; }
results=$1
shift

cannot() {
  echo "run-in-vm: CANNOT RUN THE RDMA TESTS: $*" >&2
  if [ "${CI:-}" = true ] || [ "${KVS_RXE_REQUIRED:-0}" = 1 ]; then
    exit 1
  fi
  echo "run-in-vm: SKIPPED (set KVS_RXE_REQUIRED=1 to make this a failure)" >&2
  exit 77
}

if [ "${KVS_RXE_FORCE_VM:-0}" != 1 ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "run-in-vm: this machine has RDMA devices ($(ls /sys/class/infiniband | tr '\n' ' ')): running directly"
  KVS_RXE_REQUIRED=1 exec "$@"
fi

command -v qemu-system-x86_64 >/dev/null ||
  cannot "qemu-system-x86_64 not found: install qemu-system-x86 (tools/install-deps.sh)"
cache=${KVS_RXE_CACHE:-$here/../../build-rxe}
mkdir -p "$cache" || cannot "cannot create $cache (KVS_RXE_CACHE)"
# One builder at a time (ctest -j runs several VMs): the others wait, then
# find the cache made.
boot=$(flock "$cache/.lock" "$here/build-initramfs.sh" "$cache") ||
  cannot "could not build the VM's kernel and initramfs (see above)"

mkdir -p "$results" || cannot "cannot create $results"
results=$(cd "$results" && pwd)
case "$results" in
  *[!A-Za-z0-9_./+-]*) cannot "RESULT_DIR $results has characters the kernel command line cannot carry: use letters, digits and _./+-" ;;
esac
rm -f "$results/status" "$results/cmd.sh" "$results/console.log"

{
  echo "# written by run-in-vm.sh: what the VM runs"
  env | LC_ALL=C sort | while IFS='=' read -r name value; do
    case "$name" in
      KVS_*|FI_*|ASAN_OPTIONS|UBSAN_OPTIONS|LSAN_OPTIONS|CI) printf 'export %s=%q\n' "$name" "$value" ;;
    esac
  done
  echo "export KVS_RXE_REQUIRED=1 KVS_VERBS_ADDR=192.0.2.1 HOME=/run/vmtmp TMPDIR=/run/vmtmp"
  # gcov data of coverage builds goes to the writable folder, not the read-only tree
  printf 'export GCOV_PREFIX=%q GCOV_PREFIX_STRIP=0\n' "$results/gcov"
  printf 'cd %q || exit 126\n' "$PWD"
  printf '%q ' "$@"
  echo
} >"$results/cmd.sh"

timeout_s=${KVS_RXE_TIMEOUT:-300}
start=$(date +%s%N)
timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 \
  -accel tcg -cpu max -m 2G -smp 2 -nodefaults -display none -serial stdio \
  -no-reboot -kernel "$boot/vmlinuz" -initrd "$boot/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 kvs.results=$results" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$results,mount_tag=results,security_model=none,multidevs=remap" \
  </dev/null 2>&1 | tee "$results/console.log"
qemu_rc=${PIPESTATUS[0]}
elapsed=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
if [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; then
  cannot "the VM did not finish in ${timeout_s}s (KVS_RXE_TIMEOUT): see $results/console.log"
fi
[ -s "$results/status" ] ||
  cannot "the VM stopped (qemu exit $qemu_rc) before the command finished: see $results/console.log"
status=$(cat "$results/status")
echo "run-in-vm: command exited $status; VM wall time ${elapsed}s"
exit "$status"
