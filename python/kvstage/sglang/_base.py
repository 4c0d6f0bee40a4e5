"""_base.py - sglang's disaggregation base classes when sglang is
importable, else local stand-ins of the same shape (the abstract methods
kvstage's backend implements, KVPoll's numbers, KVArgs' fields), so the
backend runs and is tested where sglang is not installed.

The stand-ins follow sglang's python/sglang/srt/disaggregation/base/conn.py
as of its commit 0094505 (the receiver's init(prefill_dp_rank) then
send_metadata(kv_indices, aux_index, state_indices, decode_prefix_len); the
sender's send(kv_indices, state_indices, token_position_offset) and
get_transfer_metric() -> KVTransferMetric); they add nothing sglang's do
not have. kvstage's classes take the older receiver call too
(init(kv_indices, aux_index)), so both sglang generations drive them."""

import abc
import dataclasses

try:  # pragma: no cover - sglang is not installed where kvstage is tested
    from sglang.srt.disaggregation.base.conn import (BaseKVBootstrapServer, BaseKVManager,
                                                     BaseKVReceiver, BaseKVSender, KVArgs,
                                                     KVPoll)
    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

    class KVArgs:
        """What the scheduler tells a KV manager: engine_rank (the TP rank),
        kv_data_ptrs / kv_data_lens / kv_item_lens (K layers then V layers),
        aux_data_ptrs / aux_data_lens / aux_item_lens (the metadata
        buffers, one item per request slot), ib_device, gpu_id."""
        engine_rank = 0
        kv_data_ptrs = kv_data_lens = kv_item_lens = ()
        aux_data_ptrs = aux_data_lens = aux_item_lens = ()
        ib_device = None
        gpu_id = 0

    class KVPoll:
        Failed = 0
        Bootstrapping = 1
        WaitingForInput = 2
        Transferring = 3
        Success = 4

    class BaseKVManager(abc.ABC):
        @abc.abstractmethod
        def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False): ...

    class BaseKVSender(abc.ABC):
        @abc.abstractmethod
        def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank,
                     req_has_disagg_prefill_dp_rank=False): ...

        @abc.abstractmethod
        def init(self, num_kv_indices, aux_index=None): ...

        @abc.abstractmethod
        def send(self, kv_indices, state_indices=None, token_position_offset=0): ...

        def pop_decode_prefix_len(self):
            return 0

        @abc.abstractmethod
        def get_transfer_metric(self): ...

        @abc.abstractmethod
        def poll(self): ...

        @abc.abstractmethod
        def failure_exception(self): ...

    class BaseKVReceiver(abc.ABC):
        @abc.abstractmethod
        def __init__(self, mgr, bootstrap_addr, bootstrap_room=None): ...

        @abc.abstractmethod
        def init(self, prefill_dp_rank): ...

        @abc.abstractmethod
        def send_metadata(self, kv_indices, aux_index=None, state_indices=None,
                          decode_prefix_len=None): ...

        @abc.abstractmethod
        def poll(self): ...

        @abc.abstractmethod
        def failure_exception(self): ...

    class BaseKVBootstrapServer(abc.ABC):
        @abc.abstractmethod
        def __init__(self, host, port): ...


try:  # pragma: no cover - sglang is not installed where kvstage is tested
    from sglang.srt.disaggregation.base.conn import KVTransferMetric
except ImportError:  # older sglang, or none
    @dataclasses.dataclass
    class KVTransferMetric:
        """A sender's transfer figures (None: not known)."""
        transfer_latency_s: float = None
        alloc_latency_s: float = None
        transfer_total_bytes: int = None
