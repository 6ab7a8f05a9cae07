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
    return {"type": "map", "when": when, "name": pm["name"], "agg": pm["agg"],
            "keys": [k["name"] for k in pm["keys"]], "entries": entries,
            "coverage": coverage_since(coverage_of(pm, rows), baseline)}


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
        if t == "map":
            out += render_map_text(b)
        elif t == "text":
            out.append(b["text"])
        elif t == "interval":
            out.append(f"-- {b['probe']} at {b['ts_ns'] / 1e6:.3f} ms --")
        elif t == "evidence":
            fields = " ".join(f"{k}={v}" for k, v in b["fields"].items())
            out.append(f"evidence[w{b['worker']} e{b['epoch']}]: {fields}")
        elif t == "warning":
            out.append(f"WARNING: {b['text']}")
    return "\n".join(out) + ("\n" if out else "")


def render_json(blocks: Iterable[dict]) -> str:
    return "".join(json.dumps(b, sort_keys=True) + "\n" for b in blocks)
