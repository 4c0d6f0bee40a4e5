"""_structs.py - ctypes mirrors of the C structs the package passes to the
library: the planner's and the rank runtime's (include/kvstage/kvstage.h),
the simulator's (sim.h), the host device's (host.h), the verbs fabric's
(verbs.h), the libfabric fabric's (ofi.h) and the rank driver's
(driver.h). Field names and order are the C ones; python/tests/test_abi.py
compiles the headers and checks every size and offset, so a change on the
C side fails a test instead of corrupting memory.
"""

import ctypes as c

ERROR_MSG_BYTES = 256  # KVS_ERROR_MSG_BYTES
SIM_CONFIG_VERSION = 1  # KVS_SIM_CONFIG_VERSION
SIM_MAX_FAULTS = 16  # KVS_SIM_MAX_FAULTS
SIM_MAX_INSTANCES = 32  # KVS_SIM_MAX_INSTANCES
SIM_MAX_FAILURE_KINDS = 8  # KVS_SIM_MAX_FAILURE_KINDS
SIM_FAILURE_DETAIL_BYTES = 256  # KVS_SIM_FAILURE_DETAIL_BYTES
SIM_AUX_ERROR_BYTES = 192  # KVS_SIM_AUX_ERROR_BYTES
SIM_ROUTERS = {"round-robin": 0, "least-loaded": 1}  # kvs_sim_router_t

i64 = c.c_int64
u64 = c.c_uint64
u32 = c.c_uint32
i32 = c.c_int32
enum = c.c_int  # a C enum


class Error(c.Structure):
    """kvs_error_t"""
    _fields_ = [("status", c.c_int), ("backend_code", c.c_int),
                ("file", c.c_char_p), ("line", c.c_int),
                ("msg", c.c_char * ERROR_MSG_BYTES)]


class LayoutParams(c.Structure):
    """kvs_layout_params_t"""
    _fields_ = [("total_heads", i64), ("heads_per_rank", i64),
                ("heads_per_rank_tp", i64), ("head_dim", i64), ("dtype", enum),
                ("layers", i64), ("page_size", i64), ("prefill_tp", i64),
                ("decode_tp", i64), ("prefill_pp", i64), ("decode_pp", i64),
                ("chunk_tokens", i64), ("kind", enum),
                ("decode_page_size", i64), ("prefill_cp", i64),
                ("kv_scales", enum), ("scale_block", i64),
                ("full_attn_every", i64), ("other_layers", enum), ("window_tokens", i64),
                ("state_heads", i64), ("state_conv_bytes", i64), ("state_ssm_bytes", i64),
                ("draft_layers", i64), ("draft_head_dim", i64), ("draft_kv_heads", i64)]


class Layout(c.Structure):
    """kvs_layout_t"""
    _fields_ = [("total_heads", i64), ("head_dim", i64), ("elem_bytes", i64),
                ("layers", i64), ("page_size", i64), ("dtype", enum),
                ("prefill_tp", i64), ("decode_tp", i64), ("prefill_pp", i64),
                ("decode_pp", i64), ("chunk_tokens", i64), ("grid_tokens", i64),
                ("chunk_pages", i64), ("src_heads", i64), ("dst_heads", i64),
                ("decode_layers", i64), ("prefill_layers", i64),
                ("tp_writers", i64), ("expected_arrivals", i64),
                ("targets_per_prefill", i64), ("path", enum), ("kind", enum),
                ("planes", i64), ("tp_sources", i64), ("decode_page_size", i64),
                ("prefill_cp", i64), ("cp_align_tokens", i64),
                ("kv_scales", enum), ("scale_block", i64), ("scale_bytes", i64),
                ("full_attn_every", i64), ("other_layers", enum), ("window_tokens", i64),
                ("state_heads", i64), ("state_head_bytes", i64),
                ("state_conv_bytes", i64), ("state_ssm_bytes", i64),
                ("state_src_heads", i64), ("state_dst_heads", i64),
                ("draft_layers", i64), ("draft_head_dim", i64)]


class HeadSlice(c.Structure):
    """kvs_head_slice_t"""
    _fields_ = [("src_start", i64), ("num_heads", i64), ("dst_start", i64)]


class Writer(c.Structure):
    """kvs_writer_t"""
    _fields_ = [("writer_index", i64), ("prefill_rank", i64), ("heads", HeadSlice),
                ("offset_bytes", i64), ("len_bytes", i64)]


class Chunk(c.Structure):
    """kvs_chunk_t"""
    _fields_ = [("index", i64), ("page_start", i64), ("num_pages", i64),
                ("token_start", i64), ("token_end", i64)]


class CpPart(c.Structure):
    """kvs_cp_part_t"""
    _fields_ = [("cp_rank", i64), ("token_start", i64), ("token_end", i64),
                ("local_token_start", i64), ("offset_bytes", i64), ("len_bytes", i64)]


class HybridWriter(c.Structure):
    """kvs_hybrid_writer_t"""
    _fields_ = [("w", Writer), ("state_heads", HeadSlice), ("token_start", i64),
                ("tokens", i64), ("full_slots", i64),
                ("window_slots", i64), ("window_token_start", i64),
                ("window_tokens", i64), ("kv_bytes", i64), ("state_layers", i64),
                ("state_offset_bytes", i64), ("state_bytes", i64),
                ("draft_offset_bytes", i64), ("draft_bytes", i64)]


class Model(c.Structure):
    """kvs_model_t"""
    _fields_ = [("name", c.c_char_p), ("total_heads", i64), ("head_dim", i64),
                ("layers", i64), ("dtype", enum), ("note", c.c_char_p),
                ("kind", enum), ("full_attn_every", i64), ("other_layers", enum),
                ("window_tokens", i64), ("state_heads", i64),
                ("state_conv_bytes", i64), ("state_ssm_bytes", i64)]


class SimConfig(c.Structure):
    """kvs_sim_config_t"""
    _fields_ = [("version", u32), ("size_bytes", u32),
                ("total_heads", i64), ("heads_per_rank", i64),
                ("heads_per_rank_tp", i64), ("head_dim", i64), ("layers", i64),
                ("page_size", i64), ("prefill_tp", i64), ("decode_tp", i64),
                ("prefill_pp", i64), ("decode_pp", i64), ("chunk_tokens", i64),
                ("dtype", i32), ("path", i32),
                ("requests", u32), ("max_inflight", u32),
                ("prompt_min_tokens", i64), ("prompt_max_tokens", i64),
                ("prefix_max_tokens", i64), ("rate_milli_per_s", u64),
                ("prefill_tokens_per_s", u64), ("seed", u64),
                ("ring_bytes", u64), ("transfer_workers", u32), ("reserved0", u32),
                ("stall_timeout_ns", u64), ("max_events", u64),
                ("gpu_hbm_bytes", u64), ("gpu_hbm_bytes_per_s", u64),
                ("gpu_launch_ns", u64), ("net_link_bytes_per_s", u64),
                ("net_latency_ns", u64), ("net_per_op_ns", u64),
                ("net_ctrl_latency_ns", u64), ("net_segment_bytes", u64),
                ("net_mtu_bytes", u32), ("net_header_bytes", u32),
                ("faults", c.POINTER(c.c_char_p)), ("nfaults", u32),
                ("reserved1", u32), ("trace_path", c.c_char_p),
                ("net_sq_depth", u32), ("data_mode", u32),
                ("prefill_instances", u32), ("decode_instances", u32),
                ("prefill_instance_tp", i64 * SIM_MAX_INSTANCES),
                ("prefill_instance_pp", i64 * SIM_MAX_INSTANCES),
                ("decode_instance_tp", i64 * SIM_MAX_INSTANCES),
                ("decode_instance_pp", i64 * SIM_MAX_INSTANCES),
                ("router", i32), ("max_aux_bytes", u32), ("reserved3", u32),
                ("progress", c.c_void_p), ("progress_ctx", c.c_void_p),
                ("kv_kind", i32), ("reserved4", u32), ("decode_page_size", i64),
                ("kv_scales", i32), ("scale_block", u32), ("prefill_cp", i64),
                ("full_attn_every", i64), ("other_layers", i32), ("reserved5", u32),
                ("window_tokens", i64), ("state_heads", i64), ("state_conv_bytes", i64),
                ("state_ssm_bytes", i64), ("draft_layers", i64), ("draft_head_dim", i64)]


class SimInstance(c.Structure):
    """kvs_sim_instance_t"""
    _fields_ = [("role", i32), ("id", u32), ("tp", i64), ("pp", i64),
                ("requests_ok", u32), ("requests_failed", u32), ("bytes", u64),
                ("ring_peak_bytes", u64)]


class SimInstanceMetrics(c.Structure):
    """kvs_sim_instance_metrics_t"""
    _fields_ = [("ttft_p50_us", c.c_double), ("ttft_p90_us", c.c_double),
                ("ttft_p99_us", c.c_double), ("transfer_p50_us", c.c_double),
                ("transfer_p99_us", c.c_double), ("ring_p99_bytes", u64),
                ("watermark_waits", u64), ("nic_util_mean", c.c_double),
                ("nic_util_max", c.c_double)]


class SimFailure(c.Structure):
    """kvs_sim_failure_t"""
    _fields_ = [("status", i32), ("count", u32),
                ("first_detail", c.c_char * SIM_FAILURE_DETAIL_BYTES)]


class SimReport(c.Structure):
    """kvs_sim_report_t. Its fields are not written here: the library
    describes them (kvs_sim_report_field, from the one list of
    kvstage/sim_report_fields.h) and _library.load() calls
    build_sim_report() before anything uses the struct."""


class SimReportField(c.Structure):
    """kvs_sim_report_field_t"""
    _fields_ = [("name", c.c_char_p), ("type", c.c_char_p), ("offset", u32),
                ("size_bytes", u32), ("count", u32), ("json", i32), ("head", u32),
                ("reserved0", u32), ("meaning", c.c_char_p)]


# kvs_sim_report_field_t.type -> ctypes: the scalars' codes and the
# element types of the report's arrays.
_REPORT_TYPES = {"u32": u32, "i32": i32, "u64": u64, "i64": i64, "f64": c.c_double,
                 "char": c.c_char, "kvs_sim_instance_t": SimInstance,
                 "kvs_sim_failure_t": SimFailure,
                 "kvs_sim_instance_metrics_t": SimInstanceMetrics}

# The report's fields as the library listed them: (name, type, json,
# head, meaning) in struct order; filled by build_sim_report().
SIM_REPORT_FIELDS = []


def build_sim_report(field_at, size):
    """Gives SimReport the fields the library lists: field_at(i) is
    kvs_sim_report_field (a SimReportField pointer, NULL past the last),
    size is kvs_sim_report_size(). Raises OSError when ctypes lays a field
    out elsewhere than the library says (a library and a package that do
    not belong together)."""
    fields, listed = [], []
    i = 0
    while True:
        f = field_at(i)
        if not f:
            break
        f = f.contents
        name, ctype = f.name.decode(), f.type.decode()
        if ctype not in _REPORT_TYPES:
            raise OSError("kvstage: the library's kvs_sim_report_t has %s of type %s, "
                          "which this package does not know: install the package that "
                          "came with the library" % (name, ctype))
        t = _REPORT_TYPES[ctype]
        fields.append((name, t * f.count if f.count != 1 or ctype == "char" else t))
        listed.append((name, ctype, f.json, bool(f.head), f.meaning.decode(),
                       f.offset, f.size_bytes))
        i += 1
    SimReport._fields_ = fields
    for name, ctype, _, _, _, offset, nbytes in listed:
        got = getattr(SimReport, name)
        if got.offset != offset or got.size != nbytes:
            raise OSError("kvstage: kvs_sim_report_t.%s is at %d (%d bytes) in the "
                          "library but %d (%d bytes) here" % (name, offset, nbytes,
                                                              got.offset, got.size))
    if c.sizeof(SimReport) != size:
        raise OSError("kvstage: kvs_sim_report_t is %d bytes in the library, %d here"
                      % (size, c.sizeof(SimReport)))
    SIM_REPORT_FIELDS[:] = [entry[:5] for entry in listed]


LOG_FN = c.CFUNCTYPE(None, c.c_void_p, c.c_int, c.c_char_p)  # kvs_log_fn
AUX_BYTES_MAX = 1 << 20  # KVS_AUX_BYTES_MAX
VERBS_GID_AUTO = -1  # KVS_VERBS_GID_AUTO


class Log(c.Structure):
    """kvs_log_t"""
    _fields_ = [("fn", LOG_FN), ("user", c.c_void_p), ("level", enum)]


class ManagerConfig(c.Structure):
    """kvs_manager_config_t"""
    _fields_ = [("role", enum), ("staging", c.c_bool), ("is_mla", c.c_bool),
                ("total_heads", i64), ("heads_per_rank", i64), ("head_dim", i64),
                ("dtype", enum), ("layers", i64), ("page_size", i64),
                ("tp_rank", i64), ("tp_size", i64), ("pp_rank", i64), ("pp_size", i64),
                ("peer_tp_size", i64), ("peer_pp_size", i64), ("context_parallel", i64),
                ("chunk_tokens", i64), ("ring_bytes", u64), ("ring_max_live", u32),
                ("transfer_workers", u32), ("log", Log), ("path", enum),
                ("session_id", u64), ("max_rooms", u32), ("max_inflight_writes", u32),
                ("stall_timeout_ns", u64), ("retry_timeout_ns", u64),
                ("trace", c.c_void_p), ("trace_ctx", c.c_void_p), ("app_tag", u32),
                ("model_layers", i64), ("instance_id", u64), ("dp_rank", i64),
                ("max_instances", u32), ("max_peers", u32), ("max_aux_bytes", u32),
                ("secret_file", c.c_char_p), ("secret_env", c.c_char_p),
                ("kv_kind", enum), ("peer_page_size", i64), ("kv_scales", enum),
                ("scale_block", i64), ("cp_rank", i64), ("full_attn_every", i64),
                ("other_layers", enum), ("window_tokens", i64), ("state_heads", i64),
                ("state_conv_bytes", i64), ("state_ssm_bytes", i64),
                ("draft_layers", i64), ("draft_head_dim", i64), ("draft_kv_heads", i64)]


class KvLayer(c.Structure):
    """kvs_kv_layer_t"""
    _fields_ = [("k_addr", u64), ("v_addr", u64), ("tokens", i64),
                ("token_stride_bytes", i64), ("head_stride_bytes", i64),
                ("elem_stride_bytes", i64), ("ks_addr", u64), ("vs_addr", u64)]


class RankConfig(c.Structure):
    """kvs_rank_config_t"""
    _fields_ = [("manager", ManagerConfig), ("layers", c.POINTER(KvLayer)),
                ("local_heads", i64), ("state_base", c.POINTER(u64)), ("state_slots", i64),
                ("draft_k_base", c.POINTER(u64)), ("draft_v_base", c.POINTER(u64))]


class Peer(c.Structure):
    """kvs_peer_t"""
    _fields_ = [("instance", u64), ("dp_rank", i64)]


class InstanceDesc(c.Structure):
    """kvs_instance_desc_t"""
    _fields_ = [("id", u64), ("tp_size", i64), ("pp_size", i64), ("dp_size", i64),
                ("addrs", c.POINTER(c.c_char_p)), ("cp_size", i64)]


class RoomDesc(c.Structure):
    """kvs_room_desc_t"""
    _fields_ = [("room", u64), ("peer", Peer), ("base_tokens", i64),
                ("total_tokens", i64), ("pages", c.POINTER(i64)), ("num_pages", i64),
                ("aux", c.c_void_p), ("aux_bytes", u32), ("state_slot", i64)]


class RoomResult(c.Structure):
    """kvs_room_result_t"""
    _fields_ = [("room", u64), ("status", c.c_int), ("chunks", i64), ("bytes", u64),
                ("rdma_writes", u64), ("open_ns", u64), ("done_ns", u64),
                ("aux", c.c_void_p), ("aux_bytes", u32), ("peer", Peer),
                ("reason", c.c_char * 192)]


class HandlerStats(c.Structure):
    """kvs_handler_stats_t"""
    _fields_ = [(name, u64) for name in (
        "rdma_writes", "rdma_write_bytes", "msgs_sent", "msgs_received", "msgs_rejected",
        "copies", "watermark_waits", "ring_peak_bytes", "rooms_ok", "rooms_failed",
        "msgs_retransmitted", "msgs_duplicate", "peers_lost", "ring_live_bytes", "msgs_unacked",
        "auth_refused", "rtt_smoothed_ns", "keys_granted", "keys_revoked")]


class HostConfig(c.Structure):
    """kvs_host_config_t"""
    _fields_ = [("name", c.c_char_p), ("max_allocs", u32), ("max_streams", u32),
                ("max_events", u32), ("queue_ops", u32), ("copy_threads", u32),
                ("max_vector_bytes", u32)]


class VerbsConfig(c.Structure):
    """kvs_verbs_config_t"""
    _fields_ = [("device", c.c_char_p), ("port", c.c_int), ("gid_index", c.c_int),
                ("bind_addr", c.c_char_p), ("listen_port", c.c_uint16),
                ("max_conns", u32), ("sq_depth", u32), ("recv_depth", u32),
                ("send_buf_bytes", u32), ("max_mrs", u32), ("max_mr_pieces", u32),
                ("max_mr_bytes", u64), ("max_write_bytes", u64), ("max_mtu_bytes", u32),
                ("connect_timeout_ms", u32), ("dmabuf", c.c_void_p),
                ("dmabuf_ctx", c.c_void_p), ("near_pci", c.c_char_p),
                ("sysfs_root", c.c_char_p), ("log", Log), ("max_grants", u32)]


class VerbsInfo(c.Structure):
    """kvs_verbs_info_t"""
    _fields_ = [("device", c.c_char * 64), ("port", c.c_int), ("gid_index", c.c_int),
                ("gid", c.c_char * 48), ("address", c.c_char * 80), ("mtu_bytes", u32),
                ("max_mr_bytes", u64), ("max_write_bytes", u64),
                ("device_reason", c.c_char * 160)]


class OfiConfig(c.Structure):
    """kvs_ofi_config_t"""
    _fields_ = [("provider", c.c_char_p), ("bind_addr", c.c_char_p),
                ("listen_port", c.c_uint16), ("max_conns", u32), ("tx_depth", u32),
                ("recv_depth", u32), ("send_slots", u32), ("max_mrs", u32),
                ("max_mr_bytes", u64), ("max_write_bytes", u64),
                ("connect_timeout_ms", u32), ("log", Log), ("max_grants", u32)]


class OfiInfo(c.Structure):
    """kvs_ofi_info_t"""
    _fields_ = [("provider", c.c_char * 64), ("fabric", c.c_char * 64),
                ("domain", c.c_char * 64), ("address", c.c_char * 80),
                ("mr_mode", c.c_char * 96), ("cq_data_bytes", u32),
                ("max_write_bytes", u64), ("max_mr_bytes", u64)]


class CudaConfig(c.Structure):
    """kvs_cuda_config_t"""
    _fields_ = [("ordinal", c.c_int), ("max_allocs", u32), ("max_streams", u32),
                ("max_events", u32), ("desc_slots", u32)]


RESULT_FN = c.CFUNCTYPE(None, c.c_void_p, c.POINTER(RoomResult))  # on_result
ERROR_FN = c.CFUNCTYPE(None, c.c_void_p, c.c_int)  # on_error


class DriverConfig(c.Structure):
    """kvs_driver_config_t"""
    _fields_ = [("rank", c.c_void_p), ("dev", c.c_void_p), ("fab", c.c_void_p),
                ("on_result", RESULT_FN), ("on_error", ERROR_FN), ("ctx", c.c_void_p),
                ("poll_interval_ns", u64)]


class DriverStats(c.Structure):
    """kvs_driver_stats_t"""
    _fields_ = [(name, u64) for name in (
        "steps", "idle_steps", "arms", "sleeps", "wakes_call", "wakes_fabric",
        "wakes_device", "wakes_deadline", "wakes_timeout", "results")]


# The C name of each mirror, for the ABI test.
C_NAMES = {Error: "kvs_error_t", LayoutParams: "kvs_layout_params_t",
           Layout: "kvs_layout_t", HeadSlice: "kvs_head_slice_t",
           Writer: "kvs_writer_t", Chunk: "kvs_chunk_t", CpPart: "kvs_cp_part_t",
           Model: "kvs_model_t", SimConfig: "kvs_sim_config_t",
           SimInstance: "kvs_sim_instance_t", SimFailure: "kvs_sim_failure_t",
           SimInstanceMetrics: "kvs_sim_instance_metrics_t",
           SimReport: "kvs_sim_report_t",
           Log: "kvs_log_t", ManagerConfig: "kvs_manager_config_t", KvLayer: "kvs_kv_layer_t",
           RankConfig: "kvs_rank_config_t", Peer: "kvs_peer_t",
           InstanceDesc: "kvs_instance_desc_t", RoomDesc: "kvs_room_desc_t",
           RoomResult: "kvs_room_result_t", HandlerStats: "kvs_handler_stats_t",
           HostConfig: "kvs_host_config_t", VerbsConfig: "kvs_verbs_config_t",
           VerbsInfo: "kvs_verbs_info_t", OfiConfig: "kvs_ofi_config_t",
           OfiInfo: "kvs_ofi_info_t", CudaConfig: "kvs_cuda_config_t",
           DriverConfig: "kvs_driver_config_t", DriverStats: "kvs_driver_stats_t"}
