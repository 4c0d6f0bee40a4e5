#!/usr/bin/env python3
"""cli_serve.py - the flags of `kvstage serve` that are refused before any
RDMA device is touched (so it runs anywhere serve is built): the help names
the pipeline flags, and every class of bad input, the TP x PP layouts
included, exits 2 with exactly one stderr line naming the flag to change.
The instance flags (--instance, --instances, --prefill-instance,
--expect-lost, --fault hold-from) and the per-rank device lists (--device,
--device-near-gpu) are refused the same way; a --device-near-gpu entry that
is no bus id is refused by each rank's verbs fabric before it looks for a
device, which shows which entry each rank took. What a run does over RDMA
is tests/rxe/test_serve.sh.

usage: cli_serve.py PATH_TO_KVSTAGE
Prints one line per failure and a summary "cli_serve: N passed, M failed";
exits 1 when anything failed. Python 3 standard library only.
"""

import sys

from cli_suite import Suite

SHAPE = ["--kv-heads", "4", "--head-dim", "32", "--layers", "4"]
DECODE = ["serve", "--role", "decode", "--peer", "192.0.2.1:18515"] + SHAPE
PREFILL = ["serve", "--role", "prefill", "--listen", "192.0.2.1:18515"] + SHAPE
# A decode of two prefill instances, TP 2 and TP 1.
CLUSTER = ["serve", "--role", "decode", "--prefill-instance",
           "0=192.0.2.1:18515,2", "--prefill-instance=1=192.0.2.1:18525,1"
           ] + SHAPE
INST = "--prefill-instance"


def test_help(s):
    s.expect_ok("serve --help", ["serve", "--help"],
                ["usage: kvstage serve", "--prefill-pp", "--decode-pp", "--prefill-cp",
                 "IP:PORT + s*P + t", "refused, naming the flag",
                 "--prefill-instance K=IP:PORT,TP[,PP]", "--instances N",
                 "--instance K", "--expect-lost K", "hold-from:R",
                 "i % N", "--device NAME[,NAME...]",
                 "--device-near-gpu BUSID[,BUSID...]", "entry s*TP + t",
                 "--mla-latent-dim N", "--decode-page-size N", "swap-pages",
                 "--kv-scales S", "shift-scales"])


def test_bad_input(s):
    cases = [
        ("no role", ["serve", "--peer", "192.0.2.1:1"] + SHAPE, "--role"),
        ("unknown role", ["serve", "--role", "both"] + SHAPE, "--role"),
        ("prefill without listen", ["serve", "--role", "prefill"] + SHAPE,
         "--listen"),
        ("decode without peer", ["serve", "--role", "decode"] + SHAPE,
         "--peer"),
        ("peer on prefill", PREFILL + ["--peer", "192.0.2.1:1"], "--peer"),
        ("fault on decode", DECODE + ["--fault", "write-error:1"],
         "give it to --role prefill"),
        ("stale-write on decode", DECODE + ["--fault", "stale-write:1"],
         "give it to --role prefill"),
        ("replay on prefill", PREFILL + ["--fault", "replay-registration"],
         "give it to --role decode"),
        ("swap-pages on prefill", PREFILL + ["--fault", "swap-pages"],
         "give it to --role decode"),
        ("stale-write not a number", PREFILL + ["--fault", "stale-write:x"],
         "--fault stale-write"),
        ("listen without port", ["serve", "--role", "prefill", "--listen",
                                 "192.0.2.1"] + SHAPE, "--listen"),
        # Pipeline layouts: the core's rules, worded for the flags.
        ("decode pp neither 1 nor prefill pp",
         DECODE + ["--prefill-pp", "2", "--decode-pp", "4"], "--decode-pp"),
        ("more prefill stages than layers",
         DECODE + ["--prefill-pp", "5"], "--prefill-pp"),
        # spec §8: the chunk is whole pages (serve's default chunk is 64).
        ("chunk not a multiple of the page", DECODE + ["--page-size", "24"],
         "--chunk-tokens"),
        ("chunk 0 means 8192", PREFILL + ["--page-size", "24",
                                          "--chunk-tokens", "0"],
         "--chunk-tokens"),
        ("decode pp 0", DECODE + ["--decode-pp", "0"], "--decode-pp"),
        # Two page sizes: the chunk must be whole pages of both (serve moves
        # them, tests/ofi/test_serve_kinds.py); the sizes are whole numbers.
        ("chunk not a multiple of the decode page",
         DECODE + ["--decode-page-size", "48"], "--decode-page-size 48"),
        ("chunk not a multiple of the decode page, prefill",
         PREFILL + ["--decode-page-size", "48"], "--chunk-tokens"),
        ("decode page size 0", DECODE + ["--decode-page-size", "0"],
         "--decode-page-size"),
        # An MLA model is one latent per token: no KV heads.
        ("mla with kv heads", ["serve", "--role", "decode", "--peer",
                               "192.0.2.1:18515", "--mla-latent-dim", "576",
                               "--layers", "4", "--kv-heads", "4"], "--kv-heads"),
        # Prefill context parallelism: a CP size of at least 1, its ranks
        # bounded as TP x PP's. (A prefill's metrics label its CP ranks and
        # its discovery records carry them: test_serve's metricscp and
        # discoverycp runs.)
        ("prefill cp 0", PREFILL + ["--prefill-cp", "0"], "--prefill-cp"),
        ("prefill cp junk", DECODE + ["--prefill-cp", "two"], "--prefill-cp"),
        ("prefill cp ranks over 64",
         PREFILL + ["--prefill-tp", "8", "--prefill-pp", "4", "--prefill-cp", "4"],
         "--prefill-cp"),
        # Nor window or state layers (kvstage plan lays them out).
        # FP8 scale planes: the dtype and the block are checked by name; the
        # planted wrong scale mapping needs scales and two layers a stage.
        ("kv scales not fp8", DECODE + ["--kv-scales", "per-token"], "--kv-scales"),
        ("kv scales block", PREFILL + ["--dtype", "fp8", "--kv-scales", "per-block:64"],
         "--kv-scales"),
        ("kv scales unknown", DECODE + ["--dtype", "fp8", "--kv-scales", "per-row"],
         "--kv-scales"),
        ("shift-scales without scales", DECODE + ["--fault", "shift-scales"],
         "--kv-scales"),
        ("shift-scales, one layer a stage",
         DECODE + ["--dtype", "fp8", "--kv-scales", "per-token", "--decode-pp", "4",
                   "--prefill-pp", "4", "--fault", "shift-scales"], "--layers"),
        ("shift-scales on prefill", PREFILL + ["--dtype", "fp8", "--kv-scales", "per-token",
                                               "--fault", "shift-scales"], "--role decode"),
        # TP x PP ranks of one process: each side's product is bounded, on
        # both roles alike (so the two processes refuse the same shapes).
        ("prefill ranks over 64",
         DECODE + ["--prefill-tp", "32", "--prefill-pp", "4",
                   "--decode-tp", "1"], "--prefill-pp"),
        ("decode ranks over 64",
         PREFILL + ["--prefill-tp", "4", "--decode-tp", "32",
                    "--prefill-pp", "4", "--decode-pp", "4"], "--decode-pp"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)


def test_instance_flags(s):
    """Instances as processes: each flag's own refusals, naming it."""
    cases = [
        # --prefill-instance ID=IP:PORT,TP[,PP], decode only.
        ("instance without tp", DECODE[:3] + [INST, "0=192.0.2.1:18515"]
         + SHAPE, INST),
        ("instance without id", DECODE[:3] + [INST, "192.0.2.1:18515,2"]
         + SHAPE, INST),
        ("instance with junk after pp",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,2,1,9"] + SHAPE, INST),
        ("instance id not a number",
         DECODE[:3] + [INST, "x=192.0.2.1:18515,2"] + SHAPE, INST),
        ("instance id over 63",
         DECODE[:3] + [INST, "64=192.0.2.1:18515,2"] + SHAPE, INST),
        ("instance tp 0", DECODE[:3] + [INST, "0=192.0.2.1:18515,0"] + SHAPE,
         INST),
        ("instance pp not a number",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,2,x"] + SHAPE, INST),
        ("instance without port", DECODE[:3] + [INST, "0=192.0.2.1,2"]
         + SHAPE, INST),
        ("instance without value", DECODE[:3] + [INST] + SHAPE, INST),
        ("instance given twice",
         CLUSTER + [INST, "1=192.0.2.1:18535,1"], INST),
        ("instance ids not 0..N-1",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,2", INST,
                       "2=192.0.2.1:18525,1"] + SHAPE, INST),
        ("instances on the same ports",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,2", INST,
                       "1=192.0.2.1:18516,1"] + SHAPE, INST),
        ("instance tp that cannot pair",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,3"] + SHAPE, INST),
        ("instance pp over the layers",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,1,5"] + SHAPE, INST),
        ("instance ranks over 64",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,32,4"] + SHAPE, INST),
        ("instance ranks over 64 with cp",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,8,4", "--prefill-cp", "4"]
         + SHAPE, "TP x PP x CP = 128"),
        # An instance's ranks take PORT.. PORT + TP x PP x CP - 1.
        ("instances on the same ports with cp",
         DECODE[:3] + [INST, "0=192.0.2.1:18515,2", INST,
                       "1=192.0.2.1:18517,1", "--prefill-cp", "2"] + SHAPE, INST),
        ("instance and peer", CLUSTER + ["--peer", "192.0.2.1:1"], "--peer"),
        ("instance and prefill-tp", CLUSTER + ["--prefill-tp", "2"],
         "--prefill-tp"),
        ("instance and prefill-pp", CLUSTER + ["--prefill-pp", "1"],
         "--prefill-pp"),
        ("instance on prefill", PREFILL + [INST, "0=192.0.2.1:18515,2"],
         INST),
        # --instance K / --instances N, prefill only.
        ("instance not below instances",
         PREFILL + ["--instance", "2", "--instances", "2"], "--instance"),
        ("instances 0", PREFILL + ["--instances", "0"], "--instances"),
        ("instances over 64", PREFILL + ["--instances", "65"], "--instances"),
        ("instance on decode", CLUSTER + ["--instance", "1"], "--instance"),
        ("instances on decode", CLUSTER + ["--instances", "2"], "--instances"),
        # --expect-lost K, decode only, an instance it knows, not with
        # --expect-failed.
        ("expect-lost on prefill", PREFILL + ["--expect-lost", "0"],
         "--expect-lost"),
        ("expect-lost of no instance", CLUSTER + ["--expect-lost", "2"],
         "--expect-lost"),
        ("expect-lost and expect-failed",
         CLUSTER + ["--expect-lost", "1", "--expect-failed", "1"],
         "--expect-lost"),
        # --fault hold-from:R, prefill only, a room of the run.
        ("hold-from past the requests",
         PREFILL + ["--requests", "8", "--fault", "hold-from:8"], "--fault"),
        ("hold-from not a number", PREFILL + ["--fault", "hold-from:x"],
         "--fault hold-from"),
        ("hold-from on decode", CLUSTER + ["--fault", "hold-from:1"],
         "--fault"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)


def test_device_lists(s):
    """--device and --device-near-gpu: one entry for every rank of the
    process or one per rank (TP x PP of its role, x CP on a prefill), never
    empty, never both."""
    pp2 = PREFILL + ["--prefill-pp", "2"]  # 4 ranks: TP 2 x PP 2
    cases = [
        ("device list shorter than the ranks", pp2 + ["--device", "a,b,c"],
         "--device: 3 entries for the 4 ranks of this prefill (TP 2 x PP 2)"),
        ("device list longer than the ranks",
         DECODE + ["--device", "mlx5_0,mlx5_1"],
         "--device: 2 entries for the 1 rank of this decode"),
        ("device list counts the decode's ranks",
         DECODE + ["--decode-tp", "2", "--device", "a,b,c"],
         "--device: 3 entries for the 2 ranks of this decode"),
        ("device entry empty", pp2 + ["--device", "a,,c,d"],
         "--device: entry 2 of 'a,,c,d' is empty"),
        ("device list ends in a comma", PREFILL + ["--device", "a,"],
         "--device: entry 2"),
        ("device name too long", PREFILL + ["--device", "m" * 64],
         "--device: '%s' is longer than 63" % ("m" * 64)),
        ("device and near gpu", PREFILL + ["--device", "a",
                                           "--device-near-gpu", "3b:00.0"],
         "--device and --device-near-gpu"),
        ("near gpu list shorter than the ranks",
         pp2 + ["--device-near-gpu", "0000:3b:00.0,0000:5e:00.0"],
         "--device-near-gpu: 2 entries for the 4 ranks"),
        ("near gpu entry empty", PREFILL + ["--device-near-gpu", ","],
         "--device-near-gpu: entry 1"),
        ("device list counts the cp ranks",
         pp2 + ["--prefill-cp", "2", "--device", "a,b,c,d"],
         "--device: 4 entries for the 8 ranks of this prefill (TP 2 x PP 2 x CP 2)"),
    ]
    for name, args, text in cases:
        s.expect_usage_error(name, args, text)
    # Rank (t, s) takes entry s*TP + t: each rank's fabric refuses its own
    # entry by name (no RDMA device is needed for that refusal).
    args = pp2 + ["--device-near-gpu", "t0s0,t1s0,t0s1,t1s1", "--json"]
    res = s.run(args)
    s.ok(res.returncode == 1, "near gpu per rank", args,
         "want exit 1, got %d (stderr %r)" % (res.returncode, res.stderr[:300]))
    for t in range(2):
        for st in range(2):
            want = ("prefill rank %d stage %d: verbs fabric (--device-near-gpu "
                    "t%ds%d): verbs config: near_pci 't%ds%d' is not a PCI bus "
                    "id" % (t, st, t, st, t, st))
            s.ok(want in res.stderr, "near gpu per rank", args,
                 "stderr lacks %r: %r" % (want, res.stderr[:1200]))
    # With CP, rank (t, s) of CP rank c takes entry (c*PP + s)*TP + t.
    args = PREFILL + ["--prefill-cp", "2", "--device-near-gpu", "t0c0,t1c0,t0c1,t1c1",
                      "--json"]
    res = s.run(args)
    s.ok(res.returncode == 1, "near gpu per cp rank", args,
         "want exit 1, got %d (stderr %r)" % (res.returncode, res.stderr[:300]))
    for t in range(2):
        for c in range(2):
            want = ("prefill rank %d cp %d: verbs fabric (--device-near-gpu "
                    "t%dc%d): verbs config: near_pci 't%dc%d' is not a PCI bus "
                    "id" % (t, c, t, c, t, c))
            s.ok(want in res.stderr, "near gpu per cp rank", args,
                 "stderr lacks %r: %r" % (want, res.stderr[:1200]))
    # One entry: every rank takes it.
    args = pp2 + ["--device-near-gpu", "gpu0"]
    res = s.run(args)
    s.ok(res.returncode == 1 and res.stderr.count("near_pci 'gpu0'") == 4,
         "near gpu for all ranks", args,
         "want exit 1 and 4 ranks refusing 'gpu0', got %d: %r"
         % (res.returncode, res.stderr[:1200]))


def main():
    if len(sys.argv) != 2:
        print("usage: cli_serve.py PATH_TO_KVSTAGE", file=sys.stderr)
        return 2
    s = Suite(sys.argv[1])
    for test in (test_help, test_bad_input, test_instance_flags,
                 test_device_lists):
        test(s)
    print("cli_serve: %d passed, %d failed" % (s.passed, s.failed))
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
