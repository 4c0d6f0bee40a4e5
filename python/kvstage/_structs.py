"""_structs.py - ctypes mirrors of the C structs the package passes to the
library: kvs_error_t, kvs_layout_params_t, kvs_layout_t, kvs_head_slice_t,
kvs_writer_t, kvs_model_t (include/kvstage/kvstage.h) and kvs_sim_config_t,
kvs_sim_instance_t, kvs_sim_report_t (include/kvstage/sim.h). Field names and order are the
C ones; python/tests/test_abi.py compiles the headers and checks every
size and offset, so a change on the C side fails a test instead of
corrupting memory.
"""

import ctypes as c

ERROR_MSG_BYTES = 256  # KVS_ERROR_MSG_BYTES
SIM_CONFIG_VERSION = 1  # KVS_SIM_CONFIG_VERSION
SIM_MAX_FAULTS = 16  # KVS_SIM_MAX_FAULTS
SIM_MAX_INSTANCES = 16  # KVS_SIM_MAX_INSTANCES
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
                ("chunk_tokens", i64)]


class Layout(c.Structure):
    """kvs_layout_t"""
    _fields_ = [("total_heads", i64), ("head_dim", i64), ("elem_bytes", i64),
                ("layers", i64), ("page_size", i64), ("dtype", enum),
                ("prefill_tp", i64), ("decode_tp", i64), ("prefill_pp", i64),
                ("decode_pp", i64), ("chunk_tokens", i64), ("grid_tokens", i64),
                ("chunk_pages", i64), ("src_heads", i64), ("dst_heads", i64),
                ("decode_layers", i64), ("prefill_layers", i64),
                ("tp_writers", i64), ("expected_arrivals", i64),
                ("targets_per_prefill", i64), ("path", enum)]


class HeadSlice(c.Structure):
    """kvs_head_slice_t"""
    _fields_ = [("src_start", i64), ("num_heads", i64), ("dst_start", i64)]


class Writer(c.Structure):
    """kvs_writer_t"""
    _fields_ = [("writer_index", i64), ("prefill_rank", i64), ("heads", HeadSlice),
                ("offset_bytes", i64), ("len_bytes", i64)]


class Model(c.Structure):
    """kvs_model_t"""
    _fields_ = [("name", c.c_char_p), ("total_heads", i64), ("head_dim", i64),
                ("layers", i64), ("dtype", enum), ("note", c.c_char_p)]


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
                ("net_sq_depth", u32), ("reserved2", u32),
                ("prefill_instances", u32), ("decode_instances", u32),
                ("prefill_instance_tp", i64 * SIM_MAX_INSTANCES),
                ("prefill_instance_pp", i64 * SIM_MAX_INSTANCES),
                ("decode_instance_tp", i64 * SIM_MAX_INSTANCES),
                ("decode_instance_pp", i64 * SIM_MAX_INSTANCES),
                ("router", i32), ("reserved3", u32)]


class SimInstance(c.Structure):
    """kvs_sim_instance_t"""
    _fields_ = [("role", i32), ("id", u32), ("tp", i64), ("pp", i64),
                ("requests_ok", u32), ("requests_failed", u32), ("bytes", u64),
                ("ring_peak_bytes", u64)]


class SimReport(c.Structure):
    """kvs_sim_report_t"""
    _fields_ = [("version", u32), ("size_bytes", u32),
                ("requests_total", u32), ("requests_ok", u32),
                ("requests_failed", u32), ("hung_requests", u32),
                ("unreported_failures", u32), ("path", i32),
                ("bytes_moved", u64), ("bytes_verified", u64),
                ("corrupt_bytes", u64), ("ring_leaked_bytes", u64),
                ("violations", u64), ("rdma_ops", u64), ("control_msgs", u64),
                ("msgs_rejected", u64), ("watermark_waits", u64),
                ("ring_peak_bytes", u64), ("sim_ns", u64), ("events", u64),
                ("digest", u64), ("prefill_ranks", i64), ("decode_ranks", i64),
                ("goodput_gbps", c.c_double), ("line_rate_gbps", c.c_double),
                ("latency_p50_us", c.c_double), ("latency_p99_us", c.c_double),
                ("e2e_p50_us", c.c_double), ("e2e_p99_us", c.c_double),
                ("msgs_retransmitted", u64), ("msgs_duplicate", u64),
                ("peers_lost", u64), ("ranks_crashed", u32),
                ("ranks_restarted", u32), ("ranks_down_at_start", u32),
                ("reserved", u32), ("init_error", c.c_char * 384),
                ("posts_refused", u64), ("collateral_failures", u32),
                ("instances", u32),
                ("instance", SimInstance * (2 * SIM_MAX_INSTANCES))]


# The C name of each mirror, for the ABI test.
C_NAMES = {Error: "kvs_error_t", LayoutParams: "kvs_layout_params_t",
           Layout: "kvs_layout_t", HeadSlice: "kvs_head_slice_t",
           Writer: "kvs_writer_t", Model: "kvs_model_t", SimConfig: "kvs_sim_config_t",
           SimInstance: "kvs_sim_instance_t", SimReport: "kvs_sim_report_t"}
