"""`dtrace-mk run`: run the reference megakernel and print throughput and step time.

    dtrace-mk run --model tiny --steps 8 --batch 4                  # GPU if present, else sim
    dtrace-mk run --model 1b --steps 4 --batch 8 --backend sim --trace out.perfetto-trace
    dtrace-mk run --model small-moe --faults faults.yaml --events-out events.jsonl
    mpiexec -n 4 dtrace-mk run --backend sim --model tiny --events-out e.jsonl   # 4 ranks
    dtrace-mk run --backend sim --ranks 4                 # 4 ranks in one process

Backends: `gpu` (the CUDA megakernel, needs CuPy and a GPU), `sim` (the discrete-event
simulation on the CPU: times are SIMULATED from the cost table, no numerics), `auto`
(gpu when CuPy and a GPU are present, else sim).

--faults FILE      JSON/YAML list of fault specs (see dtrace_mk/megakernel/faults.py)
--events-out FILE  every hook context the run fires: JSON Lines, or raw 128-byte
                   records when FILE ends in .ctx
--trace FILE       the full task trace: native Perfetto protobuf when FILE ends in
                   .perfetto-trace, else Chrome trace-event JSON (Perfetto opens both)
--schema-out FILE  the task schema of the graph (what queries resolve names against)

Tensor parallelism (sim backend): under an MPI launcher (`mpiexec -n N`) every
process is one rank (rank/size from MPI.COMM_WORLD, signals travel as MPI messages);
`--ranks N` without a launcher runs N ranks in one process (identical results).  Rank 0
prints the summary and one line per rank.  With several ranks the files named by
--events-out, --trace and --schema-out are per rank: "{rank}" in the name is replaced,
otherwise ".rank<r>" goes before the suffix (e.jsonl -> e.rank0.jsonl, e.rank1.jsonl).
Hook timestamps are each rank's simulated device clock (offset, drift, 32 ns ticks;
--no-clock-skew for one clock).  --faults applies to every rank; a fault spec may
name its rank with "rank: r".
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, List, Optional

from ..errors import UserError

NAME = "run"
ORDER = 10
HELP = "run the reference megakernel (GPU or sim) and print tokens/s and decode-step time"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

from ..megakernel.presets import SIM_WORKERS as H200_SMS  # noqa: E402


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
    p.add_argument("--trace", metavar="FILE", help="full task trace (.perfetto-trace: native Perfetto; else Chrome JSON)")
    p.add_argument("--schema-out", metavar="FILE", help="write the task schema JSON")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="tensor-parallel ranks (sim): default the MPI world size, else 1; "
                        "without an MPI launcher N ranks run in this process")
    p.add_argument("--no-clock-skew", action="store_true",
                   help="multi-rank sim: one clock for every rank (default: per-rank offset and drift)")


def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _gpu_sms() -> int:
    import cupy
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def rank_path(path: str, rank: int, ranks: int) -> str:
    """The per-rank file name of `path` (module doc); `path` itself for one rank."""
    if ranks == 1:
        return path
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def _faults_for_rank(args, rank: int, ranks: int = 1):
    """--faults rows for `rank`: specs without "rank" apply to every rank."""
    from ..megakernel.faults import FaultTable
    if not args.faults:
        return FaultTable()
    specs = _rank_specs(args.faults)
    if specs is None:
        return FaultTable.load(args.faults)
    for i, sp in enumerate(specs):
        r = sp.get("rank") if isinstance(sp, dict) else None
        if isinstance(sp, dict) and "rank" in sp and (isinstance(r, bool) or not isinstance(r, int)
                                                      or not 0 <= r < ranks):
            raise UserError(f"{args.faults}[{i}].rank: expected 0..{ranks - 1}, got {r!r}")
    strip = lambda sp: {k: v for k, v in sp.items() if k != "rank"} if isinstance(sp, dict) else sp  # noqa: E731
    FaultTable.from_specs([strip(sp) for sp in specs], args.faults)     # errors name the file's index
    return FaultTable.from_specs([strip(sp) for sp in specs if sp.get("rank", rank) == rank], args.faults)


def _rank_specs(path: str):
    """The raw specs of a fault file when any names a rank (else None)."""
    import yaml
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None                     # FaultTable.load reports it
    if isinstance(data, dict) and set(data) == {"faults"}:
        data = data["faults"]
    if isinstance(data, list) and any(isinstance(sp, dict) and "rank" in sp for sp in data):
        return data
    return None


def run(args: argparse.Namespace) -> int:
    from ..megakernel.graph import build_graph
    from ..megakernel.mpi_transport import mpi_world
    from ..megakernel.presets import get_preset

    cfg = get_preset(args.model)
    if args.steps < 1:
        raise UserError(f"--steps: expected >= 1, got {args.steps}")
    rank, size = mpi_world()
    ranks = args.ranks if args.ranks is not None else size
    if ranks < 1:
        raise UserError(f"--ranks: expected >= 1, got {ranks}")
    if size > 1 and ranks != size:
        raise UserError(f"--ranks {ranks}: this job has {size} MPI processes (one per rank)")
    backend = args.backend
    if ranks > 1:
        if backend == "gpu":
            raise UserError(f"--backend gpu: {ranks} tensor-parallel ranks run on the sim backend only "
                            f"(use --backend sim)")
        backend = "sim"
    elif backend == "auto":
        backend = "gpu" if gpu_available() else "sim"
    elif backend == "gpu" and not gpu_available():
        raise UserError("--backend gpu: no CuPy or no GPU here (use --backend sim)")
    workers = args.workers or (_gpu_sms() if backend == "gpu" else H200_SMS)
    if ranks > 1:
        return _run_ranks(args, cfg, workers, rank, size, ranks)
    faults = _faults_for_rank(args, 0)
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


class _RankFiles:
    """A rank's --events-out sink (JSONL or .ctx records) and the file names."""

    def __init__(self, args, rank: int, ranks: int):
        from ..megakernel.sim import jsonl_sink, records_sink
        self.records: List[bytes] = []
        self.fh = None
        self.sink = None
        self.events = rank_path(args.events_out, rank, ranks) if args.events_out else None
        self.trace = rank_path(args.trace, rank, ranks) if args.trace else None
        self.schema = rank_path(args.schema_out, rank, ranks) if args.schema_out else None
        if self.events:
            p = Path(self.events)
            if p.suffix == ".ctx":
                self.sink = records_sink(self.records)
            else:
                try:
                    self.fh = p.open("w", encoding="utf-8")
                except OSError as e:
                    raise UserError(f"--events-out: {p}: {e.strerror}") from None
                self.sink = jsonl_sink(self.fh)

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
        if self.records:
            from ..abi.context import write_events
            write_events(self.events, self.records)


def _rank_summary(res, rank: int) -> dict:
    return {"rank": rank, "step_ns": res.step_ns, "total_ns": res.total_ns, "tasks": res.tasks_run,
            "sent": res.signals_sent, "received": res.signals_received, "comm_wait_ns": res.comm_wait_ns,
            "comm_signal": res.hook_counts.get("comm:signal", 0),
            "comm_wait": res.hook_counts.get("comm:wait", 0), "tokens": res.tokens}


def _run_ranks(args, cfg, workers: int, rank: int, size: int, ranks: int) -> int:
    """Tensor-parallel sim: this process is MPI rank `rank` of `size`, or (size == 1)
    runs all `ranks` in-process on the loopback transport."""
    from ..megakernel.graph import build_graph
    from ..megakernel.sim import chrome_trace
    mine = list(range(ranks)) if size == 1 else [rank]
    graphs = {r: build_graph(cfg, args.batch, workers, rank=r, ranks=ranks) for r in mine}
    faults = {r: _faults_for_rank(args, r, ranks) for r in mine}
    files = {r: _RankFiles(args, r, ranks) for r in mine}
    for r in mine:
        if files[r].schema:
            graphs[r].schema.dump(files[r].schema)
    kw = dict(seed=args.seed, clock_skew=not args.no_clock_skew, queue_threshold=args.queue_threshold,
              collect_trace=bool(args.trace))
    err: Optional[BaseException] = None
    results = {}
    try:
        if size == 1:
            from ..megakernel.mpi_transport import run_loopback
            results = dict(zip(mine, run_loopback(cfg, args.batch, workers, ranks, args.steps,
                                                   graphs=[graphs[r] for r in mine], faults=faults,
                                                   sinks=[files[r].sink for r in mine], **kw)))
        else:
            from ..megakernel.mpi_transport import run_mpi
            try:
                results = {rank: run_mpi(cfg, args.batch, workers, args.steps, graph=graphs[rank],
                                         faults=faults, sink=files[rank].sink, **kw)}
            except Exception as e:       # still meet the others at the gather below
                err = e
    finally:
        for f in files.values():
            f.close()
    for r, res in results.items():
        if files[r].trace:
            _write_trace(files[r].trace, lambda: chrome_trace(graphs[r], res),
                         lambda: task_trace_from_sim(graphs[r], res))
    summaries = [_rank_summary(results[r], r) for r in mine] if err is None else \
        [{"rank": rank, "error": f"{type(err).__name__}: {err}"}]
    if size > 1:
        from mpi4py import MPI
        gathered = MPI.COMM_WORLD.gather(summaries[0], root=0)
        if err is not None:
            raise err
        if rank != 0:
            return 0
        bad = [s for s in gathered if "error" in s]
        if bad:
            raise UserError("; ".join(f"rank {s['rank']}: {s['error']}" for s in bad))
        summaries = gathered
    steps_all = [ns for s in summaries for ns in s["step_ns"]]
    total = max(s["total_ns"] for s in summaries)
    how = f"{ranks} MPI processes" if size > 1 else f"{ranks} ranks in one process"
    print(f"model {cfg.name}, batch {args.batch}, {args.steps} steps, {workers} workers per rank, "
          f"{ranks} tensor-parallel ranks ({how}), backend sim (simulated)")
    print(f"decode step (simulated): mean {statistics.mean(steps_all) / 1000:.1f} us, "
          f"min {min(steps_all) / 1000:.1f} us, max {max(steps_all) / 1000:.1f} us")
    tokens = summaries[0]["tokens"]
    print(f"throughput (simulated): {tokens * 1e9 / total if total else 0.0:,.0f} tokens/s ({tokens} tokens)")
    for s in summaries:
        print(f"rank {s['rank']}: step mean {statistics.mean(s['step_ns']) / 1000:.1f} us, "
              f"{s['tasks']} tasks, signals sent {s['sent']} received {s['received']}, "
              f"comm:wait {s['comm_wait']} ({s['comm_wait_ns'] / 1000:.1f} us waiting for remote data)")
    if args.faults:
        print(f"faults: {args.faults}")
    if args.events_out:
        print(f"events: {rank_path(args.events_out, 0, ranks)} ... (one file per rank)")
    return 0


def _run_sim(graph, args, faults, sink):
    from ..megakernel.sim import Sim, chrome_trace
    sim = Sim(graph, args.steps, faults=faults, sink=sink, seed=args.seed, collect_trace=bool(args.trace),
              queue_threshold=args.queue_threshold)
    res = sim.run()
    lines = [f"tasks run: {res.tasks_run} ({sum(res.dynamic_tasks)} dynamic MoE expert tasks), "
             f"requests finished: {res.requests_finished}",
             f"sim timing: cost table {sim.costs.provenance()}"]
    if faults.rows:
        lines.append(f"faults: {len(faults.rows)} rows ({', '.join(r.kind_name for r in faults.rows)})")
    if args.trace:
        _write_trace(args.trace, lambda: chrome_trace(graph, res), lambda: task_trace_from_sim(graph, res))
        lines.append(f"trace: {args.trace} ({len(res.trace)} task records)")
    return res.step_ns, res.tokens, {"wall_ns": res.total_ns, "lines": lines}


def _run_gpu(graph, args, faults, sink):
    """The CUDA megakernel through `gpu.Megakernel` (one launch for all steps).  Per-step
    times are not separable in one launch: every step is reported as elapsed / steps."""
    try:
        from ..megakernel import gpu
    except ImportError as e:
        raise UserError(f"--backend gpu: the GPU launcher cannot be imported: {e}") from None
    # no --events-out: the build without hook code (hooks compiled in but off still cost the
    # persistent loop a few percent: docs/results/hooks.md); the built-in trace is in both
    mk = gpu.Megakernel(graph.cfg, batch=graph.batch, num_workers=graph.num_workers, seed=args.seed,
                        graph=graph, queue_threshold=args.queue_threshold,
                        defines=() if sink is not None else ("DTMK_NO_HOOKS",))
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
        from ..exporters.perfetto import task_trace_from_gpu
        _write_trace(args.trace, lambda: gpu.trace_to_chrome(res.trace, graph, res.trace_dropped),
                     lambda: task_trace_from_gpu(res.trace, graph))
        lines.append(f"trace: {args.trace} ({len(res.trace)} task records, {res.trace_dropped} dropped)")
    return step_ns, int(res.tokens.size), {"wall_ns": total_ns, "lines": lines}


def _write_trace(path: str, chrome_doc, task_trace) -> None:
    """The full task trace: native Perfetto for *.perfetto-trace, else Chrome JSON."""
    if not path.endswith(".perfetto-trace"):
        _write_json(path, chrome_doc())
        return
    from ..exporters.batch import build_batch
    from ..exporters.perfetto import write_perfetto
    try:
        write_perfetto(path, build_batch({"findings": []}, [], task_traces=[task_trace()]))
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror}") from None


def task_trace_from_sim(graph, res):
    from ..exporters.perfetto import task_trace_from_sim as adapt
    return adapt(graph, res)


def _write_json(path: str, obj: Any) -> None:
    try:
        Path(path).write_text(json.dumps(obj) + "\n")
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror}") from None
