#!/usr/bin/env python3
"""call_graph.py - which files of hw/ and sim/ call each other (issue 27:
"no two files in hw/ or sim/ call each other"). A file calls another when
it calls a function the other defines (not static); two files that call
each other are a pair, the knot a newcomer cannot read one way.

    call_graph.py ROOT            checks against tests/call_graph_known.txt:
                                  exit 1 naming any pair not listed there
                                  (a new knot) or listed but gone (take it
                                  off the list: the list only shrinks)
    call_graph.py ROOT --print    every pair, and what each side calls

The list is the ratchet until hw/net and the simulator's split untie them
all; then it is empty and the check is the issue's."""
import os
import re
import sys

DIRS = ("hw", "sim")
DEFINE = re.compile(r"^(?!static\b|extern\b|typedef\b|#)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(")
CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])'", re.S)


def sources(root):
    for top in DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if n.endswith((".c", ".cu")):
                    path = os.path.join(dirpath, n)
                    yield os.path.relpath(path, root), path


def strip(text):
    """The code without comments and string literals (newlines kept)."""
    return COMMENTS.sub(lambda m: "\n" * m.group(0).count("\n") if m.group(0)[0] == "/" else '""',
                        text)


def definitions(code):
    """Names of the functions this file defines with external linkage: a
    line at column 0 naming a function whose parameter list is followed by
    a body, not a semicolon."""
    out = set()
    lines = code.split("\n")
    for i, line in enumerate(lines):
        m = DEFINE.match(line)
        if not m or m.group(1) in ("if", "for", "while", "switch", "return", "sizeof"):
            continue
        rest = "\n".join(lines[i:i + 12])
        depth, j = 0, rest.index("(")
        for j in range(j, len(rest)):
            depth += {"(": 1, ")": -1}.get(rest[j], 0)
            if depth == 0:
                break
        after = rest[j + 1:].lstrip()
        if after.startswith("{"):
            out.add(m.group(1))
    return out


def graph(root):
    code = {rel: strip(open(path, encoding="utf-8", errors="replace").read())
            for rel, path in sources(root)}
    owner = {}
    for rel, text in code.items():
        for name in definitions(text):
            owner.setdefault(name, rel)
    calls = {rel: {} for rel in code}
    for rel, text in code.items():
        for m in CALL.finditer(text):
            other = owner.get(m.group(1))
            if other is not None and other != rel:
                calls[rel].setdefault(other, set()).add(m.group(1))
    return calls


def pairs(calls):
    out = []
    for a in sorted(calls):
        for b in sorted(calls[a]):
            if a < b and a in calls.get(b, {}):
                out.append((a, b))
    return out


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    calls = graph(root)
    found = pairs(calls)
    if "--print" in argv:
        for a, b in found:
            print("%s <-> %s" % (a, b))
            print("    %s calls %s" % (a, ", ".join(sorted(calls[a][b]))))
            print("    %s calls %s" % (b, ", ".join(sorted(calls[b][a]))))
        print("call_graph: %d files, %d pairs that call each other" % (len(calls), len(found)))
        return 0
    known_path = os.path.join(root, "tests", "call_graph_known.txt")
    known = set()
    with open(known_path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                a, b = (s.strip() for s in line.split("<->"))
                known.add((min(a, b), max(a, b)))
    new = [p for p in found if p not in known]
    gone = sorted(known - set(found))
    for a, b in new:
        below = ("hw/net" if a.startswith(("hw/verbs", "hw/ofi")) else "hw/common"
                 if a.startswith("hw/") else "a file of its own")
        print("call_graph: %s and %s now call each other (%s -> %s; %s -> %s): make the "
              "calls run one way (what both need belongs below both, in %s)"
              % (a, b, a, ", ".join(sorted(calls[a][b])), b, ", ".join(sorted(calls[b][a])),
                 below))
    for a, b in gone:
        print("call_graph: %s <-> %s no longer call each other: take the line off "
              "tests/call_graph_known.txt" % (a, b))
    if new or gone:
        return 1
    print("call_graph: %d files in %s, %d known pairs left to untie, no new one"
          % (len(calls), "/ ".join(DIRS) + "/", len(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
