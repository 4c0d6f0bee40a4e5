"""_base.py - sglang's disaggregation base classes when sglang is
importable, else local stand-ins of the same shape (the abstract methods
kvstage's backend implements, KVPoll's numbers, KVArgs' fields), so the
backend runs and is tested where sglang is not installed.

The stand-ins follow sglang's python/sglang/srt/disaggregation/base/conn.py
(the interface whose receiver takes init(kv_indices, aux_index)); they add
nothing sglang's do not have."""

import abc

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
        def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank): ...

        @abc.abstractmethod
        def init(self, num_kv_indices, aux_index=None): ...

        @abc.abstractmethod
        def send(self, kv_indices): ...

        @abc.abstractmethod
        def poll(self): ...

        @abc.abstractmethod
        def failure_exception(self): ...

    class BaseKVReceiver(abc.ABC):
        @abc.abstractmethod
        def __init__(self, mgr, bootstrap_addr, bootstrap_room=None): ...

        @abc.abstractmethod
        def init(self, kv_indices, aux_index=None): ...

        @abc.abstractmethod
        def poll(self): ...

        @abc.abstractmethod
        def failure_exception(self): ...

    class BaseKVBootstrapServer(abc.ABC):
        @abc.abstractmethod
        def __init__(self, host, port): ...
