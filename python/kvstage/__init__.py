"""kvstage - Python binding of the kvstage C library (ctypes, standard
library only).

    import kvstage
    kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=16)
    kvstage.simulate(model="llama-3.1-8b", layers=4, prefill_tp=4, decode_tp=2,
                     page_size=16, chunk_tokens=512, requests=6,
                     faults=["dup:any:0.1"])

plan() lays out one chunk (the layout planner); simulate() runs one
deterministic simulated scenario (the engine behind `kvstage sim`); both
return plain dicts. Rank is one rank of a serving engine over its own KV
buffers (torch tensors or numpy arrays) on real hardware: the host or CUDA
device, and the verbs fabric or the libfabric one (fabric="ofi", with the
provider ofi_providers() lists; see kvstage._rank and docs/embedding.md).
A failure raises KvstageError with the library's status code, its name and
a message naming the argument to change.

The library (libkvstage_sim.so, which brings libkvstage.so) is loaded on
first use from $KVSTAGE_LIBRARY (the .so or its folder) if set, else from
next to this package (its folder, then the install tree's library folder),
else from the system's library path. library_path() says which.
"""

from ._errors import KvstageError, status_name, strerror
from ._fabric import ofi_providers
from ._library import path as library_path
from ._models import models
from ._plan import plan
from ._rank import Rank, RoomResult, RoomState, metrics_text
from .discovery import Discovery
from ._simulate import simulate

__all__ = ["Discovery", "KvstageError", "Rank", "RoomResult", "RoomState", "library_path",
           "metrics_text", "models", "ofi_providers", "plan", "simulate", "status_name",
           "strerror"]
