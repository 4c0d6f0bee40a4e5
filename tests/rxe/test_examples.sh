#!/usr/bin/env bash
# test_examples.sh - runs the embedding examples of docs/embedding.md where
# an RDMA device is (run-in-vm.sh): the C program (built as rank_example)
# and the Python one (docs/examples/rank_example.py, torch CPU tensors).
# Each checks every byte it moved and exits non-zero otherwise.
# Usage: test_examples.sh RANK_EXAMPLE_BINARY EXAMPLES_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: test_examples.sh RANK_EXAMPLE_BINARY EXAMPLES_DIR" >&2; exit 2; }
echo "== C: $1"
"$1"
echo "== Python: $2/rank_example.py"
py=/usr/bin/python3 # Debian's, where python3-torch is
[ -x "$py" ] || py=python3
"$py" "$2/rank_example.py"
echo "test_examples: both examples moved their rooms intact"
