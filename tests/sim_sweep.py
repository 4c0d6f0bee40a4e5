#!/usr/bin/env python3
"""sim_sweep.py - random simulator scenarios that must all end clean.

Draws N random valid configurations (shapes, TP/PP with layers split over
the stages evenly or not, replicated heads both ways, page and chunk sizes,
ring sizes down to one chunk, cached prefixes, loads, paths) from a seeded
generator, runs `kvstage sim --json` on each and
requires requests_ok == requests_total, corrupt_bytes == 0 and
ring_leaked_bytes == 0. Prints every failing command so it replays, and a
closing line "sim_sweep: N passed, M failed".

usage: sim_sweep.py PATH_TO_KVSTAGE [--runs N] [--seed S]
"""
import argparse
import json
import random
import subprocess
import sys


def pick_config(rng):
    heads = rng.choice([1, 2, 4, 8])
    tps = [1, 2, 4, 8]
    p = rng.choice(tps)
    d = rng.choice(tps)
    pp = rng.choice([1, 1, 2, 3])
    dp = rng.choice([1, pp])
    # Even splits over the stages, or uneven ones (spec §4).
    layers = rng.choice([2, 4]) * pp + rng.randrange(pp)
    ps = rng.choice([1, 4, 16])
    chunk = ps * rng.choice([4, 8, 32])
    head_dim = rng.choice([16, 64])
    dtype = rng.choice(["bf16", "fp16", "fp8", "fp32"])
    lo = rng.randint(1, 200)
    hi = lo + rng.randint(0, 600)
    # The largest region: a full chunk of every head a decode rank holds,
    # from every TP writer (replicated heads are written once per writer).
    writers = p // d if p > d else 1
    nh = max(1, heads // p) if p > d else max(1, heads // d)
    elem = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}[dtype]
    region = chunk * nh * writers * head_dim * elem * -(-layers // dp) * 2
    ring_mib = max(1, -(-region * rng.choice([1, 2, 3, 8]) // (1 << 20)))
    path = rng.choice(["auto", "auto", "staging", "slice"] + (["direct"] if p == d else []))
    args = ["sim", "--kv-heads", str(heads), "--head-dim", str(head_dim),
            "--layers", str(layers), "--dtype", dtype, "--page-size", str(ps),
            "--chunk-tokens", str(chunk), "--prefill-tp", str(p), "--decode-tp", str(d),
            "--prefill-pp", str(pp), "--decode-pp", str(dp),
            "--requests", str(rng.randint(1, 12)), "--prompt-tokens", "%d:%d" % (lo, hi),
            "--rate", rng.choice(["0", "50", "500"]), "--ring-mib", str(ring_mib),
            "--max-inflight", str(rng.randint(1, 8)), "--path", path,
            "--seed", str(rng.randint(0, 1 << 32)), "--json"]
    if rng.random() < 0.4:
        args += ["--prefix-tokens", str(rng.randint(0, lo))]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvstage")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    opt = ap.parse_args()
    rng = random.Random(opt.seed)
    passed = failed = 0
    for _ in range(opt.runs):
        args = pick_config(rng)
        cmd = [opt.kvstage] + args
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        why = None
        try:
            out = json.loads(res.stdout)
            if out["requests_ok"] != out["requests_total"]:
                why = "%d of %d requests failed" % (out["requests_failed"], out["requests_total"])
            elif out["corrupt_bytes"] != 0:
                why = "%d corrupt bytes" % out["corrupt_bytes"]
            elif out["ring_leaked_bytes"] != 0:
                why = "%d ring bytes leaked" % out["ring_leaked_bytes"]
            elif out["violations"] != 0:
                why = "%d invariant violations (%d hung, %d unreported)" % (
                    out["violations"], out["hung_requests"], out["unreported_failures"])
            elif res.returncode != 0:
                why = "exit %d" % res.returncode
        except (ValueError, KeyError) as exc:
            why = "exit %d, no JSON (%s): %s" % (res.returncode, exc, res.stderr.strip()[-300:])
        if why is None:
            passed += 1
        else:
            failed += 1
            print("FAIL %s\n  replay: %s" % (why, " ".join(cmd)))
    print("sim_sweep: %d passed, %d failed (seed %d)" % (passed, failed, opt.seed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
