#!/usr/bin/env python3
"""bench_ofi.py - `kvstage serve` over the libfabric fabric on loopback,
against the best references on the same provider measured in the same run,
and the simulator's prediction from a link model fitted to the provider
(issue 16, item 4; docs/performance.md, "libfabric on loopback").

Not a test: a benchmark run by hand from an optimised build on a quiet
machine. Per repetition and provider (tcp, shm), one after the other:
- fi_pingpong (libfabric-bin) over rdm endpoints of the provider at
  64 B .. 4 MiB: the provider's own message path, one message in flight;
- iperf3 (tcp only): one TCP stream on 127.0.0.1, the kernel's loopback
  bound;
- a two-process `kvstage serve` (prefill TP 2 -> decode TP 1, 8 KV heads of
  128, bf16, 4 layers, page 16, 128-token chunks: every write 1 MiB;
  REQUESTS prompts of TOKENS tokens), every byte verified by the decode;
  then the same with --no-verify: the transfer alone, no pattern made or
  checked.
Then, per provider, the median of each figure, the ratios, and the link
model fitted on the medians of fi_pingpong (time per message = latency +
per-op + bytes / rate; latency the 64-byte time, per-op what is left of the
fit's intercept) with `kvstage sim`'s prediction of the same transfer.

usage: bench_ofi.py [--kvstage build-release/kvstage] [--reps 3]
                    [--providers tcp,shm] [--requests 32] [--tokens 1024]
                    [--port 15000] [--out DIR]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = (64, 4096, 65536, 1048576, 4194304)
ADDR = "127.0.0.1"


def shape(requests, tokens):
    return ["--kv-heads", "8", "--head-dim", "128", "--layers", "4", "--page-size", "16",
            "--chunk-tokens", "128", "--prefill-tp", "2", "--decode-tp", "1",
            "--requests", str(requests), "--prompt-tokens", "%d:%d" % (tokens, tokens),
            "--seed", "1", "--ring-mib", "16"]


class Ports:
    """Fresh ports below Linux's ephemeral range, one per server."""

    def __init__(self, base):
        self.next = base

    def take(self, n=1):
        p = self.next
        self.next += n
        return p


def pingpong(prov, size, port):
    """fi_pingpong: seconds per message of `size` bytes (one way)."""
    iters = max(20, min(2000, (64 << 20) // size))
    args = ["fi_pingpong", "-p", prov, "-e", "rdm", "-I", str(iters), "-S", str(size)]
    srv = subprocess.Popen(args + ["-B", str(port)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    cli = subprocess.run(args + ["-P", str(port), ADDR], capture_output=True, text=True,
                         timeout=120)
    try:
        srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
    # "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"
    for line in cli.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0] != "bytes" and re.fullmatch(r"[0-9.]+", f[6]):
            return float(f[6]) * 1e-6
    sys.exit("bench_ofi: fi_pingpong -p %s -S %d gave no result:\n%s%s" %
             (prov, size, cli.stdout, cli.stderr))


def iperf3(port):
    """One TCP stream on loopback for 3 s: bytes/s received."""
    srv = subprocess.Popen(["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = subprocess.run(["iperf3", "-c", ADDR, "-p", str(port), "-t", "3", "-J"],
                         capture_output=True, text=True, timeout=60)
    srv.wait(timeout=30)
    return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8


def serve(kvstage, prov, port, args, out, verify=True):
    """Two serve processes; the decode's and the prefill's JSON reports.
    verify False: --no-verify, the transfer alone (no pattern made or
    checked)."""
    flags = shape(args.requests, args.tokens) + ["--fabric", "ofi", "--provider", prov,
                                                 "--timeout-s", "300", "--json"]
    if not verify:
        flags.append("--no-verify")
    with open(os.path.join(out, "prefill.err"), "w") as perr:
        pre = subprocess.Popen([kvstage, "serve", "--role", "prefill", "--listen",
                                "%s:%d" % (ADDR, port)] + flags, stdout=subprocess.PIPE,
                               stderr=perr, text=True)
        dec = subprocess.run([kvstage, "serve", "--role", "decode", "--peer",
                              "%s:%d" % (ADDR, port)] + flags, capture_output=True,
                             text=True, timeout=400)
        pout = pre.communicate(timeout=60)[0]
    if dec.returncode != 0 or pre.returncode != 0:
        sys.exit("bench_ofi: serve over %s exited %d/%d:\n%s" %
                 (prov, pre.returncode, dec.returncode, dec.stderr[-2000:]))
    d, p = json.loads(dec.stdout), json.loads(pout)
    if not d["pass"] or d["corrupt_bytes"] or \
            (verify and d["bytes_verified"] != d["bytes_expected"]):
        sys.exit("bench_ofi: serve over %s did not pass: %s" % (prov, dec.stdout))
    return d, p


def fit(times):
    """Least squares on relative error: t(s) = a + s / b; (a, b) in s, B/s."""
    pts = [(s, t) for s, t in times.items() if s > 64]
    w = [1 / (t * t) for _, t in pts]
    W = sum(w)
    sx = sum(wi * s for wi, (s, _) in zip(w, pts))
    sy = sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx = sum(wi * s * s for wi, (s, _) in zip(w, pts))
    sxy = sum(wi * s * t for wi, (s, t) in zip(w, pts))
    slope = (W * sxy - sx * sy) / (W * sxx - sx * sx)
    icpt = (sy - slope * sx) / W
    if icpt < 0 or slope <= 0:
        icpt, slope = 0.0, sxy / sxx
    return icpt, 1 / slope


def simulate(kvstage, args, per_op_ns, rate, latency_ns):
    cmd = [kvstage, "sim"] + shape(args.requests, args.tokens) + [
        "--max-inflight", "4", "--rate", "1000000", "--prefill-tokens-per-s", str(1 << 40),
        "--link-bytes-per-s", str(int(rate)), "--per-op-ns", str(max(1, int(per_op_ns))),
        "--latency-ns", str(int(latency_ns)), "--data", "provenance", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout), cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvstage", default="build-release/kvstage")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--providers", default="tcp,shm")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--port", type=int, default=15000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    kvstage = os.path.abspath(args.kvstage)
    out = args.out or tempfile.mkdtemp(prefix="bench_ofi.")
    os.makedirs(out, exist_ok=True)
    provs = args.providers.split(",")
    ports = Ports(args.port)
    print("bench_ofi: load before: %s" % open("/proc/loadavg").read().strip())
    res = {p: {"pp": {s: [] for s in SIZES}, "iperf": [], "wall": [], "check": [],
               "bare": [], "moved": 0, "writes": 0, "retrans": []} for p in provs}
    for rep in range(1, args.reps + 1):
        for prov in provs:
            r = res[prov]
            for s in SIZES:
                r["pp"][s].append(pingpong(prov, s, ports.take()))
            if prov == "tcp":
                r["iperf"].append(iperf3(ports.take()))
            d, p = serve(kvstage, prov, ports.take(4), args, out)
            r["wall"].append(d["wall_s"])
            r["check"].append(d["pattern_s"])
            r["moved"], r["writes"] = d["bytes_verified"], p["rdma_writes"]
            r["retrans"].append(d["msgs_retransmitted"] + p["msgs_retransmitted"])
            bare, _ = serve(kvstage, prov, ports.take(4), args, out, verify=False)
            r["bare"].append(bare["wall_s"])
            print("rep %d %s: fi_pingpong 1 MiB %.0f MB/s, 4 MiB %.0f MB/s%s; serve %.3f s "
                  "(checking %.3f s), %.0f MB/s, %d control messages sent again; "
                  "--no-verify %.3f s, %.0f MB/s" %
                  (rep, prov, 1048576 / r["pp"][1048576][-1] / 1e6,
                   4194304 / r["pp"][4194304][-1] / 1e6,
                   ", iperf3 %.0f MB/s" % (r["iperf"][-1] / 1e6) if r["iperf"] else "",
                   d["wall_s"], d["pattern_s"], d["bytes_verified"] / d["wall_s"] / 1e6,
                   r["retrans"][-1], bare["wall_s"], bare["payload_bytes"] / bare["wall_s"] / 1e6),
                  flush=True)
    print("bench_ofi: load after: %s" % open("/proc/loadavg").read().strip())
    for prov in provs:
        r = res[prov]
        med = {s: statistics.median(v) for s, v in r["pp"].items()}
        wall = statistics.median(r["wall"])
        serve_bps = r["moved"] / wall
        best_pp = max(s / t for s, t in med.items())
        print("\n== %s (medians of %d reps; MB = 1e6 bytes)" % (prov, args.reps))
        print("fi_pingpong: " + ", ".join("%s %.1f MB/s (%.1f us)" %
                                          (s, s / t / 1e6, t * 1e6) for s, t in med.items()))
        print("serve: %d bytes verified in %.3f s (checking %.3f s of it): %.1f MB/s, "
              "%d writes" % (r["moved"], wall, statistics.median(r["check"]),
                             serve_bps / 1e6, r["writes"]))
        print("serve / fi_pingpong (best size): %.2f" % (serve_bps / best_pp))
        print("serve / fi_pingpong 1 MiB (serve's write size): %.2f" %
              (serve_bps / (1048576 / med[1048576])))
        bare_bps = r["moved"] / statistics.median(r["bare"])
        print("serve --no-verify (the transfer alone): %.3f s, %.1f MB/s; / fi_pingpong "
              "1 MiB: %.2f" % (statistics.median(r["bare"]), bare_bps / 1e6,
                               bare_bps / (1048576 / med[1048576])))
        if r["iperf"]:
            ip = statistics.median(r["iperf"])
            print("iperf3: %.1f MB/s; serve / iperf3: %.2f; --no-verify / iperf3: %.2f"
                  % (ip / 1e6, serve_bps / ip, bare_bps / ip))
        icpt, rate = fit(med)
        latency = med[64]
        per_op = max(0.0, icpt - latency)
        sim, cmd = simulate(kvstage, args, per_op * 1e9, rate, latency * 1e9)
        predicted = sim["sim_ns"] / 1e9
        print("link model (fi_pingpong fit): link_bytes_per_s %.0f, per_op_ns %.0f, "
              "latency_ns %.0f" % (rate, per_op * 1e9, latency * 1e9))
        print("  %s" % " ".join(cmd))
        print("sim predicts %.3f s for the transfer (%d ok); measured median %.3f s: "
              "measured / predicted %.2f" % (predicted, sim["requests_ok"], wall,
                                             wall / predicted))
    print("\nresults in %s" % out)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
