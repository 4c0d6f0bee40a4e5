#!/usr/bin/env python3
"""cli_sweep.py - `kvstage sim --sweep` end to end on a small workload in the
provenance data mode (cheap): the CSV has its header and one row per value,
a ring too small for the workload is a "refused" row, every other row
equals the single run of the same flags (`kvstage sim --json`: TTFT,
goodput, ring peak, digest), a decode-instances sweep builds that many
decode instances, and the SVG chart is well-formed XML with a title, both
series (p99 TTFT and goodput) and one tick label per value. Also checks
that `kvstage sim --json` carries the operator metrics.

usage: cli_sweep.py PATH_TO_KVSTAGE
Prints one line per failure and "cli_sweep: N passed, M failed"; exits 1
when anything failed. Python 3 standard library only.
"""

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

# Llama-3.1-8B cut to 4 layers, TP 4 -> 2, four short prompts.
BASE = ["sim", "--model", "llama-3.1-8b", "--layers", "4", "--prefill-tp", "4",
        "--decode-tp", "2", "--requests", "4", "--prompt-tokens", "64:512",
        "--data", "provenance"]
SVG = "{http://www.w3.org/2000/svg}"
failures = []
passed = 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL: " + what)


def run(exe, args):
    return subprocess.run([exe] + args, capture_output=True, text=True)


def main():
    exe = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="kvs_sweep_")
    csv_path = os.path.join(tmp, "sweep.csv")
    svg_path = os.path.join(tmp, "sweep.svg")
    values = ["1", "64", "256"]  # 1 MiB holds no region of this workload
    res = run(exe, BASE + ["--sweep", "ring-mib=" + ",".join(values),
                           "--sweep-csv", csv_path, "--sweep-svg", svg_path])
    check(res.returncode == 0, "sweep exits 0: %d %s" % (res.returncode, res.stderr))
    check("ring-mib" in res.stdout and "refused" in res.stdout, "table: " + res.stdout)
    with open(csv_path) as f:
        text = f.read()
    rows = list(csv.DictReader(io.StringIO(text)))
    header = text.splitlines()[0].split(",")
    for key in ("knob", "value", "ttft_p50_us", "ttft_p99_us", "goodput_gbps",
                "ring_peak_bytes", "requests_ok", "requests_failed", "verdict", "digest"):
        check(key in header, "CSV header has " + key)
    check([r["value"] for r in rows] == values, "one row per value: %r" % rows)
    check(rows[0]["verdict"] == "refused", "1 MiB refused: %r" % rows[0])
    for row in rows[1:]:
        single = run(exe, BASE + ["--ring-mib", row["value"], "--json"])
        check(single.returncode == 0, "single run exits 0: " + single.stderr)
        rep = json.loads(single.stdout)
        check(row["verdict"] == "ok" and int(row["requests_ok"]) == rep["requests_ok"] == 4,
              "row %s ok" % row["value"])
        check(row["digest"] == rep["digest"], "row %s digest %s vs %s"
              % (row["value"], row["digest"], rep["digest"]))
        for key in ("ttft_p50_us", "ttft_p99_us", "goodput_gbps"):
            check(abs(float(row[key]) - rep[key]) <= 1e-3 * max(1.0, abs(rep[key])),
                  "row %s %s %s vs %s" % (row["value"], key, row[key], rep[key]))
        check(int(row["ring_peak_bytes"]) == rep["ring_peak_bytes"], "ring peak equal")
        # the operator metrics of --json
        check(rep["ttft_p50_us"] <= rep["ttft_p90_us"] <= rep["ttft_p99_us"],
              "TTFT percentiles ordered")
        check(rep["ttft_p50_us"] == rep["e2e_p50_us"], "TTFT is arrival -> done")
        check(0 < rep["ring_p99_bytes"] <= rep["ring_peak_bytes"], "ring p99 <= peak")
        check(0 < rep["nic_util_mean"] <= rep["nic_util_max"] <= 1, "NIC utilisation")
        check(abs(rep["goodput_fraction"] * 100 - rep["goodput_pct"]) < 1e-2,
              "goodput fraction")
        m = rep["instances"][1]["metrics"]
        check(m["ttft_p99_us"] == rep["ttft_p99_us"] and
              m["ring_p99_bytes"] == rep["ring_p99_bytes"], "one decode: its metrics")
    # The chart: well-formed, titled, both series, one x label per value.
    root = ET.parse(svg_path).getroot()
    check(root.tag == SVG + "svg", "SVG root")
    check("ring-mib" in (root.findtext(SVG + "title") or ""), "SVG title")
    names = [g.get("data-name") for g in root.iter(SVG + "g") if g.get("class") == "series"]
    check(names == ["p99 TTFT (ms)", "goodput (Gb/s)"], "series: %r" % names)
    texts = [t.text for t in root.iter(SVG + "text")]
    check(all(v in texts for v in values), "x labels: %r" % texts)
    # decode-instances: that many decode instances of the --decode-tp.
    res = run(exe, BASE + ["--ring-mib", "256", "--sweep", "decode-instances=1,2"])
    check(res.returncode == 0, "decode-instances sweep: " + res.stderr)
    rows = list(csv.DictReader(io.StringIO(res.stdout.split("\n\n", 1)[1])))
    check([r["value"] for r in rows] == ["1", "2"] and
          all(r["verdict"] == "ok" for r in rows), "decode-instances rows: %r" % rows)
    two_argv = [a if a != "2" or BASE[i - 1] != "--decode-tp" else "2,2"
                for i, a in enumerate(BASE)]
    two = run(exe, two_argv + ["--ring-mib", "256", "--json"])
    check(rows[1]["digest"] == json.loads(two.stdout)["digest"],
          "decode-instances=2 is --decode-tp 2,2")
    # Bad sweeps: exit 2, one line.
    for bad in (["--sweep", "ring-mib"], ["--sweep", "ring-mib=64", "--json"],
                ["--sweep", "decode-instances=0"]):
        res = run(exe, BASE + bad)
        check(res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1,
              "%r exits 2 with one line: %d %r" % (bad, res.returncode, res.stderr))
    print("cli_sweep: %d passed, %d failed" % (passed, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
