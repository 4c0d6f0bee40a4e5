"""_library.py - finds and loads libkvstage_sim (which brings libkvstage with
it) and declares the C prototypes the package calls.

Search order, first hit wins:
  1. $KVSTAGE_LIBRARY: the path of libkvstage_sim.so, or the folder holding
     it. An explicit setting wins over any copy the package would find
     itself, and a setting that names no library is an error, never skipped.
  2. Next to the package: this folder, then the install tree's library
     folder (written into _libdir.py by `cmake --install`).
  3. The system's loader path (ctypes.util.find_library, ld.so.cache,
     LD_LIBRARY_PATH).
The library is loaded on first use, so `import kvstage` never fails.
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
        "kvs_model_find": (c.POINTER(S.Model), [c.c_char_p]),
        "kvs_model_count": (c.c_size_t, []),
        "kvs_model_at": (c.POINTER(S.Model), [c.c_size_t]),
        "kvs_sim_run": (c.c_int, [c.POINTER(S.SimConfig), c.POINTER(S.SimReport),
                                  c.POINTER(S.Error)]),
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
            _loaded = (lib, target)
        return _loaded[0]


def path():
    """What was loaded: a file path, or the name the system loader found."""
    load()
    return _loaded[1]
