#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/recovery's claim breakdown: from a server log of auto_explain plans
(log_nested_statements, log_buffers, log_line_prefix '%n [%p] '), one row per
statement (its first 70 characters): in each phase, the plans sampled, the
median shared buffers (hit + read) of its top node and its median ms.

    claim_statements.py LOG SCHEMA NAME:FROM_MS:TO_MS...
"""
import re, sys, collections
log, schema = sys.argv[1], sys.argv[2]
phases = [(n, int(a), int(b)) for n, a, b in (x.split(":") for x in sys.argv[3:])]
entries, cur = [], None
for line in open(log, errors="replace"):
    m = re.match(r"^(\d{10})\.(\d{3}) \[(\d+)\] LOG:  duration: ([\d.]+) ms  plan:", line)
    if m:
        cur = {"t": int(m.group(1)) * 1000 + int(m.group(2)), "ms": float(m.group(4)), "q": None, "buf": None, "nodes": []}
        entries.append(cur); continue
    if re.match(r"^\d{10}\.\d{3} \[", line):
        cur = None; continue
    if cur is None: continue
    if cur["q"] is None and "Query Text:" in line:
        cur["q"] = line.split("Query Text:", 1)[1].strip()
    elif cur["buf"] is None and "Buffers:" in line:
        sh = line.split("Buffers:", 1)[1].split(",")[0]
        cur["buf"] = sum(int(x) for x in re.findall(r"(?:hit|read)=(\d+)", sh)) if "shared" in sh else 0
def med(v):
    v = sorted(v); return v[len(v) // 2] if v else 0
agg = collections.defaultdict(lambda: collections.defaultdict(list))
for e in entries:
    q = re.sub(r"\s+", " ", (e["q"] or "")).replace('"%s".' % schema, "").replace(schema + ".", "")
    for n, a, b in phases:
        if a <= e["t"] < b: agg[q[:70]][n].append((e["buf"] or 0, e["ms"]))
names = [p[0] for p in phases]
print("| statement (first 70 characters) | " + " | ".join("%s: n, buffers p50, ms p50" % n for n in names) + " |")
print("| --- |" + " ---: |" * len(names))
# the statements that cost most in the second phase (the pressure) first
rows = sorted(agg.items(), key=lambda kv: -med([x[0] for x in kv[1].get(names[min(1, len(names) - 1)], [])]))
for q, d in rows[:12]:
    print("| `%s` | " % q.replace("|", "\\|") + " | ".join("%d, %d, %.2f" % (len(d[n]), med([x[0] for x in d[n]]), med([x[1] for x in d[n]])) if d[n] else "-" for n in names) + " |")
