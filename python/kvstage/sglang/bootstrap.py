"""bootstrap.py - the HTTP bootstrap server of one sglang prefill instance,
and the decode side's client of it.

The server names its prefill instance: a random 63-bit kvstage instance
id per start (GET /instance), which every rank of the instance takes as
its Rank(instance_id=) and a decode declares it under, so that a
restarted instance is a new one to the decode. Each prefill rank's
KVManager registers its layout there (PUT /route: its
tp_rank and dp_rank, the instance's tp_size, dp_size and page_size, and the
rank's kvstage fabric address); a decode asks once per prefill instance
(GET /route: the whole layout once every rank registered, 503 until then)
and caches it; GET /health is the decode's heartbeat. Standard library
only (http.server in a daemon thread). It moves no KV: that is the
fabric's job."""

import http.server
import json
import os
import threading
import time
import urllib.error
import urllib.request

from .. import _errors
from ._base import BaseKVBootstrapServer

_FIELDS = ("tp_rank", "dp_rank", "tp_size", "dp_size", "page_size")


def _check_registration(body):
    """The registration's error in words, or None when it is whole."""
    if not isinstance(body, dict):
        return "give a JSON object"
    for key in _FIELDS:
        v = body.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return "%s: %r: give an integer >= 0" % (key, v)
    for key in ("tp_size", "dp_size", "page_size"):
        if body[key] < 1:
            return "%s: %d: give an integer >= 1" % (key, body[key])
    if body["tp_rank"] >= body["tp_size"] or body["dp_rank"] >= body["dp_size"]:
        return ("tp_rank %d / dp_rank %d: outside tp_size %d / dp_size %d"
                % (body["tp_rank"], body["dp_rank"], body["tp_size"], body["dp_size"]))
    if not isinstance(body.get("address"), str) or ":" not in body["address"]:
        return "address: %r: give the rank's fabric address \"IP:port\"" % (body.get("address"),)
    return None


class KVBootstrapServer(BaseKVBootstrapServer):
    """The bootstrap server of one prefill instance, serving on host:port
    (port 0: any free one; .port says which) from a daemon thread as soon
    as it is made. close() stops it."""

    def __init__(self, host, port):
        self.host = host
        self.instance_id = int.from_bytes(os.urandom(8), "little") >> 1
        self._mu = threading.Lock()
        self._ranks = {}  # (dp_rank, tp_rank) -> registration
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass  # the engine logs; a request per heartbeat is noise

            def _reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    self._reply(200, {"ok": True})
                elif self.path == "/instance":
                    self._reply(200, {"instance": server.instance_id})
                elif self.path == "/route":
                    layout, why = server.layout()
                    self._reply(200, layout) if layout else self._reply(503, {"error": why})
                else:
                    self._reply(404, {"error": "%s: ask /route, /instance or /health"
                                               % self.path})

            def do_PUT(self):
                if self.path != "/route":
                    self._reply(404, {"error": "%s: register with PUT /route" % self.path})
                    return
                try:
                    n = int(self.headers.get("Content-Length", "0"))
                    body = json.loads(self.rfile.read(n) or b"null")
                except ValueError:
                    body = None
                why = _check_registration(body)
                if why is None:
                    why = server.register(body)
                self._reply(400, {"error": why}) if why else self._reply(200, {"ok": True})

        self._httpd = http.server.ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="kvstage-sglang-bootstrap", daemon=True)
        self._thread.start()

    def register(self, body):
        """Adds one rank's registration; the error in words if it
        contradicts those before it (another tp/dp size or page size)."""
        with self._mu:
            for other in self._ranks.values():
                for key in ("tp_size", "dp_size", "page_size"):
                    if other[key] != body[key]:
                        return ("%s: %d but rank (dp %d, tp %d) registered %d: every rank "
                                "of a prefill instance gives the same" %
                                (key, body[key], other["dp_rank"], other["tp_rank"],
                                 other[key]))
            self._ranks[(body["dp_rank"], body["tp_rank"])] = dict(body)
        return None

    def layout(self):
        """({instance, tp_size, dp_size, page_size, addresses (dp-major,
        then tp)},
        None) once every rank registered, else (None, why)."""
        with self._mu:
            if not self._ranks:
                return None, "no prefill rank registered yet"
            any_rank = next(iter(self._ranks.values()))
            tp, dp = any_rank["tp_size"], any_rank["dp_size"]
            want = [(d, t) for d in range(dp) for t in range(tp)]
            missing = [k for k in want if k not in self._ranks]
            if missing:
                return None, "%d of %d prefill ranks registered" % (len(want) - len(missing),
                                                                   len(want))
            return {"instance": self.instance_id, "tp_size": tp, "dp_size": dp, "page_size": any_rank["page_size"],
                    "addresses": [self._ranks[k]["address"] for k in want]}, None

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def _call(url, timeout_s, body=None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"{}")


def register(bootstrap_addr, record, timeout_s):
    """A prefill rank registers `record` at the bootstrap server
    "host:port", retrying until timeout_s (the server may start after
    its ranks)."""
    return _ask(bootstrap_addr, "/route", record, timeout_s)


def instance_of(bootstrap_addr, timeout_s):
    """A prefill rank asks its bootstrap server for the instance id, waiting
    at most timeout_s for the server to start."""
    return int(_ask(bootstrap_addr, "/instance", None, timeout_s)["instance"])


def _ask(bootstrap_addr, path, body, timeout_s):
    until = time.monotonic() + timeout_s
    while True:
        try:
            return _call("http://%s%s" % (bootstrap_addr, path), min(2.0, timeout_s), body)
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            raise _errors.invalid("bootstrap server %s refused %s %s: %s"
                                  % (bootstrap_addr, path, body, detail)) from None
        except (urllib.error.URLError, OSError) as e:
            if time.monotonic() >= until:
                raise _errors.invalid("bootstrap server %s did not answer in %.1f s (%s): is "
                                      "the prefill instance's bootstrap server running on "
                                      "--disaggregation-bootstrap-port?"
                                      % (bootstrap_addr, timeout_s,
                                         getattr(e, "reason", e))) from None
            time.sleep(0.05)


def fetch_layout(bootstrap_addr, timeout_s):
    """The prefill instance's layout from its bootstrap server, waiting at
    most timeout_s for every rank to register. KvstageError naming the
    server and what it said otherwise."""
    until = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            return _call("http://%s/route" % bootstrap_addr, max(0.1, min(2.0, timeout_s)))
        except urllib.error.HTTPError as e:
            last = e.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= until:
            raise _errors.invalid("prefill bootstrap server %s: no layout in %.1f s (%s): "
                                  "check the request's bootstrap_host/bootstrap_port and "
                                  "that the prefill instance is up" % (bootstrap_addr,
                                                                        timeout_s, last))
        time.sleep(0.05)


def healthy(bootstrap_addr, timeout_s):
    """True when the bootstrap server answers /health within timeout_s."""
    try:
        _call("http://%s/health" % bootstrap_addr, timeout_s)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False
