#!/usr/bin/env python3
"""plan_model.py - an independent model of the staging layout (spec §3-§5)
checked against `kvstage plan --json`.

Written from the text of /work/shared/spec/staging.md, not from the C code:
the head-slice formula and rank mapping of §3, the region layout of §4 with
its pipeline stages (even or uneven splits) and the grid width of §2/§5. It
runs hand-worked cases (numbers derived in the comments) and N random valid
configurations, compares every field of the CLI's JSON with its own
computation, and checks that invalid configurations exit 2 with one line on
stderr.

usage: plan_model.py PATH_TO_KVSTAGE [--configs N] [--seed S]
Exit 0 when everything matches, 1 on any mismatch (the first few are printed
with the command line that replays them). Python 3 standard library only.
"""

import argparse
import json
import random
import shlex
import subprocess
import sys

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
DEFAULT_CHUNK_TOKENS = 8192  # spec §2: C = 0 means 8192
MAX_REPORTED = 5


# --------------------------------------------------------------------------
# The model (spec §2-§5)
# --------------------------------------------------------------------------

def grid(chunk_tokens, page_size):
    """spec §2: G = max(1, C / ps) * ps, C = 0 meaning 8192; F = G / ps."""
    c = chunk_tokens if chunk_tokens > 0 else DEFAULT_CHUNK_TOKENS
    g = max(1, c // page_size) * page_size
    return g, g // page_size


def head_slice(h, p, d, src, dst):
    """spec §3, for prefill rank src and decode rank dst (taken modulo their
    TP). Returns (src_start, nh, dst_start)."""
    src %= p
    dst %= d
    src_heads = max(1, h // p)
    dst_heads = max(1, h // d)
    if p > d:
        nh = src_heads
        src_start = 0
        rep = max(1, p // h)
        dst_start = ((src // rep) * src_heads) % dst_heads
    else:
        nh = dst_heads
        dst_start = 0
        rep = max(1, d // h)
        src_start = ((dst // rep) * dst_heads) % src_heads
    return src_start, nh, dst_start


def stage_layers(layers, pp, stage):
    """spec §4: L layers over pp stages, base = L // pp, rem = L % pp; stage
    s < pp - rem holds [s*base, (s+1)*base), later stages base + 1 layers
    each, contiguous. Returns (first_layer, num_layers)."""
    base, rem = layers // pp, layers % pp
    if stage < pp - rem:
        return stage * base, base
    first = (pp - rem) * base + (stage - (pp - rem)) * (base + 1)
    return first, base + 1


def writers_of(cfg, dst):
    """spec §3 rank mapping + §4 writer order: the prefill ranks writing into
    decode rank dst, in region order. P > D: of the ranks [d*k, (d+1)*k),
    k = P/D, each distinct slice of dst's heads is written once, by the
    first rank holding it (with H < P, P/H ranks in a row hold one head and
    the others only report). P < D: the one rank d / (D/P)."""
    p, d = cfg["P"], cfg["D"]
    if p > d:
        k = p // d
        seen, slots = set(), []
        for r in range(dst * k, (dst + 1) * k):
            _, nh, dst_start = head_slice(cfg["H"], p, d, r, dst)
            if (dst_start, nh) not in seen:
                seen.add((dst_start, nh))
                slots.append(r)
        return slots
    return [dst // (d // p)]


def model_plan(cfg):
    """The expected JSON fields of one configuration (staging or direct)."""
    g, f = grid(cfg["C"], cfg["ps"])
    t = cfg["T"] if cfg["T"] is not None else g
    out = {"grid_tokens": g, "chunk_pages": f, "tokens": t}
    p, d = cfg["P"], cfg["D"]
    # P == D is the direct path: no ring, but each decode rank still gets
    # the same bytes per chunk from one writer (its own rank), so the
    # per-rank fields follow the same formulas with W = 1.
    out["path"] = "direct" if p == d else "staging"
    w = len(writers_of(cfg, 0))
    # A decode stage waits for every TP writer of each prefill stage that
    # holds its layers: all Pp when Dp = 1, its own when Dp = Pp.
    arrivals = w * (cfg["Pp"] if cfg["Dp"] == 1 else 1)
    s = DTYPE_BYTES[cfg["dtype"]]

    def region(dst, lx):
        """Decode rank dst's writers for lx layer slots (spec §4)."""
        offset = 0
        ws = []
        for r in writers_of(cfg, dst):
            src_start, nh, dst_start = head_slice(cfg["H"], p, d, r, dst)
            nbytes = t * nh * cfg["hd"] * s * lx * 2
            ws.append({"prefill_rank": r, "src_head_start": src_start,
                       "dst_head_start": dst_start, "num_heads": nh,
                       "offset": offset, "bytes": nbytes})
            offset += nbytes
        return offset, ws

    out["prefill_stages"] = [
        dict(zip(("stage", "first_layer", "num_layers"),
                 (e,) + stage_layers(cfg["L"], cfg["Pp"], e)))
        for e in range(cfg["Pp"])]
    out["decode_stages"] = []
    for e in range(cfg["Dp"]):
        first, n = stage_layers(cfg["L"], cfg["Dp"], e)
        out["decode_stages"].append({"stage": e, "first_layer": first,
                                     "num_layers": n,
                                     "region_bytes": region(0, n)[0]})
    # Regions and writers are listed for the last decode stage: it holds
    # the most layers, so its regions are the largest.
    stage = cfg["Dp"] - 1
    lx = stage_layers(cfg["L"], cfg["Dp"], stage)[1]
    ranks = []
    for dst in range(d):
        offset, ws = region(dst, lx)
        ranks.append({"decode_rank": dst, "decode_stage": stage,
                      "region_bytes": offset, "expected_arrivals": arrivals,
                      "writers": ws})
    out["decode_ranks"] = ranks
    if p == d:
        return out
    # Largest region of a full G-token chunk, and how many fit in the ring.
    max_region = max(sum(g * wr["num_heads"] * cfg["hd"] * s * lx * 2
                         for wr in rk["writers"]) for rk in ranks)
    ring = cfg["ring_mib"] << 20
    out["max_region_bytes"] = max_region
    out["ring_bytes"] = ring
    out["chunks_in_ring"] = ring // max_region
    return out


# --------------------------------------------------------------------------
# Running the CLI and comparing
# --------------------------------------------------------------------------

def argv_of(cfg):
    a = ["plan", "--kv-heads", str(cfg["H"]), "--head-dim", str(cfg["hd"]),
         "--dtype", cfg["dtype"], "--layers", str(cfg["L"]),
         "--page-size", str(cfg["ps"]), "--prefill-tp", str(cfg["P"]),
         "--decode-tp", str(cfg["D"]), "--prefill-pp", str(cfg["Pp"]),
         "--decode-pp", str(cfg["Dp"]), "--chunk-tokens", str(cfg["C"]),
         "--ring-mib", str(cfg["ring_mib"])]
    if cfg["T"] is not None:
        a += ["--tokens", str(cfg["T"])]
    return a + ["--json"]


def make_cfg(H, hd, L, P, D, ps=1, Pp=1, Dp=1, C=0, T=None, dtype="bf16",
             ring_mib=4096):
    return {"H": H, "hd": hd, "L": L, "P": P, "D": D, "ps": ps, "Pp": Pp,
            "Dp": Dp, "C": C, "T": T, "dtype": dtype, "ring_mib": ring_mib}


class Checker:
    def __init__(self, binary):
        self.binary = binary
        self.checked = 0
        self.failures = []

    def replay(self, argv):
        return " ".join(shlex.quote(x) for x in [self.binary] + argv)

    def fail(self, argv, what):
        self.failures.append("%s\n    replay: %s" % (what, self.replay(argv)))

    def run(self, argv):
        return subprocess.run([self.binary] + argv, capture_output=True,
                              text=True, timeout=60)

    def compare(self, argv, path, got, want):
        if got != want:
            self.fail(argv, "%s: kvstage says %r, model says %r"
                      % (path, got, want))
            return False
        return True

    def check(self, cfg, label="", expect=None):
        """Runs one valid configuration and compares every modelled field.
        expect: hand-derived values that the model itself must reproduce."""
        self.checked += 1
        argv = argv_of(cfg)
        want = model_plan(cfg)
        if expect is not None:
            for key, value in expect.items():
                if self.lookup(want, key) != value:
                    self.fail(argv, "%s: MODEL disagrees with the hand-worked "
                              "value of %s: %r vs %r"
                              % (label, key, self.lookup(want, key), value))
        res = self.run(argv)
        if res.returncode != 0:
            self.fail(argv, "%s exit %d (stderr: %s)"
                      % (label, res.returncode, res.stderr.strip()))
            return
        try:
            got = json.loads(res.stdout)
        except ValueError as exc:
            self.fail(argv, "%s: stdout is not one JSON object: %s"
                      % (label, exc))
            return
        for key in ("grid_tokens", "chunk_pages", "tokens", "path",
                    "prefill_stages", "decode_stages"):
            self.compare(argv, key, got.get(key), want[key])
        if want["path"] == "staging":
            for key in ("max_region_bytes", "ring_bytes", "chunks_in_ring"):
                self.compare(argv, key, got.get(key), want[key])
        ranks = got.get("decode_ranks")
        if not isinstance(ranks, list) or len(ranks) != cfg["D"]:
            self.fail(argv, "decode_ranks: want a list of %d decode ranks, "
                      "got %r" % (cfg["D"], ranks))
            return
        for dr_want, dr in zip(want["decode_ranks"], ranks):
            d = dr_want["decode_rank"]
            for key in ("decode_rank", "decode_stage", "region_bytes",
                        "expected_arrivals"):
                if not self.compare(argv, "decode_ranks[%d].%s" % (d, key),
                                    dr.get(key), dr_want[key]):
                    return
            wl = dr.get("writers")
            if not isinstance(wl, list) or len(wl) != len(dr_want["writers"]):
                self.fail(argv, "decode_ranks[%d].writers: want %d writers, "
                          "got %r" % (d, len(dr_want["writers"]), wl))
                return
            for i, (ww, w) in enumerate(zip(dr_want["writers"], wl)):
                for key, value in ww.items():
                    if not self.compare(argv, "decode_ranks[%d].writers[%d]."
                                        "%s" % (d, i, key), w.get(key), value):
                        return

    @staticmethod
    def lookup(obj, dotted):
        for part in dotted.split("."):
            obj = obj[int(part)] if isinstance(obj, list) else obj[part]
        return obj

    def check_invalid(self, argv, flag_hint, label):
        """An invalid configuration: exit 2, one stderr line naming a flag."""
        self.checked += 1
        res = self.run(argv)
        lines = res.stderr.splitlines()
        if res.returncode != 2:
            self.fail(argv, "%s: want exit 2, got %d (stdout %r)"
                      % (label, res.returncode, res.stdout[:200]))
        elif len(lines) != 1:
            self.fail(argv, "%s: want exactly one stderr line, got %d: %r"
                      % (label, len(lines), res.stderr))
        elif flag_hint not in lines[0]:
            self.fail(argv, "%s: stderr does not name %s: %r"
                      % (label, flag_hint, lines[0]))
        elif res.stdout:
            self.fail(argv, "%s: want nothing on stdout, got %r"
                      % (label, res.stdout[:200]))


# --------------------------------------------------------------------------
# Hand-worked cases
# --------------------------------------------------------------------------

def hand_cases(ck):
    # 1. Llama-3-70B shape H=8, hd=128, bf16, L=80, P=8 -> D=2, ps=1, C=0:
    #    G = max(1, 8192/1)*1 = 8192, F = 8192. src_heads = 8/8 = 1,
    #    dst_heads = 8/2 = 4. P > D: nh = 1, src_start = 0,
    #    rep = max(1, 8/8) = 1, dst_start = (src*1) % 4.
    #    k = W = 4: decode 0 <- prefill 0,1,2,3 (dst_start 0,1,2,3),
    #    decode 1 <- prefill 4..7 (dst_start 4%4=0, 1, 2, 3).
    #    writer bytes = 8192*1*128*2*80*2 = 335544320 (320 MiB);
    #    region = 4*320 MiB = 1342177280 = half of spec §11's 2.5 GiB at TP1.
    #    ring 4096 MiB / 1280 MiB = 3 chunks.
    ck.check(make_cfg(8, 128, 80, 8, 2), "H8 P8 D2", {
        "grid_tokens": 8192, "chunk_pages": 8192, "tokens": 8192,
        "decode_ranks.0.region_bytes": 1342177280,
        "decode_ranks.0.expected_arrivals": 4,
        "decode_ranks.0.writers.3.prefill_rank": 3,
        "decode_ranks.0.writers.3.dst_head_start": 3,
        "decode_ranks.0.writers.3.offset": 3 * 335544320,
        "decode_ranks.1.writers.0.prefill_rank": 4,
        "decode_ranks.1.writers.0.dst_head_start": 0,
        "decode_ranks.1.writers.2.dst_head_start": 2,
        "decode_ranks.1.writers.2.bytes": 335544320,
        "chunks_in_ring": 3})
    # Spec §11 figure: decode TP1, 8192 tokens of Llama-3-70B = 2.5 GiB.
    # P=8 -> D=1: 8 writers of 1 head, 8*320 MiB = 2684354560.
    ck.check(make_cfg(8, 128, 80, 8, 1), "H8 P8 D1 (spec 11)", {
        "decode_ranks.0.region_bytes": 2684354560,
        "decode_ranks.0.writers.7.dst_head_start": 7,
        "chunks_in_ring": 1})

    # 2. H=2 replicated on the prefill side, P=8 -> D=2, hd=128, fp16, L=28,
    #    ps=16, C=64, T=16: G = max(1, 64/16)*16 = 64, F = 4.
    #    src_heads = max(1, 2/8) = 1, dst_heads = 2/2 = 1. P > D: nh = 1,
    #    rep = 8/2 = 4 prefill ranks share a head,
    #    dst_start = ((src/4)*1) % 1 = 0 for all. Decode 0's sources
    #    0,1,2,3 all hold head 0, decode 1's 4..7 head 1: one writer each
    #    (W = 1), the first of its run: decode 0 <- 0, decode 1 <- 4.
    #    bytes = 16*1*128*2*28*2 = 229376 = region; arrivals 1.
    ck.check(make_cfg(2, 128, 28, 8, 2, ps=16, C=64, T=16, dtype="fp16"),
             "H2 P8 D2", {
                 "grid_tokens": 64, "chunk_pages": 4, "tokens": 16,
                 "decode_ranks.0.region_bytes": 229376,
                 "decode_ranks.0.writers.0.offset": 0,
                 "decode_ranks.1.writers.0.prefill_rank": 4,
                 "decode_ranks.1.writers.0.dst_head_start": 0,
                 "decode_ranks.1.expected_arrivals": 1})
    # 2b. H=4 over P=8 -> D=2: pairs of prefill ranks hold one head; decode
    #    0's sources 0..3 hold heads 0,0,1,1 -> writers 0 and 2 (W = 2),
    #    dst_start 0 and 1; decode 1 <- 4 and 6. bytes 229376 each,
    #    region 458752, arrivals 2.
    ck.check(make_cfg(4, 128, 28, 8, 2, ps=16, C=64, T=16, dtype="fp16"),
             "H4 P8 D2", {
                 "decode_ranks.0.region_bytes": 458752,
                 "decode_ranks.0.writers.1.prefill_rank": 2,
                 "decode_ranks.0.writers.1.dst_head_start": 1,
                 "decode_ranks.0.writers.1.offset": 229376,
                 "decode_ranks.1.writers.1.prefill_rank": 6,
                 "decode_ranks.0.expected_arrivals": 2})

    # 3. H=2 replicated on the decode side, P=2 -> D=8, hd=64, fp8, L=24,
    #    ps=32, C=0, T=100: G = (8192/32)*32 = 8192, F = 256.
    #    src_heads = 1, dst_heads = max(1, 2/8) = 1. P < D: nh = 1,
    #    dst_start = 0, rep = 8/2 = 4, src_start = ((d/4)*1) % 1 = 0.
    #    decode d <- prefill d / (8/2) = d/4: 0,0,0,0,1,1,1,1. W = 1.
    #    bytes = 100*1*64*1*24*2 = 307200 = region; arrivals 1.
    ck.check(make_cfg(2, 64, 24, 2, 8, ps=32, T=100, dtype="fp8"),
             "H2 P2 D8", {
                 "grid_tokens": 8192, "chunk_pages": 256,
                 "decode_ranks.3.writers.0.prefill_rank": 0,
                 "decode_ranks.4.writers.0.prefill_rank": 1,
                 "decode_ranks.7.writers.0.src_head_start": 0,
                 "decode_ranks.5.region_bytes": 307200,
                 "decode_ranks.5.expected_arrivals": 1})

    # 4. H=4, P=2 -> D=8 (decode replicates), hd=128, bf16, L=32, ps=1:
    #    src_heads = 2, dst_heads = max(1, 4/8) = 1. P < D: nh = 1,
    #    rep = 8/4 = 2 decode ranks per head,
    #    src_start = ((d/2)*1) % 2: d = 0..7 -> 0,0,1,1,0,0,1,1
    #    source rank d / 4: 0,0,0,0,1,1,1,1.
    #    Check: decode d holds global head d/2; prefill 0 holds heads 0,1,
    #    prefill 1 holds 2,3; decode 6 -> head 3 = prefill 1 local 1. The
    #    modulo bug ((d*1) % 2) would give decode 1 local head 1 (wrong).
    #    T = 10: bytes = 10*1*128*2*32*2 = 163840.
    ck.check(make_cfg(4, 128, 32, 2, 8, T=10), "H4 P2 D8", {
        "decode_ranks.1.writers.0.src_head_start": 0,
        "decode_ranks.2.writers.0.src_head_start": 1,
        "decode_ranks.4.writers.0.prefill_rank": 1,
        "decode_ranks.4.writers.0.src_head_start": 0,
        "decode_ranks.6.writers.0.src_head_start": 1,
        "decode_ranks.6.writers.0.prefill_rank": 1,
        "decode_ranks.6.region_bytes": 163840})

    # 5. H=16, P=2 -> D=4 (no replication), hd=128, bf16, L=32, T=1:
    #    src_heads = 8, dst_heads = 4, nh = 4, rep = max(1, 4/16) = 1,
    #    src_start = (d*4) % 8: 0, 4, 0, 4; source d / 2: 0, 0, 1, 1.
    #    bytes = 1*4*128*2*32*2 = 65536.
    ck.check(make_cfg(16, 128, 32, 2, 4, T=1), "H16 P2 D4", {
        "decode_ranks.1.writers.0.src_head_start": 4,
        "decode_ranks.2.writers.0.src_head_start": 0,
        "decode_ranks.2.writers.0.prefill_rank": 1,
        "decode_ranks.3.writers.0.num_heads": 4,
        "decode_ranks.3.region_bytes": 65536})

    # 6. Prefill PP, decode PP 1: H=8, P=4 -> D=2, Pp=2, Dp=1, L=32, hd=128,
    #    bf16, T=8, ps=1: src_heads = 2, dst_heads = 4, nh = 2, rep = 1,
    #    dst_start = (src*2) % 4: decode 0 <- 0 (0), 1 (2); decode 1 <- 2 (0),
    #    3 (2). W = 2, arrivals = 2 * (2/1) = 4. Lx = 32/1 = 32 layer slots:
    #    bytes = 8*2*128*2*32*2 = 262144, region 524288.
    ck.check(make_cfg(8, 128, 32, 4, 2, Pp=2, Dp=1, T=8), "H8 P4 D2 Pp2 Dp1", {
        "decode_ranks.0.expected_arrivals": 4,
        "decode_ranks.1.writers.1.dst_head_start": 2,
        "decode_ranks.1.writers.0.prefill_rank": 2,
        "decode_ranks.0.writers.1.offset": 262144,
        "decode_ranks.0.region_bytes": 524288})

    # 7. Same with decode PP 2: Lx = 32/2 = 16, arrivals = 2 * (2/2) = 2,
    #    bytes = 8*2*128*2*16*2 = 131072, region 262144.
    ck.check(make_cfg(8, 128, 32, 4, 2, Pp=2, Dp=2, T=8), "H8 P4 D2 Pp2 Dp2", {
        "decode_ranks.0.expected_arrivals": 2,
        "decode_ranks.1.writers.1.bytes": 131072,
        "decode_ranks.1.region_bytes": 262144})

    # 8. Prefill PP 4 with P < D: H=8, P=2 -> D=4, Pp=4, Dp=1, L=40, fp32,
    #    hd=64, ps=16, C=32, T=32: G = 32, F = 2; W = 1, arrivals = 1*4 = 4;
    #    nh = dst_heads = 2, src_heads = 4, src_start = (d*2) % 4: 0,2,0,2;
    #    bytes = 32*2*64*4*40*2 = 1310720.
    ck.check(make_cfg(8, 64, 40, 2, 4, ps=16, Pp=4, Dp=1, C=32, T=32,
                      dtype="fp32"), "H8 P2 D4 Pp4", {
        "grid_tokens": 32, "chunk_pages": 2,
        "decode_ranks.3.expected_arrivals": 4,
        "decode_ranks.3.writers.0.src_head_start": 2,
        "decode_ranks.3.writers.0.prefill_rank": 1,
        "decode_ranks.3.region_bytes": 1310720})

    # 9. Grid corners: C must be whole pages (spec §8; C = 100 or 8 with
    #    ps = 16 are refused, see invalid_cases); C = 96 -> G = 96, F = 6.
    ck.check(make_cfg(8, 128, 80, 8, 2, ps=16, C=96), "C96 ps16", {
        "grid_tokens": 96, "chunk_pages": 6, "tokens": 96})
    #    C equal to ps gives G = ps = 64, F = 1. H=1 replicated everywhere,
    #    P=4 -> D=2: nh = 1, rep = 4, dst_start = 0; every rank holds the
    #    one head, so each decode rank has one writer, the first of its
    #    sources: decode 1 <- prefill 2 (3 only reports).
    ck.check(make_cfg(1, 128, 4, 4, 2, ps=64, C=64), "H1 P4 D2 C=ps", {
        "grid_tokens": 64, "chunk_pages": 1,
        "decode_ranks.1.writers.0.prefill_rank": 2,
        "decode_ranks.1.writers.0.dst_head_start": 0,
        "decode_ranks.1.expected_arrivals": 1})

    # 10. P == D: direct path, no staging. Decode rank 3 gets all its 8/4 = 2
    #     heads from prefill rank 3: 8192 * 2 * 128 * 2 B * 32 layers * 2
    #     = 268435456 bytes per chunk.
    ck.check(make_cfg(8, 128, 32, 4, 4, ps=16), "P == D", {
        "path": "direct", "grid_tokens": 8192, "chunk_pages": 512,
        "decode_ranks.3.writers.0.prefill_rank": 3,
        "decode_ranks.3.writers.0.num_heads": 2,
        "decode_ranks.3.writers.0.src_head_start": 0,
        "decode_ranks.3.region_bytes": 268435456,
        "decode_ranks.3.expected_arrivals": 1})

    # 11. Ring too small: region of H8 P8 D1 at 8192 tokens is 2560 MiB;
    #     a 1024 MiB ring holds 0 chunks.
    ck.check(make_cfg(8, 128, 80, 8, 1, ring_mib=1024), "ring too small", {
        "chunks_in_ring": 0, "max_region_bytes": 2684354560})

    # 12. Uneven PP (spec §4): L=80 over Pp=3: base 26, rem 2, so stage 0
    #     holds [0, 26), stages 1 and 2 hold 27 each: [26, 53), [53, 80).
    #     H8 P8 -> D2, Dp=1: the decode holds all 80 layer slots, so the
    #     region is case 1's 1342177280; arrivals = W 4 x Pp 3 = 12.
    ck.check(make_cfg(8, 128, 80, 8, 2, Pp=3), "L80 Pp3 Dp1", {
        "prefill_stages.0.num_layers": 26,
        "prefill_stages.1.first_layer": 26,
        "prefill_stages.1.num_layers": 27,
        "prefill_stages.2.first_layer": 53,
        "prefill_stages.2.num_layers": 27,
        "decode_stages.0.num_layers": 80,
        "decode_ranks.0.expected_arrivals": 12,
        "decode_ranks.1.region_bytes": 1342177280,
        "chunks_in_ring": 3})
    # 13. Same with Dp=3: the same split on the decode side. Regions are
    #     listed for decode stage 2 (27 slots): a writer is
    #     8192*1*128*2*27*2 = 113246208 bytes, a region 4x that = 452984832;
    #     stage 0's region has 26 slots: 4*8192*128*2*26*2 = 436207616.
    #     Arrivals = W 4 (one prefill stage per decode stage); the ring
    #     holds 4294967296 // 452984832 = 9 full chunks.
    ck.check(make_cfg(8, 128, 80, 8, 2, Pp=3, Dp=3), "L80 Pp3 Dp3", {
        "decode_stages.0.region_bytes": 436207616,
        "decode_stages.1.region_bytes": 452984832,
        "decode_stages.2.first_layer": 53,
        "decode_ranks.0.decode_stage": 2,
        "decode_ranks.0.writers.3.bytes": 113246208,
        "decode_ranks.1.region_bytes": 452984832,
        "decode_ranks.1.expected_arrivals": 4,
        "max_region_bytes": 452984832,
        "chunks_in_ring": 9})
    # 14. One layer per stage and one more: L=5 over Pp=Dp=4 is 1/1/1/2
    #     (base 1, rem 1: only the last stage holds 2, layers 3 and 4).
    #     H8 P2 -> D4, T=4, hd 64, fp8: nh = 2, W = 1; stage 3's region is
    #     4*2*64*1*2*2 = 2048 bytes, the others' 1024.
    ck.check(make_cfg(8, 64, 5, 2, 4, Pp=4, Dp=4, T=4, dtype="fp8"),
             "L5 Pp4 Dp4", {
                 "prefill_stages.2.first_layer": 2,
                 "prefill_stages.3.first_layer": 3,
                 "prefill_stages.3.num_layers": 2,
                 "decode_stages.0.region_bytes": 1024,
                 "decode_stages.3.region_bytes": 2048,
                 "decode_ranks.3.region_bytes": 2048,
                 "decode_ranks.3.expected_arrivals": 1})
    # 15. L == Pp: one layer per stage; Dp = 1 waits for every stage:
    #     W = 8/1 = 8 writers x 4 stages = 32 arrivals.
    ck.check(make_cfg(8, 128, 4, 8, 1, Pp=4, T=1), "L4 Pp4 Dp1", {
        "prefill_stages.3.first_layer": 3,
        "prefill_stages.3.num_layers": 1,
        "decode_ranks.0.expected_arrivals": 32})


def invalid_cases(ck):
    base = ["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "32",
            "--prefill-tp", "4", "--decode-tp", "2"]
    cases = [
        # H=6 with TP 4: 6 is neither a multiple nor a divisor of 4.
        (["plan", "--kv-heads", "6", "--head-dim", "128", "--layers", "32",
          "--prefill-tp", "4", "--decode-tp", "2"], "--prefill-tp", "H6 P4"),
        # TP 3 vs 2: neither divides the other.
        (["plan", "--kv-heads", "6", "--head-dim", "128", "--layers", "32",
          "--prefill-tp", "3", "--decode-tp", "2"], "-tp", "P3 D2"),
        # 3 layers cannot fill 4 prefill stages (30 could: 7/7/8/8).
        (["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "3",
          "--prefill-tp", "4", "--decode-tp", "2", "--prefill-pp", "4"],
         "--prefill-pp", "L3 Pp4"),
        (["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "3",
          "--prefill-tp", "4", "--decode-tp", "2", "--prefill-pp", "4",
          "--decode-pp", "4"], "--prefill-pp", "L3 Pp4 Dp4"),
        # decode PP must be 1 or the prefill PP.
        (base + ["--prefill-pp", "4", "--decode-pp", "2"], "--decode-pp",
         "Pp4 Dp2"),
        (base + ["--dtype", "int4"], "--dtype", "dtype int4"),
        (base + ["--tokens", "9000"], "--tokens", "T > G"),
        (base + ["--tokens", "0"], "--tokens", "T = 0"),
        (base + ["--page-size", "0"], "--page-size", "ps 0"),
        (base[:3] + ["--head-dim=0"] + base[5:], "--head-dim", "hd 0"),
        (base + ["--ring-mib", "-5"], "--ring-mib", "negative ring"),
        (base + ["--page-size", "16x"], "--page-size", "junk number"),
        (base + ["--bogus", "1"], "--bogus", "unknown flag"),
        # spec §8: the chunk is whole pages; 0 means 8192, which 24 does
        # not divide.
        (base + ["--page-size", "16", "--chunk-tokens", "100"],
         "--chunk-tokens", "C100 ps16"),
        (base + ["--page-size", "16", "--chunk-tokens", "8"],
         "--chunk-tokens", "C8 ps16"),
        (base + ["--page-size", "24"], "--chunk-tokens", "C0 ps24"),
        (["plan", "--kv-heads", "8", "--head-dim", "128", "--layers", "32",
          "--prefill-tp", "4"], "--decode-tp", "missing --decode-tp"),
    ]
    for argv, hint, label in cases:
        ck.check_invalid(argv, hint, label)


# --------------------------------------------------------------------------
# Random valid configurations
# --------------------------------------------------------------------------

def random_cfg(rng):
    h = rng.choice([1, 2, 4, 8, 16, 32, 64, 128])
    tps = [1, 2, 4, 8, 16, 32, 64]
    p = rng.choice(tps)
    d = rng.choice(tps)
    pp = rng.choice([1, 2, 3, 4, 5, 8])
    dp = rng.choice([1, pp])
    # Even splits, and uneven ones (spec §4) down to one layer per stage.
    layers = pp * rng.randint(1, 40) + (rng.randrange(pp) if rng.randrange(2) else 0)
    ps = rng.choice([1, 16, 32, 64])
    # C is whole pages (spec §8); ps divides 8192, so C = 0 is one too.
    c = 0 if rng.randrange(4) == 0 else ps * rng.randint(1, max(1, 16384 // ps))
    g, _ = grid(c, ps)
    r = rng.randrange(4)
    t = None if r == 0 else (g if r == 1 else rng.randint(1, g))
    hd = rng.choice([64, 80, 96, 128, 256])
    dtype = rng.choice(sorted(DTYPE_BYTES))
    ring = rng.choice([1, 64, 512, 4096, 16384])
    return make_cfg(h, hd, layers, p, d, ps=ps, Pp=pp, Dp=dp, C=c, T=t,
                    dtype=dtype, ring_mib=ring)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvstage", help="path to the kvstage binary")
    ap.add_argument("--configs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    ck = Checker(args.kvstage)
    hand_cases(ck)
    invalid_cases(ck)
    rng = random.Random(args.seed)
    for _ in range(args.configs):
        ck.check(random_cfg(rng))

    for msg in ck.failures[:MAX_REPORTED]:
        print("MISMATCH " + msg)
    if len(ck.failures) > MAX_REPORTED:
        print("... and %d more" % (len(ck.failures) - MAX_REPORTED))
    print("plan_model: %d configs checked, %d mismatches (seed %d; replay: "
          "%s %s --configs %d --seed %d)"
          % (ck.checked, len(ck.failures), args.seed, sys.argv[0],
             args.kvstage, args.configs, args.seed))
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
