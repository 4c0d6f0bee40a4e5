"""rank_example.py - embedding kvstage in an engine, in Python: a prefill
rank and a decode rank (in one process here; an engine runs each in its own
process, on its own GPU) over torch tensors as their KV pools, one request
with an aux payload, every byte checked. Needs an RDMA device (soft-RoCE
will do) and KVS_VERBS_ADDR set to its local IP; run by ctest's
examples_rxe inside the rxe VM.

    KVS_VERBS_ADDR=192.0.2.1 python3 docs/examples/rank_example.py
"""

import os
import time

import torch

import kvstage

LAYERS, HEADS, DIM, PAGE, POOL_PAGES = 2, 8, 64, 16, 64


def kv_pool():
    """An sglang-style pool: per layer, K and V of [tokens, heads, head_dim]."""
    ks = [torch.zeros(POOL_PAGES * PAGE, HEADS, DIM, dtype=torch.bfloat16)
          for _ in range(LAYERS)]
    return ks, [torch.zeros_like(k) for k in ks]


def main():
    common = dict(page_size=PAGE, total_heads=HEADS, tp_size=1, peer_tp_size=1,
                  max_aux_bytes=256, ring_bytes=32 << 20,
                  bind_addr=os.environ.get("KVS_VERBS_ADDR"))
    pk, pv = kv_pool()
    dk, dv = kv_pool()
    with kvstage.Rank("prefill", k_buffers=pk, v_buffers=pv, **common) as prefill, \
            kvstage.Rank("decode", k_buffers=dk, v_buffers=dv, **common) as decode:
        # Driver threads move the bytes from now on. The prefill must be
        # progressing before the decode connects: connecting waits for it to
        # accept (here in one process; an engine runs each in its own).
        prefill.start()
        decode.start()
        # The decode learns the prefill instance 0 (in an engine: from the
        # bootstrap server) and connects ahead of the first request.
        decode.add_instance(0, [prefill.address])
        decode.connect(0)

        # One request of 150 tokens; the allocators chose these pages.
        tokens = 150
        ppages = torch.tensor([5, 17, 2, 40, 33, 8, 61, 12, 9, 50])
        dpages = torch.tensor([1, 3, 60, 22, 47, 19, 30, 6, 55, 14])
        slot = lambda pages: pages[torch.arange(tokens) // PAGE] * PAGE \
            + torch.arange(tokens) % PAGE
        g = torch.Generator().manual_seed(0)
        for layer in range(LAYERS):  # the forward pass writes the prefill pool
            pk[layer][slot(ppages)] = torch.randn(tokens, HEADS, DIM, generator=g).bfloat16()
            pv[layer][slot(ppages)] = torch.randn(tokens, HEADS, DIM, generator=g).bfloat16()

        decode.open_room(7, dpages, total_tokens=tokens, peer=0)
        prefill.open_room(7, ppages, total_tokens=tokens, peer=0)
        prefill.set_aux(7, b"first token 1734")
        prefill.computed(7, tokens, final=True)

        results = {}
        deadline = time.time() + 120
        while len(results) < 2 and time.time() < deadline:
            for role, rank in (("prefill", prefill), ("decode", decode)):
                for r in rank.poll():
                    results[role] = r
            time.sleep(0.01)
        assert set(results) == {"prefill", "decode"}, "room 7 not done: %s" % (
            decode.state(7),)
        got = results["decode"]
        assert got.ok and got.state == kvstage.RoomState.SUCCESS, got
        assert got.aux == b"first token 1734", got.aux
        for layer in range(LAYERS):
            assert torch.equal(dk[layer][slot(dpages)], pk[layer][slot(ppages)])
            assert torch.equal(dv[layer][slot(dpages)], pv[layer][slot(ppages)])
        print("rank_example.py: room 7 moved %d bytes, aux %r, stats %s"
              % (got.bytes, got.aux, {k: v for k, v in decode.stats().items()
                                      if k in ("rooms_ok", "copies", "msgs_received")}))


if __name__ == "__main__":
    main()
