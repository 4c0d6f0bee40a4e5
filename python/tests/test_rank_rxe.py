"""test_rank_rxe.py - two Python processes move KV through kvstage.Rank: a
prefill instance of TP 2 and a decode instance of TP 1 (rank_pair.py),
torch CPU tensors as their KV pools, the host device and the verbs fabric,
several rooms in several chunks with aux payloads; the decode checks every
byte of its pool and every aux payload. Needs an RDMA device: ctest's
python_rank_rxe runs it inside the soft-RoCE VM (tests/rxe/run-in-vm.sh);
elsewhere it is skipped, saying so. test_rank_ofi.py runs the same pair
over libfabric, everywhere."""

import os

import pytest

pytest.importorskip("torch")
import rank_pair  # noqa: E402 (needs torch)


def have_rdma():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def test_prefill_tp2_to_decode_tp1_over_verbs(tmp_path):
    if not have_rdma():
        if os.environ.get("KVS_RXE_REQUIRED") == "1":
            pytest.fail("KVS_RXE_REQUIRED=1 but /sys/class/infiniband is empty")
        pytest.skip("no RDMA device here: ctest's python_rank_rxe runs this in the rxe VM")
    rank_pair.run(tmp_path, ["--fabric", "verbs"], timeout_s=420)
