"""sglang_engine.py - the processes of test_sglang_adapter.py: sglang's
prefill and decode instances as far as its disaggregation code drives a
transfer backend, each calling kvstage.sglang exactly as sglang's
schedulers call a backend (the call order is docs/embedding.md's,
"sglang"), over libfabric tcp on 127.0.0.1 with torch CPU tensors.

    sglang_engine.py prefill DIR NAME   instance NAME of PLAN: its bootstrap
        server, then one thread per engine rank (sglang runs a scheduler per
        rank): KVManager, set_kv_buffer_tensors, and per request of its DP
        group KVSender -> poll (WaitingForInput) -> init(pages, aux_index)
        -> forward (writes the KV and the metadata) -> send(chunk)... ->
        poll until Success/Failed. Writes DIR/NAME.port, DIR/NAME.json.
    sglang_engine.py decode DIR         one decode rank: per request
        KVReceiver -> poll -> init(pages, aux_index) -> poll until done
        (every other request in newer sglang's order: init(prefill_dp_rank)
        -> poll -> send_metadata(pages, aux_index, state_indices,
        decode_prefix_len), one of them with a 2-page cached prefix);
        aborts one; checks every byte of the pool and every metadata item;
        after the test kills instance B, times how long B's requests take
        to fail. Writes DIR/decode.json.

Sync points between the processes are files in DIR (the test's clock, not
sleeps: each wait has a deadline and says what it waited for).

The KV written for (room, token, layer, K/V, global head, dim) is
rank_pair.values; a request's pages are whole (sglang sends pages), so
every token slot of every page is checked.
"""
import enum
import json
import os
import sys
import threading
import time
import types

import torch

import kvstage.sglang as ks
from kvstage.sglang import bootstrap as ks_bootstrap
from rank_pair import values

HEADS, DIM, LAYERS, PAGE, POOL_PAGES, SLOTS = 4, 16, 2, 16, 64, 16  # DIM: rank_pair.values
CHUNK_PAGES = 2  # pages per send(): the chunked prefill's chunk
# Instances: A is TP 2 (one attention group), B is TP 1 with DP 2.
INSTANCES = {"A": dict(tp_size=2, dp_size=1), "B": dict(tp_size=2, dp_size=2)}
BASE = 0x5EED000000000000  # bootstrap_room is a random 63-bit int in sglang
# room: (instance, pages, what happens)
PLAN = {BASE + 1: ("A", 3, "ok"), BASE + 2: ("A", 5, "ok"), BASE + 3: ("A", 2, "abort"),
        BASE + 4: ("A", 4, "after_kill"), BASE + 5: ("B", 4, "ok"),
        BASE + 6: ("B", 3, "ok"), BASE + 7: ("B", 2, "held"), BASE + 8: ("B", 1, "held")}
PREFIX_PAGES = {BASE + 2: 2}  # a decode-side prefix-cache hit: these pages are not moved
DEADLINE_S = 40

try:  # pragma: no cover - sglang is not installed here
    from sglang.srt.disaggregation.utils import DisaggregationMode
except ImportError:
    class DisaggregationMode(enum.Enum):
        NULL = "null"
        PREFILL = "prefill"
        DECODE = "decode"


def tag(room):
    """A small number per room for rank_pair.values (which multiplies it)."""
    return room % 1000003


def metadata(room):
    """The request's metadata items (sglang's output ids and hidden state)."""
    ids = torch.tensor([(room >> s) & 0x7FFFFFFF for s in (0, 7, 13, 31)], dtype=torch.int32)
    hidden = torch.tensor([(room % 9973) + j * 0.5 for j in range(6)], dtype=torch.float32)
    return ids, hidden


def metadata_buffers():
    return torch.zeros(SLOTS, 4, dtype=torch.int32), torch.zeros(SLOTS, 6, dtype=torch.float32)


def kv_args(engine_rank, bufs):
    a = ks.KVArgs()
    a.engine_rank = engine_rank
    a.aux_data_ptrs = [b.data_ptr() for b in bufs]
    a.aux_data_lens = [b.numel() * b.element_size() for b in bufs]
    a.aux_item_lens = [b[0].numel() * b.element_size() for b in bufs]
    a.ib_device, a.gpu_id = None, 0
    return a


def pool(heads):
    ks_ = [torch.zeros(POOL_PAGES * PAGE, heads, DIM, dtype=torch.float16)
           for _ in range(LAYERS)]
    return ks_, [torch.zeros_like(k) for k in ks_]


def slots(pages):
    return torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)])


def allocator(seed):
    """An engine's page allocator: shuffled pages, none in two live requests."""
    free = torch.randperm(POOL_PAGES, generator=torch.Generator().manual_seed(seed)).tolist()

    def alloc(n):
        out = free[:n]
        del free[:n]
        return out
    return alloc


T0 = time.time()


def say(what):
    """A time-stamped line for the test's output when it fails."""
    print("%6.2f s %s" % (time.time() - T0, what), flush=True)


def wait_for(path, what, deadline_s=DEADLINE_S):
    end = time.time() + deadline_s
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit("sglang_engine: %s never came (%s)" % (what, path))
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def poll_until(obj, done, what, deadline_s=DEADLINE_S):
    end = time.time() + deadline_s
    while True:
        s = obj.poll()
        if s in done:
            return s
        if time.time() > end:
            sys.exit("sglang_engine: %s: still %d after %d s" % (what, s, deadline_s))
        time.sleep(0.005)


def dp_of(room, name):
    return room % INSTANCES[name]["dp_size"]


# ---- prefill ---------------------------------------------------------------------------

def prefill_rank(folder, name, server_args, engine_rank, report):
    shape = INSTANCES[name]
    attn_tp = shape["tp_size"] // shape["dp_size"]
    tp_rank, dp_rank = engine_rank % attn_tp, engine_rank // attn_tp
    local = HEADS // attn_tp
    heads = list(range(tp_rank * local, (tp_rank + 1) * local))
    kbuf, vbuf = pool(local)
    meta = metadata_buffers()
    mgr = ks.KVManager(kv_args(engine_rank, meta), DisaggregationMode.PREFILL, server_args)
    mgr.set_kv_buffer_tensors(kbuf, vbuf, PAGE)  # registers with the bootstrap server
    say("prefill %s engine rank %d registered" % (name, engine_rank))
    alloc = allocator(100 + dp_rank)  # the TP ranks of a group share page ids
    free_slot = list(range(SLOTS))
    mine = [(room, n, what) for room, (inst, n, what) in sorted(PLAN.items())
            if inst == name and dp_of(room, name) == dp_rank]
    addr = "127.0.0.1:%d" % server_args.disaggregation_bootstrap_port
    senders = {}
    for room, n, what in mine:
        s = ks.KVSender(mgr, addr, room, [tp_rank], 0)
        state = poll_until(s, (ks.KVPoll.WaitingForInput,), "sender %x bootstrap" % room)
        pages, aux_index = alloc(n), free_slot.pop(0)
        # newer sglang asks how much of the prompt the decode holds and sends
        # the pages after it: 0 here, kvstage skips the decode's prefix itself
        if s.pop_decode_prefix_len() != 0:
            raise AssertionError("pop_decode_prefix_len: %d" % s.pop_decode_prefix_len())
        s.init(n, aux_index)
        senders[room] = (s, pages, what)
        report[room] = {"first_poll": state}
    for room, (s, pages, what) in senders.items():
        if what == "held":
            continue  # a prefill that never finishes: killed while holding it
        if what == "abort":
            wait_for(os.path.join(folder, "aborted"), "the decode's abort")
        if what == "after_kill":
            wait_for(os.path.join(folder, "killed"), "the kill of B")
        # The forward pass: this rank's heads of every token of every page.
        for layer in range(LAYERS):
            for kv, buf in ((0, kbuf[layer]), (1, vbuf[layer])):
                buf.view(torch.int16)[slots(pages)] = \
                    values(tag(room), list(range(len(pages) * PAGE)), layer, kv, heads)
        ids, hidden = metadata(room)
        meta[0][s.aux_index], meta[1][s.aux_index] = ids, hidden
        for at in range(0, len(pages), CHUNK_PAGES):  # chunked prefill
            chunk = torch.tensor(pages[at:at + CHUNK_PAGES], dtype=torch.int32).numpy()
            if at + CHUNK_PAGES >= len(pages):
                # newer sglang: the last chunk carries one state index list per
                # state type of the pool: none for a plain KV pool
                s.send(chunk, state_indices=[])
            else:
                s.send(chunk)
        final = poll_until(s, (ks.KVPoll.Success, ks.KVPoll.Failed), "sender %x" % room)
        report[room]["final"] = final
        m = s.get_transfer_metric()
        report[room]["metric"] = [m.transfer_latency_s, m.transfer_total_bytes]
        say("prefill %s engine rank %d: room %x ended %d" % (name, engine_rank, room, final))
        if final == ks.KVPoll.Failed:
            try:
                s.failure_exception()
            except ks.KVTransferError as e:
                report[room]["error"] = str(e)
        s.clear()
    if any(what == "held" for _, _, what in senders.values()):
        write(os.path.join(folder, "%s.holding.%d" % (name, engine_rank)), "")
        time.sleep(DEADLINE_S * 3)  # the test kills this process
    mgr.close()


def prefill(folder, name):
    shape = INSTANCES[name]
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    server_args = types.SimpleNamespace(
        tp_size=shape["tp_size"], dp_size=shape["dp_size"],
        enable_dp_attention=shape["dp_size"] > 1, host="127.0.0.1",
        disaggregation_bootstrap_port=server.port)
    write(os.path.join(folder, name + ".port"), str(server.port))
    reports = [dict() for _ in range(shape["tp_size"])]
    errors = []

    def run(r):
        try:
            prefill_rank(folder, name, server_args, r, reports[r])
        except BaseException as e:  # noqa: B902 - report any failure of the thread
            errors.append("engine rank %d: %r" % (r, e))
    threads = [threading.Thread(target=run, args=(r,)) for r in range(shape["tp_size"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.close()
    if errors:
        sys.exit("sglang_engine prefill %s: %s" % (name, errors))
    write(os.path.join(folder, name + ".json"), json.dumps(
        [{str(k): v for k, v in r.items()} for r in reports]))


# ---- decode ---------------------------------------------------------------------------

def decode(folder):
    fetched = []
    real_fetch = ks_bootstrap.fetch_layout

    def counting_fetch(addr, timeout_s):
        fetched.append(addr)
        return real_fetch(addr, timeout_s)
    ks_bootstrap.fetch_layout = counting_fetch  # how often the decode asks a prefill
    addr = {n: "127.0.0.1:%s" % wait_for(os.path.join(folder, n + ".port"), n + "'s port")
            for n in INSTANCES}
    kbuf, vbuf = pool(HEADS)
    meta = metadata_buffers()
    server_args = types.SimpleNamespace(tp_size=1, dp_size=1, enable_dp_attention=False,
                                        host="127.0.0.1")
    mgr = ks.KVManager(kv_args(0, meta), DisaggregationMode.DECODE, server_args)
    mgr.set_kv_buffer_tensors(kbuf, vbuf, PAGE)
    say("decode rank made")
    alloc = allocator(7)
    want_k = [torch.zeros_like(k) for k in kbuf]
    want_v = [torch.zeros_like(v) for v in vbuf]
    want_meta = metadata_buffers()
    out = {"rooms": {}, "plan": {str(room): p for room, p in PLAN.items()}}
    recv = {}
    for i, (room, (name, n, what)) in enumerate(sorted(PLAN.items())):
        r = ks.KVReceiver(mgr, addr[name], room)
        first = r.poll()
        if first != ks.KVPoll.WaitingForInput:
            sys.exit("sglang_engine decode: receiver %x polled %d before init" % (room, first))
        prefix = PREFIX_PAGES.get(room, 0)  # pages the decode's own cache holds
        pages = alloc(n - prefix)
        if i % 2 == 0:  # sglang's receiver: init(kv_indices, aux_index)
            r.init(torch.tensor(pages, dtype=torch.int64).numpy(), i)
        else:  # newer sglang: init(prefill_dp_rank), then send_metadata
            r.init(prefill_dp_rank=dp_of(room, name))
            again = r.poll()
            if again != ks.KVPoll.WaitingForInput:
                sys.exit("sglang_engine decode: receiver %x polled %d after init(dp)"
                         % (room, again))
            r.send_metadata(torch.tensor(pages, dtype=torch.int32).numpy(), i, None,
                            decode_prefix_len=prefix * PAGE)
        recv[room] = (r, pages, i)
        if what in ("ok", "after_kill"):
            all_heads = list(range(HEADS))
            for layer in range(LAYERS):
                for kv, buf in ((0, want_k[layer]), (1, want_v[layer])):
                    buf.view(torch.int16)[slots(pages)] = \
                        values(tag(room), list(range(prefix * PAGE, n * PAGE)), layer, kv,
                               all_heads)
            want_meta[0][i], want_meta[1][i] = metadata(room)
    out["fetches_before_kill"] = {n: fetched.count(a) for n, a in addr.items()}
    # The abort: the request is cancelled on the decode before its prefill sent it.
    abort_room = next(room for room, p in PLAN.items() if p[2] == "abort")
    recv[abort_room][0].abort()
    write(os.path.join(folder, "aborted"), "")

    def finish(rooms, deadline_s=DEADLINE_S):
        states = {}
        end = time.time() + deadline_s
        while len(states) < len(rooms):
            for room in rooms:
                if room not in states:
                    s = recv[room][0].poll()
                    if s in (ks.KVPoll.Success, ks.KVPoll.Failed):
                        states[room] = (s, time.time())
            if time.time() > end:
                sys.exit("sglang_engine decode: rooms %s not done in %d s: %s"
                         % ([hex(r) for r in rooms if r not in states], deadline_s,
                            {hex(r): recv[r][0].poll() for r in rooms}))
            time.sleep(0.005)
        for room, (s, _) in states.items():
            entry = out["rooms"].setdefault(str(room), {})
            entry["state"] = s
            if s == ks.KVPoll.Failed:
                try:
                    recv[room][0].failure_exception()
                except ks.KVTransferError as e:
                    entry["error"] = str(e)
        return states

    say("decode: receivers initialised")
    finish([room for room, p in PLAN.items() if p[2] in ("ok", "abort")])
    say("decode: the rooms before the kill ended")
    # Refused by name, nothing opened: a DP rank the prefill does not have,
    # and state buffers (a hybrid model's) this backend does not move.
    bad = {}
    r = ks.KVReceiver(mgr, addr["A"], BASE + 97)
    r.init(prefill_dp_rank=1)
    r.send_metadata(torch.tensor(alloc(1)).numpy(), SLOTS - 2)
    r2 = ks.KVReceiver(mgr, addr["A"], BASE + 98)
    r2.init(prefill_dp_rank=0)
    r2.send_metadata(torch.tensor(alloc(1)).numpy(), SLOTS - 3,
                     [torch.tensor([5]).numpy()])
    for name, rx in (("dp", r), ("state", r2)):
        if rx.poll() != ks.KVPoll.Failed:
            sys.exit("sglang_engine decode: the %s receiver polled %d" % (name, rx.poll()))
        try:
            rx.failure_exception()
        except ks.KVTransferError as e:
            bad[name] = str(e)
        rx.clear()
    out["refused"] = bad
    for r in range(INSTANCES["B"]["tp_size"]):
        wait_for(os.path.join(folder, "B.holding.%d" % r), "B's ranks holding their rooms")
    write(os.path.join(folder, "kill_now"), "")
    killed_at = float(wait_for(os.path.join(folder, "killed"), "the kill of B"))
    say("decode: B killed")
    held = [room for room, p in PLAN.items() if p[2] == "held"]
    done = finish(held + [room for room, p in PLAN.items() if p[2] == "after_kill"])
    out["held_failed_after_s"] = max(done[room][1] for room in held) - killed_at
    # A request for the killed instance after it was found gone fails too,
    # at once, never hangs.
    late = BASE + 99
    t0 = time.time()
    r = ks.KVReceiver(mgr, addr["B"], late)
    r.init(torch.tensor(alloc(1)).numpy(), SLOTS - 1)
    recv[late] = (r, None, None)
    finish([late], deadline_s=10)
    out["late_failed_after_s"] = time.time() - t0
    out["fetches"] = {n: fetched.count(a) for n, a in addr.items()}
    mgr.close()
    # Every byte: the rooms that succeeded, and zeros everywhere else.
    for layer in range(LAYERS):
        for nm, got, want in (("K", kbuf[layer], want_k[layer]), ("V", vbuf[layer],
                                                                  want_v[layer])):
            if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                diff = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
                sys.exit("sglang_engine decode: %s layer %d differs at %d places, first "
                         "[slot, head, dim] %s" % (nm, layer, len(diff), diff[0].tolist()))
    for got, want in zip(meta, want_meta):
        if not torch.equal(got, want):
            sys.exit("sglang_engine decode: metadata differs at items %s"
                     % sorted({int(i) for i in (got != want).nonzero()[:, 0]}))
    out["checked_bytes"] = sum(k.numel() * 2 * 2 for k in kbuf)
    write(os.path.join(folder, "decode.json"), json.dumps(out))


if __name__ == "__main__":
    role, folder = sys.argv[1], sys.argv[2]
    if role == "prefill":
        prefill(folder, sys.argv[3])
    elif role == "decode":
        decode(folder)
    else:
        sys.exit("sglang_engine: role %r: give prefill or decode" % role)
