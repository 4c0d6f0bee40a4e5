"""kvstage.sglang - kvstage as sglang's disaggregation transfer backend.

    KVManager, KVSender, KVReceiver, KVBootstrapServer   the four classes
                                  sglang's scheduler makes per backend
    KVStageBackend                the provider sglang's dynamic backend
                                  loader asks for them (get_kv_class)
    KVPoll, KVArgs                sglang's when sglang is importable, else
                                  stand-ins of the same shape

docs/embedding.md ("sglang") says how an operator selects it and which
sglang call order the test harness (python/tests/test_sglang_adapter.py)
follows; conn.py says how a request maps onto kvstage rooms."""

from ._base import HAVE_SGLANG, KVArgs, KVPoll
from .bootstrap import KVBootstrapServer
from .conn import KVManager, KVReceiver, KVSender, KVTransferError, options


class KVStageBackend:
    """sglang's dynamic transfer-backend provider: get_kv_class(class_type)
    with class_type a KVClassType (or its value: "kvargs", "manager",
    "sender", "receiver", "bootstrap_server")."""

    _CLASSES = {"kvargs": KVArgs, "manager": KVManager, "sender": KVSender,
                "receiver": KVReceiver, "bootstrap_server": KVBootstrapServer}

    def get_kv_class(self, class_type):
        return self._CLASSES.get(str(getattr(class_type, "value", class_type)).lower())


__all__ = ["HAVE_SGLANG", "KVArgs", "KVBootstrapServer", "KVManager", "KVPoll", "KVReceiver",
           "KVSender", "KVStageBackend", "KVTransferError", "options"]
