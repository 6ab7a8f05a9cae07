"""Host side of printing: turn maps (+ coverage) into bpftrace-style text or NDJSON.

Everything is driven by the printing plan the compiler embeds in the object (see
`passes/lower.build_plan`), so a `.o` compiled yesterday prints the same today:

* `map_block(plan_map, mapset, coverage_rows)` reads one map into a JSON-serialisable
  block: entries with decoded keys (task class ids rendered as names through the plan's
  schema names), values by aggregation, and the map's coverage (the summed coverage of
  the programs that write it: eligible / executed / throttled / lost).
* `render_text(blocks)` renders blocks like bpftrace (`@slow[3]:` then a histogram with
  bars, `@c[attn]: 12` lines sorted by value), a coverage line under each map and a
  WARNING line when anything was throttled or lost.
* `render_json(blocks)` gives newline-delimited JSON with the same content.
* `merge_blocks(parts)` combines the blocks of several ranks into one view of the job:
  each map by its aggregation, coverage summed (`dtrace-mk attach --merge`).
"""
from __future__ import annotations

import json
from typing import Dict, Iterable, List, Optional, Sequence

from ..bpf.coverage import Coverage

BAR_WIDTH = 52
U64 = (1 << 64) - 1


# --- values ---------------------------------------------------------------------------

def _words(raw: bytes, n: int) -> List[int]:
    return [int.from_bytes(raw[8 * i:8 * i + 8], "little") for i in range(n)]


def key_label(value: int, ty: str, names: dict) -> object:
    """A key value as users see it: a name for named types, else the integer."""
    if ty == "hook":
        return names.get("hook", {}).get(str(value), f"hook#{value}")
    if ty in ("task_class", "comm_op", "event"):
        table = names.get(ty) or []
        if 0 <= value < len(table):
            return table[value]
        return {"task_class": "class", "comm_op": "comm_op", "event": "event"}[ty] + f"#{value}"
    return value


def decode_value(pm: dict, raw) -> object:
    agg = pm["agg"]
    if agg in ("hist", "lhist"):
        return list(raw)
    w = _words(bytes(raw), len(pm["value"]))
    if agg == "avg":
        c, s = w
        return {"count": c, "sum": s, "avg": s // c if c else 0}
    if agg == "stats":
        c, s, mn, mx = w
        return {"count": c, "sum": s, "avg": s // c if c else 0, "min": mn if c else 0, "max": mx}
    return w[0]


def _sort_value(agg: str, v) -> int:
    if agg in ("hist", "lhist"):
        return 0
    if isinstance(v, dict):
        return v["avg"] if agg == "avg" else v["count"]
    return v


def coverage_of(pm: dict, rows: Iterable[Coverage]) -> dict:
    progs = set(pm.get("programs", ()))
    total = {"eligible": 0, "executed": 0, "throttled": 0, "lost": 0}
    reasons: Dict[str, int] = {}
    for r in rows:
        if r.program in progs:
            for k in total:
                total[k] += getattr(r, k)
            for k, n in r.reasons.items():
                reasons[k] = reasons.get(k, 0) + n
    total["reasons"] = dict(sorted(reasons.items()))
    return total


def coverage_since(now: dict, base: Optional[dict]) -> dict:
    """Coverage counted after `base` (the totals when the map was last cleared)."""
    if not base:
        return now
    out = {k: now[k] - base[k] for k in ("eligible", "executed", "throttled", "lost")}
    out["reasons"] = {k: n - base["reasons"].get(k, 0) for k, n in now["reasons"].items()
                      if n - base["reasons"].get(k, 0)}
    return out


def map_block(pm: dict, mapset, rows: Iterable[Coverage], names: dict, when: str = "END",
              baseline: Optional[dict] = None) -> dict:
    """One map of the plan read from a MapSet, as a JSON-serialisable block.  `baseline`:
    the map's coverage when it was last cleared (so coverage describes what it holds)."""
    m = mapset[pm["bpf_map"]]
    if pm["map_type"] == "per_worker_array":      # unkeyed count/sum/avg: one entry, even 0
        snap = m.snapshot(per_worker=False)
    else:
        snap = m.snapshot()
    entries = []
    nkeys = len(pm["keys"])
    for kraw, vraw in snap.items():
        kvals = _words(kraw, nkeys)
        v = decode_value(pm, vraw)
        if pm["agg"] in ("hist", "lhist") and not any(v):
            continue
        entries.append({"key": [key_label(x, k["type"], names) for x, k in zip(kvals, pm["keys"])],
                        "raw_key": kvals, "value": v})
    entries.sort(key=lambda e: (_sort_value(pm["agg"], e["value"]), e["raw_key"]))
    if pm["agg"] in ("hist", "lhist"):
        entries.sort(key=lambda e: e["raw_key"])
    for e in entries:
        del e["raw_key"]
        if pm["agg"] in ("hist", "lhist"):
            e["value"] = hist_buckets(pm, e["value"])
    block = {"type": "map", "when": when, "name": pm["name"], "agg": pm["agg"],
             "keys": [k["name"] for k in pm["keys"]], "entries": entries,
             "coverage": coverage_since(coverage_of(pm, rows), baseline)}
    if pm["agg"] in ("hist", "lhist"):
        block["layout"] = dict(pm["value"])      # the bucket layout (merge_blocks rebuilds counts)
    return block


# --- histograms -------------------------------------------------------------------------

def _num(v: int) -> str:
    """1024 -> 1K, 3 -> 3 (bpftrace's power-of-1024 suffixes)."""
    for suffix, p in (("E", 60), ("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if v >= (1 << p) and v % (1 << p) == 0:
            return f"{v >> p}{suffix}"
    return str(v)


def hist_buckets(pm: dict, counts: Sequence[int]) -> List[dict]:
    """Non-empty range of buckets (first..last non-zero) as {label, lo, hi, count}."""
    nz = [i for i, c in enumerate(counts) if c]
    if not nz:
        return []
    out = []
    val = pm["value"]
    for i in range(nz[0], nz[-1] + 1):
        if val["layout"] == "log2":
            if i == 0:
                lo, hi, label = 0, 1, "[0]"
            elif i == 1:
                lo, hi, label = 1, 2, "[1]"
            elif i == len(counts) - 1:
                lo, hi = 1 << (i - 1), None
                label = f"[{_num(lo)}, ...)"
            else:
                lo, hi = 1 << (i - 1), 1 << i
                label = f"[{_num(lo)}, {_num(hi)})"
        else:
            lo0, hi0, step = val["lo"], val["hi"], val["step"]
            if i == 0:
                lo, hi, label = None, lo0, f"(..., {lo0})"
            elif i == len(counts) - 1:
                lo, hi, label = hi0, None, f"[{hi0}, ...)"
            else:
                lo = lo0 + (i - 1) * step
                hi = min(lo + step, hi0)
                label = f"[{lo}, {hi})"
        out.append({"label": label, "lo": lo, "hi": hi, "count": counts[i]})
    return out


def bucket_counts(layout: dict, buckets: Sequence[dict]) -> List[int]:
    """The inverse of hist_buckets: the full counts array of `layout` (a plan map's
    "value") from the buckets of a block; a bucket's index is the map's own bucket
    (bpf.maps) of a value it holds (its lower bound; the underflow bucket's upper - 1)."""
    from ..bpf.maps import linear_bucket, log2_bucket
    from ..bpf.program import MapDef
    n = int(layout["buckets"])
    if layout["layout"] == "log2":
        index = log2_bucket
    else:
        md = MapDef("", "hist_linear", 8, 8 * n, 1, lin_lo=layout["lo"], lin_hi=layout["hi"], lin_step=layout["step"])
        index = lambda v: linear_bucket(md, v)        # noqa: E731
    counts = [0] * n
    for b in buckets:
        i = index(b["lo"] if b["lo"] is not None else b["hi"] - 1)
        if not 0 <= i < n:
            raise ValueError(f"bucket {b['label']} is outside the layout {layout}")
        counts[i] += int(b["count"])
    return counts


def render_hist(buckets: List[dict]) -> List[str]:
    if not buckets:
        return []
    top = max(b["count"] for b in buckets)
    lines = []
    for b in buckets:
        n = b["count"] * BAR_WIDTH // top if top else 0
        lines.append(f"{b['label']:<16}{b['count']:>8} |{'@' * n:<{BAR_WIDTH}}|")
    return lines


# --- text -------------------------------------------------------------------------------

def _key_text(name: str, key: list) -> str:
    return f"{name}[{', '.join(str(k) for k in key)}]" if key else name


def _coverage_lines(b: dict) -> List[str]:
    c = b["coverage"]
    out = [f"coverage {b['name']}: eligible {c['eligible']}, executed {c['executed']}, "
           f"throttled {c['throttled']}, lost {c['lost']}"]
    if c["lost"] or c["throttled"]:
        why = ", ".join(f"{k} {n}" for k, n in c["reasons"].items())
        parts = []
        if c["lost"]:
            parts.append(f"{c['lost']} lost")
        if c["throttled"]:
            parts.append(f"{c['throttled']} throttled")
        out.append(f"WARNING: {b['name']}: {' and '.join(parts)} of {c['eligible']} eligible "
                   f"events" + (f" ({why})" if why else "") + "; the values above are incomplete")
    return out


def render_map_text(b: dict) -> List[str]:
    lines: List[str] = []
    agg = b["agg"]
    for e in b["entries"]:
        head = _key_text(b["name"], e["key"])
        v = e["value"]
        if agg in ("hist", "lhist"):
            lines.append(f"{head}:")
            lines += render_hist(v)
            lines.append("")
        elif agg == "stats":
            lines.append(f"{head}: count {v['count']}, average {v['avg']}, total {v['sum']}, "
                         f"min {v['min']}, max {v['max']}")
        elif agg == "avg":
            lines.append(f"{head}: {v['avg']}")
        else:
            lines.append(f"{head}: {v}")
    if not b["entries"]:
        lines.append(f"{b['name']}: (empty)")
    if lines and lines[-1] == "":
        lines.pop()
    lines += _coverage_lines(b)
    lines.append("")
    return lines


def render_text(blocks: Iterable[dict]) -> str:
    out: List[str] = []
    for b in blocks:
        t = b["type"]
        who = f"[rank {b['rank']}] " if "rank" in b else ""     # (a merged view's per-rank blocks)
        if t == "map":
            out += render_map_text(b)
        elif t == "text":
            out.append(who + b["text"])
        elif t == "interval":
            out.append(f"-- {who}{b['probe']} at {b['ts_ns'] / 1e6:.3f} ms{_interval_span(b)} --")
        elif t == "evidence":
            fields = " ".join(f"{k}={v}" for k, v in b["fields"].items())
            out.append(f"{who}evidence[w{b['worker']} e{b['epoch']}]: {fields}")
        elif t == "warning":
            out.append(f"{who}WARNING: {b['text']}")
    return "\n".join(out) + ("\n" if out else "")


def _steps_text(steps) -> str:
    return "no new step" if steps[1] < steps[0] else f"steps {steps[0]}-{steps[1]}"


def _interval_span(b: dict) -> str:
    """", steps 40-71" of a device query's cut (runtime.device_query); a merged header
    (merge_blocks): " (ranks 0, 1)", with the steps when every rank's are the same (a
    job's aligned cuts), else each rank's."""
    if "ranks" in b:
        per = b["ranks"]
        names = f"ranks {', '.join(str(r) for r in per)}"
        steps = {tuple(v) if v else None for v in per.values()}
        if steps == {None}:
            return f" ({names})"
        if len(steps) == 1 and len(per) > 1:
            return f", {_steps_text(next(iter(steps)))} ({names})"
        return " (" + "; ".join(f"rank {r}: {_steps_text(v) if v else 'no steps'}" for r, v in per.items()) + ")"
    return "" if b.get("steps") is None else ", " + _steps_text(b["steps"])


# --- several ranks as one view ----------------------------------------------------------

def _merge_value(agg: str, a, b):
    """Two ranks' values of one key combined as the aggregation defines it (histograms:
    counts arrays, rebuilt by the caller)."""
    if agg in ("count", "sum"):
        return a + b
    if agg == "min":
        return min(a, b)
    if agg == "max":
        return max(a, b)
    if agg in ("avg", "stats"):
        c, s = a["count"] + b["count"], a["sum"] + b["sum"]
        out = {"count": c, "sum": s, "avg": s // c if c else 0}
        if agg == "stats":
            mins = [v["min"] for v in (a, b) if v["count"]]
            out["min"], out["max"] = (min(mins) if mins else 0), max(a["max"], b["max"])
        return out
    if agg in ("hist", "lhist"):
        return [x + y for x, y in zip(a, b)]
    raise ValueError(f"aggregation {agg!r} has no merge")


def _key_order(key: list) -> tuple:
    return tuple((0, k, "") if isinstance(k, int) else (1, 0, str(k)) for k in key)


def merge_blocks(parts: Sequence[Sequence[dict]], ranks: Optional[Sequence[int]] = None) -> List[dict]:
    """The blocks of several ranks (parts[i] of rank ranks[i]; default 0, 1, ...) as one
    view: the map blocks of one name, `when` and aggregation combined key by key (count /
    sum added, min / max, avg and stats from the summed count and sum, histograms bucket by
    bucket), their coverage summed (eligible = executed + throttled + lost still holds, and
    so does the WARNING when any rank lost or throttled events).  Blocks pair by occurrence:
    the n-th block of a map (name, when, aggregation) in one rank's part merges with the
    n-th in every other's -- two ticks of an interval clause in one part are two views, not
    one sum -- and so do the n-th headers of an interval clause (one header naming each
    rank's steps).  Every other block (printf text, evidence, warnings) is kept in rank
    order, marked with its rank."""
    ranks = list(range(len(parts))) if ranks is None else list(ranks)
    maps: Dict[tuple, dict] = {}
    values: Dict[tuple, Dict[tuple, object]] = {}
    heads: Dict[tuple, dict] = {}
    out: List[dict] = []
    for r, blocks in zip(ranks, parts):
        nth: Dict[tuple, int] = {}        # the n-th interval / map of its kind in this rank's part
        for b in blocks:
            kind = (b.get("probe"),) if b["type"] == "interval" else (b.get("name"), b.get("when"), b.get("agg"))
            n = nth[kind] = nth.get(kind, -1) + 1
            if b["type"] == "interval":   # the n-th tick of a clause: one header naming each rank's
                h = heads.get(kind + (n,))
                if h is None:
                    h = heads[kind + (n,)] = {"type": "interval", "probe": b["probe"], "ts_ns": b["ts_ns"],
                                              "ranks": {}}
                    out.append(h)
                h["ranks"][r] = b.get("steps")
                continue
            if b["type"] != "map":
                out.append({**b, "rank": r})
                continue
            mk = kind + (n,)
            hist = b["agg"] in ("hist", "lhist")
            if mk not in maps:
                maps[mk] = {**b, "entries": [], "coverage": {"eligible": 0, "executed": 0, "throttled": 0,
                                                            "lost": 0, "reasons": {}}}
                values[mk] = {}
                out.append(maps[mk])
            m, vals = maps[mk], values[mk]
            for k in ("eligible", "executed", "throttled", "lost"):
                m["coverage"][k] += b["coverage"][k]
            for why, n in b["coverage"].get("reasons", {}).items():
                m["coverage"]["reasons"][why] = m["coverage"]["reasons"].get(why, 0) + n
            for e in b["entries"]:
                key = tuple(e["key"])
                v = bucket_counts(b["layout"], e["value"]) if hist else e["value"]
                vals[key] = _merge_value(b["agg"], vals[key], v) if key in vals else v
    for mk, m in maps.items():
        agg = m["agg"]
        entries = [{"key": list(k), "value": v} for k, v in values[mk].items()]
        if agg in ("hist", "lhist"):
            entries.sort(key=lambda e: _key_order(e["key"]))
            for e in entries:
                e["value"] = hist_buckets({"value": m["layout"]}, e["value"])
        else:
            entries.sort(key=lambda e: (_sort_value(agg, e["value"]), _key_order(e["key"])))
        m["entries"] = entries
        m["coverage"]["reasons"] = dict(sorted(m["coverage"]["reasons"].items()))
    return out


def render_json(blocks: Iterable[dict]) -> str:
    return "".join(json.dumps(b, sort_keys=True) + "\n" for b in blocks)
