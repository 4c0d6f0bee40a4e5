#!/bin/busybox sh
# vm-init.sh - /init of the soft-RoCE VM (tests/rxe/run-in-vm.sh boots it).
# Loads the modules listed in /mods/order, mounts the host's / read-only
# over virtio-9p (tag hostroot) at /host and the writable results folder
# (tag results) at its host path inside it, gives the host tree its own
# /proc, /sys, /dev and /run (scratch space: /run/vmtmp), makes a dummy netdev (MTU 9000,
# 192.0.2.1/24) with the soft-RoCE device rxe0 on it, then runs
# RESULTS/cmd.sh in a chroot of the host tree: host-built binaries and
# their libraries run unchanged at their own paths. The exit status goes to
# RESULTS/status; then the VM powers off. Any failure before the command
# leaves no status file, which run-in-vm.sh reports as a failed boot.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec >/dev/console 2>&1
say() { echo "rxe-vm: $*"; }
die() {
  say "FAILED: $*"
  poweroff -f
  sleep 60
}
for m in $(cat /mods/order); do
  insmod "/mods/$m" || die "insmod $m"
done
results=$(sed -n 's/.*kvs\.results=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$results" ] || die "no kvs.results= on the kernel command line"
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro,cache=loose" hostroot /host || die "mounting the host's / (9p tag hostroot)"
mount -t 9p -o "$opts" results "/host$results" || die "mounting the results folder $results"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
# /tmp stays the host's (read-only): the tree under test may live there (a
# CI clone in /tmp). Writable scratch space is /run/vmtmp (TMPDIR, HOME).
mount -t tmpfs tmpfs /host/run
mkdir -p /host/run/vmtmp
hostsh() { chroot /host /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
hostsh ip link set lo up
hostsh ip link show dummy0 >/dev/null 2>&1 || hostsh ip link add dummy0 type dummy ||
  die "ip link add dummy0 type dummy"
hostsh ip link set dummy0 mtu 9000 up || die "ip link set dummy0 mtu 9000 up"
hostsh ip addr add 192.0.2.1/24 dev dummy0 || die "ip addr add 192.0.2.1/24 dev dummy0"
hostsh rdma link add rxe0 type rxe netdev dummy0 || die "rdma link add rxe0 type rxe netdev dummy0"
say "ready after $(cut -d' ' -f1 /proc/uptime) s (uptime)"
hostsh /bin/sh "$results/cmd.sh"
echo $? >"/host$results/status"
say "command exited $(cat "/host$results/status") at $(cut -d' ' -f1 /proc/uptime) s (uptime)"
sync
umount "/host$results"
poweroff -f
sleep 60
