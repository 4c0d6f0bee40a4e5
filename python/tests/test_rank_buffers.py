"""test_rank_buffers.py - kvstage.Rank refuses every class of bad KV buffer
before it makes anything: the error is KvstageError KVS_EINVAL naming the
argument (k_buffers[i], v_buffers[i], kv_caches[i], layers, page_size,
dtype), the caller's tensors are left as they were, and a good call made
next gets past the buffers (to the fabric, which on a machine without an
RDMA device is the next thing to refuse). Runs with torch (Debian's
python3-torch) and with numpy; each is skipped where it is missing."""

import pytest

import kvstage

torch = pytest.importorskip("torch")

PAGE, HEADS, DIM, LAYERS, TOKENS = 16, 4, 8, 3, 64


def pool(dtype=torch.float16, tokens=TOKENS, heads=HEADS, dim=DIM, layers=LAYERS):
    g = torch.Generator().manual_seed(5)
    ks = [torch.randn(tokens, heads, dim, generator=g).to(dtype) for _ in range(layers)]
    vs = [torch.randn(tokens, heads, dim, generator=g).to(dtype) for _ in range(layers)]
    return ks, vs


def refused(needle, **kw):
    """Rank(**kw) raises KVS_EINVAL whose message contains needle, and every
    tensor passed is unchanged."""
    tensors = [t for key in ("k_buffers", "v_buffers", "kv_caches")
               for t in (kw.get(key) or [])]
    if isinstance(kw.get("kv_caches"), dict):
        tensors = list(kw["kv_caches"].values())
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    before = [t.clone() for t in tensors]
    args = dict(page_size=PAGE, total_heads=HEADS)
    args.update(kw)
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank(args.pop("role", "decode"), **args)
    assert e.value.name == "KVS_EINVAL", e.value
    assert needle in e.value.message, e.value.message
    for a, b in zip(tensors, before):
        assert torch.equal(a, b)
    return e.value.message


def gets_past_buffers(**kw):
    """A good constructor call: it either makes a rank (an RDMA device is
    here) or fails at the fabric, never on the buffers."""
    try:
        kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS, **kw).close()
    except kvstage.KvstageError as e:
        assert e.name == "KVS_EBACKEND" and "RDMA device" in e.message, e


def test_good_buffers_get_to_the_fabric():
    ks, vs = pool()
    gets_past_buffers(k_buffers=ks, v_buffers=vs)
    kv = [torch.zeros(2, 4, PAGE, HEADS, DIM, dtype=torch.bfloat16) for _ in range(2)]
    gets_past_buffers(kv_caches=kv)
    gets_past_buffers(kv_caches={"layers.0.attn": kv[0], "layers.1.attn": kv[1]})


def test_wrong_dtype():
    ks, vs = pool(torch.int32)
    refused("k_buffers[0]: dtype int32 is not a KV cache dtype", k_buffers=ks, v_buffers=vs)
    ks, vs = pool()
    vs[2] = vs[2].to(torch.float32)
    refused("v_buffers[2]: dtype float32 but dtype='fp16'", k_buffers=ks, v_buffers=vs)
    refused("k_buffers[0]: dtype float16 but dtype='bf16'", k_buffers=ks, v_buffers=vs,
            dtype="bf16")
    raw = [torch.zeros(TOKENS, HEADS, DIM, dtype=torch.int16) for _ in range(2)]
    refused("k_buffers[0]: dtype int16 is raw storage: pass dtype=", k_buffers=raw[:1],
            v_buffers=raw[1:])
    gets_past_buffers(k_buffers=raw[:1], v_buffers=raw[1:], dtype="bf16")


def test_not_contiguous():
    ks, vs = pool()
    ks[1] = torch.zeros(TOKENS, DIM, HEADS, dtype=torch.float16).transpose(1, 2)
    refused("k_buffers[1]: not contiguous", k_buffers=ks, v_buffers=vs)
    ks, vs = pool(tokens=2 * TOKENS)
    vs[0] = vs[0][::2]
    refused("v_buffers[0]: not contiguous", k_buffers=ks, v_buffers=vs)


def test_wrong_shape():
    ks, vs = pool()
    refused("k_buffers[0]: 4 KV heads (dim -2) but this rank holds 2", k_buffers=ks,
            v_buffers=vs, tp_size=2)
    refused("k_buffers[0]: head_dim (last dim) is 8 but the model's is 128", k_buffers=ks,
            v_buffers=vs, head_dim=128)
    ks[2] = torch.zeros(TOKENS, HEADS, DIM + 1, dtype=torch.float16)
    refused("k_buffers[2]: shape [64, 4, 9] but k_buffers[0] has [64, 4, 8]", k_buffers=ks,
            v_buffers=vs)
    ks, vs = pool()
    vs[0] = torch.zeros(TOKENS * HEADS * DIM, dtype=torch.float16)
    refused("v_buffers[0]: shape [2048]: need [tokens, heads, head_dim]", k_buffers=ks,
            v_buffers=vs)
    ks, vs = pool(tokens=PAGE - 1)
    refused("k_buffers[0]: 15 token slots, less than one page of 16", k_buffers=ks,
            v_buffers=vs)


def test_layers_disagree():
    ks, vs = pool()
    refused("v_buffers: 2 tensors but k_buffers has 3", k_buffers=ks, v_buffers=vs[:2])
    refused("layers=4 but the KV pool has 3 layers", k_buffers=ks, v_buffers=vs, layers=4)
    refused("k_buffers: empty", k_buffers=[], v_buffers=[])
    refused("give the KV pool", k_buffers=ks)
    refused("give either kv_caches or k_buffers", k_buffers=ks, v_buffers=vs,
            kv_caches=[torch.zeros(2, 2, PAGE, HEADS, DIM, dtype=torch.float16)])


def test_shared_memory():
    ks, vs = pool()
    refused("share memory: each layer's K and V need their own", k_buffers=ks,
            v_buffers=[vs[0], ks[1], vs[2]])
    whole = torch.zeros(2 * TOKENS, HEADS, DIM, dtype=torch.float16)
    refused("share memory", k_buffers=[whole[:TOKENS]],
            v_buffers=[whole[TOKENS // 2:3 * TOKENS // 2]])
    # Halves of one tensor are fine: they touch, they do not overlap.
    gets_past_buffers(k_buffers=[whole[:TOKENS]], v_buffers=[whole[TOKENS:]])


def test_kv_caches_shapes():
    bad = [torch.zeros(3, 4, PAGE, HEADS, DIM, dtype=torch.float16)]
    refused("kv_caches[0]: shape [3, 4, 16, 4, 8] is not [2, num_blocks", kv_caches=bad)
    bad = {"model.layers.0": torch.zeros(2, 4, 8, HEADS, DIM, dtype=torch.float16)}
    refused("kv_caches['model.layers.0']: block_size (dim 2) is 8 but page_size is 16",
            kv_caches=bad)
    bad = [torch.zeros(2, 4, PAGE, DIM, HEADS, dtype=torch.float16).transpose(3, 4)]
    refused("kv_caches[0]: not contiguous", kv_caches=bad)


def test_not_a_tensor_and_bad_arguments():
    ks, vs = pool()
    refused("k_buffers[1]: a torch tensor or a numpy array, not list",
            k_buffers=[ks[0], [1, 2, 3]], v_buffers=vs[:2])
    refused("page_size: 0", k_buffers=ks, v_buffers=vs, page_size=0)
    refused("role: 'router'", role="router", k_buffers=ks, v_buffers=vs)
    refused("max_aux_bytes: 2097152 is over", k_buffers=ks, v_buffers=vs,
            max_aux_bytes=2 << 20)
    refused("model: 'no-such-model' is not a built-in model", k_buffers=ks, v_buffers=vs,
            model="no-such-model")


def test_numpy_arrays():
    np = pytest.importorskip("numpy")
    ks = [np.zeros((TOKENS, HEADS, DIM), np.float16) for _ in range(2)]
    vs = [np.zeros((TOKENS, HEADS, DIM), np.float16) for _ in range(2)]
    gets_past_buffers(k_buffers=ks, v_buffers=vs)
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS, k_buffers=ks,
                     v_buffers=[vs[0], vs[1].transpose(0, 2, 1)])
    assert "v_buffers[1]: not contiguous" in e.value.message
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS,
                     k_buffers=[np.zeros((TOKENS, HEADS, DIM), np.int64)], v_buffers=ks[:1])
    assert "k_buffers[0]: dtype int64" in e.value.message


def test_mla_pool_is_one_latent_per_layer():
    """kind="mla" (or an MLA model): k_buffers alone, one latent "head" per
    token; a V, a vLLM-style cache or more than one head is refused by name,
    and a good latent pool gets to the fabric."""
    ks, vs = pool(heads=1, dim=576)
    mla = dict(kind="mla", total_heads=None)
    refused("v_buffers: an MLA pool holds one latent per layer", k_buffers=ks, v_buffers=vs,
            **mla)
    refused("kv_caches: an MLA pool holds one latent per layer",
            kv_caches=[torch.zeros(2, 4, PAGE, 1, 576, dtype=torch.float16)], **mla)
    refused("k_buffers: give the MLA pool's latent buffers", **mla)
    wide, _ = pool(heads=2, dim=576)
    refused("k_buffers[0]: 2 KV heads (dim -2) but this rank holds 1", k_buffers=wide, **mla)
    refused("kind is 'mha': give 'gqa'", kind="mha", k_buffers=ks, v_buffers=vs)
    for kw in (dict(kind="mla"), dict(model="deepseek-v3", layers=LAYERS, model_layers=LAYERS)):
        try:
            kvstage.Rank("decode", page_size=PAGE, k_buffers=ks, **kw).close()
        except kvstage.KvstageError as e:
            assert e.name == "KVS_EBACKEND" and "RDMA device" in e.message, e


def test_hybrid_buffers_refused_by_name():
    """A hybrid model's buffers (docs/kinds/hybrid.md) that do not fit its
    layer pattern are refused before anything is made, naming the argument
    and what to change; the good forms get to the fabric. The pattern:
    every 2nd layer full attention, layers 0 and 2 state layers of 4 state
    heads of 8 + 24 bytes, 2 slots: 256 bytes a state buffer."""
    ks, vs = pool()
    st = [torch.zeros(2, HEADS, 32, dtype=torch.uint8) for _ in range(2)]
    hyb = dict(full_attn_every=2, state_heads=HEADS, state_bytes=(8, 24), model_layers=LAYERS)
    attn = dict(k_buffers=[ks[1]], v_buffers=[vs[1]])
    every = dict(k_buffers=[None, ks[1], None], v_buffers=[None, vs[1], None])
    cases = [
        (dict(attn, state_slots=2), "state_buffers: this rank's stage has 2 state layers: "
         "give one buffer per state layer"),
        (dict(attn, state_buffers=st), "state_slots: this rank's stage has 2 state layers"),
        (dict(attn, state_buffers=st[:1], state_slots=2),
         "state_buffers: 1 given, but this rank's stage has 2 state layers"),
        (dict(attn, state_buffers=[torch.zeros(2, HEADS, 31, dtype=torch.uint8)] * 2,
              state_slots=2), "state_buffers[0]: 248 bytes, want 256: state_slots 2 x 4 "
         "state heads x (8 conv + 24 ssm) bytes"),
        (dict(k_buffers=ks[:2], v_buffers=vs[:2], state_buffers=st, state_slots=2),
         "k_buffers: 2 given, but this rank's stage has 3 layers, 2 of them state layers: "
         "give 3 (one per layer, None at each state layer) or 1 (its full and window layers "
         "alone, in layer order)"),
        (dict(k_buffers=ks, v_buffers=[None, vs[1], None], state_buffers=st, state_slots=2),
         "k_buffers[0]: layer 0 of this rank's stage is a state layer: give None there"),
        (dict(k_buffers=[None] * 3, v_buffers=every["v_buffers"], state_buffers=st,
              state_slots=2), "k_buffers[1]: layer 1 of this rank's stage is a full layer: "
         "give its buffer there"),
    ]
    for kw, needle in cases:
        refused(needle, **hyb, **kw)
    refused("model_layers: a model with state layers needs its layer count",
            **dict(hyb, model_layers=None), **attn, state_buffers=st, state_slots=2)
    refused("window_tokens and state_heads: give one", **hyb, window_tokens=16, **attn)
    refused("k_buffers: 2 given, but this rank's stage has 3 layers: give one per layer",
            full_attn_every=2, window_tokens=16, model_layers=LAYERS, k_buffers=ks[:2],
            v_buffers=vs[:2])
    refused("state_buffers: given, but this rank's layers have no state layers",
            k_buffers=ks, v_buffers=vs, state_buffers=st)
    refused("state_slots: given, but this rank's layers have no state layers",
            k_buffers=ks, v_buffers=vs, state_slots=2)
    # both forms of the K and V lists, and a window model's, get past them
    gets_past_buffers(**hyb, **attn, state_buffers=st, state_slots=2)
    gets_past_buffers(**hyb, **every, state_buffers=st, state_slots=2)
    gets_past_buffers(full_attn_every=2, window_tokens=16, k_buffers=ks, v_buffers=vs)
