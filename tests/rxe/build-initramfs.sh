#!/usr/bin/env bash
# build-initramfs.sh - makes the soft-RoCE VM's boot files in a cache folder:
# the kernel of Debian's linux-image-amd64 (fetched with `apt-get download`,
# unpacked with `dpkg -x`, never installed) and an initramfs of
# busybox-static, the kernel modules the VM needs (rdma_rxe, rdma_ucm,
# ib_uverbs, dummy, virtio-pci, 9p and their dependencies) and
# tests/rxe/vm-init.sh as /init.
#
# Usage: build-initramfs.sh CACHE_DIR
# Prints the folder holding vmlinuz and initramfs.cpio.gz. Idempotent: a
# folder built for the same kernel package and the same init script is
# reused, so only the first run downloads (~70 MB) and unpacks (~5 s).
# KVS_RXE_KERNEL_PKG names another kernel package (default: the one
# linux-image-amd64 depends on).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?usage: build-initramfs.sh CACHE_DIR}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

fail() {
  echo "build-initramfs: $*" >&2
  exit 1
}

for tool in apt-get apt-cache dpkg depmod modprobe cpio gzip; do
  command -v "$tool" >/dev/null ||
    fail "'$tool' not found: run tools/install-deps.sh (packages apt, dpkg, kmod, cpio, gzip)"
done
# The VM has no libc of its own before it mounts the host: busybox must be
# the static build (package busybox-static, which installs /bin/busybox).
busybox=/bin/busybox
[ -x "$busybox" ] || fail "$busybox not found: install the package busybox-static"
if LC_ALL=C readelf -l "$busybox" 2>/dev/null | grep -q 'Requesting program interpreter'; then
  fail "$busybox is dynamically linked: install busybox-static (it replaces busybox)"
fi

pkg=${KVS_RXE_KERNEL_PKG:-}
if [ -z "$pkg" ]; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [ -n "$pkg" ] || fail "apt-cache knows no linux-image-amd64: run 'apt-get update' (or set KVS_RXE_KERNEL_PKG to a kernel package name)"
fi
key=$(cat "$here/vm-init.sh" "$0" | sha256sum | cut -c1-12)
out="$cache/$pkg-$key"
if [ -s "$out/vmlinuz" ] && [ -s "$out/initramfs.cpio.gz" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d "$cache/work.XXXXXX")
chmod 755 "$work" # apt-get download hands the file to the _apt user
trap 'rm -rf "$work"' EXIT
deb=$(ls "$cache"/"$pkg"_*.deb 2>/dev/null | head -n 1 || true)
if [ -z "$deb" ]; then
  (cd "$work" && apt-get download -q "$pkg" >&2) ||
    fail "could not download $pkg with apt-get download: check the package mirror (apt-get update) or set KVS_RXE_KERNEL_PKG"
  mv "$work"/"$pkg"_*.deb "$cache"/
  deb=$(ls "$cache"/"$pkg"_*.deb | head -n 1)
fi
dpkg -x "$deb" "$work/root" || fail "dpkg -x $deb failed: delete it from $cache and rerun"
kver=$(ls "$work/root/lib/modules" | head -n 1)
[ -n "$kver" ] || fail "$deb holds no /lib/modules: set KVS_RXE_KERNEL_PKG to a linux-image package"
depmod -b "$work/root" "$kver"

# Modules in load order, each once.
ir="$work/initramfs"
mkdir -p "$ir/bin" "$ir/mods" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/host" "$ir/tmp"
: >"$ir/mods/order"
# crc32_generic: rxe computes the ICRC with the "crc32" crypto hash, which the
# kernel would otherwise ask a modprobe the VM does not have for.
for m in virtio_pci 9pnet_virtio 9p dummy crc32_generic rdma_rxe ib_uverbs rdma_ucm; do
  modprobe -d "$work/root" -S "$kver" --show-depends "$m" ||
    fail "module $m not in $pkg: pick a kernel package built with it (KVS_RXE_KERNEL_PKG)"
done | awk '$1 == "insmod" {print $2}' | while read -r ko; do
  name=$(basename "$ko")
  if ! grep -qx "$name" "$ir/mods/order"; then
    case "$ko" in
      *.ko) cp "$ko" "$ir/mods/$name" ;;
      *.ko.xz) xz -dc "$ko" >"$ir/mods/${name%.xz}"; name=${name%.xz} ;;
      *.ko.zst) zstd -qdc "$ko" >"$ir/mods/${name%.zst}"; name=${name%.zst} ;;
      *) fail "unknown module format: $ko" ;;
    esac
    echo "$name" >>"$ir/mods/order"
  fi
done
cp "$busybox" "$ir/bin/busybox"
cp "$here/vm-init.sh" "$ir/init"
chmod 755 "$ir/init" "$ir/bin/busybox"

mkdir -p "$work/out"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/out/initramfs.cpio.gz"
cp "$work/root/boot/vmlinuz-$kver" "$work/out/vmlinuz"
echo "$kver" >"$work/out/kernel-version"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
