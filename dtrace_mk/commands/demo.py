"""`dtrace-mk demo`: the reference megakernel with an injected fault and live queries.

Runs the `tiny` decode loop (the CUDA megakernel when a GPU is present, the sim
backend otherwise) with a fault from the fault table (`slow_task_class` on `attn` of
layer 1 for the second half of the steps: the same binary, the fault is data), attaches
one query from the start and a second one live at the step where the fault begins, and
prints each query's output with its coverage (eligible / executed / throttled / lost).

On the GPU the hook records come from the kernel's device ring and are fed to the
queries in time order after the launch; attaching into the running kernel (device VM)
is the device-runtime issue's work.
"""
from __future__ import annotations

import argparse
import struct
from typing import Dict

from ..abi import context
from ..abi import definition as abi
from ..errors import UserError

NAME = "demo"
ORDER = 1
HELP = "run the reference megakernel with an injected fault and live queries"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

QUERY_START = ('task:end { @latency[task.class] = hist(task.dur_ns); } '
               'dep:release { @dep_wait_ns[task.class] = sum(dep.wait_ns); }')
QUERY_LIVE = 'task:end /task.class == "attn"/ { @attn_dur_ns[task.layer] = stats(task.dur_ns); }'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=("auto", "gpu", "sim"), default="auto",
                   help="gpu when CuPy and a GPU are present (auto), else the sim backend")
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--steps", type=int, default=12, help="decode steps (default 12)")
    p.add_argument("--batch", type=int, default=4, help="request slots (default 4)")
    p.add_argument("--no-fault", action="store_true", help="run without the injected fault")
    p.add_argument("-f", "--format", choices=("text", "json"), default="text",
                   help="query output as text (bpftrace style) or newline-delimited JSON")


def run(args: argparse.Namespace) -> int:
    from ..lang import printing
    from ..lang.host import QueryRun
    from ..lang.pipeline import compile_query
    from ..megakernel.faults import FaultTable
    from ..megakernel.graph import build_graph
    from ..megakernel.presets import get_preset
    from .run import H200_SMS, _gpu_sms, gpu_available

    if args.steps < 2:
        raise UserError(f"--steps: expected >= 2 (the live query attaches mid-run), got {args.steps}")
    backend = args.backend
    if backend == "auto":
        backend = "gpu" if gpu_available() else "sim"
    elif backend == "gpu" and not gpu_available():
        raise UserError("--backend gpu: no CuPy or no GPU here (use --backend sim)")
    cfg = get_preset(args.model)
    workers = _gpu_sms() if backend == "gpu" else H200_SMS
    graph = build_graph(cfg, args.batch, workers)
    attach_step = args.steps // 2
    fault_specs = [] if args.no_fault else [
        {"kind": "slow_task_class", "task_class": "attn", "layer": min(1, cfg.n_layers - 1),
         "extra_us": 40, "steps": list(range(attach_step, args.steps))}]
    faults = FaultTable.from_specs(fault_specs, "demo")

    q_start = compile_query(QUERY_START, graph.schema, name="start")
    q_live = compile_query(QUERY_LIVE, graph.schema, name="live")
    why = "" if args.backend == "gpu" or backend == "gpu" else " (no GPU found)" if args.backend == "auto" else ""
    say = print if args.format == "text" else (lambda *a, **k: None)
    say(f"== dtrace_mk demo: model {cfg.name}, batch {args.batch}, {args.steps} decode steps, "
        f"{workers} workers, backend {backend}{why} ==")
    if fault_specs:
        f = fault_specs[0]
        say(f"fault table: slow_task_class attn layer {f['layer']} +{f['extra_us']} us, steps "
            f"{f['steps'][0]}-{f['steps'][-1]} (data in device memory: the same binary runs both halves)")
    say(f"attached at start:          {QUERY_START}")
    say(f"attached live at step {attach_step:<3}  {QUERY_LIVE}")

    hooks = {p.hook.name for q in (q_start, q_live) for p in q.obj.programs}
    runs: Dict[str, QueryRun] = {"start": QueryRun(q_start.obj, q_start.plan, num_workers=workers)}
    runs["start"].begin()

    def feed(rec: bytes) -> None:
        step = struct.unpack_from("<I", rec, context.OFF_DECODE_STEP)[0]
        if "live" not in runs and step >= attach_step:
            runs["live"] = QueryRun(q_live.obj, q_live.plan, num_workers=workers)
            runs["live"].begin()
        for q in runs.values():
            q.feed(rec)

    if backend == "sim":
        from ..megakernel.sim import Sim, pack_ctx
        res = Sim(graph, args.steps, faults=faults, sink=lambda ctx: feed(pack_ctx(ctx)),
                  hooks=sorted(hooks)).run()
        step_ns, source = res.step_ns, "simulated from the cost table"
    else:
        from ..megakernel import gpu
        mk = gpu.Megakernel(graph.cfg, batch=graph.batch, num_workers=workers, graph=graph)
        res = mk.run(args.steps, hooks="all", faults=faults if len(faults) else None)
        wanted = {abi.hook(h).id for h in hooks}
        raw = res.hooks.tobytes()
        recs = sorted((raw[i:i + 128] for i in range(0, len(raw), 128)),
                      key=lambda r: struct.unpack_from("<Q", r, context.OFF_TS_NS)[0])
        for r in recs:
            if struct.unpack_from("<I", r, context.OFF_HOOK)[0] in wanted:
                feed(r)
        total = int(res.elapsed_ms * 1e6)
        step_ns, source = [total // args.steps] * args.steps, "one launch, launch time / steps"
        if res.hooks_dropped:
            say(f"warning: {res.hooks_dropped} hook records dropped (device ring full)")

    say(f"\ndecode step time ({source}):")
    for k, ns in enumerate(step_ns):
        mark = "  <- fault active" if fault_specs and attach_step <= k else ""
        say(f"  step {k:3d}: {ns / 1000:9.1f} us{mark}")
    for label, q in runs.items():
        blocks = q.finish()
        if args.format == "json":
            print(printing.render_json(blocks), end="")
        else:
            say(f"\n-- query attached {'at start' if label == 'start' else f'live at step {attach_step}'} --")
            print(printing.render_text(blocks), end="")
    say("\nnext: dtrace-mk probes -v | dtrace-mk run-vm -e 'QUERY' --events FILE | "
        "dtrace-mk run --events-out FILE")
    return 0
