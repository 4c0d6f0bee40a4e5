"""conn.py - kvstage as an sglang disaggregation transfer backend: the KV
manager (one kvstage.Rank per engine rank), the prefill's KVSender and the
decode's KVReceiver, with sglang's poll states (KVPoll, the same numbers
as kvstage.RoomState).

How a request maps (docs/embedding.md, "sglang"):
- sglang's bootstrap_room is the kvstage room id on every rank;
- a prefill instance is found through its bootstrap server (bootstrap.py):
  the decode asks once per bootstrap address, caches the layout and gives
  it to its rank as a kvstage peer instance (add_instance) under the
  id the bootstrap server drew when it started (every prefill rank of the
  instance is made with it); the prefill attention group a room goes to is
  bootstrap_room % its dp_size;
- the prefill's pages arrive chunk by chunk in send(); kvstage takes a
  room's pages at open, so the sender opens the room when its last chunk
  (num_kv_indices pages in all) is in and sends it whole;
- both sides move whole pages: total_tokens = pages x page_size;
- the metadata buffers (KVArgs.aux_data_ptrs, one item per request slot)
  travel as the room's aux payload: the prefill's items at its aux_index,
  concatenated, land in the decode's items at its aux_index before the
  receiver reports Success.

Liveness: the decode manager's heartbeat thread asks each prefill
instance's bootstrap server for /health every heartbeat_s; after
heartbeat_misses answers missed in a row the instance is offline: its open
rooms fail (Rank.instance_lost: KVS_EPEER), receivers waiting on it report
Failed, and the next receiver naming it asks its bootstrap server once
more (it may have come back) and fails at once if it does not answer.

Both receiver interfaces of sglang work: init(kv_indices, aux_index), and
the newer init(prefill_dp_rank) + send_metadata(kv_indices, aux_index,
state_indices, decode_prefix_len), where the DP rank sglang picked replaces
bootstrap_room % dp_size and decode_prefix_len (the decode's own prefix
cache hit) is the room's base_tokens. The sender's pop_decode_prefix_len()
stays 0: sglang hands kvstage every page, and kvstage's prefill skips the
decode's cached prefix itself when the decode's room says how long it is.

What it does not do: one decode instance (decode DP 1) per prefill, since
a prefill room is paired with decode instance 0; PP; MLA pools (give
k_buffers only through the core API); state (mamba/SWA/DSA) buffers: a
request whose state_indices name one fails, saying so."""

import collections
import ctypes
import numbers
import os
import threading
import time

from .. import _errors
from .._rank import Rank
from . import bootstrap as _bootstrap
from ._base import BaseKVManager, BaseKVReceiver, BaseKVSender, KVPoll, KVTransferMetric

_RESULTS_MAX = 65536  # finished rooms remembered for late polls


class KVTransferError(Exception):
    """A room's KV transfer failed: room, and why in words."""

    def __init__(self, room, why):
        super().__init__("kvstage: bootstrap_room %d failed: %s" % (room, why))
        self.room = room
        self.why = why


# The options an operator sets in the environment (the engine's command line
# has no place for them), with their defaults and what each must be.
_OPTIONS = {
    "fabric": ("KVSTAGE_FABRIC", "verbs", str),
    "provider": ("KVSTAGE_PROVIDER", None, str),
    "bind_addr": ("KVSTAGE_BIND_ADDR", None, str),
    "bootstrap_host": ("KVSTAGE_BOOTSTRAP_HOST", None, str),
    "ring_bytes": ("KVSTAGE_RING_BYTES", 0, int),
    "chunk_tokens": ("KVSTAGE_CHUNK_TOKENS", 0, int),
    "stall_timeout_s": ("KVSTAGE_STALL_TIMEOUT_S", 0, float),
    "bootstrap_timeout_s": ("KVSTAGE_BOOTSTRAP_TIMEOUT_S", 30.0, float),
    "heartbeat_s": ("KVSTAGE_HEARTBEAT_S", 5.0, float),
    "heartbeat_misses": ("KVSTAGE_HEARTBEAT_MISSES", 3, int),
}


def options(overrides=None):
    """The backend's options: overrides (a dict), else $KVSTAGE_*, else the
    defaults. KvstageError naming the variable for a value of the wrong
    kind."""
    out = {}
    overrides = dict(overrides or {})
    for key, (env, default, kind) in _OPTIONS.items():
        if key in overrides:
            out[key] = overrides.pop(key)
            continue
        raw = os.environ.get(env)
        if raw is None or raw == "":
            out[key] = default
            continue
        try:
            out[key] = kind(raw)
        except ValueError:
            raise _errors.invalid("%s=%r: give %s" % (env, raw, {int: "an integer",
                                                                 float: "seconds",
                                                                 str: "a name"}[kind])) \
                from None
    if overrides:
        raise _errors.invalid("options: %s: not kvstage sglang options (known: %s)"
                              % (", ".join(sorted(overrides)), ", ".join(sorted(_OPTIONS))))
    for key in ("heartbeat_s", "bootstrap_timeout_s"):
        if not out[key] > 0:
            raise _errors.invalid("%s (%s): %r: give seconds > 0" % (key, _OPTIONS[key][0],
                                                                    out[key]))
    if out["heartbeat_misses"] < 1:
        raise _errors.invalid("heartbeat_misses (KVSTAGE_HEARTBEAT_MISSES): %r: give an "
                              "integer >= 1" % out["heartbeat_misses"])
    return out


def _mode_name(mode):
    """"prefill" or "decode" from sglang's DisaggregationMode (or a string)."""
    name = str(getattr(mode, "value", mode)).lower()
    if name not in ("prefill", "decode"):
        raise _errors.invalid("disaggregation_mode: %r: give DisaggregationMode.PREFILL or "
                              ".DECODE" % (mode,))
    return name


class _Instance:
    """A prefill instance the decode knows, by bootstrap address."""

    def __init__(self, ident, addr, layout):
        self.id = ident
        self.addr = addr
        self.tp_size = int(layout["tp_size"])
        self.dp_size = int(layout["dp_size"])
        self.page_size = int(layout["page_size"])
        self.addresses = list(layout["addresses"])
        self.misses = 0
        self.offline = None  # why, once marked offline


class KVManager(BaseKVManager):
    """One engine rank's kvstage transport (sglang's KV manager).

    args                KVArgs: engine_rank, aux_data_ptrs / aux_data_lens /
                        aux_item_lens (the metadata buffers)
    disaggregation_mode DisaggregationMode.PREFILL or .DECODE
    server_args         sglang's ServerArgs: tp_size, dp_size,
                        enable_dp_attention, disaggregation_bootstrap_port,
                        host are read
    options             overrides of the $KVSTAGE_* options (see options())

    The rank is made when the engine hands over its KV pool:
    set_kv_buffer_tensors(k_buffers, v_buffers, page_size) (sglang's
    staging path); a prefill rank then registers with its instance's
    bootstrap server. close() frees it."""

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False,
                 options=None):
        self.kv_args = args
        self.role = _mode_name(disaggregation_mode)
        self.server_args = server_args
        if is_mla_backend:
            raise _errors.invalid("is_mla_backend: the kvstage sglang backend moves MHA "
                                  "pools (k_buffer, v_buffer) only; use another backend "
                                  "for MLA")
        self.options = globals()["options"](options)
        tp_size = int(getattr(server_args, "tp_size", 1) or 1)
        dp_size = int(getattr(server_args, "dp_size", 1) or 1)
        if not getattr(server_args, "enable_dp_attention", False):
            dp_size = 1
        if tp_size % dp_size:
            raise _errors.invalid("server_args: tp_size %d is not a multiple of dp_size %d"
                                  % (tp_size, dp_size))
        self.attn_tp_size = tp_size // dp_size
        self.dp_size = dp_size
        engine_rank = int(getattr(args, "engine_rank", 0))
        self.attn_tp_rank = engine_rank % self.attn_tp_size
        self.dp_rank = engine_rank // self.attn_tp_size
        self.aux_ptrs = [int(p) for p in getattr(args, "aux_data_ptrs", ())]
        self.aux_item_lens = [int(n) for n in getattr(args, "aux_item_lens", ())]
        self.aux_lens = [int(n) for n in getattr(args, "aux_data_lens", ())]
        if not len(self.aux_ptrs) == len(self.aux_item_lens) == len(self.aux_lens):
            raise _errors.invalid("KVArgs: aux_data_ptrs, aux_data_lens and aux_item_lens "
                                  "have %d, %d and %d entries: give one of each per buffer"
                                  % (len(self.aux_ptrs), len(self.aux_lens),
                                     len(self.aux_item_lens)))
        self.rank = None
        self.page_size = None
        self._mu = threading.Lock()
        self._results = collections.OrderedDict()  # room -> RoomResult
        self._instances = {}                       # decode: bootstrap addr -> _Instance
        self._declared = set()                     # decode: instance ids given the rank
        self._stop = threading.Event()
        self._heartbeat = None

    # ---- the pool ---------------------------------------------------------------

    def set_kv_buffer_tensors(self, k_buffers, v_buffers, page_size):
        """The engine's KV pool (MHATokenToKVPool.k_buffer, .v_buffer: one
        [tokens, heads, head_dim] tensor per layer) and its page size:
        makes this rank's kvstage.Rank and starts it; a prefill rank
        registers with its bootstrap server."""
        if self.rank is not None:
            raise _errors.invalid("set_kv_buffer_tensors: called twice: the pool is given "
                                  "once per manager")
        o = self.options
        aux_bytes = sum(self.aux_item_lens)
        instance_id = 0
        if self.role == "prefill":
            instance_id = _bootstrap.instance_of(self.bootstrap_addr, o["bootstrap_timeout_s"])
        rank = Rank(self.role, page_size=page_size, k_buffers=list(k_buffers),
                    v_buffers=list(v_buffers), tp_rank=self.attn_tp_rank,
                    tp_size=self.attn_tp_size, dp_rank=self.dp_rank, instance_id=instance_id,
                    max_aux_bytes=aux_bytes, ring_bytes=o["ring_bytes"],
                    chunk_tokens=o["chunk_tokens"], stall_timeout_s=o["stall_timeout_s"],
                    fabric=o["fabric"], provider=o["provider"], bind_addr=o["bind_addr"])
        try:
            rank.start()
        except BaseException:
            rank.close(linger_s=0)
            raise
        self.rank, self.page_size = rank, page_size
        if self.role == "prefill":
            self.register_to_bootstrap()
        else:
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name="kvstage-sglang-heartbeat")
            self._heartbeat.start()

    def _need_rank(self, what):
        if self.rank is None:
            raise _errors.invalid("%s: the manager has no KV pool yet: call "
                                  "set_kv_buffer_tensors(k_buffers, v_buffers, page_size) "
                                  "first (sglang: SGLANG_DISAGG_STAGING_BUFFER=1)" % what)

    @property
    def bootstrap_addr(self):
        """Prefill: "host:port" of this instance's bootstrap server."""
        host = self.options["bootstrap_host"] or getattr(self.server_args, "host", None) \
            or "127.0.0.1"
        port = getattr(self.server_args, "disaggregation_bootstrap_port", None)
        if not port:
            raise _errors.invalid("server_args.disaggregation_bootstrap_port is not set: "
                                  "give --disaggregation-bootstrap-port")
        return "%s:%d" % (host, int(port))

    def register_to_bootstrap(self):
        """Prefill: registers this rank's layout and fabric address with the
        instance's bootstrap server."""
        self._need_rank("register_to_bootstrap")
        _bootstrap.register(self.bootstrap_addr, {
            "tp_rank": self.attn_tp_rank, "dp_rank": self.dp_rank,
            "tp_size": self.attn_tp_size, "dp_size": self.dp_size,
            "page_size": self.page_size, "address": self.rank.address},
            self.options["bootstrap_timeout_s"])

    # ---- rooms' results -------------------------------------------------------------

    def _collect(self):
        for r in self.rank.poll():
            with self._mu:
                self._results[r.room] = r
                while len(self._results) > _RESULTS_MAX:
                    self._results.popitem(last=False)

    def result(self, room):
        """The room's RoomResult once it finished, else None."""
        self._collect()
        with self._mu:
            return self._results.get(room)

    def state(self, room):
        """The room's KVPoll number; None for a room the rank does not know."""
        done = self.result(room)
        if done is not None:
            return KVPoll.Success if done.ok else KVPoll.Failed
        try:
            return int(self.rank.state(room))
        except _errors.KvstageError as e:
            if e.name == "KVS_ENOENT":
                return None
            raise

    def failed_result(self, room, wait_s=2.0):
        """The failed room's result, waiting at most wait_s for it: a room's
        state can read Failed a moment before its result (with the cause)
        is handed over."""
        until = time.monotonic() + wait_s
        while True:
            done = self.result(room)
            if done is not None or time.monotonic() >= until:
                return done
            time.sleep(0.002)

    def forget(self, room):
        with self._mu:
            self._results.pop(room, None)

    # ---- the aux payload ---------------------------------------------------------------

    def read_aux(self, aux_index):
        """Prefill: the metadata buffers' items at aux_index, concatenated."""
        return b"".join(ctypes.string_at(p + aux_index * n, n)
                        for p, n in zip(self.aux_ptrs, self.aux_item_lens))

    def write_aux(self, aux_index, blob):
        """Decode: blob, as read_aux made it, into the items at aux_index."""
        if len(blob) != sum(self.aux_item_lens):
            raise _errors.invalid("aux payload: %d bytes but this decode's metadata items "
                                  "are %d: give both sides the same metadata buffers"
                                  % (len(blob), sum(self.aux_item_lens)))
        at = 0
        for p, n in zip(self.aux_ptrs, self.aux_item_lens):
            ctypes.memmove(p + aux_index * n, blob[at:at + n], n)
            at += n

    def check_aux_index(self, aux_index):
        if aux_index is None:
            return
        if not isinstance(aux_index, int) or aux_index < 0 or any(
                (aux_index + 1) * n > total for n, total in zip(self.aux_item_lens,
                                                                self.aux_lens)):
            raise _errors.invalid("aux_index: %r is outside the metadata buffers (%s items)"
                                  % (aux_index, [t // n if n else 0 for n, t in
                                                 zip(self.aux_item_lens, self.aux_lens)]))

    # ---- decode: prefill instances ----------------------------------------------------

    def instance(self, bootstrap_addr):
        """Decode: the prefill instance served at bootstrap_addr, asked of its
        bootstrap server the first time (and again after it went
        offline: once, no waiting) and declared to the rank."""
        self._need_rank("instance")
        with self._mu:
            inst = self._instances.get(bootstrap_addr)
            if inst is not None and inst.offline is None:
                return inst
            was_offline = inst is not None
        wait_s = 0.2 if was_offline else self.options["bootstrap_timeout_s"]
        layout = _bootstrap.fetch_layout(bootstrap_addr, wait_s)
        with self._mu:
            inst = self._instances.get(bootstrap_addr)
            if inst is not None and inst.offline is None:
                return inst  # another thread asked at the same time
            inst = _Instance(int(layout["instance"]), bootstrap_addr, layout)
            declared = inst.id in self._declared
            self._declared.add(inst.id)
        if inst.page_size != self.page_size:
            raise _errors.invalid("prefill %s has page_size %d but this decode %d: give both "
                                  "--page-size the same" % (bootstrap_addr, inst.page_size,
                                                            self.page_size))
        if not declared:  # else: the same start of it, back after missed heartbeats
            self.rank.add_instance(inst.id, inst.addresses, tp_size=inst.tp_size,
                                   dp_size=inst.dp_size)
        with self._mu:
            self._instances[bootstrap_addr] = inst
        return inst

    def _heartbeat_loop(self):
        o = self.options
        while not self._stop.wait(o["heartbeat_s"]):
            with self._mu:
                live = [i for i in self._instances.values() if i.offline is None]
            for inst in live:
                if _bootstrap.healthy(inst.addr, o["heartbeat_s"]):
                    inst.misses = 0
                    continue
                inst.misses += 1
                if inst.misses >= o["heartbeat_misses"]:
                    self.mark_offline(inst, "its bootstrap server %s missed %d heartbeats "
                                      "(every %.1f s)" % (inst.addr, inst.misses,
                                                          o["heartbeat_s"]))

    def mark_offline(self, inst, why):
        """Decode: the prefill instance is gone: its rooms fail now."""
        with self._mu:
            if inst.offline is not None:
                return
            inst.offline = why
        for dp in range(inst.dp_size):
            try:
                self.rank.instance_lost(inst.id, dp)
            except _errors.KvstageError:
                pass  # the rank had already dropped it

    def close(self):
        """Stops the heartbeat and closes the rank (lingering for the peers'
        acknowledgements, see kvstage.Rank.close)."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self.rank is not None:
            self.rank.close()
            self.rank = None


def _why(result):
    return "%s%s" % (result.status_name, ": " + result.reason if result.reason else "")


def _no_state(state_indices, what):
    """None when state_indices asks for no state buffer (None, [] or only
    None entries: a model without mamba/SWA/DSA state), else why not."""
    if state_indices is None or all(i is None for i in state_indices):
        return None
    return ("%s: state_indices %r: this backend moves KV pages only, no state buffers "
            "(mamba, SWA, DSA); serve this model with another transfer backend"
            % (what, [type(i).__name__ if i is not None else None for i in state_indices]))


class KVSender(BaseKVSender):
    """Prefill: one request's KV to its decode. init(num_kv_indices,
    aux_index), then send(kv_indices) per chunk of the chunked prefill;
    poll() -> KVPoll; get_transfer_metric() once it ended."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0,
                 *args, **kwargs):
        mgr._need_rank("KVSender")
        self.mgr = mgr
        self.bootstrap_room = bootstrap_room
        self.room = int(bootstrap_room)
        self.num_kv_indices = None
        self.aux_index = None
        self.pages = []
        self.opened = False
        self.error = None

    def init(self, num_kv_indices, aux_index=None):
        if not isinstance(num_kv_indices, int) or num_kv_indices < 1:
            raise _errors.invalid("num_kv_indices: %r: give the request's page count (>= 1)"
                                  % (num_kv_indices,))
        self.mgr.check_aux_index(aux_index)
        self.num_kv_indices, self.aux_index = num_kv_indices, aux_index

    def send(self, kv_indices, state_indices=None, token_position_offset=0):
        """One chunk's pages; the room goes out with the last of them. A
        request that asks for state buffers, or for a token position offset,
        fails (poll() says Failed, failure_exception() why)."""
        if self.num_kv_indices is None:
            raise _errors.invalid("send: call init(num_kv_indices, aux_index) first")
        if self.error is not None or self.opened:
            return
        self.error = _no_state(state_indices, "send")
        if self.error is None and token_position_offset:
            self.error = ("send: token_position_offset %r: this backend sends a request's "
                          "pages from its first token (offset 0)" % (token_position_offset,))
        if self.error is not None:
            return
        chunk = [int(i) for i in (kv_indices.tolist() if hasattr(kv_indices, "tolist")
                                  else kv_indices)]
        if len(self.pages) + len(chunk) > self.num_kv_indices:
            raise _errors.invalid("send: %d pages sent but init said num_kv_indices=%d"
                                  % (len(self.pages) + len(chunk), self.num_kv_indices))
        self.pages += chunk
        if len(self.pages) < self.num_kv_indices:
            return
        rank, total = self.mgr.rank, len(self.pages) * self.mgr.page_size
        self.opened = True
        try:
            aux = self.mgr.read_aux(self.aux_index) if self.aux_index is not None else None
            rank.open_room(self.room, self.pages, total_tokens=total, aux=aux)
            rank.computed(self.room, total, final=True)
        except _errors.KvstageError as e:
            # Its failed result comes through poll() too when the rank had it.
            self.error = str(e)

    def poll(self):
        if self.error is not None and self.mgr.result(self.room) is None:
            return KVPoll.Failed
        if not self.opened:
            # kvstage has no per-request handshake to wait for: the decode's
            # room meets this one whenever it arrives.
            return KVPoll.WaitingForInput
        s = self.mgr.state(self.room)
        # None: the room just ended and its result is on its way (a room that
        # was opened always ends with one).
        return KVPoll.Transferring if s is None else s

    def failure_exception(self):
        done = self.mgr.failed_result(self.room) if self.opened else None
        raise KVTransferError(self.room, _why(done) if done is not None and not done.ok
                              else self.error or "not failed (poll() is %d)" % self.poll())

    def get_transfer_metric(self):
        """The ended room's figures: latency from open to done on the
        fabric's clock, and the KV bytes this rank wrote; None until it
        ended (or for a room that never opened)."""
        done = self.mgr.result(self.room) if self.opened else None
        if done is None:
            return KVTransferMetric()
        return KVTransferMetric(
            transfer_latency_s=max(0, done.done_ns - done.open_ns) / 1e9,
            transfer_total_bytes=done.bytes)

    def abort(self):
        if self.opened:
            try:
                self.mgr.rank.abort(self.room)
            except _errors.KvstageError:
                pass  # already ended
        elif self.error is None:
            self.error = "aborted by the prefill before its KV was sent"

    def clear(self):
        self.mgr.forget(self.room)


class KVReceiver(BaseKVReceiver):
    """Decode: one request's KV from the prefill instance at
    bootstrap_addr ("host:port" of its bootstrap server). Once its pages
    are allocated: init(kv_indices, aux_index), or (newer sglang)
    init(prefill_dp_rank) then send_metadata(kv_indices, aux_index,
    state_indices, decode_prefix_len); poll() -> KVPoll; on Success the KV
    is in the pages and the metadata at aux_index."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None, *args, **kwargs):
        mgr._need_rank("KVReceiver")
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = int(bootstrap_room)
        self.aux_index = None
        self.opened = False
        self.aux_done = False
        self.error = None
        self.dp_rank = None  # init(prefill_dp_rank); else bootstrap_room % dp_size
        self.inst = None
        try:
            self.inst = mgr.instance(bootstrap_addr)
        except _errors.KvstageError as e:
            self.error = e.message

    def init(self, *args, **kwargs):
        """sglang's two receiver interfaces: init(kv_indices, aux_index), the
        pages and the metadata slot at once; or, in newer sglang,
        init(prefill_dp_rank) and then send_metadata(...)."""
        if "prefill_dp_rank" in kwargs or (len(args) == 1 and not kwargs and
                                           isinstance(args[0], numbers.Integral)):
            dp = kwargs["prefill_dp_rank"] if "prefill_dp_rank" in kwargs else args[0]
            return self._choose_dp(dp)
        return self._open(*args, **kwargs)

    def _choose_dp(self, dp):
        if not isinstance(dp, numbers.Integral) or dp < 0:
            raise _errors.invalid("init: prefill_dp_rank %r: give the prefill's attention DP "
                                  "rank (>= 0)" % (dp,))
        if self.error is None and dp >= self.inst.dp_size:
            self.error = ("init: prefill_dp_rank %d, but the prefill at %s has %d attention "
                          "DP group(s)" % (dp, self.bootstrap_addr, self.inst.dp_size))
        self.dp_rank = int(dp)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None,
                      decode_prefix_len=None):
        """Newer sglang: after init(prefill_dp_rank), the pages of the
        request's uncached suffix, its metadata slot, and how many tokens
        the decode already holds (its prefix-cache hit: kvstage moves only
        the tokens after it)."""
        if self.dp_rank is None:
            raise _errors.invalid("send_metadata: call init(prefill_dp_rank) first")
        if self.error is None:
            self.error = _no_state(state_indices, "send_metadata")
        self._open(kv_indices, aux_index, base_tokens=decode_prefix_len or 0)

    def _open(self, kv_indices, aux_index=None, base_tokens=0):
        if self.error is not None:
            return
        self.mgr.check_aux_index(aux_index)
        pages = kv_indices.tolist() if hasattr(kv_indices, "tolist") else list(kv_indices)
        self.aux_index = aux_index
        self.opened = True
        dp = self.dp_rank if self.dp_rank is not None else self.room % self.inst.dp_size
        try:
            self.mgr.rank.open_room(self.room, pages, base_tokens=int(base_tokens),
                                    total_tokens=int(base_tokens) + len(pages) *
                                    self.mgr.page_size, peer=self.inst.id, dp_rank=dp)
        except _errors.KvstageError as e:
            self.error = str(e)

    def poll(self):
        done = self.mgr.result(self.room) if self.opened else None
        if done is not None:
            if done.ok and not self.aux_done:
                if self.aux_index is not None:
                    self.mgr.write_aux(self.aux_index, done.aux)
                self.aux_done = True
            return KVPoll.Success if done.ok else KVPoll.Failed
        if self.error is not None:
            return KVPoll.Failed
        if self.inst.offline is not None:
            self.error = "prefill instance offline: " + self.inst.offline
            return KVPoll.Failed
        if not self.opened:
            return KVPoll.WaitingForInput
        s = self.mgr.state(self.room)
        # Success is reported once the result (and its aux) is here; None: the
        # room just ended and its result is on its way.
        return KVPoll.Transferring if s is None or s == KVPoll.Success else s

    def failure_exception(self):
        done = self.mgr.failed_result(self.room) if self.opened else None
        raise KVTransferError(self.room, _why(done) if done is not None and not done.ok
                              else self.error or "not failed (poll() is %d)" % self.poll())

    def abort(self):
        """Cancels the request: its prefill ranks are told (their senders
        report Failed, KVS_ECANCELED)."""
        if self.opened and self.error is None:
            try:
                self.mgr.rank.abort(self.room)
            except _errors.KvstageError:
                pass  # already ended
        elif self.error is None:
            self.error = "aborted before init"

    def clear(self):
        self.mgr.forget(self.room)
