"""Benchmark of the reference megakernel against the kernel-per-operator baselines.

    python bench/megakernel.py [--presets tiny,1b] [--batch 1] [--out DIR] [--costs]

For each preset at the given batch: decode-step time of the megakernel (K steps in one
launch, and one launch per step), the per-operator build launched eagerly and replayed
as a CUDA graph (all from the same state; their tokens must agree, checked before any
timing is reported), as ratios; weight bytes per step over the measured device-to-device
copy bandwidth; beside them the sim's step for the same graph (`sim us`, `sim/mk`: how far
the sim's timing table is from this kernel).  --costs also measures per-class task costs
from the built-in trace (batch 1 and 4) in the format of dtrace_mk/megakernel/cost.py; then
`--from-json DIR/bench.json --write-cost-table dtrace_mk/megakernel/data/cost_table.json
--commit SHA` (no GPU) updates the sim's timing table with them (the worker plans do not
depend on it: dtrace_mk/megakernel/cost.py's module doc).

--variants builds the megakernel once per set of -D defines of megakernel.cu and times
each against the default build (tokens and logits must be bit-equal).  The defines left
select the old (session-2) code paths, e.g. (docs/dev/megakernel_speed.md "Session 3"):

    python bench/megakernel.py --presets 1b --steps 8 --reps 3 --quick \
        --variants s2code=DTMK_POLL_FENCE+DTMK_PROLOGUE_SERIAL+DTMK_REC_LATE,reclate=DTMK_REC_LATE,pf=prefetch

Session 4's TMA weight streaming through shared memory (the default build since then;
DTMK_NO_WSTREAM = the old matvec path; a ring of DTMK_WS_NST stages of DTMK_WS_STAGE
bytes, default 4 x 32 KB; DTMK_WS_NOPRE: no start before the dependency wait;
DTMK_WS_XSMEM: x re-read from shared memory per row instead of held in registers;
gpu.Megakernel adds the ring to the launch's shared memory):

    python bench/megakernel.py --presets 1b --steps 8 --reps 3 --quick \
        --variants nows=DTMK_NO_WSTREAM,ws8=DTMK_WS_NST=8+DTMK_WS_STAGE=16384,wsnopre=DTMK_WS_NOPRE

Session 4b (docs/dev/megakernel_speed.md "Session 4b"): DTMK_WS_NEXT streams each worker's
NEXT static task's weights into the ring slots the current tile frees (the ring does not
drain between tasks); with DTMK_WS_NOPRE the dependency wait starts nothing; with
DTMK_WS_NEXT_NOTAIL only slots free at a task boundary go to the next task (not the tail's):

    python bench/megakernel.py --presets 1b --steps 8 --reps 3 --quick \
        --variants wsnext=DTMK_WS_NEXT,wsnextnopre=DTMK_WS_NEXT+DTMK_WS_NOPRE,wsnextnotail=DTMK_WS_NEXT+DTMK_WS_NEXT_NOTAIL

Writes DIR/bench.json (and DIR/costs.json); prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench megakernel` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dtrace_mk.megakernel import gpu  # noqa: E402
from dtrace_mk.megakernel.baseline import Baseline  # noqa: E402
from dtrace_mk.megakernel.presets import PRESETS  # noqa: E402
from dtrace_mk.megakernel.reference import Requests, make_weights, weight_shapes  # noqa: E402


def copy_bandwidth(cp, nbytes=2 << 30, reps=10):
    """Device-to-device copy, bytes read + written per second (median of reps)."""
    a = cp.empty(nbytes // 4, cp.float32)
    a[:] = 1.0
    b = cp.empty_like(a)
    for _ in range(2):
        b[:] = a
    ts = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(ts)


def weight_bytes_per_step(cfg, batch):
    """Bytes of weights a decode step must read once (embedding rows: batch only)."""
    sh = weight_shapes(cfg)
    n = 0
    for name, shape in sh.items():
        size = int(np.prod(shape)) * 2
        if name == "embed":
            size = batch * cfg.hidden * 2
        elif name in ("gate", "up", "down") and len(cfg.moe_layers) == cfg.n_layers:
            size = 0
        elif name in ("router", "egate", "eup", "edown") and not cfg.moe_layers:
            size = 0
        n += size
    return n


def timed(fn, reps):
    out = []
    for _ in range(reps):
        out.append(fn())
    return statistics.median(out), out


def preset(name):
    """'1b', or the preset with options after colons: ':t16' tile_n 16; ':old' the standard
    lowering (fuse_norm off, split_k 1: the lowering before session 2); ':fuse' fuse_norm
    without split-K; ':s<N>' fuse_norm with split_k N; ':q<N>' N columns per qkv tile (fused
    lowering); ':r' rope_in_attn (no rope level, 1b's default since session 6), ':nor' with
    the rope level; ':h' head_events (events per kv group / K-slice; needs qkv tiles inside
    heads, e.g. '1b:q32:h'); ':se' slice_events (mlp_down K-slice s waits for its slice's gate_up
    tiles only; h by layer parity).  E.g. '1b:old', '1b:s2', '1b:old:t16', '1b:nor', '1b:se'."""
    import dataclasses
    base, *opts = name.split(":")
    cfg = PRESETS[base]
    for o in opts:
        if o == "old":
            cfg = dataclasses.replace(cfg, fuse_norm=False, split_k=1, rope_in_attn=False)
        elif o == "fuse":
            cfg = dataclasses.replace(cfg, fuse_norm=True, split_k=1)
        elif o.startswith("s") and o[1:].isdigit():
            cfg = dataclasses.replace(cfg, fuse_norm=True, split_k=int(o[1:]))
        elif o.startswith("t") and o[1:].isdigit():
            cfg = dataclasses.replace(cfg, tile_n=int(o[1:]))
        elif o.startswith("q") and o[1:].isdigit():
            cfg = dataclasses.replace(cfg, qkv_tile_n=int(o[1:]))
        elif o == "r":
            cfg = dataclasses.replace(cfg, rope_in_attn=True)
        elif o == "nor":
            cfg = dataclasses.replace(cfg, rope_in_attn=False)
        elif o == "h":
            cfg = dataclasses.replace(cfg, head_events=True)
        elif o == "se":
            cfg = dataclasses.replace(cfg, slice_events=True)
        else:
            raise SystemExit(f"--presets: unknown option {o!r} in {name!r} (old, fuse, s<N>, t<N>, q<N>, r, nor, h, se)")
    return cfg


def bench_preset(cp, name, batch, steps, reps, log, quick=False, weights=None):
    cfg = preset(name)
    xp = cp if cfg.name == "1b" else np
    t0 = time.time()
    w = weights if weights is not None else make_weights(cfg, 0, xp=xp)
    mk = gpu.Megakernel(cfg, batch=batch, weights=w)
    # the build without hook code: what `dtrace-mk run` executes (and a handoff job while
    # nothing is attached); same weights (cp.asarray keeps device arrays)
    mk_nh = gpu.Megakernel(cfg, batch=batch, weights=w, defines=("DTMK_NO_HOOKS",))
    bl = Baseline(mk)
    log(f"{name}: setup {time.time() - t0:.1f} s, {len(mk.graph.tasks)} tasks, {mk.num_workers} workers, "
        f"lowering fuse_norm={cfg.fuse_norm} split_k={cfg.split_k}")
    # correctness first: same tokens from the same state
    mk.reset(); t_mk = mk.run(steps).tokens
    mk.reset(); t_ps = mk.run(steps, per_step_launch=True).tokens
    mk.reset(); t_e = bl.run(steps)["tokens"]
    mk.reset(); t_g = bl.run(steps, graph=True)["tokens"]
    mk_nh.reset(); t_nh = mk_nh.run(steps).tokens
    same = bool((t_mk == t_ps).all() and (t_mk == t_e).all() and (t_mk == t_g).all() and (t_mk == t_nh).all())
    log(f"{name}: tokens equal across megakernel/per-step/eager/graph/no-hook build: {same}")

    def mk_one():
        mk.reset()
        return mk.run(steps, poison=False).elapsed_ms / steps

    def mk_nohooks():
        mk_nh.reset()
        return mk_nh.run(steps, poison=False).elapsed_ms / steps

    def mk_step():
        mk.reset()
        return mk.run(steps, per_step_launch=True, poison=False).elapsed_ms / steps

    def eager():
        mk.reset()
        return bl.run(steps, poison=False)["elapsed_ms"] / steps

    def graph():
        mk.reset()
        return bl.run(steps, graph=True, poison=False)["elapsed_ms"] / steps

    for f in (mk_one, mk_nohooks, eager, graph):
        f()  # warm
    r = {}
    for key, f in (("megakernel", mk_one), ("megakernel_nohooks", mk_nohooks),
                   ("megakernel_per_step_launch", mk_step), ("eager", eager), ("cuda_graph", graph)):
        med, allv = timed(f, reps)
        r[key] = {"step_ms": med, "runs": allv}
        log(f"{name}: {key}: {med * 1e3:.1f} us/step ({', '.join(f'{v * 1e3:.1f}' for v in allv)})")
    mk.reset()
    r["logits_last"] = mk.run(steps).logits        # last step's logits (old vs new lowering)
    r["sim_step_us"] = sim_step_us(mk.graph, steps)
    if quick:
        wb = weight_bytes_per_step(cfg, batch)
        out = {"preset": name, "batch": batch, "steps_per_run": steps, "reps": reps, "tokens_equal": same,
               "tokens": t_mk.tolist(), "tasks": len(mk.graph.tasks), "workers": mk.num_workers,
               "weight_bytes_per_step": wb, "fuse_norm": cfg.fuse_norm, "split_k": cfg.split_k, **r}
        del bl, mk, mk_nh
        cp.get_default_memory_pool().free_all_blocks()
        return out
    try:
        blc = Baseline(mk, matmul="cublas")
        def eager_cublas():
            mk.reset()
            return blc.run(steps, poison=False)["elapsed_ms"] / steps
        eager_cublas()
        med, allv = timed(eager_cublas, reps)
        r["eager_cublas_fp32"] = {"step_ms": med, "runs": allv}
        log(f"{name}: eager_cublas_fp32: {med * 1e3:.1f} us/step")
    except Exception as e:  # noqa: BLE001
        log(f"{name}: cublas variant failed: {e!r}")
    # hooks overhead (all hooks on, trace on) on the one-launch megakernel
    def mk_hooks():
        mk.reset()
        return mk.run(steps, poison=False, hooks="all", trace=True).elapsed_ms / steps
    def mk_trace():
        mk.reset()
        return mk.run(steps, poison=False, trace=True).elapsed_ms / steps
    mk.prefetch = True
    r["megakernel_l2_prefetch"] = {"step_ms": timed(mk_one, reps)[0]}
    mk.prefetch = False
    log(f"{name}: megakernel with L2 weight prefetch while waiting: {r['megakernel_l2_prefetch']['step_ms'] * 1e3:.1f} us/step")
    mk_hooks()
    r["megakernel_trace"] = {"step_ms": timed(mk_trace, reps)[0]}
    r["megakernel_hooks_all_trace"] = {"step_ms": timed(mk_hooks, reps)[0]}
    log(f"{name}: megakernel trace on: {r['megakernel_trace']['step_ms'] * 1e3:.1f} us/step; all hooks + trace: "
        f"{r['megakernel_hooks_all_trace']['step_ms'] * 1e3:.1f} us/step")
    wb = weight_bytes_per_step(cfg, batch)
    out = {"preset": name, "batch": batch, "steps_per_run": steps, "reps": reps, "tokens_equal": same,
           "tokens": t_mk.tolist(), "tasks": len(mk.graph.tasks), "workers": mk.num_workers,
           "weight_bytes_per_step": wb, "fuse_norm": cfg.fuse_norm, "split_k": cfg.split_k, **r}
    del bl, mk, mk_nh, w
    cp.get_default_memory_pool().free_all_blocks()
    return out


def parse_variants(spec):
    """'NAME=DEF1+DEF2,NAME2=...' -> [(name, defines, prefetch)]; a token 'prefetch' turns
    on Megakernel(prefetch=True) (the L2 weight prefetch at dispatch), every other token is a
    -D define (KEY or KEY=VALUE) of megakernel.cu, except 'dynpadN' (split_dynpad).  'default' (no defines) is always first."""
    out = [("default", (), False)]
    for item in [x for x in spec.split(",") if x]:
        if "=" not in item:
            raise SystemExit(f"--variants: {item!r} is not NAME=DEF1+DEF2")
        name, toks = item.split("=", 1)
        toks = [t for t in toks.split("+") if t]
        if name == "default" or name in [o[0] for o in out]:
            raise SystemExit(f"--variants: duplicate variant name {name!r}")
        out.append((name, tuple(t for t in toks if t != "prefetch"), "prefetch" in toks))
    return out


def split_dynpad(defines):
    """(defines without a 'dynpadN' token, N): N more bytes of dynamic shared memory for
    the launch, to move a build into a larger carveout (less L1) without a static array
    (static shared memory stops at 48 KB)."""
    pad = [int(t[6:]) for t in defines if t.startswith("dynpad")]
    return tuple(t for t in defines if not t.startswith("dynpad")), sum(pad)


def precompile_variants(variants, log, cfgs=()):
    """NVRTC-compile every variant in parallel processes (gpu.precompile) with the defines
    each model in `cfgs` adds (gpu.megakernel_defines); the Megakernel constructors then
    load the cubins from the disk cache."""
    t0 = time.time()
    try:
        # 'prefetch'-only variants share a build
        defs = [split_dynpad(d)[0] for _, d, _ in variants]
        sets = {gpu.megakernel_defines(c, 1, d) for d in defs for c in cfgs} if cfgs else set(defs)
        done = gpu.precompile(sorted(sets), arch=gpu.device_arch())
        log(f"variants: {len(done)} builds compiled in {time.time() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001  (a build error shows again, per variant, in bench_variants)
        log(f"variants: parallel precompile failed ({e!r}); compiling one by one")


def bench_variants(cp, name, variants, batch, steps, reps, log, weights=None):
    """The megakernel of preset `name` built once per compile-time variant (same weights,
    same starting state): tokens and last-step logits bitwise against the default build,
    then one-launch us/step, timed round-robin (rep r of every variant, then rep r + 1) so
    clock drift hits all variants alike."""
    cfg = preset(name)
    xp = cp if cfg.name == "1b" else np
    w = weights if weights is not None else make_weights(cfg, 0, xp=xp)
    mks, rows = {}, []
    ref = None
    for vname, defines, pf in variants:
        t0 = time.time()
        try:
            defs, dynpad = split_dynpad(defines)
            mk = gpu.Megakernel(cfg, batch=batch, weights=w, defines=defs, prefetch=pf)
            if dynpad:
                mk.smem += dynpad
                gpu.set_smem(mk.kernel, mk.smem)
            mk.reset()
            res = mk.run(steps)
        except Exception as e:  # noqa: BLE001
            log(f"{name} variant {vname}: FAILED {e!r}")
            rows.append({"variant": vname, "defines": list(defines), "prefetch": pf, "error": repr(e)})
            continue
        if ref is None:
            ref = (res.tokens.copy(), res.logits.copy())
        tok_eq = bool(np.array_equal(res.tokens, ref[0]))
        log_eq = bool(np.array_equal(res.logits.view(np.uint32), ref[1].view(np.uint32)))
        static, _, carve = mk.shared_memory()
        log(f"{name} variant {vname} ({'+'.join(defines + (('prefetch',) if pf else ())) or 'no defines'}): "
            f"build {time.time() - t0:.1f} s; tokens == default: {tok_eq}; logits bit-equal: {log_eq}; "
            f"smem {static} static + {mk.smem} dynamic B -> carveout {carve} KB, L1 {256 - carve} KB")
        mks[vname] = mk
        rows.append({"variant": vname, "defines": list(defines), "prefetch": pf, "tokens_equal": tok_eq,
                     "logits_bit_equal": log_eq, "smem_static": static, "smem_dynamic": mk.smem,
                     "l1_kb": 256 - carve, "runs": []})

    def one(mk):
        mk.reset()
        return mk.run(steps, poison=False).elapsed_ms / steps

    for mk in mks.values():
        one(mk)   # warm
    for _ in range(reps):
        for r in rows:
            if r["variant"] in mks:
                r["runs"].append(one(mks[r["variant"]]))
    for r in rows:
        if r.get("runs"):
            r["step_ms"] = statistics.median(r["runs"])
            log(f"{name} variant {r['variant']}: {r['step_ms'] * 1e3:.1f} us/step "
                f"({', '.join(f'{v * 1e3:.1f}' for v in r['runs'])})")
    mks.clear()
    cp.get_default_memory_pool().free_all_blocks()
    return {"preset": name, "batch": batch, "steps_per_run": steps, "reps": reps,
            "weight_bytes_per_step": weight_bytes_per_step(cfg, batch), "variants": rows}


def slot_positions(req, batch, steps, max_seq):
    """pos[k][b] of every slot at every step (reference.Requests refill rule)."""
    pos, gen = [0] * batch, [0] * batch
    ln = [req.req_len(b, 0, max_seq) for b in range(batch)]
    out = []
    for _ in range(steps):
        out.append(list(pos))
        for b in range(batch):
            pos[b] += 1
            if pos[b] >= ln[b]:
                gen[b] += 1
                pos[b] = 0
                ln[b] = req.req_len(b, gen[b], max_seq)
    return out


def measure_costs(cp, name, steps, log):
    """Per-class fixed_ns / per_row_ns from the trace at batch 1 and 4, plus the global
    latencies (notify, dispatch, step overhead) in cost.py's format."""
    cfg = preset(name)
    xp = cp if cfg.name == "1b" else np
    w1 = make_weights(cfg, 0, xp=xp)
    per_b = {}
    glob = {"notify": [], "dispatch": [], "step": []}
    for B in (1, 4):
        mk = gpu.Megakernel(cfg, batch=B, weights=w1)
        mk.run(2)
        mk.reset()
        res = mk.run(steps, trace=True, hooks=["task:dispatch", "task:begin"])
        g = mk.graph
        tr = res.trace
        pos = slot_positions(Requests(), B, mk.step, cfg.max_seq)
        by = {}
        attn = []
        for r in tr:
            t = g.tasks[int(r["task_index"])]
            d = int(r["dur_ns"])
            if t.class_name == "attn":
                attn.append((pos[int(r["step"])][t.slot] + 1, d))
            by.setdefault(t.class_name, []).append(d)
        per_b[B] = {k: float(np.median(v)) for k, v in by.items()}
        per_b[B]["_attn"] = attn
        # dispatch -> begin from hooks
        hk = res.hooks
        disp = {(int(r["task_index"]), int(r["decode_step"])): int(r["ts_ns"]) for r in hk if int(r["hook"]) == 2}
        for r in hk:
            if int(r["hook"]) == 3:
                k = (int(r["task_index"]), int(r["decode_step"]))
                if k in disp:
                    glob["dispatch"].append(int(r["ts_ns"]) - disp[k])
        # notify: consumer begin - last producer end, for consumers that waited
        end = {}
        for r in tr:
            t = g.tasks[int(r["task_index"])]
            e_ns = int(r["t_dispatch"]) + int(r["wait_ns"]) + int(r["dur_ns"])
            key = (t.signal_event, int(r["step"]))
            end[key] = max(end.get(key, 0), e_ns)
        for r in tr:
            t = g.tasks[int(r["task_index"])]
            if int(r["wait_ns"]) > 0 and t.wait_event >= 0 and not t.dynamic:
                key = (t.wait_event, int(r["step"]))
                if key in end:
                    b_ns = int(r["t_dispatch"]) + int(r["wait_ns"])
                    if t.index == 0:
                        glob["step"].append(b_ns - end[key])
                    else:
                        glob["notify"].append(b_ns - end[key])
            if t.index == 0 and int(r["step"]) > 0:
                key = (g.step_event, int(r["step"]) - 1)
                if key in end:
                    glob["step"].append(int(r["t_dispatch"]) + int(r["wait_ns"]) - end[key])
        del mk
        cp.get_default_memory_pool().free_all_blocks()
    classes = {}
    for c in per_b[1]:
        if c.startswith("_"):
            continue
        if c == "attn":
            xs = np.array([a for a, _ in per_b[1]["_attn"] + per_b[4]["_attn"]], float)
            ys = np.array([d for _, d in per_b[1]["_attn"] + per_b[4]["_attn"]], float)
            if len(set(xs)) > 1:
                slope, icpt = np.polyfit(xs, ys, 1)
            else:
                slope, icpt = 0.0, float(np.median(ys))
            classes[c] = {"fixed_ns": round(max(icpt, 0.0), 1), "per_row_ns": round(max(slope, 0.0), 2)}
            continue
        d1 = per_b[1][c]
        d4 = per_b[4].get(c, d1)
        pr = max((d4 - d1) / 3.0, 0.0)
        classes[c] = {"fixed_ns": round(max(d1 - pr, 0.0), 1), "per_row_ns": round(pr, 2)}
    med = lambda v, dflt: int(np.median(v)) if v else dflt  # noqa: E731
    from dtrace_mk.megakernel.cost import lowering_name
    entry = {"classes": classes, "lowering": lowering_name(cfg), "notify_ns": med([x for x in glob["notify"] if x >= 0], 700),
             "dispatch_ns": med(glob["dispatch"], 200), "step_overhead_ns": med([x for x in glob["step"] if x >= 0], 3000)}
    log(f"costs {name}: {json.dumps(entry)}")
    return entry


def write_cost_table(bench_json: Path, path: Path, commit: str) -> None:
    """Update the sim's timing table at `path` (dtrace_mk/megakernel/data/cost_table.json,
    cost.py's format) with the costs a device run measured (bench.json): a preset measured
    as built with a non-standard lowering goes under its entry's "lowerings" (the standard
    entry stays), with the GPU's step time of the same run ("gpu_step_us") when the run
    timed that preset.  Presets the run did not measure keep their entries (or the
    estimate, for a new file)."""
    from dtrace_mk.megakernel.cost import DEFAULTS, estimate_table
    d = json.loads(Path(bench_json).read_text())
    info, costs = d["info"], d["costs"]
    if not costs:
        raise SystemExit(f"{bench_json}: no measured costs (run with --costs PRESETS)")
    path = Path(path)
    table = json.loads(path.read_text()) if path.exists() else estimate_table()
    stamp = f"{info['date']}, {commit or '?'}, {info['card']}"
    table.update({"source": "measured", "card": info["card"], "date": info["date"], "commit": commit,
                  "note": "Measured on the GPU by bench/megakernel.py --costs: per class, the median "
                          "task duration (begin..end, built-in trace) at batch 1 and 4 gives "
                          "fixed_ns and per_row_ns (attn: linear fit over the KV length); notify_ns = "
                          "median (consumer begin - last producer end) of waiting tasks; dispatch_ns = "
                          "median task:dispatch -> task:begin; step_overhead_ns = argmax end -> next "
                          "step's first task begin; gpu_step_us: the hook build's step in the same run, "
                          "by batch. Each entry's 'measured' says when, on which tree and card; an "
                          "entry under 'lowerings' is the preset as built with that lowering. "
                          "Presets without a measurement keep the estimate.",
                  "defaults": {**dict(DEFAULTS), **table.get("defaults", {})}})
    timed = {(r["preset"], r["batch"]): r["megakernel"]["step_ms"] * 1e3 for r in d.get("results", [])}
    for name, entry in costs.items():
        low = entry.get("lowering", "standard")
        row = {"classes": dict(entry["classes"]), "source": "measured", "measured": stamp,
               **{k: entry[k] for k in ("notify_ns", "dispatch_ns", "step_overhead_ns")}}
        steps = {str(b): round(us, 1) for (p, b), us in timed.items() if p == name}
        if steps:
            row["gpu_step_us"] = steps
        base = table["presets"].setdefault(name, {"classes": {}})
        if low == "standard":
            row["lowering"] = low
            if "lowerings" in base:
                row["lowerings"] = base["lowerings"]
            table["presets"][name] = row
        else:
            base.setdefault("lowerings", {})[low] = row
    for name in table["presets"]:
        table["presets"][name].setdefault("source", "estimate")
    path.write_text(json.dumps(table, indent=1) + "\n")


def sim_step_us(graph, steps: int) -> float:
    """The sim's mean decode-step time (us) of `graph` -- the same plans the GPU runs --
    under the shipped timing table: printed beside the GPU's step, so a stale table shows."""
    from dtrace_mk.megakernel.sim import Sim
    return statistics.mean(Sim(graph, steps).run().step_ns) / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--costs", default="", help="presets to measure task costs for (comma list; each as "
                    "built with its default lowering)")
    ap.add_argument("--from-json", default="", help="(no GPU) a bench.json to turn into the cost table")
    ap.add_argument("--write-cost-table", default="", help="with --from-json: the sim's timing table to "
                    "update (dtrace_mk/megakernel/data/cost_table.json)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--quick", action="store_true",
                    help="only megakernel / per-step / eager / graph timings (no cuBLAS, prefetch, hooks)")
    ap.add_argument("--no-old", action="store_true",
                    help="do not add '<preset>:old' (the standard lowering) next to presets that use "
                         "fuse_norm / split_k")
    ap.add_argument("--variants", default="",
                    help="compile-time variants of the megakernel, 'NAME=DEF1+DEF2,...' (token 'prefetch': "
                         "the runtime L2 prefetch); each is built for --variant-presets and compared with "
                         "the default build: us/step, vs eager per-op, vs default, %% copy bandwidth, tokens; "
                         "e.g. 'reclate=DTMK_REC_LATE,s2code=DTMK_POLL_FENCE+DTMK_PROLOGUE_SERIAL+DTMK_REC_LATE'; "
                         "TMA weight streaming: 'ws=DTMK_WSTREAM,ws8=DTMK_WSTREAM+DTMK_WS_NST=8+DTMK_WS_STAGE=16384' "
                         "(docs/dev/megakernel_speed.md \"Session 4\")")
    ap.add_argument("--variant-presets", default="1b", help="presets the --variants are built for")
    a = ap.parse_args(argv)
    variants = parse_variants(a.variants) if a.variants else None
    if a.from_json:
        if not a.write_cost_table:
            raise SystemExit("--from-json: give --write-cost-table PATH (the table to update)")
        write_cost_table(Path(a.from_json), Path(a.write_cost_table), a.commit)
        print(f"wrote {a.write_cost_table}")
        return
    import cupy as cp
    from benchio import card, logger
    out = Path(a.out)
    log = logger(out, "bench.log", "a")
    info = {**card(cp), "cupy": cp.__version__}
    bw = copy_bandwidth(cp)
    info["copy_bw_bytes_per_s"] = bw
    log(f"{info['card']}, {info['sms']} SMs; device-to-device copy {bw / 1e12:.2f} TB/s (read + write)")
    if variants:
        precompile_variants(variants, log, [preset(p) for p in a.variant_presets.split(",") if p])
    results = []
    names = []
    for name in [p for p in a.presets.split(",") if p]:
        cfg = preset(name)
        if not a.no_old and cfg.fuse_norm and ":" not in name and f"{name}:old" not in names:
            names.append(f"{name}:old")        # both lowerings in the same run, old first
        if name not in names:
            names.append(name)
    shared_w = {}
    for name in names:
        try:
            cfg = preset(name)
            w = None
            if cfg.name == "1b":                # the same GPU-drawn weights for every 1b variant
                if cfg.name not in shared_w:
                    shared_w[cfg.name] = make_weights(cfg, 0, xp=cp)
                w = shared_w[cfg.name]
            results.append(bench_preset(cp, name, a.batch, a.steps, a.reps, log, quick=a.quick, weights=w))
        except Exception as e:  # noqa: BLE001
            import traceback
            log(f"{name}: FAILED {e!r}\n{traceback.format_exc()}")
    costs = {}
    for name in [p for p in a.costs.split(",") if p]:
        try:
            costs[name] = measure_costs(cp, name, 8, log)
        except Exception as e:  # noqa: BLE001
            import traceback
            log(f"costs {name}: FAILED {e!r}\n{traceback.format_exc()}")
    var_results = []
    if variants:
        for name in [p for p in a.variant_presets.split(",") if p]:
            try:
                cfg = preset(name)
                w = None
                if cfg.name == "1b":
                    w = shared_w.get(cfg.name)
                    if w is None:
                        w = shared_w[cfg.name] = make_weights(cfg, 0, xp=cp)
                var_results.append(bench_variants(cp, name, variants, a.batch, a.steps, a.reps, log, weights=w))
            except Exception as e:  # noqa: BLE001
                import traceback
                log(f"{name} variants: FAILED {e!r}\n{traceback.format_exc()}")
    shared_w.clear()
    # the lowerings against each other: same weights and starting state -> tokens agree?
    by_name = {r["preset"]: r for r in results}
    compare = []
    for r in results:
        o = by_name.get(r["preset"] + ":old")
        if o is None:
            continue
        la, lb = r.pop("logits_last", None), o.get("logits_last")
        rel = None
        if la is not None and lb is not None:
            rel = float(np.linalg.norm((la - lb).ravel()) / max(np.linalg.norm(lb.ravel()), 1e-30))
        compare.append({"preset": r["preset"], "old_mk_us": o["megakernel"]["step_ms"] * 1e3,
                        "new_mk_us": r["megakernel"]["step_ms"] * 1e3,
                        "speedup": o["megakernel"]["step_ms"] / r["megakernel"]["step_ms"],
                        "tokens_equal_old_new": r["tokens"] == o["tokens"], "last_logits_rel_diff": rel})
    for r in results:
        r.pop("logits_last", None)
    (out / "bench.json").write_text(json.dumps({"info": info, "results": results, "costs": costs,
                                                "old_vs_new": compare, "variants": var_results}, indent=1))
    # short table last
    print()
    # mk: the hook build (hooks off); nh: the build without hook code (`dtrace-mk run`)
    print(f"{'preset':12} {'lowering':10} {'tasks':>6} {'B':>2} {'mk us':>8} {'nh us':>8} {'mk/step':>8} "
          f"{'eager':>8} {'graph':>8} {'eager/mk':>8} {'eager/nh':>8} {'graph/mk':>8} {'wt GB/s':>8} "
          f"{'% copy':>6} {'nh %':>6} {'sim us':>8} {'sim/mk':>6} {'tok=':>4}")
    for r in results:
        mk_ms = r["megakernel"]["step_ms"]
        nh_ms = r["megakernel_nohooks"]["step_ms"]
        gbs = r["weight_bytes_per_step"] / (mk_ms / 1e3) / 1e9
        nh_gbs = r["weight_bytes_per_step"] / (nh_ms / 1e3) / 1e9
        low = "standard" if not r.get("fuse_norm") else ("fuse" if r.get("split_k", 1) <= 1 else f"fuse+s{r['split_k']}")
        print(f"{r['preset']:12} {low:10} {r['tasks']:>6} {r['batch']:>2} {mk_ms * 1e3:8.1f} {nh_ms * 1e3:8.1f} "
              f"{r['megakernel_per_step_launch']['step_ms'] * 1e3:8.1f} "
              f"{r['eager']['step_ms'] * 1e3:8.1f} {r['cuda_graph']['step_ms'] * 1e3:8.1f} "
              f"{r['eager']['step_ms'] / mk_ms:8.2f} {r['eager']['step_ms'] / nh_ms:8.2f} "
              f"{r['cuda_graph']['step_ms'] / mk_ms:8.2f} {gbs:8.0f} "
              f"{100 * gbs * 1e9 / bw:6.1f} {100 * nh_gbs * 1e9 / bw:6.1f} "
              f"{r['sim_step_us']:8.1f} {r['sim_step_us'] / (mk_ms * 1e3):6.2f} {str(r['tokens_equal'])[0]:>4}")

    for c in compare:
        rd = c["last_logits_rel_diff"]
        print(f"{c['preset']}: new lowering {c['new_mk_us']:.1f} us/step vs old {c['old_mk_us']:.1f} us/step: "
              f"{c['speedup']:.2f}x; tokens old == new: {c['tokens_equal_old_new']}"
              + (f"; last-step logits rel. diff {rd:.1e}" if rd is not None else ""))

    for v in var_results:
        print()
        print(variant_table(v, results, bw))


def variant_table(v, results, bw):
    """The --variants table of one preset: the eager per-op reference is the fastest eager
    build of the same base model in this run (e.g. 1b:old, the session-2 target 1624 us)."""
    base = v["preset"].split(":")[0]
    eag = [(r["eager"]["step_ms"], r["preset"]) for r in results
           if r["preset"].split(":")[0] == base and "eager" in r]
    e_ms, e_name = min(eag) if eag else (None, "-")
    rows = [r for r in v["variants"] if "step_ms" in r]
    d_ms = next((r["step_ms"] for r in rows if r["variant"] == "default"), None)
    lines = [f"{v['preset']} batch {v['batch']}: compile-time variants (eager per-op reference: {e_name}"
             + (f" {e_ms * 1e3:.1f} us)" if e_ms else ")"),
             f"{'variant':14} {'us/step':>8} {'eager/mk':>8} {'dflt/mk':>8} {'wt GB/s':>8} {'% copy':>6} "
             f"{'tok=':>4} {'bits=':>5}  defines"]
    for r in v["variants"]:
        defs = "+".join(r["defines"] + (["prefetch"] if r["prefetch"] else [])) or "-"
        if "step_ms" not in r:
            lines.append(f"{r['variant']:14} {'FAILED':>8}  {defs}  {r.get('error', '')[:80]}")
            continue
        ms = r["step_ms"]
        gbs = v["weight_bytes_per_step"] / (ms / 1e3) / 1e9
        lines.append(f"{r['variant']:14} {ms * 1e3:8.1f} {(e_ms / ms if e_ms else float('nan')):8.2f} "
                     f"{(d_ms / ms if d_ms else float('nan')):8.2f} {gbs:8.0f} {100 * gbs * 1e9 / bw:6.1f} "
                     f"{str(r['tokens_equal'])[0]:>4} {str(r['logits_bit_equal'])[0]:>5}  {defs}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
