"""cli_suite.py - the small check harness the CLI tests share: runs the
binary, counts passed and failed checks, prints each failure with the
command that replays it. Standard library only."""

import json
import shlex
import subprocess


class Suite:
    def __init__(self, binary, timeout_s=60):
        self.binary = binary
        self.timeout_s = timeout_s
        self.passed = 0
        self.failed = 0

    def run(self, args):
        return subprocess.run([self.binary] + args, capture_output=True,
                              text=True, timeout=self.timeout_s)

    def cmd(self, args):
        return " ".join(shlex.quote(x) for x in [self.binary] + args)

    def ok(self, cond, name, args, detail=""):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s: %s\n    %s" % (name, detail, self.cmd(args)))
        return cond

    def expect_ok(self, name, args, contains=()):
        """Exit 0, nothing on stderr (not a terminal: no progress line is
        drawn), stdout has every string of contains."""
        res = self.run(args)
        if not self.ok(res.returncode == 0 and res.stderr == "", name, args,
                       "exit %d, stderr %r" % (res.returncode, res.stderr)):
            return res
        for text in contains:
            self.ok(text in res.stdout, name, args,
                    "stdout lacks %r:\n%s" % (text, res.stdout))
        return res

    def expect_json(self, name, args):
        res = self.expect_ok(name, args)
        try:
            obj = json.loads(res.stdout)
        except ValueError as exc:
            self.ok(False, name, args, "not JSON: %s: %r" % (exc, res.stdout))
            return {}
        self.ok(isinstance(obj, dict), name, args, "not a JSON object")
        return obj if isinstance(obj, dict) else {}

    def expect_usage_error(self, name, args, flag):
        """Exit 2, exactly one stderr line that names flag, empty stdout."""
        res = self.run(args)
        lines = res.stderr.splitlines()
        self.ok(res.returncode == 2, name, args,
                "want exit 2, got %d (stderr %r)" % (res.returncode,
                                                     res.stderr[:300]))
        self.ok(len(lines) == 1, name, args,
                "want one stderr line, got %r" % res.stderr[:500])
        self.ok(bool(lines) and flag in lines[0], name, args,
                "stderr does not name %s: %r" % (flag, res.stderr[:300]))
        self.ok(res.stdout == "", name, args,
                "stdout not empty: %r" % res.stdout[:200])
