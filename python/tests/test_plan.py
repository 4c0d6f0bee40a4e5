"""test_plan.py - kvstage.plan() gives the numbers `kvstage plan --json`
prints for the same input (the CLI is checked against an independent model
in tests/plan_model.py), over models, explicit shapes, both TP directions,
the direct path, replicated heads, pipeline stages and partial chunks; and
bad input raises KvstageError with the right status and a message naming
the argument."""

import pytest

import kvstage

# (plan() keywords, the same as `kvstage plan` flags)
CASES = [
    (dict(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1),
     ["--model", "llama-3.1-70b", "--prefill-tp", 8, "--decode-tp", 2]),
    (dict(model="llama-3.1-8b", prefill_tp=2, decode_tp=8, page_size=16,
          chunk_tokens=512, tokens=100),
     ["--model", "llama-3.1-8b", "--prefill-tp", 2, "--decode-tp", 8,
      "--page-size", 16, "--chunk-tokens", 512, "--tokens", 100]),
    (dict(model="qwen2.5-1.5b", prefill_tp=8, decode_tp=4, page_size=16),
     ["--model", "qwen2.5-1.5b", "--prefill-tp", 8, "--decode-tp", 4,
      "--page-size", 16]),
    (dict(model="qwen2.5-7b", prefill_tp=4, decode_tp=4, page_size=16),
     ["--model", "qwen2.5-7b", "--prefill-tp", 4, "--decode-tp", 4,
      "--page-size", 16]),
    (dict(total_heads=16, head_dim=64, layers=24, dtype="fp8", page_size=32,
          prefill_tp=4, decode_tp=1, prefill_pp=2, decode_pp=2, chunk_tokens=1024),
     ["--kv-heads", 16, "--head-dim", 64, "--layers", 24, "--dtype", "fp8",
      "--page-size", 32, "--prefill-tp", 4, "--decode-tp", 1, "--prefill-pp", 2,
      "--decode-pp", 2, "--chunk-tokens", 1024]),
    (dict(model="llama-3.1-405b", layers=42, dtype="fp32", prefill_tp=16,
          decode_tp=4, page_size=64, prefill_pp=3),
     ["--model", "llama-3.1-405b", "--layers", 42, "--dtype", "fp32",
      "--prefill-tp", 16, "--decode-tp", 4, "--page-size", 64, "--prefill-pp", 3]),
    # MLA: one latent per token, one writer per decode rank (docs/kinds/mla.md).
    (dict(model="deepseek-v3", prefill_tp=8, decode_tp=2, page_size=64),
     ["--model", "deepseek-v3", "--prefill-tp", 8, "--decode-tp", 2, "--page-size", 64]),
    (dict(kind="mla", head_dim=576, layers=12, prefill_tp=2, decode_tp=4, page_size=16,
          prefill_pp=2),
     ["--mla-latent-dim", 576, "--layers", 12, "--prefill-tp", 2, "--decode-tp", 4,
      "--page-size", 16, "--prefill-pp", 2]),
    # Different page sizes (docs/kinds/page-sizes.md): the grid is a multiple
    # of lcm(16, 64) and of lcm(48, 32) = 96, chunk_pages the decode's pages.
    (dict(model="llama-3.1-8b", prefill_tp=4, decode_tp=2, page_size=16,
          decode_page_size=64, chunk_tokens=512),
     ["--model", "llama-3.1-8b", "--prefill-tp", 4, "--decode-tp", 2, "--page-size", 16,
      "--decode-page-size", 64, "--chunk-tokens", 512]),
    (dict(model="llama-3.1-8b", prefill_tp=2, decode_tp=2, page_size=48,
          decode_page_size=32, chunk_tokens=192),
     ["--model", "llama-3.1-8b", "--prefill-tp", 2, "--decode-tp", 2, "--page-size", 48,
      "--decode-page-size", 32, "--chunk-tokens", 192]),
    # Prefill context parallelism (docs/kinds/context-parallel.md): the CP
    # ranges and each chunk's CP parts and writers, GQA with PP and MLA.
    (dict(model="llama-3.1-70b", prefill_tp=4, decode_tp=2, page_size=16,
          chunk_tokens=4096, prefill_cp=2, request_tokens=10000, prefill_pp=2),
     ["--model", "llama-3.1-70b", "--prefill-tp", 4, "--decode-tp", 2, "--page-size", 16,
      "--chunk-tokens", 4096, "--prefill-cp", 2, "--request-tokens", 10000,
      "--prefill-pp", 2]),
    (dict(model="deepseek-v3", prefill_tp=2, decode_tp=4, page_size=64, prefill_cp=4,
          chunk_tokens=1024),
     ["--model", "deepseek-v3", "--prefill-tp", 2, "--decode-tp", 4, "--page-size", 64,
      "--prefill-cp", 4, "--chunk-tokens", 1024]),
    # FP8 scale planes ride in each layer slot (docs/kinds/fp8-scales.md).
    (dict(model="llama-3.1-70b", dtype="fp8", kv_scales="per-token", prefill_tp=8,
          decode_tp=2, page_size=16),
     ["--model", "llama-3.1-70b", "--dtype", "fp8", "--kv-scales", "per-token",
      "--prefill-tp", 8, "--decode-tp", 2, "--page-size", 16]),
    (dict(model="llama-3.1-8b", dtype="fp8", kv_scales="per-block:64", prefill_tp=2,
          decode_tp=4, page_size=16, prefill_pp=2, tokens=100),
     ["--model", "llama-3.1-8b", "--dtype", "fp8", "--kv-scales", "per-block:64",
      "--prefill-tp", 2, "--decode-tp", 4, "--page-size", 16, "--prefill-pp", 2,
      "--tokens", 100]),
    # Hybrid models (docs/kinds/hybrid.md): window layers send the last
    # window's rows, state layers a per-request state in the last chunk.
    (dict(model="gpt-oss-120b", prefill_tp=4, decode_tp=8, page_size=16,
          chunk_tokens=2048, tokens=1808, request_tokens=10000),
     ["--model", "gpt-oss-120b", "--prefill-tp", 4, "--decode-tp", 8, "--page-size", 16,
      "--chunk-tokens", 2048, "--tokens", 1808, "--request-tokens", 10000]),
    (dict(model="qwen3-next-80b-a3b", prefill_tp=8, decode_tp=2, page_size=16,
          prefill_pp=2, decode_pp=2),
     ["--model", "qwen3-next-80b-a3b", "--prefill-tp", 8, "--decode-tp", 2,
      "--page-size", 16, "--prefill-pp", 2, "--decode-pp", 2]),
    (dict(total_heads=8, head_dim=128, layers=10, prefill_tp=2, decode_tp=4, page_size=16,
          chunk_tokens=512, full_attn_every=5, state_heads=8, state_bytes=(1024, 8192)),
     ["--kv-heads", 8, "--head-dim", 128, "--layers", 10, "--prefill-tp", 2,
      "--decode-tp", 4, "--page-size", 16, "--chunk-tokens", 512, "--full-attn-every", 5,
      "--state-heads", 8, "--state-bytes", "1024+8192"]),
    # Draft KV (docs/kinds/draft.md): an EAGLE layer of the model's shape, a
    # standalone draft of its own head dim, DeepSeek's MTP latent with CP.
    (dict(model="llama-3.1-8b", prefill_tp=4, decode_tp=2, page_size=16, draft_layers=1),
     ["--model", "llama-3.1-8b", "--prefill-tp", 4, "--decode-tp", 2, "--page-size", 16,
      "--draft-layers", 1]),
    (dict(model="llama-3.1-70b", prefill_tp=2, decode_tp=8, page_size=16, tokens=100,
          draft_layers=16, draft_head_dim=64, draft_kv_heads=8),
     ["--model", "llama-3.1-70b", "--prefill-tp", 2, "--decode-tp", 8, "--page-size", 16,
      "--tokens", 100, "--draft-layers", 16, "--draft-head-dim", 64,
      "--draft-kv-heads", 8]),
    (dict(model="deepseek-v3", prefill_tp=8, decode_tp=4, page_size=64, prefill_cp=2,
          chunk_tokens=1024, draft_layers=1),
     ["--model", "deepseek-v3", "--prefill-tp", 8, "--decode-tp", 4, "--page-size", 64,
      "--prefill-cp", 2, "--chunk-tokens", 1024, "--draft-layers", 1]),
    # Uneven pipeline splits (spec §4): 80 layers over 3 stages, 26 / 27 / 27.
    (dict(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=16,
          prefill_pp=3),
     ["--model", "llama-3.1-70b", "--prefill-tp", 8, "--decode-tp", 2,
      "--page-size", 16, "--prefill-pp", 3]),
    (dict(model="llama-3.1-70b", prefill_tp=2, decode_tp=8, page_size=16,
          prefill_pp=3, decode_pp=3, tokens=100),
     ["--model", "llama-3.1-70b", "--prefill-tp", 2, "--decode-tp", 8,
      "--page-size", 16, "--prefill-pp", 3, "--decode-pp", 3, "--tokens", 100]),
]


@pytest.mark.parametrize("kwargs,flags", CASES,
                         ids=[" ".join(map(str, f)) for _, f in CASES])
def test_plan_equals_cli_json(cli, kwargs, flags):
    got = kvstage.plan(**kwargs)
    want = cli("plan", *flags)
    # Every key the two share holds the same value; the CLI's ring advice
    # (ring_*, chunks_in_ring, ...) is the CLI's own and not in plan().
    shared = set(got) & set(want)
    assert shared >= {"model", "total_heads", "head_dim", "dtype", "elem_bytes",
                      "layers", "page_size", "prefill_tp", "decode_tp",
                      "prefill_pp", "decode_pp", "chunk_tokens", "grid_tokens",
                      "chunk_pages", "tokens", "path", "src_heads", "dst_heads",
                      "decode_layers", "prefill_layers", "tp_writers",
                      "expected_arrivals", "targets_per_prefill", "decode_ranks",
                      "prefill_stages", "decode_stages", "kv_kind", "planes",
                      "tp_sources", "decode_page_size", "prefill_cp", "kv_scales",
                      "scale_block", "scale_bytes", "draft_layers", "draft_head_dim",
                      "draft_part_bytes"}
    if kwargs.get("draft_layers"):
        assert got["draft_part_bytes"] > 0
    if kwargs.get("prefill_cp", 1) > 1:
        assert "context_parallel" in shared
    for key in sorted(shared):
        assert got[key] == want[key], key
    if want["path"] == "staging":
        assert got["max_region_bytes"] == want["max_region_bytes"] > 0
    else:
        assert got["max_region_bytes"] == 0


def test_plan_llama70_numbers():
    """docs/cli.md's `kvstage plan` example, by hand: 8 KV heads at TP 8 -> 2 give 4
    one-head writers of 8192 * 128 * 2 * 80 * 2 bytes per decode rank."""
    p = kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1)
    assert p["tp_writers"] == 4
    assert p["max_region_bytes"] == 4 * 8192 * 128 * 2 * 80 * 2 == 1342177280
    w = p["decode_ranks"][1]["writers"]
    assert [x["prefill_rank"] for x in w] == [4, 5, 6, 7]
    assert [x["offset"] for x in w] == [i * 335544320 for i in range(4)]


def test_plan_uneven_pipeline_split():
    """80 layers over 3 stages: the last two hold one layer more (spec §4);
    decode stage e's regions hold its own layers."""
    p = kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1,
                     prefill_pp=3, decode_pp=3)
    assert [(st["first_layer"], st["num_layers"]) for st in p["prefill_stages"]] == \
        [(0, 26), (26, 27), (53, 27)]
    assert [st["region_bytes"] for st in p["decode_stages"]] == \
        [4 * 8192 * 128 * 2 * n * 2 for n in (26, 27, 27)]
    assert p["max_region_bytes"] == p["decode_stages"][2]["region_bytes"]
    assert (p["prefill_layers"], p["decode_layers"], p["expected_arrivals"]) == (27, 27, 4)
    p = kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1,
                     prefill_pp=3)
    assert p["decode_stages"] == [{"stage": 0, "first_layer": 0, "num_layers": 80,
                                   "region_bytes": 1342177280}]
    assert p["expected_arrivals"] == 12


def test_plan_decode_page_size():
    """decode_page_size: 0 or None is page_size's; another gives the lcm
    grid and chunk_pages in decode pages; a chunk not a multiple of both
    sizes is floored to the lcm, and a negative size is refused by name."""
    base = dict(model="llama-3.1-8b", prefill_tp=4, decode_tp=2, page_size=16,
                chunk_tokens=512)
    p = kvstage.plan(**base)
    assert (p["decode_page_size"], p["grid_tokens"], p["chunk_pages"]) == (16, 512, 32)
    assert kvstage.plan(decode_page_size=0, **base)["decode_page_size"] == 16
    p = kvstage.plan(decode_page_size=64, **base)
    assert (p["page_size"], p["decode_page_size"], p["grid_tokens"], p["chunk_pages"]) == \
        (16, 64, 512, 8)
    p = kvstage.plan(**dict(base, page_size=48, decode_page_size=32, chunk_tokens=200))
    assert (p["grid_tokens"], p["chunk_pages"]) == (192, 6)
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.plan(decode_page_size=-1, **base)
    assert "decode_page_size" in str(e.value)


def test_explicit_arguments_override_the_model(cli):
    got = kvstage.plan(model="llama-3.1-70b", layers=40, dtype="fp16",
                       prefill_tp=8, decode_tp=2, page_size=1)
    assert (got["layers"], got["dtype"], got["model"]) == (40, "fp16", "llama-3.1-70b")
    assert got["max_region_bytes"] == 1342177280 // 2


def test_models_lists_the_cli_models():
    names = [m["name"] for m in kvstage.models()]
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-7b",
            "qwen2.5-72b", "qwen2.5-1.5b", "chatglm3-6b"} <= set(names)
    m = {x["name"]: x for x in kvstage.models()}["qwen2.5-7b"]
    assert (m["total_heads"], m["head_dim"], m["layers"], m["dtype"]) == (4, 128, 28, "bf16")


def raises(status, words, **kwargs):
    """plan(**kwargs) raises KvstageError `status` whose message holds
    every one of words."""
    with pytest.raises(kvstage.KvstageError) as info:
        kvstage.plan(**kwargs)
    e = info.value
    assert e.name == status, e
    assert e.code < 0 and kvstage.status_name(e.code) == status
    if status == "KVS_EINVAL":
        assert e.code == -1
    for w in words:
        assert w in e.message, (w, e.message)
    return e


OK = dict(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=16)


def with_(**change):
    kw = dict(OK)
    kw.update(change)
    return kw


def test_bad_sizes_name_the_argument():
    raises("KVS_EINVAL", ["prefill_tp", "> 0"], **with_(prefill_tp=0))
    raises("KVS_EINVAL", ["page_size"], **with_(page_size=0))
    raises("KVS_EINVAL", ["head_dim"], prefill_tp=2, decode_tp=2, page_size=1,
           total_heads=8, layers=4)


def test_sizes_that_do_not_split():
    e = raises("KVS_EHEAD_SPLIT", ["prefill TP 8", "decode TP 3"], **with_(decode_tp=3))
    assert e.code == -16
    raises("KVS_EPP_SPLIT", ["decode PP 3"], **with_(prefill_pp=2, decode_pp=3))
    raises("KVS_EPP_SPLIT", ["2 layers cannot fill 3 prefill stages"],
           **with_(layers=2, prefill_pp=3))
    raises("KVS_ECHUNK", ["chunk_tokens -5"], **with_(chunk_tokens=-5))


def test_context_parallel_arguments():
    raises("KVS_EINVAL", ["prefill_cp", ">= 1"], **with_(prefill_cp=-1))
    raises("KVS_EINVAL", ["request_tokens", "prefill_cp 2 or more"],
           **with_(request_tokens=100))
    raises("KVS_EINVAL", ["request_tokens"], **with_(prefill_cp=2, request_tokens=0))
    # 1000 tokens over CP 4 in pages of 16: 256 each, the last 232
    got = kvstage.plan(**with_(prefill_cp=4, request_tokens=1000, chunk_tokens=512))
    cp = got["context_parallel"]
    assert cp["ranges"] == [[0, 256], [256, 512], [512, 768], [768, 1000]]
    assert [c["arrivals"] for c in cp["chunks"]] == [8, 8]  # 2 CP ranks x 4 writers
    assert [w["writer_index"] for w in cp["chunks"][1]["parts"][1]["writers"]] == \
        [12, 13, 14, 15]


def test_bad_names_and_values():
    raises("KVS_EINVAL", ["model 'gpt-5' is unknown", "llama-3.1-70b"], **with_(model="gpt-5"))
    raises("KVS_EDTYPE", ["dtype 'int4'", "bf16"], **with_(dtype="int4"))
    raises("KVS_EINVAL", ["tokens is 8193", "1..8192"], **with_(tokens=8193))
    raises("KVS_EINVAL", ["tokens is 0"], **with_(tokens=0))
    raises("KVS_EINVAL", ["decode_tp must be > 0 (got -1)"], **with_(decode_tp=-1))
    raises("KVS_EINVAL", ["layers is 'many'", "whole number"], **with_(layers="many"))
    raises("KVS_EINVAL", ["layers is True"], **with_(layers=True))
    raises("KVS_EINVAL", ["prefill_tp is %d" % (1 << 63)], **with_(prefill_tp=1 << 63))


def test_error_carries_code_name_and_message():
    with pytest.raises(kvstage.KvstageError) as info:
        kvstage.plan(**with_(decode_tp=3))
    e = info.value
    assert (e.code, e.name) == (-16, "KVS_EHEAD_SPLIT")
    assert str(e).startswith("KVS_EHEAD_SPLIT (-16): ")
    assert "multiple" in kvstage.strerror(e.code)


def test_plan_kv_scales_refused_by_name():
    """Scale planes need fp8 and a block dividing the head; a bad name is named."""
    with pytest.raises(kvstage.KvstageError, match="kv_scales per-token needs dtype fp8"):
        kvstage.plan("llama-3.1-8b", prefill_tp=2, decode_tp=1, page_size=16,
                     kv_scales="per-token")
    with pytest.raises(kvstage.KvstageError, match="scale_block 48 must divide"):
        kvstage.plan("llama-3.1-8b", prefill_tp=2, decode_tp=1, page_size=16, dtype="fp8",
                     kv_scales="per-block:48")
    with pytest.raises(kvstage.KvstageError, match="kv_scales is 'per-tensor'"):
        kvstage.plan("llama-3.1-8b", prefill_tp=2, decode_tp=1, page_size=16, dtype="fp8",
                     kv_scales="per-tensor")


def test_plan_hybrid_numbers():
    # Qwen3-Next P8 -> D2, one 8192-token chunk: 12 full layers of one head
    # of 256 bf16 (K and V), 36 state layers of 2 state heads of 68608
    # bytes. Prefill 4..7 all hold decode 1's KV head: 4 writes it with its
    # state, 5, 6 and 7 their state alone
    got = kvstage.plan(model="qwen3-next-80b-a3b", prefill_tp=8, decode_tp=2, page_size=1)
    assert got["full_attn_every"] == 4 and got["other_layers"] == "state"
    w = got["decode_ranks"][1]["writers"][0]
    assert w["prefill_rank"] == 4
    assert w["bytes"] == 12 * 8192 * 512 * 2 + 36 * 2 * 68608
    w = got["decode_ranks"][1]["writers"][3]
    assert w["prefill_rank"] == 7
    assert w["bytes"] == 36 * 2 * 68608
    # gpt-oss: only the window's pages of a window layer
    got = kvstage.plan(model="gpt-oss-20b", prefill_tp=2, decode_tp=2, page_size=16,
                       chunk_tokens=1024, request_tokens=5000, tokens=904)
    assert got["window_tokens"] == 128 and got["request_tokens"] == 5000
    # 12 full slots of 904 rows, 12 window slots of 5000 - 4864 = 136 rows
    assert got["decode_ranks"][0]["region_bytes"] == (12 * 904 + 12 * 136) * 4 * 128 * 2
    raises("KVS_EINVAL", ["window_tokens and state_heads"],
           **dict(model="gpt-oss-20b", prefill_tp=2, decode_tp=2, page_size=16,
                  full_attn_every=2, window_tokens=128, state_heads=4))
    raises("KVS_EINVAL", ["request_tokens"],
           **dict(model="gpt-oss-20b", prefill_tp=2, decode_tp=2, page_size=16,
                  request_tokens=10))
    raises("KVS_EHEAD_SPLIT", ["--state-heads"],
           **dict(model="qwen3-next-80b-a3b", prefill_tp=4, decode_tp=2, page_size=16,
                  full_attn_every=4, state_heads=6, state_bytes=100))


def test_plan_draft_refused_by_name():
    """A draft whose heads do not split as the model's, or with scale
    planes, is refused naming the argument; with PP it is planned on the
    last stage (docs/kinds/draft.md)."""
    base = dict(model="llama-3.1-8b", prefill_tp=4, decode_tp=2, page_size=16)
    raises("KVS_ENOTSUP", ["draft_kv_heads 4", "--draft-kv-heads"], draft_layers=1,
           draft_kv_heads=4, **base)
    # with PP the draft is the last stage's: its regions carry it
    got = kvstage.plan(draft_layers=1, prefill_pp=2, decode_pp=2, **base)
    assert got["draft_layers"] == 1 and got["draft_part_bytes"] > 0
    raises("KVS_ENOTSUP", ["kv_scales per-token"], draft_layers=1, prefill_pp=2,
           dtype="fp8", kv_scales="per-token", **base)
    raises("KVS_EINVAL", ["draft_layers is 0"], draft_head_dim=64, **base)
