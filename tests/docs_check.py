#!/usr/bin/env python3
"""docs_check.py - the documentation checked against the tree it describes.

Fails, naming the doc and what to change, when
  - a repository path a doc names in backticks (src/..., hw/..., tests/...;
    a <name> placeholder or a * matches any file) or a relative link
    points at nothing;
  - a doc names a public header <kvstage/x.h> that include/kvstage/ lacks,
    or a public header exists that docs/architecture.md's layout of the
    tree does not name;
  - a folder of the tree (src, sim, hw/*, tools, tests, fuzz, python,
    cmake, docs) is missing from that layout, or it names one that is gone;
  - a status code of the X-macro list (include/kvstage/kvstage.h) has no
    heading "### `KVS_NAME` (value)" in docs/troubleshooting.md, or a
    heading there names a code that no longer exists or another value;
  - a page of docs/ is not linked from the index, docs/README.md;
  - a source file of src/, sim/, hw/, tools/ or python/kvstage/, or a
    test file of tests/ or python/tests/, is not named in tests/README.md
    (by its path, a glob of paths, or, for a test, its ctest name).

usage: docs_check.py SOURCE_DIR
"""
import fnmatch
import glob
import os
import re
import sys

TOPS = ("src/", "sim/", "hw/", "tests/", "fuzz/", "tools/", "include/",
        "docs/", "python/", "cmake/", ".ci/")


def exists(root, path):
    """Whether a named path matches something; <x> and * match anything."""
    pattern = re.sub(r"<[^>]*>", "*", path)
    if any(c in pattern for c in "*?["):
        return bool(glob.glob(os.path.join(root, pattern)))
    return os.path.exists(os.path.join(root, pattern))


def unmapped(root):
    """Files tests/README.md does not name: a newcomer looks there first."""
    text = open(os.path.join(root, "tests/README.md"), encoding="utf-8").read()
    ticked = set(re.findall(r"`([^`\s]+)`", text))
    globs = [t for t in ticked if "*" in t and "<" not in t]
    stems = {t for t in ticked if "/" not in t}
    sources = [f for pat in ("src/*.c", "sim/*.c", "hw/*/*.c", "tools/*.c",
                             "python/kvstage/**/*.py")
               for f in glob.glob(pat, recursive=True)
               if os.path.basename(f) != "__init__.py"]
    tests = [f for pat in ("tests/*.c", "tests/*.py", "tests/*.sh", "tests/*/*.c",
                           "tests/*/*.cu", "tests/*/*.py", "tests/*/*.sh", "python/tests/*.py")
             for f in glob.glob(pat)]
    problems = []
    for f in sorted(set(sources) | set(tests)):
        stem = os.path.splitext(os.path.basename(f))[0]
        named = (f in ticked or any(fnmatch.fnmatch(f, g) for g in globs) or
                 (f in tests and stem in stems) or
                 (f.startswith("python/") and os.path.basename(f) in stems))
        if not named:
            problems.append(f"tests/README.md: does not name {f}: say where it is tested "
                            "(or, for a test, what it tests)")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    os.chdir(root)
    problems = []
    docs = ["README.md", "tests/README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))

    for doc in docs:
        text = open(doc, encoding="utf-8").read()
        for m in re.finditer(r"`([^`\s]+)`", text):
            path = re.sub(r"[:#].*$", "", m.group(1)).rstrip(".,;)")
            if path.startswith(TOPS) and not exists(root, path):
                problems.append(f"{doc}: names `{m.group(1)}`, which is not in the tree")
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1).split("#")[0]
            if not target or target.startswith(("http://", "https://", "mailto:")):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(doc), target))):
                problems.append(f"{doc}: links to {m.group(1)}, which does not exist")
        for m in re.finditer(r"<kvstage/([A-Za-z0-9_]+\.h)>", text):
            if not os.path.exists(os.path.join("include/kvstage", m.group(1))):
                problems.append(f"{doc}: names {m.group(0)}, not a header of include/kvstage/")

    arch = open("docs/architecture.md", encoding="utf-8").read()
    layout = re.search(r"## Layout of the tree\n.*?```\n(.*?)```", arch, re.S)
    if layout is None:
        problems.append("docs/architecture.md: no ``` block under '## Layout of the tree'")
    else:
        block = layout.group(1)
        named = set(re.findall(r"^(\S+/)\s", block, re.M))
        folders = {"include/kvstage/", "src/", "sim/", "tools/", "tests/", "fuzz/",
                   "python/", "cmake/", "docs/"}
        folders |= {d + "/" for d in glob.glob("hw/*") if os.path.isdir(d)}
        for f in sorted(folders - named):
            problems.append(f"docs/architecture.md: the layout of the tree lacks {f}")
        for f in sorted(named - folders):
            if not os.path.isdir(f):
                problems.append(f"docs/architecture.md: the layout names {f}, which is gone")
        for h in sorted(glob.glob("include/kvstage/*.h")):
            if os.path.basename(h) not in block:
                problems.append(f"docs/architecture.md: the layout does not name the public "
                                f"header {os.path.basename(h)}")

    header = open("include/kvstage/kvstage.h", encoding="utf-8").read()
    codes = {name: int(value) for name, value in
             re.findall(r"X\((OK|E[A-Z0-9_]+),\s*(-?\d+),", header)}
    if len(codes) < 10:
        problems.append("include/kvstage/kvstage.h: found only %d status codes in the "
                        "X-macro list; has its form changed?" % len(codes))
    trouble = open("docs/troubleshooting.md", encoding="utf-8").read()
    headings = {name: int(value) for name, value in
                re.findall(r"^### `KVS_([A-Z0-9_]+)` \((-?\d+)\)", trouble, re.M)}
    for name, value in sorted(codes.items(), key=lambda kv: -kv[1]):
        if name not in headings:
            problems.append(f"docs/troubleshooting.md: no heading ### `KVS_{name}` ({value}): "
                            "say its cause and its fix")
        elif headings[name] != value:
            problems.append(f"docs/troubleshooting.md: KVS_{name} is ({headings[name]}) "
                            f"there, ({value}) in kvstage.h")
    for name in sorted(set(headings) - set(codes)):
        problems.append(f"docs/troubleshooting.md: KVS_{name} is no status code any more")

    index = open("docs/README.md", encoding="utf-8").read()
    for page in sorted(glob.glob("docs/*.md")):
        base = os.path.basename(page)
        if base != "README.md" and f"({base}" not in index:
            problems.append(f"docs/README.md: the index does not link {base}")

    problems += unmapped(root)

    for p in problems:
        print("docs_check: " + p)
    print("docs_check: %d docs, %d status codes, %d problems" %
          (len(docs), len(codes), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
