"""test_library.py - where the package finds libkvstage_sim, in its search
order: $KVSTAGE_LIBRARY (the file, or its folder; a wrong setting is an
error, not skipped), next to the package (its folder, then the folder
_libdir.py names, as `cmake --install` writes it), the system's loader
path. Each case runs in a fresh interpreter, since a process loads the
library once. `import kvstage` works without any library."""

import os
import shutil
import subprocess
import sys

import pytest

import kvstage

PACKAGE = os.path.dirname(os.path.abspath(kvstage.__file__))

PROBE = """
import kvstage
p = kvstage.plan(model="llama-3.1-70b", prefill_tp=8, decode_tp=2, page_size=1)
assert p["max_region_bytes"] == 1342177280, p
print(kvstage.library_path())
"""


def python(code, env_change, pythonpath):
    env = dict(os.environ)
    env.pop("KVSTAGE_LIBRARY", None)
    env.pop("LD_LIBRARY_PATH", None)
    env.update(env_change)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=120)


def package_copy(tmp_path):
    """A copy of the package with no library next to it; returns the
    folder to put on PYTHONPATH."""
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "kvstage",
                    ignore=shutil.ignore_patterns("__pycache__", "_libdir.py", "*.so*"))
    return root


def loaded(res):
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_env_names_the_file(tmp_path, library):
    got = loaded(python(PROBE, {"KVSTAGE_LIBRARY": library}, package_copy(tmp_path)))
    assert got == library


def test_env_names_the_folder(tmp_path, library):
    folder = os.path.dirname(library)
    got = loaded(python(PROBE, {"KVSTAGE_LIBRARY": folder}, package_copy(tmp_path)))
    assert got == os.path.join(folder, "libkvstage_sim.so")


def test_env_wins_over_a_copy_next_to_the_package(tmp_path, library):
    site = package_copy(tmp_path)
    os.symlink(library, site / "kvstage" / "libkvstage_sim.so")
    got = loaded(python(PROBE, {"KVSTAGE_LIBRARY": library}, site))
    assert got == library


@pytest.mark.parametrize("setting", ["missing.so", "empty-folder"])
def test_a_wrong_env_setting_is_an_error(tmp_path, library, setting):
    site = package_copy(tmp_path)
    os.symlink(library, site / "kvstage" / "libkvstage_sim.so")
    target = tmp_path / setting
    if setting == "empty-folder":
        target.mkdir()
    code = ("import kvstage\n"
            "try:\n    kvstage.plan(prefill_tp=1, decode_tp=1, page_size=1)\n"
            "except OSError as e:\n    print('OSError', e)\n")
    res = python(code, {"KVSTAGE_LIBRARY": str(target)}, site)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("OSError KVSTAGE_LIBRARY=%s" % target), res.stdout


def test_next_to_the_package(tmp_path, library):
    site = package_copy(tmp_path)
    os.symlink(library, site / "kvstage" / "libkvstage_sim.so")
    got = loaded(python(PROBE, {}, site))
    assert got == str(site / "kvstage" / "libkvstage_sim.so")


def test_the_install_trees_library_folder(tmp_path, library):
    site = package_copy(tmp_path)
    libdir = tmp_path / "lib"
    libdir.mkdir()
    os.symlink(library, libdir / "libkvstage_sim.so")
    (site / "kvstage" / "_libdir.py").write_text('LIBDIR = "../../lib"\n')
    got = loaded(python(PROBE, {}, site))
    assert got == str(libdir / "libkvstage_sim.so")


def test_the_system_path(tmp_path, library):
    site = package_copy(tmp_path)
    folder = os.path.dirname(library)
    got = loaded(python(PROBE, {"LD_LIBRARY_PATH": folder}, site))
    assert not got.startswith(str(tmp_path)), got
    assert os.path.basename(got).startswith("libkvstage_sim.so"), got


def test_nothing_found_names_where_it_looked(tmp_path):
    site = package_copy(tmp_path)
    code = ("import kvstage\n"
            "try:\n    kvstage.simulate()\n"
            "except OSError as e:\n    print('OSError', e)\n")
    res = python(code, {}, site)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("OSError kvstage: cannot load libkvstage_sim"), out
    assert str(site / "kvstage" / "libkvstage_sim.so") in out
    assert "the system library path" in out and "KVSTAGE_LIBRARY" in out
