#!/usr/bin/python3 -B
# tests/check_includes.py [-v]: check the layout of libcommon/
# (libcommon/README.md), from the sources alone (no build, no database), as
# a TAP test (make check runs it):
#
#   1. the front (libcommon/*.c, *.h) includes no header of a backend
#      (libcommon/pg/, libcommon/mongo/), and no backend one of the other;
#   2. no header includes itself again through others (an include cycle);
#   3. no two files of libcommon depend on each other, directly or round
#      a longer cycle: file A depends on file B when A uses a function or
#      variable that B defines and that a header A includes (itself or
#      through the headers it includes) declares.  A backend's files
#      share their private header(s), so that each depends only on the
#      files below it: a step file on the backend's core, never the core
#      on a step.
#
# -v also prints every file's dependencies (file: what it depends on, and
# by which names).  Exit status 0 when all hold, 1 when not.
import os
import re
import sys

top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
lib = os.path.join(top, "libcommon")
verbose = "-v" in sys.argv[1:]
PARTS = ("pg", "mongo")


def part(rel):
    """The part a file of libcommon is in: "front", "pg" or "mongo"."""
    d = os.path.dirname(rel)
    return d if d in PARTS else "front"


files = []
for d in ("",) + PARTS:
    if not os.path.isdir(os.path.join(lib, d)):
        continue
    for n in sorted(os.listdir(os.path.join(lib, d))):
        if n.endswith((".c", ".h")):
            files.append(os.path.join(d, n))


def code(rel):
    """The text of a file without its comments and string literals."""
    with open(os.path.join(lib, rel), encoding="utf-8") as f:
        t = f.read()
    t = re.sub(r"/\*.*?\*/", " ", t, flags=re.S)
    t = re.sub(r"//[^\n]*", " ", t)
    t = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', t)
    return re.sub(r"'(?:\\.|[^'\\\n])*'", "''", t)


text = {f: code(f) for f in files}
raw_includes = {}
for f in files:
    with open(os.path.join(lib, f), encoding="utf-8") as fh:
        raw_includes[f] = re.findall(r'^\s*#\s*include\s+"([^"]+)"', fh.read(), flags=re.M)


def resolve(f, inc):
    """A quoted #include of f as a file of libcommon (as the compiler finds
    it: beside f first, then -I libcommon), or None (config.h, ...)."""
    for base in (os.path.dirname(f), ""):
        rel = os.path.normpath(os.path.join(base, inc))
        if rel in text:
            return rel
    return None


includes = {f: [r for r in (resolve(f, i) for i in raw_includes[f]) if r] for f in files}

# the globals each .c defines: a function (its name at the start of a
# line, then "(", the style of these sources) or a variable (a line at
# file scope that is not static and ends in an initializer)
defined = {}
for f in files:
    if not f.endswith(".c"):
        continue
    for m in re.finditer(r"^(\w+)\s*\(", text[f], flags=re.M):
        start = text[f].rfind("\n", 0, m.start() - 1) + 1
        if not text[f][start:m.start()].lstrip().startswith("static"):
            defined.setdefault(m.group(1), f)
    for m in re.finditer(r"^(?!static\b)(?:const\s+|extern\s+)?[\w ]+?\b(\w+)\s*(?:\[\w*\])?\s*=", text[f], flags=re.M):
        defined.setdefault(m.group(1), f)


def closure(h, seen=None):
    """The headers h includes, itself and through others."""
    seen = set() if seen is None else seen
    for i in includes[h]:
        if i.endswith(".h") and i not in seen:
            seen.add(i)
            closure(i, seen)
    return seen


ok_all = True
results = []

# 1. the front includes no backend header; a backend none of another
bad = []
for f in files:
    for i in includes[f]:
        if part(i) != "front" and part(i) != part(f):
            bad.append("%s includes %s" % (f, i))
results.append(("the front includes no backend header, a backend none of another", bad))

# 2. no include cycle between headers
bad = []
for h in files:
    if h.endswith(".h") and h in closure(h):
        bad.append("%s includes itself (through %s)" % (h, ", ".join(sorted(closure(h) - {h}))))
results.append(("no header includes itself through others", bad))

# 3. the dependencies between files, and their cycles
words = {f: set(re.findall(r"\b\w+\b", text[f])) for f in files}
declared = {h: words[h] & set(defined) for h in files if h.endswith(".h")}
deps = {f: {} for f in files if f.endswith(".c")}
for f in deps:
    for h in closure(f):
        for name in declared[h] & words[f]:
            g = defined[name]
            if g != f:
                deps[f].setdefault(g, set()).add(name)

index, low, stack, on, sccs = {}, {}, [], set(), []


def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(deps.get(v, {})):
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        c = []
        while True:
            w = stack.pop()
            on.discard(w)
            c.append(w)
            if w == v:
                break
        if len(c) > 1:
            sccs.append(sorted(c))


sys.setrecursionlimit(10000)
for v in sorted(deps):
    if v not in index:
        strong(v)
bad = []
for c in sccs:
    bad.append("a cycle: " + ", ".join(c))
    for a in c:
        for b in c:
            if b in deps[a]:
                bad.append("  %s -> %s (%s)" % (a, b, " ".join(sorted(deps[a][b]))))
results.append(("no cycle between the files of libcommon (through the headers they share)", bad))

print("1..%d" % len(results))
for n, (what, bad) in enumerate(results, 1):
    print("%s %d - %s" % ("not ok" if bad else "ok", n, what))
    for line in bad:
        print("# " + line)
    ok_all = ok_all and not bad
if verbose:
    for f in sorted(deps):
        print("# libcommon/%s: %s" % (f, ", ".join(sorted(deps[f])) or "-"))
sys.exit(0 if ok_all else 1)
