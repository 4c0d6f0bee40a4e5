"""_simulate.py - simulate(): one deterministic simulated scenario through
kvs_sim_run (include/kvstage/sim.h), its report as a dict."""

import ctypes

from . import _convert, _errors, _library, _models
from . import _structs as S

# The parallelism of each side: a whole number, or a list of one per
# instance (a cluster, spec §12).
_SIZES = ("prefill_tp", "prefill_pp", "decode_tp", "decode_pp")
# kvs_sim_config_t fields the caller may set as keyword arguments; dtype,
# path, faults, trace_path, router, data (data_mode) and the instance lists
# (through the sizes above) are handled apart.
_SETTABLE = tuple(name for name, _ in S.SimConfig._fields_
                  if name not in ("version", "size_bytes", "reserved0", "reserved1",
                                  "data_mode", "dtype", "path", "faults",
                                  "nfaults", "trace_path", "router", "prefill_instances",
                                  "decode_instances", "prefill_instance_tp",
                                  "prefill_instance_pp", "decode_instance_tp",
                                  "decode_instance_pp", "reserved5", "other_layers",
                                  "state_conv_bytes", "state_ssm_bytes"))
# The layer pattern of a hybrid model, as plan()'s (_models.hybrid_params).
_HYBRID = ("full_attn_every", "window_tokens", "state_heads", "state_bytes")


def _is_list(value):
    return isinstance(value, (list, tuple))


def _set_instances(cfg, side, tp, pp):
    """One side of the cluster: tp and pp are whole numbers (one instance,
    the config's scalars) or lists with one value per instance (a single
    value is then for every instance)."""
    if not _is_list(tp) and not _is_list(pp):
        for name, value in ((side + "_tp", tp), (side + "_pp", pp)):
            if value is not None:
                _convert.set_int(cfg, name, value)
        return
    n = max(len(v) for v in (tp, pp) if _is_list(v))
    if n == 0 or n > S.SIM_MAX_INSTANCES:
        raise _errors.invalid("%s_tp / %s_pp list %d instances: give 1..%d"
                              % (side, side, n, S.SIM_MAX_INSTANCES))
    for name, value in ((side + "_tp", tp), (side + "_pp", pp)):
        if _is_list(value) and len(value) not in (1, n):
            raise _errors.invalid("%s has %d values for %d %s instances: give one "
                                  "value for all instances, or one each"
                                  % (name, len(value), n, side))
    if tp is None:
        raise _errors.invalid("%s_tp is required: the TP size of each %s instance"
                              % (side, side))
    tps = list(tp) if _is_list(tp) else [tp]
    pps = list(pp) if _is_list(pp) else [0 if pp is None else pp]
    setattr(cfg, side + "_instances", n)
    tp_array = getattr(cfg, side + "_instance_tp")
    pp_array = getattr(cfg, side + "_instance_pp")
    probe = S.SimConfig()  # range checks per value, named by field
    for i in range(n):
        for name, values, array in (("_tp", tps, tp_array), ("_pp", pps, pp_array)):
            value = values[i if len(values) == n else 0]
            _convert.set_int(probe, side + name, value)
            array[i] = value


# kvs_sim_data_mode_t by name, as `kvstage sim --data`.
_DATA_MODES = {"bytes": 0, "provenance": 1}


def simulate(model=None, *, dtype=None, path=None, faults=(), trace_path=None,
             router=None, data=None, **fields):
    """Runs one simulated disaggregated-serving scenario and returns its
    report as a dict.

    model: a built-in model name (see models()) filling total_heads,
    head_dim, layers and dtype; explicit arguments override it. Every other
    keyword is a field of kvs_sim_config_t (include/kvstage/sim.h), e.g.
    page_size, decode_page_size (the decode's pages when they are not
    page_size's, which is then the prefill's: docs/kinds/page-sizes.md, as
    `kvstage sim --decode-page-size`), prefill_tp, decode_tp (required),
    prefill_cp (prefill context-parallel ranks, each of prefill_tp x
    prefill_pp and holding one token range of a request:
    docs/kinds/context-parallel.md, as `kvstage sim --prefill-cp`),
    chunk_tokens, requests,
    prompt_min_tokens, prompt_max_tokens, rate_milli_per_s, ring_bytes,
    seed, stall_timeout_ns, net_link_bytes_per_s, net_sq_depth (work
    requests per connection's send queue: a post beyond them is refused and
    posted again, counted in posts_refused), max_aux_bytes (0..1048576:
    every request carries an aux payload of up to that many bytes to every
    decode rank, checked byte for byte there and counted in
    aux_bytes_verified and aux_corrupt_bytes, as `kvstage sim --aux-bytes`;
    0, the default, carries none); 0 or absent takes the simulator's
    default. full_attn_every, window_tokens, state_heads, state_bytes: a
    hybrid model's layer pattern as plan()'s (a hybrid model gives its
    own), moved on the staging path with every window row and state byte
    verified (docs/kinds/hybrid.md). path: "auto", "staging", "direct" or
    "slice". kv_scales:
    "none", "per-token" or "per-block[:N]" as for plan() (with dtype "fp8"):
    every scale slot is moved and verified with its rows.
    faults: strings as `kvstage sim --fault`, e.g. ["drop:any:0.01"] or
    ["crash:prefill@1:0:20000"]. trace_path: write a Chrome trace-event
    JSON there.

    A cluster (spec §12): prefill_tp, prefill_pp, decode_tp and decode_pp
    also take a list with one value per instance, e.g. prefill_tp=[8, 8, 4],
    decode_tp=[2, 2] (a single value or list of one: the same for every
    instance of that side). router: "round-robin" (default) or
    "least-loaded".

    data: "bytes" (default: simulated memory holds every KV byte, each
    checked) or "provenance" (it holds where each byte came from, as runs
    that grow with copy descriptors, not bytes: far less memory and time
    for the same events, times and digest), as `kvstage sim --data`.

    The dict has the report's fields (requests_total, requests_ok,
    requests_failed, hung_requests, bytes_moved, bytes_verified,
    corrupt_bytes, ring_leaked_bytes, violations, collateral_failures,
    aux_bytes_verified, aux_corrupt_bytes, rdma_ops, sim_ns, goodput_gbps,
    latency_p50_us, digest, ...); ok, the run's verdict (True when it broke
    no invariant: the library's, the same as `kvstage sim`'s exit status);
    failures, why requests failed: {status name: {"count": n,
    "first_detail": "..."}} as `kvstage sim --json`; aux_error, the first
    wrong aux payload in words ("" when none); path, the
    name of the path the handlers ran, and instances: one dict per instance
    (prefill ones first) with id, role, tp, pp, requests_ok,
    requests_failed, bytes, ring_peak_bytes and metrics (ttft_p50_us,
    ttft_p90_us, ttft_p99_us, transfer_p50_us, transfer_p99_us,
    ring_p99_bytes, watermark_waits, nic_util_mean, nic_util_max), as
    `kvstage sim --json`; the whole run's operator metrics are top-level
    fields of the same names, with goodput_fraction. Requests that fail under injected faults are
    counted there; KvstageError is raised only when the run cannot happen
    (a bad field, named in the message; a ring smaller than the largest
    region of the workload, KVS_EOVERSIZED; or no memory for the cluster).
    """
    unknown = sorted(set(fields) - set(_SETTABLE) - set(_HYBRID))
    if unknown:
        raise TypeError("simulate() got unknown argument(s) %s; the fields are: "
                        "model, dtype, path, faults, trace_path, router, %s"
                        % (", ".join(unknown), ", ".join(_SETTABLE)))
    fields["dtype"] = dtype
    scales = fields.pop("kv_scales", None)
    _, fields = _models.shape(model, fields)

    cfg = S.SimConfig()
    cfg.version = S.SIM_CONFIG_VERSION
    cfg.size_bytes = ctypes.sizeof(cfg)
    for key in _SETTABLE:
        value = fields.get(key)
        if value is not None and key not in _SIZES and key not in _HYBRID:
            _convert.set_int(cfg, key, value)
    _models.hybrid_params(cfg, fields)
    for side in ("prefill", "decode"):
        _set_instances(cfg, side, fields.get(side + "_tp"), fields.get(side + "_pp"))
    if router is not None:
        if router not in S.SIM_ROUTERS:
            raise _errors.invalid("router is %r: give one of %s"
                                  % (router, ", ".join(sorted(S.SIM_ROUTERS))))
        cfg.router = S.SIM_ROUTERS[router]
    if data is not None:
        if data not in _DATA_MODES:
            raise _errors.invalid("data is %r: give one of %s"
                                  % (data, ", ".join(sorted(_DATA_MODES))))
        cfg.data_mode = _DATA_MODES[data]
    cfg.dtype = _convert.dtype(fields.get("dtype") or "bf16")
    cfg.kv_kind = _models.kind_value(fields.get("kind"))  # an MLA model's, or gqa
    cfg.kv_scales, block = _models.scales_value(scales)
    if fields.get("scale_block") is None:
        cfg.scale_block = block
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

    lib = _library.load()  # before SimReport: loading gives it its fields
    report = S.SimReport()
    report.size_bytes = ctypes.sizeof(report)
    err = S.Error()
    rc = lib.kvs_sim_run(ctypes.byref(cfg), ctypes.byref(report), ctypes.byref(err))
    if rc != 0:
        _errors.raise_for(rc, err)
    # Every scalar result the library lists (kvstage/sim_report_fields.h),
    # then the arrays and the fields that read better converted.
    out = {}
    for name, ctype, _, head, _ in S.SIM_REPORT_FIELDS:
        if not head and ctype in ("u32", "i32", "u64", "i64", "f64"):
            out[name] = getattr(report, name)
    out["ok"] = bool(report.ok)
    # Why requests failed, by status name, as `kvstage sim --json`.
    out["failures"] = {
        _errors.status_name(f.status): {
            "count": f.count, "first_detail": f.first_detail.decode(errors="replace")}
        for f in report.failure[:report.failures]}
    out["failures_unlisted"] = report.failures_unlisted
    out["instances"] = [
        {"id": i.id, "role": "decode" if i.role == 1 else "prefill", "tp": i.tp,
         "pp": i.pp, "requests_ok": i.requests_ok, "requests_failed": i.requests_failed,
         "bytes": i.bytes, "ring_peak_bytes": i.ring_peak_bytes,
         "metrics": {name: getattr(m, name) for name, _ in S.SimInstanceMetrics._fields_}}
        for i, m in zip(report.instance[:report.instances],
                        report.instance_metrics[:report.instances])]
    out["init_error"] = report.init_error.decode(errors="replace")
    out["aux_error"] = report.aux_error.decode(errors="replace")
    out["path"] = _convert.path_name(report.path)
    return out
