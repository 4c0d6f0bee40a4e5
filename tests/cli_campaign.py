#!/usr/bin/env python3
"""cli_campaign.py - `kvstage sim --campaign N --seed S`: the JSON summary
and the table, determinism (one seed, one output; another seed, another
digest), that every run replays alone (its logged `kvstage sim` command
gives the same digest and counts as inside the campaign, and run i is the
same in a campaign of any length), --campaign-faults, --campaign-kinds
(model kinds drawn from a stream of their own), the violation report
and its exit status, the flags a campaign draws (--ring-bytes,
--transfer-workers, --prefill-tokens-per-s, --max-events, --sq-depth,
--aux-bytes),
clusters of several instances with faults naming one (and no collateral
failure), and that bad input exits 2 with one stderr line naming the flag.

usage: cli_campaign.py PATH_TO_KVSTAGE
Prints one line per failure and "cli_campaign: N passed, M failed"; exits
1 when anything failed. Python 3 standard library only.
"""

import json
import os
import shlex
import sys
import tempfile

from cli_suite import Suite

JSON_KEYS = [
    "ok", "runs", "violations", "runs_with_violations", "seed",
    "runs_with_faults", "requests_total", "requests_ok", "requests_failed",
    "hung_requests", "ring_leaked_bytes", "corrupt_bytes",
    "unreported_failures", "collateral_failures", "failed_without_faults",
    "setup_errors", "runs_stopped", "runs_with_clusters", "runs_with_sq_depth", "posts_refused",
    "runs_with_aux", "aux_bytes_verified", "aux_corrupt_bytes", "keys_granted",
    "keys_leaked", "hostile_writes", "hostile_bytes_landed", "events",
    "max_run_events", "digest", "faults_drawn", "model_kinds",
    "runs_model_combined", "paths_run", "wall_seconds",
    "ms_per_run", "violating_runs", "first_violation", "replay",
]
MODEL_KINDS = ["gqa", "mla", "page-sizes", "per-token", "per-block", "context-parallel",
               "hybrid", "draft"]
# The flag each model kind puts in a run's replay.
MODEL_FLAGS = {"mla": "--mla-latent-dim", "page-sizes": "--decode-page-size",
               "per-token": "--kv-scales per-token", "per-block": "--kv-scales per-block:",
               "context-parallel": "--prefill-cp", "hybrid": "--full-attn-every",
               "draft": "--draft-layers"}
KINDS = ["drop", "dup", "delay", "write-error", "link-down", "slow-scatter",
         "stall", "crash", "restart", "hbm-full", "hostile-write"]
# Keys derived from the real clock: the only ones two campaigns may differ in.
WALL_KEYS = ("wall_seconds", "ms_per_run")


def without_wall(obj):
    return {k: v for k, v in obj.items() if k not in WALL_KEYS}


def campaign_json(s, name, args, want_rc=0):
    """Runs a campaign with --json; exit want_rc; returns the object."""
    res = s.run(args + ["--json"])
    s.ok(res.returncode == want_rc, name + " exit", args,
         "want %d, got %d: %s" % (want_rc, res.returncode, res.stderr[-500:]))
    try:
        obj = json.loads(res.stdout)
    except ValueError as exc:
        s.ok(False, name + " json", args, "%s: %r" % (exc, res.stdout[:300]))
        return {}, res
    return obj, res


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_json_summary(s):
    args = ["sim", "--campaign", "40", "--seed", "3"]
    obj, res = campaign_json(s, "json", args)
    for key in JSON_KEYS:
        s.ok(key in obj, "json key " + key, args, "missing")
    s.ok(res.stderr == "", "json stderr empty", args, res.stderr[-300:])
    s.ok(obj.get("runs") == 40 and obj.get("seed") == 3, "json runs and seed",
         args, repr(obj)[:300])
    s.ok(obj.get("violations") == 0 and obj.get("ok") is True
         and obj.get("first_violation") is None
         and obj.get("violating_runs") == [], "json no violations", args,
         repr(obj)[:600])
    s.ok(obj.get("requests_ok", 0) + obj.get("requests_failed", 0)
         == obj.get("requests_total", -1) and obj.get("requests_ok", 0) > 0,
         "json requests add up", args, repr(obj)[:300])
    s.ok(0 < obj.get("runs_with_faults", 0) < 40, "json some runs with faults",
         args, repr(obj.get("runs_with_faults")))
    drawn = obj.get("faults_drawn", {})
    s.ok(sorted(drawn) == sorted(KINDS), "json fault kinds", args, repr(drawn))
    s.ok(all(drawn.get(k, 0) > 0 for k in ("link-down", "crash", "restart")),
         "default draws link-down, crash and restart", args, repr(drawn))
    paths = obj.get("paths_run", {})
    s.ok(sorted(paths) == ["direct", "slice", "staging"]
         and sum(paths.values()) == 40, "json paths", args, repr(paths))
    s.ok(obj.get("replay") == "kvstage sim --campaign 40 --seed 3",
         "json replay", args, repr(obj.get("replay")))
    s.ok(0 < obj.get("max_run_events", 0) <= obj.get("events", 0),
         "json events", args, repr(obj)[:300])
    s.ok(0 < obj.get("runs_with_sq_depth", 0) < 40 and obj.get("posts_refused", 0) > 0,
         "some runs fill their send queues", args, repr(obj)[:600])
    s.ok(0 < obj.get("runs_with_aux", 0) < 40 and obj.get("aux_bytes_verified", 0) > 0
         and obj.get("aux_corrupt_bytes") == 0,
         "some runs carry aux payloads, every byte of them verified", args, repr(obj)[:600])
    s.ok(0 < obj.get("runs_with_clusters", 0) < 40 and obj.get("collateral_failures") == 0,
         "some runs are clusters, none fails a request of an unfaulted pair", args,
         repr(obj)[:600])


def test_table(s):
    args = ["sim", "--campaign", "12", "--seed", "5"]
    s.expect_ok("table", args, [
        "kvstage sim --campaign 12 --seed 5: 12 random scenarios", "runs",
        "requests", "violations         0 in 0 runs", "faults drawn",
        "paths run", "events", "wall time", "seed", "first violation    none"])


def test_determinism(s):
    args = ["sim", "--campaign", "30", "--seed", "11"]
    a, _ = campaign_json(s, "determinism 1", args)
    b, _ = campaign_json(s, "determinism 2", args)
    s.ok(a and without_wall(a) == without_wall(b), "same seed, same campaign",
         args, "%r\nvs\n%r" % (a, b))
    c, _ = campaign_json(s, "other seed", ["sim", "--campaign", "30",
                                           "--seed", "12"])
    s.ok(c.get("digest") != a.get("digest"), "other seed, other digest", args,
         "both %r" % a.get("digest"))
    d, _ = campaign_json(s, "seed equals form",
                         ["sim", "--campaign=30", "--seed=11"])
    s.ok(d.get("digest") == a.get("digest"), "flag=value form", args,
         "%r vs %r" % (d.get("digest"), a.get("digest")))


def test_replay(s):
    """Every logged run replays alone, with the same digest and counts."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "runs.jsonl")
        args = ["sim", "--campaign", "40", "--seed", "7", "--campaign-log", log]
        obj, _ = campaign_json(s, "replay campaign", args)
        runs = read_log(log) if os.path.exists(log) else []
        s.ok(len(runs) == 40 and [r.get("run") for r in runs] == list(range(40)),
             "log has one line per run", args, "%d lines" % len(runs))
        s.ok(sum(r.get("requests_total", 0) for r in runs)
             == obj.get("requests_total"), "log requests add up", args,
             repr(obj.get("requests_total")))
        faulted = [r for r in runs if "--fault" in r.get("replay", "")
                   or "--stall-timeout-ms 30000" not in r.get("replay", "")]
        clean = [r for r in runs if r not in faulted]
        s.ok(len(faulted) >= 5 and len(clean) >= 3, "log has both kinds of run",
             args, "%d with faults, %d without" % (len(faulted), len(clean)))
        queued = [r for r in runs if "--sq-depth" in r.get("replay", "")]
        s.ok(len(queued) >= 3, "log has runs with --sq-depth", args,
             "%d of them" % len(queued))
        aux = [r for r in runs if "--aux-bytes" in r.get("replay", "")]
        s.ok(len(aux) >= 3, "log has runs with --aux-bytes", args, "%d of them" % len(aux))
        clusters = [r for r in runs if is_cluster(r)]
        s.ok(len(clusters) >= 5, "log has clusters", args, "%d of them" % len(clusters))
        for r in faulted[:8] + clean[:4] + queued[:2] + aux[:2] + clusters[:3]:
            replay_alone(s, args, r)
        # Run i does not depend on how many runs the campaign has.
        short = os.path.join(tmp, "short.jsonl")
        s.run(["sim", "--campaign", "10", "--seed", "7", "--campaign-log",
               short])
        first = read_log(short) if os.path.exists(short) else []
        s.ok(len(first) == 10 and all(a.get("digest") == b.get("digest")
                                      and a.get("replay") == b.get("replay")
                                      for a, b in zip(first, runs)),
             "run i is the same in a shorter campaign", args,
             "%d lines" % len(first))


def is_cluster(run):
    """A run with more than one instance on a side: a comma list of sizes."""
    words = shlex.split(run.get("replay", ""))
    return any("," in w for w, flag in zip(words[1:], words) if flag.endswith("-tp"))


def replay_alone(s, args, r):
    """Run r of a campaign log replays alone: same digest, counts and exit."""
    words = shlex.split(r.get("replay", ""))
    if not s.ok(words[:2] == ["kvstage", "sim"] and "--seed" in words
                and "--max-events" in words, "replay words", args,
                repr(words)):
        return
    res = s.run(words[1:] + ["--json"])
    try:
        alone = json.loads(res.stdout)
    except ValueError:
        s.ok(False, "replay json", words[1:], res.stderr[-300:])
        return
    name = "run %d replayed alone" % r["run"]
    s.ok(alone.get("digest") == r.get("digest"), name + ": digest",
         words[1:], "%r vs %r" % (alone.get("digest"), r.get("digest")))
    for key in ("requests_total", "requests_ok", "requests_failed",
                "events", "violations"):
        s.ok(alone.get(key) == r.get(key), name + ": " + key,
             words[1:], "%r vs %r" % (alone.get(key), r.get(key)))
    s.ok(res.returncode == (1 if r.get("violations") else 0),
         name + ": exit", words[1:], "exit %d" % res.returncode)


def test_clusters(s):
    """Clusters (spec §12): some runs have several instances on a side, of
    mixed TP and PP; faults of one rank name its instance (p1.0@2,
    crash:prefill@1:...); no request fails for a fault of another
    instance; such runs replay alone."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "runs.jsonl")
        args = ["sim", "--campaign", "120", "--seed", "7", "--campaign-log", log]
        obj, _ = campaign_json(s, "clusters campaign", args)
        runs = read_log(log) if os.path.exists(log) else []
        clusters = [r for r in runs if is_cluster(r)]
        named = [r for r in clusters if "@" in r.get("replay", "")]
        s.ok(obj.get("runs_with_clusters") == len(clusters) and 25 <= len(clusters) <= 75,
             "about 40% of the runs are clusters", args,
             "%d of %d, %r" % (len(clusters), len(runs), obj.get("runs_with_clusters")))
        s.ok(len(named) >= 3, "faults name an instance", args,
             "%d runs" % len(named))
        s.ok(any("--router least-loaded" in r["replay"] for r in clusters)
             and any("--router" not in r["replay"] for r in clusters),
             "both routers drawn", args, "")
        s.ok(obj.get("collateral_failures") == 0 and obj.get("violations") == 0,
             "no collateral failure", args, repr(obj)[:300])
        for r in named[:3]:
            replay_alone(s, args, r)


def test_fault_kinds(s):
    args = ["sim", "--campaign", "25", "--seed", "4", "--campaign-faults",
            "none"]
    obj, _ = campaign_json(s, "faults none", args)
    s.ok(obj.get("runs_with_faults") == 0 and obj.get("requests_failed") == 0
         and obj.get("requests_ok", 0) > 0, "no faults: every request ok",
         args, repr(obj)[:400])
    s.ok(obj.get("replay", "").endswith("--campaign-faults none"),
         "faults none replay", args, repr(obj.get("replay")))
    args = ["sim", "--campaign", "25", "--seed", "4", "--campaign-faults",
            "drop,stall"]
    obj, _ = campaign_json(s, "faults drop,stall", args)
    drawn = obj.get("faults_drawn", {})
    s.ok(drawn.get("drop", 0) > 0 and drawn.get("stall", 0) > 0
         and all(v == 0 for k, v in drawn.items() if k not in ("drop", "stall")),
         "only the kinds asked for", args, repr(drawn))


def test_model_kinds(s):
    """Model kinds (docs/kinds/): each run draws MLA, two page sizes and
    scale planes at their odds, from a stream of their own, so a run that
    drew none is the run of --campaign-kinds none (the campaign of before);
    --campaign-kinds names the kinds to draw, one at least in every run;
    the replay of a kind's run names its flags and gives the same run."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "all.jsonl")
        args = ["sim", "--campaign", "40", "--seed", "2", "--campaign-log", log]
        obj, _ = campaign_json(s, "kinds campaign", args)
        kinds = obj.get("model_kinds", {})
        s.ok(sorted(kinds) == sorted(MODEL_KINDS) and kinds.get("gqa", 0) < 40
             and all(kinds.get(k, 0) > 0 for k in MODEL_KINDS),
             "every model kind drawn", args, repr(kinds))
        runs = read_log(log) if os.path.exists(log) else []
        for kind, flag in MODEL_FLAGS.items():
            have = [r for r in runs if flag in r.get("replay", "")]
            s.ok(len(have) == kinds.get(kind), "log: %s runs name %s" % (kind, flag), args,
                 "%d vs %r" % (len(have), kinds.get(kind)))
            for r in have[:1]:
                replay_alone(s, args, r)
        plain_log = os.path.join(tmp, "none.jsonl")
        plain_args = ["sim", "--campaign", "40", "--seed", "2", "--campaign-kinds", "none",
                      "--campaign-log", plain_log]
        plain, _ = campaign_json(s, "kinds none", plain_args)
        s.ok(plain.get("model_kinds", {}).get("gqa") == 40
             and plain.get("runs_model_combined") == 0
             and plain.get("replay", "").endswith("--campaign-kinds none"),
             "kinds none: GQA only", plain_args, repr(plain.get("model_kinds")))
        before = read_log(plain_log) if os.path.exists(plain_log) else []
        same = [(a, b) for a, b in zip(runs, before)
                if not any(f in a.get("replay", "") for f in MODEL_FLAGS.values())]
        s.ok(len(before) == 40 and 0 < len(same) < 40
             and all(a["replay"] == b["replay"] and a["digest"] == b["digest"]
                     for a, b in same),
             "a run without kinds is the run of kinds none", plain_args,
             "%d runs compared" % len(same))
        only_args = ["sim", "--campaign", "12", "--seed", "2", "--campaign-kinds",
                     "page-sizes,per-block"]
        only, _ = campaign_json(s, "kinds named", only_args)
        got = only.get("model_kinds", {})
        s.ok(got.get("gqa") == 12 and got.get("mla") == 0 and got.get("per-token") == 0
             and got.get("page-sizes", 0) + got.get("per-block", 0)
             - only.get("runs_model_combined", 0) == 12,
             "only the kinds named, one in every run", only_args, repr(got))
    s.expect_ok("table kinds", ["sim", "--campaign", "6", "--seed", "2"],
                ["model kinds        gqa "])


def test_violations(s):
    """Short stall timeouts mixed with loss, lateness and real failures (off
    by default: the judge cannot tell a notice that had no time to arrive
    from one never sent) give a violation in this seed's 200 runs. Whatever
    they do, the report must agree with itself and with the replayed run."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "runs.jsonl")
        args = ["sim", "--campaign", "200", "--seed", "3", "--campaign-faults",
                "stall,drop,write-error,delay", "--campaign-log", log]
        res = s.run(args + ["--json"])
        try:
            obj = json.loads(res.stdout)
        except ValueError:
            s.ok(False, "violations json", args, res.stderr[-300:])
            return
        runs = read_log(log) if os.path.exists(log) else []
        bad = [r for r in runs if r.get("violations")]
        s.ok(obj.get("runs_with_violations") == len(bad)
             and obj.get("violations") == sum(r["violations"] for r in bad),
             "violation counts match the log", args, repr(obj)[:300])
        s.ok(res.returncode == (1 if bad else 0), "exit 1 iff violations",
             args, "exit %d, %d violating runs" % (res.returncode, len(bad)))
        first = obj.get("first_violation")
        if not bad:
            s.ok(first is None and res.stderr == "", "no violation reported",
                 args, repr(first))
            return
        s.ok(isinstance(first, dict) and first.get("run") == bad[0]["run"]
             and first.get("replay") == bad[0]["replay"]
             and first.get("why"), "first violation is the first bad run",
             args, repr(first))
        s.ok(("campaign run %d" % bad[0]["run"]) in res.stderr
             and bad[0]["replay"] in res.stderr, "stderr names the replay",
             args, res.stderr[:500])
        words = shlex.split(bad[0]["replay"])
        again = s.run(words[1:])
        s.ok(again.returncode == 1 and "FAILED" in again.stderr,
             "the replay fails alone too", words[1:],
             "exit %d: %s" % (again.returncode, again.stderr[-300:]))
        table = s.run(args[:-2])
        s.ok(table.returncode == 1 and "first violation    run %d" % bad[0]["run"]
             in table.stdout and bad[0]["replay"] in table.stdout,
             "table names the first violation", args[:-2], table.stdout[-600:])


def test_sim_flags(s):
    """The flags campaigns draw that `kvstage sim` gained for them."""
    base = ["sim", "--kv-heads", "4", "--head-dim", "16", "--layers", "2",
            "--page-size", "4", "--chunk-tokens", "16", "--prefill-tp", "4",
            "--decode-tp", "2", "--requests", "3", "--prompt-tokens", "8:64",
            "--rate", "0", "--seed", "2"]
    args = base + ["--ring-bytes", "5000", "--transfer-workers", "1",
                   "--prefill-tokens-per-s", "1000000", "--json"]
    obj = s.expect_json("campaign flags", args)
    s.ok(obj.get("ring_bytes") == 5000 and obj.get("transfer_workers") == 1
         and obj.get("prefill_tokens_per_s") == 1000000
         and obj.get("requests_ok") == 3, "campaign flags echoed", args,
         repr(obj)[:400])
    # A ring of exactly one region (2 writers x 1 head x head dim 16 x 2
    # bytes x 2 layers x K, V x 16 tokens = 4 KiB, as `kvstage plan` says):
    # every chunk waits for the scatter of the one before.
    args = base + ["--ring-bytes", "4096", "--json"]
    tight = s.expect_json("one-region ring", args)
    s.ok(tight.get("requests_ok") == 3 and tight.get("ring_bytes") == 4096
         and tight.get("watermark_waits", 0) > 0, "one-region ring waits",
         args, repr(tight)[:300])
    res = s.run(base + ["--max-events", "50", "--json"])
    obj = json.loads(res.stdout) if res.stdout.startswith("{") else {}
    s.ok(res.returncode == 1 and obj.get("hung_requests", 0) > 0,
         "--max-events stops a run: its requests are hung", base,
         "exit %d %r" % (res.returncode, repr(obj)[:200]))


def test_bad_input(s):
    cases = [
        ("campaign zero", ["sim", "--campaign", "0"], "--campaign"),
        ("campaign negative", ["sim", "--campaign", "-5"], "--campaign"),
        ("campaign junk", ["sim", "--campaign", "ten"], "--campaign"),
        ("campaign too many", ["sim", "--campaign", "1000000000"], "--campaign"),
        ("campaign missing value", ["sim", "--campaign"], "--campaign"),
        ("campaign empty", ["sim", "--campaign="], "--campaign"),
        ("campaign with a scenario flag", ["sim", "--campaign", "3",
                                           "--requests", "4"], "--requests"),
        ("campaign with --fault", ["sim", "--campaign", "3", "--fault",
                                   "drop:any:0.1"], "--fault"),
        ("campaign bad seed", ["sim", "--campaign", "3", "--seed", "x"],
         "--seed"),
        ("campaign twice", ["sim", "--campaign", "3", "--campaign", "4"],
         "--campaign"),
        ("campaign positional", ["sim", "--campaign", "3", "extra"], "extra"),
        ("campaign unknown kind", ["sim", "--campaign", "3",
                                   "--campaign-faults", "drop,meteor"],
         "--campaign-faults"),
        ("campaign empty kind", ["sim", "--campaign", "3",
                                 "--campaign-faults", "drop,"],
         "--campaign-faults"),
        ("campaign unknown model kind", ["sim", "--campaign", "3",
                                         "--campaign-kinds", "mla,moe"],
         "--campaign-kinds"),
        ("campaign log unwritable", ["sim", "--campaign", "3",
                                     "--campaign-log", "/nonexistent-dir/x"],
         "--campaign-log"),
        ("campaign log empty", ["sim", "--campaign", "3", "--campaign-log="],
         "--campaign-log"),
        ("ring bytes and mib", ["sim", "--ring-bytes", "4096", "--ring-mib",
                                "1"], "--ring-bytes"),
        ("ring bytes zero", ["sim", "--ring-bytes", "0"], "--ring-bytes"),
        ("transfer workers zero", ["sim", "--transfer-workers", "0"],
         "--transfer-workers"),
        ("transfer workers too many", ["sim", "--transfer-workers", "1025"],
         "--transfer-workers"),
        ("prefill speed zero", ["sim", "--prefill-tokens-per-s", "0"],
         "--prefill-tokens-per-s"),
        ("max events zero", ["sim", "--max-events", "0"], "--max-events"),
    ]
    for name, args, flag in cases:
        s.expect_usage_error(name, args, flag)


def test_help(s):
    s.expect_ok("help lists campaigns", ["sim", "--help"], [
        "--campaign N", "--campaign-log FILE", "--campaign-faults KINDS",
        "--campaign-kinds KINDS",
        "--ring-bytes", "--transfer-workers", "--prefill-tokens-per-s",
        "--max-events"])
    for args in (["sim", "--campaign", "3", "--help"],
                 ["sim", "--campaign", "3", "-h"]):
        s.expect_ok(" ".join(args), args, ["usage: kvstage sim", "--campaign N"])


def main():
    if len(sys.argv) != 2:
        print("usage: cli_campaign.py PATH_TO_KVSTAGE", file=sys.stderr)
        return 2
    s = Suite(sys.argv[1], timeout_s=600)
    for test in (test_help, test_json_summary, test_table, test_determinism,
                 test_replay, test_clusters, test_fault_kinds, test_model_kinds,
                 test_violations,
                 test_sim_flags, test_bad_input):
        test(s)
    print("cli_campaign: %d passed, %d failed" % (s.passed, s.failed))
    return 1 if s.failed else 0


if __name__ == "__main__":
    sys.exit(main())
