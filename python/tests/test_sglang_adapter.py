"""test_sglang_adapter.py - kvstage.sglang, the sglang transfer backend,
driven as sglang's schedulers drive one (sglang_engine.py), in real
processes over libfabric tcp on 127.0.0.1 with torch CPU tensors:

- two prefill instances of different shape, A (TP 2) and B (TP 1, DP 2:
  requests go to attention group bootstrap_room % 2), into one decode (TP
  1), each found through its HTTP bootstrap server, asked once and cached;
  chunked sends, metadata items; every byte of the decode's pool and every
  metadata item checked (untouched pages stay zero);
- both receiver interfaces of sglang, request by request: init(kv_indices,
  aux_index), and the newer init(prefill_dp_rank) + send_metadata(...,
  decode_prefix_len) with one request's first 2 pages cached on the
  decode (not moved: the senders' get_transfer_metric() bytes say so);
  a DP rank the prefill lacks and state buffers are refused by name;
- an abort on the decode fails the request on both sides (KVS_ECANCELED);
- B killed (SIGKILL) while it holds two requests: exactly those fail on
  the decode, within a bound, never hang; a request A sends after the kill
  arrives whole; a new request naming B fails at once;
- the backend's own refusals (bad options, bad registrations, no pool),
  each naming what to change.

ctest python_sglang (TIMEOUT in CMakeLists.txt)."""

import json
import os
import types

import pytest

import kvstage
import kvstage.sglang as ks
from kvstage.sglang import bootstrap as ks_bootstrap
from engine_procs import need_ofi_and_torch, run_with_kill

HERE = os.path.dirname(os.path.abspath(__file__))
KILL_BOUND_S = 8  # heartbeat 0.3 s x 2 misses, or the fabric's own EPEER, far under this


def test_sglang_two_prefills_abort_and_kill(tmp_path):
    need_ofi_and_torch("the sglang backend")
    import sglang_engine  # torch: only once the check above passed
    env = dict(os.environ, KVSTAGE_FABRIC="ofi", KVSTAGE_PROVIDER="tcp",
               KVSTAGE_BIND_ADDR="127.0.0.1", KVSTAGE_HEARTBEAT_S="0.3",
               KVSTAGE_HEARTBEAT_MISSES="2", KVSTAGE_BOOTSTRAP_TIMEOUT_S="20",
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(HERE, "sglang_engine.py")

    run_with_kill(script, env, tmp_path, {"A": ["prefill", tmp_path, "A"],
                                          "B": ["prefill", tmp_path, "B"],
                                          "decode": ["decode", tmp_path]})
    dec = json.loads((tmp_path / "decode.json").read_text())
    pre_a = json.loads((tmp_path / "A.json").read_text())
    print("decode", dec, "A", pre_a)
    plan = {int(room): tuple(p) for room, p in dec["plan"].items()}
    assert len(plan) == 8, plan
    for room, (name, _, what) in plan.items():
        got = dec["rooms"][str(room)]
        if what in ("ok", "after_kill"):
            assert got["state"] == ks.KVPoll.Success, (hex(room), got)
        else:
            assert got["state"] == ks.KVPoll.Failed, (hex(room), got)
        if what == "abort":
            assert "KVS_ECANCELED" in got["error"], got
        if what == "held":
            assert "KVS_EPEER" in got["error"] or "offline" in got["error"], got
    # Both A ranks saw their requests through, and the abort as a failure.
    for rank_report in pre_a:
        for room, (name, _, what) in plan.items():
            if name != "A":
                continue
            r = rank_report[str(room)]
            assert r["first_poll"] == ks.KVPoll.WaitingForInput, r
            if what == "abort":
                assert r["final"] == ks.KVPoll.Failed and "KVS_ECANCELED" in r["error"], r
            else:
                assert r["final"] == ks.KVPoll.Success, (hex(room), r)
                # get_transfer_metric: this rank's 2 of 4 heads of the tokens
                # the decode lacked (a cached prefix is not moved)
                n, prefix = plan[room][1], sglang_engine.PREFIX_PAGES.get(room, 0)
                want = (n - prefix) * sglang_engine.PAGE * sglang_engine.LAYERS * 2 * 2 * \
                    sglang_engine.DIM * 2
                latency_s, moved = r["metric"]
                assert moved == want and 0 <= latency_s < 60, (hex(room), r, want)
    # The decode asked each bootstrap server once while both were up.
    assert dec["fetches_before_kill"] == {"A": 1, "B": 1}, dec
    assert dec["held_failed_after_s"] < KILL_BOUND_S, dec
    assert dec["late_failed_after_s"] < 3, dec
    assert dec["checked_bytes"] > 0
    assert "init: prefill_dp_rank 1, but the prefill at 127.0.0.1:" in dec["refused"]["dp"], dec
    assert "has 1 attention DP group(s)" in dec["refused"]["dp"], dec
    assert "state_indices ['ndarray']: this backend moves KV pages only" in \
        dec["refused"]["state"], dec


# ---- the backend's refusals, in this process ---------------------------------------------

def test_sglang_options_name_the_variable(monkeypatch):
    monkeypatch.setenv("KVSTAGE_HEARTBEAT_S", "soon")
    with pytest.raises(kvstage.KvstageError) as e:
        ks.options()
    assert "KVSTAGE_HEARTBEAT_S='soon': give seconds" in e.value.message, e.value
    monkeypatch.setenv("KVSTAGE_HEARTBEAT_S", "0")
    with pytest.raises(kvstage.KvstageError) as e:
        ks.options()
    assert "heartbeat_s (KVSTAGE_HEARTBEAT_S): 0.0: give seconds > 0" in e.value.message
    monkeypatch.delenv("KVSTAGE_HEARTBEAT_S")
    with pytest.raises(kvstage.KvstageError) as e:
        ks.options({"heartbeat": 1})
    assert "heartbeat: not kvstage sglang options" in e.value.message, e.value
    assert ks.options({"heartbeat_s": 2.5})["heartbeat_s"] == 2.5


def test_sglang_bootstrap_server_checks_registrations():
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    try:
        addr = "127.0.0.1:%d" % server.port
        assert ks_bootstrap.healthy(addr, 2)
        with pytest.raises(kvstage.KvstageError) as e:
            ks_bootstrap.fetch_layout(addr, 0.2)
        assert "no prefill rank registered yet" in e.value.message, e.value
        good = dict(tp_rank=0, dp_rank=0, tp_size=2, dp_size=1, page_size=16,
                    address="127.0.0.1:5000")
        ks_bootstrap.register(addr, good, 2)
        with pytest.raises(kvstage.KvstageError) as e:
            ks_bootstrap.fetch_layout(addr, 0.2)
        assert "1 of 2 prefill ranks registered" in e.value.message, e.value
        for bad, needle in ((dict(good, tp_rank=2), "tp_rank 2 / dp_rank 0: outside"),
                            (dict(good, tp_rank=1, page_size=32),
                             "page_size: 32 but rank (dp 0, tp 0) registered 16"),
                            (dict(good, address=5), "address: 5: give the rank's fabric"),
                            (dict(good, dp_size=0), "dp_size: 0: give an integer >= 1")):
            with pytest.raises(kvstage.KvstageError) as e:
                ks_bootstrap.register(addr, bad, 2)
            assert needle in e.value.message, e.value
        ks_bootstrap.register(addr, dict(good, tp_rank=1, address="127.0.0.1:5001"), 2)
        assert ks_bootstrap.instance_of(addr, 1) == server.instance_id < 1 << 63
        assert ks_bootstrap.fetch_layout(addr, 1) == {
            "instance": server.instance_id, "tp_size": 2, "dp_size": 1, "page_size": 16,
            "addresses": ["127.0.0.1:5000", "127.0.0.1:5001"]}
    finally:
        server.close()
    assert not ks_bootstrap.healthy(addr, 0.5)


def test_sglang_manager_refusals():
    args = ks.KVArgs()
    args.engine_rank = 0
    args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = [1], [8], []
    sa = types.SimpleNamespace(tp_size=1, dp_size=1)
    with pytest.raises(kvstage.KvstageError) as e:
        ks.KVManager(args, "prefill", sa)
    assert "aux_data_ptrs, aux_data_lens and aux_item_lens have 1, 1 and 0" in e.value.message
    args.aux_data_ptrs, args.aux_data_lens = [], []
    with pytest.raises(kvstage.KvstageError) as e:
        ks.KVManager(args, "encode", sa)
    assert "disaggregation_mode: 'encode'" in e.value.message, e.value
    with pytest.raises(kvstage.KvstageError) as e:
        ks.KVManager(args, "prefill", sa, is_mla_backend=True)
    assert "MHA pools (k_buffer, v_buffer) only" in e.value.message, e.value
    mgr = ks.KVManager(args, "decode", sa)
    with pytest.raises(kvstage.KvstageError) as e:
        ks.KVReceiver(mgr, "127.0.0.1:1", 5)
    assert "call set_kv_buffer_tensors(k_buffers, v_buffers, page_size) first" \
        in e.value.message, e.value


def test_sglang_backend_provider_maps_class_types():
    backend = ks.KVStageBackend()
    kinds = types.SimpleNamespace(MANAGER=types.SimpleNamespace(value="manager"))
    assert backend.get_kv_class(kinds.MANAGER) is ks.KVManager
    assert backend.get_kv_class("sender") is ks.KVSender
    assert backend.get_kv_class("receiver") is ks.KVReceiver
    assert backend.get_kv_class("bootstrap_server") is ks.KVBootstrapServer
    assert backend.get_kv_class("kvargs") is ks.KVArgs
    assert backend.get_kv_class("something_else") is None
