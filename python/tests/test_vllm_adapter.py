"""test_vllm_adapter.py - kvstage.vllm.KVStageConnector, driven as vLLM's
scheduler, model runner and executor drive a KV connector
(vllm_engine.py), in real processes over libfabric tcp on 127.0.0.1 with
torch CPU KV caches:

- two prefill instances of different TP, A (TP 2) and B (TP 1), into one
  decode (TP 1): heterogeneous TP, a request with a locally cached prefix,
  partial last blocks; every byte of the decode's caches checked
  (untouched slots stay zero);
- a decode request aborted mid-load keeps its blocks (delay_free) until
  its room ended, and is then reported for freeing; the prefill reports
  it sent (its blocks freed) too;
- B killed (SIGKILL) while the decode waits on one of its requests: that
  request is reported received with its blocks in the load errors, within
  a bound, never hangs; a request A serves after the kill arrives whole;
- a request the rank refuses with nothing opened (its room table full) is
  reported at once, never held;
- the connector's refusals (roles, options, ports), naming what to change.

ctest python_vllm (TIMEOUT in CMakeLists.txt)."""

import json
import os
import socket
import types

import pytest

import kvstage
from kvstage.vllm import KVConnectorRole, KVStageConnector
from engine_procs import need_ofi_and_torch, run_with_kill

HERE = os.path.dirname(os.path.abspath(__file__))
KILL_BOUND_S = 8


def free_ports(n):
    """A base port with the n ports from it free on 127.0.0.1 now."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            held = []
            for p in range(base, base + n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    raise AssertionError("no %d consecutive free ports on 127.0.0.1" % n)


def test_vllm_two_prefills_abort_and_kill(tmp_path):
    need_ofi_and_torch("the vLLM connector")
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(HERE, "vllm_engine.py")

    run_with_kill(script, env, tmp_path, {"A": ["prefill", tmp_path, "A", free_ports(2)],
                                          "B": ["prefill", tmp_path, "B", free_ports(1)],
                                          "decode": ["decode", tmp_path]})
    dec = json.loads((tmp_path / "decode.json").read_text())
    pre_a = json.loads((tmp_path / "A.json").read_text())
    print("decode", dec, "A", pre_a)
    assert dec["received"] == ["a1", "a2", "a4", "b1", "b2"], dec
    assert dec["freed"] == ["a3"] and dec["abort_delay_free"] is True, dec
    # Exactly the killed prefill's request failed: its blocks, no others.
    assert dec["load_errors"] == dec["b2_blocks"], dec
    assert dec["b2_failed_after_s"] < KILL_BOUND_S, dec
    assert pre_a["sent"] == ["a1", "a2", "a3", "a4"], pre_a
    assert dec["checked_bytes"] > 0


# ---- the connector's refusals, in this process -------------------------------------------

def config(**ktc):
    base = dict(kv_role="kv_producer", kv_ip="127.0.0.1", kv_port=20000, engine_id="e",
                kv_connector_extra_config={})
    base.update(ktc)
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(**base),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=2, rank=1),
        cache_config=types.SimpleNamespace(block_size=16))


def refused(needle, role=KVConnectorRole.SCHEDULER, **ktc):
    with pytest.raises(kvstage.KvstageError) as e:
        KVStageConnector(config(**ktc), role)
    assert needle in e.value.message, e.value
    return e.value


def test_vllm_connector_refusals():
    refused('kv_role: \'kv_both\': the kvstage connector takes "kv_producer"', kv_role="kv_both")
    refused("kv_connector_extra_config: 'fabrik' is not a kvstage option",
            kv_connector_extra_config={"fabrik": "ofi"})
    refused("kv_connector_extra_config['ring_bytes']: '1M': give a number",
            kv_connector_extra_config={"ring_bytes": "1M"})
    refused("kv_port: 0: a prefill's worker t listens on kv_port + t", kv_port=0)
    refused("engine_id: empty", engine_id="")
    c = KVStageConnector(config(kv_role="kv_consumer", kv_port=0), KVConnectorRole.WORKER)
    assert (c.side, c.tp_rank, c.tp_size) == ("decode", 1, 2)
    c.bind_connector_metadata(c.build_connector_meta(None))
    with pytest.raises(kvstage.KvstageError) as e:
        c.start_load_kv(None)
    assert "start_load_kv: no KV caches yet" in e.value.message, e.value


def test_vllm_room_table_full_fails_the_request_at_once():
    """A room the rank refuses with nothing opened (its room table full)
    is reported at once, never held: the prefill's as sent (vLLM frees its
    blocks), with the others still moving."""
    need_ofi_and_torch("the vLLM connector")
    import numpy as np
    port = free_ports(1)
    cfg = config(kv_port=port, kv_connector_extra_config={
        "fabric": "ofi", "provider": "tcp", "max_rooms": 1})
    cfg.parallel_config = types.SimpleNamespace(tensor_parallel_size=1, rank=0)
    sched = KVStageConnector(cfg, KVConnectorRole.SCHEDULER)
    worker = KVStageConnector(cfg, KVConnectorRole.WORKER)
    worker.register_kv_caches({"l0": np.zeros((2, 8, 16, 2, 8), dtype=np.float16)})
    try:
        for rid in ("r1", "r2"):
            req = types.SimpleNamespace(request_id=rid, prompt_token_ids=[1] * 20,
                                        kv_transfer_params={"do_remote_decode": True},
                                        status=types.SimpleNamespace(name="FINISHED_LENGTH_CAPPED"))
            assert sched.request_finished(req, [0, 1] if rid == "r1" else [2, 3])[0]
        worker.bind_connector_metadata(sched.build_connector_meta(None))
        worker.start_load_kv(None)
        sent, recvd = worker.get_finished(set())
        # r1 holds the only room (its decode never comes); r2 found none.
        assert sent == {"r2"} and recvd is None, (sent, recvd)
        assert [r[0] for r in worker._rooms.values()] == ["r1"], worker._rooms
    finally:
        worker.shutdown()


def test_vllm_scheduler_side_without_transfer_params():
    """A request that is not a disaggregated one is left to vLLM."""
    sched = KVStageConnector(config(kv_role="kv_consumer", kv_port=0),
                             KVConnectorRole.SCHEDULER)
    req = types.SimpleNamespace(request_id="r", prompt_token_ids=[1] * 40,
                                kv_transfer_params=None)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, None, 0)
    assert sched.request_finished(req, [1, 2, 3]) == (False, None)
    req.kv_transfer_params = {"do_remote_prefill": True, "kvstage_room": 5}
    assert sched.get_num_new_matched_tokens(req, 16) == (24, True)

    class Blocks:
        def get_block_ids(self):
            return ([1, 2, 3],)
    with pytest.raises(kvstage.KvstageError) as e:
        sched.update_state_after_alloc(req, Blocks(), 24)
    assert "kv_transfer_params lack kvstage_instance, kvstage_addresses" in e.value.message
