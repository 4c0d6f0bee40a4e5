"""kvstage.vllm - kvstage as a vLLM (v1) KV connector.

    KVStageConnector   the connector class vLLM loads from
                       --kv-transfer-config '{"kv_connector": "KVStageConnector",
                       "kv_connector_module_path": "kvstage.vllm", ...}'

docs/embedding.md ("vLLM") says how an operator configures it and which
vLLM call order the test harness (python/tests/test_vllm_adapter.py)
follows; connector.py says how a request maps onto kvstage rooms."""

from ._base import HAVE_VLLM, KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole
from .connector import KVStageConnector, KVStageConnectorMetadata, id63

__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole",
           "KVStageConnector", "KVStageConnectorMetadata", "id63"]
