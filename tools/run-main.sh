#!/usr/bin/env bash
# run-main.sh - the main job on a fresh machine: installs what is needed,
# builds kvstage and runs the simulator's default scenario (Llama-3.1-70B,
# prefill TP 8 -> decode TP 2 on 8 + 2 simulated H200s with 400 Gb/s NICs;
# every byte moved is verified). Extra arguments go to `kvstage sim`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVS_TESTS=OFF
cmake --build build -j"$(nproc)"
./build/kvstage sim "$@"
