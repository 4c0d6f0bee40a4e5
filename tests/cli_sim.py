#!/usr/bin/env python3
"""cli_sim.py - end-to-end behaviour of `kvstage sim` on small, fast
scenarios: the JSON report and its invariants (every request ok, no corrupt
byte, no leaked ring byte), the table, the defaults, determinism (one seed,
one report; another seed, another digest), the replay command, the trace
file, the staging path's write count against the slice baseline, and that
every class of bad input exits 2 with exactly one stderr line naming the
flag to change; aux payloads (--aux-bytes) reach every decode rank.

usage: cli_sim.py PATH_TO_KVSTAGE
Prints one line per failure and a summary "cli_sim: N passed, M failed";
exits 1 when anything failed. Python 3 standard library only.
"""

import json
import os
import re
import shlex
import sys
import tempfile

# Llama-3.1-8B cut to 4 layers, TP 4 -> 2, six short prompts: ~0.3 s.
SMALL = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "4",
         "--decode-tp", "2", "--requests", "6", "--prompt-tokens", "64:512",
         "--ring-mib", "64"]

REQUIRED_KEYS = [
    "requests_total", "requests_ok", "requests_failed", "bytes_moved",
    "bytes_verified", "corrupt_bytes", "ring_leaked_bytes", "rdma_ops",
    "control_msgs", "sim_seconds", "goodput_gbps", "line_rate_gbps",
    "latency_p50_us", "latency_p99_us", "events", "wall_seconds",
    "e2e_p50_us", "e2e_p99_us", "ring_peak_bytes", "watermark_waits",
    "msgs_rejected", "digest", "path", "seed", "prefill_ranks",
    "decode_ranks", "model", "total_heads", "head_dim", "dtype", "layers",
    "page_size", "decode_page_size", "chunk_tokens", "prefill_tp", "decode_tp", "prefill_pp",
    "decode_pp", "replay", "hung_requests", "unreported_failures", "violations",
    "sq_depth", "posts_refused", "aux_bytes", "aux_bytes_verified",
    "aux_corrupt_bytes", "ok", "failures", "failed_without_faults", "ring_bytes_needed",
    "keys_granted", "keys_revoked", "keys_leaked", "hostile_writes", "hostile_bytes_landed",
]


def report_list_fields():
    """The scalar results of the report's one list
    (include/kvstage/sim_report_fields.h): FIELD(code, name, json, ...)."""
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include",
                          "kvstage", "sim_report_fields.h")
    with open(header) as f:
        text = f.read()
    return re.findall(r"\bFIELD\((?:u32|i32|u64|i64|f64), (\w+), -?\d+,", text)


# Keys derived from the real clock: the only ones two runs may differ in.
WALL_KEYS = ("wall_seconds", "events_per_s")


from cli_suite import Suite as _Suite


class Suite(_Suite):
    """The shared harness plus the simulator's run invariants."""

    def __init__(self, binary):
        super().__init__(binary, timeout_s=120)

    def expect_clean(self, name, args, obj, exact=True):
        """The run's invariants: every request ok, nothing corrupt, nothing
        left in a ring, and the bytes that arrived verified: all the bytes
        moved when exact, else at least some and no more than were moved
        (replicated prefill heads are written by every replica)."""
        total = obj.get("requests_total")
        self.ok(isinstance(total, int) and total > 0
                and obj.get("requests_ok") == total
                and obj.get("requests_failed") == 0, name + " requests ok",
                args, "total %r ok %r failed %r" % (
                    total, obj.get("requests_ok"), obj.get("requests_failed")))
        self.ok(obj.get("corrupt_bytes") == 0, name + " corrupt_bytes", args,
                repr(obj.get("corrupt_bytes")))
        self.ok(obj.get("ring_leaked_bytes") == 0, name + " ring_leaked_bytes",
                args, repr(obj.get("ring_leaked_bytes")))
        moved = obj.get("bytes_moved")
        verified = obj.get("bytes_verified")
        self.ok(isinstance(moved, int) and isinstance(verified, int)
                and moved > 0 and (verified == moved if exact
                                   else 0 < verified <= moved),
                name + " bytes verified", args,
                "moved %r verified %r" % (moved, verified))
        self.ok(obj.get("ok") is True, name + " ok", args, repr(obj.get("ok")))


# The cluster of the clusters issue (3 prefill, 2 decode instances of mixed
# TP), 200 requests at once, on Llama-3.1-8B cut to 4 layers and short
# prompts: about 15 s under ASan. The same command with the default model
# and prompts (`kvstage sim --prefill-tp 8,8,4 --decode-tp 2,2 --requests 200
# --rate 0`) takes about 2 minutes and 11 GB in a Release build.
CLUSTER = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "8,8,4",
           "--decode-tp", "2,2", "--requests", "200", "--rate", "0", "--prompt-tokens",
           "64:512", "--ring-mib", "64"]
INSTANCE_KEYS = ("id", "role", "tp", "pp", "requests_ok", "requests_failed", "bytes",
                 "ring_peak_bytes", "metrics")
INSTANCE_METRICS = ("ttft_p50_us", "ttft_p90_us", "ttft_p99_us", "transfer_p50_us",
                    "transfer_p99_us", "ring_p99_bytes", "watermark_waits", "nic_util_mean",
                    "nic_util_max")


def test_help(s):
    s.expect_ok("--help lists sim", ["--help"], ["sim"])
    for args in (["sim", "--help"], ["sim", "-h"], ["help", "sim"]):
        s.expect_ok(" ".join(args), args, [
            "usage: kvstage sim", "--prompt-tokens", "--rate", "--nic-gbps",
            "--path", "--seed", "--trace", "--prefix-tokens",
            "--max-inflight", "--page-size", "--aux-bytes", "llama-3.1-70b"])


def test_json_report(s):
    args = SMALL + ["--seed", "3", "--json"]
    obj = s.expect_json("small json", args)
    for key in REQUIRED_KEYS:
        s.ok(key in obj, "json key " + key, args, "missing")
    fields = report_list_fields()
    s.ok(len(fields) > 50, "the report's list read", args, repr(fields))
    for key in fields + ["aux_error", "init_error"]:
        s.ok(key in obj, "json key " + key + " of the report's list", args, "missing")
    s.expect_clean("small json", args, obj)
    s.ok(obj.get("requests_total") == 6, "small json requests_total", args,
         repr(obj.get("requests_total")))
    s.ok(obj.get("path") == "staging", "small json auto is staging", args,
         repr(obj.get("path")))
    s.ok(obj.get("prefill_ranks") == 4 and obj.get("decode_ranks") == 2,
         "small json ranks", args,
         "%r %r" % (obj.get("prefill_ranks"), obj.get("decode_ranks")))
    want = {"model": "llama-3.1-8b", "total_heads": 8, "head_dim": 128,
            "dtype": "bf16", "layers": 4, "page_size": 16,
            "chunk_tokens": 512, "prefill_tp": 4, "decode_tp": 2,
            "prefill_pp": 1, "decode_pp": 1, "seed": 3,
            "prompt_min_tokens": 64, "prompt_max_tokens": 512,
            "ring_bytes": 64 << 20}
    for key, value in want.items():
        s.ok(obj.get(key) == value, "small json " + key, args,
             "got %r, want %r" % (obj.get(key), value))
    digest = obj.get("digest")
    s.ok(isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{16}", digest)
         is not None, "digest is 16 hex digits", args, repr(digest))
    s.ok(obj.get("rdma_ops", 0) > 0 and obj.get("control_msgs", 0) > 0
         and obj.get("events", 0) > 0 and obj.get("sim_seconds", 0) > 0,
         "small json counters", args, repr(obj)[:300])
    s.ok(obj.get("line_rate_gbps") == 800 and
         0 < obj.get("goodput_gbps", 0) <= obj.get("line_rate_gbps", 0),
         "goodput within line rate (2 NICs x 400 Gb/s)", args,
         "%r of %r" % (obj.get("goodput_gbps"), obj.get("line_rate_gbps")))
    s.ok(0 < obj.get("latency_p50_us", 0) <= obj.get("latency_p99_us", 0)
         and 0 < obj.get("e2e_p50_us", 0) <= obj.get("e2e_p99_us", 0)
         and obj.get("latency_p99_us", 0) <= obj.get("e2e_p99_us", 0),
         "latency percentiles ordered", args, repr(obj)[:300])
    s.ok(obj.get("ring_peak_bytes", 0) > 0
         and obj.get("ring_peak_bytes", 0) <= 64 << 20,
         "ring peak within the ring", args, repr(obj.get("ring_peak_bytes")))
    replay = obj.get("replay", "")
    s.ok(replay.startswith("kvstage sim ") and replay.endswith("--seed 3"),
         "replay command", args, repr(replay))


def test_table(s):
    args = SMALL + ["--seed", "3"]
    res = s.expect_ok("small table", args, [
        "kvstage sim: llama-3.1-8b", "prefill TP 4", "decode TP 2",
        "6 ok, 0 failed (of 6)", "0 corrupt", "0 bytes leaked", "RDMA ops",
        "control messages", "simulated time", "line rate", "p50", "p99",
        "watermark waits", "events/s", "wall time", "seed", "replay",
        "kvstage sim --model llama-3.1-8b"])
    s.ok(re.search(r"replay +kvstage sim .* --seed 3\n", res.stdout)
         is not None, "table replay line", args, res.stdout[-300:])


def test_defaults(s):
    # No shape flags: Llama-3.1-70B at TP 8 -> 2, page 16, 400 Gb/s NICs,
    # 20 requests/s, a 4096 MiB ring. Cut to 1 layer and 1 short request
    # so it runs in a fraction of a second.
    args = ["sim", "--layers", "1", "--requests", "1", "--prompt-tokens", "16",
            "--json"]
    obj = s.expect_json("defaults json", args)
    s.expect_clean("defaults json", args, obj)
    want = {"model": "llama-3.1-70b", "total_heads": 8, "head_dim": 128,
            "dtype": "bf16", "page_size": 16, "prefill_tp": 8,
            "decode_tp": 2, "prefill_ranks": 8, "decode_ranks": 2,
            "nic_gbps": 400, "rate_milli_per_s": 20000,
            "ring_bytes": 512 << 20, "chunk_tokens": 512, "seed": 0,
            "path": "staging"}
    for key, value in want.items():
        s.ok(obj.get(key) == value, "defaults " + key, args,
             "got %r, want %r" % (obj.get(key), value))
    s.ok(obj.get("line_rate_gbps") == 800, "defaults line rate", args,
         repr(obj.get("line_rate_gbps")))


def without_wall(obj):
    return {k: v for k, v in obj.items() if k not in WALL_KEYS}


def test_determinism(s):
    args = SMALL + ["--seed", "11", "--json"]
    a = s.expect_json("determinism run 1", args)
    b = s.expect_json("determinism run 2", args)
    s.ok(a and without_wall(a) == without_wall(b), "same seed, same report",
         args, "%r\nvs\n%r" % (a, b))
    other = SMALL + ["--seed", "12", "--json"]
    c = s.expect_json("other seed", other)
    s.ok(c.get("digest") != a.get("digest"), "other seed, other digest",
         other, "both %r" % a.get("digest"))
    # --seed=S is the same flag.
    d = s.expect_json("seed equals form", SMALL + ["--seed=11", "--json"])
    s.ok(d.get("digest") == a.get("digest"), "seed equals form digest",
         args, "%r vs %r" % (d.get("digest"), a.get("digest")))
    # The largest seed is accepted and replayed verbatim.
    big = SMALL + ["--seed", "18446744073709551615", "--json"]
    e = s.expect_json("largest seed", big)
    s.ok(e.get("seed") == 18446744073709551615, "largest seed echoed", big,
         repr(e.get("seed")))

    # The replay command reproduces the run: same digest and counters.
    replay = a.get("replay", "")
    words = shlex.split(replay)
    if s.ok(words[:2] == ["kvstage", "sim"], "replay words", args, repr(words)):
        r = s.expect_json("replay run", words[1:])
        s.ok(r and without_wall(r) == without_wall(a), "replay reproduces",
             words[1:], "%r\nvs\n%r" % (r, a))
    # A given seed is replaced, not repeated, in the replay command.
    s.ok(replay.count("--seed") == 1, "replay has one --seed", args,
         repr(replay))


def test_workload_flags(s):
    base = SMALL + ["--seed", "5", "--json"]
    plain = s.expect_json("workload base", base)
    for rate, milli in (("0", 0), ("2.5", 2500), ("50", 50000),
                        ("0.125", 125)):
        args = base + ["--rate", rate]
        obj = s.expect_json("rate " + rate, args)
        s.expect_clean("rate " + rate, args, obj)
        s.ok(obj.get("rate_milli_per_s") == milli, "rate " + rate + " stored",
             args, repr(obj.get("rate_milli_per_s")))
    slow = s.expect_json("rate 2.5 run", base + ["--rate", "2.5"])
    s.ok(slow.get("sim_seconds", 0) > plain.get("sim_seconds", 0),
         "slower arrivals take longer", base,
         "%r vs %r" % (slow.get("sim_seconds"), plain.get("sim_seconds")))

    args = base + ["--prefix-tokens", "256"]
    obj = s.expect_json("prefix", args)
    s.expect_clean("prefix", args, obj)
    s.ok(0 < obj.get("bytes_moved", 0) < plain.get("bytes_moved", 0),
         "a cached prefix moves fewer bytes", args,
         "%r vs %r" % (obj.get("bytes_moved"), plain.get("bytes_moved")))

    args = [a if a != "64:512" else "128" for a in base]
    obj = s.expect_json("prompt N alone", args)
    s.ok(obj.get("prompt_min_tokens") == 128
         and obj.get("prompt_max_tokens") == 128, "prompt N alone is N:N",
         args, repr(obj)[:300])

    for extra, label in ((["--max-inflight", "1"], "max inflight 1"),
                         (["--nic-gbps", "100"], "nic 100"),
                         (["--dtype", "fp8"], "fp8"),
                         (["--chunk-tokens", "128"], "small chunks")):
        args = base + extra
        obj = s.expect_json(label, args)
        s.expect_clean(label, args, obj)
    obj = s.expect_json("nic 100 line rate", base + ["--nic-gbps", "100"])
    s.ok(obj.get("line_rate_gbps") == 200, "nic 100 line rate", base,
         repr(obj.get("line_rate_gbps")))


def test_topologies(s):
    common = ["sim", "--layers", "4", "--requests", "4", "--prompt-tokens",
              "64:256", "--ring-mib", "64", "--seed", "2", "--json"]
    l8 = ["--model", "llama-3.1-8b"]
    cases = [
        ("P < D", l8 + ["--prefill-tp", "2", "--decode-tp", "4"],
         "staging", 2, 4),
        ("P == D direct", l8 + ["--prefill-tp", "2", "--decode-tp", "2"],
         "direct", 2, 2),
        ("P == D staging", l8 + ["--prefill-tp", "2", "--decode-tp", "2",
                                 "--path", "staging"], "staging", 2, 2),
        ("prefill PP", l8 + ["--prefill-tp", "2", "--decode-tp", "1",
                             "--prefill-pp", "2"], "staging", 4, 1),
        ("both PP", l8 + ["--prefill-tp", "2", "--decode-tp", "4",
                          "--prefill-pp", "2", "--decode-pp", "2"],
         "staging", 4, 8),
        # 4 layers over 3 stages: 1 / 1 / 2 (spec §4, uneven splits).
        ("uneven prefill PP", l8 + ["--prefill-tp", "2", "--decode-tp", "1",
                                    "--prefill-pp", "3"], "staging", 6, 1),
        ("uneven both PP", l8 + ["--prefill-tp", "2", "--decode-tp", "4",
                                 "--prefill-pp", "3", "--decode-pp", "3"],
         "staging", 6, 12),
        ("replicated heads", ["--model", "qwen2.5-1.5b", "--prefill-tp", "4",
                              "--decode-tp", "2"], "staging", 4, 2),
        ("no model", ["--kv-heads", "4", "--head-dim", "64",
                      "--prefill-tp", "4", "--decode-tp", "1"],
         "staging", 4, 1),
    ]
    for name, extra, path, nprefill, ndecode in cases:
        args = common + extra
        obj = s.expect_json(name, args)
        s.expect_clean(name, args, obj, exact=name != "replicated heads")
        s.ok(obj.get("path") == path, name + " path", args,
             "got %r, want %r" % (obj.get("path"), path))
        s.ok(obj.get("prefill_ranks") == nprefill
             and obj.get("decode_ranks") == ndecode, name + " ranks", args,
             "got %r + %r, want %d + %d" % (obj.get("prefill_ranks"),
                                            obj.get("decode_ranks"),
                                            nprefill, ndecode))
    # One instance per side: the JSON still lists both instances.
    args = common + l8 + ["--prefill-tp", "2", "--decode-tp", "4"]
    obj = s.expect_json("one instance per side", args)
    s.ok([(i.get("role"), i.get("id"), i.get("tp")) for i in obj.get("instances", [])]
         == [("prefill", 0, 2), ("decode", 0, 4)] and obj.get("prefill_instances") == 1
         and obj.get("decode_instances") == 1, "one instance per side listed", args,
         repr(obj.get("instances")))
    # --kv-heads, --head-dim and --layers together replace the default
    # model, which the report then does not name.
    args = common + ["--kv-heads", "4", "--head-dim", "64", "--prefill-tp",
                     "4", "--decode-tp", "1"]
    obj = s.expect_json("custom shape", args)
    s.ok(obj.get("model") is None and obj.get("total_heads") == 4
         and obj.get("head_dim") == 64 and obj.get("layers") == 4,
         "custom shape names no model", args, repr(obj)[:300])


def test_cluster(s):
    """Three prefill instances (TP 8, 8, 4) and two decode instances (TP 2,
    2): every request ok, every byte verified, each instance in the JSON
    with its share (round robin: 67/67/66 and 100/100), the table with a
    line per instance."""
    args = CLUSTER + ["--json"]
    obj = s.expect_json("cluster", args)
    s.expect_clean("cluster", args, obj)
    s.ok(obj.get("requests_ok") == 200 and obj.get("collateral_failures") == 0
         and obj.get("violations") == 0, "cluster all ok", args, repr(obj)[:300])
    s.ok(obj.get("prefill_instances") == 3 and obj.get("decode_instances") == 2
         and obj.get("prefill_ranks") == 20 and obj.get("decode_ranks") == 4
         and obj.get("router") == "round-robin", "cluster sizes", args, repr(obj)[:400])
    insts = obj.get("instances", [])
    s.ok(len(insts) == 5 and all(set(i) == set(INSTANCE_KEYS) and
                                 set(i["metrics"]) == set(INSTANCE_METRICS) for i in insts),
         "cluster lists five instances, each with its metrics", args, repr(insts))
    want = [("prefill", 0, 8, 67), ("prefill", 1, 8, 67), ("prefill", 2, 4, 66),
            ("decode", 0, 2, 100), ("decode", 1, 2, 100)]
    got = [(i.get("role"), i.get("id"), i.get("tp"), i.get("requests_ok")) for i in insts]
    s.ok(got == want, "cluster instances and round robin shares", args,
         "got %r, want %r" % (got, want))
    pre = [i for i in insts if i.get("role") == "prefill"]
    dec = [i for i in insts if i.get("role") == "decode"]
    s.ok(all(i.get("pp") == 1 and i.get("requests_failed") == 0 and i.get("bytes", 0) > 0
             for i in insts), "cluster instances moved bytes, none failed", args,
         repr(insts))
    s.ok(sum(i["bytes"] for i in pre) == obj.get("bytes_moved")
         and sum(i["bytes"] for i in dec) == obj.get("bytes_verified"),
         "cluster bytes add up", args, repr(insts))
    s.ok(all(i.get("ring_peak_bytes") == 0 for i in pre)
         and all(0 < i.get("ring_peak_bytes", 0) <= obj.get("ring_peak_bytes", 0)
                 for i in dec)
         and max(i["ring_peak_bytes"] for i in dec) == obj.get("ring_peak_bytes"),
         "cluster ring peaks on decode instances", args, repr(insts))
    table = CLUSTER[:CLUSTER.index("--requests") + 1] + ["10"] + \
        CLUSTER[CLUSTER.index("--requests") + 2:]
    s.expect_ok("cluster table", table, [
        "3 prefill instances (TP 8,8,4 x PP 1,1,1) -> 2 decode instances (TP 2,2 x PP 1,1)",
        "round-robin router", "prefill 2", "decode 1", "0 collateral failures"])
    # Mixed PP with uneven splits: 5 layers over 2 and 3 stages, decodes of
    # PP 1 (a decode of PP > 1 pairs only with prefills of its PP).
    args = ["sim", "--model", "llama-3.1-8b", "--layers", "5", "--prefill-tp", "2,4,2",
            "--prefill-pp", "1,2,3", "--decode-tp", "1,2", "--requests", "12",
            "--prompt-tokens", "64:256", "--ring-mib", "64", "--router", "least-loaded",
            "--json"]
    obj = s.expect_json("cluster mixed pp", args)
    s.expect_clean("cluster mixed pp", args, obj)
    s.ok([(i.get("tp"), i.get("pp")) for i in obj.get("instances", [])]
         == [(2, 1), (4, 2), (2, 3), (1, 1), (2, 1)]
         and obj.get("router") == "least-loaded" and obj.get("prefill_ranks") == 16,
         "cluster mixed pp instances", args, repr(obj.get("instances")))
    # Decodes of PP 2 with prefills of PP 2 only.
    args = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "2,4",
            "--prefill-pp", "2", "--decode-tp", "4,1", "--decode-pp", "2,1",
            "--requests", "8", "--prompt-tokens", "64:256", "--ring-mib", "64", "--json"]
    obj = s.expect_json("cluster decode pp", args)
    s.expect_clean("cluster decode pp", args, obj)


def test_router(s):
    """Round robin gives each instance its turn; least-loaded sends a
    request to the instance with the fewest in flight: with everything
    arriving at once both spread evenly, and their runs differ once
    requests end at different times."""
    base = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "4,4,2",
            "--decode-tp", "2,1", "--prompt-tokens", "32:1024", "--ring-mib", "64",
            "--requests", "12", "--json"]
    rr = s.expect_json("router round robin", base + ["--rate", "0"])
    s.ok([i.get("requests_ok") for i in rr.get("instances", [])] == [4, 4, 4, 6, 6],
         "round robin assigns evenly", base, repr(rr.get("instances")))
    ll = s.expect_json("router least loaded at once",
                       base + ["--rate", "0", "--router", "least-loaded"])
    s.ok([i.get("requests_ok") for i in ll.get("instances", [])] == [4, 4, 4, 6, 6],
         "least loaded spreads a burst evenly", base, repr(ll.get("instances")))
    a = s.expect_json("router rr paced", base + ["--rate", "40"])
    b = s.expect_json("router ll paced", base + ["--rate", "40", "--router", "least-loaded"])
    s.expect_clean("router ll paced", base, b)
    s.ok(a.get("digest") != b.get("digest"), "routers differ", base,
         "%r vs %r" % (a.get("digest"), b.get("digest")))


def test_slice_vs_staging(s):
    base = SMALL + ["--seed", "4", "--json"]
    staged = s.expect_json("staging path", base + ["--path", "staging"])
    sliced = s.expect_json("slice path", base + ["--path", "slice"])
    s.expect_clean("staging path", base, staged)
    s.expect_clean("slice path", base, sliced)
    s.ok(staged.get("path") == "staging" and sliced.get("path") == "slice",
         "paths ran as asked", base,
         "%r %r" % (staged.get("path"), sliced.get("path")))
    s.ok(staged.get("bytes_moved") == sliced.get("bytes_moved"),
         "both paths move the same bytes", base,
         "%r vs %r" % (staged.get("bytes_moved"), sliced.get("bytes_moved")))
    st, sl = staged.get("rdma_ops", 0), sliced.get("rdma_ops", 0)
    s.ok(st > 0 and st * 50 <= sl, "staging needs 50x fewer RDMA ops", base,
         "staging %r, slice %r" % (st, sl))


def test_page_sizes(s):
    """A decode with other pages than the prefill: every byte moves, either way."""
    base = SMALL + ["--seed", "5", "--json", "--prefix-tokens", "200"]
    same = s.expect_json("one page size", base)
    for ps, dps in (("16", "64"), ("64", "16")):
        for path in ("staging", "slice"):
            args = base + ["--page-size", ps, "--decode-page-size", dps, "--path", path]
            obj = s.expect_json("pages %s -> %s %s" % (ps, dps, path), args)
            s.expect_clean("pages %s -> %s %s" % (ps, dps, path), args, obj)
            s.ok(obj.get("page_size") == int(ps) and obj.get("decode_page_size") == int(dps),
                 "the report names both page sizes", args,
                 "%r %r" % (obj.get("page_size"), obj.get("decode_page_size")))
            s.ok(obj.get("bytes_verified", 0) > 0
                 and obj.get("requests_ok") == same.get("requests_ok"),
                 "every request moves and is verified", args,
                 "%r verified, %r ok" % (obj.get("bytes_verified"), obj.get("requests_ok")))
    s.ok(same.get("decode_page_size") == same.get("page_size"),
         "one page size reports the same size twice", base,
         "%r %r" % (same.get("page_size"), same.get("decode_page_size")))


def test_prefill_cp(s):
    """Prefill context parallelism: CP ranks of the prefill's TP each hold one
    token range and write it into the decode's regions; every byte moves and
    is verified, MLA and pipeline stages too (docs/kinds/context-parallel.md)."""
    base = [a if a != "64:512" else "1:900" for a in SMALL] + [
        "--seed", "9", "--json", "--prefix-tokens", "200"]
    plain = s.expect_json("without CP", base)
    for extra in (["--prefill-cp", "2"], ["--prefill-cp", "3", "--prefill-pp", "2"],
                  ["--prefill-cp", "2", "--data", "provenance"]):
        args = base + extra
        obj = s.expect_json(" ".join(extra), args)
        s.expect_clean(" ".join(extra), args, obj)
        cp = int(extra[1])
        pp = int(extra[3]) if "--prefill-pp" in extra else 1
        s.ok(obj.get("prefill_cp") == cp and obj.get("prefill_ranks") == 4 * pp * cp,
             "the report names the CP size and counts every CP rank", args,
             "%r %r" % (obj.get("prefill_cp"), obj.get("prefill_ranks")))
        s.ok(obj.get("bytes_verified") == plain.get("bytes_verified")
             and obj.get("requests_ok") == plain.get("requests_ok"),
             "the same bytes reach the decode as without CP", args,
             "%r verified, %r ok" % (obj.get("bytes_verified"), obj.get("requests_ok")))
    s.ok(plain.get("prefill_cp") == 1, "CP 1 by default", base, repr(plain.get("prefill_cp")))
    table = s.run(SMALL + ["--prefill-cp", "2"])
    s.ok(table.returncode == 0 and "x CP 2" in table.stdout and " 8 + 2 " in table.stdout,
         "the table names the CP size and the GPUs", SMALL + ["--prefill-cp", "2"],
         table.stdout[:400])


def test_kv_scales(s):
    """FP8 with scale planes: every scale slot moves and is verified, on each path."""
    base = SMALL + ["--seed", "7", "--json", "--dtype", "fp8", "--prefix-tokens", "200"]
    plain = s.expect_json("fp8 without scales", base)
    for scales, per_head in (("per-token", 4), ("per-block", 4), ("per-block:64", 2)):
        for path in ("staging", "slice"):
            args = base + ["--kv-scales", scales, "--path", path]
            obj = s.expect_json("scales %s %s" % (scales, path), args)
            s.expect_clean("scales %s %s" % (scales, path), args, obj)
            s.ok(obj.get("kv_scales") == scales.split(":")[0]
                 and obj.get("scale_bytes") == per_head,
                 "the report names the scales", args,
                 "%r %r" % (obj.get("kv_scales"), obj.get("scale_bytes")))
            # head dim 128 in fp8: 128 bytes a head, and its scales besides
            s.ok(obj.get("bytes_verified", 0) * 128
                 == plain.get("bytes_verified", 0) * (128 + per_head),
                 "every scale slot is verified with its rows", args,
                 "%r with scales, %r without" % (obj.get("bytes_verified"),
                                                 plain.get("bytes_verified")))
    s.ok(plain.get("kv_scales") == "none" and plain.get("scale_bytes") == 0,
         "no scales by default", base, repr(plain.get("kv_scales")))
    cases = [
        ("scales need fp8", SMALL + ["--kv-scales", "per-token"], "--kv-scales"),
        ("block must divide the head", SMALL + ["--dtype", "fp8", "--kv-scales",
                                                "per-block:48"], "--kv-scales"),
        ("unknown scales", SMALL + ["--dtype", "fp8", "--kv-scales", "per-tensor"],
         "--kv-scales"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)


def test_hybrid(s):
    """Hybrid models on the staging path: window rows and each request's state
    move and are verified in both data modes, the same run bit for bit; a
    window moves fewer bytes than full layers; direct and slice refuse them
    naming --path (docs/kinds/hybrid.md)."""
    window = [a if a != "64:512" else "300:900" for a in SMALL] + [
        "--seed", "8", "--json", "--prefix-tokens", "200"]
    qwen = [a if a != "llama-3.1-8b" else "qwen3-next-80b-a3b" for a in window]
    gpt = [a if a != "llama-3.1-8b" else "gpt-oss-20b" for a in window]
    for name, args in (("gpt-oss-20b", gpt),
                       ("window flags", window + ["--full-attn-every", "2",
                                                  "--window", "128"]),
                       ("qwen3-next-80b-a3b", qwen),
                       ("state flags", window + ["--full-attn-every", "4",
                                                 "--state-heads", "8",
                                                 "--state-bytes", "64+192"]),
                       # with prefill CP: each CP rank its range's rows, the
                       # state from the CP rank of the last token
                       ("qwen3-next-80b-a3b CP 2", qwen + ["--prefill-cp", "2"]),
                       ("gpt-oss-20b CP 3", gpt + ["--prefill-cp", "3"])):
        obj = s.expect_json(name, args)
        s.expect_clean(name, args, obj, exact=not name.startswith("qwen3-next-80b-a3b"))
        if "--prefill-cp" in args:
            s.ok(obj.get("prefill_cp") == int(args[args.index("--prefill-cp") + 1]),
                 name + " runs prefill CP", args, repr(obj.get("prefill_cp")))
        s.ok(obj.get("path") == "staging", name + " stages", args, repr(obj.get("path")))
        prov = s.expect_json(name + " provenance", args + ["--data", "provenance"])
        s.ok(prov.get("digest") == obj.get("digest")
             and prov.get("bytes_verified") == obj.get("bytes_verified")
             and prov.get("corrupt_bytes") == 0, name + " the same in both data modes",
             args, "%r %r" % (prov.get("digest"), obj.get("digest")))
    pattern = ("full_attn_every", "other_layers", "window_tokens", "state_heads",
               "state_conv_bytes", "state_ssm_bytes")
    want = {"full layers": [0, "full", 0, 0, 0, 0], "window flags": [2, "window", 128, 0, 0, 0],
            "state flags": [4, "state", 0, 8, 64, 192]}
    for name, extra in (("full layers", []),
                        ("window flags", ["--full-attn-every", "2", "--window", "128"]),
                        ("state flags", ["--full-attn-every", "4", "--state-heads", "8",
                                         "--state-bytes", "64+192"])):
        obj = s.expect_json(name + " json", window + extra)
        s.ok([obj.get(k) for k in pattern] == want[name], name + " names its pattern",
             window + extra, repr([obj.get(k) for k in pattern]))
        table = s.run([a for a in window if a != "--json"] + extra)
        s.ok(table.returncode == 0 and ("  layers " in table.stdout) == bool(extra),
             name + " table names its pattern", window + extra, table.stdout[:300])
    full = s.expect_json("full layers", window)
    win = s.expect_json("window", window + ["--full-attn-every", "2", "--window", "128"])
    s.ok(0 < win.get("bytes_verified", 0) < full.get("bytes_verified", 0),
         "a window moves less than full layers", window,
         "%r vs %r" % (win.get("bytes_verified"), full.get("bytes_verified")))
    equal = list(window)
    equal[equal.index("--prefill-tp") + 1] = "2"  # TP 2 -> 2
    eq = s.expect_json("equal TP", equal + ["--full-attn-every", "2", "--window", "128"])
    s.expect_clean("equal TP", equal, eq)
    s.ok(eq.get("path") == "staging" and eq.get("prefill_tp") == eq.get("decode_tp"),
         "path auto stages a hybrid layout at equal TP", equal,
         "%r %r %r" % (eq.get("path"), eq.get("prefill_tp"), eq.get("decode_tp")))
    for path in ("direct", "slice"):
        s.expect_usage_error("hybrid on the %s path" % path,
                             equal + ["--full-attn-every", "2", "--window", "128",
                                      "--path", path], "--path")


def test_draft(s):
    """A draft model's KV on the staging path: every draft byte moves and is
    verified in both data modes, the same run bit for bit; the draft adds
    its bytes to the model's, as many with PP (the last stage's); path auto
    stages a draft at equal TP, and direct and slice refuse it naming
    --path (docs/kinds/draft.md)."""
    base = SMALL + ["--seed", "8", "--json", "--prefix-tokens", "200"]
    mla = [a if a != "llama-3.1-8b" else "deepseek-v3" for a in base]
    mla[mla.index("--prefill-tp") + 1] = "2"
    for name, args in (("EAGLE", base + ["--draft-layers", "1"]),
                       ("own head dim", base + ["--draft-layers", "2",
                                                "--draft-head-dim", "64"]),
                       ("MTP", mla + ["--draft-layers", "1"]),
                       ("EAGLE with CP", base + ["--draft-layers", "1",
                                                 "--prefill-cp", "2"]),
                       # with PP the draft is the last stage's on both sides
                       ("EAGLE with PP 2 -> 1", base + ["--draft-layers", "1",
                                                        "--prefill-pp", "2"]),
                       ("own head dim with PP 2 -> 2", base + [
                           "--draft-layers", "2", "--draft-head-dim", "64",
                           "--prefill-pp", "2", "--decode-pp", "2"]),
                       ("MTP with PP 2 -> 2", mla + ["--draft-layers", "1",
                                                     "--prefill-pp", "2",
                                                     "--decode-pp", "2"])):
        obj = s.expect_json(name, args)
        s.expect_clean(name, args, obj)
        s.ok(obj.get("path") == "staging" and obj.get("draft_layers") == int(
            args[args.index("--draft-layers") + 1]), name + " stages and names the draft",
             args, "%r %r" % (obj.get("path"), obj.get("draft_layers")))
        prov = s.expect_json(name + " provenance", args + ["--data", "provenance"])
        s.ok(prov.get("digest") == obj.get("digest")
             and prov.get("bytes_verified") == obj.get("bytes_verified")
             and prov.get("corrupt_bytes") == 0, name + " the same in both data modes",
             args, "%r %r" % (prov.get("digest"), obj.get("digest")))
    plain = s.expect_json("no draft", base)
    s.ok(plain.get("draft_layers") == 0 and plain.get("draft_head_dim") == 0,
         "no draft named 0", base, repr(plain.get("draft_layers")))
    eagle = s.expect_json("EAGLE", base + ["--draft-layers", "1"])
    s.ok(eagle.get("bytes_verified", 0) * 4 == plain.get("bytes_verified", 0) * 5,
         "one draft layer adds a fifth to 4 layers", base,
         "%r vs %r" % (eagle.get("bytes_verified"), plain.get("bytes_verified")))
    pp = base + ["--draft-layers", "1", "--prefill-pp", "2", "--decode-pp", "2"]
    eagle_pp = s.expect_json("EAGLE with PP", pp)
    s.ok(eagle_pp.get("bytes_verified") == eagle.get("bytes_verified"),
         "with PP the draft's bytes are verified once, on the last stage", pp,
         "%r vs %r" % (eagle_pp.get("bytes_verified"), eagle.get("bytes_verified")))
    equal = list(base)
    equal[equal.index("--prefill-tp") + 1] = "2"  # TP 2 -> 2
    eq = s.expect_json("equal TP", equal + ["--draft-layers", "1"])
    s.expect_clean("equal TP", equal, eq)
    s.ok(eq.get("path") == "staging" and eq.get("prefill_tp") == eq.get("decode_tp"),
         "path auto stages a draft at equal TP", equal,
         "%r %r %r" % (eq.get("path"), eq.get("prefill_tp"), eq.get("decode_tp")))
    for path in ("direct", "slice"):
        s.expect_usage_error("draft on the %s path" % path,
                             equal + ["--draft-layers", "1", "--path", path], "--path")


def test_trace(s):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run trace.json")  # a space, to be quoted
        args = SMALL + ["--seed", "6", "--trace", path, "--json"]
        obj = s.expect_json("trace run", args)
        s.expect_clean("trace run", args, obj)
        s.ok(obj.get("trace") == path, "trace path echoed", args,
             repr(obj.get("trace")))
        s.ok("'" + path + "'" in obj.get("replay", ""), "trace path quoted",
             args, repr(obj.get("replay")))
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if s.ok(size > 0, "trace file written", args,
                "missing or empty: %s" % path):
            try:
                with open(path) as f:
                    trace = json.load(f)
            except ValueError as exc:
                s.ok(False, "trace parses", args, str(exc))
                trace = {}
            events = trace.get("traceEvents") if isinstance(trace, dict) else None
            s.ok(isinstance(events, list) and len(events) > 0,
                 "trace has traceEvents", args, repr(trace)[:200])
            s.ok(isinstance(events, list) and all(
                isinstance(e, dict) and "ph" in e and "name" in e
                for e in events), "trace events well formed", args,
                repr(events)[:200])
        # Same run without the trace: the trace does not change the run.
        plain = s.expect_json("trace off", SMALL + ["--seed", "6", "--json"])
        s.ok(plain.get("digest") == obj.get("digest"),
             "trace does not change the run", args,
             "%r vs %r" % (plain.get("digest"), obj.get("digest")))
    # A trace that cannot be written is a set-up error.
    s.expect_usage_error("trace unwritable",
                         SMALL + ["--trace", "/nonexistent-dir/x.json"],
                         "/nonexistent-dir/x.json")


def test_bad_input(s):
    def with_flag(flag, value, *more):
        """SMALL with flag (and more flag, value pairs) set to value."""
        pairs = [(flag, value)] + list(zip(more[::2], more[1::2]))
        out = []
        i = 1
        while i < len(SMALL):
            if SMALL[i] not in dict(pairs):
                out += SMALL[i:i + 2]
            i += 2
        return ["sim"] + out + [w for pair in pairs for w in pair]

    cases = [
        ("requests zero", with_flag("--requests", "0"), "--requests"),
        ("requests junk", with_flag("--requests", "6x"), "--requests"),
        ("requests negative", with_flag("--requests", "-6"), "--requests"),
        ("prompt min above max", with_flag("--prompt-tokens", "512:64"),
         "--prompt-tokens"),
        ("prompt missing max", with_flag("--prompt-tokens", "64:"),
         "--prompt-tokens"),
        ("prompt missing min", with_flag("--prompt-tokens", ":64"),
         "--prompt-tokens"),
        ("prompt junk", with_flag("--prompt-tokens", "abc"),
         "--prompt-tokens"),
        ("prompt zero", with_flag("--prompt-tokens", "0:64"),
         "--prompt-tokens"),
        ("prompt three parts", with_flag("--prompt-tokens", "1:2:3"),
         "--prompt-tokens"),
        ("rate negative", SMALL + ["--rate", "-1"], "--rate"),
        ("rate two points", SMALL + ["--rate", "2.5.1"], "--rate"),
        ("rate too precise", SMALL + ["--rate", "1.2345"], "--rate"),
        ("rate junk", SMALL + ["--rate", "fast"], "--rate"),
        ("rate empty", SMALL + ["--rate="], "--rate"),
        ("rate trailing point", SMALL + ["--rate", "2."], "--rate"),
        ("rate leading point", SMALL + ["--rate", ".5"], "--rate"),
        ("rate exponent", SMALL + ["--rate", "1e3"], "--rate"),
        ("rate too high", SMALL + ["--rate", "99999999999"], "--rate"),
        ("ring zero", with_flag("--ring-mib", "0"), "--ring-mib"),
        ("nic zero", SMALL + ["--nic-gbps", "0"], "--nic-gbps"),
        ("nic decimal", SMALL + ["--nic-gbps", "1.5"], "--nic-gbps"),
        ("unknown path", SMALL + ["--path", "teleport"], "--path"),
        ("direct with unequal TP", SMALL + ["--path", "direct"], "--path"),
        ("seed negative", SMALL + ["--seed", "-1"], "--seed"),
        ("seed overflow", SMALL + ["--seed", "18446744073709551616"],
         "--seed"),
        ("seed hex", SMALL + ["--seed", "0x10"], "--seed"),
        ("prefix negative", SMALL + ["--prefix-tokens", "-5"],
         "--prefix-tokens"),
        ("max inflight zero", SMALL + ["--max-inflight", "0"],
         "--max-inflight"),
        ("trace missing value", SMALL + ["--trace"], "--trace"),
        ("trace empty", SMALL + ["--trace="], "--trace"),
        ("value to --json", SMALL + ["--json=yes"], "--json"),
        ("unknown flag", SMALL + ["--frobnicate", "3"], "--frobnicate"),
        ("positional", SMALL + ["extra"], "extra"),
        ("duplicate flag", SMALL + ["--requests", "6"], "--requests"),
        ("unknown model", with_flag("--model", "gpt-5"), "--model"),
        ("unknown dtype", SMALL + ["--dtype", "int4"], "--dtype"),
        ("zero layers", with_flag("--layers", "0"), "--layers"),
        ("heads do not split", SMALL + ["--kv-heads", "6"], "--prefill-tp"),
        ("chunk not multiple of page", SMALL + ["--chunk-tokens", "100"],
         "--chunk-tokens"),
        ("default chunk not multiple of page", SMALL + ["--page-size", "24"],
         "--chunk-tokens"),
        ("chunk 0 not multiple of page", SMALL + ["--page-size", "24",
                                                  "--chunk-tokens", "0"],
         "--chunk-tokens"),
        ("decode pp not 1 or pp", SMALL + ["--prefill-pp", "4",
                                           "--decode-pp", "2"], "--decode-pp"),
        ("more stages than layers", SMALL + ["--prefill-pp", "5"],
         "--prefill-pp"),
        ("sq depth negative", SMALL + ["--sq-depth", "-1"], "--sq-depth"),
        ("sq depth too deep", SMALL + ["--sq-depth", "65536"], "--sq-depth"),
        ("sq depth junk", SMALL + ["--sq-depth", "deep"], "--sq-depth"),
        ("aux bytes negative", SMALL + ["--aux-bytes", "-1"], "--aux-bytes"),
        ("aux bytes over the limit", SMALL + ["--aux-bytes", "1048577"], "--aux-bytes"),
        ("aux bytes junk", SMALL + ["--aux-bytes", "4k"], "--aux-bytes"),
        ("aux bytes empty", SMALL + ["--aux-bytes="], "--aux-bytes"),
        # Clusters: every prefill instance must pair with every decode one.
        ("empty instance", with_flag("--prefill-tp", "4,,2"), "--prefill-tp"),
        ("instance tp zero", with_flag("--decode-tp", "2,0"), "--decode-tp"),
        ("too many instances", with_flag("--decode-tp", ",".join(["2"] * 33)),
         "--decode-tp"),
        ("pp list of another length", with_flag("--prefill-tp", "4,4,2",
                                                "--prefill-pp", "1,2"), "--prefill-pp"),
        ("instance heads do not split", with_flag("--prefill-tp", "4,3"), "--prefill-tp"),
        ("decode pp pairs with one prefill pp", with_flag("--prefill-tp", "4,4",
                                                          "--prefill-pp", "2,1",
                                                          "--decode-pp", "2"),
         "--decode-pp"),
        ("decode instance pp", with_flag("--decode-tp", "2,2", "--decode-pp", "1,2"),
         "--decode-pp"),
        ("direct across instances", with_flag("--prefill-tp", "2,4", "--decode-tp", "2",
                                              "--path", "direct"), "--path"),
        ("unknown router", SMALL + ["--router", "random"], "--router"),
        # Different page sizes: a chunk covers whole pages of both sides.
        ("chunk not multiple of decode page", SMALL + ["--decode-page-size", "48"],
         "--decode-page-size"),
        ("decode page zero", SMALL + ["--decode-page-size", "0"], "--decode-page-size"),
        ("decode page junk", SMALL + ["--decode-page-size", "big"], "--decode-page-size"),
        ("prefill cp junk", SMALL + ["--prefill-cp", "two"], "--prefill-cp"),
        ("prefill cp negative", SMALL + ["--prefill-cp", "-2"], "--prefill-cp"),
        # A draft model's layers the planner refuses, named.
        ("draft heads differ", SMALL + ["--draft-layers", "1", "--draft-kv-heads", "4"],
         "--draft-kv-heads"),
        ("draft head dim alone", SMALL + ["--draft-head-dim", "64"], "--draft-layers"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)


def test_faults(s):
    """--fault repeats and is seeded: duplicates are dropped by the links;
    lost messages are sent again, so every request still succeeds; crashes
    and restarts fail only what they touch; bad specs are one-line usage
    errors naming --fault."""
    args = SMALL + ["--fault", "dup:any:0.3", "--fault=delay:watermark:0.5:200", "--json"]
    obj = s.expect_json("faults dup+delay", args)
    s.expect_clean("faults dup+delay", args, obj)
    s.ok(obj.get("msgs_duplicate", 0) > 0, "faults dup dropped", args,
         repr(obj.get("msgs_duplicate")))
    args = SMALL + ["--fault", "drop:any:0.05", "--stall-timeout-ms", "2000", "--json"]
    obj = s.expect_json("faults drop", args)
    s.ok(obj.get("violations") == 0 and obj.get("hung_requests") == 0
         and obj.get("ok") is True, "faults drop invariants", args, repr(obj)[:300])
    s.ok(obj.get("requests_ok") == obj.get("requests_total")
         and obj.get("msgs_retransmitted", 0) > 0, "faults drop recovered", args,
         repr(obj)[:300])
    again = s.expect_json("faults drop again", args)
    s.ok(again.get("digest") == obj.get("digest"), "faults are seeded", args,
         "%r vs %r" % (again.get("digest"), obj.get("digest")))
    args = SMALL + ["--fault", "write-error:0.2", "--fault", "slow-scatter:d1:5",
                    "--fault", "link-down:p0:5000:20000", "--json"]
    obj = s.expect_json("faults write/slow/link", args)
    s.ok(obj.get("hung_requests") == 0 and obj.get("ring_leaked_bytes") == 0
         and obj.get("corrupt_bytes") == 0, "faults write/slow/link invariants", args,
         repr(obj)[:300])
    for spec, crashed, restarted in (("crash:prefill:0:20000", 1, 0),
                                     ("restart:decode:1:20000", 1, 1)):
        args = SMALL + ["--fault", spec, "--stall-timeout-ms", "500", "--json"]
        obj = s.expect_json("fault " + spec, args)
        s.ok(obj.get("violations") == 0 and obj.get("ok") is True
             and obj.get("ranks_crashed") == crashed
             and obj.get("ranks_restarted") == restarted, "fault " + spec + " invariants",
             args, repr(obj)[:300])
    # A hostile writer: the fabric refuses its write (region-scoped keys),
    # one request fails cleanly and not a byte of the write lands.
    for mode in ("stale", "outside"):
        args = SMALL + ["--fault", "hostile-write:p1:%s:0" % mode, "--json"]
        obj = s.expect_json("fault hostile-write " + mode, args)
        s.ok(obj.get("violations") == 0 and obj.get("ok") is True
             and obj.get("hostile_writes") == 1 and obj.get("hostile_bytes_landed") == 0
             and obj.get("requests_failed") == 1 and obj.get("keys_leaked") == 0
             and obj.get("keys_granted", 0) > 0
             and obj.get("keys_granted") == obj.get("keys_revoked"),
             "fault hostile-write " + mode + " refused", args, repr(obj)[:400])
    args = SMALL + ["--fault", "hbm-full:d1", "--stall-timeout-ms", "500", "--json"]
    obj = s.expect_json("fault hbm-full", args)
    s.ok(obj.get("ranks_down_at_start") == 1 and "--ring-mib" in obj.get("init_error", "")
         and obj.get("violations") == 0, "fault hbm-full names the knob", args, repr(obj)[:400])
    # A short stall timeout fails requests on healthy peers: alone it is a
    # violation (collateral: exit 1); carried by the stall fault, which
    # strikes the whole cluster, the same run passes (the campaign's
    # `stall` runs replay so).
    short = SMALL + ["--stall-timeout-ms", "1", "--json"]
    res = s.run(short)
    s.ok(res.returncode == 1 and json.loads(res.stdout).get("violations", 0) > 0,
         "short stall without fault fails", short, res.stdout[-300:])
    args = SMALL + ["--fault", "stall:1", "--json"]
    obj = s.expect_json("fault stall", args)
    s.ok(obj.get("requests_failed", 0) > 0 and obj.get("violations") == 0
         and obj.get("ok") is True, "fault stall excuses its failures", args, repr(obj)[:400])
    for spec in ("drop:bogus:0.1", "drop:any", "write-error:1.5", "delay:any:0.1",
                 "link-down:p9:1:2", "slow-scatter:d0:0", "crash:prefill:9:10",
                 "crash:router:0:10", "restart:decode:0", "hbm-full:p9", "nonsense",
                 "link-down:p0@1:1:2", "crash:prefill@1:0:10", "crash:prefill@:0:10",
                 "hbm-full:d0@x", "slow-scatter:p0:2", "stall", "stall:0", "stall:x",
                 "stall:1:2", "hostile-write:d0:stale:0", "hostile-write:p0:sideways:0",
                 "hostile-write:p0:stale", "hostile-write:p9:outside:0"):
        s.expect_usage_error("fault " + spec, SMALL + ["--fault", spec], "--fault")
    # Instance-qualified forms name a rank of another instance.
    cl = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "4,2",
          "--decode-tp", "2,1", "--requests", "8", "--prompt-tokens", "64:256",
          "--ring-mib", "64", "--stall-timeout-ms", "500", "--json"]
    for spec in ("crash:prefill@1:1:20000", "link-down:d0@1:20000:1000", "hbm-full:p1@1",
                 "restart:decode@1:0:20000", "slow-scatter:d0@1:5"):
        obj = s.expect_json("cluster fault " + spec, cl + ["--fault", spec])
        s.ok(obj.get("violations") == 0 and obj.get("collateral_failures") == 0
             and obj.get("ok") is True, "cluster fault " + spec + " isolated", cl,
             repr(obj)[:400])
    for spec in ("crash:prefill@2:0:10", "link-down:p2@1:0:10", "hbm-full:d1@1"):
        s.expect_usage_error("cluster fault " + spec, cl[:-1] + ["--fault", spec], "--fault")


def test_sq_depth(s):
    """--sq-depth N: send queues of N work requests, whose refused posts the
    core posts again: every request still ok and verified, the refusals
    counted and shown; 0 (the default) refuses nothing and leaves the run
    as it was."""
    base = s.expect_json("sq depth default", SMALL + ["--seed", "3", "--json"])
    zero = s.expect_json("sq depth 0", SMALL + ["--seed", "3", "--sq-depth", "0", "--json"])
    s.ok(base.get("sq_depth") == 0 and base.get("posts_refused") == 0
         and zero.get("digest") == base.get("digest"), "sq depth 0 is unlimited", SMALL,
         "%r vs %r" % (zero.get("digest"), base.get("digest")))
    for depth in ("1", "2"):
        args = SMALL + ["--seed", "3", "--sq-depth", depth, "--json"]
        obj = s.expect_json("sq depth " + depth, args)
        s.expect_clean("sq depth " + depth, args, obj)
        s.ok(obj.get("sq_depth") == int(depth) and obj.get("posts_refused", 0) > 0
             and obj.get("bytes_verified") == base.get("bytes_verified")
             and obj.get("rdma_ops") == base.get("rdma_ops"),
             "sq depth %s refuses and recovers" % depth, args, repr(obj)[:400])
    args = SMALL + ["--seed", "3", "--sq-depth", "1"]
    s.expect_ok("sq depth table", args, ["send queues", "1 work requests per connection",
                                         "posts refused"])


def test_aux_bytes(s):
    """--aux-bytes N: every request carries an aux payload to every decode
    rank, checked there byte for byte. SMALL's six requests have payloads
    of none, 1..256 bytes, N/2..N and N, none, 1..256 (sim/kvdata.h), and
    its two decode ranks each get every payload: aux_bytes_verified within
    those bounds means the payloads arrived (a lost or short one counts in
    aux_corrupt_bytes and fails the run). 0, the default, leaves the run
    as it was; faults do not lose a payload; a bad value is refused
    naming the flag and the range."""
    base = s.expect_json("aux default", SMALL + ["--seed", "3", "--json"])
    zero = s.expect_json("aux 0", SMALL + ["--seed", "3", "--aux-bytes", "0", "--json"])
    s.ok(base.get("aux_bytes") == 0 and base.get("aux_bytes_verified") == 0
         and zero.get("digest") == base.get("digest"), "aux 0 is none", SMALL,
         "%r vs %r" % (zero.get("digest"), base.get("digest")))
    n = 9000  # more than two AUX messages' worth
    args = SMALL + ["--seed", "3", "--aux-bytes", str(n), "--json"]
    obj = s.expect_json("aux 9000", args)
    s.expect_clean("aux 9000", args, obj)
    lo, hi = 2 * (n + (n - n // 2) + 2), 2 * (n + n + 2 * 256)
    got = obj.get("aux_bytes_verified")
    s.ok(obj.get("aux_bytes") == n and isinstance(got, int) and lo <= got <= hi
         and obj.get("aux_corrupt_bytes") == 0, "aux 9000 payloads verified", args,
         "verified %r, want %d..%d; corrupt %r" % (got, lo, hi,
                                                   obj.get("aux_corrupt_bytes")))
    s.ok(obj.get("bytes_verified") == base.get("bytes_verified")
         and obj.get("digest") != base.get("digest"), "aux 9000 KV bytes as before",
         args, repr(obj)[:300])
    again = s.expect_json("aux 9000 again", args)
    s.ok(again.get("digest") == obj.get("digest"), "aux is seeded", args,
         "%r vs %r" % (again.get("digest"), obj.get("digest")))
    args = SMALL + ["--aux-bytes", str(1 << 20), "--fault", "drop:any:0.05",
                    "--stall-timeout-ms", "2000", "--json"]
    obj = s.expect_json("aux limit with drops", args)
    s.expect_clean("aux limit with drops", args, obj)
    s.ok(obj.get("aux_bytes_verified", 0) >= 3 * (1 << 20)
         and obj.get("aux_corrupt_bytes") == 0, "aux limit with drops verified", args,
         repr(obj)[:300])
    args = SMALL + ["--seed", "3", "--aux-bytes", "300"]
    s.expect_ok("aux table", args, ["aux payloads", "up to 300 bytes a request",
                                    "verified on the decode ranks, 0 corrupt"])


def test_failures(s):
    """Why requests failed: counts by status with the first request's
    detail, in --json (failures) and the table; a ring that can never hold
    the workload's regions is refused before the run, naming --ring-mib
    (or --ring-bytes) and the size it needs."""
    args = SMALL + ["--fault", "crash:prefill:0:2000", "--json"]
    obj = s.expect_json("failures crash", args)
    f = obj.get("failures", {})
    s.ok(obj.get("ok") is True and obj.get("requests_failed", 0) > 0
         and sum(v.get("count", 0) for v in f.values()) == obj.get("requests_failed")
         and all(v.get("first_detail", "").startswith("request ") for v in f.values()),
         "failures by status", args, repr(f)[:300])
    args = SMALL + ["--stall-timeout-ms", "1"]
    res = s.run(args)
    s.ok(res.returncode == 1 and "failures" in res.stdout
         and "KVS_ETIMEDOUT: request " in res.stdout
         and "KVS_ETIMEDOUT, the first: request " in res.stderr,
         "failures table and stderr", args, res.stdout[-600:] + res.stderr[-300:])
    args = SMALL + ["--stall-timeout-ms", "1", "--json"]
    res = s.run(args)
    obj = json.loads(res.stdout) if res.stdout else {}
    s.ok(res.returncode == 1 and obj.get("ok") is False
         and "KVS_ETIMEDOUT" in obj.get("failures", {}), "failures json verdict", args,
         res.stdout[:300])
    # The default model's region of a 512-token chunk is 80 MiB.
    res = s.run(["sim", "--ring-mib", "1"])
    lines = res.stderr.splitlines()
    s.ok(res.returncode == 2 and res.stdout == "" and len(lines) == 1
         and lines[0].startswith("kvstage sim: OVERSIZED: a 80 MiB region does not fit "
                                 "a 1 MiB ring; raise --ring-mib to at least 80"),
         "oversized before the run", ["sim", "--ring-mib", "1"], res.stderr)
    s.expect_usage_error("oversized --ring-bytes", SMALL[:-2] + ["--ring-bytes", "4096"],
                         "--ring-bytes")


def main():
    if len(sys.argv) != 2:
        print("usage: cli_sim.py PATH_TO_KVSTAGE", file=sys.stderr)
        return 2
    s = Suite(sys.argv[1])
    for test in (test_help, test_json_report, test_table, test_defaults,
                 test_determinism, test_workload_flags, test_topologies,
                 test_cluster, test_router, test_slice_vs_staging, test_page_sizes,
                 test_kv_scales, test_prefill_cp, test_hybrid, test_draft,
                 test_trace, test_bad_input, test_faults,
                 test_sq_depth, test_aux_bytes, test_failures):
        test(s)
    print("cli_sim: %d passed, %d failed" % (s.passed, s.failed))
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
