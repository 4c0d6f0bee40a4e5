"""test_abi.py - the package's ctypes mirrors (kvstage/_structs.py) match
the C headers: a C program built from include/kvstage prints the size of
every mirrored struct and the offset of every field, and the constants
the package copies; each must equal what ctypes computes. A field added,
removed or retyped on the C side fails here, not as corrupt memory."""

import ctypes
import os
import subprocess

import pytest

from kvstage import _library
from kvstage import _structs as S

# SimReport takes its fields from the library (kvs_sim_report_field): the
# mirror checked below is the one the library built.
_library.load()

CONSTANTS = {"KVS_ERROR_MSG_BYTES": S.ERROR_MSG_BYTES,
             "KVS_SIM_CONFIG_VERSION": S.SIM_CONFIG_VERSION,
             "KVS_SIM_MAX_FAULTS": S.SIM_MAX_FAULTS,
             "KVS_SIM_MAX_INSTANCES": S.SIM_MAX_INSTANCES,
             "KVS_SIM_MAX_FAILURE_KINDS": S.SIM_MAX_FAILURE_KINDS,
             "KVS_SIM_FAILURE_DETAIL_BYTES": S.SIM_FAILURE_DETAIL_BYTES,
             "KVS_SIM_AUX_ERROR_BYTES": S.SIM_AUX_ERROR_BYTES,
             "KVS_SIM_ROUTER_ROUND_ROBIN": S.SIM_ROUTERS["round-robin"],
             "KVS_SIM_ROUTER_LEAST_LOADED": S.SIM_ROUTERS["least-loaded"],
             "KVS_AUX_BYTES_MAX": S.AUX_BYTES_MAX,
             "KVS_VERBS_GID_AUTO": S.VERBS_GID_AUTO}


def c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>",
             "#include <kvstage/kvstage.h>", "#include <kvstage/sim.h>",
             "#include <kvstage/host.h>", "#include <kvstage/verbs.h>",
             "#include <kvstage/ofi.h>",
             "#include <kvstage/cuda.h>", "#include <kvstage/driver.h>",
             "int main(void)", "{"]
    for mirror, cname in S.C_NAMES.items():
        lines.append('    printf("%s size %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, _ in mirror._fields_:
            lines.append('    printf("%s %s %%zu\\n", offsetof(%s, %s));'
                         % (cname, field, cname, field))
    for name in CONSTANTS:
        lines.append('    printf("%s %%lld\\n", (long long)(%s));' % (name, name))
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def expected():
    out = []
    for mirror, cname in S.C_NAMES.items():
        out.append("%s size %d" % (cname, ctypes.sizeof(mirror)))
        for field, _ in mirror._fields_:
            out.append("%s %s %d" % (cname, field, getattr(mirror, field).offset))
    for name, value in CONSTANTS.items():
        out.append("%s %d" % (name, value))
    return out


def test_mirrors_match_the_headers(tmp_path, c_compiler, include_dir):
    src = tmp_path / "abi.c"
    exe = tmp_path / "abi"
    src.write_text(c_program())
    # The compiler and the probe are plain programs: no sanitizer preload.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    res = subprocess.run([c_compiler, "-std=c11", "-Wall", "-Werror", "-I", include_dir,
                          "-o", str(exe), str(src)], capture_output=True, text=True,
                         env=env)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([str(exe)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    got = res.stdout.splitlines()
    want = expected()
    assert len(got) == len(want)
    mismatched = [(c, p) for c, p in zip(got, want) if c != p]
    assert not mismatched, "C says / ctypes says: %r" % mismatched


@pytest.mark.parametrize("mirror", list(S.C_NAMES), ids=list(S.C_NAMES.values()))
def test_mirror_field_names_are_unique(mirror):
    names = [f for f, _ in mirror._fields_]
    assert len(names) == len(set(names))
