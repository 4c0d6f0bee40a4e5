#!/usr/bin/env bash
# run-main.sh - the main job on a fresh machine: installs what is needed,
# builds kvstage and runs its default scenario (for now the layout plan of
# Llama-3.1-70B from prefill TP 8 to decode TP 2).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVS_TESTS=OFF
cmake --build build -j"$(nproc)"
./build/kvstage plan --model llama-3.1-70b --prefill-tp 8 --decode-tp 2 "$@"
