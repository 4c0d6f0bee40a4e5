"""_models.py - the library's built-in model shapes (kvs_model_find), as
dicts, and how a model fills the shape fields of plan() and simulate():
the model gives total_heads, head_dim, layers and dtype; a field passed
explicitly overrides it, as `kvstage plan --model` does."""

from . import _convert, _errors, _library


_KINDS = ("gqa", "mla")  # kvs_kv_kind_t by value


def kind_name(value):
    """kvs_kv_kind_t as "gqa" or "mla"."""
    return _KINDS[value] if 0 <= value < len(_KINDS) else "unknown"


_SCALES = ("none", "per-token", "per-block")


def scales_value(scales):
    """kv_scales as (kvs_kv_scales_t, scale_block): "none" (or None), "per-token"
    (one fp32 per token and head), "per-block" or "per-block:N" (MXFP8: one
    e8m0 byte per N elements, 32 by default); KvstageError (KVS_EINVAL)
    naming the argument otherwise. The planner checks the dtype (fp8) and
    that N divides head_dim."""
    if scales is None:
        return 0, 0
    if isinstance(scales, str):
        name, _, block = scales.partition(":")
        if name in _SCALES and (not block or (name == "per-block" and block.isdigit()
                                              and int(block) > 0)):
            return _SCALES.index(name), int(block) if block else 0
    raise _errors.invalid("kv_scales is %r: give 'none', 'per-token' (one fp32 per token "
                          "and head) or 'per-block[:N]' (one e8m0 byte per N elements, "
                          "32 by default)" % (scales,))


def scales_name(value):
    """kvs_kv_scales_t as its name ("none", "per-token", "per-block")."""
    return _SCALES[value] if 0 <= value < len(_SCALES) else "unknown"


def kind_value(kind):
    """"gqa" / "mla" (or 0 / 1, or None for gqa) as kvs_kv_kind_t; KvstageError
    (KVS_EINVAL) naming the argument otherwise."""
    if kind is None:
        return 0
    if isinstance(kind, str) and kind in _KINDS:
        return _KINDS.index(kind)
    if isinstance(kind, int) and not isinstance(kind, bool) and 0 <= kind < len(_KINDS):
        return kind
    raise _errors.invalid("kind is %r: give 'gqa' (K and V per layer) or 'mla' (one "
                          "latent per layer)" % (kind,))


_LAYER_KINDS = ("full", "window", "state")  # kvs_layer_kind_t


def _as_dict(m):
    return {"name": m.name.decode(), "total_heads": m.total_heads,
            "head_dim": m.head_dim, "layers": m.layers,
            "dtype": _convert.dtype_name(m.dtype), "note": m.note.decode(),
            "kind": kind_name(m.kind), "full_attn_every": m.full_attn_every,
            "other_layers": _LAYER_KINDS[m.other_layers], "window_tokens": m.window_tokens,
            "state_heads": m.state_heads,
            "state_bytes": (m.state_conv_bytes, m.state_ssm_bytes)}


def models():
    """Every built-in model as a dict: name, total_heads, head_dim, layers,
    dtype, note, kind ("gqa", or "mla": one latent of head_dim per token)."""
    lib = _library.load()
    return [_as_dict(lib.kvs_model_at(i).contents) for i in range(lib.kvs_model_count())]


def find(name):
    """The model called name (case-insensitive) as a dict; KvstageError
    (KVS_EINVAL) listing the known names otherwise."""
    if not isinstance(name, str):
        raise _errors.invalid("model is %r: give a model name such as "
                              "'llama-3.1-70b'" % (name,))
    m = _library.load().kvs_model_find(name.encode())
    if not m:
        raise _errors.invalid("model '%s' is unknown: use one of %s, or pass "
                              "total_heads, head_dim and layers" % (
                                  name, ", ".join(x["name"] for x in models())))
    return _as_dict(m.contents)


_PATTERN = ("full_attn_every", "window_tokens", "state_heads", "state_bytes")


def fill_pattern(m, out):
    """A hybrid model's layer pattern (docs/kinds/hybrid.md) from the model
    dict m into the dict out, unless the caller gave one of its own (any
    of full_attn_every, window_tokens, state_heads, state_bytes)."""
    if m["full_attn_every"] > 1 and all(out.get(k) is None for k in _PATTERN):
        for key in _PATTERN:
            out[key] = m[key]
        if m["other_layers"] == "window":
            out["state_heads"] = out["state_bytes"] = None
        else:
            out["window_tokens"] = None
    return out


def layer_kinds(every, other, first, count):
    """The kinds of layers [first, first + count) of a pattern, as
    kvs_layout_layer_kind gives them: "full" when every <= 1 or (l + 1) %
    every == 0, else other ("window" or "state")."""
    return ["full" if every <= 1 or (layer + 1) % every == 0 else other
            for layer in range(first, first + count)]


def shape(model, fields):
    """fields (a dict of the caller's keyword arguments) with the model's
    total_heads, head_dim, layers and dtype filled where the caller gave
    none. Returns (model name or None, the new dict)."""
    out = dict(fields)
    if model is None:
        return None, out
    m = find(model)
    for key in ("total_heads", "head_dim", "layers", "dtype", "kind"):
        if out.get(key) is None:
            out[key] = m[key]
    fill_pattern(m, out)
    return m["name"], out


def hybrid_params(params, fields):
    """The layer pattern of a hybrid model (docs/kinds/hybrid.md) into params
    (kvs_layout_params_t or kvs_sim_config_t, whose fields share the names):
    full_attn_every, then window_tokens (window layers) or state_heads with
    state_bytes (conv, ssm) or one number (state layers)."""
    every, window = fields.get("full_attn_every"), fields.get("window_tokens")
    heads, sbytes = fields.get("state_heads"), fields.get("state_bytes")
    _convert.set_int(params, "full_attn_every", every or 0)
    if window is not None and heads is not None:
        raise _errors.invalid("window_tokens and state_heads: give one; the layers that "
                              "are not full attention are all window or all state layers")
    if window is not None:
        params.other_layers = 1  # KVS_LAYER_WINDOW
        _convert.set_int(params, "window_tokens", window)
    if heads is not None:
        params.other_layers = 2  # KVS_LAYER_STATE
        _convert.set_int(params, "state_heads", heads)
        if isinstance(sbytes, int) and not isinstance(sbytes, bool):
            sbytes = (0, sbytes)
        if not isinstance(sbytes, (tuple, list)) or len(sbytes) != 2:
            raise _errors.invalid("state_bytes is %r: give (conv, ssm) bytes of one state "
                                  "head of one request, or one number" % (sbytes,))
        _convert.set_int(params, "state_conv_bytes", sbytes[0])
        _convert.set_int(params, "state_ssm_bytes", sbytes[1])
    elif sbytes is not None:
        raise _errors.invalid("state_bytes without state_heads: give state_heads too")

