"""_library.py - finds and loads libkvstage_sim (which brings libkvstage with
it) and declares the C prototypes the package calls; and, for kvstage.Rank,
the backends' libraries libkvstage_hw (host device, driver, the verbs and
libfabric fabrics) and libkvstage_cuda (CUDA device), looked for next to
libkvstage_sim first.

Search order, first hit wins:
  1. $KVSTAGE_LIBRARY: the path of libkvstage_sim.so, or the folder holding
     it. An explicit setting wins over any copy the package would find
     itself, and a setting that names no library is an error, never skipped.
  2. Next to the package: this folder, then the install tree's library
     folder (written into _libdir.py by `cmake --install`).
  3. The system's loader path (ctypes.util.find_library, ld.so.cache,
     LD_LIBRARY_PATH).
The library is loaded on first use, so `import kvstage` never fails.
The backends' libraries: $KVSTAGE_HW_LIBRARY / $KVSTAGE_CUDA_LIBRARY (the
file or its folder), else the folder libkvstage_sim came from, else the
places above.
"""

import ctypes
import ctypes.util
import os
import threading

from . import _structs as S

ENV = "KVSTAGE_LIBRARY"
NAME = "kvstage_sim"
FILES = ("libkvstage_sim.so", "libkvstage_sim.so.0")

_lock = threading.Lock()
_loaded = None  # (CDLL, path) once loaded


def _from_env(value):
    """The library file $KVSTAGE_LIBRARY names (a file or a folder)."""
    if os.path.isdir(value):
        for f in FILES:
            path = os.path.join(value, f)
            if os.path.exists(path):
                return path
        raise OSError("%s=%s is a folder without %s: point it at the build or "
                      "install folder that holds libkvstage_sim.so"
                      % (ENV, value, " or ".join(FILES)))
    if os.path.isfile(value):
        return value
    raise OSError("%s=%s does not exist: set it to the path of "
                  "libkvstage_sim.so or the folder holding it" % (ENV, value))


def _next_to_package():
    """Candidate files next to the package, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    folders = [here]
    try:
        from . import _libdir  # written by `cmake --install`
        folders.append(os.path.normpath(os.path.join(here, _libdir.LIBDIR)))
    except ImportError:
        pass
    return [os.path.join(d, f) for d in folders for f in FILES]


def _find():
    """(what to dlopen, the places tried) by the search order above."""
    value = os.environ.get(ENV)
    if value:
        return _from_env(value), []
    tried = _next_to_package()
    for path in tried:
        if os.path.exists(path):
            return path, tried
    found = ctypes.util.find_library(NAME)
    # find_library may miss LD_LIBRARY_PATH; the loader itself does not.
    return (found or FILES[1]), tried + ["the system library path"]


def _declare(lib):
    """Prototypes of every C function the package calls."""
    c = ctypes
    protos = {
        "kvs_strerror": (c.c_char_p, [c.c_int]),
        "kvs_status_name": (c.c_char_p, [c.c_int]),
        "kvs_dtype_parse": (c.c_int, [c.c_char_p, c.POINTER(c.c_int)]),
        "kvs_dtype_name": (c.c_char_p, [c.c_int]),
        "kvs_path_parse": (c.c_int, [c.c_char_p, c.POINTER(c.c_int)]),
        "kvs_path_name": (c.c_char_p, [c.c_int]),
        "kvs_layout_init": (c.c_int, [c.POINTER(S.Layout), c.POINTER(S.LayoutParams),
                                      c.POINTER(S.Error)]),
        "kvs_pp_stage_layers": (c.c_int, [c.c_int64, c.c_int64, c.c_int64,
                                          c.POINTER(c.c_int64), c.POINTER(c.c_int64)]),
        "kvs_layout_stage_layers": (c.c_int, [c.POINTER(S.Layout), c.c_int, c.c_int64,
                                              c.POINTER(c.c_int64), c.POINTER(c.c_int64)]),
        "kvs_layout_writer": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                        c.c_int64, c.c_int64, c.POINTER(S.Writer)]),
        "kvs_layout_region_bytes": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                              c.c_int64, c.POINTER(c.c_int64)]),
        "kvs_layout_max_region_bytes": (c.c_int64, [c.POINTER(S.Layout)]),
        "kvs_layout_draft_part_bytes": (c.c_int64, [c.POINTER(S.Layout), c.c_int64,
                                                    c.c_int64]),
        "kvs_grid_num_chunks": (c.c_int64, [c.POINTER(S.Layout), c.c_int64]),
        "kvs_grid_chunk": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64, c.c_int64,
                                     c.POINTER(S.Chunk)]),
        "kvs_layout_cp_range": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                          c.POINTER(c.c_int64), c.POINTER(c.c_int64)]),
        "kvs_layout_cp_writers": (c.c_int, [c.POINTER(S.Layout), c.c_int64,
                                            c.POINTER(S.Chunk), c.POINTER(c.c_int64),
                                            c.POINTER(c.c_int64)]),
        "kvs_layout_cp_part": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                         c.c_int64, c.POINTER(S.Chunk), c.c_int64,
                                         c.POINTER(S.CpPart)]),
        "kvs_layout_chunk_arrivals": (c.c_int64, [c.POINTER(S.Layout), c.c_int64,
                                                  c.POINTER(S.Chunk)]),
        "kvs_layout_hybrid_writer": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                               c.c_int64, c.c_int64, c.POINTER(S.Chunk),
                                               c.POINTER(S.HybridWriter)]),
        "kvs_layout_layer_tokens": (c.c_int, [c.POINTER(S.Layout), c.c_int64, c.c_int64,
                                              c.POINTER(c.c_int64), c.POINTER(c.c_int64)]),
        "kvs_layout_state_slot_bytes": (c.c_int, [c.POINTER(S.Layout), c.c_int, c.c_int64,
                                                  c.POINTER(c.c_int64)]),
        "kvs_model_find": (c.POINTER(S.Model), [c.c_char_p]),
        "kvs_model_count": (c.c_size_t, []),
        "kvs_model_at": (c.POINTER(S.Model), [c.c_size_t]),
        "kvs_sim_run": (c.c_int, [c.POINTER(S.SimConfig), c.POINTER(S.SimReport),
                                  c.POINTER(S.Error)]),
        "kvs_sim_report_field": (c.POINTER(S.SimReportField), [c.c_uint32]),
        "kvs_sim_report_size": (c.c_uint32, []),
        "kvs_dtype_bytes": (c.c_int64, [c.c_int]),
        "kvs_room_state_name": (c.c_char_p, [c.c_int]),
        "kvs_rank_create": (c.c_int, [c.POINTER(S.RankConfig), c.c_void_p, c.c_void_p,
                                      c.POINTER(c.c_void_p), c.POINTER(S.Error)]),
        "kvs_rank_destroy": (None, [c.c_void_p]),
        "kvs_rank_manager": (c.c_void_p, [c.c_void_p]),
        "kvs_manager_layout": (c.POINTER(S.Layout), [c.c_void_p]),
        "kvs_rank_last_error": (c.POINTER(S.Error), [c.c_void_p]),
        "kvs_rank_add_instance": (c.c_int, [c.c_void_p, c.POINTER(S.InstanceDesc)]),
        "kvs_rank_connect": (c.c_int, [c.c_void_p, S.Peer]),
        "kvs_rank_open_room": (c.c_int, [c.c_void_p, c.POINTER(S.RoomDesc)]),
        "kvs_rank_set_aux": (c.c_int, [c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint32]),
        "kvs_rank_computed": (c.c_int, [c.c_void_p, c.c_uint64, c.c_int64, c.c_bool]),
        "kvs_rank_room_state": (c.c_int, [c.c_void_p, c.c_uint64, c.POINTER(c.c_int)]),
        "kvs_rank_abort": (c.c_int, [c.c_void_p, c.c_uint64]),
        "kvs_rank_stats": (None, [c.c_void_p, c.POINTER(S.HandlerStats)]),
        "kvs_rank_peers_ready": (c.c_int64, [c.c_void_p]),
        "kvs_rank_instance_lost": (c.c_int, [c.c_void_p, S.Peer]),
        "kvs_rank_metrics": (c.c_int, [c.POINTER(c.c_void_p), c.c_size_t, c.c_char_p,
                                       c.c_size_t, c.POINTER(c.c_size_t)]),
    }
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load():
    """The loaded library (a ctypes.CDLL); loads it on the first call.
    Raises OSError naming where it looked when no library loads."""
    global _loaded
    with _lock:
        if _loaded is None:
            target, tried = _find()
            try:
                lib = ctypes.CDLL(target)
            except OSError as e:
                where = ", ".join(tried) if tried else target
                raise OSError("kvstage: cannot load libkvstage_sim (%s); looked in: "
                              "%s. Set %s to the path of libkvstage_sim.so or its "
                              "folder" % (e, where, ENV)) from e
            _declare(lib)
            if not S.SIM_REPORT_FIELDS:
                S.build_sim_report(lib.kvs_sim_report_field, lib.kvs_sim_report_size())
            _loaded = (lib, target)
        return _loaded[0]


def path():
    """What was loaded: a file path, or the name the system loader found."""
    load()
    return _loaded[1]


# ---- the backends' libraries (kvstage.Rank) ---------------------------------

HW = {"hw": ("KVSTAGE_HW_LIBRARY", "kvstage_hw", ("libkvstage_hw.so", "libkvstage_hw.so.0"),
             "the host device, the driver and the verbs and ofi fabrics"),
      "cuda": ("KVSTAGE_CUDA_LIBRARY", "kvstage_cuda",
               ("libkvstage_cuda.so", "libkvstage_cuda.so.0"), "the CUDA device")}
_backends = {}


def _declare_hw(lib, which):
    c = ctypes
    err = c.POINTER(S.Error)
    if which == "cuda":
        protos = {
            "kvs_cuda_device_create": (c.c_int, [c.POINTER(S.CudaConfig),
                                                 c.POINTER(c.c_void_p), err]),
            "kvs_cuda_device_destroy": (None, [c.c_void_p]),
            "kvs_cuda_device": (c.c_void_p, [c.c_void_p]),
            "kvs_cuda_mem_attach": (c.c_int, [c.c_void_p, c.c_uint64, c.c_uint64, err]),
            "kvs_cuda_mem_detach": (c.c_int, [c.c_void_p, c.c_uint64, err]),
        }
    else:
        protos = {
            "kvs_host_device_create": (c.c_int, [c.POINTER(S.HostConfig),
                                                 c.POINTER(c.c_void_p), err]),
            "kvs_host_device_destroy": (None, [c.c_void_p]),
            "kvs_host_device": (c.c_void_p, [c.c_void_p]),
            "kvs_host_mem_attach": (c.c_int, [c.c_void_p, c.c_void_p, c.c_uint64, err]),
            "kvs_host_mem_detach": (c.c_int, [c.c_void_p, c.c_void_p, err]),
            "kvs_driver_create": (c.c_int, [c.POINTER(S.DriverConfig),
                                            c.POINTER(c.c_void_p), err]),
            "kvs_driver_destroy": (None, [c.c_void_p]),
            "kvs_driver_start": (c.c_int, [c.c_void_p]),
            "kvs_driver_stop": (c.c_int, [c.c_void_p]),
            "kvs_driver_running": (c.c_bool, [c.c_void_p]),
            "kvs_driver_progress": (c.c_int, [c.c_void_p]),
            "kvs_driver_wait": (c.c_int, [c.c_void_p, c.c_uint64]),
            "kvs_driver_wake": (None, [c.c_void_p]),
            "kvs_driver_last_error": (err, [c.c_void_p]),
            "kvs_driver_rank_error": (c.c_int, [c.c_void_p, err]),
            "kvs_driver_stats": (None, [c.c_void_p, c.POINTER(S.DriverStats)]),
        }
        # Each fabric built in has the same four calls, on its own structs.
        for fabric, config, info in (("verbs", S.VerbsConfig, S.VerbsInfo),
                                     ("ofi", S.OfiConfig, S.OfiInfo)):
            if not hasattr(lib, "kvs_%s_fabric_create" % fabric):
                continue
            protos.update({
                "kvs_%s_config_init" % fabric: (None, [c.POINTER(config)]),
                "kvs_%s_fabric_create" % fabric: (c.c_int, [c.POINTER(config),
                                                            c.POINTER(c.c_void_p), err]),
                "kvs_%s_fabric_destroy" % fabric: (c.c_int, [c.c_void_p]),
                "kvs_%s_fabric_info" % fabric: (c.c_int, [c.c_void_p, c.POINTER(info)]),
            })
        if hasattr(lib, "kvs_ofi_providers"):
            protos["kvs_ofi_providers"] = (c.c_int, [c.c_char_p, c.c_size_t])
    for name, (restype, argtypes) in protos.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load_backend(which):
    """libkvstage_hw ("hw") or libkvstage_cuda ("cuda"), loaded once; OSError
    naming where it looked and what to set when it does not load."""
    env, name, files, what = HW[which]
    core = load()
    with _lock:
        if which in _backends:
            return _backends[which]
        value = os.environ.get(env)
        tried = []
        if value:
            if os.path.isdir(value):
                cands = [os.path.join(value, f) for f in files]
            else:
                cands = [value]
        else:
            folders = []
            if os.path.sep in _loaded[1]:
                folders.append(os.path.dirname(_loaded[1]))
            cands = [os.path.join(d, f) for d in folders for f in files]
            cands += [p.replace("kvstage_sim", name) for p in _next_to_package()]
        target = None
        for path in cands:
            tried.append(path)
            if os.path.exists(path):
                target = path
                break
        if target is None:
            if value:
                raise OSError("%s=%s names no %s: point it at the build or install "
                              "folder that holds it" % (env, value, files[0]))
            target = ctypes.util.find_library(name) or files[1]
            tried.append("the system library path")
        try:
            lib = ctypes.CDLL(target)
        except OSError as e:
            raise OSError("kvstage: cannot load lib%s (%s), which brings %s; looked in: "
                          "%s. Build it (it is built with libkvstage) or set %s to it or "
                          "its folder" % (name, e, what, ", ".join(tried), env)) from e
        del core
        _declare_hw(lib, which)
        _backends[which] = lib
        return lib
