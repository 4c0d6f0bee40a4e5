"""test_rank_rxe.py - two Python processes move KV through kvstage.Rank: a
prefill instance of TP 2 and a decode instance of TP 1 (rank_pair.py),
torch CPU tensors as their KV pools, the host device and the verbs fabric,
several rooms in several chunks with aux payloads; the decode checks every
byte of its pool and every aux payload. Needs an RDMA device: ctest's
python_rank_rxe runs it inside the soft-RoCE VM (tests/rxe/run-in-vm.sh);
elsewhere it is skipped, saying so."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def have_rdma():
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def test_prefill_tp2_to_decode_tp1_over_verbs(tmp_path):
    pytest.importorskip("torch")
    if not have_rdma():
        if os.environ.get("KVS_RXE_REQUIRED") == "1":
            pytest.fail("KVS_RXE_REQUIRED=1 but /sys/class/infiniband is empty")
        pytest.skip("no RDMA device here: ctest's python_rank_rxe runs this in the rxe VM")
    script = os.path.join(HERE, "rank_pair.py")
    procs = {role: subprocess.Popen([sys.executable, script, role, str(tmp_path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for role in ("prefill", "decode")}
    outs = {}
    for role, p in procs.items():
        try:
            outs[role] = p.communicate(timeout=420)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail("%s did not finish in 420 s" % role)
    for role, p in procs.items():
        assert p.returncode == 0, "%s exited %d:\n%s" % (role, p.returncode, outs[role])
    dec = json.loads((tmp_path / "decode.json").read_text())
    pre = json.loads((tmp_path / "prefill.json").read_text())
    print("decode", dec, "prefill", pre)
    assert dec["rooms"] == dec["rooms_ok"] == 5
    assert dec["aux_bytes"] > 0
    # The decode received what the two prefill ranks wrote, one write per chunk.
    assert dec["bytes"] > 0 and all(w > 0 for w in pre["rdma_writes"])
