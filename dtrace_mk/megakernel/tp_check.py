"""Rank script of the 2-GPU tensor-parallel check (tests/gpu/test_tp.py runs it):

    mpirun --allow-run-as-root -n 2 python3 -m dtrace_mk.megakernel.tp_check --out tp.json

Every rank (one GPU each, `TPGroup(MPI.COMM_WORLD)`) runs, per preset (default tiny and
small-moe, batch 4):
  * the single-GPU megakernel on its own GPU and the tensor-parallel megakernel (same
    full weights, make_weights(cfg, 0)); rank 0 also the NumPy reference: greedy tokens;
  * the comm hooks of the TP run against the graph (check_comm_hooks): one comm:signal
    per remote comm task and step with the right comm_op / comm_gen / peer / event /
    target / FLAG_REMOTE, one comm:wait per consumer of a receive event and step;
  * late_comm on rank 1 only (allreduce_attn of the last layer, --delay-us): rank 0's
    comm:wait of that op grows (mean per step, vs the same run without the fault), rank
    1's comm:signal of it carries FLAG_FAULT;
  * (first preset) rank 1 injects a deadlock: both ranks get a watchdog report (not a
    hang); rank 0's names a worker waiting (or stopped while waiting) on its receive
    event of layer 0's allreduce_mlp, rank 1's one on the victim's event;
  * timing: TP step time per rank vs the single GPU (one launch of --timing-steps),
    tiny and (--timing-1b) 1b at batch 1.
Rank 0 writes every fact to --out (JSON) and prints one line per check and the timing
line; the exit status is 1 when a check failed on any rank.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List

import numpy as np

from ..abi import definition as D
from .graph import CLASS_IDS, TaskGraph

AR, NORM = CLASS_IDS["allreduce"], CLASS_IDS["rmsnorm"]
_KEEP: List[Any] = []       # megakernels stay alive: peers keep their buffers mapped over IPC


def check_comm_hooks(g: TaskGraph, hooks: np.ndarray, steps: int, step0: int = 0) -> List[str]:
    """Problems of a TP run's comm:signal / comm:wait records against graph g (empty: ok)."""
    bad: List[str] = []
    L = g.cfg.n_layers
    sig = hooks[hooks["hook"] == D.hook("comm:signal").id]
    wai = hooks[hooks["hook"] == D.hook("comm:wait").id]
    want_sig = {}
    for t in g.tasks:
        if t.cls == AR and g.is_remote(t.signal_event):
            ev = g.events[t.signal_event]
            for k in range(step0, step0 + steps):
                want_sig[(t.index, k)] = (ev.comm_op, k * L + t.layer, ev.owner_rank, ev.id, ev.triggers * (k + 1))
    got = defaultdict(list)
    for r in sig:
        got[(int(r["task_index"]), int(r["decode_step"]))].append(
            (int(r["comm_op"]), int(r["comm_gen"]), int(r["peer_rank"]), int(r["event_id"]), int(r["event_gen"])))
        if not int(r["flags"]) & D.FLAG_REMOTE:
            bad.append(f"comm:signal task {int(r['task_index'])} without FLAG_REMOTE")
    bad += _exactly_once("comm:signal", got, want_sig, len(sig))
    # consumers: rmsnorms waiting on this rank's receive events; the all-reduce's layer
    recv_layer = {t.signal_event: t.layer for t in g.tasks if t.cls == AR and not g.is_remote(t.signal_event)}
    want_wait = {}
    peers = [q for q in range(g.ranks) if q != g.rank]
    for t in g.tasks:
        if t.cls == NORM and t.wait_event in recv_layer:
            ev = g.events[t.wait_event]
            for k in range(step0, step0 + steps):
                want_wait[(t.index, k)] = (ev.comm_op, k * L + recv_layer[t.wait_event], ev.id, t.wait_count * (k + 1))
    gotw = defaultdict(list)
    for r in wai:
        gotw[(int(r["task_index"]), int(r["decode_step"]))].append(
            (int(r["comm_op"]), int(r["comm_gen"]), int(r["event_id"]), int(r["event_gen"])))
        if int(r["peer_rank"]) not in peers:
            bad.append(f"comm:wait task {int(r['task_index'])}: peer {int(r['peer_rank'])} not in {peers}")
        if not int(r["flags"]) & D.FLAG_REMOTE:
            bad.append(f"comm:wait task {int(r['task_index'])} without FLAG_REMOTE")
    bad += _exactly_once("comm:wait", gotw, want_wait, len(wai))
    return bad[:20]


def _exactly_once(hook: str, got, want, n_records: int) -> List[str]:
    """Each expected (task, step) record once with the expected fields, and nothing else."""
    bad = [f"{hook} task {k[0]} step {k[1]}: got {got.get(k)}, want [{v}]"
           for k, v in want.items() if got.get(k) != [v]]
    if n_records != len(want):
        bad.append(f"{hook}: {n_records} records, want {len(want)}")
    return bad


def comm_wait_ns(hooks: np.ndarray, op: int, layer: int, n_layers: int) -> List[int]:
    """wait_ns of the comm:wait records of (op, layer), in step order."""
    w = hooks[(hooks["hook"] == D.hook("comm:wait").id) & (hooks["comm_op"] == op)
              & (hooks["comm_gen"] % n_layers == layer)]
    w = w[np.argsort(w["decode_step"], kind="stable")]
    return [int(x) for x in w["wait_ns"]]


def run_preset(name: str, tp, args, out: Dict[str, Any], first: bool) -> None:
    from . import gpu
    from .faults import FaultTable
    from .presets import PRESETS
    from .reference import ReferenceModel, make_weights
    cfg = PRESETS[name]
    B, steps, rank = args.batch, args.steps, tp.rank
    W = make_weights(cfg, 0)
    t0 = time.perf_counter()
    single = gpu.Megakernel(cfg, batch=B, weights=W)
    out["single_tokens"] = single.run(steps).tokens.tolist()
    if rank == 0:
        out["ref_tokens"] = ReferenceModel(cfg, B, W).run(steps)["tokens"].tolist()
    mk = gpu.Megakernel(cfg, batch=B, weights=W, tp=tp)
    _KEEP.append(mk)
    out["build_s"] = round(time.perf_counter() - t0, 2)
    res = mk.run(steps, hooks="all")
    out["tp_tokens"] = res.tokens.tolist()
    out["hooks_dropped"] = int(res.hooks_dropped)
    out["hook_problems"] = check_comm_hooks(mk.graph, res.hooks, steps)
    out["n_comm_signal"] = int(np.count_nonzero(res.hooks["hook"] == D.hook("comm:signal").id))
    out["n_comm_wait"] = int(np.count_nonzero(res.hooks["hook"] == D.hook("comm:wait").id))
    # late_comm on rank 1: allreduce_attn of the last layer
    L = cfg.n_layers
    layer, op = L - 1, 0
    hooks = ["comm:wait", "comm:signal"]
    mk.reset()
    base = mk.run(steps, hooks=hooks)
    spec = [{"kind": "late_comm", "comm_op": "allreduce_attn", "layer": layer, "delay_us": args.delay_us}]
    faults = FaultTable.from_specs(spec) if rank == 1 else None
    mk.reset()
    late = mk.run(steps, hooks=hooks, faults=faults)
    out["late_tokens_equal"] = late.tokens.tolist() == base.tokens.tolist()
    out["wait_base_ns"] = comm_wait_ns(base.hooks, op, layer, L)
    out["wait_late_ns"] = comm_wait_ns(late.hooks, op, layer, L)
    s = late.hooks[(late.hooks["hook"] == D.hook("comm:signal").id) & (late.hooks["comm_op"] == op)
                   & (late.hooks["layer"] == layer)]
    out["late_signals"] = int(len(s))
    out["late_signals_fault_flag"] = int(np.count_nonzero(s["flags"] & D.FLAG_FAULT))
    # timing: one launch of timing_steps
    mk.reset()
    single.reset()
    tt = mk.run(args.timing_steps)
    ts = single.run(args.timing_steps)
    out["tp_step_us"] = round(tt.elapsed_ms * 1e3 / args.timing_steps, 1)
    out["single_step_us"] = round(ts.elapsed_ms * 1e3 / args.timing_steps, 1)
    if first:
        # rank 1 deadlocks its first MLP norm: both ranks report instead of hanging
        mk.reset()
        victim = next(t.index for t in mk.graph.tasks if t.cls == NORM and t.tile[0] == 1)
        t1 = time.perf_counter()
        dl = mk.run(steps, watchdog_ms=args.watchdog_ms, raise_on_watchdog=False,
                    inject_deadlock=victim if rank == 1 else None)
        out["deadlock_s"] = round(time.perf_counter() - t1, 2)
        rep = dl.watchdog
        out["deadlock_reported"] = rep is not None
        # Which workers wait on what.  The watchdog fires in ONE worker per rank: the one
        # whose awaited counter has stood still longest (often a task downstream of the
        # stuck one, e.g. rank 0's L1 qkv tiles on L1.attn_norm, which started waiting
        # before the consumer of L0.allreduce_mlp.r0 did); it sets the abort word and every
        # other waiting worker leaves its wait as "stopped" with WS_EVENT still naming the
        # event it waited on.  So the stuck chain shows among the stopped workers too: rank
        # 1 (the victim's wait target is unreachable) on L0.allreduce_attn.r1, and rank 0 --
        # which finished layer 0's attention, sent its allreduce_mlp partials, and never
        # gets rank 1's -- on its receive event L0.allreduce_mlp.r0.
        ws = (rep or {}).get("workers", [])
        out["deadlock_waiting_on"] = sorted({w["event_name"] for w in ws
                                             if w["state"] in ("waiting", "watchdog", "stopped")})
        out["deadlock_fired"] = next((f"{w['class']} on {w['event_name']}" for w in ws
                                      if w["state"] == "watchdog"), None)
        out["deadlock_workers"] = [(w["worker"], w["state"], w["class"], w["event_name"], w.get("value"),
                                    w.get("target")) for w in ws if w["state"] != "done"]
        v = mk.graph.tasks[victim]
        # rank 1: the victim's own wait; rank 0: its receive event of layer 0's MLP all-reduce
        out["deadlock_expect_event"] = (mk.graph.events[v.wait_event].name if rank == 1 else
                                        next(e.name for e in mk.graph.events
                                             if e.comm_op == 1 and e.owner_rank == rank
                                             and e.name.startswith("L0.")))
        mk.reset()


def run_1b_timing(tp, args, out: Dict[str, Any]) -> None:
    import cupy as cp
    from . import gpu
    from .presets import PRESETS
    from .reference import make_weights
    cfg = PRESETS["1b"]
    W = make_weights(cfg, 0, xp=cp)
    single = gpu.Megakernel(cfg, batch=1, weights=W)
    mk = gpu.Megakernel(cfg, batch=1, weights=W, tp=tp)
    _KEEP.append(mk)
    n = args.timing_steps
    single.run(2)
    mk.run(2)
    single.reset()
    mk.reset()
    ts = single.run(n)
    tt = mk.run(n)
    out["tokens_equal"] = ts.tokens.tolist() == tt.tokens.tolist()
    out["tp_step_us"] = round(tt.elapsed_ms * 1e3 / n, 1)
    out["single_step_us"] = round(ts.elapsed_ms * 1e3 / n, 1)


def verdicts(per_rank: List[Dict[str, Any]], args) -> List[str]:
    """One line per check ('ok ...' or 'FAIL ...') over every rank's facts."""
    lines = []
    ok = lambda c, msg: lines.append(("ok   " if c else "FAIL ") + msg)  # noqa: E731
    for name in args.presets:
        ref = per_rank[0][name]["ref_tokens"]
        for r, facts in enumerate(per_rank):
            f = facts[name]
            ok(f["tp_tokens"] == ref and f["single_tokens"] == ref,
               f"{name} rank {r}: TP tokens == single-GPU tokens == NumPy reference")
            ok(not f["hook_problems"] and f["hooks_dropped"] == 0,
               f"{name} rank {r}: comm hooks ({f['n_comm_signal']} signal, {f['n_comm_wait']} wait) "
               f"{f['hook_problems'][:3]}")
            ok(f["late_tokens_equal"], f"{name} rank {r}: late_comm leaves the tokens unchanged")
        f0, f1 = per_rank[0][name], per_rank[1][name]
        b, l = np.mean(f0["wait_base_ns"] or [0]), np.mean(f0["wait_late_ns"] or [0])
        ok(l - b >= 0.5 * args.delay_us * 1e3,
           f"{name}: late_comm on rank 1 -> rank 0 comm:wait mean {b / 1e3:.1f} -> {l / 1e3:.1f} us "
           f"(delay {args.delay_us} us)")
        ok(f1["late_signals"] > 0 and f1["late_signals_fault_flag"] == f1["late_signals"],
           f"{name}: rank 1's delayed comm:signal records carry FLAG_FAULT "
           f"({f1['late_signals_fault_flag']}/{f1['late_signals']})")
        if "deadlock_reported" in f0:
            ok(all(p[name]["deadlock_reported"] for p in per_rank)
               and all(p[name]["deadlock_expect_event"] in p[name]["deadlock_waiting_on"] for p in per_rank),
               f"{name}: rank 1 deadlock -> watchdog reports on both ranks in "
               f"{[p[name]['deadlock_s'] for p in per_rank]} s; "
               + "; ".join(f"rank {r} waits on {p[name]['deadlock_waiting_on']} (want "
                           f"{p[name]['deadlock_expect_event']}; fired: {p[name]['deadlock_fired']})"
                           for r, p in enumerate(per_rank)))
    if "1b" in per_rank[0]:
        ok(all(p["1b"]["tokens_equal"] for p in per_rank), "1b: TP tokens == single-GPU tokens")
    return lines


def timing_line(per_rank: List[Dict[str, Any]]) -> str:
    parts = []
    for name in [n for n in ("tiny", "1b") if n in per_rank[0]]:
        tp = ", ".join(f"rank {r} {p[name]['tp_step_us']} us" for r, p in enumerate(per_rank))
        parts.append(f"{name}: TP step {tp} vs single GPU {per_rank[0][name]['single_step_us']} us")
    return "TP timing (2 ranks): " + "; ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrace_mk.megakernel.tp_check")
    ap.add_argument("--presets", default="tiny,small-moe")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timing-steps", type=int, default=32)
    ap.add_argument("--delay-us", type=int, default=300)
    ap.add_argument("--watchdog-ms", type=int, default=300)
    ap.add_argument("--timing-1b", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    args.presets = [p for p in args.presets.split(",") if p]
    from mpi4py import MPI
    from .tp import TPGroup
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        print("tp_check: run with exactly 2 ranks (mpirun -n 2)", file=sys.stderr)
        return 2
    tp = TPGroup(comm)
    facts: Dict[str, Any] = {"rank": tp.rank, "device": tp.device}
    err = None
    try:
        for i, name in enumerate(args.presets):
            facts[name] = {}
            run_preset(name, tp, args, facts[name], first=i == 0)
        if args.timing_1b:
            facts["1b"] = {}
            run_1b_timing(tp, args, facts["1b"])
    except Exception:  # noqa: BLE001 - the peer may sit in a collective: abort the job
        import traceback
        print(f"FAIL rank {tp.rank}:\n{traceback.format_exc()}TP-CHECK FAILED", file=sys.stderr, flush=True)
        comm.Abort(1)
    every = comm.gather((facts, err), root=0)
    status = 0
    if tp.rank == 0:
        errs = [e for _, e in every if e]
        per_rank = [f for f, _ in every]
        lines = errs and [f"FAIL {e}" for e in errs] or verdicts(per_rank, args)
        if not errs:
            lines.append(timing_line(per_rank))
        for ln in lines:
            print(ln, flush=True)
        status = 1 if any(ln.startswith("FAIL") for ln in lines) else 0
        if args.out:
            with open(args.out, "w") as fh:
                json.dump({"per_rank": per_rank, "errors": errs, "lines": lines, "status": status}, fh, indent=1)
        print("TP-CHECK " + ("PASSED" if status == 0 else "FAILED"), flush=True)
    status = comm.bcast(status, root=0)
    return status


if __name__ == "__main__":
    sys.exit(main())
