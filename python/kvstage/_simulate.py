"""_simulate.py - simulate(): one deterministic simulated scenario through
kvs_sim_run (include/kvstage/sim.h), its report as a dict."""

import ctypes

from . import _convert, _errors, _library, _models
from . import _structs as S

# kvs_sim_config_t fields the caller may set as keyword arguments; dtype,
# path, faults and trace_path are handled apart.
_SETTABLE = tuple(name for name, _ in S.SimConfig._fields_
                  if name not in ("version", "size_bytes", "reserved0", "reserved1",
                                  "reserved2", "dtype", "path", "faults", "nfaults",
                                  "trace_path"))


def simulate(model=None, *, dtype=None, path=None, faults=(), trace_path=None,
             **fields):
    """Runs one simulated disaggregated-serving scenario and returns its
    report as a dict.

    model: a built-in model name (see models()) filling total_heads,
    head_dim, layers and dtype; explicit arguments override it. Every other
    keyword is a field of kvs_sim_config_t (include/kvstage/sim.h), e.g.
    page_size, prefill_tp, decode_tp (required), chunk_tokens, requests,
    prompt_min_tokens, prompt_max_tokens, rate_milli_per_s, ring_bytes,
    seed, stall_timeout_ns, net_link_bytes_per_s, net_sq_depth (work
    requests per connection's send queue: a post beyond them is refused and
    posted again, counted in posts_refused); 0 or absent takes the
    simulator's default. path: "auto", "staging", "direct" or "slice".
    faults: strings as `kvstage sim --fault`, e.g. ["drop:any:0.01"].
    trace_path: write a Chrome trace-event JSON there.

    The dict has the report's fields (requests_total, requests_ok,
    requests_failed, hung_requests, bytes_moved, bytes_verified,
    corrupt_bytes, ring_leaked_bytes, violations, rdma_ops, sim_ns,
    goodput_gbps, latency_p50_us, digest, ...) and path, the name of the
    path the handlers ran. Requests that fail under injected faults are
    counted there; KvstageError is raised only when the run cannot happen
    (a bad field, named in the message, or no memory for the cluster).
    """
    unknown = sorted(set(fields) - set(_SETTABLE))
    if unknown:
        raise TypeError("simulate() got unknown argument(s) %s; the fields are: "
                        "model, dtype, path, faults, trace_path, %s"
                        % (", ".join(unknown), ", ".join(_SETTABLE)))
    fields["dtype"] = dtype
    _, fields = _models.shape(model, fields)

    cfg = S.SimConfig()
    cfg.version = S.SIM_CONFIG_VERSION
    cfg.size_bytes = ctypes.sizeof(cfg)
    for key in _SETTABLE:
        value = fields.get(key)
        if value is not None:
            _convert.set_int(cfg, key, value)
    cfg.dtype = _convert.dtype(fields.get("dtype") or "bf16")
    cfg.path = _convert.path(path or "auto")

    if isinstance(faults, (str, bytes)):
        faults = [faults]
    faults = list(faults)
    if len(faults) > S.SIM_MAX_FAULTS:
        raise _errors.invalid("faults has %d entries: give at most %d"
                              % (len(faults), S.SIM_MAX_FAULTS))
    for i, f in enumerate(faults):
        if not isinstance(f, str):
            raise _errors.invalid("faults[%d] is %r: give a string such as "
                                  "'drop:any:0.01'" % (i, f))
    specs = (ctypes.c_char_p * max(1, len(faults)))(*[f.encode() for f in faults])
    cfg.faults = ctypes.cast(specs, ctypes.POINTER(ctypes.c_char_p))
    cfg.nfaults = len(faults)
    trace = None
    if trace_path is not None:
        trace = str(trace_path).encode()
        cfg.trace_path = trace

    report = S.SimReport()
    report.size_bytes = ctypes.sizeof(report)
    err = S.Error()
    rc = _library.load().kvs_sim_run(ctypes.byref(cfg), ctypes.byref(report),
                                     ctypes.byref(err))
    if rc != 0:
        _errors.raise_for(rc, err)
    out = {}
    for name, _ in S.SimReport._fields_:
        if name not in ("version", "size_bytes", "reserved"):
            out[name] = getattr(report, name)
    out["init_error"] = report.init_error.decode(errors="replace")
    out["path"] = _convert.path_name(report.path)
    return out
