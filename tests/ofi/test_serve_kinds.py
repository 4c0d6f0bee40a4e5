#!/usr/bin/env python3
"""test_serve_kinds.py - `kvstage serve` moving the KV kinds beyond GQA (MLA,
two page sizes, FP8 scale planes) between two processes over libfabric (ofi tcp on
127.0.0.1, no RDMA device needed), every byte checked by the decode:

  mla_p4d2   an MLA model (--mla-latent-dim 576, 4 layers), P=4 -> D=2: one
             writer per decode rank (prefill 0 and 2), the other two prefill
             ranks silent (they report their status and write nothing)
  mla_p2d4   the same at P=2 -> D=4: each prefill rank feeds two decode ranks
  ps16_64    GQA with 16-token prefill pages and 64-token decode pages, P=2 ->
             D=1 (staging: the gather pages by 16, the scatter by 64)
  ps64_16    64-token prefill pages into 16-token decode pages, P=2 -> D=2 (the
             direct path: token runs cut at either side's page boundary)
  fp8t_p2d1  FP8 GQA with per-token scale planes (--kv-scales per-token), P=2
             -> D=1 (staging: each row's scales in the same copy and write)
  fp8b_p2d2  FP8 with per-block:16 scales and 64 -> 16-token pages, P=2 ->
             D=2 (the direct path: a run's rows, then its scale rows)
  fp8b_mla   an FP8 MLA latent with per-block scales (one scale buffer a
             layer), P=4 -> D=2
  *_swap     ps16_64 and mla_p4d2 again with the decode's planted wrong page
             mapping (--fault swap-pages: the core scatters each room into its
             first two pages swapped, the check looks where the room's list
             puts them): the decode must see corrupt bytes and exit 1, so the
             runs above cannot pass with rows in the wrong pages
  fp8t_shift fp8t_p2d1 again with the decode's planted wrong scale mapping
             (--fault shift-scales: each layer's scale buffers published as
             the next layer's, the check looks where they belong): corrupt
             bytes and exit 1, so the fp8 runs cannot pass with scales in
             the wrong buffers
  cp_*       prefill context parallelism (--prefill-cp, docs/kinds/
             context-parallel.md): each CP rank fills its KV pool for its
             own token range of each prompt only, so a row the decode gets
             from any other CP rank, or from outside the range, is corrupt.
             cp_p2d1 P2 CP2 -> D1 (staging), cp_p2d2 P2 CP2 -> D2 (the direct
             path), cp_pp P2xPP2 CP2 -> D1, cp_mla MLA P4 CP2 -> D2,
             cp_short_direct P1 CP4 -> D1 and cp_short_staging P2 CP4 -> D1
             with prompts of 3 to 20 tokens (16-token ranges: CP ranks 2 and
             3 hold nothing, rank 1 at most 4 tokens), and cp_p2d2_swap
             cp_p2d2 with the decode's wrong page mapping (must fail); both
             sides' reports name the CP size, the prefill's ranks TP x PP x CP
  hyb_*      hybrid models (docs/kinds/hybrid.md; the staging path, which
             AUTO picks for them even at equal TP): hyb_window every other
             layer a 48-token sliding window, P2 -> D1 (the decode checks
             the window's rows, which alone move); hyb_state every other
             layer a state layer of 4 state heads of 96 conv + 416 SSM
             bytes, P1 -> D2 (each decode rank checks its state heads at
             the room's state slot); hyb_state_eq P2 -> D2 with 16 -> 32
             token pages; hyb_window_swap hyb_window with the decode's
             wrong page mapping (must fail); hyb_window_cp hyb_window with
             prefill CP 2, hyb_state_cp hyb_state with prefill CP 3 and
             prompts of 3 to 120 tokens (some CP ranks hold nothing): a
             CP rank fills its range's rows, and only the one holding the
             room's last token its state; hyb_state_pp hyb_state at P2xPP2
             -> D1, hyb_window_pp_cp hyb_window at P1xPP2 CP2 -> D2 (each
             prefill stage writes its part of every writer block);
             hyb_state_draft_pp hyb_state_pp with a draft layer (after the
             last stage's state in each KV writer's block)
  rep_*      fewer KV heads than prefill ranks: rep_p8d2 4 heads, P8 -> D2
             (pairs of prefill ranks hold a head; ranks 0, 2, 4, 6 write,
             the others report), rep_p4d2_pp 1 head, P4xPP2 -> D2 (one
             writer a stage), rep_hyb_state a hybrid model of 1 KV head
             and 8 state heads, P4 -> D2 (prefill 0 and 2 write the KV head
             and their state, 1 and 3 their state alone), rep_hyb_both 2
             KV and 2 state heads, P4 -> D1 (prefill 0 and 2 write both,
             1 and 3 report); the prefill
             writes exactly the bytes the decode holds, each replicated head
             once
  draft_*    a draft model's layers (docs/kinds/draft.md; the staging path):
             draft_p2d1 one draft layer of the model's shape, P2 -> D1;
             draft_hd_p1d2 two draft layers of head dim 16, P1 -> D2;
             draft_mla_cp MLA with an MTP-like draft layer, P4 CP2 -> D2;
             draft_p2d1_swap with the decode's wrong page mapping (must fail);
             draft_pp P2 PP2 -> D1 PP1, draft_pp2 P2 PP2 -> D1 PP2 (two
             layers of head dim 16; the draft on the last stage of each
             side), draft_pp_mla MLA + MTP P2 PP2 CP2 -> D1, draft_pp2_swap
             draft_pp2 with the decode's wrong page mapping (must fail)

Each run: both processes exit 0, every room ok on both sides, the decode
verified exactly the bytes its rooms hold (bytes_expected: every token,
layer, plane and decode rank) with 0 corrupt, the prefill wrote those bytes
and no more, and its ring is empty at the end. Ports PORT.. (default
14515; ranks take PORT + s*P + t, 20 ports a run), two runs at a time.

usage: test_serve_kinds.py PATH_TO_KVSTAGE [--port PORT] [--only NAME...]
Exits 0 when every check passes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ADDR = "127.0.0.1"
COMMON = ["--fabric", "ofi", "--provider", "tcp", "--requests", "8",
          "--seed", "7", "--ring-mib", "4", "--timeout-s", "60", "--json"]
PROMPT = ["--prompt-tokens", "32:192"]  # unless a run gives its own
MLA = ["--mla-latent-dim", "576", "--layers", "4", "--page-size", "16",
       "--chunk-tokens", "64"]
GQA = ["--kv-heads", "4", "--head-dim", "32", "--layers", "2"]
HYB = ["--kv-heads", "4", "--head-dim", "32", "--layers", "4", "--page-size", "16",
       "--chunk-tokens", "32"]
FP8T = GQA + ["--dtype", "fp8", "--kv-scales", "per-token", "--page-size", "16",
              "--chunk-tokens", "64", "--prefill-tp", "2", "--decode-tp", "1"]

# name, shape flags, decode's own flags, whether the decode must fail
RUNS = [
    ("mla_p4d2", MLA + ["--prefill-tp", "4", "--decode-tp", "2"], [], False),
    ("mla_p2d4", MLA + ["--prefill-tp", "2", "--decode-tp", "4"], [], False),
    ("ps16_64", GQA + ["--page-size", "16", "--decode-page-size", "64",
                       "--chunk-tokens", "64", "--prefill-tp", "2",
                       "--decode-tp", "1"], [], False),
    ("ps64_16", GQA + ["--page-size", "64", "--decode-page-size", "16",
                       "--chunk-tokens", "64", "--prefill-tp", "2",
                       "--decode-tp", "2"], [], False),
    ("ps16_64_swap", GQA + ["--page-size", "16", "--decode-page-size", "64",
                            "--chunk-tokens", "64", "--prefill-tp", "2",
                            "--decode-tp", "1"],
     ["--fault", "swap-pages"], True),
    ("mla_p4d2_swap", MLA + ["--prefill-tp", "4", "--decode-tp", "2"],
     ["--fault", "swap-pages"], True),
    ("fp8t_p2d1", FP8T, [], False),
    ("fp8b_p2d2", GQA + ["--dtype", "fp8", "--kv-scales", "per-block:16",
                         "--page-size", "64", "--decode-page-size", "16",
                         "--chunk-tokens", "64", "--prefill-tp", "2",
                         "--decode-tp", "2"], [], False),
    ("fp8b_mla", MLA + ["--dtype", "fp8", "--kv-scales", "per-block",
                        "--prefill-tp", "4", "--decode-tp", "2"], [], False),
    ("fp8t_shift", FP8T, ["--fault", "shift-scales"], True),
    ("cp_p2d1", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                       "--decode-tp", "1", "--prefill-cp", "2"], [], False),
    ("cp_p2d2", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                       "--decode-tp", "2", "--prefill-cp", "2"], [], False),
    ("cp_pp", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                     "--prefill-pp", "2", "--decode-tp", "1", "--prefill-cp", "2"], [], False),
    ("cp_mla", MLA + ["--prefill-tp", "4", "--decode-tp", "2", "--prefill-cp", "2"], [],
     False),
    ("cp_short_direct", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp",
                               "1", "--decode-tp", "1", "--prefill-cp", "4",
                               "--prompt-tokens", "3:20"], [], False),
    ("cp_short_staging", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp",
                                "2", "--decode-tp", "1", "--prefill-cp", "4",
                                "--prompt-tokens", "3:20"], [], False),
    ("cp_p2d2_swap", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                            "--decode-tp", "2", "--prefill-cp", "2"],
     ["--fault", "swap-pages"], True),
    # Fewer KV heads than prefill ranks: each head written once.
    ("rep_p8d2", ["--kv-heads", "4", "--head-dim", "32", "--layers", "2", "--page-size", "16",
                  "--chunk-tokens", "64", "--prefill-tp", "8", "--decode-tp", "2"], [], False),
    ("rep_p4d2_pp", ["--kv-heads", "1", "--head-dim", "32", "--layers", "3", "--page-size",
                     "16", "--chunk-tokens", "64", "--prefill-tp", "4", "--decode-tp", "2",
                     "--prefill-pp", "2"], [], False),
    ("rep_hyb_state", ["--kv-heads", "1", "--head-dim", "32", "--layers", "4", "--page-size",
                       "16", "--chunk-tokens", "64", "--full-attn-every", "2", "--state-heads",
                       "8", "--state-bytes", "96+416", "--prefill-tp", "4", "--decode-tp",
                       "2"], [], False),
    ("rep_hyb_both", ["--kv-heads", "2", "--head-dim", "32", "--layers", "4", "--page-size",
                      "16", "--chunk-tokens", "64", "--full-attn-every", "2", "--state-heads",
                      "2", "--state-bytes", "96+416", "--prefill-tp", "4", "--decode-tp",
                      "1"], [], False),
    # Hybrid models (docs/kinds/hybrid.md), on the staging path.
    ("hyb_window", HYB + ["--full-attn-every", "2", "--window", "48", "--prefill-tp", "2",
                          "--decode-tp", "1"], [], False),
    ("hyb_state", HYB + ["--full-attn-every", "2", "--state-heads", "4", "--state-bytes",
                         "96+416", "--prefill-tp", "1", "--decode-tp", "2"], [], False),
    ("hyb_state_eq", HYB + ["--full-attn-every", "3", "--state-heads", "2", "--state-bytes",
                            "600", "--prefill-tp", "2", "--decode-tp", "2",
                            "--decode-page-size", "32"], [], False),
    ("hyb_window_swap", HYB + ["--full-attn-every", "2", "--window", "48", "--prefill-tp",
                               "2", "--decode-tp", "1"], ["--fault", "swap-pages"], True),
    # Hybrid models with prefill CP: each CP rank its range's rows, the
    # state from the CP rank of the last token alone.
    ("hyb_window_cp", HYB + ["--full-attn-every", "2", "--window", "48", "--prefill-tp", "2",
                             "--decode-tp", "1", "--prefill-cp", "2"], [], False),
    ("hyb_state_cp", HYB + ["--full-attn-every", "2", "--state-heads", "4", "--state-bytes",
                            "96+416", "--prefill-tp", "1", "--decode-tp", "2",
                            "--prefill-cp", "3", "--prompt-tokens", "3:120"], [], False),
    # Hybrid models with prefill PP into a decode of PP 1: each prefill
    # stage writes its part of each writer block, one span.
    ("hyb_state_pp", HYB + ["--full-attn-every", "2", "--state-heads", "4", "--state-bytes",
                            "96+416", "--prefill-tp", "2", "--decode-tp", "1",
                            "--prefill-pp", "2"], [], False),
    ("hyb_window_pp_cp", HYB + ["--full-attn-every", "2", "--window", "48", "--prefill-tp",
                                "1", "--decode-tp", "2", "--prefill-pp", "2",
                                "--prefill-cp", "2"], [], False),
    # A hybrid model with a draft (Qwen3-Next and its MTP layer): the
    # draft's part ends each KV writer's block, after the state.
    ("hyb_state_draft_pp", HYB + ["--full-attn-every", "2", "--state-heads", "4",
                                  "--state-bytes", "96+416", "--prefill-tp", "2",
                                  "--decode-tp", "1", "--prefill-pp", "2",
                                  "--draft-layers", "1"], [], False),
    # A draft model's layers (docs/kinds/draft.md), on the staging path.
    ("draft_p2d1", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                          "--decode-tp", "1", "--draft-layers", "1"], [], False),
    ("draft_hd_p1d2", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp",
                             "1", "--decode-tp", "2", "--draft-layers", "2",
                             "--draft-head-dim", "16"], [], False),
    ("draft_mla_cp", MLA + ["--prefill-tp", "4", "--decode-tp", "2", "--prefill-cp", "2",
                            "--draft-layers", "1"], [], False),
    ("draft_p2d1_swap", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp",
                               "2", "--decode-tp", "1", "--draft-layers", "1"],
     ["--fault", "swap-pages"], True),
    # ... with PP: the draft on the last stage of each side.
    ("draft_pp", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                        "--prefill-pp", "2", "--decode-tp", "1", "--draft-layers", "1"],
     [], False),
    ("draft_pp2", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp", "2",
                         "--prefill-pp", "2", "--decode-tp", "1", "--decode-pp", "2",
                         "--draft-layers", "2", "--draft-head-dim", "16"], [], False),
    ("draft_pp_mla", MLA + ["--prefill-tp", "2", "--prefill-pp", "2", "--prefill-cp", "2",
                            "--decode-tp", "1", "--draft-layers", "1"], [], False),
    ("draft_pp2_swap", GQA + ["--page-size", "16", "--chunk-tokens", "64", "--prefill-tp",
                              "2", "--prefill-pp", "2", "--decode-tp", "1", "--decode-pp",
                              "2", "--draft-layers", "1"], ["--fault", "swap-pages"], True),
]


def flag(shape, name, default):
    """The value of flag name in shape, as an int, or default."""
    return int(shape[shape.index(name) + 1]) if name in shape else default


def run(kvstage, work, name, port, shape, dflags, planted, say):
    t0 = time.monotonic()
    out = {}
    common = COMMON + ([] if "--prompt-tokens" in shape else PROMPT)
    with open(os.path.join(work, name + ".prefill.json"), "w") as pj, \
            open(os.path.join(work, name + ".prefill.err"), "w") as pe:
        prefill = subprocess.Popen(
            [kvstage, "serve", "--role", "prefill", "--listen",
             "%s:%d" % (ADDR, port)] + shape + common, stdout=pj, stderr=pe)
        d = subprocess.run(
            [kvstage, "serve", "--role", "decode", "--peer", "%s:%d" % (ADDR, port)]
            + shape + common + dflags, capture_output=True, text=True, timeout=120)
        try:
            prc = prefill.wait(timeout=60)
        except subprocess.TimeoutExpired:
            prefill.kill()
            prc = prefill.wait()
    drc = d.returncode
    with open(os.path.join(work, name + ".prefill.json")) as f:
        ptext = f.read()
    with open(os.path.join(work, name + ".prefill.err")) as f:
        perr = f.read()
    say("test_serve_kinds: %s: prefill exit %d, decode exit %d, %.1f s"
        % (name, prc, drc, time.monotonic() - t0))
    bad = []
    try:
        out["prefill"] = json.loads(ptext)
        out["decode"] = json.loads(d.stdout)
    except ValueError:
        bad.append("no JSON report (prefill %r, decode %r)" % (ptext[:200], d.stdout[:200]))
    if bad:
        pass
    elif planted:
        dec = out["decode"]
        what = "scales shifted a layer" if "shift-scales" in dflags else "pages swapped"
        if drc != 1:
            bad.append("decode exit %d with its %s, not 1" % (drc, what))
        if "swap-pages" in dflags and dec["swapped_rooms"] == 0:
            bad.append("no room was given swapped pages: the check proves nothing")
        if dec["corrupt_bytes"] == 0:
            bad.append("bytes moved with the decode's %s were not seen as corrupt" % what)
        if dec["pass"]:
            bad.append("decode passed with its %s" % what)
        if prc != 0:
            bad.append("prefill exit %d (its side moved every room)" % prc)
    else:
        if prc != 0 or drc != 0:
            bad.append("exit codes %d/%d" % (prc, drc))
        for side in ("prefill", "decode"):
            r = out[side]
            if r["requests_ok"] != r["requests"] or r["requests_failed"] != 0 \
                    or r["requests_unfinished"] != 0 or not r["pass"]:
                bad.append("%s: %d ok of %d, %d failed, %d unfinished, pass %s"
                           % (side, r["requests_ok"], r["requests"], r["requests_failed"],
                              r["requests_unfinished"], r["pass"]))
        dec = out["decode"]
        if dec["corrupt_bytes"] != 0 or dec["bytes_verified"] == 0 \
                or dec["bytes_verified"] != dec["bytes_expected"]:
            bad.append("decode verified %d of %d bytes, %d corrupt"
                       % (dec["bytes_verified"], dec["bytes_expected"], dec["corrupt_bytes"]))
        if dec["ring_live_bytes"] != 0:
            bad.append("decode: %d ring bytes live at the end (leaked)" % dec["ring_live_bytes"])
        # Each byte the decode holds is written once: with replicated KV
        # heads (rep_*) only the first of the ranks holding a head writes
        # it; a hybrid model's other ranks write their state alone. (No run
        # here has fewer state heads than prefill ranks, whose replicas
        # would each write: docs/kinds/hybrid.md.)
        wrote = out["prefill"]["payload_bytes"]
        if wrote != dec["bytes_expected"]:
            bad.append("prefill wrote %d payload bytes for the %d the decode holds"
                       % (wrote, dec["bytes_expected"]))
    if not bad:
        # Both sides name the prefill's CP size; the prefill runs TP x PP x CP ranks.
        cp = flag(shape, "--prefill-cp", 1)
        want = flag(shape, "--prefill-tp", 2) * flag(shape, "--prefill-pp", 1) * cp
        for side in ("prefill", "decode"):
            r = out[side]
            if r["prefill_cp"] != cp or r["instances"][0]["cp"] != cp:
                bad.append("%s: prefill_cp %d, instance cp %d, not %d"
                           % (side, r["prefill_cp"], r["instances"][0]["cp"], cp))
        if out["prefill"]["ranks"] != want:
            bad.append("prefill ran %d ranks, not %d" % (out["prefill"]["ranks"], want))
    if bad:
        say("  prefill: " + ptext.strip())
        say("  decode: " + d.stdout.strip())
        for line in (perr + d.stderr).splitlines():
            say("  stderr: " + line)
    say("  " + ("; ".join(bad) if bad else "ok"))
    return not bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvstage")
    ap.add_argument("--port", type=int, default=14515)
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args()
    chosen = [(k, r) for k, r in enumerate(RUNS) if not a.only or r[0] in a.only]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        def one(k, name, shape, dflags, planted):
            lines = []
            # 20 ports a run: its ranks' (at most 4 here) and room to spare.
            ok = run(a.kvstage, work, name, a.port + 20 * k, shape, dflags, planted,
                     lines.append)
            results[k] = (ok, lines)
        # Two runs at a time (each process mostly waits: start-up, the
        # fabric's connection, the linger), each run's lines kept together.
        for i in range(0, len(chosen), 2):
            threads = [threading.Thread(target=one, args=(k,) + tuple(r))
                       for k, r in chosen[i:i + 2]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    failed = 0
    for k, _ in chosen:
        ok, lines = results.get(k, (False, ["test_serve_kinds: run %d did not report" % k]))
        print("\n".join(lines))
        failed += not ok
    print("test_serve_kinds: %d of %d runs failed" % (failed, len(chosen)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
