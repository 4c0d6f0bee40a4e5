"""_plan.py - plan(): the layout planner (kvs_layout_init and the region and
writer queries of include/kvstage/kvstage.h) as one dict, with the keys
`kvstage plan --json` uses for the same numbers."""

import ctypes

from . import _convert, _errors, _library, _models
from . import _structs as S

_SHAPE = ("total_heads", "heads_per_rank", "heads_per_rank_tp", "head_dim",
          "layers", "page_size", "prefill_tp", "decode_tp", "prefill_pp",
          "decode_pp", "chunk_tokens", "decode_page_size", "prefill_cp",
          "draft_layers", "draft_head_dim", "draft_kv_heads")
_LAYOUT = ("total_heads", "head_dim", "elem_bytes", "layers", "page_size",
           "prefill_tp", "decode_tp", "prefill_pp", "decode_pp", "chunk_tokens",
           "grid_tokens", "chunk_pages", "src_heads", "dst_heads", "decode_layers",
           "prefill_layers", "tp_writers", "expected_arrivals",
           "targets_per_prefill", "planes", "tp_sources", "decode_page_size")


_ROLE_PREFILL, _ROLE_DECODE = 0, 1  # kvs_role_t
_MAX_CP_CHUNKS = 64  # chunks listed, as `kvstage plan --prefill-cp`


def _check(rc, what):
    if rc != 0:
        _errors.raise_for(rc, detail=what)


def _context_parallel(lib, lay, stage, total):
    """The CP ranges of a request of `total` tokens and, per chunk of decode
    rank 0's regions at `stage`, its arrivals and CP parts with their
    writers (docs/kinds/context-parallel.md): `kvstage plan --json`'s
    context_parallel member."""
    ref = ctypes.byref
    ranges = []
    for c in range(lay.prefill_cp):
        start, end = ctypes.c_int64(), ctypes.c_int64()
        _check(lib.kvs_layout_cp_range(ref(lay), total, c, ref(start), ref(end)),
               "kvs_layout_cp_range(CP rank %d)" % c)
        ranges.append([start.value, end.value])
    pages = -(-total // lay.decode_page_size)
    nchunks = lib.kvs_grid_num_chunks(ref(lay), pages)
    chunks = []
    for i in range(min(nchunks, _MAX_CP_CHUNKS)):
        ch = S.Chunk()
        first, count = ctypes.c_int64(), ctypes.c_int64()
        _check(lib.kvs_grid_chunk(ref(lay), 0, total, i, ref(ch)), "kvs_grid_chunk(%d)" % i)
        _check(lib.kvs_layout_cp_writers(ref(lay), total, ref(ch), ref(first), ref(count)),
               "kvs_layout_cp_writers(chunk %d)" % i)
        parts = []
        for c in range(first.value, first.value + count.value):
            part = S.CpPart()
            _check(lib.kvs_layout_cp_part(ref(lay), 0, stage, total, ref(ch), c, ref(part)),
                   "kvs_layout_cp_part(chunk %d, CP rank %d)" % (i, c))
            writers = []
            for j in range(lay.tp_writers):
                w = S.Writer()
                _check(lib.kvs_layout_writer(ref(lay), 0, stage, j,
                                             part.token_end - part.token_start, ref(w)),
                       "kvs_layout_writer(CP rank %d, writer %d)" % (c, j))
                writers.append({"writer_index": c * lay.tp_writers + j,
                                "prefill_rank": w.prefill_rank,
                                "offset": part.offset_bytes + w.offset_bytes,
                                "bytes": w.len_bytes})
            parts.append({"cp_rank": c, "token_start": part.token_start,
                          "token_end": part.token_end,
                          "local_token_start": part.local_token_start,
                          "offset": part.offset_bytes, "bytes": part.len_bytes,
                          "writers": writers})
        chunks.append({"chunk": i, "token_start": ch.token_start, "token_end": ch.token_end,
                       "arrivals": lib.kvs_layout_chunk_arrivals(ref(lay), total, ref(ch)),
                       "parts": parts})
    return {"request_tokens": total, "decode_rank": 0, "decode_stage": stage,
            "ranges": ranges, "chunks": chunks,
            "chunks_left_out": nchunks - len(chunks)}


def _region_bytes(lib, lay, decode_rank, decode_stage, tokens):
    """kvs_layout_region_bytes, raising KvstageError on failure."""
    region = ctypes.c_int64()
    rc = lib.kvs_layout_region_bytes(ctypes.byref(lay), decode_rank, decode_stage, tokens,
                                     ctypes.byref(region))
    if rc != 0:
        _errors.raise_for(rc, detail="kvs_layout_region_bytes(decode rank %d, stage %d)"
                          % (decode_rank, decode_stage))
    return region.value


def layout_params(fields):
    """A kvs_layout_params_t from shape fields (None or absent = 0, the
    planner's default; dtype by name or number, default bf16)."""
    params = S.LayoutParams()
    for key in _SHAPE:
        value = fields.get(key)
        _convert.set_int(params, key, 0 if value is None else value)
    params.dtype = _convert.dtype(fields.get("dtype") or "bf16")
    params.kind = _models.kind_value(fields.get("kind"))
    params.kv_scales, params.scale_block = _models.scales_value(fields.get("kv_scales"))
    _models.hybrid_params(params, fields)
    return params


def _hybrid_writers(lib, lay, d, stage, tokens, request):
    """Region bytes and writers of decode rank d at `stage` for the last
    chunk (its last `tokens` tokens) of a hybrid model's request of
    `request` tokens (kvs_layout_hybrid_writer)."""
    ch = S.Chunk(token_start=request - tokens, token_end=request)
    region, writers = 0, []
    for i in range(lay.tp_writers):
        hw = S.HybridWriter()
        _check(lib.kvs_layout_hybrid_writer(ctypes.byref(lay), d, stage, i, request,
                                            ctypes.byref(ch), ctypes.byref(hw)),
               "kvs_layout_hybrid_writer(decode rank %d, stage %d, writer %d)"
               % (d, stage, i))
        w = hw.w
        region = w.offset_bytes + w.len_bytes
        writers.append({"writer_index": w.writer_index, "prefill_rank": w.prefill_rank,
                        "src_head_start": w.heads.src_start,
                        "dst_head_start": w.heads.dst_start,
                        "num_heads": w.heads.num_heads,
                        "offset": w.offset_bytes, "bytes": w.len_bytes})
    return region, writers


def plan(model=None, *, prefill_tp, decode_tp, page_size, total_heads=None, kind=None,
         heads_per_rank=None, heads_per_rank_tp=None, head_dim=None, layers=None,
         dtype=None, prefill_pp=None, decode_pp=None, chunk_tokens=None,
         tokens=None, decode_page_size=None, prefill_cp=None, request_tokens=None,
         kv_scales=None, full_attn_every=None, window_tokens=None, state_heads=None,
         state_bytes=None, draft_layers=None, draft_head_dim=None, draft_kv_heads=None):
    """Plans the staging transfer of one chunk (spec sections 3-5).

    model: a built-in model name (see models()); it fills total_heads,
    head_dim, layers, dtype and kind, and explicit arguments override it.
    kind: "gqa" (K and V per layer, the default) or "mla" (one latent of
    head_dim elements per token and layer, the same on every TP rank).
    decode_page_size: tokens per page of the decode's KV pool when it is
    not page_size (which is then the prefill's); the chunk grid is then a
    multiple of both sizes' lcm (docs/kinds/page-sizes.md).
    kv_scales: FP8 KV with scale planes (dtype "fp8"): None or "none",
    "per-token" (one fp32 per token and head) or "per-block[:N]" (MXFP8: one
    e8m0 byte per N elements, 32); each layer slot of a region then holds
    its rows and their scale rows (docs/kinds/fp8-scales.md).
    full_attn_every, window_tokens, state_heads, state_bytes: a hybrid
    model's layers (docs/kinds/hybrid.md; gpt-oss and qwen3-next-80b-a3b
    give theirs): layer l is full attention when (l + 1) % full_attn_every
    == 0, the others window layers of window_tokens tokens or state layers
    of state_heads heads of state_bytes (conv, ssm) a request. The regions
    listed are then those of the last chunk (its last `tokens` tokens) of a
    request of request_tokens (default tokens): a writer's bytes are its
    slots' rows, then the state of its state heads.
    draft_layers, draft_head_dim, draft_kv_heads: a draft model's layers
    (speculative decoding, docs/kinds/draft.md), moved after the model's in
    each writer's block; its heads are the model's (draft_kv_heads is
    checked), its head dim draft_head_dim (default head_dim). The dict has
    draft_layers, draft_head_dim and draft_part_bytes (of each writer's
    block of `tokens` rows).
    Zero or None takes the planner's default (prefill_pp, decode_pp: 1;
    chunk_tokens: 8192; dtype: bf16). tokens: the chunk to lay out,
    1..grid_tokens (default: a full chunk of grid_tokens).

    Layers need not divide by the PP sizes: stage s of PP holds
    layers // PP layers, the last layers % PP stages one more (spec §4).

    prefill_cp: prefill context-parallel ranks (default 1), each holding one
    contiguous token range of a request; with 2 or more the dict has
    context_parallel: for a request of request_tokens (default CP x
    grid_tokens + grid_tokens // 2) each CP rank's range and, per chunk of
    decode rank 0's regions, its arrivals and CP parts with their writers
    (docs/kinds/context-parallel.md). Every plan has prefill_cp.

    Returns a dict: the resolved shape and parallelism, the derived layout
    (grid_tokens, chunk_pages, src_heads, dst_heads, tp_writers,
    expected_arrivals, ...; prefill_layers and decode_layers are the most
    layers one stage holds), path ("staging" or "direct"),
    max_region_bytes (the largest region of a full chunk; 0 on the direct
    path), prefill_stages and decode_stages (per stage its stage,
    first_layer and num_layers; a decode stage also its region_bytes for
    `tokens` tokens, the same on every decode rank) and decode_ranks: per
    decode rank, at decode_stage (the last, which holds the most layers),
    its region_bytes for `tokens` tokens and its writers (writer_index,
    prefill_rank, src_head_start, dst_head_start, num_heads, offset, bytes).
    Raises KvstageError naming the argument to change.
    """
    name, fields = _models.shape(model, {
        "total_heads": total_heads, "heads_per_rank": heads_per_rank,
        "heads_per_rank_tp": heads_per_rank_tp, "head_dim": head_dim,
        "layers": layers, "dtype": dtype, "page_size": page_size,
        "prefill_tp": prefill_tp, "decode_tp": decode_tp, "prefill_pp": prefill_pp,
        "decode_pp": decode_pp, "chunk_tokens": chunk_tokens, "kind": kind,
        "decode_page_size": decode_page_size, "prefill_cp": prefill_cp,
        "kv_scales": kv_scales, "full_attn_every": full_attn_every,
        "window_tokens": window_tokens, "state_heads": state_heads,
        "state_bytes": state_bytes, "draft_layers": draft_layers,
        "draft_head_dim": draft_head_dim, "draft_kv_heads": draft_kv_heads})
    params = layout_params(fields)
    lib = _library.load()
    lay = S.Layout()
    err = S.Error()
    rc = lib.kvs_layout_init(ctypes.byref(lay), ctypes.byref(params), ctypes.byref(err))
    if rc != 0:
        _errors.raise_for(rc, err)

    if tokens is None:
        tokens = lay.grid_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or \
            not 1 <= tokens <= lay.grid_tokens:
        raise _errors.invalid(
            "tokens is %r: give 1..%d, a chunk never spans more than the grid "
            "width grid_tokens; raise chunk_tokens to plan bigger chunks"
            % (tokens, lay.grid_tokens))

    hybrid = lay.full_attn_every > 1
    request = request_tokens if hybrid and request_tokens is not None else tokens
    if hybrid and (isinstance(request, bool) or not isinstance(request, int) or
                   not tokens <= request <= 1 << 40):
        raise _errors.invalid("request_tokens is %r: give at least tokens (%d): the chunk "
                              "listed is the request's last" % (request, tokens))
    out = {"model": name}
    for key in _LAYOUT:
        out[key] = getattr(lay, key)
    out["dtype"] = _convert.dtype_name(lay.dtype)
    out["kv_kind"] = _models.kind_name(lay.kind)
    out["kv_scales"] = _models.scales_name(lay.kv_scales)
    out["scale_block"] = lay.scale_block
    out["scale_bytes"] = lay.scale_bytes
    out["tokens"] = tokens
    staging = _convert.path_name(lay.path) == "staging"
    out["path"] = "staging" if staging else "direct"
    out["max_region_bytes"] = lib.kvs_layout_max_region_bytes(ctypes.byref(lay)) \
        if staging else 0
    for role, key, pp in ((_ROLE_PREFILL, "prefill_stages", lay.prefill_pp),
                          (_ROLE_DECODE, "decode_stages", lay.decode_pp)):
        stages = []
        for e in range(pp):
            first, count = ctypes.c_int64(), ctypes.c_int64()
            rc = lib.kvs_layout_stage_layers(ctypes.byref(lay), role, e,
                                             ctypes.byref(first), ctypes.byref(count))
            if rc != 0:
                _errors.raise_for(rc, detail="kvs_layout_stage_layers(%s stage %d)"
                                  % (key, e))
            stage = {"stage": e, "first_layer": first.value, "num_layers": count.value}
            if role == _ROLE_DECODE and hybrid:
                stage["region_bytes"] = _hybrid_writers(lib, lay, 0, e, tokens, request)[0]
            elif role == _ROLE_DECODE:
                stage["region_bytes"] = _region_bytes(lib, lay, 0, e, tokens)
            stages.append(stage)
        out[key] = stages
    stage = lay.decode_pp - 1  # the last decode stage holds the most layers
    ranks = []
    for d in range(lay.decode_tp):
        if hybrid:
            region, writers = _hybrid_writers(lib, lay, d, stage, tokens, request)
            ranks.append({"decode_rank": d, "decode_stage": stage, "region_bytes": region,
                          "expected_arrivals": lay.expected_arrivals, "writers": writers})
            continue
        region = _region_bytes(lib, lay, d, stage, tokens)
        writers = []
        for i in range(lay.tp_writers):
            w = S.Writer()
            rc = lib.kvs_layout_writer(ctypes.byref(lay), d, stage, i, tokens,
                                       ctypes.byref(w))
            if rc != 0:
                _errors.raise_for(rc, detail="kvs_layout_writer(decode rank %d, "
                                             "stage %d, writer %d)" % (d, stage, i))
            writers.append({"writer_index": w.writer_index,
                            "prefill_rank": w.prefill_rank,
                            "src_head_start": w.heads.src_start,
                            "dst_head_start": w.heads.dst_start,
                            "num_heads": w.heads.num_heads,
                            "offset": w.offset_bytes, "bytes": w.len_bytes})
        ranks.append({"decode_rank": d, "decode_stage": stage, "region_bytes": region,
                      "expected_arrivals": lay.expected_arrivals, "writers": writers})
    out["decode_ranks"] = ranks
    out["prefill_cp"] = lay.prefill_cp
    out["full_attn_every"] = lay.full_attn_every
    out["other_layers"] = ("full", "window", "state")[lay.other_layers]
    out["window_tokens"] = lay.window_tokens
    out["state_heads"] = lay.state_heads
    out["state_conv_bytes"] = lay.state_conv_bytes
    out["state_ssm_bytes"] = lay.state_ssm_bytes
    out["draft_layers"] = lay.draft_layers
    out["draft_head_dim"] = lay.draft_head_dim
    out["draft_part_bytes"] = lib.kvs_layout_draft_part_bytes(
        ctypes.byref(lay), tokens,
        lay.src_heads if lay.prefill_tp > lay.decode_tp else lay.dst_heads)
    if hybrid:
        out["request_tokens"] = request
        return out
    if request_tokens is not None and lay.prefill_cp <= 1:
        raise _errors.invalid(
            "request_tokens is %r: it lists the chunks of a request split over prefill "
            "CP ranks: give prefill_cp 2 or more, or drop request_tokens" % (request_tokens,))
    if lay.prefill_cp > 1:
        if request_tokens is None:
            request_tokens = lay.prefill_cp * lay.grid_tokens + lay.grid_tokens // 2
        if isinstance(request_tokens, bool) or not isinstance(request_tokens, int) or \
                not 1 <= request_tokens <= 1 << 24:
            raise _errors.invalid("request_tokens is %r: give 1..%d tokens"
                                  % (request_tokens, 1 << 24))
        out["context_parallel"] = _context_parallel(lib, lay, stage, request_tokens)
    return out
