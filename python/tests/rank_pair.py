"""rank_pair.py - the two-process kvstage.Rank test (test_rank_rxe.py over
verbs, test_rank_ofi.py over libfabric): one side per process, a prefill
instance of TP 2 (two ranks in this process) or a decode instance of TP 1
(other sizes by --prefill-tp, --decode-tp), each with torch CPU tensors
as its KV pool, on the host device and the fabric the command line names;
and run(), which starts both sides and checks what they report.

    rank_pair.py prefill DIR [FABRIC]   writes DIR/prefill.addrs, serves the rooms
    rank_pair.py decode DIR [FABRIC]    reads it, receives the rooms, checks bytes
    FABRIC: [--fabric verbs|ofi] [--provider NAME] [--address IP]
            [--deadline-s S] [--decode-page N] [--mla] [--scales [--shift-scales]]
            [--prefill-cp N [--cp-addrs-swapped]] [--draft-layers N [--draft-swapped]]
            [--prefill-tp N] [--decode-tp N] [--prefill-pp N] [--decode-pp N]
            [--window W | --state-heads H --state-bytes C+S [--state-slot-shifted]]
    (verbs by default; --address: every rank's bind_addr, default
    $KVS_VERBS_ADDR; --deadline-s: how long each wait may take, 240;
    --decode-page: the decode's page size, 16 like the prefill's by
    default; --mla: an MLA pool, one latent "head" per layer and no V, the
    same on both prefill ranks, of which rank 0 writes and rank 1 only
    reports; --scales: an fp8 pool with per-token scale planes, a scale
    tensor beside every K and V tensor, whose every byte is checked too;
    both processes are given the same; --shift-scales, to the decode: a
    planted wrong mapping, each layer's scale tensors handed to the Rank as
    the next layer's, which the check must catch; --prefill-cp N: the
    prefill instance has N context-parallel ranks of TP 2 (2N ranks in its
    process), each holding and filling only its token range of every room
    (Rank.cp_range), and the decode declares it with cp_size N;
    --cp-addrs-swapped, to the decode: a planted mistake, the addresses of
    CP rank 0 TP rank 1 and CP rank 1 TP rank 0 given in each other's
    place, which the registration must refuse by name; --draft-layers N:
    a draft model's N layers of head dim 8 (docs/kinds/draft.md), their own
    K and V tensors (MLA: K) over the same pages, draft_k_buffers and
    draft_v_buffers on both sides, every draft byte checked too);
    --prefill-tp N, --decode-tp N: the prefill instance has N TP ranks (2
    by default), the decode instance N (1 by default), each with its share
    of the heads, every decode rank's pool checked; --prefill-pp N,
    --decode-pp N: N pipeline stages on that side (1 by default), each
    rank holding its stage's share of the layers (kvs_pp_stage_layers)
    and, with --draft-layers, the last stage alone the draft's buffers
    (the others declare it with draft_layers= and draft_head_dim=);
    --window W: a hybrid model whose layers 0 and 2 are sliding-window
    layers of W tokens (full_attn_every 2, docs/kinds/hybrid.md): the
    prefill fills every row, and each window layer of the decode must hold
    the rows from the page-aligned window on and nothing before it;
    --state-heads H --state-bytes C+S: layers 0 and 2 are state layers of
    H state heads of C + S bytes, with no K or V (the prefill gives
    k_buffers for its attention layer alone, the decode one per layer,
    None at the state layers), a state tensor per state layer and a slot
    per room on each side (a different one on each), every state byte of
    the decode checked; --state-slot-shifted, to the decode: a planted
    mistake, each room opened with the next room's state slot, which the
    check must catch)

Every value the prefill puts in its pool is a function of (room, token,
layer, K or V, global head, dim); the decode builds the pool it must end
with from the same function and compares all of it (untouched pages stay
zero), and every room's aux payload byte for byte. Exits 0 on success and
writes DIR/<role>.json with what it measured; else says what differed.
"""

import argparse
import faulthandler
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

if __name__ == "__main__":
    # run() sends SIGUSR1 to a side that ran past its time: print every
    # thread's Python stack (to stdout, which run() reads) before it is
    # killed; registered before torch loads, which takes seconds.
    faulthandler.register(signal.SIGUSR1, file=sys.stdout, all_threads=True)

import torch  # noqa: E402

import kvstage  # noqa: E402

HEADS, DIM, LAYERS, PAGE, POOL_TOKENS = 4, 16, 3, 16, 1024
MAX_AUX = 300
CHUNK = 64  # tokens per chunk: several chunks per room
# The TP ranks and PP stages of the prefill instance (--prefill-tp,
# --prefill-pp) and of the decode instance (--decode-tp, --decode-pp).
PREFILL = {"tp": 2, "pp": 1}
DECODE = {"tp": 1, "pp": 1}
# Context parallelism of the prefill instance (--prefill-cp), and the
# decode's planted address mistake (--cp-addrs-swapped).
CP = {"size": 1, "swap": False}
# A draft model's layers (--draft-layers) and their head dim.
DRAFT = {"layers": 0, "dim": 8, "swap": False}
# Tokens per page of each side's pool (--decode-page sets the decode's).
PAGES = {"prefill": PAGE, "decode": PAGE}
# What a layer holds (--mla: one latent, kvstage's head 0, no V).
KV = {"mla": False, "heads": HEADS}
# A hybrid model's pattern (--window, --state-heads): every 2nd layer full
# attention, the others window layers of "window" tokens or state layers of
# "state_heads" heads of conv + ssm bytes; a state tensor of SLOTS slots
# per state layer; the decode's planted slot mistake (--state-slot-shifted).
HYB = {"every": 0, "window": 0, "state_heads": 0, "conv": 0, "ssm": 0, "shift": False}
SLOTS = 8
# FP8 scale planes (--scales): per-token, 4 bytes a head and token, and
# the KV pool in bytes (fp8), 2 * DIM of them a head (viewed as DIM int16).
SCALES = {"on": False, "bytes": 4, "shift": False}
# room: (total tokens, decode's cached prefix)
ROOMS = {11: (40, 0), 12: (130, 0), 13: (96, 32), 14: (16, 0), 15: (257, 0)}


def layer_kind(layer):
    """"full", "window" or "state": the kind of a layer of the pattern."""
    if HYB["every"] <= 1 or (layer + 1) % HYB["every"] == 0:
        return "full"
    return "window" if HYB["window"] else "state"


def state_layers(layers=range(LAYERS)):
    return [layer for layer in layers if layer_kind(layer) == "state"]


def stage_layers(side, stage):
    """The model layers PP stage `stage` of one side ("prefill", "decode")
    holds, as kvs_pp_stage_layers splits them: the first pp - LAYERS % pp
    stages LAYERS // pp, the others one more."""
    pp = (PREFILL if side == "prefill" else DECODE)["pp"]
    base, short = LAYERS // pp, pp - LAYERS % pp
    first = stage * base if stage < short else short * base + (stage - short) * (base + 1)
    return list(range(first, first + base + (stage >= short)))


def last_stage(side, stage):
    """True on the stage that holds the draft (kvs_layout_draft_stage)."""
    return stage == (PREFILL if side == "prefill" else DECODE)["pp"] - 1


def pp_kw(side, stage):
    """The Rank keywords of a rank of PP stage `stage` ({} without PP on
    either side): its stage, and the other side's PP (peer_pp_size)."""
    pp, peer = (PREFILL, DECODE) if side == "prefill" else (DECODE, PREFILL)
    if pp["pp"] == 1 and peer["pp"] == 1:
        return {}
    return dict(pp_rank=stage, pp_size=pp["pp"], peer_pp_size=peer["pp"], model_layers=LAYERS)


def state_slot(room, side):
    """The room's slot in one side's state tensors: its place among the
    rooms, offset by 3 on the decode, so that a slot is no room id and the
    two sides' slots differ."""
    i = sorted(ROOMS).index(room)
    return (i + (3 if side == "decode" else 0)) % SLOTS


def state_values(room, layer, heads):
    """uint8 [len(heads), conv + ssm] of a room's state for one layer."""
    h = torch.tensor(heads, dtype=torch.int64).view(-1, 1)
    b = torch.arange(HYB["conv"] + HYB["ssm"], dtype=torch.int64).view(1, -1)
    return ((room * 131 + layer * 31 + h * 17 + b * 7 + 1) % 251).to(torch.uint8)


def state_tensors(heads, layers=range(LAYERS)):
    """One zeroed state tensor per state layer of these layers, [SLOTS,
    heads, conv + ssm]."""
    return [torch.zeros(SLOTS, heads, HYB["conv"] + HYB["ssm"], dtype=torch.uint8)
            for _ in state_layers(layers)]


def hybrid_kw(ks, vs, states, every_layer):
    """The Rank keywords of a hybrid pool: the pattern, and with state
    layers the K and V lists either one per layer, None at a state layer
    (every_layer), or for the attention layers alone, the state tensors and
    their slots. {} without a pattern."""
    if not HYB["every"]:
        return {}
    out = dict(full_attn_every=HYB["every"], model_layers=LAYERS)
    if HYB["window"]:
        out["window_tokens"] = HYB["window"]
        return out
    out.update(state_heads=HYB["state_heads"], state_bytes=(HYB["conv"], HYB["ssm"]),
               state_buffers=states, state_slots=SLOTS)
    if not every_layer:
        out.update(k_buffers=[k for k in ks if k is not None],
                   v_buffers=[v for v in vs if v is not None])
    return out


def rows_from(room, layer, side_base):
    """The first token of a layer whose rows a decode holding tokens from
    side_base on receives: a window layer's page-aligned window (the lcm
    of both page sizes, kvs_layout_layer_tokens), else side_base."""
    total = ROOMS[room][0]
    if layer_kind(layer) != "window":
        return side_base
    unit = math.lcm(PAGES["prefill"], PAGES["decode"])
    return max(side_base, max(0, total - HYB["window"]) // unit * unit)


def use_decode_page(size):
    """The decode pages by `size`: a cached prefix must then be whole pages
    of both sides, so room 13's is 64 tokens (of 160) when 32 is not."""
    PAGES["decode"] = size
    if 32 % size != 0:
        ROOMS[13] = (160, 64)


def use_mla():
    KV["mla"], KV["heads"] = True, 1


def use_scales():
    SCALES["on"] = True


def kv_tensor(heads):
    """One zeroed K or V tensor of the pool: fp16, or with --scales fp8 bytes
    (2 * DIM a head, so that viewed as int16 it holds DIM values too)."""
    if SCALES["on"]:
        return torch.zeros(POOL_TOKENS, heads, 2 * DIM, dtype=torch.uint8)
    return torch.zeros(POOL_TOKENS, heads, DIM, dtype=torch.float16)


def scale_tensors(heads, layers=LAYERS):
    """The scale tensors of a pool of `layers` layers (--scales): per
    layer K's and V's (MLA: the latent's), [POOL_TOKENS, heads, 4] bytes
    each; () without scales."""
    if not SCALES["on"]:
        return []
    return [torch.zeros(POOL_TOKENS, heads, SCALES["bytes"], dtype=torch.uint8)
            for _ in range(layers * (1 if KV["mla"] else 2))]


def scale_planes(ss, i):
    """(kv, buffer) of the scale planes of the pool's layer i: kv 2 (K's),
    3 (V's)."""
    n = 1 if KV["mla"] else 2
    return tuple((2 + kv, ss[i * n + kv]) for kv in range(n)) if ss else ()


def planes(k, v):
    """(kv, buffer) of one layer's planes: K and V, or MLA's latent alone."""
    return ((0, k),) if KV["mla"] else ((0, k), (1, v))


def rank_kv(ks, vs, heads, ss=()):
    """The Rank keywords of a pool: its buffers and what they hold."""
    out = dict(k_buffers=ks, kind="mla") if KV["mla"] else \
        dict(k_buffers=ks, v_buffers=vs, total_heads=heads)
    if SCALES["on"]:
        n = 1 if KV["mla"] else 2
        if SCALES["shift"]:  # --shift-scales: layer i gets layer i+1's
            ss = ss[n:] + ss[:n]
        out.update(dtype="fp8", kv_scales="per-token", ks_buffers=ss[0::n])
        if n == 2:
            out["vs_buffers"] = ss[1::n]
    return out


def draft_tensors(heads, last=True):
    """A pool's draft buffers (--draft-layers): (K list, V list), V empty
    for MLA; ([], []) without a draft, or on a PP stage before the last
    (last False), which holds none."""
    dk = [torch.zeros(POOL_TOKENS, heads, DRAFT["dim"], dtype=torch.float16)
          for _ in range(DRAFT["layers"] if last else 0)]
    dv = [] if KV["mla"] else [torch.zeros_like(t) for t in dk]
    return dk, dv


def draft_kw(dk, dv, planted=False):
    """The Rank keywords of the draft buffers; planted (--draft-swapped, to
    the decode): each draft layer's K and V handed over in each other's
    place, which the check must catch. A PP stage before the last, with no
    buffers, declares the draft by its shape."""
    if not dk:
        return dict(draft_layers=DRAFT["layers"], draft_head_dim=DRAFT["dim"]) \
            if DRAFT["layers"] else {}
    if planted and dv:
        dk, dv = dv, dk
    return dict(draft_k_buffers=dk, **({"draft_v_buffers": dv} if dv else {}))


def draft_planes(dk, dv):
    """(global layer id, kv, buffer) of each draft buffer: draft layer d is
    layer LAYERS + d of the pattern, as the simulator numbers it."""
    return [(LAYERS + d, kv, buf) for d in range(len(dk))
            for kv, buf in ((0, dk[d]),) + (((1, dv[d]),) if dv else ())]


def pool_pages(side):
    return POOL_TOKENS // PAGES[side]


def aux_of(room):
    """The room's aux payload: 0 to MAX_AUX bytes, all derived from room."""
    n = (room * 97) % (MAX_AUX + 1) if room != 14 else 0
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"%d:%d" % (room, i)).digest()
        i += 1
    return out[:n]


def values(room, tokens, layer, kv, heads, dim=DIM):
    """int16 values [len(tokens), len(heads), dim] for these tokens/heads
    (kv 0, 1: K, V; 2, 3: their scales, dim 2)."""
    t = torch.tensor(tokens, dtype=torch.int64).view(-1, 1, 1)
    h = torch.tensor(heads, dtype=torch.int64).view(1, -1, 1)
    d = torch.arange(dim, dtype=torch.int64).view(1, 1, -1)
    v = (room * 7919 + t * 131 + layer * 1009 + kv * 50021 + h * 257 + d * 3) % 65521
    return (v - 32760).to(torch.int16)


def pages_by_room(seed, side):
    """Each room's pages on one side, as an engine's allocator gives them:
    shuffled, and no page in two live rooms."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(pool_pages(side), generator=g).tolist()
    out = {}
    ps = PAGES[side]
    for room, (total, base) in sorted(ROOMS.items()):
        n = (total - (base if side == "decode" else 0) + ps - 1) // ps
        out[room], free = free[:n], free[n:]
    return out


def slots(pages, n, side):
    """The pool's token slots of a request's first n tokens on these pages
    of one side (its page size)."""
    ps = PAGES[side]
    i = torch.arange(n)
    return torch.tensor(pages, dtype=torch.int64)[i // ps] * ps + i % ps


def pool():
    ks = [kv_tensor(KV["heads"]) for _ in range(LAYERS)]
    vs = [torch.zeros_like(k) for k in ks]
    return ks, vs, scale_tensors(KV["heads"])


def whose(row, layer, kv):
    """Which (room, token) a pool slot's values belong to, for messages."""
    if not row.any():
        return "zeros"
    for room, (total, _) in ROOMS.items():
        for t in range(total):
            if torch.equal(row, values(room, [t], layer, kv, list(range(KV["heads"])))[0]):
                return "room %d token %d" % (room, t)
    return "no token's values (%s...)" % row[0, :4].tolist()


def refused(call, needle):
    """call raises KvstageError whose text holds needle."""
    try:
        call()
    except kvstage.KvstageError as e:
        if needle not in str(e):
            sys.exit("rank_pair: refused with %r, want %r in it" % (str(e), needle))
        return
    sys.exit("rank_pair: not refused (want %r)" % needle)


def wait_file(path, deadline_s):
    end = time.time() + deadline_s
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit("rank_pair: %s never came" % path)
        time.sleep(0.05)
    with open(path) as f:
        return f.read()


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.rename(tmp, path)


def prefill(folder, fabric, deadline_s):
    local = max(1, KV["heads"] // PREFILL["tp"])  # MLA: the one latent on each
    ranks, pools, tps = [], [], []
    # CP rank c, stage s, TP rank tp at (c * pp + s) * PREFILL["tp"] + tp
    # (add_instance's order)
    for c in range(CP["size"]):
        for stage in range(PREFILL["pp"]):
            layers = stage_layers("prefill", stage)
            for tp in range(PREFILL["tp"]):
                ks = [kv_tensor(local) if layer_kind(layer) != "state" else None
                      for layer in layers]
                vs = [torch.zeros_like(k) if k is not None else None for k in ks]
                ss = scale_tensors(local, len(layers))
                dk, dv = draft_tensors(local, last_stage("prefill", stage))
                st = state_tensors(max(1, HYB["state_heads"] // PREFILL["tp"]), layers)
                pools.append((layers, ks, vs, ss, dk, dv, st))
                tps.append(tp)
                kw = rank_kv(ks, vs, HEADS, ss)
                kw.update(hybrid_kw(ks, vs, st, every_layer=False))
                kw.update(draft_kw(dk, dv))
                kw.update(pp_kw("prefill", stage))
                ranks.append(kvstage.Rank("prefill", page_size=PAGES["prefill"],
                                          peer_page_size=PAGES["decode"], **kw,
                                          tp_rank=tp, tp_size=PREFILL["tp"],
                                          context_parallel=CP["size"], cp_rank=c,
                                          peer_tp_size=DECODE["tp"], chunk_tokens=CHUNK,
                                          max_aux_bytes=MAX_AUX, ring_bytes=8 << 20,
                                          **fabric))
    with open(os.path.join(folder, "prefill.addrs.tmp"), "w") as f:
        f.write("\n".join(r.address for r in ranks))
    os.rename(os.path.join(folder, "prefill.addrs.tmp"), os.path.join(folder, "prefill.addrs"))
    refused(lambda: ranks[0].open_room(98, [0], total_tokens=PAGES["prefill"],
                                       aux=b"x" * (MAX_AUX + 1)),
            "aux: 301 bytes but max_aux_bytes is 300")
    ranks[0].start()  # one rank on the driver's thread, one (if two) in this loop
    for room, (total, _) in sorted(ROOMS.items()):
        pages = pages_by_room(1, "prefill")[room]
        for tp, r, (layers, ks, vs, ss, dk, dv, st) in zip(tps, ranks, pools):
            heads = [0] if KV["mla"] else list(range(tp * local, (tp + 1) * local))
            # A CP rank holds the rows of its range only, where the room's
            # page list (the request's, by token) puts them.
            start, end = r.cp_range(total)
            for i, layer in enumerate(layers):
                if ks[i] is None:
                    continue  # a state layer: no K or V
                for kv, buf in planes(ks[i], vs[i]) + scale_planes(ss, i):
                    view = buf.view(torch.int16)
                    view[slots(pages, total, "prefill")[start:end]] = \
                        values(room, list(range(start, end)), layer, kv, heads,
                               view.shape[-1])
            # The room's state after its last token, per state layer: of
            # this rank's state heads, in the room's slot.
            sh = max(1, HYB["state_heads"] // PREFILL["tp"])
            for layer, buf in zip(state_layers(layers), st):
                buf[state_slot(room, "prefill")] = state_values(
                    room, layer, list(range(tp * sh, (tp + 1) * sh)))
            for layer, kv, buf in draft_planes(dk, dv):
                view = buf.view(torch.int16)
                view[slots(pages, total, "prefill")[start:end]] = \
                    values(room, list(range(start, end)), layer, kv, heads, view.shape[-1])
            r.open_room(room, pages, total_tokens=total,
                        **({"state_slot": state_slot(room, "prefill")} if st else {}))
            unit = math.lcm(PAGES["prefill"], PAGES["decode"])  # whole pages of both
            half = (total // 2) // unit * unit
            if half > 0:
                r.computed(room, half)  # the first half, then the rest with aux
            r.set_aux(room, aux_of(room))
            r.computed(room, total, final=True)
    done = [dict() for _ in ranks]
    end = time.time() + deadline_s
    for r in ranks[2:]:
        r.start()
    while any(len(d) < len(ROOMS) for d in done):
        if time.time() > end:
            sys.exit("rank_pair prefill: rooms not done in %d s: %s" % (deadline_s, done))
        if len(ranks) > 1:
            ranks[1].progress()
            ranks[1].wait(0.01)
        else:
            time.sleep(0.01)
        for d, r in zip(done, ranks):
            for res in r.poll():
                d[res.room] = res
    bad = [(tp, res) for tp, d in enumerate(done) for res in d.values() if not res.ok]
    if bad:
        sys.exit("rank_pair prefill: rooms failed: %s" % bad)
    stats = [r.stats() for r in ranks]
    metrics = kvstage.metrics_text(*ranks)
    for r in ranks:
        r.close()
    write_json(os.path.join(folder, "prefill.json"),
               {"provider": ranks[0].provider, "page_size": ranks[0].page_size,
                "kind": ranks[0].kind, "tp_ranks": tps,
                "rdma_writes": [s["rdma_writes"] for s in stats],
                "bytes": [s["rdma_write_bytes"] for s in stats],
                "driver_steps": [s["driver_steps"] for s in stats],
                "metrics": metrics})


def decode_side(d, stage, fabric):
    """Decode TP rank d of PP stage `stage`: its pool, its Rank and the
    pool it must end with."""
    local = max(1, KV["heads"] // DECODE["tp"])
    heads = [0] if KV["mla"] else list(range(d * local, (d + 1) * local))
    layers = stage_layers("decode", stage)
    ks = [kv_tensor(local) if layer_kind(layer) != "state" else None for layer in layers]
    vs = [torch.zeros_like(k) if k is not None else None for k in ks]
    ss = scale_tensors(local, len(layers))
    dk, dv = draft_tensors(local, last_stage("decode", stage))
    st = state_tensors(max(1, HYB["state_heads"] // DECODE["tp"]), layers)
    kw = rank_kv(ks, vs, HEADS, ss)
    kw.update(hybrid_kw(ks, vs, st, every_layer=True))
    kw.update(draft_kw(dk, dv, DRAFT["swap"]))
    kw.update(pp_kw("decode", stage))
    rank = kvstage.Rank("decode", page_size=PAGES["decode"], peer_page_size=PAGES["prefill"],
                        **kw, tp_rank=d, tp_size=DECODE["tp"], chunk_tokens=CHUNK,
                        max_aux_bytes=MAX_AUX, ring_bytes=8 << 20, **fabric)
    zeros = lambda xs: [torch.zeros_like(x) if x is not None else None for x in xs]  # noqa
    return dict(rank=rank, d=d, stage=stage, layers=layers, heads=heads, ks=ks, vs=vs, ss=ss,
                dk=dk, dv=dv, st=st,
                want_k=zeros(ks), want_v=zeros(vs), want_s=zeros(ss), want_dk=zeros(dk),
                want_dv=zeros(dv), want_st=zeros(st))


def expect(side, room, pages):
    """Fills the pool a decode rank must end with for one room: its rows of
    every layer it receives (a window layer's from its window on), its
    draft rows and its state heads' state in the room's slot."""
    total, base = ROOMS[room]
    at = slots(pages, total - base, "decode")
    for layer, kv, buf in draft_planes(side["want_dk"], side["want_dv"]):
        view = buf.view(torch.int16)
        view[at] = values(room, list(range(base, total)), layer, kv, side["heads"],
                          view.shape[-1])
    for i, layer in enumerate(side["layers"]):
        if side["want_k"][i] is None:
            continue
        first = rows_from(room, layer, base)
        for kv, buf in planes(side["want_k"][i], side["want_v"][i]) + \
                scale_planes(side["want_s"], i):
            view = buf.view(torch.int16)
            view[at[first - base:]] = values(room, list(range(first, total)), layer, kv,
                                             side["heads"], view.shape[-1])
    sh = max(1, HYB["state_heads"] // DECODE["tp"])
    d = side["d"]
    for layer, buf in zip(state_layers(side["layers"]), side["want_st"]):
        buf[state_slot(room, "decode")] = state_values(room, layer,
                                                       list(range(d * sh, (d + 1) * sh)))


def check(side):
    """Exits naming the first difference between a decode rank's pool and
    the one it must hold."""
    name = "decode rank %d" % side["d"] + (" of stage %d" % side["stage"]
                                           if DECODE["pp"] > 1 else "")
    for i, layer in enumerate(side["layers"]):
        if side["ks"][i] is None:
            continue
        for plane, got, want in (("K", side["ks"][i], side["want_k"][i]),
                                 ("V", side["vs"][i], side["want_v"][i]))[
                                     :len(planes(0, 0))]:
            if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                diff = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
                slot = int(diff[0][0])
                sys.exit("rank_pair %s: %s layer %d (%s) differs at %d places, first [slot, "
                         "head, dim] %s; that slot holds %s, want %s"
                         % (name, plane, layer, layer_kind(layer), len(diff), diff[0].tolist(),
                            whose(got.view(torch.int16)[slot], layer, plane == "V"),
                            whose(want.view(torch.int16)[slot], layer, plane == "V")))
        # The scales of every row (--scales), K's then V's.
        for (kv, got), (_, want) in zip(scale_planes(side["ss"], i),
                                        scale_planes(side["want_s"], i)):
            if not torch.equal(got, want):
                diff = (got != want).nonzero()
                sys.exit("rank_pair %s: %s scales of layer %d differ at %d bytes, first "
                         "[slot, head, byte] %s" % (name, "KV"[kv - 2], layer, len(diff),
                                                    diff[0].tolist()))
    # The draft's layers (--draft-layers), every byte.
    for (layer, kv, got), (_, _, want) in zip(draft_planes(side["dk"], side["dv"]),
                                              draft_planes(side["want_dk"], side["want_dv"])):
        if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            diff = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
            sys.exit("rank_pair %s: draft layer %d %s differs at %d places, first "
                     "[slot, head, dim] %s" % (name, layer - LAYERS, "KV"[kv], len(diff),
                                               diff[0].tolist()))
    # The state layers (--state-heads), every byte of every slot.
    for layer, got, want in zip(state_layers(side["layers"]), side["st"], side["want_st"]):
        if not torch.equal(got, want):
            diff = (got != want).nonzero()
            sys.exit("rank_pair %s: state layer %d differs at %d of %d bytes, first [slot, "
                     "state head, byte] %s" % (name, layer, len(diff), want.numel(),
                                               diff[0].tolist()))


def decode(folder, fabric, deadline_s):
    addrs = wait_file(os.path.join(folder, "prefill.addrs"), deadline_s).split("\n")
    dps = PAGES["decode"]
    sides = []
    try:
        for stage in range(DECODE["pp"]):
            for d in range(DECODE["tp"]):
                sides.append(decode_side(d, stage, fabric))
        decode_rooms(sides, addrs, folder, dps, deadline_s)
    finally:
        for side in sides:
            side["rank"].close()


def decode_rooms(sides, addrs, folder, dps, deadline_s):
    rank = sides[0]["rank"]
    n = pool_pages("decode")
    refused(lambda: rank.open_room(99, [1, n], total_tokens=2 * dps),
            "pages[1] = %d is outside the KV pool's %d pages" % (n, n))
    refused(lambda: rank.state(99), "KVS_ENOENT")  # nothing was opened
    if HYB["state_heads"]:
        refused(lambda: rank.open_room(99, [1], total_tokens=dps),
                "state_slot: room 99: this rank's stage has state layers")
        refused(lambda: rank.open_room(99, [1], total_tokens=dps, state_slot=SLOTS),
                "state_slot: room 99: %d is outside the state buffers' slots" % SLOTS)
    if CP["swap"]:  # planted: CP 0 TP 1 and CP 1 TP 0 in each other's place
        addrs[1], addrs[PREFILL["tp"]] = addrs[PREFILL["tp"]], addrs[1]
    for side in sides:
        side["rank"].add_instance(0, addrs, tp_size=PREFILL["tp"], cp_size=CP["size"],
                                  pp_size=PREFILL["pp"])
        side["rank"].connect(0)
        side["rank"].start()
    order = sorted(ROOMS)
    for room in order:
        total, base = ROOMS[room]
        pages = pages_by_room(2, "decode")[room]
        # --state-slot-shifted: the next room's slot, where the check
        # expects the room's own
        given = order[(order.index(room) + 1) % len(order)] if HYB["shift"] else room
        for side in sides:
            r = side["rank"]
            r.open_room(room, pages, total_tokens=total, base_tokens=base,
                        **({"state_slot": state_slot(given, "decode")} if side["st"] else {}))
            seen = r.state(room)
            if seen not in (kvstage.RoomState.BOOTSTRAPPING, kvstage.RoomState.WAITING,
                            kvstage.RoomState.TRANSFERRING, kvstage.RoomState.SUCCESS):
                sys.exit("rank_pair decode: room %d opened in state %r" % (room, seen))
            expect(side, room, pages)
    results = [{} for _ in sides]
    end = time.time() + deadline_s
    while any(len(res) < len(ROOMS) for res in results):
        if time.time() > end:
            sys.exit("rank_pair decode: rooms not done in %d s: have %s, states %s"
                     % (deadline_s, [sorted(res) for res in results],
                        [{r: side["rank"].state(r) for r in ROOMS if r not in res}
                         for side, res in zip(sides, results)]))
        for side, res in zip(sides, results):
            for x in side["rank"].poll():
                res[x.room] = x
        time.sleep(0.02)
    for side, res in zip(sides, results):
        for room, x in sorted(res.items()):
            if not x.ok:
                sys.exit("rank_pair decode: room %d failed: %s" % (room, x))
            if x.aux != aux_of(room):
                sys.exit("rank_pair decode: room %d aux differs: %d bytes, want %d"
                         % (room, len(x.aux), len(aux_of(room))))
        side["rank"].stop()
    for side in sides:
        check(side)
    stats = [side["rank"].stats() for side in sides]
    every = [t for side in sides for key in ("ks", "vs", "ss", "dk", "dv", "st")
             for t in side[key] if t is not None]
    write_json(os.path.join(folder, "decode.json"),
               {"provider": rank.provider, "metrics": rank.metrics(),
                "page_size": rank.page_size, "kind": rank.kind,
                "layer_kinds": rank.layer_kinds, "decode_tp": DECODE["tp"],
                "decode_ranks": len(sides),
                "draft_ranks": sum(1 for side in sides if side["dk"]),
                "peers": sorted({x.peer for x in results[0].values()}),
                "rooms": min(len(res) for res in results),
                "bytes": sum(x.bytes for res in results for x in res.values()),
                "aux_bytes": sum(len(x.aux) for x in results[0].values()),
                "checked_bytes": sum(t.numel() * t.element_size() for t in every),
                "kv_scales": rank.kv_scales,
                "draft_bytes": sum(t.numel() * t.element_size()
                                   for side in sides for t in side["dk"] + side["dv"]),
                "state_bytes": sum(t.numel() for side in sides for t in side["st"]),
                "window_rows": sum(int(t.view(torch.int16).flatten(1).any(1).sum())
                                   for side in sides
                                   for layer, t in zip(side["layers"], side["ks"])
                                   if layer_kind(layer) == "window"),
                "rooms_ok": min(s["rooms_ok"] for s in stats),
                "copies": sum(s["copies"] for s in stats)})


def threads_of(pid):
    """One line per thread of a live process: its name, kernel wait channel
    and the number of the system call it is in ("running" when on a CPU),
    from /proc, so that a hang shows where the native code waits (x86-64:
    202 futex, a lock or condition variable; 7 poll, 271 ppoll, 232
    epoll_wait, the network or a driver's sleep)."""
    lines = []
    try:
        tids = sorted(os.listdir("/proc/%d/task" % pid), key=int)
    except OSError:
        return "  (gone)"
    for tid in tids:
        info = []
        for name in ("comm", "wchan", "syscall"):
            try:
                with open("/proc/%d/task/%s/%s" % (pid, tid, name)) as f:
                    info.append(f.read().strip().split(" ")[0] or "-")
            except OSError:
                info.append("?")
        lines.append("  thread %s %s: wchan %s, syscall %s" % (tid, *info))
    return "\n".join(lines)


def stop_hung(procs):
    """Stops both sides of a pair that ran past its time and returns what
    each was doing: its threads (threads_of), then its Python stacks, which
    SIGUSR1 makes it print (faulthandler, registered when it starts), then
    everything it printed."""
    native = {}
    for role, q in procs.items():
        if q.poll() is None:
            native[role] = threads_of(q.pid)
            q.send_signal(signal.SIGUSR1)
    time.sleep(2)
    report = []
    for role, q in procs.items():
        if q.poll() is None:
            q.kill()
        out = q.communicate()[0].decode(errors="replace")
        report.append("---- %s (exit %s)\n%s\n%s" % (role, q.returncode,
                                                    native.get(role, "  (had exited)"), out))
    return "\n".join(report)


def run(folder, args=(), timeout_s=420):
    """Runs the prefill and the decode side as two processes, rank_pair.py
    ROLE folder ARGS, and checks what they report: both exit 0 (the decode
    found every byte and aux payload as it should be), every room arrived
    and each prefill rank wrote. Returns (decode.json, prefill.json) as
    dicts; AssertionError with the processes' output otherwise."""
    script = os.path.abspath(__file__)
    procs = {role: subprocess.Popen([sys.executable, script, role, str(folder)] + list(args),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for role in ("prefill", "decode")}
    outs = {}
    for role, p in procs.items():
        try:
            outs[role] = p.communicate(timeout=timeout_s)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            raise AssertionError("rank_pair %s did not finish in %d s; where each side "
                                 "was:\n%s" % (role, timeout_s, stop_hung(procs))) from None
    for role, p in procs.items():
        other = "decode" if role == "prefill" else "prefill"
        assert p.returncode == 0, "%s exited %d:\n%s\n---- and the %s (exit %d):\n%s" % (
            role, p.returncode, outs[role], other, procs[other].returncode, outs[other])
    with open(os.path.join(folder, "decode.json")) as f:
        dec = json.load(f)
    with open(os.path.join(folder, "prefill.json")) as f:
        pre = json.load(f)
    print("decode", dec, "prefill", pre)
    assert dec["rooms"] == dec["rooms_ok"] == len(ROOMS)
    assert dec["aux_bytes"] > 0
    # The decode received what the two prefill ranks wrote, one write per
    # chunk; with MLA rank 0 alone wrote, rank 1 only reported.
    assert dec["bytes"] > 0
    if "--mla" in args:  # TP rank 0 of each stage (and CP rank) writes
        assert all((w > 0) == (tp == 0) for w, tp in zip(pre["rdma_writes"], pre["tp_ranks"])), pre
    else:
        assert all(w > 0 for w in pre["rdma_writes"]), pre
    return dec, pre


def main(argv):
    p = argparse.ArgumentParser(description="one side of the two-process Rank test")
    p.add_argument("role", choices=("prefill", "decode"))
    p.add_argument("folder")
    p.add_argument("--fabric", default="verbs")
    p.add_argument("--provider")
    p.add_argument("--address", default=os.environ.get("KVS_VERBS_ADDR"))
    p.add_argument("--deadline-s", type=float, default=240)
    p.add_argument("--decode-page", type=int, default=PAGE)
    p.add_argument("--mla", action="store_true")
    p.add_argument("--scales", action="store_true")
    p.add_argument("--shift-scales", action="store_true")
    p.add_argument("--prefill-cp", type=int, default=1)
    p.add_argument("--cp-addrs-swapped", action="store_true")
    p.add_argument("--draft-layers", type=int, default=0)
    p.add_argument("--draft-swapped", action="store_true")
    p.add_argument("--prefill-tp", type=int, default=2)
    p.add_argument("--decode-tp", type=int, default=1)
    p.add_argument("--prefill-pp", type=int, default=1)
    p.add_argument("--decode-pp", type=int, default=1)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--state-heads", type=int, default=0)
    p.add_argument("--state-bytes", default="0+0")
    p.add_argument("--state-slot-shifted", action="store_true")
    a = p.parse_args(argv)
    PREFILL["tp"], DECODE["tp"] = a.prefill_tp, a.decode_tp
    PREFILL["pp"], DECODE["pp"] = a.prefill_pp, a.decode_pp
    if a.window or a.state_heads:
        if a.window and a.state_heads:
            p.error("--window and --state-heads: give one")
        HYB["every"], HYB["window"], HYB["state_heads"] = 2, a.window, a.state_heads
        HYB["conv"], HYB["ssm"] = (int(x) for x in a.state_bytes.split("+"))
        HYB["shift"] = a.state_slot_shifted and a.role == "decode"
    CP["size"], CP["swap"] = a.prefill_cp, a.cp_addrs_swapped
    DRAFT["layers"], DRAFT["swap"] = a.draft_layers, a.draft_swapped
    use_decode_page(a.decode_page)
    if a.mla:
        use_mla()
    if a.scales:
        use_scales()
    SCALES["shift"] = a.shift_scales and a.role == "decode"
    fabric = dict(fabric=a.fabric, provider=a.provider, bind_addr=a.address)
    {"prefill": prefill, "decode": decode}[a.role](a.folder, fabric, a.deadline_s)


if __name__ == "__main__":
    main(sys.argv[1:])
