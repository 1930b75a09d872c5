"""Helpers of scripts/gitleaks-compare.

samples JSONL DIR: writes each sample of gitleaks' samples-dev.jsonl to DIR/<n>/<file>
    (its `path` when it has one, else sample.txt).
time NAME RUNS CMD...: runs CMD RUNS times, prints NAME and the median wall time.
compare TITLE GITLEAKS.json MOAT.json TIMES: prints the agreement of two JSON reports
    on (Commit, File, RuleID, StartLine) and the timing ratio; lists differences.
"""
import json
import os
import statistics
import subprocess
import sys
import time


def samples(jsonl, out):
    n = 0
    with open(jsonl) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            s = json.loads(line)
            rel = s.get("path") or "sample.txt"
            p = os.path.join(out, f"{i:04d}", rel.lstrip("/"))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as g:
                g.write(s["text"])
            n += 1
    print(f"{n} samples written", file=sys.stderr)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def keys(data):
    return {(d.get("Commit", ""), d["File"].lstrip("./"), d["RuleID"], d["StartLine"]) for d in data}


def full_keys(data):
    """Every field (Entropy to 5 decimals)."""
    fields = ["Commit", "File", "SymlinkFile", "RuleID", "Description", "StartLine", "EndLine",
              "StartColumn", "EndColumn", "Match", "Secret", "Author", "Email", "Date", "Message",
              "Tags", "Fingerprint"]
    return {tuple(str(d.get(k, "")).lstrip("./") if k in ("File", "Fingerprint") else str(d.get(k, ""))
                  for k in fields) + (round(float(d.get("Entropy", 0)), 5),)
            for d in data}


def compare(title, gpath, mpath, times):
    gd, md = load(gpath), load(mpath)
    print(f"\n== {title}")
    if gd is None or md is None:
        print(f"  no report from {'gitleaks' if gd is None else 'moat'}")
        return
    g, m = keys(gd), keys(md)
    both = g & m
    print(f"  findings: gitleaks {len(gd)}, moat {len(md)}; distinct (commit, file, rule, line): "
          f"gitleaks {len(g)}, moat {len(m)}, same {len(both)}")
    fg, fm = full_keys(gd), full_keys(md)
    print(f"  distinct findings identical in every field: {len(fg & fm)} of {len(fg)}")
    # Fields that differ, for findings with the same (commit, file, rule, line).
    fields = ["StartColumn", "EndColumn", "EndLine", "Match", "Secret", "Author", "Email", "Date",
              "Message", "Tags", "Description", "SymlinkFile"]
    mi = {}
    for d in md:
        mi.setdefault((d.get("Commit", ""), d["File"].lstrip("./"), d["RuleID"], d["StartLine"]), []).append(d)
    diff = {}
    for d in gd:
        k = (d.get("Commit", ""), d["File"].lstrip("./"), d["RuleID"], d["StartLine"])
        cands = mi.get(k, [])
        if not cands or any(all(c.get(f) == d.get(f) for f in fields) for c in cands):
            continue
        for f in fields:
            if all(c.get(f) != d.get(f) for c in cands):
                diff[f] = diff.get(f, 0) + 1
    if diff:
        print(f"  fields differing (gitleaks findings with no identical moat finding): {diff}")
    for name, only in (("only gitleaks", sorted(g - m)), ("only moat", sorted(m - g))):
        if only:
            print(f"  {name}: {len(only)}")
            for k in only[:20]:
                print(f"    {k[0][:10] + ' ' if k[0] else ''}{k[1]}:{k[3]} {k[2]}")
    t = {}
    with open(times) as f:
        for line in f:
            name, secs = line.split()
            t[name.split("-")[0]] = float(secs)
    if "gitleaks" in t and "moat" in t and t["moat"] > 0:
        print(f"  time: gitleaks {t['gitleaks']:.3f} s, moat {t['moat']:.3f} s, "
              f"gitleaks/moat {t['gitleaks'] / t['moat']:.2f}x")


def timed(name, runs, cmd):
    secs = []
    for _ in range(int(runs)):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        secs.append(time.perf_counter() - start)
    print(f"{name} {statistics.median(secs):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "samples":
        samples(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "time":
        timed(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        compare(*sys.argv[2:6])
