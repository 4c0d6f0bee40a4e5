"""vllm_engine.py - the processes of test_vllm_adapter.py: vLLM (v1)
prefill and decode instances as far as vLLM drives a KV connector, each
calling kvstage.vllm.KVStageConnector exactly as vLLM's scheduler, model
runner and executor do (the call order is docs/embedding.md's, "vLLM"),
over libfabric tcp on 127.0.0.1 with torch CPU KV caches
[2, num_blocks, block_size, heads, head_dim] per layer.

    vllm_engine.py prefill DIR NAME PORT   instance NAME of INSTANCES (its
        workers listen on PORT + tp rank): runs each of its requests of PLAN
        (max_tokens=1, do_remote_decode), writes the kv_transfer_params that
        request_finished returns to DIR/params.REQ (the proxy's job), and
        steps until the workers report each one sent. B holds its last
        request (request_finished, then no step) until the test kills it.
    vllm_engine.py decode DIR              one decode instance (TP 1): admits
        each request as its params appear, steps, aborts one mid-load,
        checks every byte of its caches, the load errors of the request
        whose prefill was killed and how long that took. Writes
        DIR/decode.json.

One engine step, as vLLM's (see step()): scheduler build_connector_meta;
on every worker (a thread each, as the executor's collective call)
bind_connector_metadata, start_load_kv, the forward pass with
wait_for_layer_load / save_kv_layer per layer, wait_for_save,
get_finished(finished_req_ids), clear_connector_metadata; the workers'
outputs aggregated (a request is done once every worker said so) into the
scheduler's update_connector_output.
"""
import enum
import json
import os
import sys
import threading
import time
import types

import torch

from kvstage.vllm import KVConnectorRole, KVStageConnector
from rank_pair import values
from sglang_engine import say, tag, wait_for, write

HEADS, DIM, LAYERS, BLOCK, NUM_BLOCKS = 4, 16, 2, 16, 48
INSTANCES = {"A": 2, "B": 1}  # TP
DECODE_TP = 1
# request: (instance, prompt tokens, decode's locally cached prefix, what happens)
PLAN = {"a1": ("A", 40, 0, "ok"), "a2": ("A", 100, 16, "ok"), "a3": ("A", 64, 0, "abort"),
        "a4": ("A", 33, 0, "after_kill"), "b1": ("B", 70, 0, "ok"),
        "b2": ("B", 50, 0, "held")}
DEADLINE_S = 40
LAYER_NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]

try:  # pragma: no cover - vLLM is not installed here
    from vllm.v1.request import RequestStatus
except ImportError:
    class RequestStatus(enum.Enum):
        RUNNING = 2
        FINISHED_LENGTH_CAPPED = 7
        FINISHED_ABORTED = 8


class Blocks:
    """vLLM's KVCacheBlocks as the connector reads it (one KV cache group)."""

    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


def config(role, tp, rank, engine_id, port):
    ktc = types.SimpleNamespace(
        kv_connector="KVStageConnector", kv_connector_module_path="kvstage.vllm",
        kv_role=role, kv_ip="127.0.0.1", kv_port=port, engine_id=engine_id,
        kv_connector_extra_config={"fabric": "ofi", "provider": "tcp"})
    return types.SimpleNamespace(
        kv_transfer_config=ktc,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, rank=rank),
        cache_config=types.SimpleNamespace(block_size=BLOCK))


def caches(heads):
    return [torch.zeros(2, NUM_BLOCKS, BLOCK, heads, DIM, dtype=torch.float16)
            for _ in range(LAYERS)]


def fill(cache_layers, req, blocks, first, last, heads):
    """The forward pass: K and V of tokens [first, last) of req."""
    slots = torch.tensor([b * BLOCK + i for b in blocks for i in range(BLOCK)][first:last])
    for layer, c in enumerate(cache_layers):
        flat = c.view(2, NUM_BLOCKS * BLOCK, len(heads), DIM).view(torch.int16)
        for kv in (0, 1):
            flat[kv][slots] = values(tag(hash_req(req)), list(range(first, last)), layer, kv,
                                     heads)


def hash_req(req):
    return sum(ord(c) * 131 ** i for i, c in enumerate(req))


class Engine:
    """One vLLM instance: the scheduler's connector and one per worker."""

    def __init__(self, role, tp, engine_id, port):
        self.sched = KVStageConnector(config(role, tp, 0, engine_id, port),
                                      KVConnectorRole.SCHEDULER)
        self.workers, self.caches = [], []
        for t in range(tp):
            w = KVStageConnector(config(role, tp, t, engine_id, port), KVConnectorRole.WORKER)
            c = caches(HEADS // tp)
            w.register_kv_caches(dict(zip(LAYER_NAMES, c)))
            self.workers.append(w)
            self.caches.append(c)
        self.tp = tp
        self.counts = {"sending": {}, "recving": {}}
        self.load_errors = set()

    def step(self, forward=None, finished_req_ids=()):
        """One engine step; forward(t, caches) is the model's pass on worker
        t. Returns (finished_sending, finished_recving) once every worker
        reported them."""
        meta = self.sched.build_connector_meta(types.SimpleNamespace(
            finished_req_ids=set(finished_req_ids)))
        outs = [None] * self.tp
        errors = []

        def run(t):
            try:
                w = self.workers[t]
                w.bind_connector_metadata(meta)
                w.start_load_kv(None)
                if forward is not None:
                    forward(t, self.caches[t])
                for name, c in zip(LAYER_NAMES, self.caches[t]):
                    w.wait_for_layer_load(name)
                    w.save_kv_layer(name, c, None)
                w.wait_for_save()
                outs[t] = (w.get_finished(set(finished_req_ids)),
                           w.get_block_ids_with_load_errors())
                w.clear_connector_metadata()
            except BaseException as e:  # noqa: B902 - the step fails with it
                errors.append("worker %d: %r" % (t, e))
        threads = [threading.Thread(target=run, args=(t,)) for t in range(self.tp)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            sys.exit("vllm_engine: step failed: %s" % errors)
        done = {"sending": set(), "recving": set()}
        for (sending, recving), errs in outs:
            self.load_errors |= errs
            for kind, ids in (("sending", sending), ("recving", recving)):
                for req in ids or ():
                    n = self.counts[kind][req] = self.counts[kind].get(req, 0) + 1
                    if n == self.tp:
                        done[kind].add(req)
        self.sched.update_connector_output(types.SimpleNamespace(
            finished_sending=done["sending"], finished_recving=done["recving"]))
        return done["sending"], done["recving"]

    def close(self):
        for w in self.workers:
            w.shutdown()


# ---- prefill ---------------------------------------------------------------------------

def prefill(folder, name, port):
    tp = INSTANCES[name]
    eng = Engine("kv_producer", tp, "prefill-%s-%d" % (name, os.getpid()), port)
    say("prefill %s: %d workers made" % (name, tp))
    free = list(range(NUM_BLOCKS))[::-1]
    sent, out = set(), {}

    def run_request(req_id, n):
        req = types.SimpleNamespace(request_id=req_id, prompt_token_ids=list(range(n)),
                                    kv_transfer_params={"do_remote_decode": True},
                                    status=RequestStatus.RUNNING, num_computed_tokens=0)
        got = eng.sched.get_num_new_matched_tokens(req, 0)
        assert got == (0, False), got
        blocks = [free.pop() for _ in range(-(-n // BLOCK))]
        eng.sched.update_state_after_alloc(req, Blocks(blocks), 0)
        local = HEADS // tp
        eng.step(lambda t, c: fill(c, req_id, blocks, 0, n,
                                   list(range(t * local, (t + 1) * local))))
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED  # max_tokens=1
        delay_free, params = eng.sched.request_finished(req, blocks)
        assert delay_free and params["do_remote_prefill"], (delay_free, params)
        write(os.path.join(folder, "params." + req_id), json.dumps(params))

    def step_until(reqs):
        end = time.time() + DEADLINE_S
        while not reqs <= sent:
            s, _ = eng.step()
            sent.update(s)
            if time.time() > end:
                sys.exit("vllm_engine prefill %s: %s never reported sent" % (name,
                                                                           reqs - sent))
            time.sleep(0.005)

    mine = [(r, p) for r, p in sorted(PLAN.items()) if p[0] == name]
    for req_id, (_, n, _, what) in mine:
        if what in ("held", "after_kill"):
            continue
        run_request(req_id, n)
        if what == "abort":
            wait_for(os.path.join(folder, "aborted"), "the decode's abort")
        step_until({req_id})
        say("prefill %s: %s sent" % (name, req_id))
    for req_id, (_, n, _, what) in mine:
        if what == "held":
            run_request(req_id, n)  # its params go out, its room is never opened
            write(os.path.join(folder, name + ".holding"), "")
            time.sleep(DEADLINE_S * 3)  # the test kills this process
        if what == "after_kill":
            wait_for(os.path.join(folder, "killed"), "the kill of B")
            run_request(req_id, n)
            step_until({req_id})
            say("prefill %s: %s sent after the kill" % (name, req_id))
    out["sent"] = sorted(sent)
    eng.close()
    write(os.path.join(folder, name + ".json"), json.dumps(out))


# ---- decode ----------------------------------------------------------------------------

def open_rooms(eng):
    """What a stuck decode still holds: each connector room's request,
    whether it was aborted, and its state on the rank."""
    out = []
    w = eng.workers[0]
    for room, (req_id, _, aborted) in sorted(w._rooms.items()):
        try:
            state = w.rank.state(room).name
        except Exception as e:  # noqa: B902 - said, not raised
            state = repr(e)
        out.append("%s%s: %s" % (req_id, " (aborted)" if aborted else "", state))
    return out


def decode(folder):
    eng = Engine("kv_consumer", DECODE_TP, "decode-0", 0)
    say("decode: worker made")
    free = list(range(NUM_BLOCKS))[::-1]
    want = caches(HEADS)
    heads = list(range(HEADS))
    reqs, blocks_of, recvd, freed, out = {}, {}, {}, set(), {"requests": {}}
    aborted = killed_at = None
    # under run_with_kill's 60 s per process, so a stuck run says what it
    # still waited for instead of being killed silent
    end = time.time() + DEADLINE_S + 10

    def absorb(step_out):
        sending, recving = step_out
        now = time.time()
        for rid in recving:
            recvd[rid[len("decode-"):]] = now
        freed.update(rid[len("decode-"):] for rid in sending)

    while len(recvd) + len(freed & {"a3"}) < len(PLAN):
        if time.time() > end:
            sys.exit("vllm_engine decode: not done in time: received %s, freed %s; "
                     "rooms still open %s" % (sorted(recvd), sorted(freed), open_rooms(eng)))
        for req_id, (_, n, base, what) in sorted(PLAN.items()):
            path = os.path.join(folder, "params." + req_id)
            if req_id in reqs or not os.path.exists(path):
                continue
            with open(path) as f:
                params = json.load(f)
            req = types.SimpleNamespace(request_id="decode-" + req_id,
                                        prompt_token_ids=list(range(n)),
                                        kv_transfer_params=params,
                                        status=RequestStatus.RUNNING, num_computed_tokens=base)
            blocks = [free.pop() for _ in range(-(-n // BLOCK))]
            if base:  # the locally cached prefix: already in the cache
                fill(eng.caches[0], req_id, blocks, 0, base, heads)
            got = eng.sched.get_num_new_matched_tokens(req, base)
            assert got == (n - base, True), (req_id, got)
            eng.sched.update_state_after_alloc(req, Blocks(blocks), n - base)
            reqs[req_id], blocks_of[req_id] = req, blocks
            if what in ("ok", "after_kill"):
                fill(want, req_id, blocks, 0, n, heads)
        absorb(eng.step())
        if "a3" in reqs and aborted is None and \
                reqs["a3"].kv_transfer_params["kvstage_room"] in eng.workers[0]._rooms:
            # Cancelled mid-load: the scheduler finishes it; the next step aborts it.
            req = reqs["a3"]
            req.status = RequestStatus.FINISHED_ABORTED
            delay, params = eng.sched.request_finished(req, blocks_of["a3"])
            out["abort_delay_free"] = delay
            # This step's report counts too: a3's room may end in it.
            absorb(eng.step())
            aborted = time.time()
            write(os.path.join(folder, "aborted"), "")
            say("decode: a3 aborted")
        if killed_at is None and os.path.exists(os.path.join(folder, "B.holding")) and \
                "b2" in reqs and all(r in recvd for r, p in PLAN.items()
                                     if p[3] == "ok"):
            write(os.path.join(folder, "kill_now"), "")
            killed_at = float(wait_for(os.path.join(folder, "killed"), "the kill of B"))
            say("decode: B killed")
        time.sleep(0.005)
    out["b2_failed_after_s"] = recvd["b2"] - killed_at
    out["load_errors"] = sorted(eng.load_errors)
    out["b2_blocks"] = sorted(blocks_of["b2"])
    out["received"] = sorted(recvd)
    out["freed"] = sorted(freed)
    eng.close()
    for layer in range(LAYERS):
        got, exp = eng.caches[0][layer].view(torch.int16), want[layer].view(torch.int16)
        if not torch.equal(got, exp):
            diff = (got != exp).nonzero()
            sys.exit("vllm_engine decode: layer %d differs at %d places, first [kv, block, "
                     "slot, head, dim] %s" % (layer, len(diff), diff[0].tolist()))
    out["checked_bytes"] = sum(c.numel() * 2 for c in want)
    write(os.path.join(folder, "decode.json"), json.dumps(out))


if __name__ == "__main__":
    role, folder = sys.argv[1], sys.argv[2]
    if role == "prefill":
        prefill(folder, sys.argv[3], int(sys.argv[4]))
    elif role == "decode":
        decode(folder)
    else:
        sys.exit("vllm_engine: role %r: give prefill or decode" % role)
