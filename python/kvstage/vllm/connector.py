"""connector.py - kvstage as a vLLM (v1) KV connector: KVStageConnector,
one class for both of vLLM's roles (the scheduler's connector and each
worker's), as vLLM makes them.

How a request maps (docs/embedding.md, "vLLM"):
- kv_role "kv_producer" is the prefill instance, "kv_consumer" the decode;
- a request's kvstage room id is its prefill request id hashed to 63 bits;
  the prefill instance's id is its kv_transfer_config.engine_id hashed the
  same way; its worker of TP rank t listens on kv_ip:kv_port+t, so the
  prefill's scheduler knows every worker's address without asking them;
- prefill: the request runs as usual (max_tokens=1); request_finished
  keeps its blocks (delay_free) and returns kv_transfer_params for the
  decode (do_remote_prefill, the room, the instance, its addresses and TP
  size, the prompt's token count); the next step's metadata tells each
  worker to open the room on those blocks and mark it computed, and
  get_finished reports it as sent once its result came (ok or failed:
  either way vLLM may free the blocks);
- decode: get_num_new_matched_tokens claims the prompt's tokens beyond the
  local prefix cache, to be loaded asynchronously; update_state_after_alloc
  takes the blocks; the next step's metadata makes the worker declare the
  prefill instance (first time only) and open the room on the blocks after
  the locally cached prefix; get_finished reports it as received when its
  result came; a failed one also lists its blocks in
  get_block_ids_with_load_errors (vLLM recomputes them);
- an aborted decode request whose load is in flight keeps its blocks
  (request_finished returns delay_free) until its room has ended, and is
  then reported as finished sending, which is when vLLM frees them;
- kvstage moves a request whole from the pool once it is computed, not
  layer by layer: wait_for_layer_load, save_kv_layer and wait_for_save
  have nothing to wait for.

Heterogeneous TP is kvstage's (a decode rank takes its heads from every
prefill rank holding them). What it does not do: kv_role "kv_both"; more
than one decode instance per prefill (a prefill room is paired with
decode instance 0); PP; MLA caches; the hybrid allocator (HMA).

Options: kv_connector_extra_config {"fabric": "verbs"|"ofi", "provider",
"ring_bytes", "chunk_tokens", "max_rooms", "stall_timeout_s"}; the fabric binds to
kv_ip."""

import hashlib
import logging
import threading

from .. import _errors
from .._rank import Rank
from ._base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole

_log = logging.getLogger("kvstage.vllm")

_EXTRA = {"fabric": str, "provider": str, "ring_bytes": int, "chunk_tokens": int,
          "max_rooms": int, "stall_timeout_s": (int, float)}
# Refusals of open_room after which the rank still delivers the room's
# failed result through poll() (a decode whose prefill writer is lost, a
# prefix not on both sides' pages); after any other the rank holds
# nothing, and the connector reports the request itself.
_RESULT_FOLLOWS = ("KVS_EPEER", "KVS_EPREFIX_ALIGN")


def id63(text):
    """A 63-bit id from a string (a request id, an engine id): the same on
    every process that hashes the same string."""
    return int.from_bytes(hashlib.sha256(str(text).encode()).digest()[:8], "little") >> 1


def _role_of(kv_transfer_config):
    role = getattr(kv_transfer_config, "kv_role", None)
    if role == "kv_producer":
        return "prefill"
    if role == "kv_consumer":
        return "decode"
    raise _errors.invalid("kv_role: %r: the kvstage connector takes \"kv_producer\" (prefill) "
                          "or \"kv_consumer\" (decode)" % (role,))


def _extra(kv_transfer_config):
    extra = dict(getattr(kv_transfer_config, "kv_connector_extra_config", None) or {})
    for key, value in extra.items():
        if key not in _EXTRA:
            raise _errors.invalid("kv_connector_extra_config: %r is not a kvstage option "
                                  "(known: %s)" % (key, ", ".join(sorted(_EXTRA))))
        if not isinstance(value, _EXTRA[key]) or isinstance(value, bool):
            raise _errors.invalid("kv_connector_extra_config[%r]: %r: give %s" % (
                key, value, "a name" if _EXTRA[key] is str else "a number"))
    return extra


def _status_name(request):
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


class KVStageConnectorMetadata(KVConnectorMetadata):
    """One step's work for the workers: rooms to send (prefill), to receive
    (decode) and to abort, each {req_id: what}."""

    def __init__(self):
        self.reqs_to_send = {}     # req_id -> (room, block_ids, total_tokens)
        self.reqs_to_recv = {}     # req_id -> (room, block_ids, base_tokens, params)
        self.reqs_to_abort = {}    # req_id -> room


class KVStageConnector(KVConnectorBase_V1):
    """kvstage's vLLM connector; vLLM makes it with (vllm_config, role
    [, kv_cache_config]) once in the scheduler and once per worker."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.side = _role_of(ktc)
        self.extra = _extra(ktc)
        par = vllm_config.parallel_config
        self.tp_size = int(getattr(par, "tensor_parallel_size", 1) or 1)
        self.tp_rank = int(getattr(par, "rank", 0) or 0) % self.tp_size
        self.block_size = int(vllm_config.cache_config.block_size)
        self.kv_ip = getattr(ktc, "kv_ip", None) or "127.0.0.1"
        self.kv_port = int(getattr(ktc, "kv_port", 0) or 0)
        if self.side == "prefill" and not 0 < self.kv_port <= 65535 - self.tp_size:
            raise _errors.invalid("kv_port: %r: a prefill's worker t listens on kv_port + t: "
                                  "give a port with %d free after it" % (self.kv_port,
                                                                         self.tp_size))
        self.engine_id = str(getattr(ktc, "engine_id", None) or "")
        if self.side == "prefill" and not self.engine_id:
            raise _errors.invalid("engine_id: empty: give the prefill instance an id "
                                  "(kv_transfer_config.engine_id)")
        self.instance_id = id63(self.engine_id)
        # Scheduler side.
        self._meta = KVStageConnectorMetadata()
        self._loading = {}        # decode: req_id -> room, from alloc to get_finished
        # Worker side.
        self.rank = None
        self._mu = threading.Lock()
        self._rooms = {}          # room -> (req_id, block_ids, aborted)
        self._declared = set()    # decode: instance ids given to the rank
        self._sent, self._recvd = set(), set()
        self._load_errors = set()

    # ================= worker side =================================================

    def register_kv_caches(self, kv_caches):
        """The worker's KV caches, {layer name: [2, num_blocks, block_size,
        heads, head_dim]}: makes this worker's kvstage.Rank and starts it."""
        if self.rank is not None:
            raise _errors.invalid("register_kv_caches: called twice on one worker")
        e = self.extra
        rank = Rank(self.side, page_size=self.block_size, kv_caches=kv_caches,
                    tp_rank=self.tp_rank, tp_size=self.tp_size,
                    instance_id=self.instance_id if self.side == "prefill" else 0,
                    fabric=e.get("fabric", "verbs"), provider=e.get("provider"),
                    bind_addr=self.kv_ip,
                    listen_port=self.kv_port + self.tp_rank if self.side == "prefill" else 0,
                    ring_bytes=e.get("ring_bytes", 0), chunk_tokens=e.get("chunk_tokens", 0),
                    max_rooms=e.get("max_rooms", 0), stall_timeout_s=e.get("stall_timeout_s", 0))
        try:
            rank.start()
        except BaseException:
            rank.close(linger_s=0)
            raise
        self.rank = rank

    def _need_rank(self, what):
        if self.rank is None:
            raise _errors.invalid("%s: no KV caches yet: vLLM calls register_kv_caches "
                                  "first on a worker; on the scheduler's connector this "
                                  "is not a call to make" % what)

    def start_load_kv(self, forward_context, **kwargs):
        """Starts this step's rooms: the prefill's finished requests are
        sent, the decode's allocated ones received, the aborted ones
        aborted. Returns at once; get_finished reports them."""
        self._need_rank("start_load_kv")
        meta = self._get_connector_metadata()
        for req_id, (room, blocks, total) in meta.reqs_to_send.items():
            self._open(req_id, room, blocks, total_tokens=total)
        for req_id, (room, blocks, base, params) in meta.reqs_to_recv.items():
            inst = int(params["kvstage_instance"])
            if inst not in self._declared:
                self.rank.add_instance(inst, params["kvstage_addresses"],
                                       tp_size=int(params["kvstage_tp_size"]))
                self._declared.add(inst)
            self._open(req_id, room, blocks[base // self.block_size:], peer=inst,
                       base_tokens=base, total_tokens=int(params["kvstage_tokens"]))
        for req_id, room in meta.reqs_to_abort.items():
            with self._mu:
                known = room in self._rooms
                if known:
                    r = self._rooms[room]
                    self._rooms[room] = (r[0], r[1], True)
            if known:
                try:
                    self.rank.abort(room)
                except _errors.KvstageError:
                    pass  # it ended meanwhile: get_finished reports it

    def _open(self, req_id, room, blocks, **kw):
        with self._mu:
            self._rooms[room] = (req_id, list(blocks), False)
        try:
            self.rank.open_room(room, blocks, **kw)
            if self.side == "prefill":
                self.rank.computed(room, kw["total_tokens"], final=True)
        except _errors.KvstageError as e:
            if e.name == "KVS_EINVAL":
                raise  # the caller's mistake, not the peer's
            if self.side == "decode" and e.name in _RESULT_FOLLOWS:
                return  # its failed result comes through poll(): reported then
            # Refused with nothing open on the rank (its room table full, ...):
            # no result will come, so it is reported failed now, never held.
            _log.warning("kvstage connector: request %s: %s", req_id, e)
            if self.side == "prefill":
                try:  # opened, then computed() refused: nothing may read the blocks now
                    self.rank.abort(room)
                except _errors.KvstageError:
                    pass  # never opened (the usual case): nothing to release
            with self._mu:
                self._rooms.pop(room, None)
                if self.side == "prefill":
                    self._sent.add(req_id)
                else:
                    self._recvd.add(req_id)
                    self._load_errors.update(blocks)

    def wait_for_layer_load(self, layer_name):
        """Nothing to wait for: a request is scheduled only once
        get_finished said its whole KV is in."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing to save per layer: the request's KV is sent from the pool
        once the request finished (request_finished)."""

    def wait_for_save(self):
        """Nothing to wait for (see save_kv_layer)."""

    def get_finished(self, finished_req_ids):
        """(ids whose blocks vLLM may free: sent, or aborted and ended; ids
        whose KV is in: received, or failed with its blocks in
        get_block_ids_with_load_errors), each None when empty."""
        self._need_rank("get_finished")
        for res in self.rank.poll():
            with self._mu:
                entry = self._rooms.pop(res.room, None)
            if entry is None:
                continue
            req_id, blocks, aborted = entry
            if self.side == "prefill" or aborted:
                self._sent.add(req_id)
            else:
                self._recvd.add(req_id)
                if not res.ok:
                    self._load_errors.update(blocks)
        sent, self._sent = self._sent, set()
        recvd, self._recvd = self._recvd, set()
        return sent or None, recvd or None

    def get_block_ids_with_load_errors(self):
        out, self._load_errors = self._load_errors, set()
        return out

    def shutdown(self):
        if self.rank is not None:
            self.rank.close()
            self.rank = None

    # ================= scheduler side ==============================================

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Decode: the prompt's tokens past the local prefix cache come from
        the prefill, asynchronously; (0, False) for anything else."""
        params = getattr(request, "kv_transfer_params", None) or {}
        if self.side == "decode" and params.get("do_remote_prefill"):
            n = len(request.prompt_token_ids) - num_computed_tokens
            return (n, True) if n > 0 else (0, False)
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = getattr(request, "kv_transfer_params", None) or {}
        if self.side != "decode" or not params.get("do_remote_prefill") or \
                num_external_tokens <= 0:
            return
        missing = [k for k in ("kvstage_room", "kvstage_instance", "kvstage_addresses",
                               "kvstage_tp_size", "kvstage_tokens") if k not in params]
        if missing:
            raise _errors.invalid("request %s: kv_transfer_params lack %s: pass the prefill's "
                                  "kv_transfer_params to the decode unchanged"
                                  % (request.request_id, ", ".join(missing)))
        base = len(request.prompt_token_ids) - num_external_tokens
        if base % self.block_size:
            raise _errors.invalid("request %s: the local prefix (%d tokens) is not whole "
                                  "blocks of %d" % (request.request_id, base, self.block_size))
        room = int(params["kvstage_room"])
        block_ids = list(blocks.get_block_ids()[0])
        self._meta.reqs_to_recv[request.request_id] = (room, block_ids, base, dict(params))
        self._loading[request.request_id] = room
        params["do_remote_prefill"] = False  # once: the second call after the load is not a load

    def build_connector_meta(self, scheduler_output):
        meta, self._meta = self._meta, KVStageConnectorMetadata()
        return meta

    def update_connector_output(self, connector_output):
        for req_id in (getattr(connector_output, "finished_recving", None) or ()):
            self._loading.pop(req_id, None)
        for req_id in (getattr(connector_output, "finished_sending", None) or ()):
            self._loading.pop(req_id, None)

    def request_finished(self, request, block_ids):
        """Prefill: a request run for a decode (do_remote_decode) that ended
        at its length cap keeps its blocks until sent and returns the
        decode's kv_transfer_params. Decode: an aborted request whose load
        is in flight keeps its blocks until its room ended."""
        params = getattr(request, "kv_transfer_params", None) or {}
        if self.side == "decode":
            room = self._loading.pop(request.request_id, None)
            if room is None:
                return False, None
            if self._meta.reqs_to_recv.pop(request.request_id, None) is not None:
                return False, None  # no worker opened it yet: nothing can land
            self._meta.reqs_to_abort[request.request_id] = room
            return True, None
        if not params.get("do_remote_decode") or \
                _status_name(request) != "FINISHED_LENGTH_CAPPED":
            return False, None
        room = id63(request.request_id)
        tokens = len(request.prompt_token_ids)
        blocks = list(block_ids[: -(-tokens // self.block_size)])
        self._meta.reqs_to_send[request.request_id] = (room, blocks, tokens)
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False,
            "kvstage_room": room, "kvstage_instance": self.instance_id,
            "kvstage_addresses": ["%s:%d" % (self.kv_ip, self.kv_port + t)
                                  for t in range(self.tp_size)],
            "kvstage_tp_size": self.tp_size, "kvstage_tokens": tokens}
