#!/usr/bin/env python3
"""cli_serve.py - the flags of `kvstage serve` that are refused before any
RDMA device is touched (so it runs anywhere serve is built): the help names
the pipeline flags, and every class of bad input, the TP x PP layouts
included, exits 2 with exactly one stderr line naming the flag to change.
What a run does over RDMA is tests/rxe/test_serve.sh.

usage: cli_serve.py PATH_TO_KVSTAGE
Prints one line per failure and a summary "cli_serve: N passed, M failed";
exits 1 when anything failed. Python 3 standard library only.
"""

import sys

from cli_suite import Suite

SHAPE = ["--kv-heads", "4", "--head-dim", "32", "--layers", "4"]
DECODE = ["serve", "--role", "decode", "--peer", "192.0.2.1:18515"] + SHAPE
PREFILL = ["serve", "--role", "prefill", "--listen", "192.0.2.1:18515"] + SHAPE


def test_help(s):
    s.expect_ok("serve --help", ["serve", "--help"],
                ["usage: kvstage serve", "--prefill-pp", "--decode-pp",
                 "IP:PORT + s*P + t", "refused, naming the flag"])


def test_bad_input(s):
    cases = [
        ("no role", ["serve", "--peer", "192.0.2.1:1"] + SHAPE, "--role"),
        ("unknown role", ["serve", "--role", "both"] + SHAPE, "--role"),
        ("prefill without listen", ["serve", "--role", "prefill"] + SHAPE,
         "--listen"),
        ("decode without peer", ["serve", "--role", "decode"] + SHAPE,
         "--peer"),
        ("peer on prefill", PREFILL + ["--peer", "192.0.2.1:1"], "--peer"),
        ("fault on decode", DECODE + ["--fault", "write-error:1"], "--fault"),
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


def main():
    if len(sys.argv) != 2:
        print("usage: cli_serve.py PATH_TO_KVSTAGE", file=sys.stderr)
        return 2
    s = Suite(sys.argv[1])
    for test in (test_help, test_bad_input):
        test(s)
    print("cli_serve: %d passed, %d failed" % (s.passed, s.failed))
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
