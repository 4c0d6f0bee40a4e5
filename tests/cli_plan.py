#!/usr/bin/env python3
"""cli_plan.py - end-to-end behaviour of the `kvstage` command line: help
and dispatch, `kvstage plan` tables and JSON, built-in models and overrides,
both flag forms, the ring-sizing advice, and that every class of bad input
exits 2 with exactly one stderr line naming the flag to change.

usage: cli_plan.py PATH_TO_KVSTAGE
Prints one line per failure and a summary "cli_plan: N passed, M failed";
exits 1 when anything failed. Python 3 standard library only.
"""

import sys

LLAMA70 = ["--model", "llama-3.1-70b"]


from cli_suite import Suite


def test_help_and_dispatch(s):
    s.expect_ok("--help", ["--help"], ["usage: kvstage", "plan"])
    s.expect_ok("help", ["help"], ["usage: kvstage", "plan"])
    s.expect_ok("help plan", ["help", "plan"], ["usage: kvstage plan",
                                                "llama-3.1-70b"])
    s.expect_ok("plan --help", ["plan", "--help"], ["--prefill-tp",
                                                    "--ring-mib"])
    s.expect_usage_error("unknown command", ["frobnicate"], "frobnicate")
    s.expect_usage_error("help unknown command", ["help", "frob"], "frob")
    res = s.run([])
    s.ok(res.returncode == 2 and "usage" in res.stderr, "no command", [],
         "exit %d, stderr %r" % (res.returncode, res.stderr))


def test_table(s):
    args = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "2"]
    # 8 KV heads, TP 8 -> 2: 4 one-head writers of 8192*128*2*80*2 bytes
    # = 320 MiB each; region 1.25 GiB; 4096 MiB ring holds 3.
    s.expect_ok("llama70 table", args, [
        "decode rank 0", "decode rank 1", "1342177280", "335544320",
        "1.25 GiB", "320.00 MiB", "largest region",
        "full chunks that fit in the ring: 3", "--ring-mib 5120"])
    # Uneven PP (spec §4): 80 layers over 3 stages are 26 / 27 / 27; a
    # decode of PP 1 holds all 80 slots, so its regions are as without PP,
    # and each chunk waits for 4 TP writers x 3 stages.
    s.expect_ok("uneven pp table", args + ["--prefill-pp", "3"], [
        "26 or 27 layers per stage",
        "prefill stage 0: layers 0-25 (26)",
        "prefill stage 1: layers 26-52 (27)",
        "prefill stage 2: layers 53-79 (27)",
        "decode stage 0: layers 0-79 (80)", "12 arrival(s)", "1342177280"])
    # With decode PP 3 each decode stage holds its own 26 or 27 layers; the
    # regions listed are the 27-layer stage's: 4 x 8192*128*2*27*2 bytes.
    s.expect_ok("uneven pp both sides table",
                args + ["--prefill-pp", "3", "--decode-pp", "3"], [
                    "decode stage 0: layers 0-25 (26), region 416.00 MiB "
                    "(436207616 bytes)",
                    "decode stage 2: layers 53-79 (27), region 432.00 MiB "
                    "(452984832 bytes)",
                    "listed for decode stage 2", "4 arrival(s)",
                    "full chunks that fit in the ring: 9"])
    # One layer per stage.
    s.expect_ok("one layer per stage",
                ["plan", "--kv-heads", "8", "--head-dim", "64", "--layers", "4",
                 "--prefill-tp", "2", "--decode-tp", "1", "--prefill-pp", "4"],
                ["1 layers per stage", "prefill stage 3: layers 3-3 (1)"])
    # P == D is the direct path.
    s.expect_ok("direct table",
                ["plan"] + LLAMA70 + ["--prefill-tp", "4", "--decode-tp", "4"],
                ["P == D: no staging, direct page copy"])


def test_json(s):
    args = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "2",
                                 "--json"]
    obj = s.expect_json("llama70 json", args)
    want = {"grid_tokens": 8192, "chunk_pages": 8192, "tokens": 8192,
            "path": "staging", "max_region_bytes": 1342177280,
            "ring_bytes": 4096 << 20, "chunks_in_ring": 3}
    for key, value in want.items():
        s.ok(obj.get(key) == value, "llama70 json " + key, args,
             "got %r, want %r" % (obj.get(key), value))
    ranks = obj.get("decode_ranks", [])
    s.ok(len(ranks) == 2 and all(len(r.get("writers", [])) == 4 for r in ranks)
         and ranks[1]["writers"][0]["prefill_rank"] == 4
         and ranks[1]["writers"][3]["offset"] == 3 * 335544320,
         "llama70 json writers", args, repr(ranks)[:300])

    # Uneven PP: the per-stage ranges of both sides.
    uneven = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "2",
                                   "--prefill-pp", "3", "--decode-pp", "3",
                                   "--json"]
    obj = s.expect_json("uneven pp json", uneven)
    want_stages = [{"stage": 0, "first_layer": 0, "num_layers": 26},
                   {"stage": 1, "first_layer": 26, "num_layers": 27},
                   {"stage": 2, "first_layer": 53, "num_layers": 27}]
    s.ok(obj.get("prefill_stages") == want_stages, "uneven pp json prefill",
         uneven, repr(obj.get("prefill_stages")))
    dstages = obj.get("decode_stages", [])
    s.ok([{k: v for k, v in st.items() if k != "region_bytes"} for st in dstages]
         == want_stages and [st.get("region_bytes") for st in dstages]
         == [436207616, 452984832, 452984832], "uneven pp json decode", uneven,
         repr(dstages))
    s.ok(obj.get("prefill_layers") == 27 and obj.get("decode_layers") == 27
         and obj.get("expected_arrivals") == 4
         and obj.get("max_region_bytes") == 452984832
         and all(r.get("decode_stage") == 2 for r in obj.get("decode_ranks", [])),
         "uneven pp json layout", uneven, repr(obj)[:400])

    direct = s.expect_json("direct json", ["plan"] + LLAMA70 + [
        "--prefill-tp", "2", "--decode-tp", "2", "--json"])
    s.ok(direct.get("path") == "direct", "direct json path", args,
         repr(direct.get("path")))

    # No --model: required shape flags, defaults page size 1, dtype bf16.
    plain = ["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "80",
             "--prefill-tp", "8", "--decode-tp", "2", "--json"]
    obj2 = s.expect_json("no model json", plain)
    s.ok(obj2.get("page_size") == 1 and obj2.get("dtype") == "bf16"
         and obj2.get("max_region_bytes") == 1342177280,
         "no model defaults", plain, repr(obj2)[:300])

    # Replicated heads: qwen2.5-1.5b has 2 KV heads; decode TP 8 shares them.
    rep = ["plan", "--model", "qwen2.5-1.5b", "--prefill-tp", "2",
           "--decode-tp", "8", "--json"]
    obj3 = s.expect_json("replicated heads json", rep)
    srcs = [r["writers"][0]["prefill_rank"] for r in obj3.get("decode_ranks", [])]
    s.ok(srcs == [0, 0, 0, 0, 1, 1, 1, 1], "replicated heads sources", rep,
         repr(srcs))


def test_overrides_and_forms(s):
    base = ["--prefill-tp", "8", "--decode-tp", "2", "--json"]
    full = s.expect_json("model", ["plan"] + LLAMA70 + base)
    # An explicit flag overrides the model, before or after --model.
    for order, args in (("after", ["plan"] + LLAMA70 + ["--layers", "40"] + base),
                        ("before", ["plan", "--layers", "40"] + LLAMA70 + base)):
        obj = s.expect_json("override " + order, args)
        s.ok(obj.get("layers") == 40 and
             obj.get("max_region_bytes") == full.get("max_region_bytes", 0) // 2,
             "override " + order, args, repr(obj)[:300])
    obj = s.expect_json("override dtype", ["plan"] + LLAMA70 +
                        ["--dtype", "fp8"] + base)
    s.ok(obj.get("dtype") == "fp8" and
         obj.get("max_region_bytes") == full.get("max_region_bytes", 0) // 2,
         "override dtype", base, repr(obj)[:300])
    # --flag=value gives the same plan as --flag value.
    spaced = ["plan", "--kv-heads", "4", "--head-dim", "128", "--layers", "28",
              "--page-size", "16", "--prefill-tp", "2", "--decode-tp", "8",
              "--chunk-tokens", "512", "--tokens", "100", "--json"]
    equals = ["plan", "--kv-heads=4", "--head-dim=128", "--layers=28",
              "--page-size=16", "--prefill-tp=2", "--decode-tp=8",
              "--chunk-tokens=512", "--tokens=100", "--json"]
    a = s.expect_json("spaced form", spaced)
    b = s.expect_json("equals form", equals)
    s.ok(a == b and a.get("grid_tokens") == 512 and a.get("tokens") == 100,
         "flag forms agree", equals, "%r vs %r" % (a, b))


def test_ring_advice(s):
    # TP 8 -> 1: one region is 8 writers * 320 MiB = 2560 MiB.
    small = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "1",
                                  "--ring-mib", "1024"]
    # 2560 MiB / 8192 tokens = 320 KiB per token; 1024 MiB holds 3276.8
    # tokens -> at most 3276 with page size 1.
    s.expect_ok("ring too small", small, [
        "DOES NOT FIT", "--ring-mib to at least 2560",
        "--chunk-tokens to at most 3276"])
    # page size 16: 3276 // 16 * 16 = 3264.
    s.expect_ok("ring too small ps16", small + ["--page-size", "16"],
                ["--chunk-tokens to at most 3264"])
    obj = s.expect_json("ring too small json", small + ["--json"])
    s.ok(obj.get("chunks_in_ring") == 0 and obj.get("min_ring_mib") == 2560
         and obj.get("max_chunk_tokens_for_ring") == 3276,
         "ring too small json", small, repr(obj)[:300])
    # Not even one page fits: only the ring size can help.
    tiny = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "1",
                                 "--page-size", "64", "--ring-mib", "1"]
    s.expect_ok("ring below one page", tiny, ["--ring-mib to at least 2560",
                                             "cannot help"])
    # Exactly one fits: warn that transfers serialize, suggest 4 chunks.
    one = ["plan"] + LLAMA70 + ["--prefill-tp", "8", "--decode-tp", "1"]
    s.expect_ok("one chunk fits", one, [
        "full chunks that fit in the ring: 1", "serialize",
        "--ring-mib 10240"])


def test_bad_input(s):
    ok = ["--kv-heads", "8", "--head-dim", "128", "--layers", "32",
          "--prefill-tp", "4", "--decode-tp", "2"]

    def with_flag(flag, value):
        out = []
        i = 0
        while i < len(ok):
            if ok[i] != flag:
                out += ok[i:i + 2]
            i += 2
        return ["plan"] + out + [flag, value]

    cases = [
        ("junk number", with_flag("--head-dim", "12x"), "--head-dim"),
        ("hex number", with_flag("--layers", "0x20"), "--layers"),
        ("empty number", ["plan"] + ok + ["--page-size="], "--page-size"),
        ("space in number", with_flag("--kv-heads", " 8"), "--kv-heads"),
        ("plus sign", with_flag("--kv-heads", "+8"), "--kv-heads"),
        ("negative", with_flag("--decode-tp", "-2"), "--decode-tp"),
        ("negative equals", ["plan"] + ok + ["--ring-mib=-1"], "--ring-mib"),
        ("zero heads", with_flag("--kv-heads", "0"), "--kv-heads"),
        ("zero page size", with_flag("--page-size", "0"), "--page-size"),
        ("zero prefill pp", with_flag("--prefill-pp", "0"), "--prefill-pp"),
        ("zero ring", with_flag("--ring-mib", "0"), "--ring-mib"),
        ("overflow", with_flag("--layers", "99999999999999999999999"),
         "--layers"),
        ("out of range", with_flag("--prefill-tp", "4096"), "--prefill-tp"),
        ("unknown dtype", with_flag("--dtype", "int4"), "--dtype"),
        ("unknown model", ["plan", "--model", "gpt-5", "--prefill-tp", "8",
                           "--decode-tp", "2"], "--model"),
        ("unknown flag", ["plan"] + ok + ["--frobnicate", "3"], "--frobnicate"),
        ("unknown flag equals", ["plan"] + ok + ["--colour=red"], "--colour"),
        ("positional", ["plan"] + ok + ["extra"], "extra"),
        ("duplicate flag", ["plan"] + ok + ["--layers", "32"], "--layers"),
        ("missing value", ["plan"] + ok + ["--tokens"], "--tokens"),
        ("missing value before flag", ["plan", "--kv-heads", "--head-dim",
                                       "128"], "--kv-heads"),
        ("value to --json", ["plan"] + ok + ["--json=yes"], "--json"),
        ("missing --kv-heads", ["plan", "--head-dim", "128", "--layers", "32",
                                "--prefill-tp", "4", "--decode-tp", "2"],
         "--kv-heads"),
        ("missing --head-dim", ["plan", "--kv-heads", "8", "--layers", "32",
                                "--prefill-tp", "4", "--decode-tp", "2"],
         "--head-dim"),
        ("missing --layers", ["plan", "--kv-heads", "8", "--head-dim", "128",
                              "--prefill-tp", "4", "--decode-tp", "2"],
         "--layers"),
        ("missing --prefill-tp", ["plan"] + LLAMA70 + ["--decode-tp", "2"],
         "--prefill-tp"),
        ("missing --decode-tp", ["plan"] + LLAMA70 + ["--prefill-tp", "2"],
         "--decode-tp"),
        ("nothing", ["plan"], "--"),
        ("tokens above grid", with_flag("--tokens", "8193"), "--tokens"),
        ("tokens above small grid", ["plan"] + ok + [
            "--page-size", "16", "--chunk-tokens", "64", "--tokens", "65"],
         "--tokens"),
        ("tokens zero", with_flag("--tokens", "0"), "--tokens"),
        # spec §8: the chunk is whole pages, never floored in silence.
        ("chunk not a multiple of the page", ["plan"] + ok + [
            "--page-size", "16", "--chunk-tokens", "100"], "--chunk-tokens"),
        ("chunk below one page", ["plan"] + ok + [
            "--page-size", "16", "--chunk-tokens", "8"], "--chunk-tokens"),
        ("default chunk, page not dividing 8192", ["plan"] + ok + [
            "--page-size", "24"], "--chunk-tokens"),
        ("heads do not divide prefill tp", with_flag("--kv-heads", "6"),
         "--prefill-tp"),
        ("tp sizes do not divide", ["plan", "--kv-heads", "6", "--head-dim",
                                    "128", "--layers", "32", "--prefill-tp",
                                    "3", "--decode-tp", "2"], "--decode-tp"),
        ("more prefill stages than layers", with_flag("--layers", "2") +
         ["--prefill-pp", "3"], "--prefill-pp"),
        ("more stages than layers, both sides", with_flag("--layers", "2") +
         ["--prefill-pp", "3", "--decode-pp", "3"], "--prefill-pp"),
        ("decode pp not 1 or pp", ["plan"] + ok + [
            "--prefill-pp", "4", "--decode-pp", "2"], "--decode-pp"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)
    # The chunk messages name the page size and a chunk that fits.
    res = s.run(["plan"] + ok + ["--page-size", "16", "--chunk-tokens", "100"])
    s.ok("--page-size 16" in res.stderr and "96" in res.stderr,
         "chunk message", ok, repr(res.stderr))
    res = s.run(["plan"] + ok + ["--page-size", "24"])
    s.ok("0 means 8192" in res.stderr and "8184" in res.stderr,
         "default chunk message", ok, repr(res.stderr))
    # A page size dividing 8192 keeps the default chunk.
    s.expect_ok("default chunk, page 64", ["plan"] + ok + ["--page-size", "64"],
                ["G = 8192 tokens = 128 pages"])
    # The --tokens message explains the grid width and the knob.
    res = s.run(with_flag("--tokens", "8193"))
    s.ok("--chunk-tokens" in res.stderr and "8192" in res.stderr,
         "tokens message", with_flag("--tokens", "8193"), repr(res.stderr))


def test_context_parallel(s):
    """--prefill-cp: each CP rank's range and, per chunk, its parts and
    writers (docs/kinds/context-parallel.md), worked by hand."""
    args = ["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "4",
            "--prefill-tp", "4", "--decode-tp", "2", "--page-size", "16",
            "--chunk-tokens", "4096", "--prefill-cp", "2", "--request-tokens", "10000"]
    # 10000 over 2: 5000 -> 5008 (pages of 16); chunk 1 [4096, 8192) meets both
    s.expect_ok("cp table", args, ["prefill CP 2", "CP rank 0 holds [0, 5008)",
                                   "CP rank 1 holds [5008, 10000)", "[4096, 5008)"])
    obj = s.expect_json("cp json", args + ["--json"])
    cp = obj.get("context_parallel") or {}
    s.ok(obj.get("prefill_cp") == 2 and cp.get("ranges") == [[0, 5008], [5008, 10000]],
         "cp json ranges", args, repr(cp)[:300])
    chunks = cp.get("chunks") or []
    s.ok([c.get("arrivals") for c in chunks] == [2, 4, 2], "cp json arrivals", args,
         repr(chunks)[:300])
    if len(chunks) == 3:
        parts = chunks[1]["parts"]
        # 912 tokens of CP 0 (local row 4096), then CP 1's from region-token 912;
        # a region token is 2 writers x 2 heads x 128 x 2 B x 4 layers x 2
        per_token = 2 * 2 * 128 * 2 * 4 * 2
        s.ok([(p["cp_rank"], p["local_token_start"], p["offset"]) for p in parts] ==
             [(0, 4096, 0), (1, 0, 912 * per_token)], "cp json parts", args,
             repr(parts)[:300])
        s.ok([w["writer_index"] for w in parts[1]["writers"]] == [2, 3] and
             [w["prefill_rank"] for w in parts[1]["writers"]] == [0, 1],
             "cp json writers", args, repr(parts[1])[:300])
    # without CP the JSON says 1 and lists no CP parts
    plain = s.expect_json("cp 1 json", args[:-4] + ["--json"])
    s.ok(plain.get("prefill_cp") == 1 and "context_parallel" not in plain,
         "cp 1 json", args, repr(plain)[:200])
    s.expect_usage_error("cp 0", args[:-4] + ["--prefill-cp", "0"], "--prefill-cp")
    s.expect_usage_error("request without cp", args[:-4] + ["--request-tokens", "100"],
                         "--request-tokens")


def test_kv_scales(s):
    """FP8 scale planes: each head's scales ride in its writer's layer slots."""
    args = ["plan", "--model", "llama-3.1-70b", "--prefill-tp", "8", "--decode-tp", "2",
            "--dtype", "fp8"]
    plain = s.expect_json("fp8 plan", args + ["--json"])
    obj = s.expect_json("per-token plan", args + ["--kv-scales", "per-token", "--json"])
    s.ok(obj.get("kv_scales") == "per-token" and obj.get("scale_bytes") == 4,
         "json names the scales", args, repr(obj.get("kv_scales")))
    # head dim 128 fp8: each region grows by 4 bytes per head and token
    a = plain.get("decode_ranks", [{}])[0].get("region_bytes", 0)
    b = obj.get("decode_ranks", [{}])[0].get("region_bytes", 0)
    s.ok(a > 0 and b * 128 == a * 132, "region holds the scale rows", args, "%r %r" % (a, b))
    s.expect_ok("per-block table", args + ["--kv-scales", "per-block"],
                ["scales   per-block: 4 byte(s) of scales per head"])
    s.expect_usage_error("scales need fp8", ["plan", "--model", "llama-3.1-70b",
                                             "--prefill-tp", "8", "--decode-tp", "2",
                                             "--kv-scales", "per-token"], "--kv-scales")
    s.expect_usage_error("block must divide the head", args + ["--kv-scales", "per-block:96"],
                         "--kv-scales")


def test_hybrid(s):
    """Hybrid models: window layers send the last window's rows, state layers
    a per-request state in the request's last chunk (docs/kinds/hybrid.md)."""
    s.expect_ok("qwen3-next table", ["plan", "--model", "qwen3-next-80b-a3b", "--prefill-tp",
                                     "8", "--decode-tp", "2"],
                ["layers   12 full attention (layer l when (l + 1) % 4 == 0) + 36 state",
                 "state    16 state heads x (3072 conv + 65536 ssm) bytes",
                 "100.71 MiB (105603072)"])
    s.expect_ok("gpt-oss table", ["plan", "--model", "gpt-oss-120b", "--prefill-tp", "4",
                                  "--decode-tp", "8", "--page-size", "16", "--chunk-tokens",
                                  "2048", "--tokens", "1808", "--request-tokens", "10000"],
                ["18 full attention", "tokens [9872, 10000) of this 10000-token request",
                 "8.51 MiB (8921088)"])
    args = ["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "8", "--prefill-tp",
            "2", "--decode-tp", "2", "--page-size", "16", "--chunk-tokens", "256", "--json"]
    obj = s.expect_json("explicit pattern", args + ["--full-attn-every", "4", "--state-heads",
                                                    "4", "--state-bytes", "100+900"])
    # 2 full layers x 256 tokens x 4 heads x 256 bytes x K/V, then 6 state
    # layers x 2 state heads a rank (4 over TP 2) x 1000 bytes
    want = 2 * 256 * 4 * 256 * 2 + 6 * 2 * 1000
    got = obj.get("decode_ranks", [{}])[0].get("region_bytes")
    s.ok(got == want and obj.get("other_layers") == "state", "explicit state pattern", args,
         "%r, want %r" % (got, want))
    for name, extra, flag in [
            ("window and state", ["--full-attn-every", "2", "--window", "64", "--state-heads",
                                  "2", "--state-bytes", "8"], "--window and --state-heads"),
            ("state heads need bytes", ["--full-attn-every", "2", "--state-heads", "2"],
             "--state-bytes"),
            ("bad state bytes", ["--full-attn-every", "2", "--state-heads", "2",
                                 "--state-bytes", "1+x"], "--state-bytes"),
            ("state bytes alone", ["--state-bytes", "8"], "--state-bytes"),
            ("window without pattern", ["--window", "64"], "--full-attn-every"),
            ("state heads do not split", ["--full-attn-every", "2", "--state-heads", "3",
                                          "--state-bytes", "8"], "--state-heads")]:
        s.expect_usage_error(name, args + extra, flag)
    # With prefill CP each CP part is a hybrid region of its own tokens, at
    # the bytes of the parts before it: gpt-oss-20b P2 CP2 -> D1, 600
    # tokens, ranges [0, 304) and [304, 600), window [464, 600). Chunk 1
    # [256, 512): CP 0's 48 rows of 12 full layers (4 heads x 128 bytes, K
    # and V: 12288 bytes a row) are 589824 bytes a writer; CP 1's part
    # starts at 1179648, its writer blocks 208 full + 48 window rows.
    s.expect_ok("hybrid with prefill cp", ["plan", "--model", "gpt-oss-20b", "--prefill-tp",
                                           "2", "--decode-tp", "1", "--prefill-cp", "2",
                                           "--page-size", "16", "--chunk-tokens", "256",
                                           "--request-tokens", "600"],
                ["CP rank 0 holds [0, 304), CP rank 1 holds [304, 600)",
                 "576.00 KiB (589824)", "1.12 MiB (1179648)", "4.12 MiB (4325376)"])


def test_draft(s):
    """A draft model's layers end each writer's block (docs/kinds/draft.md):
    the table and the JSON by hand, each bad flag naming itself."""
    s.expect_ok("eagle table", ["plan", "--model", "llama-3.1-8b", "--prefill-tp", "4",
                                "--decode-tp", "2", "--page-size", "16", "--draft-layers", "1"],
                ["draft    1 draft layer(s) of head dim 128",
                 "8.00 MiB (8388608 bytes) of each writer's block",
                 "| draft K | draft V]", "region 528.00 MiB (553648128 bytes)"])
    args = ["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "8", "--prefill-tp",
            "4", "--decode-tp", "2", "--page-size", "16", "--chunk-tokens", "256", "--json"]
    obj = s.expect_json("draft json", args + ["--draft-layers", "2", "--draft-head-dim", "64"])
    # 2 writers of 2 heads: 256 x 2 x (128 x 8 + 64 x 2) x 2 bytes x K/V each
    want = 2 * 256 * 2 * (128 * 8 + 64 * 2) * 2 * 2
    got = obj.get("decode_ranks", [{}])[0].get("region_bytes")
    part = obj.get("draft_part_bytes")
    s.ok(got == want and part == 256 * 2 * 64 * 2 * 2 * 2 and obj.get("draft_layers") == 2,
         "draft json", args, "region %r, want %r; draft part %r" % (got, want, part))
    # With PP the draft is the last stage's: its regions (the plan's, the
    # last decode stage's) carry it, 4 layers of 8 a stage; decode PP 1:
    # all 8 layers and the draft.
    for dpp, layers in (("2", 4), ("1", 8)):
        pp = args + ["--draft-layers", "2", "--draft-head-dim", "64", "--prefill-pp", "2",
                     "--decode-pp", dpp]
        obj = s.expect_json("draft json with pp", pp)
        want = 2 * 256 * 2 * (128 * layers + 64 * 2) * 2 * 2
        got = obj.get("decode_ranks", [{}])[0].get("region_bytes")
        s.ok(got == want, "draft json with pp", pp, "region %r, want %r" % (got, want))
    s.expect_ok("draft table with pp", ["plan", "--model", "llama-3.1-8b", "--prefill-tp", "4",
                                        "--decode-tp", "2", "--page-size", "16",
                                        "--draft-layers", "1", "--prefill-pp", "2",
                                        "--decode-pp", "2"],
                ["with PP the draft is the last stage's: prefill stage 1 writes it, into "
                 "the regions of decode stage 1"])
    for name, extra, flag in [
            ("draft heads differ", ["--draft-layers", "1", "--draft-kv-heads", "4"],
             "--draft-kv-heads"),
            ("draft head dim alone", ["--draft-head-dim", "64"], "--draft-layers"),
            ("draft with scales and pp", ["--draft-layers", "1", "--prefill-pp", "2",
                                          "--dtype", "fp8", "--kv-scales", "per-token"],
             "--kv-scales"),
            ("draft layers junk", ["--draft-layers", "one"], "--draft-layers"),
            ("draft head dim zero", ["--draft-layers", "1", "--draft-head-dim", "0"],
             "--draft-head-dim")]:
        s.expect_usage_error(name, args + extra, flag)


def main():
    if len(sys.argv) != 2:
        print("usage: cli_plan.py PATH_TO_KVSTAGE", file=sys.stderr)
        return 2
    s = Suite(sys.argv[1])
    for test in (test_help_and_dispatch, test_table, test_json,
                 test_overrides_and_forms, test_ring_advice, test_bad_input,
                 test_context_parallel, test_kv_scales, test_hybrid, test_draft):
        test(s)
    print("cli_plan: %d passed, %d failed" % (s.passed, s.failed))
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
