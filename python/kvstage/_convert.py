"""_convert.py - Python values into ctypes struct fields, refused with a
KvstageError naming the field when they cannot be held exactly (ctypes
would silently wrap -1 into 2**64 - 1), and dtype and path names through
the library's own parsers."""

import ctypes
import operator

from . import _errors, _library

_SIGNED = (ctypes.c_int64, ctypes.c_int32, ctypes.c_int)


def set_int(struct, field, value):
    """struct.field = value for an integer field; KvstageError (KVS_EINVAL)
    naming the field when value is not a whole number or does not fit."""
    ctype = dict(struct._fields_)[field]
    if isinstance(value, bool):
        raise _errors.invalid("%s is %r: give a whole number" % (field, value))
    try:
        value = operator.index(value)
    except TypeError:
        raise _errors.invalid("%s is %r: give a whole number" % (field, value)) from None
    bits = ctypes.sizeof(ctype) * 8
    if ctype in _SIGNED:
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        lo, hi = 0, (1 << bits) - 1
    if not lo <= value <= hi:
        raise _errors.invalid("%s is %d: give %d..%d" % (field, value, lo, hi))
    setattr(struct, field, value)


def dtype(value):
    """"bf16", "fp16", "fp8", "fp32" (or the kvs_dtype_t int) -> the int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise _errors.invalid("dtype is %r: use bf16, fp16, fp8 or fp32" % (value,))
    out = ctypes.c_int()
    rc = _library.load().kvs_dtype_parse(value.encode(), ctypes.byref(out))
    if rc != 0:
        _errors.raise_for(rc, detail="dtype '%s' is unknown: use bf16, fp16, fp8 "
                                     "or fp32" % value)
    return out.value


def dtype_name(value):
    return _library.load().kvs_dtype_name(value).decode()


def path(value):
    """"auto", "staging", "direct", "slice" (or the kvs_path_t int) -> the int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise _errors.invalid("path is %r: use auto, staging, direct or slice" % (value,))
    out = ctypes.c_int()
    rc = _library.load().kvs_path_parse(value.encode(), ctypes.byref(out))
    if rc != 0:
        _errors.raise_for(rc, detail="path '%s' is unknown: use auto, staging, "
                                     "direct or slice" % value)
    return out.value


def path_name(value):
    return _library.load().kvs_path_name(value).decode()
