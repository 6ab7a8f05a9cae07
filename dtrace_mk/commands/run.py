"""`dtrace-mk run`: run the reference megakernel and print throughput and step time.

    dtrace-mk run --model tiny --steps 8 --batch 4                  # GPU if present, else sim
    dtrace-mk run --model 1b --steps 4 --batch 8 --backend sim --trace out.perfetto-trace
    dtrace-mk run --model small-moe --faults faults.yaml --events-out events.jsonl

Backends: `gpu` (the CUDA megakernel, needs CuPy and a GPU), `sim` (the discrete-event
simulation on the CPU: times are SIMULATED from the cost table, no numerics), `auto`
(gpu when CuPy and a GPU are present, else sim).

--faults FILE      JSON/YAML list of fault specs (see dtrace_mk/megakernel/faults.py)
--events-out FILE  every hook context the run fires: JSON Lines, or raw 128-byte
                   records when FILE ends in .ctx
--trace FILE       the full task trace as Chrome trace-event JSON (Perfetto opens it)
--schema-out FILE  the task schema of the graph (what queries resolve names against)
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, List

from ..errors import UserError

NAME = "run"
ORDER = 10
HELP = "run the reference megakernel (GPU or sim) and print tokens/s and decode-step time"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

H200_SMS = 132


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..megakernel.presets import PRESETS
    p.add_argument("--model", default="tiny", metavar="NAME", help=f"preset: {', '.join(PRESETS)} (default tiny)")
    p.add_argument("--steps", type=int, default=8, metavar="N", help="decode steps (default 8)")
    p.add_argument("--batch", type=int, default=4, metavar="B", help="request slots (default 4)")
    p.add_argument("--backend", choices=("auto", "gpu", "sim"), default="auto")
    p.add_argument("--workers", type=int, metavar="W",
                   help=f"workers (one per SM); default: the GPU's SM count, {H200_SMS} (H200) for sim")
    p.add_argument("--seed", type=int, default=0, help="seed of the sim's routing (default 0)")
    p.add_argument("--queue-threshold", type=int, default=16, metavar="N",
                   help="queue:pressure fires when a ready queue reaches N entries (default 16)")
    p.add_argument("--faults", metavar="FILE", help="fault specs (JSON or YAML list)")
    p.add_argument("--events-out", metavar="FILE", help="write every hook context (JSONL, or .ctx raw)")
    p.add_argument("--trace", metavar="FILE", help="full task trace (Chrome trace JSON, opens in Perfetto)")
    p.add_argument("--schema-out", metavar="FILE", help="write the task schema JSON")


def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _gpu_sms() -> int:
    import cupy
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def run(args: argparse.Namespace) -> int:
    from ..megakernel.faults import FaultTable
    from ..megakernel.graph import build_graph
    from ..megakernel.presets import get_preset

    cfg = get_preset(args.model)
    if args.steps < 1:
        raise UserError(f"--steps: expected >= 1, got {args.steps}")
    backend = args.backend
    if backend == "auto":
        backend = "gpu" if gpu_available() else "sim"
    elif backend == "gpu" and not gpu_available():
        raise UserError("--backend gpu: no CuPy or no GPU here (use --backend sim)")
    workers = args.workers or (_gpu_sms() if backend == "gpu" else H200_SMS)
    faults = FaultTable.load(args.faults) if args.faults else FaultTable()
    graph = build_graph(cfg, args.batch, workers)
    if args.schema_out:
        graph.schema.dump(args.schema_out)

    records: List[bytes] = []
    events_fh = None
    sink = None
    if args.events_out:
        from ..megakernel.sim import jsonl_sink, records_sink
        p = Path(args.events_out)
        if p.suffix == ".ctx":
            sink = records_sink(records)
        else:
            try:
                events_fh = p.open("w", encoding="utf-8")
            except OSError as e:
                raise UserError(f"--events-out: {p}: {e.strerror}") from None
            sink = jsonl_sink(events_fh)
    try:
        if backend == "sim":
            step_ns, tokens, extra = _run_sim(graph, args, faults, sink)
        else:
            step_ns, tokens, extra = _run_gpu(graph, args, faults, sink)
    finally:
        if events_fh is not None:
            events_fh.close()
    if records:
        from ..abi.context import write_events
        write_events(args.events_out, records)

    simulated = " (simulated)" if backend == "sim" else ""
    total = sum(step_ns)
    print(f"model {cfg.name}, batch {args.batch}, {args.steps} steps, {workers} workers, "
          f"backend {backend}{simulated}")
    print(f"decode step{simulated}: mean {statistics.mean(step_ns) / 1000:.1f} us, "
          f"min {min(step_ns) / 1000:.1f} us, max {max(step_ns) / 1000:.1f} us")
    tps = tokens * 1e9 / extra.get("wall_ns", total) if total else 0.0
    print(f"throughput{simulated}: {tps:,.0f} tokens/s ({tokens} tokens)")
    for line in extra.get("lines", []):
        print(line)
    return 0


def _run_sim(graph, args, faults, sink):
    from ..megakernel.sim import Sim, chrome_trace
    sim = Sim(graph, args.steps, faults=faults, sink=sink, seed=args.seed, collect_trace=bool(args.trace),
              queue_threshold=args.queue_threshold)
    res = sim.run()
    lines = [f"tasks run: {res.tasks_run} ({sum(res.dynamic_tasks)} dynamic MoE expert tasks), "
             f"requests finished: {res.requests_finished}, cost table: {sim.costs.source}"]
    if faults.rows:
        lines.append(f"faults: {len(faults.rows)} rows ({', '.join(r.kind_name for r in faults.rows)})")
    if args.trace:
        _write_json(args.trace, chrome_trace(graph, res))
        lines.append(f"trace: {args.trace} ({len(res.trace)} task records)")
    return res.step_ns, res.tokens, {"wall_ns": res.total_ns, "lines": lines}


def _run_gpu(graph, args, faults, sink):
    """The CUDA megakernel through `gpu.Megakernel` (one launch for all steps).  Per-step
    times are not separable in one launch: every step is reported as elapsed / steps."""
    try:
        from ..megakernel import gpu
    except ImportError as e:
        raise UserError(f"--backend gpu: the GPU launcher cannot be imported: {e}") from None
    mk = gpu.Megakernel(graph.cfg, batch=graph.batch, num_workers=graph.num_workers, seed=args.seed,
                        graph=graph, queue_threshold=args.queue_threshold)
    res = mk.run(args.steps, hooks="all" if sink is not None else None, trace=bool(args.trace),
                 faults=faults if len(faults) else None)
    total_ns = int(res.elapsed_ms * 1e6)
    step_ns = [total_ns // args.steps] * args.steps
    lines = [f"tokens: {res.tokens.size} (one launch, {res.elapsed_ms:.3f} ms; per-step time = "
             f"launch time / steps)"]
    if sink is not None:
        from ..abi import context
        raw = res.hooks.tobytes()
        n = len(raw) // 128
        for i in range(n):
            sink(context.to_dict(raw[i * 128:(i + 1) * 128]))
        if res.hooks_dropped:
            lines.append(f"hooks: {n} written, {res.hooks_dropped} dropped (device ring full)")
    if args.trace:
        _write_json(args.trace, gpu.trace_to_chrome(res.trace, graph, res.trace_dropped))
        lines.append(f"trace: {args.trace} ({len(res.trace)} task records, {res.trace_dropped} dropped)")
    return step_ns, int(res.tokens.size), {"wall_ns": total_ns, "lines": lines}


def _write_json(path: str, obj: Any) -> None:
    try:
        Path(path).write_text(json.dumps(obj) + "\n")
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror}") from None
