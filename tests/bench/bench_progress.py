"""bench_progress.py - what a Python engine pays for driving kvstage from
its own loop: Rank.progress() (a ctypes call into kvs_driver_progress)
against a C loop of kvs_driver_progress on the same driver, side by side
in one process, on a connected prefill/decode pair (verbs fabric, host
device, torch CPU tensors). Two cases: idle (nothing to do: the pure call
cost a loop pays between requests) and busy (rooms in flight, each step
moving chunks). Rounds alternate Python and C; medians and the ratio are
printed. A benchmark, never a test: nothing is asserted on the figures.

    KVS_VERBS_ADDR=<ip> KVSTAGE_LIBRARY=build-release/libkvstage_sim.so \\
      python3 tests/bench/bench_progress.py build-release/kvs_bench_progress.so
(tests/rxe/run-in-vm.sh runs it where there is no RDMA device.)
"""

import ctypes
import os
import statistics
import sys
import time

import torch

import kvstage

PAGE, HEADS, DIM, LAYERS, POOL_PAGES = 16, 8, 128, 4, 512
ROUNDS, CALLS = 7, 20000


def pool():
    ks = [torch.zeros(POOL_PAGES * PAGE, HEADS, DIM, dtype=torch.float16)
          for _ in range(LAYERS)]
    return ks, [torch.zeros_like(k) for k in ks]


def python_loop(rank, n):
    progress = rank.progress
    t = time.perf_counter_ns()
    for _ in range(n):
        progress()
    return (time.perf_counter_ns() - t) / n


def main():
    loop = ctypes.CDLL(sys.argv[1]).kvs_bench_progress_loop
    loop.restype = ctypes.c_double
    loop.argtypes = [ctypes.c_void_p, ctypes.c_long]
    common = dict(page_size=PAGE, total_heads=HEADS, ring_bytes=64 << 20,
                  chunk_tokens=256, bind_addr=os.environ.get("KVS_VERBS_ADDR"))
    pk, pv = pool()
    dk, dv = pool()
    with kvstage.Rank("prefill", k_buffers=pk, v_buffers=pv, **common) as pre, \
            kvstage.Rank("decode", k_buffers=dk, v_buffers=dv, **common) as dec:
        dec.start()  # the decode on its thread; the prefill is the measured loop
        pre.start()  # while the decode connects (it waits for the accept)
        dec.add_instance(0, [pre.address])
        dec.connect(0)
        end = time.time() + 60
        while dec.peers_ready < 1 and time.time() < end:
            time.sleep(0.01)
        pre.stop()
        print("bench_progress: %d calls per round, %d rounds, median ns per call"
              % (CALLS, ROUNDS))
        room = 0
        for case in ("idle", "busy"):
            py, c = [], []
            for _ in range(ROUNDS):
                for measure, out in ((lambda: python_loop(pre, CALLS), py),
                                     (lambda: loop(pre._drv, CALLS), c)):
                    if case == "busy":  # rooms of 2048 tokens in flight
                        for _ in range(4):
                            room += 1
                            pages = list(range((room % 4) * 128, (room % 4) * 128 + 128))
                            dec.open_room(room, pages)
                            pre.open_room(room, pages)
                            pre.computed(room, 128 * PAGE, final=True)
                    ns = measure()
                    if ns < 0:
                        sys.exit("bench_progress: progress failed: %s"
                                 % kvstage.status_name(int(ns)))
                    out.append(ns)
                    while case == "busy" and (dec.stats()["rooms_ok"] +
                                              dec.stats()["rooms_failed"]) < room:
                        pre.progress()
                    pre.poll()
                    dec.poll()
            mp, mc = statistics.median(py), statistics.median(c)
            print("  %-5s python %8.0f ns   C %8.0f ns   python / C %.2f"
                  % (case, mp, mc, mp / mc))
        print("  rooms moved in the busy case: %d, all ok: %s"
              % (room, dec.stats()["rooms_failed"] == 0))


if __name__ == "__main__":
    main()
