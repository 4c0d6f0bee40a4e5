"""conftest.py - what the binding's tests need from the build, passed in
the environment by ctest (CMakeLists.txt, "the Python binding" block):
  PYTHONPATH        holds python/ (the package under test)
  KVSTAGE_LIBRARY   the build's libkvstage_sim.so
  KVSTAGE_CLI       the build's `kvstage` (plan and sim --json are the
                    reference the dicts are checked against)
  KVSTAGE_INCLUDE   include/ (test_abi.py compiles the public headers)
  KVSTAGE_CC        the C compiler of the build
A missing one fails the test that needs it, never skips it."""

import json
import os
import subprocess

import pytest


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail("%s is not set: run these tests through ctest, or set it "
                    "as python/tests/conftest.py says" % name)
    return value


@pytest.fixture(scope="session")
def cli():
    """Runs `kvstage ARGS --json` and returns the parsed object."""
    binary = _env("KVSTAGE_CLI")

    def run(*args):
        res = subprocess.run([binary] + [str(a) for a in args] + ["--json"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, "kvstage %s: exit %d: %s" % (
            " ".join(map(str, args)), res.returncode, res.stderr)
        return json.loads(res.stdout)
    return run


@pytest.fixture(scope="session")
def include_dir():
    return _env("KVSTAGE_INCLUDE")


@pytest.fixture(scope="session")
def c_compiler():
    return _env("KVSTAGE_CC")


@pytest.fixture(scope="session")
def library():
    return _env("KVSTAGE_LIBRARY")
