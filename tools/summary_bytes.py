"""Bytes of the summary monitor against the full task trace, on the sim backend (CPU): the
same query (runtime.live.SUMMARY_QUERY) in the reference runtime over the sim's hook
contexts, the trace as the kernel's 32-byte records (gpu.TRACE_DTYPE) of the same run,
both encoded as bench/hooks.py does on the GPU (dtrace_mk.runtime.wire).  A preview of
bench/hooks.py's bytes row (its task durations come from the GPU-measured cost table).

    python tools/summary_bytes.py [--preset 1b] [--steps 3]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(preset: str = "1b", steps: int = 3) -> dict:
    """{"trace_records_per_step", "trace_raw_per_step", "trace_wire_per_step",
    "summary_raw", "summary_wire"} of one sim run (module doc)."""
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.sim import Sim, runtime_hooks, runtime_sink
    from dtrace_mk.runtime.live import summary_monitor
    from dtrace_mk.runtime.reference import ReferenceRuntime
    from dtrace_mk.runtime.wire import snapshot_wire, trace_wire
    g = build_graph(PRESETS[preset], 1, 132)
    rt = ReferenceRuntime(num_workers=g.num_workers)
    aid = rt.attach(summary_monitor(g.schema).obj)
    res = Sim(g, steps, sink=runtime_sink(rt), hooks=runtime_hooks(rt), collect_trace=True).run()
    tr = np.zeros(len(res.trace), dtype=gpu.TRACE_DTYPE)
    for j, (t, k, w, b, e, fl) in enumerate(res.trace):     # the kernel's record of the same task
        tr[j] = (b, 0, e - b, t, k, w, w, fl, g.tasks[t].cls)
    maps = list(rt.maps(aid))
    return {"trace_records_per_step": len(tr) / steps, "trace_raw_per_step": len(tr) * gpu.TRACE_BYTES / steps,
            "trace_wire_per_step": len(trace_wire(tr)) / steps,
            "summary_raw": sum(len(k) + (len(v) * 8 if isinstance(v, list) else len(v))
                               for m in maps for k, v in m.snapshot().items()),
            "summary_wire": len(snapshot_wire(maps))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    r = measure(a.preset, a.steps)
    print(f"{a.preset}, {a.steps} steps on the sim ({time.perf_counter() - t0:.0f} s): trace "
          f"{r['trace_records_per_step']:.0f} records/step, {r['trace_raw_per_step']:.0f} B/step raw, "
          f"{r['trace_wire_per_step']:.0f} B/step wire; summary {r['summary_raw']} B map entries, "
          f"{r['summary_wire']} B wire per snapshot: {r['trace_wire_per_step'] / r['summary_wire']:.0f}x fewer "
          f"on the wire ({r['trace_raw_per_step'] / r['summary_raw']:.0f}x raw)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
