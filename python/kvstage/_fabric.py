"""_fabric.py - the fabrics a kvstage.Rank can run on, by name, all in
libkvstage_hw where it was built with them:

  "verbs"  libibverbs + rdma_cm (<kvstage/verbs.h>): an RDMA NIC, chosen
           by rdma_device or near_pci
  "ofi"    libfabric (<kvstage/ofi.h>): one provider by name, "tcp" (any
           machine), "shm" (processes on one host), ...

check() refuses, before anything is made, a fabric this build lacks and
the arguments of the other fabric, and check_memory() KV memory the
fabric cannot register (ofi: host memory only, no FI_HMEM); create()
makes the fabric, info() says what it chose and destroy() is the create's
matching kvs_*_fabric_destroy. ofi_providers() lists the providers the ofi
fabric can take here. Nothing here holds state: the Rank keeps the handle
and the name.
"""

import ctypes

from . import _errors
from . import _library
from . import _structs as S

# name: (the symbol a build with it exports, what to install when it lacks it)
_BUILT_WITH = {
    "verbs": ("kvs_verbs_fabric_create", "libibverbs-dev and librdmacm-dev"),
    "ofi": ("kvs_ofi_fabric_create", "libfabric-dev"),
}
NAMES = tuple(_BUILT_WITH)


def _need(hw, fabric):
    symbol, packages = _BUILT_WITH[fabric]
    if not hasattr(hw, symbol):
        others = [n for n in NAMES if n != fabric and hasattr(hw, _BUILT_WITH[n][0])]
        raise _errors.invalid("fabric=%r: this kvstage was built without the %s fabric "
                              "(install %s, rebuild)%s"
                              % (fabric, fabric, packages,
                                 "; or give fabric=%r" % others[0] if others else ""))


def check(hw, fabric, provider, rdma_device, near_pci, listen_port):
    """Refuses what the chosen fabric cannot take (KvstageError KVS_EINVAL
    naming the argument), before anything is made."""
    if not isinstance(fabric, str) or fabric not in _BUILT_WITH:
        raise _errors.invalid("fabric: %r is not a fabric: give %s"
                              % (fabric, " or ".join('"%s"' % n for n in NAMES)))
    _need(hw, fabric)
    if fabric == "ofi":
        for name, value in (("rdma_device", rdma_device), ("near_pci", near_pci)):
            if value is not None:
                raise _errors.invalid("%s: %r chooses the RDMA device of fabric=\"verbs\"; "
                                      "with fabric=\"ofi\" the provider chooses: drop %s, "
                                      "or give fabric=\"verbs\"" % (name, value, name))
        if provider is not None and (not isinstance(provider, str) or not provider):
            raise _errors.invalid("provider: %r: give a libfabric provider's name as "
                                  "fi_info -l lists it (\"tcp\", \"shm\"), or None for "
                                  "\"tcp\"" % (provider,))
    elif provider is not None:
        raise _errors.invalid("provider: %r names a libfabric provider: give it with "
                              "fabric=\"ofi\"" % (provider,))
    if not isinstance(listen_port, int) or isinstance(listen_port, bool) or \
            not 0 <= listen_port < 65536:
        raise _errors.invalid("listen_port: %r: give a port in [0, 65536) (0: any)"
                              % (listen_port,))


def check_memory(fabric, pool):
    """Refuses a KV pool the fabric cannot register, before anything is
    made: the ofi fabric takes host memory only (it would hand a CUDA
    address to libfabric as a host one)."""
    if fabric == "ofi" and pool.device[0] != "cpu":
        first = pool.buffers[0]
        raise _errors.invalid("%s: on %s but the ofi fabric registers host memory only: "
                              "give CPU tensors, or fabric=\"verbs\" for GPU memory"
                              % (first.name, first.where()))


def _text(s):
    return s.encode() if s is not None else None


def create(hw, fabric, provider, rdma_device, near_pci, bind_addr, listen_port):
    """The kvs_fabric_t * of a new fabric (check() passed); the caller
    destroys it with destroy(hw, fabric, handle). The config's strings are
    copied by the C side."""
    err = S.Error()
    out = ctypes.c_void_p()
    if fabric == "ofi":
        cfg = S.OfiConfig()
        hw.kvs_ofi_config_init(ctypes.byref(cfg))
        cfg.provider, cfg.bind_addr = _text(provider), _text(bind_addr)
        cfg.listen_port = listen_port
        rc = hw.kvs_ofi_fabric_create(ctypes.byref(cfg), ctypes.byref(out), ctypes.byref(err))
    else:
        cfg = S.VerbsConfig()
        hw.kvs_verbs_config_init(ctypes.byref(cfg))
        cfg.device, cfg.near_pci = _text(rdma_device), _text(near_pci)
        cfg.bind_addr = _text(bind_addr)
        cfg.listen_port = listen_port
        rc = hw.kvs_verbs_fabric_create(ctypes.byref(cfg), ctypes.byref(out),
                                        ctypes.byref(err))
    if rc != 0:
        _errors.raise_for(rc, err)
    return out


def info(hw, fabric, handle):
    """What the fabric chose: {"address": "IP:port" peers connect to,
    "provider": ofi: as libfabric names it ("tcp;ofi_rxm"), verbs: None,
    "rdma_device": verbs: the device, ofi: None}."""
    if fabric == "ofi":
        fi = S.OfiInfo()
        rc = hw.kvs_ofi_fabric_info(handle, ctypes.byref(fi))
        out = {"provider": fi.provider.decode(), "rdma_device": None}
    else:
        fi = S.VerbsInfo()
        rc = hw.kvs_verbs_fabric_info(handle, ctypes.byref(fi))
        out = {"provider": None, "rdma_device": fi.device.decode()}
    if rc != 0:
        _errors.raise_for(rc, None, "kvs_%s_fabric_info: %s" % (fabric, _errors.strerror(rc)))
    out["address"] = fi.address.decode()
    return out


def destroy(hw, fabric, handle):
    """The matching kvs_*_fabric_destroy (the rank on it is gone)."""
    if fabric == "ofi":
        return hw.kvs_ofi_fabric_destroy(handle)
    return hw.kvs_verbs_fabric_destroy(handle)


def ofi_providers():
    """The libfabric providers the ofi fabric can take here, by the names
    Rank(fabric="ofi", provider=...) takes: e.g. ["tcp", "shm", ...].
    KvstageError when this kvstage was built without the ofi fabric."""
    hw = _library.load_backend("hw")
    _need(hw, "ofi")
    buf = ctypes.create_string_buffer(4096)
    hw.kvs_ofi_providers(buf, len(buf))
    return [n for n in buf.value.decode().split(", ") if n]
