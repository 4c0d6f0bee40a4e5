"""test_sim_report_fields.py - the package's kvs_sim_report_t is the
library's one list (include/kvstage/sim_report_fields.h, read through
kvs_sim_report_field): the ctypes struct has its members, offsets and
size; simulate()'s dict and `kvstage sim --json` both carry every scalar
result of the list, with equal values; a field the package's struct or
dict lacks is named."""

import ctypes

import pytest

import kvstage
from kvstage import _library
from kvstage import _structs as S

SMALL = dict(model="llama-3.1-8b", layers=4, prefill_tp=4, decode_tp=2,
             page_size=16, chunk_tokens=512, requests=6, prompt_min_tokens=64,
             prompt_max_tokens=512, ring_bytes=64 << 20, rate_milli_per_s=20000)
SMALL_FLAGS = ["--model", "llama-3.1-8b", "--layers", 4, "--prefill-tp", 4,
               "--decode-tp", 2, "--page-size", 16, "--chunk-tokens", 512,
               "--requests", 6, "--prompt-tokens", "64:512", "--ring-mib", 64,
               "--rate", 20]
SCALARS = ("u32", "i32", "u64", "i64", "f64")


def listed():
    """(name, type, offset, size) of every member, from the library."""
    lib = _library.load()
    out, i = [], 0
    while True:
        f = lib.kvs_sim_report_field(i)
        if not f:
            return out
        f = f.contents
        out.append((f.name.decode(), f.type.decode(), f.offset, f.size_bytes))
        i += 1


def missing_from_struct(fields, struct):
    """Members of the list the ctypes struct lacks or lays out elsewhere."""
    bad = []
    for name, _, offset, size in fields:
        got = getattr(struct, name, None)
        if got is None or got.offset != offset or got.size != size:
            bad.append(name)
    return bad


def test_struct_is_the_library_list():
    fields = listed()
    assert len(fields) > 60
    assert [f[0] for f in fields] == [f[0] for f in S.SimReport._fields_]
    assert ctypes.sizeof(S.SimReport) == _library.load().kvs_sim_report_size()
    assert missing_from_struct(fields, S.SimReport) == []
    assert [f[0] for f in S.SIM_REPORT_FIELDS] == [f[0] for f in fields]


def test_a_struct_without_a_field_is_caught():
    # Planted: a mirror written by hand that forgot the last member.
    fields = listed()

    class Short(ctypes.Structure):
        _fields_ = S.SimReport._fields_[:-1]
    assert missing_from_struct(fields, Short) == [fields[-1][0]]


def test_every_scalar_is_in_simulate_and_the_cli(cli):
    got = kvstage.simulate(**SMALL)
    want = cli("sim", *SMALL_FLAGS)
    names = [name for name, ctype, _, head, _ in S.SIM_REPORT_FIELDS
             if not head and ctype in SCALARS]
    assert "hostile_bytes_landed" in names and "ttft_p90_us" in names
    assert [n for n in names if n not in got] == []
    assert [n for n in names if n not in want] == []
    for name, ctype, json, head, _ in S.SIM_REPORT_FIELDS:
        if head or ctype not in SCALARS or json < 0:
            continue
        if ctype == "f64":
            assert got[name] == pytest.approx(want[name], abs=10.0 ** -json), name
        else:
            assert got[name] == want[name], name
    assert "%016x" % got["digest"] == want["digest"]
    assert got["ok"] is want["ok"] is True
    assert got["path"] == want["path"]
