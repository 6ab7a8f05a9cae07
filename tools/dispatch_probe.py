"""Where a hook build's dispatch waits sit, task by task (GPU).

    python tools/dispatch_probe.py [--preset 1b] [--batch 4] [--steps 60] [--reps 2] [--defines D1+D2]

Runs the preset with the agent's device summary query (monitors/summary_tasks.d) attached hot
and every hook streamed (hooks="all"), then prints per task class: tasks, tasks flagged
FLAG_OBS_DELAY (their dependency seen met while the worker's observer drained: the drain's
poller, the default since session 48; -DDTMK_NO_DRAIN_POLL flags none), the dispatch wait
(task:dispatch wait_ns) mean / p90 / p99 / max of flagged and other tasks, and the median
ready -> dispatch stamp gap beyond the wait of flagged ones (the drain after the event was met).  Session 47 wrote it to find why the
drain's poller raised 1b's mlp_down dispatch-wait tail in serving (plan 117)."""
from __future__ import annotations

import argparse
from typing import Dict

import numpy as np

from dtrace_mk.abi import definition as D

WARMUP_STEPS = 2


def add_records(rows: Dict, h: np.ndarray, names: Dict[int, str]) -> Dict:
    """rows[class] = {True: flagged dispatch waits, False: the others, "gap": the flagged tasks'
    dispatch.ts - dispatch.wait_ns - ready.ts} from one run's hook records `h` (CTX_DTYPE);
    static tasks of steps >= WARMUP_STEPS."""
    h = h[h["decode_step"] >= WARMUP_STEPS]
    key = lambda r: (int(r["worker"]), int(r["decode_step"]), int(r["task_index"]))  # noqa: E731
    ready = {key(r): int(r["ts_ns"]) for r in h[h["hook"] == D.hook("task:ready").id]}
    for r in h[(h["hook"] == D.hook("task:dispatch").id) & ((h["flags"] & D.FLAG_DYNAMIC) == 0)]:
        flagged = bool(int(r["flags"]) & D.FLAG_OBS_DELAY)
        d = rows.setdefault(names.get(int(r["task_class"]), str(int(r["task_class"]))), {True: [], False: [], "gap": []})
        d[flagged].append(int(r["wait_ns"]))
        if flagged and key(r) in ready:
            d["gap"].append(int(r["ts_ns"]) - int(r["wait_ns"]) - ready[key(r)])
    return rows


def table(rows: Dict) -> str:
    def q(v):
        if not v:
            return f"{'-':>6} {'-':>6} {'-':>6} {'-':>7}"
        return (f"{np.mean(v) / 1e3:6.2f} {np.percentile(v, 90) / 1e3:6.2f} {np.percentile(v, 99) / 1e3:6.2f} "
                f"{np.max(v) / 1e3:7.2f}")
    out = [f"{'class':14} {'tasks':>6} {'flag':>5}   other: mean    p90    p99     max"
           f"   flagged: mean    p90    p99     max   gap med"]
    for c, d in rows.items():
        g = f"{np.median(d['gap']) / 1e3:7.2f}" if d["gap"] else "      -"
        out.append(f"{c:14} {len(d[True]) + len(d[False]):6d} {len(d[True]):5d}          {q(d[False])}"
                   f"            {q(d[True])}   {g}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--defines", default="", help="compile-time variants, '+'-joined (e.g. DTMK_NO_DRAIN_POLL)")
    a = ap.parse_args(argv)
    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.graph import CLASS_IDS
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.runtime.agent import SUMMARY_PARTS
    from dtrace_mk.runtime.live import LiveSession
    names = {v: k for k, v in CLASS_IDS.items()}
    defines = tuple(d for d in a.defines.split("+") if d)
    mk = gpu.Megakernel(PRESETS[a.preset], batch=a.batch, seed=0, defines=defines)
    mon = compile_query(SUMMARY_PARTS["tasks"].read_text(), mk.graph.schema, name="<summary tasks>")
    rows, dropped = {}, 0
    live = LiveSession(mk)
    aid = live.attach(mon.obj)
    for _ in range(a.reps):
        live.start(a.steps, hooks="all")
        res = live.wait()
        dropped += int(res.hooks_dropped)
        add_records(rows, res.hooks, names)
    live.detach(aid)
    print(f"{a.preset} batch {a.batch}, defines {a.defines or '(default)'}, {a.steps} steps x {a.reps}, "
          f"summary_tasks.d hot, hooks streamed ({dropped} records dropped); us")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
