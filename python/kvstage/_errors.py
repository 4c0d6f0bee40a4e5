"""_errors.py - KvstageError, the one exception the package raises for a
kvstage status, and the lookups between status codes and names that the
library itself provides (kvs_status_name, kvs_strerror)."""

from . import _library

# Status codes are small negative ints (KVS_STATUS_LIST); this bounds the
# scan that maps a name back to its code.
_MAX_STATUS = 256


class KvstageError(Exception):
    """A kvstage call failed.

    code    the status, a negative int (e.g. -1)
    name    its name, e.g. "KVS_EINVAL"
    message the detail: which value to change and how
    """

    def __init__(self, code, name, message):
        super().__init__("%s (%d): %s" % (name, code, message))
        self.code = code
        self.name = name
        self.message = message


def status_name(code):
    """"KVS_EINVAL" for -1; "KVS_UNKNOWN" for a code kvstage does not have."""
    return _library.load().kvs_status_name(code).decode()


def strerror(code):
    """The library's message for a status: what went wrong, what to change."""
    return _library.load().kvs_strerror(code).decode()


def status_code(name):
    """The code of a status name such as "KVS_EINVAL" (KeyError if none)."""
    for code in range(0, -_MAX_STATUS, -1):
        if status_name(code) == name:
            return code
    raise KeyError(name)


def raise_for(code, err=None, detail=None):
    """Raises KvstageError for a failed status; the message is err.msg (a
    kvs_error_t the call filled), else detail, else kvs_strerror."""
    message = detail
    if err is not None and err.msg:
        message = err.msg.decode(errors="replace")
    if not message:
        message = strerror(code)
    raise KvstageError(code, status_name(code), message)


def invalid(message):
    """KvstageError KVS_EINVAL with message, for input refused before any
    C call (a value ctypes could not hold, an unknown model)."""
    code = status_code("KVS_EINVAL")
    return KvstageError(code, "KVS_EINVAL", message)
