"""discovery.py - the ranks of a kvstage cluster found through etcd.

Every rank that is given a Discovery publishes one record under a lease of
its process: its role, instance, place (dp_rank, pp_rank, tp_rank), its
instance's sizes, the address a decode connects to, and the model shape
the registration fingerprint compares. A decode rank asked to open a room
with an instance it has not met looks the instance up (all of its ranks'
records) and declares it; an instance that joins at run time is found on
its first room, without a restart. A process that dies or hangs stops
renewing its lease; etcd deletes its records once the lease's TTL has
passed, and every decode rank following the cluster fails that instance's
open rooms at once (Rank.instance_lost: KVS_EPEER), leaving every other
instance's rooms alone. A restarted instance at the same addresses is used
again on its next room.

etcd's v3 API through its JSON gateway (etcd >= 3.4, Debian's
etcd-server), standard library only: no client package is needed.

Keys: {prefix}/{cluster}/{role}/{instance}/{dp_rank}/{pp_rank}/{tp_rank},
and /{cp_rank} after them for a rank of a context-parallel prefill
(cp_size > 1); values: JSON objects (docs/operations.md, "Finding peers").
A record without cp_rank and cp_size is a rank without CP.
"""
import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from . import _errors

_PREFIX = "/kvstage"


def _b64(text):
    return base64.b64encode(text.encode()).decode()


def _unb64(text):
    return base64.b64decode(text).decode()


def _prefix_end(prefix):
    """etcd's range_end for every key starting with prefix."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class Etcd:
    """The few calls of etcd's v3 JSON API kvstage needs. endpoints:
    ["http://host:port", ...], tried in turn; timeout_s bounds each call."""

    def __init__(self, endpoints, timeout_s=2.0):
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s

    def call(self, path, body):
        last = None
        for ep in self.endpoints:
            req = urllib.request.Request(ep + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")
                raise _errors.invalid("etcd %s%s refused %s: %s" % (ep, path, body, detail))
            except (urllib.error.URLError, OSError) as e:
                last = "%s: %s" % (ep, getattr(e, "reason", e))
        raise _errors.invalid("etcd: no endpoint answered %s (%s): is etcd running there? "
                              "give discovery=\"etcd://HOST:PORT\" of a live member"
                              % (path, last))

    def grant(self, ttl_s):
        out = self.call("/v3/lease/grant", {"TTL": int(ttl_s)})
        return int(out["ID"])

    def keepalive(self, lease):
        """The lease's TTL left after renewing it; 0 when it had lapsed."""
        out = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(out.get("result", out).get("TTL", 0))

    def revoke(self, lease):
        self.call("/v3/lease/revoke", {"ID": str(lease)})

    def put(self, key, value, lease=0):
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.call("/v3/kv/put", body)

    def delete(self, key):
        self.call("/v3/kv/deleterange", {"key": _b64(key)})

    def range_prefix(self, prefix):
        """{key: value} of every key under prefix."""
        out = self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix)})
        return {_unb64(kv["key"]): _unb64(kv.get("value", "")) for kv in out.get("kvs", [])}


def _endpoints(url):
    """"etcd://h1:p1,h2:p2" or "http://h:p" -> ["http://h1:p1", ...]."""
    if not isinstance(url, str) or "://" not in url:
        raise _errors.invalid("discovery: %r: give \"etcd://HOST:PORT[,HOST:PORT...]\"" % (url,))
    scheme, rest = url.split("://", 1)
    if scheme not in ("etcd", "http"):
        raise _errors.invalid("discovery: %r: the scheme is etcd:// (or http://)" % (url,))
    hosts = [h for h in rest.rstrip("/").split(",") if h]
    if not hosts or any(":" not in h for h in hosts):
        raise _errors.invalid("discovery: %r: give HOST:PORT for each etcd member" % (url,))
    return ["http://" + h for h in hosts]


class Discovery:
    """One process's view of a kvstage cluster in etcd.

    url         "etcd://HOST:PORT[,HOST:PORT...]": etcd members (client URLs)
    cluster     the cluster's name: ranks of other clusters are not seen
    ttl_s       the lease's TTL: a process silent this long is gone
    poll_s      how often a decode rank looks for instances gone or back
                (default ttl_s / 4)

    Give it to Rank(discovery=...); one Discovery serves every rank of a
    process (one lease, one keepalive thread, one follower thread)."""

    def __init__(self, url, *, cluster="default", ttl_s=5, poll_s=None, timeout_s=2.0):
        if not isinstance(ttl_s, (int, float)) or not 2 <= ttl_s <= 3600:
            raise _errors.invalid("ttl_s: %r: give seconds in [2, 3600]" % (ttl_s,))
        if not isinstance(cluster, str) or not cluster or "/" in cluster:
            raise _errors.invalid("cluster: %r: give a name without '/'" % (cluster,))
        self.url = url
        self.ttl_s = int(ttl_s)
        self.poll_s = float(poll_s) if poll_s else self.ttl_s / 4.0
        self.root = "%s/%s/" % (_PREFIX, cluster)
        self.etcd = Etcd(_endpoints(url), timeout_s)
        self._mu = threading.Lock()
        self._lease = 0
        self._mine = {}           # key -> value published by this process
        self._followers = []      # decode ranks to tell of instances gone
        self._stop = threading.Event()
        self._threads = []
        self.lease_lapsed = 0     # times this process found its lease gone
        self.errors = []          # what the threads could not do, newest last

    # ---- publishing -----------------------------------------------------------

    def _ensure_lease(self):
        if self._lease:
            return
        self._lease = self.etcd.grant(self.ttl_s)
        self._start(self._keepalive_loop, "kvstage-discovery-keepalive")

    def _start(self, fn, name):
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _keepalive_loop(self):
        while not self._stop.wait(self.ttl_s / 3.0):
            try:
                with self._mu:
                    lease = self._lease
                if lease and self.etcd.keepalive(lease) == 0:
                    # It lapsed (the process stalled past the TTL): publish again
                    # under a new one, so the instance comes back.
                    with self._mu:
                        self.lease_lapsed += 1
                        self._lease = self.etcd.grant(self.ttl_s)
                        for key, value in self._mine.items():
                            self.etcd.put(key, value, self._lease)
            except Exception as e:  # keep renewing; say why it failed
                self._error("keepalive: %s" % e)

    def _error(self, what):
        with self._mu:
            self.errors = (self.errors + [what])[-16:]

    def publish(self, record):
        """Publishes one rank's record (a dict with role, instance, dp_rank,
        pp_rank, tp_rank, and cp_rank with cp_size > 1) under this
        process's lease."""
        key = "%s%s/%d/%d/%d/%d" % (self.root, record["role"], record["instance"],
                                   record["dp_rank"], record["pp_rank"], record["tp_rank"])
        if record.get("cp_size", 1) > 1:
            key += "/%d" % record["cp_rank"]
        value = json.dumps(record, sort_keys=True)
        with self._mu:
            self._ensure_lease()
            self.etcd.put(key, value, self._lease)
            self._mine[key] = value
        return key

    def unpublish(self, key):
        with self._mu:
            if self._mine.pop(key, None) is not None:
                self.etcd.delete(key)

    # ---- finding ------------------------------------------------------------------

    def instances(self, role="prefill"):
        """{(instance, dp_rank): {"tp_size", "pp_size", "cp_size", "dp_size",
        "addresses", "shape"}} of the complete attention groups of `role`
        (every rank of the group published), addresses in CP-rank-major,
        then stage, then TP order (add_instance's)."""
        groups = {}
        for key, value in self.etcd.range_prefix(self.root + role + "/").items():
            try:
                rec = json.loads(value)
            except ValueError:
                continue
            g = groups.setdefault((int(rec["instance"]), int(rec["dp_rank"])), {})
            g[(int(rec.get("cp_rank", 0)), int(rec["pp_rank"]), int(rec["tp_rank"]))] = rec
        out = {}
        for ref, ranks in groups.items():
            any_rec = next(iter(ranks.values()))
            tp, pp = int(any_rec["tp_size"]), int(any_rec["pp_size"])
            cp = int(any_rec.get("cp_size", 1))
            want = [(c, s, t) for c in range(cp) for s in range(pp) for t in range(tp)]
            if sorted(ranks) != want:
                continue  # still joining, or leaving
            out[ref] = {"tp_size": tp, "pp_size": pp, "cp_size": cp,
                        "dp_size": sum(1 for g in groups if g[0] == ref[0]),
                        "addresses": [ranks[k]["address"] for k in want],
                        "shape": any_rec.get("shape", {})}
        return out

    def wait_instance(self, role, ref, timeout_s):
        """The group `ref` of `role` once all its ranks published, waiting at
        most timeout_s; None if it is not complete by then."""
        until = time.monotonic() + timeout_s
        while True:
            found = self.instances(role).get(ref)
            if found is not None or time.monotonic() >= until:
                return found
            time.sleep(min(0.05, self.poll_s))

    # ---- following ------------------------------------------------------------------

    def follow(self, rank):
        """A decode rank hears of the prefill instances it declared through
        this discovery that vanish (rank.instance_lost) and come back."""
        with self._mu:
            self._followers.append(rank)
            if len(self._followers) == 1:
                self._start(self._follow_loop, "kvstage-discovery-follow")

    def unfollow(self, rank):
        with self._mu:
            if rank in self._followers:
                self._followers.remove(rank)

    def _follow_loop(self):
        while not self._stop.wait(self.poll_s):
            try:
                present = self.instances("prefill")
            except Exception as e:
                self._error("follow: %s" % e)
                continue
            with self._mu:
                followers = list(self._followers)
            for rank in followers:
                try:
                    rank._discovery_seen(present)
                except Exception as e:
                    self._error("follow: %s" % e)

    def close(self):
        """Stops the threads and revokes the lease (this process's records go
        at once). Ranks using it should be closed first."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.etcd.timeout_s * 2 + 1)
        self._threads = []
        with self._mu:
            lease, self._lease = self._lease, 0
            self._mine.clear()
        if lease:
            try:
                self.etcd.revoke(lease)
            except Exception:
                pass  # it lapses by itself

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
