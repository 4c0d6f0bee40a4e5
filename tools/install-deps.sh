#!/usr/bin/env bash
# install-deps.sh - installs every Debian 12 package the build and the tests
# use. Run as root on a fresh machine; already-installed packages cost nothing.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: run as root (apt-get needs it), e.g. with sudo" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends \
  build-essential cmake clang libclang-rt-14-dev pkg-config \
  libcmocka-dev nettle-dev gcovr valgrind python3 python3-pytest python3-torch python3-numpy \
  python3-prometheus-client curl etcd-server \
  git ca-certificates \
  libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils rdmacm-utils \
  libfabric-dev libfabric-bin \
  perftest iproute2 qemu-system-x86 busybox-static cpio kmod binutils
