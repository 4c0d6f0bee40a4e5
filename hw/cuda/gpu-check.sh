#!/usr/bin/env bash
# gpu-check.sh - the GPU check of the CUDA backend, for a machine with an
# NVIDIA GPU (run it whenever one is available; record the numbers in
# docs/cuda.md). Builds Release in build-gpu-check/, runs test_cuda_kernels
# (the kernels' arithmetic on the CPU) and test_cuda_device with
# KVS_EXPECT_GPU=1 (when cmocka is installed), then gpu_check: CUDA
# gather/scatter against the host backend byte for byte on random data, and
# bandwidth against cudaMemcpy device-to-device (docs/cuda.md shows the
# output). Every step has a timeout; the whole run stays under 8 minutes on
# one GPU. Arguments go to gpu_check: [tokens] [repetitions] [random shapes].
# Exit status: 0 all equal, 1 a difference or failure, 2 no usable GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
tests=OFF
targets=(gpu_check)
if [ -f /usr/include/cmocka.h ]; then
  tests=ON
  targets+=(test_cuda_kernels test_cuda_device)
fi
mkdir -p build-gpu-check
echo "== build (Release, build-gpu-check/)"
timeout 120 cmake -S . -B build-gpu-check -DCMAKE_BUILD_TYPE=Release -DKVS_TESTS="$tests" \
  >build-gpu-check/build.log 2>&1 || { tail -n 30 build-gpu-check/build.log; exit 1; }
if ! grep -q "CUDA backend on" build-gpu-check/build.log; then
  grep -i cuda build-gpu-check/build.log || true
  echo "gpu-check: no CUDA compiler found; put nvcc on PATH or set CUDACXX" >&2
  exit 1
fi
timeout 240 cmake --build build-gpu-check -j"$(nproc)" --target "${targets[@]}" >>build-gpu-check/build.log 2>&1 ||
  { tail -n 30 build-gpu-check/build.log; exit 1; }
status=0
if [ "$tests" = ON ]; then
  echo "== test_cuda_kernels (the kernels' arithmetic on the CPU)"
  timeout 120 build-gpu-check/test_cuda_kernels || status=1
  echo "== test_cuda_device (KVS_EXPECT_GPU=1)"
  KVS_EXPECT_GPU=1 timeout 60 build-gpu-check/test_cuda_device || status=1
fi
echo "== gpu_check"
timeout 120 build-gpu-check/gpu_check "$@" || { rc=$?; [ "$rc" -gt "$status" ] && status=$rc; }
echo "gpu-check: done in $(( $(date +%s) - start )) s, exit status $status"
exit "$status"
