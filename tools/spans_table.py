"""Print a step table from a dtrace_mk spans JSON-lines file (demo --spans FILE).

One row per (step, rank): start relative to the first step span (us), duration (us),
remote-wait sum and count, and the longest comm:wait of the step; findings last.
Used to read a GPU demo run by eye (issue 7: which steps are slow, on which rank).
"""
import json
import sys
from collections import defaultdict


def outliers(spans, factor=1.3):
    """Steps (outside every finding's steps) whose span is over `factor` x the rank's median,
    and how many of them are slow on every rank at once."""
    steps = [s for s in spans if s["name"].startswith("step ")]
    flagged = set()
    for s in spans:
        if s["name"].startswith("finding:"):
            flagged.update(s["attributes"].get("dtrace_mk.finding.steps") or [])
    by_rank = defaultdict(dict)
    for s in steps:
        a = s["attributes"]
        by_rank[a["dtrace_mk.rank"]][a["dtrace_mk.step"]] = (s["end_time_unix_nano"] - s["start_time_unix_nano"]) / 1e3
    slow = defaultdict(set)
    for r, d in by_rank.items():
        vals = sorted(v for k, v in d.items() if k not in flagged)
        med = vals[len(vals) // 2]
        for k, v in d.items():
            if k not in flagged and v > factor * med:
                slow[k].add(r)
                print(f"outlier: rank {r} step {k} {v:.1f} us (median {med:.1f})")
    both = sorted(k for k, rs in slow.items() if len(rs) == len(by_rank))
    n = len({k for d in by_rank.values() for k in d} - flagged)
    print(f"outliers: {len(slow)} of {n} unflagged steps slow on some rank, {len(both)} on every rank {both}")


def main(path):
    spans = [json.loads(line) for line in open(path)]
    if "--outliers" in sys.argv:
        outliers(spans)
        return
    steps = [s for s in spans if s["name"].startswith("step ")]
    if not steps:
        sys.exit(f"{path}: no step spans")
    t0 = min(s["start_time_unix_nano"] for s in steps)
    waits = defaultdict(list)
    for s in spans:
        if s["name"].startswith("comm:wait"):
            a = s["attributes"]
            waits[(a["dtrace_mk.rank"], a["dtrace_mk.step"])].append(
                (s["end_time_unix_nano"] - s["start_time_unix_nano"]) / 1e3)
    print(f"{'step':>4} {'rank':>4} {'start_us':>12} {'dur_us':>9} {'rw_sum':>8} {'rw_n':>4} {'max_wait':>8}")
    for s in sorted(steps, key=lambda s: (s["attributes"]["dtrace_mk.step"], s["attributes"]["dtrace_mk.rank"])):
        a = s["attributes"]
        r, st = a["dtrace_mk.rank"], a["dtrace_mk.step"]
        w = waits.get((r, st), [])
        print(f"{st:>4} {r:>4} {(s['start_time_unix_nano'] - t0) / 1e3:>12.1f} "
              f"{(s['end_time_unix_nano'] - s['start_time_unix_nano']) / 1e3:>9.1f} "
              f"{a.get('dtrace_mk.remote_wait.sum_us', 0):>8.1f} {a.get('dtrace_mk.remote_wait.count', 0):>4} "
              f"{max(w) if w else 0:>8.1f}")
    seen = set()
    for s in spans:
        if s["name"].startswith("finding:"):
            a = s["attributes"]
            key = (s["name"], a.get("dtrace_mk.finding.rank"), str(a.get("dtrace_mk.finding.steps")),
                   a.get("dtrace_mk.finding.comm_op"), a.get("dtrace_mk.finding.task_class"))
            if key in seen:
                continue
            seen.add(key)
            print(s["name"], "rank", a.get("dtrace_mk.finding.rank"), "steps", a.get("dtrace_mk.finding.steps"),
                  "conf", a.get("dtrace_mk.finding.confidence"), "op", a.get("dtrace_mk.finding.comm_op"),
                  "class", a.get("dtrace_mk.finding.task_class"))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0] if args else "spans.jsonl")
