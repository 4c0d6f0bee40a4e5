"""engine_procs.py - what the engine adapters' harnesses share
(test_sglang_adapter.py, test_vllm_adapter.py): the checks that skip them
where they cannot run, and their three processes (prefill A, prefill B,
decode) run until the decode asks for B's death (DIR/kill_now); B is
SIGKILLed, the time written to DIR/killed, and A and the decode run to
their ends."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from kvstage import _library


def need_ofi_and_torch(what):
    """Skips, naming the package to install, where the harness cannot run.
    The engine processes need torch; the test's own process does not import
    it (under ASan its import alone takes seconds)."""
    if not hasattr(_library.load_backend("hw"), "kvs_ofi_fabric_create"):
        pytest.skip("this kvstage was built without libfabric (install libfabric-dev, "
                    "rebuild): no ofi fabric to test %s on" % what)
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (install python3-torch): the harness's KV "
                    "pools are torch tensors")


def run_with_kill(script, env, folder, args):
    """Runs `script` once per entry of args ({"A": [...], "B": [...],
    "decode": [...]}), kills B when the decode asks, and returns the output
    of A and of the decode, each of which must exit 0."""
    def start(extra):
        return subprocess.Popen([sys.executable, script] + [str(a) for a in extra], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs = {name: start(extra) for name, extra in args.items()}
    try:
        end = time.time() + 60
        while not (folder / "kill_now").exists():
            for name, p in procs.items():
                if p.poll() is not None:
                    raise AssertionError("%s exited %d before the kill:\n%s" % (
                        name, p.returncode, p.communicate()[0].decode(errors="replace")))
            assert time.time() < end, "the decode never asked for the kill"
            time.sleep(0.02)
        procs["B"].send_signal(signal.SIGKILL)
        procs["B"].wait()
        (folder / "killed.tmp").write_text(repr(time.time()))
        os.rename(folder / "killed.tmp", folder / "killed")
        outs = {}
        for name in ("A", "decode"):
            outs[name] = procs[name].communicate(timeout=60)[0].decode(errors="replace")
            assert procs[name].returncode == 0, "%s exited %d:\n%s" % (
                name, procs[name].returncode, outs[name])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    for name, text in outs.items():
        print("---- %s\n%s" % (name, text))  # their time stamps, under pytest -s
    return outs
