"""test_discovery.py - kvstage.Discovery against a real etcd (Debian's
etcd-server, started here on loopback ports), and a cluster whose processes
find each other through it (discovery_cluster.py): a prefill instance that
joins after the decode started is used without a restart, and one that
hangs (SIGSTOP: its sockets stay up, its lease is no longer renewed) fails
exactly its open room with KVS_EPEER within the lease time, long before the
stall timeout, while every other room moves every byte; restarted at other
addresses (as a pod is), the same instance serves the decode's next rooms
without a restart of the decode. A prefill instance of two
context-parallel ranks is found and declared with its CP size, every
byte checked.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import kvstage
from kvstage.discovery import Etcd

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd(tmp_path):
    exe = shutil.which("etcd")
    if exe is None:
        pytest.fail("etcd is not installed: install etcd-server (tools/install-deps.sh does)")
    client, peer = free_port(), free_port()
    url = "http://127.0.0.1:%d" % client
    log = open(tmp_path / "etcd.log", "w")
    proc = subprocess.Popen(
        [exe, "--data-dir", str(tmp_path / "etcd"), "--name", "kvstage-test",
         "--listen-client-urls", url, "--advertise-client-urls", url,
         "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
         "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
         "--initial-cluster", "kvstage-test=http://127.0.0.1:%d" % peer],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 20
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.time() > end or proc.poll() is not None:
                    pytest.fail("etcd did not start: %s" % open(tmp_path / "etcd.log").read())
                time.sleep(0.1)
        yield "etcd://127.0.0.1:%d" % client
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_discovery_lease_lapses_without_keepalive(etcd):
    """A record under a lease stays while the lease is renewed and is gone
    once it is not, within its TTL; a revoked lease takes it at once."""
    e = Etcd(["http://" + etcd.split("://", 1)[1]])
    lease = e.grant(2)
    e.put("/kvstage/t/a", "1", lease)
    assert e.range_prefix("/kvstage/t/") == {"/kvstage/t/a": "1"}
    for _ in range(3):
        time.sleep(1)
        assert e.keepalive(lease) > 0
    assert "/kvstage/t/a" in e.range_prefix("/kvstage/t/")
    end = time.time() + 6
    while e.range_prefix("/kvstage/t/") and time.time() < end:
        time.sleep(0.1)
    assert e.range_prefix("/kvstage/t/") == {}
    assert e.keepalive(lease) == 0
    lease = e.grant(30)
    e.put("/kvstage/t/b", "2", lease)
    e.revoke(lease)
    assert e.range_prefix("/kvstage/t/") == {}


def test_discovery_refuses_bad_arguments(etcd):
    with pytest.raises(kvstage.KvstageError, match="etcd://HOST:PORT"):
        kvstage.Discovery("127.0.0.1:2379")
    with pytest.raises(kvstage.KvstageError, match="ttl_s"):
        kvstage.Discovery(etcd, ttl_s=1)
    with pytest.raises(kvstage.KvstageError, match="is etcd running there"):
        kvstage.Discovery("etcd://127.0.0.1:%d" % free_port()).publish(
            dict(role="prefill", instance=0, dp_rank=0, pp_rank=0, tp_rank=0))


def test_discovery_cluster_join_and_lapse(etcd, tmp_path):
    from discovery_cluster import AFTER, HELD, ROOMS, STALL_S, TTL_S, POLL_S
    script = os.path.join(HERE, "discovery_cluster.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

    def start(*args):
        return subprocess.Popen([sys.executable, script, *args[:1], str(tmp_path), etcd,
                                 *args[1:]], env=env)

    procs = []
    try:
        procs.append(start("prefill", "--instance", "0", "--tp", "2"))
        dec = start("decode")
        procs.append(dec)
        # Instance 1 joins while the decode runs: its rooms wait for it.
        time.sleep(1.0)
        late = start("prefill", "--instance", "1", "--tp", "1", "--hold", str(HELD))
        procs.append(late)
        held = tmp_path / "held-1"
        end = time.time() + 60
        while not held.exists():
            assert time.time() < end and late.poll() is None, "instance 1 never held its room"
            time.sleep(0.05)
        late.send_signal(signal.SIGSTOP)  # hung: sockets up, lease not renewed
        stopped = time.time()
        failed = tmp_path / "held-failed"
        while not failed.exists():
            assert time.time() < stopped + 60 and dec.poll() is None, \
                "the decode never ended the held room"
            time.sleep(0.05)
        # Instance 1 restarted: a new process, new ports, the same id.
        again = start("prefill", "--instance", "1", "--tp", "1", "--after")
        procs.append(again)
        assert dec.wait(timeout=60) == 0
        assert procs[0].wait(timeout=60) == 0
        assert again.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    out = json.load(open(tmp_path / "decode.json"))
    rooms = out["rooms"]
    assert sorted(int(r) for r in rooms) == sorted({**ROOMS, **AFTER})
    old, new = out["moved"]
    assert old and new and old != new, out["moved"]
    for room, (instance, _) in {**ROOMS, **AFTER}.items():
        got = rooms[str(room)]
        assert got["instance"] == instance
        if room == HELD:
            assert got["status"] == "KVS_EPEER", got
            took = got["at"] - stopped
            # Within the lease time (plus a poll and etcd's expiry tick), far
            # from the stall timeout that would fail it otherwise.
            assert took < TTL_S + POLL_S + 1.5, "failed %.2f s after the hang" % took
            assert took < STALL_S / 10
        else:
            assert got["status"] == "KVS_OK", (room, got)
            assert got["bytes_checked"] > 0
    print("held room failed %.2f s after its instance hung (lease %d s)"
          % (rooms[str(HELD)]["at"] - stopped, TTL_S))


def test_discovery_cp_prefill_instance(etcd):
    """A prefill instance of two context-parallel ranks (TP 1 each) found
    through etcd: each CP rank publishes its cp_rank and cp_size, the
    decode's lookup orders the addresses by CP rank and declares the
    instance with cp_size 2 on the room that first names it, and every byte
    of two rooms (one split over both CP ranks, one short enough to be CP
    rank 0's alone) arrives where the decode's pages put it."""
    pytest.importorskip("torch")
    import torch
    from discovery_cluster import DIM, HEADS, LAYERS, PAGE, POOL_PAGES, common, discovery, \
        pages_of, slots
    from rank_pair import values
    disc = discovery(etcd)
    rooms = {41: 130, 43: 12}

    def pool():
        ks = [torch.zeros(POOL_PAGES * PAGE, HEADS, DIM, dtype=torch.float16)
              for _ in range(LAYERS)]
        return ks, [torch.zeros_like(k) for k in ks]

    made = []
    try:
        pre = []
        for c in range(2):
            ks, vs = pool()
            r = kvstage.Rank("prefill", k_buffers=ks, v_buffers=vs, instance_id=3,
                             context_parallel=2, cp_rank=c, **common(disc))
            made.append(r)
            pre.append((r, ks, vs))
        found = disc.instances().get((3, 0))
        assert found is not None and found["cp_size"] == 2, found
        assert found["addresses"] == [r.address for r, _, _ in pre], found
        ks, vs = pool()
        dec = kvstage.Rank("decode", k_buffers=ks, v_buffers=vs, ring_bytes=4 << 20,
                           **common(disc))
        made.append(dec)
        for r in made:
            r.start()
        held = {}
        for room, total in rooms.items():
            for r, pks, pvs in pre:
                start, end = r.cp_range(total)
                held[(room, r)] = end - start
                idx = slots(pages_of(room, total), total)[start:end]
                for layer in range(LAYERS):
                    for kv, buf in ((0, pks[layer]), (1, pvs[layer])):
                        buf.view(torch.int16)[idx] = values(room, list(range(start, end)),
                                                            layer, kv, list(range(HEADS)))
                r.open_room(room, pages_of(room, total), total_tokens=total)
                r.computed(room, total, final=True)
            dec.open_room(room, pages_of(room, total), peer=3, total_tokens=total)
        # Room 41 is split over both CP ranks; room 43 is CP rank 0's alone.
        assert all(held[(41, r)] > 0 for r, _, _ in pre), held
        assert held[(43, pre[1][0])] == 0, held
        results = {}
        end = time.time() + 60
        while len(results) < len(rooms):
            assert time.time() < end, "rooms without a result: %s" % (set(rooms) - set(results))
            time.sleep(0.02)
            for res in dec.poll():
                results[res.room] = res
        for room, total in rooms.items():
            assert results[room].ok, results[room]
            idx = slots(pages_of(room, total), total)
            for layer in range(LAYERS):
                for kv, buf in ((0, ks[layer]), (1, vs[layer])):
                    want = values(room, list(range(total)), layer, kv, list(range(HEADS)))
                    assert torch.equal(buf.view(torch.int16)[idx], want), (room, layer, kv)
        assert disc.errors == [], disc.errors
    finally:
        for r in made:
            r.close()
        disc.close()
