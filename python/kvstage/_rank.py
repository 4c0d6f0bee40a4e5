"""_rank.py - kvstage.Rank: one rank of a serving engine (prefill or
decode) over the engine's own KV buffers, on the C rank runtime (kvs_rank)
and the hardware driver (kvs_driver): the host device for CPU tensors, the
CUDA device for CUDA tensors, and for the network the verbs fabric (an
RDMA NIC; the default) or the libfabric one (fabric="ofi": tcp on any
machine, shm between processes of one host; see kvstage._fabric).

    with kvstage.Rank("decode", model="llama-3.1-8b", page_size=16,
                      tp_rank=0, tp_size=1, k_buffers=ks, v_buffers=vs,
                      max_aux_bytes=64) as rank:
        rank.add_instance(0, prefill_addresses, tp_size=2)   # their .address
        rank.open_room(7, pages=[3, 9, 4], total_tokens=40, peer=0)
        rank.start()                  # or call progress() in your loop
        ... rank.state(7) ... for r in rank.poll(): r.ok, r.aux

Rooms: a room is one request, named by the same id on every rank; it is
paired with a peer instance (the id the application gives the model
replica of the other role; 0 with one of each). state() answers in the
five states engines poll (RoomState, sglang's KVPoll numbers); a finished
room's state stays readable until poll() has returned its result.

Threads: every method may be called from any thread; with start() a
background thread (the C driver's) moves the bytes and collects results.
A failed call raises KvstageError naming what to change; a refused
constructor leaves nothing behind.
"""

import collections
import ctypes
import enum
import operator
import threading
import time

from . import _buffers
from . import _errors
from . import _fabric
from . import _library
from . import _models
from . import _structs as S

_ROLES = {"prefill": 0, "decode": 1}
_KVS_EPEER = -28  # KVS_EPEER (include/kvstage/kvstage.h)
_MAX_PAGE = (1 << 63) - 1


class RoomState(enum.IntEnum):
    """Where a room stands; the numbers are sglang's KVPoll."""
    FAILED = 0         # it failed (the result says why)
    BOOTSTRAPPING = 1  # a peer rank is not connected and registered yet
    WAITING = 2        # waiting for input: no KV has moved yet
    TRANSFERRING = 3   # KV is moving
    SUCCESS = 4        # done


class RoomResult:
    """A finished room: status (0 or a negative kvstage status), ok, state,
    status_name, chunks, bytes, rdma_writes, open_ns / done_ns (the fabric's
    clock), aux (decode, on success: the bytes the prefill gave; b""),
    peer, the (instance, dp_rank) of the other side it was paired with, and
    reason: why it failed, in words ("" when ok)."""

    __slots__ = ("room", "status", "status_name", "chunks", "bytes", "rdma_writes",
                 "open_ns", "done_ns", "aux", "peer", "reason")

    def __init__(self, r, aux, name):
        self.room, self.status, self.chunks = int(r.room), int(r.status), int(r.chunks)
        self.bytes, self.rdma_writes = int(r.bytes), int(r.rdma_writes)
        self.open_ns, self.done_ns = int(r.open_ns), int(r.done_ns)
        self.aux = aux
        self.status_name = name
        self.peer = (int(r.peer.instance), int(r.peer.dp_rank))
        self.reason = r.reason.decode(errors="replace")

    @property
    def ok(self):
        return self.status == 0

    @property
    def state(self):
        return RoomState.SUCCESS if self.status == 0 else RoomState.FAILED

    def __repr__(self):
        return ("RoomResult(room=%d, %s, bytes=%d, aux=%d bytes%s)"
                % (self.room, self.status_name, self.bytes, len(self.aux),
                   ", " + self.reason if self.reason else ""))


def _u64(name, value, low=0):
    if not isinstance(value, int) or isinstance(value, bool) or not \
            low <= value < (1 << 64):
        raise _errors.invalid("%s: %r: give an integer in [%d, 2^64)" % (name, value, low))
    return value


def _i64(name, value, low=0):
    if not isinstance(value, int) or isinstance(value, bool) or not \
            low <= value <= _MAX_PAGE:
        raise _errors.invalid("%s: %r: give an integer >= %d" % (name, value, low))
    return value


def _bytes_of(name, value):
    if value is None:
        return b""
    try:
        return bytes(memoryview(value).cast("B"))
    except TypeError:
        raise _errors.invalid("%s: %s is not bytes-like: give bytes, bytearray or a "
                              "buffer" % (name, type(value).__name__)) from None


def _ints(name, values):
    """A list of ints from a list, tuple, range, numpy array or torch tensor."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        out = [int(v) for v in values]
    except (TypeError, ValueError):
        raise _errors.invalid("%s: give a sequence of page ids (ints)" % name) from None
    return out


class Rank:
    """One rank of a serving engine. See the module docstring.

    role            "prefill" or "decode"
    page_size       tokens per page (the engine's block size)
    peer_page_size  tokens per page of the other side's pool when it pages
                    differently (a prefill's decode, a decode's prefill;
                    0: page_size). Both sides give both sizes; the chunk is
                    then whole pages of each (docs/kinds/page-sizes.md)
    k_buffers, v_buffers, or kv_caches
                    the KV pool (see kvstage._buffers): torch tensors on CPU
                    or CUDA, or numpy arrays; kept referenced by the rank.
                    An MLA pool is k_buffers alone: one latent tensor per
                    layer, [pool_tokens, 1, latent_dim]
    model           a built-in model name (kvstage.models()) giving
                    total_heads, head_dim, model_layers and kind; or give
                    those
    draft_k_buffers, draft_v_buffers
                    a draft model's KV of speculative decoding (EAGLE's one
                    layer, DeepSeek's MTP layer; docs/kinds/draft.md): one
                    tensor per draft layer, [pool_tokens, heads, draft
                    head_dim], indexed by the same pages as the pool (MLA:
                    draft_k_buffers alone). Its heads are the model's; both
                    sides give the same draft. With PP the draft is the
                    last stage's (pp_rank pp_size - 1): only it gives the
                    buffers
    draft_layers, draft_head_dim, draft_kv_heads
                    the draft's shape, as kvstage.plan() takes it: on a PP
                    stage before the last, which holds no draft but lays
                    out its regions as every stage does, draft_layers (and
                    draft_head_dim, 0 or None: head_dim) declare the draft
                    without buffers. Beside the buffers they are optional
                    and must agree with them. draft_kv_heads: 0 or the
                    model's KV heads (the default, 0)
    kv_scales, ks_buffers, vs_buffers
                    FP8 KV with scale planes (dtype "fp8"; docs/kinds/
                    fp8-scales.md): kv_scales "per-token" (one fp32 per token
                    and head) or "per-block[:N]" (one e8m0 byte per N
                    elements, 32 by default), and one scale tensor per layer
                    beside each K and V buffer (MLA: ks_buffers alone) of
                    pool_tokens x heads x a head's scale bytes, token-major;
                    the scales of a row move with it. Both sides give the
                    same kv_scales
    full_attn_every, window_tokens, state_heads, state_bytes
                    a hybrid model's layer pattern (docs/kinds/hybrid.md;
                    model= a hybrid built-in model, gpt-oss-20b or
                    qwen3-next-80b-a3b, gives it): layer l is full attention
                    when (l + 1) % full_attn_every == 0, every other layer a
                    sliding-window layer of window_tokens tokens, or a state
                    layer of state_heads heads (split over TP as KV heads)
                    of state_bytes (conv, ssm) bytes each (one number: ssm).
                    Both sides give the same pattern. A window layer keeps K
                    and V as a full one (only the window's pages move); a
                    state layer keeps none: with state layers k_buffers and
                    v_buffers (kv_caches, ks_buffers, vs_buffers) are given
                    for every layer of the stage, None at each state layer,
                    or for its full and window layers alone, in layer order
    state_buffers, state_slots
                    with state layers: one tensor per state layer of this
                    rank's stage, in layer order, each state_slots slots of
                    [local state heads][conv | ssm bytes] (any dtype, C-
                    contiguous, on the KV's device; local state heads:
                    state_heads / tp_size, or 1 when fewer than tp_size).
                    A room names its slot: open_room(state_slot=).
                    Once made, layer_kinds lists the kind of each layer of
                    the stage ("full", "window", "state") and state_slots
                    the slots (0: no state layers)
    kind            "gqa" (K and V per layer, the default) or "mla" (one
                    latent per token and layer, the same on every TP rank;
                    one prefill rank writes it to each decode rank and the
                    others report their status only: docs/kinds/mla.md)
    tp_rank, tp_size, pp_rank, pp_size
                    this rank's place in its instance
    context_parallel, cp_rank
                    prefill: its instance's context-parallel size and this
                    rank's CP rank (docs/kinds/context-parallel.md). Each CP
                    rank holds one token range of every request
                    (cp_range()); it opens the room with the request's
                    whole page list and fills only its range's rows. A
                    decode declares the CP size of a prefill instance with
                    add_instance(cp_size=)
    peer_tp_size, peer_pp_size
                    the default peer instance's (0: decode -> this TP;
                    prefill -> learned)
    instance_id, dp_rank
                    this rank's instance (spec section 12)
    dtype           "bf16", "fp16", "fp8", "fp32"; default: the tensors'
    max_aux_bytes   largest aux payload per room (both sides agree), 0: none
    chunk_tokens, ring_bytes, max_rooms, transfer_workers, stall_timeout_s,
    app_tag, staging (True)
                    the manager's knobs (kvs_manager_config_t); 0: default
    fabric          "verbs" (the default): libibverbs + rdma_cm on an RDMA
                    NIC; "ofi": libfabric, on the provider named next
    provider        fabric="ofi": the libfabric provider as fi_info -l names
                    it: "tcp" (None: the default; any machine), "shm"
                    (processes on one host); kvstage.ofi_providers() lists
                    those offered here. Every rank of a deployment gives the
                    same fabric and provider
    bind_addr, listen_port
                    the local IP (None: any) and the port peers connect to
                    (0: any free one; .address tells which)
    rdma_device, near_pci
                    fabric="verbs" only: the RDMA device, or the one nearest
                    the PCI id near_pci (the rank's GPU)
    copy_threads    host device: threads per large copy (0: 1)
    discovery       a kvstage.Discovery (etcd, shared by the process's
                    ranks): the rank publishes itself there under the
                    process's lease; a decode rank declares a prefill
                    instance it has not met when a room first names it,
                    waiting at most discovery_wait_s for all its ranks, and
                    fails that instance's rooms (instance_lost) once its
                    lease lapses (docs/operations.md)

    What the fabric chose, once made: address (the "IP:port" a decode
    gives add_instance for this rank), fabric, provider (ofi: as libfabric
    names it, e.g. "tcp;ofi_rxm"; verbs: None), rdma_device (verbs: the
    device taken; ofi: None).
    """

    def __init__(self, role, *, page_size, peer_page_size=0, k_buffers=None, v_buffers=None,
                 kv_caches=None, model=None, kind=None, total_heads=None, head_dim=None,
                 model_layers=None, layers=None,
                 tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, peer_tp_size=0, peer_pp_size=0,
                 context_parallel=1, cp_rank=0,
                 instance_id=0, dp_rank=0, dtype=None, max_aux_bytes=0, chunk_tokens=0,
                 ring_bytes=0, max_rooms=0, transfer_workers=0, stall_timeout_s=0,
                 app_tag=0, staging=True, fabric="verbs", provider=None, rdma_device=None,
                 near_pci=None, bind_addr=None, listen_port=0, copy_threads=0,
                 secret_file=None, secret_env=None, discovery=None, discovery_wait_s=10.0,
                 kv_scales=None, ks_buffers=None, vs_buffers=None, draft_k_buffers=None,
                 draft_v_buffers=None, draft_layers=None, draft_head_dim=None,
                 draft_kv_heads=None, full_attn_every=None, window_tokens=None,
                 state_heads=None, state_bytes=None, state_buffers=None, state_slots=None):
        self._rank = self._drv = self._dev_obj = self._fab = None
        self._attached = []
        self._discovery = self._published = None
        self._declared = {}     # decode: (instance, dp_rank) -> addresses, by discovery
        self._gone = set()      # ... of those, the ones whose records vanished
        self._seen_mu = threading.Lock()  # both: the follower's thread and open_room
        if role not in _ROLES:
            raise _errors.invalid("role: %r: give \"prefill\" or \"decode\"" % (role,))
        lib = _library.load()
        hw = _library.load_backend("hw")
        _fabric.check(hw, fabric, provider, rdma_device, near_pci, listen_port)
        pattern = dict(full_attn_every=full_attn_every, window_tokens=window_tokens,
                       state_heads=state_heads, state_bytes=state_bytes)
        if model is not None:
            m = lib.kvs_model_find(str(model).encode())
            if not m:
                raise _errors.invalid("model: %r is not a built-in model: see "
                                      "kvstage.models(), or give total_heads, head_dim "
                                      "and model_layers" % (model,))
            m = m.contents
            total_heads = m.total_heads if total_heads is None else total_heads
            head_dim = m.head_dim if head_dim is None else head_dim
            model_layers = m.layers if model_layers is None else model_layers
            kind = m.kind if kind is None else kind
            _models.fill_pattern(_models.find(str(model)), pattern)
        kv_kind = _models.kind_value(kind)
        _i64("tp_size", tp_size, 1)
        _i64("tp_rank", tp_rank)
        cfg = S.RankConfig()
        kinds = self._layer_kinds(lib, cfg.manager, pattern, model_layers, layers,
                                  k_buffers if kv_caches is None else kv_caches,
                                  _i64("pp_rank", pp_rank), _i64("pp_size", pp_size, 1))
        heads = None
        if kv_kind == 1:  # MLA: one latent "head" on every rank
            total_heads = 1 if total_heads is None else total_heads
            heads = 1
        elif total_heads is not None and total_heads >= tp_size:
            heads = total_heads // tp_size
        scales, block = _models.scales_value(kv_scales)
        def pick(values, name):  # a state model's per-layer lists: attention layers'
            return _buffers.select_attention(values, name, kinds)
        pool = _buffers.Pool(pick(k_buffers, "k_buffers"), pick(v_buffers, "v_buffers"),
                             pick(kv_caches, "kv_caches"), page_size, dtype=dtype,
                             head_dim=head_dim, heads=heads,
                             layers=layers if kinds is None else None,
                             planes=1 if kv_kind == 1 else 2,
                             scales=(scales, block, pick(ks_buffers, "ks_buffers"),
                                     pick(vs_buffers, "vs_buffers")),
                             drafts=(draft_k_buffers, draft_v_buffers))
        mc = cfg.manager
        n_state = (kinds or []).count("state")
        if n_state:
            ssh = mc.state_heads // tp_size if mc.state_heads >= tp_size else 1
            head_bytes = mc.state_conv_bytes + mc.state_ssm_bytes
            what = "%d state heads x (%d conv + %d ssm) bytes" % (
                ssh, mc.state_conv_bytes, mc.state_ssm_bytes)
            if state_buffers is None:
                pool.add_states(None, n_state, 0, 0, what)  # refused, naming it
            if state_slots is None:
                raise _errors.invalid("state_slots: this rank's stage has %d state layers: "
                                      "give the slots of each state buffer (a request's "
                                      "state goes to the slot open_room(state_slot=) names)"
                                      % n_state)
            slots = _i64("state_slots", state_slots, 1)
            pool.add_states(state_buffers, n_state, slots, ssh * head_bytes, what)
            sb = (ctypes.c_uint64 * len(kinds))()
            it = iter(pool.state_buffers)
            for i, kind in enumerate(kinds):
                sb[i] = next(it).ptr if kind == "state" else 0
            cfg.state_base, cfg.state_slots = sb, slots
        else:
            if state_slots is not None:
                raise _errors.invalid("state_slots: given, but this rank's layers have no "
                                      "state layers: drop it (with state_buffers)")
            pool.add_states(state_buffers, 0, 0, 0, "")
            slots = 0
        _fabric.check_memory(fabric, pool)
        if total_heads is None:
            total_heads = pool.heads * tp_size
        code = ctypes.c_int()
        if lib.kvs_dtype_parse(pool.dtype.encode(), ctypes.byref(code)) != 0:
            raise _errors.invalid("dtype: %r is not a kvstage dtype" % pool.dtype)
        aux = _u64("max_aux_bytes", max_aux_bytes)
        if aux > S.AUX_BYTES_MAX:
            raise _errors.invalid("max_aux_bytes: %d is over the %d bytes a room can carry"
                                  % (aux, S.AUX_BYTES_MAX))

        mc.role = _ROLES[role]
        mc.staging = bool(staging)
        mc.total_heads = _i64("total_heads", total_heads, 1)
        mc.kv_kind = kv_kind
        mc.head_dim = pool.head_dim
        mc.dtype = code.value
        mc.layers = pool.layers if kinds is None else len(kinds)
        mc.page_size = page_size
        mc.peer_page_size = _i64("peer_page_size", peer_page_size)
        mc.tp_rank, mc.tp_size = tp_rank, tp_size
        mc.pp_rank, mc.pp_size = _i64("pp_rank", pp_rank), _i64("pp_size", pp_size, 1)
        mc.peer_tp_size = _i64("peer_tp_size", peer_tp_size)
        mc.peer_pp_size = _i64("peer_pp_size", peer_pp_size)
        mc.context_parallel = _i64("context_parallel", context_parallel, 1)
        mc.cp_rank = _i64("cp_rank", cp_rank)
        mc.chunk_tokens = _i64("chunk_tokens", chunk_tokens)
        mc.ring_bytes = _u64("ring_bytes", ring_bytes)
        mc.max_rooms = _u64("max_rooms", max_rooms)
        mc.transfer_workers = _u64("transfer_workers", transfer_workers)
        if not isinstance(stall_timeout_s, (int, float)) or stall_timeout_s < 0:
            raise _errors.invalid("stall_timeout_s: %r: give seconds >= 0 (0: 30 s)"
                                  % (stall_timeout_s,))
        mc.stall_timeout_ns = int(stall_timeout_s * 1e9)
        mc.app_tag = _u64("app_tag", app_tag)
        # The cluster secret is named, never passed (docs/security.md).
        for key, val in (("secret_file", secret_file), ("secret_env", secret_env)):
            if val is not None:
                if not isinstance(val, str) or not val:
                    raise _errors.invalid("%s: %r: give a path or a variable name" % (key, val))
                setattr(mc, key, val.encode())
        mc.model_layers = _i64("model_layers", model_layers or 0)
        mc.instance_id = _u64("instance_id", instance_id)
        mc.dp_rank = _i64("dp_rank", dp_rank)
        mc.max_aux_bytes = aux
        mc.kv_scales, mc.scale_block = scales, block
        # A draft model's layers (docs/kinds/draft.md): its own K / V
        # buffers over the same pages; both sides give the same draft.
        mc.draft_layers, mc.draft_head_dim, mc.draft_kv_heads = self._draft_shape(
            pool, draft_layers, draft_head_dim, draft_kv_heads, mc.pp_rank, mc.pp_size)
        if pool.draft_pairs:
            dk = (ctypes.c_uint64 * len(pool.draft_pairs))(*[k.ptr for k, _ in pool.draft_pairs])
            cfg.draft_k_base = dk
            if kv_kind != 1:
                dv = (ctypes.c_uint64 * len(pool.draft_pairs))(
                    *[v.ptr for _, v in pool.draft_pairs])
                cfg.draft_v_base = dv
        layer_arr = (S.KvLayer * mc.layers)()
        pool.fill_layers(layer_arr, kinds)
        cfg.layers = layer_arr
        cfg.local_heads = pool.heads

        self._lib, self._hw, self._pool = lib, hw, pool
        self.role = role
        self.fabric = fabric
        self.page_size = page_size
        self.kind = _models.kind_name(kv_kind)
        self.kv_scales = _models.scales_name(scales)
        self.context_parallel, self._cp_rank = context_parallel, cp_rank
        self.peer_page_size = peer_page_size or page_size
        self.num_pages = pool.num_pages
        self.layers = mc.layers
        # the stage's layer kinds ("full", "window", "state"), and the
        # slots of its state buffers (0: no state layers)
        self.layer_kinds = list(kinds or ["full"] * mc.layers)
        self.state_slots = slots
        self.local_heads = pool.heads
        self.head_dim = pool.head_dim
        self.dtype = pool.dtype
        self.max_aux_bytes = aux
        self.device = pool.buffers[0].where()
        self._lock = threading.Lock()
        # on_result notifies it: state() waits there for a room the C rank
        # has handed to the driver but whose result is not here yet.
        self._ended = threading.Condition(self._lock)
        self._results = collections.deque()
        self._finished = {}
        self._pending = set()  # rooms opened whose result has not come yet
        self._thread_error = None
        try:
            self._make_device(pool, copy_threads)
            self._fab = _fabric.create(hw, fabric, provider, rdma_device, near_pci,
                                       bind_addr, listen_port)
            chose = _fabric.info(hw, fabric, self._fab)
            self.address = chose["address"]
            self.provider = chose["provider"]
            self.rdma_device = chose["rdma_device"]
            err = S.Error()
            out = ctypes.c_void_p()
            rc = lib.kvs_rank_create(ctypes.byref(cfg), self._dev, self._fab,
                                     ctypes.byref(out), ctypes.byref(err))
            if rc != 0:
                _errors.raise_for(rc, err)
            self._rank = out
            self._make_driver()
            if discovery is not None:
                self._join(discovery, discovery_wait_s, dict(
                    role=role, instance=instance_id, dp_rank=dp_rank, pp_rank=pp_rank,
                    tp_rank=tp_rank, tp_size=tp_size, pp_size=pp_size,
                    cp_rank=cp_rank, cp_size=context_parallel, address=self.address,
                    shape=dict(total_heads=total_heads, head_dim=pool.head_dim,
                               model_layers=model_layers or pool.layers * pp_size,
                               page_size=page_size, dtype=pool.dtype)))
        except BaseException:
            self._teardown()
            raise

    # ---- construction and teardown ------------------------------------------

    @staticmethod
    def _draft_shape(pool, layers, head_dim, kv_heads, pp_rank, pp_size):
        """(draft_layers, draft_head_dim, draft_kv_heads) of the manager
        config (docs/kinds/draft.md): the draft's buffers' on the last PP
        stage, which alone holds the draft (kvs_layout_draft_stage); the
        declared ones (draft_layers=, draft_head_dim=) on a stage before
        it, which gives no buffers but lays its regions out as every stage
        does. Refuses buffers on a stage before the last, none on the last
        with a declared draft, and a declared shape the buffers do not
        have, naming the argument."""
        last = pp_rank == pp_size - 1
        n = len(pool.draft_pairs)
        layers = None if layers is None else _i64("draft_layers", layers)
        head_dim = None if head_dim is None else _i64("draft_head_dim", head_dim)
        kv_heads = 0 if kv_heads is None else _i64("draft_kv_heads", kv_heads)
        if n and not last:
            raise _errors.invalid(
                "draft_k_buffers: pp_rank %d is not the last stage (pp_size %d), and the "
                "draft is the last stage's (docs/kinds/draft.md): give no draft buffers here, "
                "declare the draft with draft_layers=%d and draft_head_dim=%d"
                % (pp_rank, pp_size, n, pool.draft_head_dim))
        if not n and layers and last:
            raise _errors.invalid(
                "draft_k_buffers: draft_layers=%d, and %s holds the draft: give its buffers, "
                "one per draft layer (draft_layers= alone declares the draft on a stage "
                "before the last)" % (layers, "this rank" if pp_size == 1 else
                                      "pp_rank %d, the last stage," % pp_rank))
        if n:
            if layers is not None and layers != n:
                raise _errors.invalid("draft_layers=%d but %d draft_k_buffers are given: one "
                                      "per draft layer" % (layers, n))
            want = head_dim or pool.head_dim
            if head_dim is not None and want != pool.draft_head_dim:
                raise _errors.invalid("draft_head_dim=%d%s but the draft buffers' last "
                                      "dimension is %d: give the draft's head_dim"
                                      % (head_dim, " (the model's head_dim %d)" % want
                                         if not head_dim else "", pool.draft_head_dim))
            return n, pool.draft_head_dim, kv_heads
        if not layers and (head_dim or kv_heads):
            raise _errors.invalid("%s: given, but there is no draft (no draft_k_buffers, "
                                  "draft_layers %s): declare it with draft_layers=, or drop "
                                  "it" % ("draft_head_dim" if head_dim else "draft_kv_heads",
                                          layers))
        return layers or 0, head_dim or 0, kv_heads if layers else 0

    @staticmethod
    def _layer_kinds(lib, mc, pattern, model_layers, layers, given, pp_rank, pp_size):
        """Puts a hybrid model's layer pattern in the manager config mc and
        returns the kinds of this rank's stage's layers ("full", "window",
        "state"; docs/kinds/hybrid.md), or None for a model of full
        attention only. The stage is model_layers' share (kvs_pp_stage_
        layers); without model_layers, one of pp_size equal stages of as
        many layers as `layers` or the buffers given (`given`), which with
        state layers cannot say how many there are."""
        _models.hybrid_params(mc, pattern)
        if mc.full_attn_every <= 1:
            return None
        other = ("full", "window", "state")[mc.other_layers]
        if model_layers:
            first, count = ctypes.c_int64(), ctypes.c_int64()
            rc = lib.kvs_pp_stage_layers(_i64("model_layers", model_layers, 1), pp_size,
                                         pp_rank, ctypes.byref(first), ctypes.byref(count))
            if rc != 0:
                raise _errors.invalid("pp_rank: %d: give a stage in [0, pp_size %d)"
                                      % (pp_rank, pp_size))
            first, count = first.value, count.value
        elif other == "state":
            raise _errors.invalid("model_layers: a model with state layers needs its layer "
                                  "count to tell which of this rank's layers keep K and V: "
                                  "give model= or model_layers=")
        else:
            count = layers if layers is not None else len(list(given or []))
            first = pp_rank * count
        if layers is not None and layers != count:
            raise _errors.invalid("layers=%d but this rank's stage of model_layers %d over "
                                  "pp_size %d has %d layers" % (layers, model_layers,
                                                                pp_size, count))
        kinds = _models.layer_kinds(mc.full_attn_every, other, first, count)
        if "state" in kinds and kinds.count("state") == len(kinds):
            raise _errors.invalid("pp_rank: stage %d (layers %d..%d) holds state layers "
                                  "alone: kvstage.Rank needs a full or window layer's K and "
                                  "V on each rank (the pool's pages)"
                                  % (pp_rank, first, first + count - 1))
        return kinds

    def _make_device(self, pool, copy_threads):
        err = S.Error()
        out = ctypes.c_void_p()
        kind, index = pool.device
        if kind == "cuda":
            cuda = _library.load_backend("cuda")
            cc = S.CudaConfig(ordinal=index)
            rc = cuda.kvs_cuda_device_create(ctypes.byref(cc), ctypes.byref(out),
                                             ctypes.byref(err))
            if rc != 0:
                _errors.raise_for(rc, err)
            self._dev_obj, self._dev_kind = out, cuda
            self._dev = cuda.kvs_cuda_device(out)
            attach = lambda a, n: cuda.kvs_cuda_mem_attach(self._dev, a, n, ctypes.byref(err))
        else:
            hc = S.HostConfig(copy_threads=_u64("copy_threads", copy_threads))
            rc = self._hw.kvs_host_device_create(ctypes.byref(hc), ctypes.byref(out),
                                                 ctypes.byref(err))
            if rc != 0:
                _errors.raise_for(rc, err)
            self._dev_obj, self._dev_kind = out, None
            self._dev = self._hw.kvs_host_device(out)
            attach = lambda a, n: self._hw.kvs_host_mem_attach(self._dev, a, n,
                                                               ctypes.byref(err))
        for addr, n in pool.ranges():
            rc = attach(addr, n)
            if rc != 0:
                _errors.raise_for(rc, err)
            self._attached.append(addr)

    def _make_driver(self):
        # The callbacks run on the driver's thread (start()) or inside
        # progress(); aux is valid only during the call, so it is copied.
        def on_result(_ctx, res):
            r = res.contents
            aux = ctypes.string_at(r.aux, r.aux_bytes) if r.aux and r.aux_bytes else b""
            name = self._lib.kvs_status_name(r.status).decode()
            item = RoomResult(r, aux, name)
            with self._lock:
                self._results.append(item)
                self._finished[item.room] = item.state
                self._pending.discard(item.room)
                self._ended.notify_all()

        def on_error(_ctx, status):
            self._thread_error = status

        self._on_result = S.RESULT_FN(on_result)
        self._on_error = S.ERROR_FN(on_error)
        dc = S.DriverConfig(rank=self._rank, dev=self._dev, fab=self._fab,
                            on_result=self._on_result, on_error=self._on_error)
        err = S.Error()
        out = ctypes.c_void_p()
        rc = self._hw.kvs_driver_create(ctypes.byref(dc), ctypes.byref(out),
                                        ctypes.byref(err))
        if rc != 0:
            _errors.raise_for(rc, err)
        self._drv = out

    def _join(self, discovery, wait_s, record):
        from .discovery import Discovery
        if not isinstance(discovery, Discovery):
            raise _errors.invalid("discovery: %r: give a kvstage.Discovery" % (discovery,))
        if not isinstance(wait_s, (int, float)) or wait_s < 0:
            raise _errors.invalid("discovery_wait_s: %r: give seconds >= 0" % (wait_s,))
        self._discovery, self._discovery_wait_s = discovery, float(wait_s)
        self._shape = record["shape"]
        self._published = discovery.publish(record)
        if self.role == "decode":
            discovery.follow(self)

    def _discover(self, ref):
        """Decode: declares the prefill group ref from the discovery's records
        the first time a room names it. A group gone from them is looked up
        again: back (maybe elsewhere), its room uses it."""
        if ref in self._declared:
            if ref in self._gone:
                found = self._discovery.instances("prefill").get(ref)
                if found is not None:
                    self._discovery_seen({ref: found}, only=ref)
            return
        found = self._discovery.wait_instance("prefill", ref, self._discovery_wait_s)
        if found is None:
            raise _errors.invalid(
                "open_room: prefill instance %d group %d has no complete record in %s "
                "after %.1f s: is it running with the same discovery and cluster?"
                % (ref[0], ref[1], self._discovery.url, self._discovery_wait_s))
        for field, mine in self._shape.items():
            theirs = found["shape"].get(field)
            if theirs is not None and theirs != mine:
                raise _errors.invalid(
                    "open_room: prefill instance %d serves %s=%r, this decode %r: give "
                    "both sides the same model shape" % (ref[0], field, theirs, mine))
        if found["dp_size"] > 1 or ref[1] > 0:
            # Groups of one instance are declared together (add_instance takes
            # them all): wait for every group of the instance.
            raise _errors.invalid("open_room: discovery of attention-data-parallel prefill "
                                  "instances is not supported yet: declare instance %d with "
                                  "add_instance" % ref[0])
        self.add_instance(ref[0], found["addresses"], tp_size=found["tp_size"],
                          pp_size=found["pp_size"], cp_size=found["cp_size"])
        self._declared[ref] = found["addresses"]

    def _discovery_seen(self, present, only=None):
        """The discovery's follower thread (and _discover): the complete
        prefill groups now ({ref: record}). A declared group that vanished
        is lost: its rooms fail at once. Back at other addresses (a
        restarted pod), it is declared again there; either way its next
        room connects."""
        with self._seen_mu:
            for ref in [only] if only is not None else list(self._declared):
                if ref not in present and ref not in self._gone:
                    self._gone.add(ref)
                    if self._rank:
                        self.instance_lost(ref[0], ref[1])
                elif ref in present and ref in self._gone:
                    found = present[ref]
                    if found["addresses"] != self._declared[ref] and self._rank:
                        self.add_instance(ref[0], found["addresses"],
                                          tp_size=found["tp_size"], pp_size=found["pp_size"],
                                          cp_size=found["cp_size"])
                        self._declared[ref] = found["addresses"]
                    self._gone.discard(ref)

    def _teardown(self):
        if self._discovery is not None:
            self._discovery.unfollow(self)
            if self._published is not None:
                try:
                    self._discovery.unpublish(self._published)
                except Exception:
                    pass  # the lease takes it with it
            self._discovery = self._published = None
        hw = self._hw if hasattr(self, "_hw") else None
        if self._drv:
            hw.kvs_driver_destroy(self._drv)  # stops and joins its thread
            self._drv = None
        if self._rank:
            self._lib.kvs_rank_destroy(self._rank)
            self._rank = None
        if self._fab:
            _fabric.destroy(hw, self.fabric, self._fab)
            self._fab = None
        if self._dev_obj:
            for addr in self._attached:
                if self._dev_kind is not None:
                    self._dev_kind.kvs_cuda_mem_detach(self._dev, addr, None)
                else:
                    hw.kvs_host_mem_detach(self._dev, addr, None)
            self._attached = []
            if self._dev_kind is not None:
                self._dev_kind.kvs_cuda_device_destroy(self._dev_obj)
            else:
                hw.kvs_host_device_destroy(self._dev_obj)
            self._dev_obj = None

    def close(self, linger_s=1.0):
        """Lingers until the peers have acknowledged every control message
        this rank sent (stats()["msgs_unacked"] == 0: a decode's last DONE,
        without which its prefill would fail the room when this side
        vanishes), at most linger_s seconds, moving them with the
        background thread or, stopped, with progress(); then stops the
        thread and frees the driver, the rank, the fabric and the device
        (the KV buffers stay the caller's). Rooms still open are dropped.
        Safe to call twice."""
        if self._rank and self._drv and linger_s and self._thread_error is None:
            self._linger(time.monotonic() + linger_s)
        self._teardown()

    def _linger(self, until):
        hs = S.HandlerStats()
        running = self._hw.kvs_driver_running(self._drv)
        while time.monotonic() < until:
            self._lib.kvs_rank_stats(self._rank, ctypes.byref(hs))
            if hs.msgs_unacked == 0:
                return
            if running:
                time.sleep(0.002)
            elif self._hw.kvs_driver_progress(self._drv) < 0:
                return  # the rank failed: nothing more will be acknowledged
            else:
                self._hw.kvs_driver_wait(self._drv, 2000000)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close(linger_s=0)
        except Exception:
            pass

    # ---- calls ----------------------------------------------------------------

    def _live(self, what):
        if not self._rank:
            raise _errors.invalid("%s: the rank is closed" % what)

    def _check(self, rc, what):
        if rc < 0:
            err = S.Error()
            self._hw.kvs_driver_rank_error(self._drv, ctypes.byref(err))
            detail = err.msg.decode(errors="replace") if err.status == rc and err.msg \
                else None
            _errors.raise_for(rc, None, "%s: %s" % (what, detail or _errors.strerror(rc)))
        return rc

    def add_instance(self, instance, addresses, *, tp_size=None, pp_size=1, dp_size=1,
                     cp_size=1):
        """Decode: declares prefill instance `instance`: the fabric address
        of each of its ranks ("ip:port"), dp_size x cp_size x pp_size x
        tp_size of them, group-major, then CP rank, then stage. cp_size:
        its context-parallel ranks. Connections are made on first use (or
        connect())."""
        self._live("add_instance")
        addrs = [str(a) for a in addresses]
        # 0 means 1 for each (as in kvs_instance_desc_t)
        others = 1
        for key, val in (("pp_size", pp_size), ("dp_size", dp_size), ("cp_size", cp_size)):
            others *= max(1, _i64(key, val))
        if tp_size is None:
            tp_size = len(addrs) // others
        arr = (ctypes.c_char_p * max(1, len(addrs)))(*[a.encode() for a in addrs])
        if len(addrs) != tp_size * others:
            raise _errors.invalid("addresses: %d given but the instance has %d ranks "
                                  "(tp_size %d x pp_size %d x cp_size %d x dp_size %d)"
                                  % (len(addrs), tp_size * others, tp_size, pp_size,
                                     cp_size, dp_size))
        desc = S.InstanceDesc(id=_u64("instance", instance), tp_size=tp_size,
                              pp_size=pp_size, dp_size=dp_size, addrs=arr, cp_size=cp_size)
        self._check(self._lib.kvs_rank_add_instance(self._rank, ctypes.byref(desc)),
                    "add_instance(%d)" % instance)

    def connect(self, instance=0, dp_rank=0):
        """Decode: connects to the ranks of a declared prefill instance that
        write to this rank, ahead of the first room naming it."""
        self._live("connect")
        peer = S.Peer(instance=_u64("instance", instance), dp_rank=_i64("dp_rank", dp_rank))
        self._check(self._lib.kvs_rank_connect(self._rank, peer), "connect(%d)" % instance)

    @property
    def peers_ready(self):
        """Decode: peer ranks connected and registered."""
        self._live("peers_ready")
        return int(self._lib.kvs_rank_peers_ready(self._rank))

    def open_room(self, room, pages, *, peer=0, dp_rank=0, total_tokens=None,
                  base_tokens=0, aux=None, state_slot=None):
        """Opens request `room` paired with instance `peer`. pages: the KV
        pool pages of the request (decode: of its uncached suffix, after
        base_tokens; prefill: all of it), as ints, a numpy array or a
        tensor. total_tokens defaults to the pages' tokens (plus
        base_tokens). Prefill: aux, the request's aux payload, may be given
        here or later with set_aux. state_slot: with state layers, the
        request's slot in the state buffers, [0, state_slots) (a prefill
        gathers its state from there, a decode scatters it there); given
        by each side for its own buffers. A room whose peer rank is lost
        raises KVS_EPEER and its failed result also comes through poll()."""
        self._live("open_room")
        _u64("room", room)
        pages = _ints("pages", pages)
        for i, p in enumerate(pages):
            if not 0 <= p < self.num_pages:
                raise _errors.invalid("pages[%d] = %d is outside the KV pool's %d pages"
                                      % (i, p, self.num_pages))
        base = _i64("base_tokens", base_tokens)
        if total_tokens is None:
            total_tokens = base + len(pages) * self.page_size
        total = _i64("total_tokens", total_tokens)
        blob = _bytes_of("aux", aux)
        if blob and self.role == "decode":
            raise _errors.invalid("aux: a decode room receives its aux payload with its "
                                  "result; give aux on the prefill side")
        if len(blob) > self.max_aux_bytes:
            raise _errors.invalid("aux: %d bytes but max_aux_bytes is %d: raise "
                                  "max_aux_bytes on both sides" % (len(blob),
                                                                   self.max_aux_bytes))
        if self.state_slots and state_slot is None:
            raise _errors.invalid("state_slot: room %d: this rank's stage has state layers: "
                                  "give the request's slot in the state buffers, in [0, "
                                  "state_slots %d)" % (room, self.state_slots))
        if not self.state_slots and state_slot is not None:
            raise _errors.invalid("state_slot: room %d: this rank's layers have no state "
                                  "layers: drop state_slot" % room)
        if state_slot is not None:
            try:  # an int, or a numpy / torch integer
                slot = None if isinstance(state_slot, bool) else operator.index(state_slot)
            except TypeError:
                slot = None
            if slot is None or not 0 <= slot < self.state_slots:
                raise _errors.invalid("state_slot: room %d: %r is outside the state buffers' "
                                      "slots: give an integer in [0, state_slots %d)"
                                      % (room, state_slot, self.state_slots))
            state_slot = slot
        arr = (ctypes.c_int64 * max(1, len(pages)))(*pages)
        desc = S.RoomDesc(room=room, peer=S.Peer(instance=_u64("peer", peer),
                                                 dp_rank=_i64("dp_rank", dp_rank)),
                          base_tokens=base, total_tokens=total, pages=arr,
                          num_pages=len(pages), aux=ctypes.cast(ctypes.c_char_p(blob),
                                                                ctypes.c_void_p) if blob
                          else None, aux_bytes=len(blob),
                          state_slot=state_slot if state_slot is not None else 0)
        if self._discovery is not None and self.role == "decode":
            self._discover((peer, dp_rank))
        with self._lock:
            self._finished.pop(room, None)
            self._pending.add(room)
        rc = self._lib.kvs_rank_open_room(self._rank, ctypes.byref(desc))
        if rc < 0 and rc != _KVS_EPEER:  # (EPEER: the failed result comes)
            with self._lock:
                self._pending.discard(room)
        self._check(rc, "open_room(%d)" % room)

    def instance_lost(self, instance, dp_rank=0):
        """The peer instance (attention group) is gone, as the application
        learned (a discovery lease lapsed): its open rooms fail now with
        KVS_EPEER, its connections are dropped, and a decode connects again
        on the next room naming it."""
        self._live("instance_lost")
        peer = S.Peer(instance=_u64("instance", instance), dp_rank=_i64("dp_rank", dp_rank))
        self._check(self._lib.kvs_rank_instance_lost(self._rank, peer),
                    "instance_lost(%d)" % instance)

    def set_aux(self, room, aux):
        """Prefill: the room's aux payload (at most max_aux_bytes), sent
        with its last chunk; set it before the final computed()."""
        self._live("set_aux")
        blob = _bytes_of("aux", aux)
        if len(blob) > self.max_aux_bytes:
            raise _errors.invalid("aux: %d bytes but max_aux_bytes is %d: raise "
                                  "max_aux_bytes on both sides" % (len(blob),
                                                                   self.max_aux_bytes))
        self._check(self._lib.kvs_rank_set_aux(self._rank, _u64("room", room), blob,
                                               len(blob)), "set_aux(%d)" % room)

    def cp_range(self, total_tokens):
        """The tokens [start, end) of a request of total_tokens that this
        rank holds: its context-parallel rank's range (a prefill of
        context_parallel > 1; empty for the last CP ranks of a short
        prompt), else all of them."""
        self._live("cp_range")
        lay = self._lib.kvs_manager_layout(self._lib.kvs_rank_manager(self._rank))
        start, end = ctypes.c_int64(), ctypes.c_int64()
        self._check(self._lib.kvs_layout_cp_range(lay, _i64("total_tokens", total_tokens),
                                                  self._cp_rank, ctypes.byref(start),
                                                  ctypes.byref(end)),
                    "cp_range(%d)" % total_tokens)
        return int(start.value), int(end.value)

    def computed(self, room, end_tokens, final=False):
        """Prefill: the KV of tokens [0, end_tokens) of the room is in the
        pool (its forward pass wrote it); final: the last call for it."""
        self._live("computed")
        self._check(self._lib.kvs_rank_computed(self._rank, _u64("room", room),
                                                _i64("end_tokens", end_tokens), bool(final)),
                    "computed(%d)" % room)

    def state(self, room):
        """The room's RoomState; a finished room's until poll() returned it.
        KvstageError KVS_ENOENT for a room never opened (or polled)."""
        self._live("state")
        out = ctypes.c_int()
        rc = self._lib.kvs_rank_room_state(self._rank, _u64("room", room), ctypes.byref(out))
        if rc == 0:
            return RoomState(out.value)
        with self._lock:
            # The driver takes a finished room's result from the C rank and
            # hands it to on_result outside the rank's lock: a room opened
            # and not reported yet is in neither place for that moment.
            if room in self._pending and room not in self._finished:
                self._ended.wait_for(lambda: room not in self._pending, timeout=5.0)
            done = self._finished.get(room)
        if done is not None:
            return done
        self._check(rc, "state(%d)" % room)

    def abort(self, room):
        """Fails the room (KVS_ECANCELED) and tells its peers; its result
        comes through poll()."""
        self._live("abort")
        self._check(self._lib.kvs_rank_abort(self._rank, _u64("room", room)),
                    "abort(%d)" % room)

    def progress(self):
        """One step in the caller's loop (not while start() runs): moves
        what can move, collects finished rooms for poll(). Returns the work
        it found (0: nothing to do)."""
        self._live("progress")
        if self._hw.kvs_driver_running(self._drv):
            raise _errors.invalid("progress: the background thread runs (start()); "
                                  "call stop() first or leave progress to it")
        rc = self._hw.kvs_driver_progress(self._drv)
        if rc < 0:
            e = self._hw.kvs_driver_last_error(self._drv).contents
            _errors.raise_for(rc, e)
        return rc

    def wait(self, timeout_s=None):
        """Caller's loop: sleeps until there may be work (a completion, a
        message, another thread's call, a deadline) or timeout_s passed.
        True: call progress(); False: the time-out passed."""
        self._live("wait")
        ns = (1 << 64) - 1 if timeout_s is None else max(0, int(timeout_s * 1e9))
        rc = self._hw.kvs_driver_wait(self._drv, ns)
        if rc == 0:
            return True
        if rc == _errors.status_code("KVS_EAGAIN"):
            return False
        e = self._hw.kvs_driver_last_error(self._drv).contents
        _errors.raise_for(rc, e)

    def start(self):
        """Starts the background thread that moves the bytes; results wait
        for poll()."""
        self._live("start")
        rc = self._hw.kvs_driver_start(self._drv)
        if rc != 0:
            e = self._hw.kvs_driver_last_error(self._drv).contents
            _errors.raise_for(rc, e)

    def stop(self):
        """Stops the background thread (the rank stays usable)."""
        if self._drv:
            rc = self._hw.kvs_driver_stop(self._drv)
            if rc != 0:
                e = self._hw.kvs_driver_last_error(self._drv).contents
                _errors.raise_for(rc, e)

    def poll(self):
        """The rooms finished since the last call, oldest first, as
        RoomResult. Raises the background thread's failure, if it ended on
        one."""
        if self._thread_error is not None:
            status, self._thread_error = self._thread_error, None
            e = self._hw.kvs_driver_last_error(self._drv).contents
            _errors.raise_for(status, e)
        with self._lock:
            out = list(self._results)
            self._results.clear()
            for r in out:
                if self._finished.get(r.room) == r.state:
                    del self._finished[r.room]
        return out

    def metrics(self):
        """The rank's metrics as Prometheus text (exposition format 0.0.4):
        rooms' transfer time and bytes per peer instance, rooms ended by
        status, open rooms by state, the counters of stats(); what an
        engine's /metrics endpoint serves (docs/operations.md). Ranks of one
        process: kvstage.metrics_text(rank, rank, ...)."""
        self._live("metrics")
        return metrics_text(self)

    def stats(self):
        """The rank's counters (kvs_handler_stats_t) and the driver's
        (prefixed driver_), as a dict."""
        self._live("stats")
        hs = S.HandlerStats()
        self._lib.kvs_rank_stats(self._rank, ctypes.byref(hs))
        out = {name: int(getattr(hs, name)) for name, _ in S.HandlerStats._fields_}
        ds = S.DriverStats()
        self._hw.kvs_driver_stats(self._drv, ctypes.byref(ds))
        out.update({"driver_" + name: int(getattr(ds, name))
                    for name, _ in S.DriverStats._fields_})
        return out


def metrics_text(*ranks):
    """The metrics of several open Ranks of this process as one Prometheus
    exposition (each metric family once, every rank's samples under it)."""
    if not ranks:
        raise _errors.invalid("metrics_text: give at least one Rank")
    for r in ranks:
        if not isinstance(r, Rank) or not r._rank:
            raise _errors.invalid("metrics_text: %r is not an open kvstage.Rank" % (r,))
    lib = ranks[0]._lib
    arr = (ctypes.c_void_p * len(ranks))(*[r._rank for r in ranks])
    need = ctypes.c_size_t(0)
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        rc = lib.kvs_rank_metrics(arr, len(ranks), buf, cap, ctypes.byref(need))
        if rc == 0:
            return buf.value.decode()
        if rc != _errors.status_code("KVS_ERANGE") or need.value + 1 <= cap:
            _errors.raise_for(rc, None, "kvs_rank_metrics: %s" % _errors.strerror(rc))
        cap = need.value + 1
