"""discovery_cluster.py - processes of a kvstage cluster that find each other
through etcd (kvstage.Discovery), for test_discovery.py. Every rank runs
over libfabric tcp on 127.0.0.1 with torch CPU tensors; no address is given
on any command line: only the etcd URL.

    discovery_cluster.py prefill DIR ETCD --instance K --tp N [--hold R] [--after]
        publishes TP N ranks of prefill instance K, serves its rooms (ROOMS),
        writing each room's pattern; with --hold R it opens room R and never
        computes it, then writes DIR/held-K and waits (the test stops it).
        With --after it is the instance restarted (at new addresses: the
        fabric's ports are the system's) and serves AFTER instead.
    discovery_cluster.py decode DIR ETCD
        opens every room of ROOMS, each paired with its instance, which it
        finds in etcd when the room first names it (instance 1 is started
        after the decode); once they all ended writes DIR/held-failed,
        waits for instance 1 back at other addresses and opens AFTER's
        rooms; checks every byte of every room that ends ok, writes
        DIR/decode.json: each room's status, seconds and the time a held
        room failed.

The pattern is rank_pair.py's: a function of (room, token, layer, K/V,
global head, dim) that the decode recomputes.
"""
import argparse
import json
import os
import sys
import time

import torch

import kvstage
from rank_pair import values

HEADS, DIM, LAYERS, PAGE, POOL_PAGES, CHUNK = 4, 16, 2, 16, 128, 32
TTL_S, POLL_S = 2, 0.25
STALL_S = 60  # far above what a lost instance may take to fail its rooms
# room: (instance, total tokens)
ROOMS = {11: (0, 40), 12: (0, 96), 13: (0, 130), 21: (1, 64), 22: (1, 33), 24: (1, 80)}
HELD = 24
AFTER = {31: (1, 50), 32: (1, 70)}  # served by instance 1 restarted elsewhere


def pages_of(room, total):
    """The room's pages: its own run of the pool, the same on both sides."""
    n = -(-total // PAGE)
    first = (room % 16) * 8
    return list(range(first, first + n))


def slots(pages, total):
    return torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)][:total])


def discovery(etcd):
    return kvstage.Discovery(etcd, cluster="test", ttl_s=TTL_S, poll_s=POLL_S)


def common(disc):
    return dict(page_size=PAGE, total_heads=HEADS, chunk_tokens=CHUNK, fabric="ofi",
                provider="tcp", bind_addr="127.0.0.1", stall_timeout_s=STALL_S,
                discovery=disc, discovery_wait_s=30)


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


def prefill(folder, etcd, instance, tp_size, hold, after):
    disc = discovery(etcd)
    local = HEADS // tp_size
    ranks, pools = [], []
    for tp in range(tp_size):
        ks = [torch.zeros(POOL_PAGES * PAGE, local, DIM, dtype=torch.float16)
              for _ in range(LAYERS)]
        vs = [torch.zeros_like(k) for k in ks]
        pools.append((ks, vs))
        ranks.append(kvstage.Rank("prefill", k_buffers=ks, v_buffers=vs, tp_rank=tp,
                                  tp_size=tp_size, instance_id=instance, **common(disc)))
    for r in ranks:
        r.start()
    rooms = AFTER if after else ROOMS
    mine = sorted(room for room, (inst, _) in rooms.items() if inst == instance)
    for room in mine:
        total = rooms[room][1]
        pages = pages_of(room, total)
        for tp, (r, (ks, vs)) in enumerate(zip(ranks, pools)):
            heads = list(range(tp * local, (tp + 1) * local))
            for layer in range(LAYERS):
                for kv, buf in ((0, ks[layer]), (1, vs[layer])):
                    buf.view(torch.int16)[slots(pages, total)] = \
                        values(room, list(range(total)), layer, kv, heads)
            r.open_room(room, pages, total_tokens=total)
            if room != hold:
                r.computed(room, total, final=True)
    served = [room for room in mine if room != hold]
    done = [dict() for _ in ranks]
    end = time.time() + 60
    while any(len([x for x in d if x in served]) < len(served) for d in done):
        if time.time() > end:
            sys.exit("discovery_cluster prefill %d: rooms not done: %s" % (instance, done))
        time.sleep(0.02)
        for d, r in zip(done, ranks):
            for res in r.poll():
                d[res.room] = res
    bad = [res for d in done for res in d.values() if not res.ok]
    if bad:
        sys.exit("discovery_cluster prefill %d: rooms failed: %s" % (instance, bad))
    if hold is not None:
        open(os.path.join(folder, "held-%d" % instance), "w").close()
        time.sleep(600)  # the test stops this process here
    for r in ranks:
        r.close()
    disc.close()


def decode(folder, etcd):
    disc = discovery(etcd)
    ks = [torch.zeros(POOL_PAGES * PAGE, HEADS, DIM, dtype=torch.float16)
          for _ in range(LAYERS)]
    vs = [torch.zeros_like(k) for k in ks]
    rank = kvstage.Rank("decode", k_buffers=ks, v_buffers=vs, tp_size=1, ring_bytes=4 << 20,
                        **common(disc))
    rank.start()
    opened, results = {}, {}

    def open_all(rooms):
        for room in sorted(rooms):
            instance, total = rooms[room]
            rank.open_room(room, pages_of(room, total), peer=instance, total_tokens=total)
            opened[room] = time.time()

    def wait_all(rooms):
        end = time.time() + 60
        while any(room not in results for room in rooms):
            if time.time() > end:
                sys.exit("discovery_cluster decode: rooms without a result: %s"
                         % sorted(set(rooms) - set(results)))
            time.sleep(0.02)
            for res in rank.poll():
                results[res.room] = (res, time.time())

    open_all(ROOMS)  # instance 1 is there: its first room waited for it
    old = disc.instances().get((1, 0), {}).get("addresses")
    wait_all(ROOMS)
    open(os.path.join(folder, "held-failed"), "w").close()
    end = time.time() + 30  # the test restarts instance 1 now
    while True:
        back = disc.instances().get((1, 0))
        if back is not None and back["addresses"] != old:
            break
        if time.time() > end:
            sys.exit("discovery_cluster decode: instance 1 did not come back at new addresses")
        time.sleep(0.05)
    open_all(AFTER)
    wait_all(AFTER)
    out = {"rooms": {}, "errors": disc.errors, "moved": [old, back["addresses"]]}
    for room, (res, at) in sorted(results.items()):
        entry = {"status": res.status_name, "instance": res.peer[0],
                 "seconds": at - opened[room], "at": at}
        if res.ok:
            total = {**ROOMS, **AFTER}[room][1]
            idx = slots(pages_of(room, total), total)
            for layer in range(LAYERS):
                for kv, buf in ((0, ks[layer]), (1, vs[layer])):
                    want = values(room, list(range(total)), layer, kv, list(range(HEADS)))
                    if not torch.equal(buf.view(torch.int16)[idx], want):
                        sys.exit("discovery_cluster decode: room %d layer %d %s differs"
                                 % (room, layer, "KV"[kv]))
            entry["bytes_checked"] = int(idx.numel() * HEADS * DIM * 2 * 2 * LAYERS)
        out["rooms"][str(room)] = entry
    rank.close()
    disc.close()
    write_json(os.path.join(folder, "decode.json"), out)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["prefill", "decode"])
    ap.add_argument("folder")
    ap.add_argument("etcd")
    ap.add_argument("--instance", type=int, default=0)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--hold", type=int, default=None)
    ap.add_argument("--after", action="store_true")
    a = ap.parse_args(argv)
    if a.role == "prefill":
        prefill(a.folder, a.etcd, a.instance, a.tp, a.hold, a.after)
    else:
        decode(a.folder, a.etcd)


if __name__ == "__main__":
    main(sys.argv[1:])
