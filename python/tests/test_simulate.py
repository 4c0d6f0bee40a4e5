"""test_simulate.py - kvstage.simulate() runs the same scenario as
`kvstage sim --json` for the same input (same bytes, same event digest),
every request of a clean run finishes ok, a seed replays a run exactly,
faults go through the CLI's syntax, aux payloads reach every decode rank,
a trace file is written, and bad input raises KvstageError naming the
field."""

import json

import pytest

import kvstage

# Llama-3.1-8B cut to 4 layers, TP 4 -> 2, six short prompts (as
# tests/cli_sim.py's SMALL). simulate() takes the simulator's defaults
# where `kvstage sim` has its own, so both sides spell them out.
SMALL = dict(model="llama-3.1-8b", layers=4, prefill_tp=4, decode_tp=2,
             page_size=16, chunk_tokens=512, requests=6, prompt_min_tokens=64,
             prompt_max_tokens=512, ring_bytes=64 << 20, rate_milli_per_s=20000)
SMALL_FLAGS = ["--model", "llama-3.1-8b", "--layers", 4, "--prefill-tp", 4,
               "--decode-tp", 2, "--page-size", 16, "--chunk-tokens", 512,
               "--requests", 6, "--prompt-tokens", "64:512", "--ring-mib", 64,
               "--rate", 20]

SAME_AS_CLI = ("requests_total", "requests_ok", "requests_failed", "hung_requests",
               "unreported_failures", "bytes_moved", "bytes_verified",
               "corrupt_bytes", "ring_leaked_bytes", "violations", "rdma_ops",
               "control_msgs", "msgs_rejected", "watermark_waits",
               "ring_peak_bytes", "sim_ns", "events", "prefill_ranks",
               "decode_ranks", "path", "posts_refused")


def run(**change):
    kw = dict(SMALL)
    kw.update(change)
    return kvstage.simulate(**kw)


def assert_clean(r, requests):
    assert r["requests_total"] == requests
    assert r["requests_ok"] == requests
    assert r["requests_failed"] == r["hung_requests"] == 0
    assert r["corrupt_bytes"] == r["ring_leaked_bytes"] == r["violations"] == 0
    assert r["bytes_verified"] == r["bytes_moved"] > 0


@pytest.mark.parametrize("path", ["staging", "slice"])
def test_simulate_equals_cli_json(cli, path):
    got = run(path=path)
    want = cli("sim", *SMALL_FLAGS, "--path", path)
    assert_clean(got, 6)
    for key in SAME_AS_CLI:
        assert got[key] == want[key], key
    assert "%016x" % got["digest"] == want["digest"]
    for key in ("goodput_gbps", "line_rate_gbps", "latency_p50_us",
                "latency_p99_us", "e2e_p50_us", "e2e_p99_us"):
        assert got[key] == pytest.approx(want[key], abs=1e-3), key
    assert got["path"] == path


def test_direct_path_and_pipeline_stages(cli):
    kw = dict(prefill_tp=2, decode_tp=2, prefill_pp=2, decode_pp=2, requests=3)
    got = run(**kw)
    flags = ["--model", "llama-3.1-8b", "--layers", 4, "--prefill-tp", 2,
             "--decode-tp", 2, "--prefill-pp", 2, "--decode-pp", 2,
             "--page-size", 16, "--chunk-tokens", 512, "--requests", 3,
             "--prompt-tokens", "64:512", "--ring-mib", 64, "--rate", 20]
    want = cli("sim", *flags)
    assert_clean(got, 3)
    assert got["path"] == want["path"] == "direct"
    assert (got["prefill_ranks"], got["decode_ranks"]) == (4, 4)
    assert "%016x" % got["digest"] == want["digest"]


@pytest.mark.parametrize("ps,dps,path", [(16, 64, "staging"), (64, 16, "slice")])
def test_decode_page_size_equals_cli(cli, ps, dps, path):
    """decode_page_size: the decode's pool in pages of another size, every
    byte verified, the same run as `kvstage sim --decode-page-size`."""
    got = run(page_size=ps, decode_page_size=dps, path=path, requests=4)
    flags = list(SMALL_FLAGS)
    flags[flags.index("--page-size") + 1] = ps
    flags[flags.index("--requests") + 1] = 4
    want = cli("sim", *flags, "--decode-page-size", dps, "--path", path)
    assert_clean(got, 4)
    for key in SAME_AS_CLI:
        assert got[key] == want[key], key
    assert "%016x" % got["digest"] == want["digest"]
    # The size reaches the managers: with staging, a chunk that is no whole
    # number of the decode's pages is refused, naming both sizes.
    raises("KVS_ECHUNK", ["peer's page size 48", "page_size %d" % ps],
           page_size=ps, decode_page_size=48, path="staging", requests=4)
@pytest.mark.parametrize("scales", ["per-token", "per-block:64"])
def test_fp8_scale_planes_equal_cli(cli, scales):
    """kv_scales moves and verifies every scale slot, as `kvstage sim --kv-scales`."""
    got = run(dtype="fp8", kv_scales=scales)
    want = cli("sim", *SMALL_FLAGS, "--dtype", "fp8", "--kv-scales", scales)
    assert_clean(got, 6)
    for key in SAME_AS_CLI:
        assert got[key] == want[key], key
    assert "%016x" % got["digest"] == want["digest"]
    plain = run(dtype="fp8")
    per_head = 4 if scales == "per-token" else 2  # fp32, or 128 / 64 e8m0 bytes
    assert got["bytes_verified"] * 128 == plain["bytes_verified"] * (128 + per_head)
    with pytest.raises(kvstage.KvstageError, match="kv_scales"):
        run(kv_scales=scales)  # bf16: scale planes belong to an fp8 cache


def test_prefill_context_parallel_equals_cli(cli):
    """prefill_cp: CP ranks each hold one token range of a request and write
    it into the decode's regions, every byte verified, the same run as
    `kvstage sim --prefill-cp` (docs/kinds/context-parallel.md)."""
    got = run(prefill_cp=2)
    want = cli("sim", *SMALL_FLAGS, "--prefill-cp", 2)
    assert_clean(got, 6)
    for key in SAME_AS_CLI:
        assert got[key] == want[key], key
    assert "%016x" % got["digest"] == want["digest"]
    assert got["prefill_ranks"] == 8
    assert got["bytes_verified"] == run()["bytes_verified"]
    # Equal TP takes the direct path, which moves CP too.
    direct = run(prefill_tp=2, decode_tp=2, prefill_cp=2, requests=2)
    assert_clean(direct, 2)
    assert direct["path"] == "direct"


def test_cluster_equals_cli(cli):
    """A cluster (lists of TP sizes, one per instance) runs as `kvstage sim`
    with comma lists: same digest, same per-instance counts."""
    got = run(prefill_tp=[4, 2, 4], decode_tp=[2, 1], requests=8, router="least-loaded")
    flags = [f for f in SMALL_FLAGS]
    flags[flags.index("--prefill-tp") + 1] = "4,2,4"
    flags[flags.index("--decode-tp") + 1] = "2,1"
    flags[flags.index("--requests") + 1] = 8
    want = cli("sim", *flags, "--router", "least-loaded")
    assert_clean(got, 8)
    assert got["collateral_failures"] == 0
    assert "%016x" % got["digest"] == want["digest"]
    # The CLI prints the metrics' doubles to fixed decimals: equal to them.
    assert [dict(i, metrics=None) for i in got["instances"]] == \
        [dict(i, metrics=None) for i in want["instances"]]
    for g, w in zip(got["instances"], want["instances"]):
        assert g["metrics"] == pytest.approx(w["metrics"], rel=1e-6, abs=1e-3)
    assert [(i["role"], i["id"], i["tp"]) for i in got["instances"]] == [
        ("prefill", 0, 4), ("prefill", 1, 2), ("prefill", 2, 4),
        ("decode", 0, 2), ("decode", 1, 1)]
    assert sum(i["requests_ok"] for i in got["instances"] if i["role"] == "prefill") == 8
    assert sum(i["requests_ok"] for i in got["instances"] if i["role"] == "decode") == 8
    # One instance per side is the single-instance run, instances listed.
    one = run()
    assert [(i["role"], i["tp"], i["requests_ok"]) for i in one["instances"]] == [
        ("prefill", 4, 6), ("decode", 2, 6)]


def test_seed_replays_exactly():
    a, b, c = run(seed=7), run(seed=7), run(seed=8)
    assert a == b
    assert a["digest"] != c["digest"]


def test_faults_use_the_cli_syntax(cli):
    faults = ["dup:any:0.3", "delay:watermark:0.5:200"]
    got = run(faults=faults)
    want = cli("sim", *SMALL_FLAGS, "--fault", faults[0], "--fault", faults[1])
    assert got["msgs_duplicate"] > 0  # dropped by the links
    assert_clean(got, 6)
    assert "%016x" % got["digest"] == want["digest"]
    # Dropped messages are sent again: every request still succeeds.
    r = run(faults="drop:any:0.05", stall_timeout_ns=2 * 10**9)
    assert r["hung_requests"] == r["violations"] == 0
    assert r["requests_ok"] == r["requests_total"] == 6
    assert r["msgs_retransmitted"] > 0
    # A rank whose HBM is full says what to change; the run goes on without it.
    r = run(faults="hbm-full:d0", stall_timeout_ns=2 * 10**8)
    assert r["ranks_down_at_start"] == 1 and r["violations"] == 0
    assert "--ring-mib" in r["init_error"]


def test_send_queue_depth(cli):
    """net_sq_depth is `kvstage sim --sq-depth`: posts beyond it are refused
    and posted again, so every request still succeeds, same digest as the
    CLI."""
    got = run(net_sq_depth=1)
    want = cli("sim", *SMALL_FLAGS, "--sq-depth", 1)
    assert_clean(got, 6)
    assert got["posts_refused"] == want["posts_refused"] > 0
    assert "%016x" % got["digest"] == want["digest"]
    assert run()["posts_refused"] == 0  # unlimited by default


def test_aux_payloads(cli):
    """max_aux_bytes is `kvstage sim --aux-bytes`: every request's aux
    payload reaches both decode ranks, checked byte for byte; the KV bytes
    are as without aux, and the digest is the CLI's."""
    got = run(max_aux_bytes=9000)
    want = cli("sim", *SMALL_FLAGS, "--aux-bytes", 9000)
    assert_clean(got, 6)
    for key in ("aux_bytes_verified", "aux_corrupt_bytes", "bytes_verified"):
        assert got[key] == want[key], key
    assert "%016x" % got["digest"] == want["digest"]
    # Six requests, two decode ranks: none, 1..256, 4500..9000, 9000, none,
    # 1..256 bytes each (sim/kvdata.h).
    assert 2 * (9000 + 4500 + 2) <= got["aux_bytes_verified"] <= 2 * (2 * 9000 + 512)
    assert got["aux_corrupt_bytes"] == 0
    none = run()
    assert none["aux_bytes_verified"] == none["aux_corrupt_bytes"] == 0
    assert got["bytes_verified"] == none["bytes_verified"]


def test_trace_file_is_written(tmp_path):
    trace = tmp_path / "run.json"
    run(requests=2, trace_path=trace)
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("name") == "gather" for e in events)


def raises(status, words, **change):
    with pytest.raises(kvstage.KvstageError) as info:
        run(**change)
    e = info.value
    assert e.name == status and kvstage.status_name(e.code) == status, e
    for w in words:
        assert w in e.message, (w, e.message)
    return e


def test_bad_fields_are_named():
    e = raises("KVS_EINVAL", ["prefill_tp is 0", "1..1024"], prefill_tp=0)
    assert e.code == -1
    raises("KVS_EINVAL", ["requests is 2000000"], requests=2_000_000)
    raises("KVS_EINVAL", ["requests is -1"], requests=-1)
    raises("KVS_EINVAL", ["prompt_min_tokens 600", "prompt_max_tokens 512"],
           prompt_min_tokens=600)
    raises("KVS_EINVAL", ["ring_bytes"], ring_bytes=1 << 60)
    raises("KVS_EINVAL", ["path direct needs equal TP sizes"], path="direct")
    raises("KVS_EINVAL", ["path 'fast'"], path="fast")
    raises("KVS_EHEAD_SPLIT", ["decode TP 3"], decode_tp=3)
    raises("KVS_EDTYPE", ["dtype 'int4'"], dtype="int4")
    raises("KVS_ECHUNK", ["chunk_tokens 100", "page_size 16"], chunk_tokens=100)
    raises("KVS_EINVAL", ["seed is -1"], seed=-1)
    raises("KVS_EINVAL", ["net_sq_depth is 65536", "0..65535"], net_sq_depth=65536)
    raises("KVS_EINVAL", ["prefill_pp has 2 values for 3 prefill instances"],
           prefill_tp=[4, 4, 2], prefill_pp=[1, 2])
    raises("KVS_EPP_SPLIT", ["decode instance 1 (PP 2)", "prefill instance 0 (PP 1)"],
           decode_tp=[2, 2], decode_pp=[1, 2])
    raises("KVS_EHEAD_SPLIT", ["prefill instance 1 (TP 3"], prefill_tp=[4, 3])
    raises("KVS_EINVAL", ["router is 'random'"], router="random")
    raises("KVS_EINVAL", ["max_aux_bytes is 1048577", "0..1048576"],
           max_aux_bytes=(1 << 20) + 1)
    raises("KVS_EINVAL", ["max_aux_bytes is -1"], max_aux_bytes=-1)


def test_bad_faults_are_named():
    raises("KVS_EINVAL", ["faults[1] 'drop:bogus:0.1'", "unknown message type"],
           faults=["dup:any:0.1", "drop:bogus:0.1"])
    raises("KVS_EINVAL", ["faults[0] 'link-down:p9:1:1'", "RANK"],
           faults=["link-down:p9:1:1"])
    raises("KVS_EINVAL", ["faults has 17 entries"], faults=["dup:any:0.1"] * 17)
    raises("KVS_EINVAL", ["faults[0] is 3"], faults=[3])
    raises("KVS_EINVAL", ["faults[0] 'crash:prefill@1:0:10'", "prefill[@<instance>]"],
           faults=["crash:prefill@1:0:10"])


def test_unknown_argument_is_a_type_error():
    with pytest.raises(TypeError, match="ring_mib"):
        run(ring_mib=64)


def _cli_json(*args):
    """`kvstage sim ARGS --json`, whatever its exit status: (status, dict)."""
    import os
    import subprocess
    binary = os.environ["KVSTAGE_CLI"]
    res = subprocess.run([binary, "sim"] + [str(a) for a in args] + ["--json"],
                         capture_output=True, text=True, timeout=300)
    return res.returncode, json.loads(res.stdout)


@pytest.mark.parametrize("extra,change,ok", [
    # A crash fails the requests of its instance: failures, yet no violation.
    (["--fault", "crash:prefill:0:2000"], dict(faults="crash:prefill:0:2000"), True),
    # A stall timeout far below the run's own waits, no fault: every request
    # fails although nothing struck it, a violation for all three.
    (["--stall-timeout-ms", 1], dict(stall_timeout_ns=10**6), False),
])
def test_one_verdict_with_the_cli(extra, change, ok):
    """The library's verdict (the report's ok), simulate()'s and the CLI's
    (its exit status and --json ok) are one, with the same failures."""
    got = run(**change)
    status, want = _cli_json(*SMALL_FLAGS, *extra)
    assert got["ok"] is ok and want["ok"] is ok
    assert status == (0 if ok else 1)
    assert got["violations"] == want["violations"]
    assert (got["violations"] == 0) is ok
    assert got["requests_failed"] == want["requests_failed"] > 0
    assert got["failures"] == want["failures"]
    assert sum(f["count"] for f in got["failures"].values()) == got["requests_failed"]
    for f in got["failures"].values():
        assert f["first_detail"].startswith("request ")


def test_a_ring_too_small_is_refused_before_the_run():
    """A ring below the largest region of the workload: KVS_EOVERSIZED before
    anything runs, naming ring_bytes and the size it needs."""
    with pytest.raises(kvstage.KvstageError) as exc:
        run(ring_bytes=1 << 20)
    assert exc.value.name == "KVS_EOVERSIZED"
    assert "ring_bytes" in str(exc.value) and "at least" in str(exc.value)


def test_hybrid_models_move_on_the_staging_path():
    """gpt-oss's window layers and Qwen3-Next's state layers (or the same
    pattern given as fields) move on the staging path, with and without
    prefill CP, every window row and
    state byte verified, both data modes the same run, as the CLI's; the
    direct path refuses them by name (docs/kinds/hybrid.md)."""
    for model, flags, change in (
            ("gpt-oss-20b", [], {}),
            ("qwen3-next-80b-a3b", [], {}),
            ("llama-3.1-8b", ["--full-attn-every", 4, "--state-heads", 8,
                              "--state-bytes", "64+192"],
             dict(full_attn_every=4, state_heads=8, state_bytes=(64, 192))),
            # with prefill CP: the state from the CP rank of the last token
            ("qwen3-next-80b-a3b", ["--prefill-cp", 2], dict(prefill_cp=2)),
            ("gpt-oss-20b", ["--prefill-cp", 3], dict(prefill_cp=3))):
        r = run(model=model, **change)
        assert r["requests_ok"] == 6 and r["ok"] is True
        assert r["corrupt_bytes"] == r["ring_leaked_bytes"] == r["violations"] == 0
        # Qwen3-Next's 2 KV heads over TP 4: replicas write the same rows
        assert 0 < r["bytes_verified"] <= r["bytes_moved"]
        assert r["path"] == "staging"
        p = run(model=model, data="provenance", **change)
        assert p["digest"] == r["digest"] and p["corrupt_bytes"] == 0
        _, want = _cli_json(*[model if a == "llama-3.1-8b" else a for a in SMALL_FLAGS],
                            *flags)
        for key in SAME_AS_CLI:
            assert r[key] == want[key], (model, key)
    raises("KVS_EINVAL", ["does not move hybrid layers", "staging"],
           model="gpt-oss-20b", prefill_tp=2, decode_tp=2, path="direct")
    raises("KVS_EINVAL", ["window_tokens and state_heads"], full_attn_every=2,
           window_tokens=64, state_heads=4, state_bytes=8)




def test_draft_layers_move_on_the_staging_path():
    """A draft model's layers (draft_layers, draft_head_dim; docs/kinds/
    draft.md) move in the same writes as the model's, every draft byte
    verified, both data modes the same run, as the CLI's; the direct path
    refuses them by name."""
    plain = run()
    r = run(draft_layers=2, draft_head_dim=64)
    assert_clean(r, 6)
    assert r["path"] == "staging" and r["rdma_ops"] == plain["rdma_ops"]
    assert r["bytes_verified"] > plain["bytes_verified"]
    p = run(draft_layers=2, draft_head_dim=64, data="provenance")
    assert p["digest"] == r["digest"] and p["corrupt_bytes"] == 0
    _, want = _cli_json(*SMALL_FLAGS, "--draft-layers", 2, "--draft-head-dim", 64)
    for key in SAME_AS_CLI:
        assert r[key] == want[key], key
    raises("KVS_EINVAL", ["path direct does not move a draft", "use path staging"],
           draft_layers=1, prefill_tp=2, decode_tp=2,
           path="direct")
