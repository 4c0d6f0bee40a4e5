"""_base.py - vLLM's KV connector base (KVConnectorBase_V1, its role enum
and metadata base) when vLLM is importable, else minimal local stand-ins
of the same shape, so the connector runs and is tested where vLLM is not
installed. The stand-ins add nothing vLLM's do not have."""

import abc
import enum

try:  # pragma: no cover - vLLM is not installed where kvstage is tested
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorMetadata,
                                                                   KVConnectorRole)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata(abc.ABC):  # noqa: B024 - a marker, as vLLM's
        pass

    class KVConnectorBase_V1(abc.ABC):
        """vLLM's base as the connector uses it: the config and role kept,
        the metadata bound and cleared by the model runner each step."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches):
            return

        @abc.abstractmethod
        def start_load_kv(self, forward_context, **kwargs): ...

        @abc.abstractmethod
        def wait_for_layer_load(self, layer_name): ...

        @abc.abstractmethod
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...

        @abc.abstractmethod
        def wait_for_save(self): ...

        def get_finished(self, finished_req_ids):
            return None, None

        def get_block_ids_with_load_errors(self):
            return set()

        def shutdown(self):
            return None

        @abc.abstractmethod
        def get_num_new_matched_tokens(self, request, num_computed_tokens): ...

        @abc.abstractmethod
        def update_state_after_alloc(self, request, blocks, num_external_tokens): ...

        @abc.abstractmethod
        def build_connector_meta(self, scheduler_output): ...

        def request_finished(self, request, block_ids):
            return False, None
