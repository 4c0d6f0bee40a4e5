"""test_rank_ofi.py - kvstage.Rank on the libfabric fabric (fabric="ofi"),
on this machine: no RDMA device, no VM.

- The choice of fabric: what each fabric cannot take is refused before
  anything is made, naming the argument and what to change (an unknown
  fabric, a provider without fabric="ofi", rdma_device or near_pci with
  it, an unknown provider with the list of those offered here, CUDA
  tensors, a build without the fabric); a rank on ofi tcp says what it
  chose.
- The two-process test of test_rank_rxe.py (rank_pair.py: a prefill
  instance of TP 2 and a decode instance of TP 1, torch CPU tensors,
  several rooms in several chunks with aux payloads, every byte of the
  decode's pool and every aux payload checked) over the tcp provider on
  127.0.0.1 and over shm.
- The pair with an fp8 pool and per-token scale planes (kv_scales,
  ks_buffers, vs_buffers; GQA and MLA), every KV and scale byte checked;
  scale buffers refused by name where they do not fit.
- The same pair over tcp with the decode paging its pool by 64 tokens and
  the prefill by 16 (peer_page_size), every byte checked; a bad
  peer_page_size refused by name; and with an MLA pool (kind="mla"): one
  latent per layer, written by prefill rank 0 alone.
- Hybrid models (docs/kinds/hybrid.md): a window model P2 -> D1 (decode
  pages of 16 and 64 tokens) and a
  state model P2 -> D1, P2 -> D2 and P1 -> D2 (state_buffers, a state slot per room
  on each side), every window row and state byte checked by the decode; a
  decode that gives each room the next room's state slot fails the check;
  gpt-oss-20b and qwen3-next-80b-a3b by model=; state slots refused by
  name.
- The pair with prefill context parallelism (two CP ranks of TP 2, each
  filling only its range, Rank.cp_range; add_instance(cp_size=2)), every
  byte checked; addresses given out of CP order are refused.

Runs in ctest's python_binding (under the ASan preload in a sanitized
build; the pair's processes inherit it). Where the build has no ofi
fabric, the tests that need it skip, saying so."""

import math

import pytest

import kvstage
from kvstage import _library

torch = pytest.importorskip("torch")
import rank_pair  # noqa: E402 (needs torch)

PAGE, HEADS, DIM = 16, 4, 8


def need_ofi():
    if not hasattr(_library.load_backend("hw"), "kvs_ofi_fabric_create"):
        pytest.skip("this kvstage was built without libfabric (install libfabric-dev, "
                    "rebuild): no ofi fabric to test")


def rank(**kw):
    ks = [torch.zeros(4 * PAGE, HEADS, DIM, dtype=torch.float16) for _ in range(2)]
    vs = [torch.zeros_like(k) for k in ks]
    return kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS, k_buffers=ks,
                        v_buffers=vs, **kw)


def refused(needles, **kw):
    """rank(**kw) raises KVS_EINVAL whose message holds every needle."""
    with pytest.raises(kvstage.KvstageError) as e:
        rank(**kw).close()
    assert e.value.name == "KVS_EINVAL", e.value
    for needle in needles:
        assert needle in e.value.message, e.value.message
    return e.value.message


def test_rank_fabric_unknown_name_refused():
    refused(['fabric: \'rdma\' is not a fabric: give "verbs" or "ofi"'], fabric="rdma")
    refused(["fabric: None is not a fabric"], fabric=None)


def test_rank_fabric_provider_needs_ofi():
    refused(['provider: \'tcp\' names a libfabric provider: give it with fabric="ofi"'],
            provider="tcp")


def test_rank_ofi_refuses_rdma_device_and_near_pci():
    need_ofi()
    refused(["rdma_device: 'rxe0' chooses the RDMA device of fabric=\"verbs\"",
             "drop rdma_device"], fabric="ofi", rdma_device="rxe0")
    refused(["near_pci: '0000:3b:00.0' chooses the RDMA device", "drop near_pci"],
            fabric="ofi", provider="tcp", near_pci="0000:3b:00.0")


def test_rank_ofi_unknown_provider_lists_those_offered():
    need_ofi()
    offered = kvstage.ofi_providers()
    assert "tcp" in offered and "shm" in offered, offered
    msg = refused(["provider 'nosuch' is not offered here"], fabric="ofi",
                  provider="nosuch", bind_addr="127.0.0.1")
    assert msg.endswith(", ".join(offered)), msg
    refused(["provider: '': give a libfabric provider's name"], fabric="ofi", provider="")
    refused(["listen_port: 70000: give a port in [0, 65536)"], fabric="ofi",
            listen_port=70000)


def test_rank_ofi_tcp_says_what_it_chose():
    need_ofi()
    r = rank(fabric="ofi", bind_addr="127.0.0.1")
    try:
        assert r.fabric == "ofi"
        assert r.provider.split(";")[0] == "tcp", r.provider  # "tcp;ofi_rxm"
        assert r.rdma_device is None
        host, port = r.address.rsplit(":", 1)
        assert host == "127.0.0.1" and 0 < int(port) < 65536, r.address
    finally:
        r.close()
    r.close()  # twice is fine


class _CudaLike:
    """What kvstage reads of a torch CUDA tensor, over a CPU one: no GPU
    needed, the refusal comes before any device is made."""

    def __init__(self, t):
        self._t = t
        self.shape, self.dtype = t.shape, t.dtype
        self.device = torch.device("cuda", 0)

    def data_ptr(self):
        return self._t.data_ptr()

    def is_contiguous(self):
        return True

    def element_size(self):
        return self._t.element_size()


def test_rank_ofi_refuses_cuda_tensors():
    need_ofi()
    ks = [_CudaLike(torch.zeros(4 * PAGE, HEADS, DIM, dtype=torch.float16)) for _ in range(2)]
    vs = [_CudaLike(torch.zeros(4 * PAGE, HEADS, DIM, dtype=torch.float16)) for _ in range(2)]
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS, k_buffers=ks, v_buffers=vs,
                     fabric="ofi")
    assert e.value.name == "KVS_EINVAL", e.value
    assert ("k_buffers[0]: on cuda:0 but the ofi fabric registers host memory only: give CPU "
            "tensors, or fabric=\"verbs\"") in e.value.message, e.value.message


class _WithoutOfi:
    """libkvstage_hw as a build without libfabric exports it."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        if name.startswith("kvs_ofi_"):
            raise AttributeError(name)
        return getattr(self._lib, name)


def test_rank_ofi_on_a_build_without_it_says_what_to_install(monkeypatch):
    hw = _library.load_backend("hw")
    monkeypatch.setattr(_library, "load_backend", lambda which: _WithoutOfi(hw))
    want = ["fabric='ofi': this kvstage was built without the ofi fabric",
            "install libfabric-dev, rebuild"]
    refused(want, fabric="ofi")
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.ofi_providers()
    assert all(w in e.value.message for w in want), e.value


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_rank_ofi_prefill_tp2_to_decode_tp1(tmp_path, provider):
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", provider,
                                        "--address", "127.0.0.1", "--deadline-s", "40"],
                             timeout_s=100)
    # The ranks ran on the provider asked for (tcp as libfabric layers it:
    # "tcp;ofi_rxm").
    assert dec["provider"].split(";")[0] == pre["provider"].split(";")[0] == provider
    check_metrics(dec, pre)


@pytest.mark.parametrize("decode_page", [64])
def test_rank_ofi_decode_pages_of_another_size(tmp_path, decode_page):
    """The same pair with the decode's pool in pages of 64 tokens and the
    prefill's in pages of 16 (peer_page_size on both): every byte of the
    decode's pool lands where its own page list puts it (rank_pair checks
    the whole pool), with a cached prefix of 64 tokens."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--decode-page", str(decode_page)],
                             timeout_s=100)
    assert dec["page_size"] == decode_page and pre["page_size"] == rank_pair.PAGE
    check_metrics(dec, pre)


def test_rank_ofi_mla_prefill_tp2_to_decode_tp1(tmp_path):
    """The pair with an MLA pool (kind="mla", k_buffers alone): the latent is
    the same on both prefill ranks, rank 0 writes it and rank 1 only reports
    (rank_pair checks its writes are 0), and every byte of the decode's pool
    is checked."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--mla"], timeout_s=100)
    assert dec["kind"] == pre["kind"] == "mla"
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)


@pytest.mark.parametrize("mla", [False, True])
def test_rank_ofi_fp8_scales_prefill_tp2_to_decode_tp1(tmp_path, mla):
    """The pair with an fp8 pool and per-token scale planes (kv_scales=
    "per-token", a scale tensor beside every K and V tensor, or beside the
    MLA latent alone): the scales of each row move with it, and rank_pair
    checks every byte of the decode's KV and scale tensors."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--scales"] + (["--mla"] if mla else []),
                             timeout_s=100)
    assert dec["kv_scales"] == "per-token"
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)


def test_rank_ofi_fp8_scales_shifted_are_caught(tmp_path):
    """The planted wrong scale mapping (the decode hands the Rank each
    layer's scale tensors as the next layer's): every row arrives, the
    scales land a layer off, and the decode's check fails the pair."""
    need_ofi()
    with pytest.raises(AssertionError) as e:
        rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp", "--address",
                                 "127.0.0.1", "--deadline-s", "40", "--scales",
                                 "--shift-scales"], timeout_s=100)
    assert "decode exited 1" in str(e.value) and "scales of layer" in str(e.value), e.value


def test_rank_ofi_prefill_cp2_tp2_to_decode_tp1(tmp_path):
    """The pair with a prefill instance of two context-parallel ranks of TP
    2 (context_parallel=2, cp_rank; four Rank objects): each fills only the
    rows of its range (Rank.cp_range) and writes them, the decode declares
    the instance with cp_size=2 and checks every byte of its pool, the
    short room (16 tokens) included, whose range is CP rank 0's alone."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--prefill-cp", "2"], timeout_s=100)
    # Every CP rank wrote (run() checks each rank's writes are > 0).
    assert len(pre["rdma_writes"]) == 4, pre
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)


def test_rank_ofi_prefill_cp_addresses_out_of_order_refused(tmp_path):
    """The planted mistake: the decode gives the addresses of CP rank 0 TP
    rank 1 and CP rank 1 TP rank 0 in each other's place. The registration
    is refused and the decode fails instead of scattering a range's rows as
    another's, naming the address and what to fix."""
    need_ofi()
    with pytest.raises(AssertionError) as e:
        rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp", "--address",
                                 "127.0.0.1", "--deadline-s", "20", "--prefill-cp", "2",
                                 "--cp-addrs-swapped"], timeout_s=100)
    # Both sides fail their rooms; the decode says which address reached
    # which CP rank and what to fix.
    msg = str(e.value)
    assert "decode (exit 1)" in msg or "decode exited 1" in msg, msg
    assert "reaches context-parallel rank 1 of 2, not rank 0 of 2" in msg, msg
    assert "fix that rank's address" in msg, msg


@pytest.mark.parametrize("mla", [False, True])
def test_rank_ofi_draft_layers_prefill_tp2_to_decode_tp1(tmp_path, mla):
    """The pair with a draft model's 2 layers (draft_k_buffers and
    draft_v_buffers; MLA: draft_k_buffers alone, an MTP-like latent) over
    the same pages: they move in the same writes, and the decode checks
    every draft byte as well as the pool's."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--draft-layers", "2"] + (["--mla"] if mla else []),
                             timeout_s=100)
    assert dec["draft_bytes"] > 0, dec
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)


def test_rank_ofi_draft_swapped_is_caught(tmp_path):
    """The planted wrong draft mapping: the decode hands each draft layer's
    K and V buffers over in each other's place; the rooms move and the
    decode's check fails on the draft."""
    need_ofi()
    with pytest.raises(AssertionError) as e:
        rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp", "--address",
                                 "127.0.0.1", "--deadline-s", "40", "--draft-layers", "1",
                                 "--draft-swapped"], timeout_s=100)
    assert "decode exited 1" in str(e.value) and "draft layer 0" in str(e.value), e.value


@pytest.mark.parametrize("prefill_pp,decode_pp,mla", [(2, 2, False), (2, 1, False),
                                                      (2, 2, True)])
def test_rank_ofi_draft_layers_with_pp(tmp_path, prefill_pp, decode_pp, mla):
    """A draft with PP (docs/kinds/draft.md): the prefill of PP 2 x TP 2
    into a decode of PP 2 or 1. The draft is the last stage's on each side:
    its ranks give the draft's buffers, and each stage before it declares
    the draft by its shape (draft_layers=, draft_head_dim=) with none. The
    decode checks every byte of each stage's pool and of the draft, which
    only its last stage holds. Decode PP 1 takes every prefill stage's
    blocks, so a stage that did not declare the draft would be refused by
    the fingerprint."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--draft-layers", "2",
                                        "--prefill-pp", str(prefill_pp),
                                        "--decode-pp", str(decode_pp)]
                             + (["--mla"] if mla else []), timeout_s=100)
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)
    assert dec["decode_ranks"] == decode_pp and dec["draft_ranks"] == 1, dec
    assert dec["draft_bytes"] > 0, dec
    # stage 0 (model layer 0) writes one layer; stage 1 (layers 1 and 2)
    # two and the draft's two, in its TP rank 0's writes (MLA: alone)
    tp = 2
    assert pre["bytes"][tp] > 2 * pre["bytes"][0] > 0, pre


def test_rank_ofi_draft_swapped_with_pp_is_caught(tmp_path):
    """The planted wrong draft mapping with PP 2 on both sides: the last
    decode stage's check fails on the draft."""
    need_ofi()
    with pytest.raises(AssertionError) as e:
        rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp", "--address",
                                 "127.0.0.1", "--deadline-s", "40", "--draft-layers", "1",
                                 "--prefill-pp", "2", "--decode-pp", "2", "--draft-swapped"],
                      timeout_s=100)
    assert "decode exited 1" in str(e.value), e.value
    assert "decode rank 0 of stage 1: draft layer 0" in str(e.value), e.value


def _window_rows(window, rooms, decode_page):
    """Rows a decode of these rooms ({room: (total, cached)}) holds in one
    window layer of `window` tokens: from the window's first token floored
    to the lcm of both page sizes (kvs_layout_layer_tokens) or its cached
    prefix, whichever is later, to the room's end."""
    unit = math.lcm(rank_pair.PAGE, decode_page)
    return sum(total - max(base, max(0, total - window) // unit * unit)
               for total, base in rooms.values())


@pytest.mark.parametrize("decode_page, rows", [(16, 406), (64, 566)])
def test_rank_ofi_hybrid_window_prefill_tp2_to_decode_tp1(tmp_path, decode_page, rows):
    """A window model (layers 0 and 2 sliding-window layers of 48 tokens,
    layer 1 full attention: full_attn_every=2, window_tokens=48) from a
    prefill of TP 2 to a decode of TP 1, the decode paging by 16 or 64
    tokens: the prefill fills every row of every layer, and the decode
    checks its whole pool: every row of the full layer, and in each window
    layer the rows from the window's start floored to both page sizes on,
    and none before it."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--window", "48", "--decode-page", str(decode_page)],
                             timeout_s=100)
    assert dec["layer_kinds"] == ["window", "full", "window"], dec["layer_kinds"]
    # the window layers hold the window's rows alone: fewer than a full
    # layer's (every room's every uncached token); with 64-token pages
    # room 13 caches 64 tokens of 160 (rank_pair.use_decode_page)
    rooms = dict(rank_pair.ROOMS)
    if decode_page == 64:
        rooms[13] = (160, 64)
    assert dec["window_rows"] == 2 * _window_rows(48, rooms, decode_page) == rows, dec
    assert dec["window_rows"] < 2 * sum(t - b for t, b in rooms.values())
    check_metrics(dec, pre)


def test_rank_ofi_hybrid_window_prefill_pp2_to_decode_pp1(tmp_path):
    """The window model from a prefill of TP 2 x PP 2 (stage 0: window layer
    0; stage 1: full layer 1 and window layer 2) into a decode of TP 1 x PP
    1: each prefill stage writes its part of every writer block, one write
    (docs/kinds/hybrid.md), and the decode checks its whole pool as for PP
    1: the full layer's every row, the window layers' window rows alone."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--window", "48", "--prefill-pp", "2",
                                        "--decode-pp", "1"], timeout_s=100)
    assert dec["layer_kinds"] == ["window", "full", "window"], dec["layer_kinds"]
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)
    assert dec["window_rows"] == 2 * _window_rows(48, dict(rank_pair.ROOMS), 16), dec
    # stage 1 (a full and a window layer) writes more than stage 0 (a
    # window layer), one write per chunk each
    assert pre["bytes"][2] > pre["bytes"][0] > 0, pre


@pytest.mark.parametrize("prefill_tp, decode_tp", [(2, 1), (2, 2), (1, 2)])
def test_rank_ofi_hybrid_state(tmp_path, prefill_tp, decode_tp):
    """A state model (layers 0 and 2 state layers of 4 state heads of 96 +
    416 bytes, no K or V; layer 1 full attention) from a prefill of TP 2 to
    a decode of TP 1 or 2, and of TP 1 to TP 2: the prefill gives k_buffers and v_buffers for
    its attention layer alone, the decode one per layer with None at the
    state layers; each side's state tensors have 8 slots, each room its
    own slot on each side (a different one). The decode checks every byte
    of every state tensor (the room's slot holds its state heads' state,
    the other slots zeros) and of its pool."""
    need_ofi()
    dec, pre = rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp",
                                        "--address", "127.0.0.1", "--deadline-s", "40",
                                        "--state-heads", "4", "--state-bytes", "96+416",
                                        "--prefill-tp", str(prefill_tp),
                                        "--decode-tp", str(decode_tp)], timeout_s=100)
    assert dec["layer_kinds"] == ["state", "full", "state"], dec["layer_kinds"]
    assert dec["decode_tp"] == decode_tp
    # 2 state layers x 8 slots x 4 state heads (over the decode's ranks) x 512
    assert dec["state_bytes"] == 2 * 8 * 4 * 512, dec
    assert dec["rooms"] == dec["rooms_ok"] == len(rank_pair.ROOMS)


def test_rank_ofi_hybrid_state_wrong_slot_is_caught(tmp_path):
    """The planted mistake: the decode opens each room with the next room's
    state slot. The rooms move, the states land in the wrong slots, and the
    decode's check fails on a state layer."""
    need_ofi()
    with pytest.raises(AssertionError) as e:
        rank_pair.run(tmp_path, ["--fabric", "ofi", "--provider", "tcp", "--address",
                                 "127.0.0.1", "--deadline-s", "40", "--state-heads", "4",
                                 "--state-bytes", "96+416", "--state-slot-shifted"],
                      timeout_s=100)
    assert "decode exited 1" in str(e.value) and "state layer 0 differs" in str(e.value), \
        e.value


def test_rank_ofi_hybrid_models_and_state_slots():
    """model= a hybrid built-in model fills its layer pattern: gpt-oss-20b's
    24 layers alternate window and full layers (layer 0 a window layer, K
    and V for each); qwen3-next-80b-a3b's 48 layers are 36 state layers and
    12 full ones, whose K and V are given for those 12 alone, with 36 state
    buffers. A room's state slot is refused by name when missing, outside
    the slots, or given to a rank without state layers."""
    need_ofi()
    ofi = dict(fabric="ofi", provider="tcp", bind_addr="127.0.0.1")
    ks = [torch.zeros(4 * PAGE, 1, 64, dtype=torch.bfloat16) for _ in range(24)]
    with kvstage.Rank("decode", page_size=PAGE, model="gpt-oss-20b", tp_size=8,
                      k_buffers=ks, v_buffers=[torch.zeros_like(k) for k in ks], **ofi) as r:
        assert r.layer_kinds == ["window", "full"] * 12 and r.state_slots == 0
        with pytest.raises(kvstage.KvstageError) as e:
            r.open_room(1, [0], state_slot=0)
        assert "state_slot: room 1: this rank's layers have no state layers: drop " \
            "state_slot" in e.value.message, e.value.message
    # Qwen3-Next at TP 2: 1 KV head of 256 a rank, 8 state heads of 3072 +
    # 65536 bytes a rank and state layer
    ks = [torch.zeros(4 * PAGE, 1, 256, dtype=torch.bfloat16) for _ in range(12)]
    st = [torch.zeros(2, 8, 3072 + 65536, dtype=torch.uint8) for _ in range(36)]
    with kvstage.Rank("decode", page_size=PAGE, model="qwen3-next-80b-a3b", tp_size=2,
                      k_buffers=ks, v_buffers=[torch.zeros_like(k) for k in ks],
                      state_buffers=st, state_slots=2, **ofi) as r:
        assert r.layer_kinds == ["state", "state", "state", "full"] * 12
        assert r.state_slots == 2 and r.layers == 48
        for kw, needle in ((dict(), "state_slot: room 1: this rank's stage has state layers: "
                            "give the request's slot in the state buffers, in [0, "
                            "state_slots 2)"),
                           (dict(state_slot=2), "state_slot: room 1: 2 is outside the state "
                            "buffers' slots: give an integer in [0, state_slots 2)"),
                           (dict(state_slot=-1), "state_slot: room 1: -1 is outside"),
                           (dict(state_slot=1.0), "state_slot: room 1: 1.0 is outside the "
                            "state buffers' slots: give an integer")):
            with pytest.raises(kvstage.KvstageError) as e:
                r.open_room(1, [0], **kw)
            assert e.value.name == "KVS_EINVAL" and needle in e.value.message, e.value.message
    # the model's pattern wants its state buffers
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank("decode", page_size=PAGE, model="qwen3-next-80b-a3b", tp_size=2,
                     k_buffers=ks, v_buffers=[torch.zeros_like(k) for k in ks], **ofi)
    assert "state_buffers: this rank's stage has 36 state layers" in e.value.message


def test_rank_draft_buffers_refused_by_name():
    """Draft buffers that do not fit the pool are refused at create, naming
    the argument: V without K, K without V, another head count, another
    token count."""
    need_ofi()
    bad = torch.zeros(4 * PAGE, HEADS, 8, dtype=torch.float16)
    for kw, needle in (
            (dict(draft_v_buffers=[bad]), "draft_v_buffers without draft_k_buffers"),
            (dict(draft_k_buffers=[bad]), "draft_k_buffers without draft_v_buffers"),
            (dict(draft_k_buffers=[torch.zeros(4 * PAGE, 2, 8, dtype=torch.float16)],
                  draft_v_buffers=[bad]), "heads %d" % HEADS),
            (dict(draft_k_buffers=[torch.zeros(2 * PAGE, HEADS, 8, dtype=torch.float16)],
                  draft_v_buffers=[bad]), "pool_tokens %d" % (4 * PAGE))):
        refused([needle], fabric="ofi", provider="tcp", bind_addr="127.0.0.1", **kw)


def test_rank_draft_on_pp_stages_refused_by_name():
    """With PP the draft is the last stage's: a stage before it declares
    the draft by its shape without buffers, and is made; buffers there,
    none on the last stage, a shape the buffers do not have, or a shape
    without a draft are refused at create, naming the argument."""
    need_ofi()
    ofi = dict(fabric="ofi", provider="tcp", bind_addr="127.0.0.1")
    dk = [torch.zeros(4 * PAGE, HEADS, 4, dtype=torch.float16)]  # head dim 4
    dv = [torch.zeros_like(dk[0])]
    pp0 = dict(pp_rank=0, pp_size=2, peer_pp_size=2)
    pp1 = dict(pp_rank=1, pp_size=2, peer_pp_size=2)
    rank(draft_layers=1, draft_head_dim=4, **pp0, **ofi).close()  # declared, no buffers
    rank(draft_layers=1, draft_k_buffers=dk, draft_v_buffers=dv, **pp1, **ofi).close()
    for kw, needle in (
            (dict(draft_k_buffers=dk, draft_v_buffers=dv, **pp0),
             "draft_k_buffers: pp_rank 0 is not the last stage (pp_size 2), and the draft is "
             "the last stage's (docs/kinds/draft.md): give no draft buffers here, declare the "
             "draft with draft_layers=1 and draft_head_dim=4"),
            (dict(draft_layers=1, draft_head_dim=4, **pp1),
             "draft_k_buffers: draft_layers=1, and pp_rank 1, the last stage, holds the draft: "
             "give its buffers"),
            (dict(draft_layers=1), "draft_k_buffers: draft_layers=1, and this rank holds the "
                                   "draft: give its buffers"),
            (dict(draft_layers=2, draft_k_buffers=dk, draft_v_buffers=dv, **pp1),
             "draft_layers=2 but 1 draft_k_buffers are given"),
            (dict(draft_head_dim=16, draft_k_buffers=dk, draft_v_buffers=dv),
             "draft_head_dim=16 but the draft buffers' last dimension is 4"),
            (dict(draft_head_dim=0, draft_k_buffers=dk, draft_v_buffers=dv),
             "draft_head_dim=0 (the model's head_dim %d) but the draft buffers' last "
             "dimension is 4" % DIM),
            (dict(draft_head_dim=4, **pp0), "draft_head_dim: given, but there is no draft"),
            (dict(draft_kv_heads=HEADS, **pp0), "draft_kv_heads: given, but there is no draft"),
            (dict(draft_layers="1", **pp0), "draft_layers: '1': give an integer >= 0")):
        refused([needle], **kw, **ofi)


def test_rank_state_waits_for_a_result_on_its_way():
    """The driver takes a finished room's result from the C rank, then hands
    it to the Rank outside the rank's lock: for that moment the room is in
    neither place, and state() must wait for it rather than say KVS_ENOENT
    (it did, once, in the VM: test_rank_rxe's decode died on state(15) of a
    room done that fast). Here the result comes 0.2 s after state() asks."""
    need_ofi()
    import ctypes
    import threading
    import time
    from kvstage import _structs as S
    with rank(fabric="ofi", provider="tcp", bind_addr="127.0.0.1") as r:
        with r._lock:
            r._pending.add(77)  # opened, its result not here yet

        def deliver():
            time.sleep(0.2)
            r._on_result(None, ctypes.pointer(S.RoomResult(room=77, status=0)))

        t = threading.Thread(target=deliver)
        t.start()
        t0 = time.monotonic()
        assert r.state(77) == kvstage.RoomState.SUCCESS
        assert time.monotonic() - t0 >= 0.15
        t.join()
        assert [x.room for x in r.poll()] == [77]
        with pytest.raises(kvstage.KvstageError) as e:
            r.state(77)  # polled: gone, and never waited for
        assert e.value.name == "KVS_ENOENT"


def test_rank_cp_range_and_cp_size_checked():
    """cp_range() without CP is the whole request; add_instance counts the
    CP ranks' addresses and names cp_size."""
    need_ofi()
    with rank(fabric="ofi", provider="tcp", bind_addr="127.0.0.1") as r:
        assert r.cp_range(100) == (0, 100)
        with pytest.raises(kvstage.KvstageError) as e:
            r.add_instance(0, ["127.0.0.1:1"] * 3, tp_size=2, cp_size=2)
        assert "cp_size 2" in e.value.message, e.value.message
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", provider="tcp", context_parallel=0).close()
    assert "context_parallel" in e.value.message, e.value.message


def test_rank_scale_buffers_refused_by_name():
    """Scale buffers are checked at create, naming the argument: without
    kv_scales, missing, of the wrong size, a V's for an MLA pool; and a
    block that does not divide the head dim."""
    need_ofi()
    ks = [torch.zeros(4 * PAGE, HEADS, DIM, dtype=torch.uint8) for _ in range(2)]
    vs = [torch.zeros_like(k) for k in ks]

    def scales(nbytes=4, n=2):
        return [torch.zeros(4 * PAGE, HEADS, nbytes, dtype=torch.uint8) for _ in range(n)]

    def make(**kw):
        kvstage.Rank("decode", page_size=PAGE, total_heads=HEADS, k_buffers=ks,
                     v_buffers=vs, dtype="fp8", fabric="ofi", bind_addr="127.0.0.1",
                     **kw).close()

    cases = [
        (dict(ks_buffers=scales(), vs_buffers=scales()), "ks_buffers: scale buffers without "
         "kv_scales"),
        (dict(kv_scales="per-token"), "ks_buffers, vs_buffers: kv_scales needs a scale buffer"),
        (dict(kv_scales="per-token", ks_buffers=scales(), vs_buffers=scales(n=1)),
         "vs_buffers: 1 tensors but the KV pool has 2 layers"),
        (dict(kv_scales="per-token", ks_buffers=scales(2), vs_buffers=scales()),
         "ks_buffers[0]: 512 bytes, want 1024"),
        (dict(kv_scales="per-block:3", ks_buffers=scales(), vs_buffers=scales()),
         "kv_scales: per-block:3 needs the block to divide head_dim 8"),
    ]
    for kw, needle in cases:
        with pytest.raises(kvstage.KvstageError) as e:
            make(**kw)
        assert e.value.name == "KVS_EINVAL", e.value
        assert needle in e.value.message, e.value.message
    with pytest.raises(kvstage.KvstageError) as e:
        kvstage.Rank("decode", page_size=PAGE, kind="mla", k_buffers=[k[:, :1] .contiguous()
                                                                     for k in ks],
                     dtype="fp8", kv_scales="per-token", ks_buffers=scales(),
                     vs_buffers=scales(), fabric="ofi", bind_addr="127.0.0.1")
    assert "vs_buffers: an MLA pool has no V" in e.value.message, e.value.message
    # per-block:8 on head dim 8: one byte a head and token
    make(kv_scales="per-block:8", ks_buffers=scales(1), vs_buffers=scales(1))


def test_rank_peer_page_size_refused_by_name():
    """A negative peer_page_size, and a chunk that is no whole number of
    the peer's pages, are refused at create, naming what to change."""
    need_ofi()
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", bind_addr="127.0.0.1", peer_page_size=-1).close()
    assert "peer_page_size: -1" in e.value.message, e.value.message
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", bind_addr="127.0.0.1", peer_page_size=48, chunk_tokens=64).close()
    assert e.value.name == "KVS_ECHUNK", e.value
    assert "peer_page_size" in e.value.message, e.value.message


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus exposition, read by
    the Prometheus project's own parser (Debian's python3-prometheus-client)."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, "sample %s twice" % (key,)
            out[key] = s.value
    return out


def check_metrics(dec, pre):
    """What the ranks' metrics say agrees with what they did: the decode's
    rooms and bytes per peer instance, the prefill ranks' writes."""
    d = samples(dec["metrics"])
    assert dec["peers"] == [[0, 0]]
    rank = {"role": "decode", "instance": "0", "dp_rank": "0", "tp_rank": "0", "pp_rank": "0"}
    peer = dict(rank, peer_instance="0", peer_dp_rank="0")
    assert d[("kvstage_rooms_ended_total", frozenset(dict(peer, status="KVS_OK").items()))] \
        == dec["rooms_ok"] == dec["rooms"]
    assert d[("kvstage_room_transfer_bytes_sum", frozenset(peer.items()))] == dec["bytes"] > 0
    assert d[("kvstage_room_transfer_seconds_count", frozenset(peer.items()))] == dec["rooms"]
    assert d[("kvstage_room_transfer_seconds_bucket",
              frozenset(dict(peer, le="+Inf").items()))] == dec["rooms"]
    assert d[("kvstage_ring_live_bytes", frozenset(rank.items()))] == 0
    p = samples(pre["metrics"])
    for tp, writes in enumerate(pre["rdma_writes"]):
        labels = {"role": "prefill", "instance": "0", "dp_rank": "0", "tp_rank": str(tp),
                  "pp_rank": "0"}
        assert p[("kvstage_rdma_writes_total", frozenset(labels.items()))] == writes > 0


def test_rank_secret_is_named_and_checked_at_create(tmp_path, monkeypatch):
    """The cluster secret comes from a file or a variable the rank is told
    the name of (docs/security.md); one that is not there or too short is
    refused at create, naming it; a good one makes a rank."""
    need_ofi()
    monkeypatch.delenv("KVS_TEST_NO_SECRET", raising=False)
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", bind_addr="127.0.0.1", secret_env="KVS_TEST_NO_SECRET").close()
    assert "KVS_TEST_NO_SECRET" in e.value.message, e.value.message
    short = tmp_path / "short"
    short.write_text("tiny\n")
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", bind_addr="127.0.0.1", secret_file=str(short)).close()
    assert str(short) in e.value.message and "tiny" not in e.value.message, e.value.message
    with pytest.raises(kvstage.KvstageError) as e:
        rank(fabric="ofi", secret_file=123)
    assert "secret_file: 123" in e.value.message
    good = tmp_path / "secret"
    good.write_text("a cluster secret of some length\n")
    rank(fabric="ofi", bind_addr="127.0.0.1", secret_file=str(good)).close()
    monkeypatch.setenv("KVS_TEST_SECRET", "a cluster secret of some length")
    rank(fabric="ofi", bind_addr="127.0.0.1", secret_env="KVS_TEST_SECRET").close()
