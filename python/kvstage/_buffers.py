"""_buffers.py - an engine's KV buffers (torch tensors on CPU or CUDA, or
numpy arrays) checked and described for the rank runtime: per layer a K
and a V buffer (an MLA pool: one latent buffer), each [tokens..., heads,
head_dim] and C-contiguous, all of one dtype, one device and one shape;
the layers as kvs_kv_layer_t (MLA: the latent as K, v_addr 0).

Three ways to hand them over, as engines hold them:
  k_buffers=[...], v_buffers=[...]  one tensor per layer each (sglang's
                                    MHATokenToKVPool k_buffer / v_buffer,
                                    [pool_tokens, heads, head_dim]);
  k_buffers=[...] alone, MLA        one latent tensor per layer (sglang's
                                    MLATokenToKVPool kv_buffer,
                                    [pool_tokens, 1, latent_dim]);
  kv_caches=[...] or {name: ...}    one tensor per layer holding K and V,
                                    [2, num_blocks, block_size, heads,
                                    head_dim] (vLLM's register_kv_caches);
                                    block_size must be the page size.
With FP8 scale planes (kv_scales, docs/kinds/fp8-scales.md) a scale buffer
beside each K and V buffer: ks_buffers=[...], vs_buffers=[...] (MLA:
ks_buffers alone), one tensor per layer, C-contiguous, of exactly
pool_tokens x heads x scale bytes of a head (e.g. [pool_tokens, heads] fp32
for per-token, [pool_tokens, heads, head_dim / N] uint8 for per-block:N),
token-major as the KV rows, on the KV's device.
A hybrid model (docs/kinds/hybrid.md) whose stage has state layers holds
K and V for its attention layers alone: each per-layer list (k_buffers,
v_buffers, kv_caches, ks_buffers, vs_buffers) is given either for every
layer of the stage, None at its state layers, or for its full and window
layers alone, in layer order (select_attention); and state_buffers, one
per state layer of the stage, [state_slots, local state heads, conv + ssm
bytes] of any dtype, C-contiguous, on the KV's device (Pool.add_states).
Nothing here touches a C object: a refusal raises KvstageError KVS_EINVAL
naming the argument (e.g. "k_buffers[3]") and what to change.
"""

from . import _errors

# kvstage's dtype names by the array libraries' names.
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float": "fp32", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
           "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
# Raw storage an engine may use for a dtype its library lacks (numpy has no
# bfloat16, older torch no fp8): accepted when dtype= names the real one.
_RAW = {"uint16": ("bf16", "fp16"), "int16": ("bf16", "fp16"), "uint8": ("fp8",),
        "int8": ("fp8",)}
_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


class Buffer:
    """One K or V buffer: where it is and what it holds."""

    def __init__(self, obj, name):
        self.obj = obj
        self.name = name
        if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):  # torch
            self.ptr = int(obj.data_ptr())
            self.shape = tuple(int(d) for d in obj.shape)
            self.contiguous = bool(obj.is_contiguous())
            self.itemsize = int(obj.element_size())
            self.dtype = str(obj.dtype).replace("torch.", "")
            dev = obj.device
            self.device = (dev.type, dev.index if dev.index is not None else 0) \
                if dev.type == "cuda" else (dev.type, None)
        elif hasattr(obj, "__array_interface__"):  # numpy and friends
            ai = obj.__array_interface__
            self.ptr = int(ai["data"][0])
            self.shape = tuple(int(d) for d in ai["shape"])
            self.contiguous = ai.get("strides") is None or bool(obj.flags["C_CONTIGUOUS"])
            self.itemsize = int(obj.itemsize)
            self.dtype = str(obj.dtype)
            self.device = ("cpu", None)
        else:
            raise _errors.invalid("%s: a torch tensor or a numpy array, not %s"
                                  % (name, type(obj).__name__))
        n = 1
        for d in self.shape:
            n *= d
        self.nbytes = n * self.itemsize

    def where(self):
        kind, index = self.device
        return kind if index is None else "%s:%d" % (kind, index)


def _kv_dtype(buf, want):
    """kvstage's dtype name for buf, checked against dtype= (want, or None)."""
    name = _DTYPES.get(buf.dtype)
    if name is None and buf.dtype in _RAW:
        if want is None or want not in _RAW[buf.dtype]:
            raise _errors.invalid(
                "%s: dtype %s is raw storage: pass dtype= the KV cache's real dtype (%s)"
                % (buf.name, buf.dtype, " or ".join(_RAW[buf.dtype])))
        return want
    if name is None:
        raise _errors.invalid("%s: dtype %s is not a KV cache dtype: use bfloat16, "
                              "float16, float8 or float32" % (buf.name, buf.dtype))
    if want is not None and want != name:
        raise _errors.invalid("%s: dtype %s but dtype=%r: give tensors of the model's "
                              "KV dtype or fix dtype=" % (buf.name, buf.dtype, want))
    return name


def select_attention(values, name, kinds):
    """The entries of the stage's attention (full and window) layers from a
    per-layer list given either for every layer of the stage (kinds, one
    per layer: "full", "window" or "state"), None at its state layers, or
    for the attention layers alone, in layer order; a dict (kv_caches) by
    its values in order. None stays None. KvstageError naming the argument
    and both counts it takes otherwise."""
    if values is None or kinds is None:
        return values
    keys = None
    if isinstance(values, dict):
        keys, items = list(values.keys()), list(values.values())
    else:
        items = list(values)
    attn = [i for i, kind in enumerate(kinds) if kind != "state"]
    state = len(kinds) - len(attn)
    if len(items) == len(kinds) and len(attn) != len(kinds):
        for i, kind in enumerate(kinds):
            if (kind == "state") != (items[i] is None):
                raise _errors.invalid(
                    "%s[%d]: layer %d of this rank's stage is a %s layer: give %s there "
                    "(%s), or give the %d attention layers' buffers alone"
                    % (name, i, i, kind, "None" if kind == "state" else "its buffer",
                       "a state layer keeps no K or V" if kind == "state"
                       else "it keeps K and V", len(attn)))
        picked = attn
    elif len(items) == len(attn):
        for i, item in enumerate(items):
            if item is None:
                raise _errors.invalid("%s[%d]: None, but the %d entries are the stage's "
                                      "attention layers: give each one's buffer"
                                      % (name, i, len(items)))
        picked = list(range(len(items)))
    elif not state:
        raise _errors.invalid("%s: %d given, but this rank's stage has %d layers: give one "
                              "per layer" % (name, len(items), len(kinds)))
    else:
        raise _errors.invalid(
            "%s: %d given, but this rank's stage has %d layers, %d of them state layers: "
            "give %d (one per layer, None at each state layer) or %d (its full and window "
            "layers alone, in layer order)" % (name, len(items), len(kinds), state,
                                               len(kinds), len(attn)))
    if keys is not None:
        return {keys[i]: items[i] for i in picked}
    return [items[i] for i in picked]


def _latents(k_buffers, v_buffers, kv_caches):
    """[(latent Buffer, None)] per layer of an MLA pool: k_buffers alone."""
    if v_buffers is not None or kv_caches is not None:
        raise _errors.invalid("%s: an MLA pool holds one latent per layer: give it as "
                              "k_buffers= alone (sglang's kv_buffer), no V"
                              % ("v_buffers" if v_buffers is not None else "kv_caches"))
    if k_buffers is None or not list(k_buffers):
        raise _errors.invalid("k_buffers: give the MLA pool's latent buffers, one tensor "
                              "per layer [pool_tokens, 1, latent_dim]")
    return [(Buffer(k, "k_buffers[%d]" % i), None) for i, k in enumerate(k_buffers)]


def _pairs(k_buffers, v_buffers, kv_caches, page_size, planes=2):
    """[(k Buffer, v Buffer)] per layer, from either form; with planes 1
    (MLA) [(latent Buffer, None)]."""
    if planes == 1:
        return _latents(k_buffers, v_buffers, kv_caches)
    if kv_caches is not None:
        if k_buffers is not None or v_buffers is not None:
            raise _errors.invalid("kv_caches: give either kv_caches or k_buffers and "
                                  "v_buffers, not both")
        if isinstance(kv_caches, dict):
            items = [("kv_caches[%r]" % key, t) for key, t in kv_caches.items()]
        else:
            items = [("kv_caches[%d]" % i, t) for i, t in enumerate(kv_caches)]
        if not items:
            raise _errors.invalid("kv_caches: empty: give one tensor per layer")
        out = []
        for name, t in items:
            whole = Buffer(t, name)
            if len(whole.shape) < 4 or whole.shape[0] != 2:
                raise _errors.invalid(
                    "%s: shape %s is not [2, num_blocks, block_size, heads, head_dim] "
                    "(K and V of one layer)" % (name, list(whole.shape)))
            if not whole.contiguous:
                raise _errors.invalid("%s: not contiguous: give the cache tensor itself, "
                                      "not a view with strides (.contiguous() copies)"
                                      % name)
            if len(whole.shape) == 5 and whole.shape[2] != page_size:
                raise _errors.invalid("%s: block_size (dim 2) is %d but page_size is %d: "
                                      "kvstage's page is the engine's block"
                                      % (name, whole.shape[2], page_size))
            out.append((Buffer(t[0], name + "[0]"), Buffer(t[1], name + "[1]")))
        return out
    if k_buffers is None or v_buffers is None:
        raise _errors.invalid("k_buffers, v_buffers: give the KV pool, as k_buffers= and "
                              "v_buffers= (a tensor per layer each) or kv_caches=")
    k_buffers, v_buffers = list(k_buffers), list(v_buffers)
    if not k_buffers:
        raise _errors.invalid("k_buffers: empty: give one tensor per layer")
    if len(k_buffers) != len(v_buffers):
        raise _errors.invalid("v_buffers: %d tensors but k_buffers has %d: one K and one "
                              "V per layer" % (len(v_buffers), len(k_buffers)))
    return [(Buffer(k, "k_buffers[%d]" % i), Buffer(v, "v_buffers[%d]" % i))
            for i, (k, v) in enumerate(zip(k_buffers, v_buffers))]


def _scale_bytes(kind, block, head_dim):
    """Bytes of one head's scales in a token row (kvs_kv_scales_head_bytes):
    0 (none), 4 (per-token fp32), head_dim / block (per-block, 0 -> 32);
    KVS_EINVAL naming kv_scales when the block does not divide head_dim."""
    if kind == 0:
        return 0
    if kind == 1:
        return 4
    b = block or 32
    if head_dim % b != 0:
        raise _errors.invalid("kv_scales: per-block:%d needs the block to divide head_dim %d: "
                              "give per-block:N with N dividing it" % (b, head_dim))
    return head_dim // b


class Pool:
    """The checked KV pool: its layers, geometry and memory ranges."""

    def __init__(self, k_buffers, v_buffers, kv_caches, page_size, dtype=None,
                 head_dim=None, heads=None, layers=None, planes=2, scales=None,
                 drafts=None):
        if not isinstance(page_size, int) or page_size <= 0:
            raise _errors.invalid("page_size: %r: give the KV cache's page (block) size in "
                                  "tokens, > 0" % (page_size,))
        pairs = _pairs(k_buffers, v_buffers, kv_caches, page_size, planes)
        if layers is not None and layers != len(pairs):
            raise _errors.invalid("layers=%d but the KV pool has %d layers: give this "
                                  "rank's layers (its pipeline stage's share)"
                                  % (layers, len(pairs)))
        first = pairs[0][0]
        self.buffers = [b for pair in pairs for b in pair if b is not None]
        self.dtype = dtype
        for b in self.buffers:
            if not b.contiguous:
                raise _errors.invalid("%s: not contiguous: give the pool's tensor itself, "
                                      "not a strided view (kvstage copies whole token "
                                      "rows)" % b.name)
            if len(b.shape) < 2:
                raise _errors.invalid("%s: shape %s: need [tokens, heads, head_dim]"
                                      % (b.name, list(b.shape)))
            self.dtype = _kv_dtype(b, self.dtype)
            if b.device != first.device:
                raise _errors.invalid("%s: on %s but %s is on %s: one rank's KV pool lives "
                                      "on one device" % (b.name, b.where(), first.name,
                                                         first.where()))
            if b.device[0] not in ("cpu", "cuda"):
                raise _errors.invalid("%s: on %s: kvstage moves KV from CPU or CUDA memory"
                                      % (b.name, b.where()))
            if b.shape != first.shape:
                raise _errors.invalid("%s: shape %s but %s has %s: every layer's K and V "
                                      "have one shape" % (b.name, list(b.shape), first.name,
                                                          list(first.shape)))
            if b.ptr == 0 or b.nbytes == 0:
                raise _errors.invalid("%s: empty: the KV pool needs memory" % b.name)
        self.heads, self.head_dim = first.shape[-2], first.shape[-1]
        if head_dim is not None and head_dim != self.head_dim:
            raise _errors.invalid("%s: head_dim (last dim) is %d but the model's is %d"
                                  % (first.name, self.head_dim, head_dim))
        if heads is not None and heads != self.heads:
            raise _errors.invalid("%s: %d KV heads (dim -2) but this rank holds %d (the "
                                  "model's KV heads over tp_size)"
                                  % (first.name, self.heads, heads))
        tokens = 1
        for d in first.shape[:-2]:
            tokens *= d
        self.tokens = tokens
        self.num_pages = tokens // page_size
        if self.num_pages == 0:
            raise _errors.invalid("%s: %d token slots, less than one page of %d"
                                  % (first.name, tokens, page_size))
        elem = _BYTES[self.dtype]
        if first.itemsize != elem:
            raise _errors.invalid("%s: items of %d bytes, but %s has %d"
                                  % (first.name, first.itemsize, self.dtype, elem))
        self.device = first.device
        self.layers = len(pairs)
        self.elem_bytes = elem
        self.pairs = pairs
        self.scale_pairs = self._scale_pairs(scales, planes)
        self.draft_pairs, self.draft_head_dim = self._draft_pairs(drafts, planes)
        self.state_buffers = []
        # No two buffers may share memory: each layer's K and V are its own.
        self._no_overlap()

    def _scale_pairs(self, scales, planes):
        """[(ks Buffer, vs Buffer or None)] per layer from scales =
        (kvs_kv_scales_t, scale_block, ks_buffers, vs_buffers), or [] without
        scale planes."""
        kind, block, ks_buffers, vs_buffers = scales if scales is not None else (0, 0, None, None)
        self.scale_bytes = _scale_bytes(kind, block, self.head_dim)
        scale_bytes = self.scale_bytes
        if scale_bytes == 0:
            for name, given in (("ks_buffers", ks_buffers), ("vs_buffers", vs_buffers)):
                if given is not None:
                    raise _errors.invalid("%s: scale buffers without kv_scales: give kv_scales="
                                          "'per-token' or 'per-block[:N]' (with dtype fp8), "
                                          "or drop them" % name)
            return []
        if ks_buffers is None or (planes == 2 and vs_buffers is None):
            raise _errors.invalid("ks_buffers%s: kv_scales needs a scale buffer beside each "
                                  "%s buffer, one tensor per layer"
                                  % (", vs_buffers" if planes == 2 else "",
                                     "K and V" if planes == 2 else "latent"))
        if planes == 1 and vs_buffers is not None:
            raise _errors.invalid("vs_buffers: an MLA pool has no V: give its latent's scales "
                                  "as ks_buffers= alone")
        named = [("ks_buffers", list(ks_buffers))]
        if planes == 2:
            named.append(("vs_buffers", list(vs_buffers)))
        want = self.tokens * self.heads * scale_bytes
        out = []
        for name, bufs in named:
            if len(bufs) != self.layers:
                raise _errors.invalid("%s: %d tensors but the KV pool has %d layers: one scale "
                                      "buffer per layer" % (name, len(bufs), self.layers))
            col = []
            for i, t in enumerate(bufs):
                b = Buffer(t, "%s[%d]" % (name, i))
                if not b.contiguous:
                    raise _errors.invalid("%s: not contiguous: give the scale tensor itself, "
                                          "not a strided view" % b.name)
                if b.device != self.device:
                    raise _errors.invalid("%s: on %s but the KV pool is on %s: a rank's scales "
                                          "live with its KV" % (b.name, b.where(),
                                                                self.buffers[0].where()))
                if b.ptr == 0 or b.nbytes != want:
                    raise _errors.invalid("%s: %d bytes, want %d: pool_tokens %d x heads %d x "
                                          "%d scale bytes of a head" % (b.name, b.nbytes, want,
                                                                        self.tokens, self.heads,
                                                                        scale_bytes))
                col.append(b)
            out.append(col)
        return [(k, out[1][i] if planes == 2 else None) for i, k in enumerate(out[0])]

    def _draft_pairs(self, drafts, planes):
        """([(K Buffer, V Buffer or None)] per draft layer, draft head dim)
        from drafts = (draft_k_buffers, draft_v_buffers), or ([], 0) without
        a draft (docs/kinds/draft.md): each [pool_tokens, heads, draft
        head_dim] in the pool's dtype, on its device, indexed by the same
        pages."""
        dk, dv = drafts if drafts is not None else (None, None)
        if dk is None:
            if dv is not None:
                raise _errors.invalid("draft_v_buffers without draft_k_buffers: give the "
                                      "draft's K buffers too (one tensor per draft layer)")
            return [], 0
        if planes == 1 and dv is not None:
            raise _errors.invalid("draft_v_buffers: an MLA pool has no V: give the draft's "
                                  "latents as draft_k_buffers= alone")
        if planes == 2 and dv is None:
            raise _errors.invalid("draft_k_buffers without draft_v_buffers: a draft of K and "
                                  "V needs both, one tensor per draft layer")
        named = [("draft_k_buffers", list(dk))] + ([("draft_v_buffers", list(dv))]
                                                   if planes == 2 else [])
        if not named[0][1] or (planes == 2 and len(named[1][1]) != len(named[0][1])):
            raise _errors.invalid("draft_k_buffers%s: one tensor per draft layer, as many of "
                                  "each" % (", draft_v_buffers" if planes == 2 else ""))
        out, dhd = [], None
        for name, bufs in named:
            col = []
            for i, t in enumerate(bufs):
                b = Buffer(t, "%s[%d]" % (name, i))
                dhd = b.shape[-1] if dhd is None and len(b.shape) >= 2 else dhd
                rows = 1
                for d in b.shape[:-2]:
                    rows *= d
                if not b.contiguous or len(b.shape) < 2 or b.device != self.device or \
                        _kv_dtype(b, self.dtype) != self.dtype or b.shape[-2] != self.heads \
                        or b.shape[-1] != dhd or rows != self.tokens or b.ptr == 0:
                    raise _errors.invalid(
                        "%s: shape %s, %s on %s: give a contiguous [pool_tokens %d, heads %d, "
                        "draft head_dim] tensor of the pool's dtype (%s) on its device (%s), "
                        "the same draft head_dim in every draft buffer"
                        % (b.name, list(b.shape), b.dtype, b.where(), self.tokens, self.heads,
                           self.dtype, self.buffers[0].where()))
                col.append(b)
            out.append(col)
        return [(k, out[1][i] if planes == 2 else None) for i, k in enumerate(out[0])], dhd

    def add_states(self, state_buffers, count, slots, slot_bytes, what):
        """The state buffers of a stage with `count` state layers (none:
        count 0): one each, of exactly `slots` x `slot_bytes` bytes (what:
        how those bytes are made, for the message); checked as the KV
        buffers are, and against them for shared memory."""
        self.state_buffers = []
        if count == 0:
            if state_buffers is not None:
                raise _errors.invalid("state_buffers: given, but this rank's layers have no "
                                      "state layers: drop state_buffers, or give the model's "
                                      "pattern (model= a state model such as "
                                      "qwen3-next-80b-a3b, or full_attn_every=, state_heads= "
                                      "and state_bytes=)")
            return
        if state_buffers is None:
            raise _errors.invalid("state_buffers: this rank's stage has %d state layers: "
                                  "give one buffer per state layer, in layer order, of "
                                  "state_slots x %s" % (count, what))
        bufs = list(state_buffers)
        if len(bufs) != count:
            raise _errors.invalid("state_buffers: %d given, but this rank's stage has %d "
                                  "state layers: one buffer per state layer, in layer order"
                                  % (len(bufs), count))
        want = slots * slot_bytes
        for i, t in enumerate(bufs):
            b = Buffer(t, "state_buffers[%d]" % i)
            if not b.contiguous:
                raise _errors.invalid("%s: not contiguous: give the state tensor itself, not "
                                      "a strided view" % b.name)
            if b.device != self.device:
                raise _errors.invalid("%s: on %s but the KV pool is on %s: a rank's state "
                                      "lives with its KV" % (b.name, b.where(),
                                                             self.buffers[0].where()))
            if b.ptr == 0 or b.nbytes != want:
                raise _errors.invalid("%s: %d bytes, want %d: state_slots %d x %s"
                                      % (b.name, b.nbytes, want, slots, what))
            self.state_buffers.append(b)
        self._no_overlap()

    def _no_overlap(self):
        spans = sorted((b.ptr, b.ptr + b.nbytes, b.name) for b in self.all_buffers())
        for (s0, e0, n0), (s1, _, n1) in zip(spans, spans[1:]):
            if s1 < e0:
                raise _errors.invalid("%s and %s share memory: each layer's K and V need "
                                      "their own" % (n0, n1))

    def all_buffers(self):
        """The KV buffers, then the scale buffers, then the draft's, then
        the state buffers."""
        return self.buffers + [b for pair in self.scale_pairs for b in pair if b is not None] \
            + [b for pair in self.draft_pairs for b in pair if b is not None] \
            + self.state_buffers

    def ranges(self):
        """The memory to attach, as (address, bytes), adjacent buffers merged."""
        out = []
        for start, end in sorted((b.ptr, b.ptr + b.nbytes) for b in self.all_buffers()):
            if out and out[-1][1] == start:
                out[-1][1] = end
            else:
                out.append([start, end])
        return [(s, e - s) for s, e in out]

    def fill_layers(self, arr, kinds=None):
        """kvs_kv_layer_t per layer of the stage into the ctypes array arr
        (zeroed): the pool's layers in order at the stage's attention layers
        (kinds, as select_attention; None: every layer is one). A state
        layer's descriptor stays zeroed: it keeps no K or V, and the core
        needs none there (kvs_manager_set_kv_layers)."""
        row = self.heads * self.head_dim * self.elem_bytes
        at = [i for i, kind in enumerate(kinds or ["full"] * self.layers) if kind != "state"]
        for i, (k, v) in zip(at, self.pairs):
            arr[i].k_addr, arr[i].v_addr = k.ptr, v.ptr if v is not None else 0
            arr[i].tokens = self.tokens
            arr[i].token_stride_bytes = row
            arr[i].head_stride_bytes = self.head_dim * self.elem_bytes
            arr[i].elem_stride_bytes = self.elem_bytes
        for i, (ks, vs) in zip(at, self.scale_pairs):
            arr[i].ks_addr, arr[i].vs_addr = ks.ptr, vs.ptr if vs is not None else 0
