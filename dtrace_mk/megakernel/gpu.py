"""GPU launcher of the reference megakernel: NVRTC compile + disk cache, table packing,
buffers, launch, hook/trace/watchdog read-back.

    from dtrace_mk.megakernel import gpu
    mk = gpu.Megakernel(cfg, batch=4)                # builds the graph, weights, buffers
    res = mk.run(steps=8)                           # K steps in one launch
    res = mk.run(steps=8, per_step_launch=True)     # one launch per step
    res.tokens [steps, B], res.logits [B, V] (last step), res.hooks (dtmk_ctx records),
    res.trace (task trace records), res.watchdog (None or per-worker state)
    mk = gpu.Megakernel(cfg, batch=4, tp=tp.TPGroup(MPI.COMM_WORLD))   # tensor parallel:
                                                    # this rank's shard; run() is collective


The build's facts -- defines, the NVRTC compile and cache, the kernel's layouts, shared
memory, packed tables -- are in dtrace_mk/megakernel/gpu_build.py (re-exported here).
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..abi import definition as abi
from ..errors import UserError
from .graph import TaskGraph, build_graph, fused_lowering, split_part_floats
from .reference import Requests, make_weights, shard_weights, tp_local_config

from .gpu_build import (  # the build's facts: used here, and re-exported (gpu.X is their long-standing name)
    MK_THREADS, MK_MAXB, MK_WARPS, TREC_WORDS, SMEM_LIMIT, TRACE_BYTES, WS_SMEM_MAX, site_form, lean_site,
    runs_descriptors, PARAM_FIELDS, CTL_HOOK_MASK, CTL_TRACE, CTL_ABORT, CTL_REFRESH, CTL_WD_US,
    CTL_ABORT_WORKER, CTL_GEN, CTL_GEN_DUE, CTL_TABLES, CTL_OBS, CTL_STAMP, CTL_WORDS, CTL_GATE, ABORT_LEAVE, WS_LEFT,
    CTL_SM_MAP, CTL_OBSQ, OSQ_N, OSQ_N_MIN, OSQ_N_MAX, osq_w_bytes, OSQ_W_BYTES, OSQ_SPLIT_NH, OSQ_BLK_HDR,
    OBS_RING, OSQ_PAIR_BYTES, osq_split_bytes, OBS_SM_WARPS_MAX, OBS_SM_DEFINES, OBS_SMS_MAX, OBS_SMS_DEFAULT,
    OSQ_DEFER_DEFAULT, observer_defines, define_value, osq_depth_of, obs_sms_of, HO_WORDS, GATE_STOP,
    OBS_NAMES, OBS_WORDS, OBS_NONE, WS_NAMES, WS_STATES, TRACE_DTYPE, CTX_DTYPE, CompileError,
    lineinfo_options, source_hash, cache_dir, compile_source, cubin_file, load_module, precompile,
    ws_ring_default, ws_ring_bytes, ws_ring_for, megakernel_defines, h_buffers, staged_k, smem_layout,
    SM90_CARVEOUTS_KB, carveout_kb, SM90_REGS, SM90_SMEM, one_cta_per_sm, set_smem, gpu_count, device_arch,
    probe_smids, pack_tables, hook_mask, KERNEL_DIR)

#: this module's names and the build's it re-exports
__all__ = [
    "RunResult", "WatchdogFired", "format_watchdog", "Megakernel", "trace_to_chrome", "GpuRunResult", "run",
    "hook_dicts", "MK_THREADS", "MK_MAXB", "MK_WARPS", "TREC_WORDS", "SMEM_LIMIT", "TRACE_BYTES",
    "WS_SMEM_MAX", "site_form", "lean_site", "runs_descriptors", "PARAM_FIELDS", "CTL_HOOK_MASK", "CTL_TRACE", "CTL_ABORT",
    "CTL_REFRESH", "CTL_WD_US", "CTL_ABORT_WORKER", "CTL_GEN", "CTL_GEN_DUE", "CTL_TABLES", "CTL_OBS", "CTL_STAMP",
    "CTL_WORDS", "CTL_GATE", "ABORT_LEAVE", "WS_LEFT", "CTL_SM_MAP", "CTL_OBSQ", "OSQ_N", "OSQ_N_MIN",
    "OSQ_N_MAX", "osq_w_bytes", "OSQ_W_BYTES", "OSQ_SPLIT_NH", "OSQ_BLK_HDR", "OBS_RING", "OSQ_PAIR_BYTES",
    "osq_split_bytes", "OBS_SM_WARPS_MAX", "OBS_SM_DEFINES", "OBS_SMS_MAX", "OBS_SMS_DEFAULT",
    "OSQ_DEFER_DEFAULT", "observer_defines", "define_value", "osq_depth_of", "obs_sms_of", "HO_WORDS",
    "GATE_STOP", "OBS_NAMES", "OBS_WORDS", "OBS_NONE", "WS_NAMES", "WS_STATES", "TRACE_DTYPE", "CTX_DTYPE",
    "CompileError", "lineinfo_options", "source_hash", "cache_dir", "compile_source", "cubin_file",
    "load_module", "precompile", "ws_ring_default", "ws_ring_bytes", "ws_ring_for", "megakernel_defines",
    "h_buffers", "staged_k", "smem_layout", "SM90_CARVEOUTS_KB", "carveout_kb", "SM90_REGS", "SM90_SMEM",
    "one_cta_per_sm", "set_smem", "gpu_count", "device_arch", "probe_smids", "pack_tables", "hook_mask",
    "KERNEL_DIR", "fused_lowering",
]


# ---------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------

@dataclass
class RunResult:
    tokens: np.ndarray                 # int32 [steps, B] greedy tokens
    logits: np.ndarray                 # fp32 [B, V] of the last step
    step_logits: Optional[np.ndarray]  # fp32 [steps, B, V] with per_step_launch, else None
    hooks: np.ndarray                  # CTX_DTYPE records, sorted by ts_ns
    hooks_dropped: int
    trace: np.ndarray                  # TRACE_DTYPE records, sorted by t_dispatch
    trace_dropped: int
    watchdog: Optional[Dict[str, Any]]  # None, or the report of a stopped run
    elapsed_ms: float
    steps: int
    step0: int

    def hook_counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for h in abi.HOOKS:
            n = int(np.count_nonzero(self.hooks["hook"] == h.id))
            if n:
                out[h.name] = n
        return out


class WatchdogFired(UserError):
    def __init__(self, report: Dict[str, Any]):
        self.report = report
        super().__init__(format_watchdog(report))


def format_watchdog(rep: Dict[str, Any]) -> str:
    lines = [f"megakernel stopped by the watchdog ({rep['reason']}): no progress for "
             f"{rep['timeout_ms']} ms; first worker to fire: {rep['worker']}"]
    for w in rep["workers"]:
        if w["state"] in ("waiting", "watchdog", "stopped"):
            lines.append(f"  worker {w['worker']}: {w['state']} in task {w['task']} ({w['class']}) step "
                         f"{w['step']}: event {w['event']} ({w['event_name']}) = {w['value']} < target {w['target']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------

class Megakernel:
    """One model's megakernel on the current CUDA device (CuPy)."""

    def __init__(self, cfg, batch: int = 1, num_workers: Optional[int] = None, seed: int = 0,
                 weights: Optional[Dict[str, Any]] = None, requests: Requests = Requests(),
                 graph: Optional[TaskGraph] = None, hook_cap: int = 1 << 14, trace_cap: int = 1 << 14,
                 queue_threshold: int = 16, filler_ns: int = 1000, arch: Optional[str] = None,
                 prefetch: bool = False, defines: Sequence[str] = (), tp=None, handoff: bool = False,
                 idle_sms: int = 0):
        """defines: compile-time variants of megakernel.cu, e.g. ("DTMK_NO_HOOKS",) (no
        hook code at all: the baseline of bench/hooks.py).

        handoff: also load the LEAN build (the same defines + DTMK_NO_HOOKS DTMK_SM_WORKER:
        the no-hook build itself) and pin the workers to SMs (place_workers, both builds
        have -DDTMK_SM_WORKER; the hook build -DDTMK_HANDOFF too): start(lean=True) runs the
        lean grid, and handoff() swaps the hook build in while it runs, each worker at its
        next dependency wait (megakernel.cu "grid handoff"; LiveSession does it at the
        first attach).

        tp: a tp.TPGroup with ranks > 1 makes this rank's share of a tensor-parallel
        megakernel (collective: every rank of the group constructs it): the graph is
        build_graph(cfg, batch, W, rank, ranks), the weights this rank's shards of the
        FULL weights (`weights`, default make_weights(cfg, seed)), and the receive
        buffers and event counters are exchanged over CUDA IPC.  run / start / finish are
        then collective too (barriers around the launch).

        idle_sms (-DDTMK_SM_IDLE -DDTMK_SM_WORKER): the grid has that many CTAs more, on the
        SMs last in place_workers' order, and they leave at once (those SMs run nothing:
        bench/obs_split.py --idle-smids; serve's pinned observers, its clock pairs' SM)."""
        import cupy as cp
        self.cp = cp
        self.cfg, self.B, self.req = cfg, batch, requests
        dev = cp.cuda.Device()
        # -DDTMK_OBS_SM: DTMK_OBS_SMS SMs (default 1) are the observers'; the graph is planned
        # for the rest (the lean grid of a handoff job too: it leaves them free, sm_worker)
        self.obs_sm = "DTMK_OBS_SM" in defines
        self.obs_sms = obs_sms_of(defines) if self.obs_sm else 0
        self.osq_w_bytes = osq_w_bytes(osq_depth_of(defines)) if self.obs_sm else 0
        self.osq_split = self.obs_sm and "DTMK_OSQ_SPLIT" in defines
        if self.osq_split and (self.obs_sms < 2 or self.obs_sms % 2):
            raise UserError(f"DTMK_OSQ_SPLIT: an even number of observer SMs (half build, half drain), "
                            f"got DTMK_OBS_SMS={self.obs_sms}")
        if self.obs_sm and tp is not None and tp.ranks > 1:
            raise UserError("DTMK_OBS_SM: one rank only (no tensor parallelism yet)")
        n_sm = int(dev.attributes["MultiProcessorCount"])
        self.idle_sms = int(idle_sms)
        if self.idle_sms and not {"DTMK_SM_IDLE", "DTMK_SM_WORKER"} <= set(defines):
            raise UserError("Megakernel(idle_sms=...): the build needs -DDTMK_SM_IDLE and -DDTMK_SM_WORKER")
        if self.idle_sms and (handoff or self.idle_sms < 0):
            raise UserError(f"Megakernel(idle_sms={idle_sms}): a count >= 0, not with a grid handoff")
        self.num_workers = num_workers or n_sm - self.obs_sms - self.idle_sms
        self.grid = self.num_workers + self.obs_sms + self.idle_sms   # CTAs of a launch (+ observers, idle)
        if (self.obs_sm or self.idle_sms) and self.grid > n_sm:
            who = (("DTMK_OBS_SM: " if self.obs_sm else f"Megakernel(idle_sms={idle_sms}): ")
                   + f"{self.num_workers} workers and {self.obs_sms} observer(s)"
                   + (f" and {self.idle_sms} idle SM(s)" if self.idle_sms else ""))
            raise UserError(f"{who} need {self.grid} SMs (one CTA each, all resident); this GPU has {n_sm}: "
                            f"num_workers <= {n_sm - self.obs_sms - self.idle_sms}")
        self.tp = tp if tp is not None and tp.ranks > 1 else None
        rank, ranks = (tp.rank, tp.ranks) if self.tp else (0, 1)
        self.graph = graph or build_graph(cfg, batch, self.num_workers, rank=rank, ranks=ranks)
        if (self.graph.rank, self.graph.ranks) != (rank, ranks):
            raise UserError(f"Megakernel: graph of rank {self.graph.rank} of {self.graph.ranks}, "
                            f"but the group says rank {rank} of {ranks}")
        if ranks > 1 and cfg.comm_tile % 4:
            raise UserError(f"model {cfg.name!r}: comm_tile {cfg.comm_tile} must be a multiple of 4 on the GPU")
        self.lcfg = tp_local_config(cfg, rank, ranks)     # the shapes this rank computes
        self.arch = arch or device_arch()
        self.handoff_ok = bool(handoff)
        if handoff:
            if ranks > 1:
                raise UserError("Megakernel(handoff=True): one rank only (a tensor-parallel worker's "
                                "deferred comm signals are not handed over)")
            if "DTMK_NO_HOOKS" in defines:
                raise UserError("Megakernel(handoff=True): the hook build is the one handed to; "
                                "leave DTMK_NO_HOOKS out of `defines` (the lean build adds it)")
            base = tuple(d for d in defines if d != "DTMK_SM_WORKER")
            defines = base + ("DTMK_HANDOFF", "DTMK_SM_WORKER")
        self.defines = megakernel_defines(cfg, ranks, defines)
        self.block = MK_THREADS     # the launch's block size (one place)
        self.module = load_module(self.arch, "megakernel.cu", self.defines)
        # (the observer SM's defines are the hook build's; its lean grid leaves that SM free)
        lean_base = tuple(d for d in base if d.split("=")[0] not in OBS_SM_DEFINES) if handoff else ()
        self.lean_defines = (megakernel_defines(cfg, ranks, lean_base + ("DTMK_NO_HOOKS", "DTMK_SM_WORKER"))
                             if handoff else None)
        self.lean_kernel = (load_module(self.arch, "megakernel.cu", self.lean_defines).get_function("dtmk_megakernel")
                            if handoff else None)
        self.sm_map = None           # -DDTMK_SM_WORKER: cupy int32 map[smid] -> worker (place_workers)
        self._smid_cache = None      # sm_ids(): the SMs the grid gets, probed once
        self._sm_rec = None          # -DDTMK_SM_WORKER: cupy int32 [W], each worker's SM (record_placement)
        self._ws_host = None         # pinned copy of worker_state, read while a grid runs (handoff)
        self.obs_tables = 0          # device VM hook tables (dtrace_mk.runtime.live), 0 = none
        self.obs_state = None        # cupy uint64 [W, OBS_WORDS]
        self.kernel = self.module.get_function("dtmk_megakernel")
        self.hook_cap, self.trace_cap = hook_cap, trace_cap
        W = self.num_workers
        # weights (bf16 bits) on the device
        w = weights if weights is not None else make_weights(cfg, seed)
        if ranks > 1:
            w = shard_weights(cfg, w, rank, ranks)
        self.weights = {k: cp.asarray(v) for k, v in w.items()}
        tabs = pack_tables(self.graph)
        self.tables = {k: cp.asarray(v) for k, v in tabs.items()}
        c = self.lcfg
        f32, i32 = cp.float32, cp.int32
        et = max(c.expert_ffn // c.tile_n, 1)
        n_moe = max(len(c.moe_layers), 1)
        nt = c.vocab // c.tile_n
        B = batch
        nh = h_buffers(cfg, ranks)            # slice_events: h by layer parity (mk_hbuf)
        self.buf = {
            "h": cp.zeros((nh, B, c.hidden) if nh > 1 else (B, c.hidden), f32),
            "xn": cp.zeros((B, c.hidden), f32),
            "qkv": cp.zeros((c.n_layers, B, c.qkv_dim), f32),
            "attn": cp.zeros((c.n_layers, B, c.q_dim), f32),
            "act": cp.zeros((c.n_layers, B, c.ffn), f32),
            "k_cache": cp.zeros((c.n_layers, B, c.max_seq, c.n_kv_heads, c.head_dim), f32),
            "v_cache": cp.zeros((c.n_layers, B, c.max_seq, c.n_kv_heads, c.head_dim), f32),
            "logits": cp.zeros((B, c.vocab), f32),
            "tile_max": cp.zeros((B, nt), f32), "tile_arg": cp.zeros((B, nt), i32),
            "moe_part": cp.zeros((n_moe, max(c.n_experts, 1), et, B, c.hidden) if c.moe_layers
                                 else (max(1, split_part_floats(c, B) if self.graph.ranks == 1 else 0),), f32),
            "route_expert": cp.zeros((n_moe, B, max(c.top_k, 1)), i32),
            "route_weight": cp.zeros((n_moe, B, max(c.top_k, 1)), f32),
            "tokens": cp.zeros(B, i32), "pos": cp.zeros(B, i32), "req_gen": cp.zeros(B, i32),
            "req_len": cp.zeros(B, i32),
            "events": cp.zeros(len(self.graph.events), cp.uint64),
            "dyn_items": cp.zeros((n_moe, max(c.n_experts * et, 1), 2), cp.uint64),
            "dyn_head": cp.zeros(n_moe, cp.uint64), "dyn_tail": cp.zeros(n_moe, cp.uint64),
            "control": cp.zeros(CTL_WORDS, cp.uint32),
            "hook_ring": cp.zeros((W, hook_cap, abi.CONTEXT_SIZE), cp.uint8),
            "hook_head": cp.zeros(W, cp.uint64),      # records stored (a streaming ring: slot n % cap)
            "hook_drop": cp.zeros(W, cp.uint64),      # records not stored: ring full
            "hook_tail": cp.zeros(W, cp.uint64),      # resident: records the host consumed
            "steps_done": cp.zeros(W, cp.uint64),     # resident: steps whose records are all stored
            "trace_ring": cp.zeros((W, trace_cap, TRACE_BYTES), cp.uint8),
            "trace_head": cp.zeros(W, cp.uint64),
            "worker_state": cp.zeros((W, 8), cp.uint64),
            "obsq": cp.zeros(W * self.osq_w_bytes + self._osq_split_bytes(W) if self.obs_sm else 8, cp.uint8),
            "faults": cp.zeros((1, 8), cp.int64),
        }
        if self.tp:
            # peers write: event counters (+ per event the last remote sender) and the
            # receive slots [2 * n_layers][ranks][B][hidden], on their own allocations
            E = len(self.graph.events)
            self._ev_all = self.tp.alloc_shared((2 * E,), cp.uint64)
            self.buf["events"] = self._ev_all[:E]
            self.buf["tp_recv"] = self.tp.alloc_shared((2 * c.n_layers, ranks, B, c.hidden), f32)
            self.buf["tp_part"] = cp.zeros((2 * c.n_layers, B, c.hidden), f32)
        self.out_tokens = cp.zeros((1, B), i32)
        self.n_faults = 0
        self.queue_threshold, self.filler_ns = queue_threshold, filler_ns
        self.prefetch = prefetch      # L2 prefetch of a task's weights while its worker waits
        self.xs_off, self.xs_cap, self.smem = smem_layout(c, B, ranks, self.defines)
        set_smem(self.kernel, self.smem)
        if handoff:     # one params block serves both grids: the same dynamic layout
            assert smem_layout(c, B, ranks, self.lean_defines) == (self.xs_off, self.xs_cap, self.smem)
            set_smem(self.lean_kernel, self.smem)
            for k, what in ((self.kernel, "hook"), (self.lean_kernel, "lean")):
                if not one_cta_per_sm(k, self.block, self.smem):
                    raise UserError(f"Megakernel(handoff=True): a CTA of the {what} build does not fill an SM "
                                    f"({k.num_regs} registers x {self.block} threads, {self.smem} B dynamic "
                                    f"shared memory): a successor CTA could share an SM with a lean one")
        self.step = 0
        self._res = None              # the resident launch (start_resident), None when none
        self.reset()
        if handoff:
            self.place_workers()      # a successor CTA resumes the worker of its SM
            self._preload(self.kernel)
        if self.tp:                   # collective: map every rank's counters and slots
            peers = self.tp.exchange([self._ev_all.data.ptr, self.buf["tp_recv"].data.ptr])
            self.tables["tp_peers"] = cp.asarray(np.asarray(peers, dtype=np.uint64).reshape(ranks, 2))

    # -- state --
    def shared_memory(self) -> Tuple[int, int, int]:
        """(static, dynamic, carveout KB) of a worker's shared memory in this build and
        launch; the worker's L1 is 256 KB minus the carveout (carveout_kb)."""
        static = int(self.kernel.shared_size_bytes)
        return static, self.smem, carveout_kb(static + self.smem)

    def reset(self) -> None:
        """Fresh requests (generation 0 in every slot), zero events and queues."""
        cp, B, c = self.cp, self.B, self.cfg
        self.buf["tokens"][:] = cp.asarray([self.req.prompt_token(b, 0, c.vocab) for b in range(B)], cp.int32)
        self.buf["req_len"][:] = cp.asarray([self.req.req_len(b, 0, c.max_seq) for b in range(B)], cp.int32)
        for k in ("pos", "req_gen", "events", "dyn_head", "dyn_tail", "k_cache", "v_cache", "worker_state"):
            self.buf[k].fill(0)
        if self.tp:
            self._ev_all.fill(0)
        self.step = 0

    def set_faults(self, table) -> None:
        a = table.to_array() if table is not None and len(table) else np.zeros((0, 8), np.int64)
        self.n_faults = len(a)
        self.buf["faults"] = self.cp.asarray(a if len(a) else np.zeros((1, 8), np.int64))

    def _params(self, steps: int, n_out: int, out_row: int = 0, resident: bool = False,
                handoff_in: int = 0) -> Any:
        cp, c, g = self.cp, self.lcfg, self.graph
        ptr = lambda a: int(a.data.ptr)  # noqa: E731
        f32bits = lambda x: struct.unpack("<I", struct.pack("<f", x))[0]  # noqa: E731
        W, b, t = self.weights, self.buf, self.tables
        v = {
            "hidden": c.hidden, "n_layers": c.n_layers, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim, "ffn": c.ffn, "vocab": c.vocab, "max_seq": c.max_seq,
            "n_experts": c.n_experts, "top_k": c.top_k, "expert_ffn": c.expert_ffn, "batch": self.B,
            "qkv_dim": c.qkv_dim, "tile_n": c.tile_n, "xs_off": self.xs_off, "xs_cap": self.xs_cap,
            "rms_eps_bits": f32bits(c.rms_eps), "rope_theta_bits": f32bits(c.rope_theta),
            "w_embed": ptr(W["embed"]), "w_attn_norm": ptr(W["attn_norm"]), "w_qkv": ptr(W["qkv"]),
            "w_o": ptr(W["o"]), "w_mlp_norm": ptr(W["mlp_norm"]), "w_gate": ptr(W["gate"]),
            "w_up": ptr(W["up"]), "w_down": ptr(W["down"]), "w_router": ptr(W["router"]),
            "w_egate": ptr(W["egate"]), "w_eup": ptr(W["eup"]), "w_edown": ptr(W["edown"]),
            "w_final_norm": ptr(W["final_norm"]), "w_lm_head": ptr(W["lm_head"]),
            "out_tokens": ptr(self.out_tokens) + 4 * self.B * out_row, "n_out_steps": n_out,
            "req_seed": self.req.seed, "req_min": self.req.min_len, "req_span": self.req.span,
            "tasks": ptr(t["tasks"]), "n_tasks": len(g.tasks), "event_triggers": ptr(t["event_triggers"]),
            "n_events": len(g.events), "plan_off": ptr(t["plan_off"]), "plan_tasks": ptr(t["plan_tasks"]),
            "n_workers": self.num_workers, "step_event": g.step_event,
            "moe": ptr(t["moe"]), "n_moe": len(g.moe), "dyn_cap": int(b["dyn_items"].shape[1]),
            "step0": self.step, "n_steps": steps,
            "hook_cap": self.hook_cap, "trace_cap": self.trace_cap,
            "n_faults": self.n_faults, "rank": g.rank, "queue_threshold": self.queue_threshold,
            "filler_ns": self.filler_ns, "prefetch": int(self.prefetch),
            "ranks": g.ranks, "tp_peers": 0, "tp_part": 0, "tp_recv": 0, "ev_comm_op": 0,
            "resident": int(resident), "hook_tail": ptr(b["hook_tail"]) if resident else 0,
            "hook_drop": ptr(b["hook_drop"]), "steps_done": ptr(b["steps_done"]),
            "handoff_in": handoff_in,
        }
        if self.tp:
            v.update(tp_peers=ptr(t["tp_peers"]), tp_part=ptr(b["tp_part"]), tp_recv=ptr(b["tp_recv"]),
                     ev_comm_op=ptr(t["ev_comm_op"]))
        for k in ("h", "xn", "qkv", "attn", "act", "k_cache", "v_cache", "logits", "tile_max", "tile_arg",
                  "moe_part", "route_expert", "route_weight", "tokens", "pos", "req_gen", "req_len",
                  "events", "dyn_items", "dyn_head", "dyn_tail", "control", "hook_ring", "hook_head",
                  "trace_ring", "trace_head", "worker_state", "faults"):
            v[k] = ptr(b[k])
        missing = [f for f in PARAM_FIELDS if f not in v]
        assert not missing, missing
        return cp.asarray(np.array([v[f] for f in PARAM_FIELDS], dtype=np.uint64))

    def poison(self) -> None:
        for k in ("h", "xn", "qkv", "attn", "act", "logits", "tile_max", "moe_part", "tp_part", "tp_recv"):
            if k in self.buf:
                self.buf[k].fill(np.nan)
        self.buf["tile_arg"].fill(-1)
        self.out_tokens.fill(-1)

    def abort(self, stream=None) -> None:
        """Ask a running kernel to stop (host side; a separate stream)."""
        cp = self.cp
        s = stream or cp.cuda.Stream(non_blocking=True)
        one = np.array([1], np.uint32)
        cp.cuda.runtime.memcpyAsync(int(self.buf["control"].data.ptr) + 4 * CTL_ABORT, one.ctypes.data, 4,
                                    cp.cuda.runtime.memcpyHostToDevice, s.ptr)
        s.synchronize()

    def launch(self, steps: int, n_out: int, stream=None, lean: bool = False) -> None:
        """One launch of `steps` steps; lean: the LEAN grid (its successor's params were
        built before, start())."""
        params = self._params(steps, n_out)
        self._last_params = params   # keep alive until the launch completes
        if lean:      # (an observer-SM job: the lean CTA on the observer's SM leaves at once)
            self.lean_kernel((self.grid,), (self.block,), (params,), shared_mem=self.smem, stream=stream)
        else:
            self._clear_obsq(stream)
            self.kernel((self.grid,), (self.block,), (params,), shared_mem=self.smem, stream=stream)
        self.step += steps

    @property
    def obs_sm_warps_max(self) -> int:
        """Observer warps per observer SM at most in this build (-DDTMK_OBS_SM_WARPS, else
        OBS_SM_WARPS_MAX): the rows per observer SM of the kernel's per-warp arrays
        (dtmk_osq_stats, the split's handoff pairs)."""
        warps = define_value(self.defines, "DTMK_OBS_SM_WARPS")
        return int(warps) if warps else OBS_SM_WARPS_MAX

    def _osq_split_bytes(self, n_workers: int) -> int:
        """-DDTMK_OSQ_SPLIT: the handoff area after the workers' queues (else none)."""
        if not self.osq_split:
            return 0
        return osq_split_bytes(n_workers, self.obs_sms, self.obs_sm_warps_max)

    def _ctl_obsq(self, ctl: np.ndarray) -> None:
        """-DDTMK_OBS_SM: the observer queues' address into control words CTL_OBSQ, +1."""
        if self.obs_sm:
            qp = int(self.buf["obsq"].data.ptr)
            ctl[CTL_OBSQ], ctl[CTL_OBSQ + 1] = qp & 0xFFFFFFFF, qp >> 32

    def _clear_obsq(self, stream) -> None:
        """-DDTMK_OBS_SM: the observer queues count from 0 in every launch (cleared on the
        launch's stream)."""
        if self.obs_sm:
            with (stream if stream is not None else self.cp.cuda.get_current_stream()):
                self.buf["obsq"].fill(0)

    def _preload(self, kernel) -> None:
        """Launch `kernel` once for zero steps (no task runs; it returns at once).  CUDA
        loads a module's code at its first launch (lazy loading), and that load waits for
        every running kernel: a successor grid launched for the first time while the lean
        grid runs would start only after the lean grid ended, a deadlock when lean workers
        wait on work of workers that already left (measured: tiny, handoff at once;
        tools/handoff_probe.py).  Loaded here, it is placed on the first SM a lean worker
        frees (~3 us after it left, 1b and tiny, session 11)."""
        params = self._params(0, 0)
        if self.obs_sm:       # (its observer reads the queues' address from control before any _prepare)
            self._clear_obsq(None)
            ctl = np.zeros(CTL_WORDS, np.uint32)
            self._ctl_obsq(ctl)
            self.buf["control"][CTL_OBSQ:CTL_OBSQ + 2] = self.cp.asarray(ctl[CTL_OBSQ:CTL_OBSQ + 2])
        kernel((self.grid,), (self.block,), (params,), shared_mem=self.smem)
        self.cp.cuda.runtime.deviceSynchronize()

    def handoff(self, handle: Dict[str, Any]) -> bool:
        """Swap the hook build in for start(lean=True)'s running lean grid: launch it as a
        second grid (its CTAs take the SMs the lean workers free), then ask every lean
        worker to stop at its next dependency wait (control[CTL_ABORT] = ABORT_LEAVE, which
        the hook grid ignores).  Returns False when there is nothing to do (not lean,
        already handed off).  No kernel but the successor is launched and nothing waits
        for the lean grid."""
        ho = handle.get("handoff")
        if ho is None or ho["end"] is not None:
            return False
        self._launch_successor(handle)
        ho["word"][0] = ABORT_LEAVE
        self._h2d(int(self.buf["control"].data.ptr) + 4 * CTL_ABORT, ho["word"], 4, ho["side"])
        return True

    def _read_worker_state(self, side) -> np.ndarray:
        """worker_state, read on the side stream while a grid runs."""
        cp, ws = self.cp, self.buf["worker_state"]
        if self._ws_host is None:
            self._ws_host = np.frombuffer(cp.cuda.alloc_pinned_memory(ws.nbytes), np.uint64,
                                          ws.size).reshape(ws.shape)
        cp.cuda.runtime.memcpyAsync(self._ws_host.ctypes.data, int(ws.data.ptr), ws.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToHost, side.ptr)
        side.synchronize()
        return self._ws_host

    def _launch_successor(self, handle: Dict[str, Any]) -> None:
        """Launch the hook grid once every lean CTA has started (each has written its
        worker_state row, zeroed before the launch): a successor CTA then finds only SMs
        lean CTAs have left, never one a lean CTA is still to be placed on (it would wait
        for that worker, and the lean CTA would run another SM's worker a second time)."""
        ho, cp = handle["handoff"], self.cp
        col = WS_NAMES.index("state")
        while not handle["end"].done and not self._read_worker_state(ho["side"])[:, col].all():
            pass
        ho["stream"] = cp.cuda.Stream(non_blocking=True)
        ho["end"] = cp.cuda.Event()
        self._clear_obsq(ho["stream"])
        self.kernel((self.grid,), (self.block,), (ho["params"],), shared_mem=self.smem, stream=ho["stream"])
        ho["end"].record(ho["stream"])

    def handoff_state(self, handle: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """After finish(): where the hook grid resumed each lean worker ({"resumed": workers
        resumed, "left": [(worker, step, plan index)] stopped mid-plan, "drain": [workers]
        stopped in the end-of-run drain, "finished": [workers] done before the handoff,
        "done_at_leave": {worker: tasks}, "phantoms_readded": workers whose unspent
        queue_saturation phantoms the successor re-added, "leave_ns" / "resume_ns": device
        clock per worker (0 = none), "handed_off"}), None for a launch without a lean grid."""
        ho = handle.get("handoff")
        if ho is None:
            return None
        b = ho["block"].get()
        W = self.num_workers
        rec = b[2:2 + W * HO_WORDS].reshape(W, HO_WORDS)
        resumed = [w for w in range(W) if rec[w, 13]]
        idx = rec[:, 1].view(np.int64)
        finished = np.uint64(0xFFFFFFFFFFFFFFFF)        # the step word of a worker that had finished
        return {"resumed": int(b[1]),
                "left": [(w, int(rec[w, 0]), int(idx[w])) for w in resumed if idx[w] >= 0],
                "drain": [w for w in resumed if idx[w] == -3],
                "finished": [w for w in resumed if rec[w, 0] == finished],
                "done_at_leave": {w: int(rec[w, 2]) for w in resumed},
                "phantoms_readded": int(rec[:, 3].sum()),
                "leave_ns": rec[:, 12].astype(np.int64), "resume_ns": rec[:, 13].astype(np.int64),
                "handed_off": ho["end"] is not None}

    def run(self, steps: int, per_step_launch: bool = False, hooks=None, trace: bool = False,
            faults=None, watchdog_ms: int = 2000, refresh: int = 16, poison: bool = True,
            keep_logits: bool = False, raise_on_watchdog: bool = True, host_timeout_s: float = 60.0,
            inject_deadlock: Optional[int] = None) -> RunResult:
        """Run `steps` decode steps from the current state (one launch, or one per step).

        hooks: None / names / "all" / mask; trace: the built-in full task trace;
        faults: a faults.FaultTable; watchdog_ms: a wait longer than this stops the run
        (0: off); inject_deadlock: task index whose wait target is made unreachable."""
        cp = self.cp
        self._prepare(hooks, trace, faults, watchdog_ms, refresh)
        if poison:
            self.poison()
        saved = None
        if inject_deadlock is not None:
            saved = self.tables["tasks"][inject_deadlock, 7].copy()
            self.tables["tasks"][inject_deadlock, 7] += 1 << 20
        self.out_tokens = cp.full((steps, self.B), -1, cp.int32)
        step0 = self.step
        logits_hist = []
        stream = cp.cuda.Stream(non_blocking=True)
        cp.cuda.runtime.deviceSynchronize()
        self._barrier()               # tensor parallel: every rank reset / poisoned before any launch
        t0 = time.perf_counter()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        keep = []
        with stream:
            start.record(stream)
            if per_step_launch:
                for k in range(steps):
                    params = self._params(1, 1, out_row=k)
                    keep.append(params)
                    self._clear_obsq(stream)
                    self.kernel((self.grid,), (self.block,), (params,), shared_mem=self.smem)
                    self.step += 1
                    if keep_logits:
                        logits_hist.append(cp.asnumpy(self.buf["logits"]))
                        if int(self.buf["control"][CTL_ABORT]):
                            break
            else:
                self.launch(steps, steps, stream)
        end.record(stream)
        while not end.done:
            if time.perf_counter() - t0 > host_timeout_s:
                self.abort()
                break
            time.sleep(0.0005)
        stream.synchronize()
        elapsed = cp.cuda.get_elapsed_time(start, end)
        if saved is not None:
            self.tables["tasks"][inject_deadlock, 7] = saved
        res = self._collect(steps, step0, elapsed, np.stack(logits_hist) if logits_hist else None,
                            watchdog_ms)
        self._barrier()               # no peer writes into this rank's buffers after this
        if res.watchdog is not None and raise_on_watchdog:
            raise WatchdogFired(res.watchdog)
        return res

    def load_cubin(self, cubin: bytes, tag: str = "linked") -> None:
        """Run a prebuilt cubin of megakernel.cu from the next launch (the compiled tier:
        the kernel's LTO-IR linked with a monitor's, dtrace_mk.runtime.live)."""
        import cupy as cp
        self.module = cp.RawModule(path=str(cubin_file(cubin, f"megakernel_{tag}")))
        self.kernel = self.module.get_function("dtmk_megakernel")
        set_smem(self.kernel, self.smem)
        if self.handoff_ok:
            self._preload(self.kernel)

    # -- observer (device VM at the hook sites) ----------------------------------------
    def set_observer(self, tables_ptr: int, state) -> None:
        """Run the device VM's hook tables at `tables_ptr` (DeviceRuntime.tables) in the
        next launches; `state`: cupy uint64 [num_workers, OBS_WORDS].  0 / None: off."""
        self.obs_tables = int(tables_ptr)
        self.obs_state = state

    def place_workers(self, order: Optional[Sequence[int]] = None) -> List[int]:
        """-DDTMK_SM_WORKER builds: run worker k's plan on SM order[k] in every launch
        (megakernel.cu "worker placement"); order=None: the SMs in id order.  [] turns it
        off (the block order, different per launch).  Returns the order in force."""
        if "DTMK_SM_WORKER" not in self.defines:
            raise UserError("Megakernel.place_workers: the build lacks -DDTMK_SM_WORKER")
        if order is not None and not len(order):
            if self.handoff_ok:
                raise UserError("Megakernel.place_workers([]): a grid handoff needs the workers placed")
            self._sm_rec = None
            self.sm_map = None
            return []
        ids = self.sm_ids()
        order = ids if order is None else [int(x) for x in order]
        if sorted(order) != sorted(ids):
            raise UserError(f"Megakernel.place_workers: order must be a permutation of the SMs the grid "
                            f"gets ({len(ids)} ids, {min(ids)}..{max(ids)})")
        m = np.full(max(ids) + 1, -1, np.int32)
        m[order] = np.arange(len(order), dtype=np.int32)
        if self.idle_sms:                             # (-DDTMK_SM_IDLE: the last ones run nothing)
            m[order[len(order) - self.idle_sms:]] = -2
        self._sm_rec = None
        self.sm_map = self.cp.asarray(m)
        return order

    def place_observers(self, sms: Sequence[int]) -> List[int]:
        """-DDTMK_OBS_SM -DDTMK_SM_WORKER builds: run the observers on the SMs `sms` (as many
        as the build has observers) and the workers on the others in id order, from the
        next launch on (obs_place.calibrate chooses the SMs).  With idle_sms the highest
        other SMs idle (serve: a grid of every SM, one left free for the clock pairs).
        Returns the order in force."""
        if not self.obs_sm:
            raise UserError("Megakernel.place_observers: the build has no observer SMs (-DDTMK_OBS_SM)")
        if "DTMK_SM_WORKER" not in self.defines:
            raise UserError("Megakernel.place_observers: the build lacks -DDTMK_SM_WORKER")
        if len(sms) != self.obs_sms:
            raise UserError(f"Megakernel.place_observers: the build has {self.obs_sms} observer SMs, "
                            f"got {len(sms)} ({list(sms)})")
        from .obs_place import observer_order
        named = set(int(x) for x in sms)
        rest = [x for x in self.sm_ids() if x not in named]            # (sorted)
        idle = rest[len(rest) - self.idle_sms:] if self.idle_sms else []
        # (place_workers idles the order's last idle_sms SMs: after the observers)
        return self.place_workers(observer_order([x for x in self.sm_ids() if x not in idle], sms) + idle)

    def sm_ids(self) -> List[int]:
        """The SMs this grid's blocks get, sorted (probed once)."""
        if self._smid_cache is None:
            self._smid_cache = sorted(probe_smids(self.grid, self.smem))
        return list(self._smid_cache)

    def record_placement(self) -> None:
        """-DDTMK_SM_WORKER builds: from the next launch on, run in the block order (no
        map) and record the SM each worker ran on; placement() reads the last launch's."""
        if "DTMK_SM_WORKER" not in self.defines:
            raise UserError("Megakernel.record_placement: the build lacks -DDTMK_SM_WORKER")
        if self.handoff_ok:
            raise UserError("Megakernel.record_placement: a grid handoff needs the workers placed")
        self.sm_map = None
        self._sm_rec = self.cp.full(self.grid, -1, self.cp.int32)   # (the observer's block last)

    def placement(self) -> List[int]:
        """The SM of each worker in the last launch since record_placement() (an order for
        place_workers); -1 for a worker whose block did not start."""
        if self._sm_rec is None:
            raise UserError("Megakernel.placement: call record_placement() before the launch")
        return [int(x) for x in self.cp.asnumpy(self._sm_rec)]

    def _barrier(self) -> None:
        if self.tp:
            self.tp.barrier()

    def _prepare(self, hooks, trace, faults, watchdog_ms, refresh) -> None:
        self.set_faults(faults)
        ctl = np.zeros(CTL_WORDS, np.uint32)
        ctl[CTL_HOOK_MASK] = hook_mask(hooks)
        if self.tp and (hooks is True or hooks == "all"):       # comm:* exist only with ranks > 1
            ctl[CTL_HOOK_MASK] |= hook_mask(["comm:signal", "comm:wait"])
        ctl[CTL_TRACE] = 1 if trace else 0
        ctl[CTL_REFRESH] = refresh
        ctl[CTL_WD_US] = watchdog_ms * 1000
        ctl[CTL_ABORT_WORKER] = 0xFFFFFFFF
        if self.obs_tables and self.obs_state is not None:
            st = np.zeros((self.num_workers, OBS_WORDS), np.uint64)
            st[:, 0] = OBS_NONE
            self.obs_state.set(st)
            tp, op = self.obs_tables, int(self.obs_state.data.ptr)
            ctl[CTL_TABLES], ctl[CTL_TABLES + 1] = tp & 0xFFFFFFFF, tp >> 32
            ctl[CTL_OBS], ctl[CTL_OBS + 1] = op & 0xFFFFFFFF, op >> 32
            # keep the generation and stamp the host wrote (LiveSession attached before the launch)
            old = self.buf["control"].get()
            ctl[CTL_GEN] = old[CTL_GEN]
            ctl[CTL_STAMP:CTL_STAMP + 2] = old[CTL_STAMP:CTL_STAMP + 2]
        mp = (int(self.sm_map.data.ptr) if self.sm_map is not None
              else int(self._sm_rec.data.ptr) | 1 if self._sm_rec is not None else 0)
        ctl[CTL_SM_MAP], ctl[CTL_SM_MAP + 1] = mp & 0xFFFFFFFF, mp >> 32
        self._ctl_obsq(ctl)
        self.buf["control"].set(ctl)
        for k in ("hook_head", "trace_head", "hook_drop", "hook_tail", "steps_done"):
            self.buf[k].fill(0)

    def start(self, steps: int, hooks=None, trace: bool = False, faults=None, watchdog_ms: int = 2000,
              refresh: int = 16, poison: bool = True, lean: bool = False,
              handoff_after: Optional[int] = None) -> Dict[str, Any]:
        """Launch `steps` decode steps in ONE launch on a non-blocking stream and return at
        once; finish(handle) waits and collects (the asynchronous half of run()).

        lean (Megakernel(handoff=True) only): run the build without hook code; handoff()
        swaps the hook build in while it runs.  handoff_after=n (tests, benches): 0 asks
        the swap before the launch (every worker leaves at its first dependency wait), n > 0
        once some worker has done n tasks (the host polls; returns after asking)."""
        cp = self.cp
        if (lean or handoff_after is not None) and not self.handoff_ok:
            raise UserError("Megakernel.start(lean=True): built without handoff (Megakernel(..., handoff=True))")
        if lean and hooks:
            raise UserError("Megakernel.start: lean=True runs no hook code; hooks= needs the hook build")
        lean = lean or handoff_after is not None
        if handoff_after is not None and handoff_after < 0:
            raise UserError(f"Megakernel.start: handoff_after must be >= 0 tasks, got {handoff_after}")
        self._prepare(hooks, trace, faults, watchdog_ms, refresh)
        if handoff_after == 0:
            self.buf["control"][CTL_ABORT] = ABORT_LEAVE
        if lean:      # a successor waits for its worker's row to read done / left: none may be stale
            self.buf["worker_state"][:, WS_NAMES.index("state")] = 0
        if poison:
            self.poison()
        self.out_tokens = cp.full((steps, self.B), -1, cp.int32)
        step0 = self.step
        stream = cp.cuda.Stream(non_blocking=True)
        cp.cuda.runtime.deviceSynchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        ho = None
        if lean:        # zeroed before the launch: nothing but kernels' own work while it runs
            ho = {"block": cp.zeros(2 + self.num_workers * HO_WORDS, cp.uint64), "end": None,
                  "side": cp.cuda.Stream(non_blocking=True),
                  "word": np.frombuffer(cp.cuda.alloc_pinned_memory(4), np.uint32, 1)}
            # the successor's params, built before the start event: the timed window holds one launch
            ho["params"] = self._params(steps, steps, handoff_in=int(ho["block"].data.ptr))
        cp.cuda.runtime.deviceSynchronize()
        self._barrier()
        start.record(stream)
        self.launch(steps, steps, stream, lean=ho is not None)
        end.record(stream)
        handle = {"stream": stream, "start": start, "end": end, "steps": steps, "step0": step0,
                  "watchdog_ms": watchdog_ms, "t0": time.perf_counter(), "handoff": ho}
        if ho is not None:
            if handoff_after == 0:
                self._launch_successor(handle)
            elif handoff_after is not None:
                self._handoff_when_done(handle, handoff_after)
        return handle

    def _handoff_when_done(self, handle: Dict[str, Any], n: int) -> None:
        """handoff() once some lean worker has done n tasks (its WS_DONE, read on the side
        stream while the grid runs), or at once when the lean grid has ended."""
        col = WS_NAMES.index("done")
        while not handle["end"].done:
            if int(self._read_worker_state(handle["handoff"]["side"])[:, col].max()) >= n:
                break
        self.handoff(handle)

    def done(self, handle: Dict[str, Any]) -> bool:
        ho = handle.get("handoff")
        return bool(handle["end"].done) and (ho is None or ho["end"] is None or bool(ho["end"].done))

    def finish(self, handle: Optional[Dict[str, Any]] = None, host_timeout_s: float = 60.0,
               raise_on_watchdog: bool = True) -> RunResult:
        """Wait for start()'s launch `handle` and collect; without a handle: the resident
        launch (finish_resident)."""
        if handle is None:
            return self.finish_resident(host_timeout_s, raise_on_watchdog)
        cp = self.cp
        while not self.done(handle):
            if time.perf_counter() - handle["t0"] > host_timeout_s:
                self.abort()
                break
            time.sleep(0.0005)
        handle["stream"].synchronize()
        ho = handle.get("handoff")
        end = handle["end"]
        if ho is not None and ho["end"] is not None:
            ho["stream"].synchronize()
            end = ho["end"]      # the successor ends after every lean worker left or finished
        elapsed = cp.cuda.get_elapsed_time(handle["start"], end)
        res = self._collect(handle["steps"], handle["step0"], elapsed, None, handle["watchdog_ms"])
        self._barrier()
        if res.watchdog is not None and raise_on_watchdog:
            raise WatchdogFired(res.watchdog)
        return res

    # -- resident launches (serving): one launch across many steps, hooks streamed -------
    def start_resident(self, hooks=None, faults=None, watchdog_ms: int = 2000, window: int = 4,
                       refresh: int = 16, poison: bool = True, trace: bool = False,
                       out_rows: int = 256, max_steps: int = 1 << 30) -> None:
        """Launch the megakernel ONCE for many decode steps from the current step s0 and
        return at once; the kernel runs steps < s0 + window, then parks at the step gate
        (control word CTL_GATE) until grant() lets more run; stop() ends every worker at
        the granted step; finish() waits and collects.  While it runs, poll() streams the
        hook records (the ring is consumed: records written after the host read them may
        reuse their slots) and the steps every worker has finished.

        The kernel holds every SM while it runs: nothing here (grant, stop, poll) launches
        a kernel; only async copies on a side stream into pinned host buffers.  Tokens of
        step k land in row (k - s0) % out_rows and are read by poll() (grant refuses to
        run out_rows steps ahead of the last poll).  Collective with tensor parallelism.
        trace: not in resident launches (its ring does not stream)."""
        cp = self.cp
        if trace:
            raise UserError("Megakernel.start_resident: the built-in task trace does not stream; "
                            "use run(..., trace=True) (one launch of a known length)")
        if self._res is not None:
            raise UserError("Megakernel.start_resident: a resident launch is already running (finish() it)")
        if window < 1 or out_rows <= window:
            raise UserError(f"Megakernel.start_resident: window {window} must be >= 1 and < out_rows {out_rows}")
        self._prepare(hooks, False, faults, watchdog_ms, refresh)
        if poison:
            self.poison()
        s0 = self.step
        self.out_tokens = cp.full((out_rows, self.B), -1, cp.int32)
        self.buf["control"][CTL_GATE] = s0 + window
        W = self.num_workers
        pin = lambda n, dt: np.frombuffer(cp.cuda.alloc_pinned_memory(max(1, n * np.dtype(dt).itemsize)),  # noqa: E731
                                          dt, n)
        stage_n = int(min(W * self.hook_cap, 1 << 15))      # records per staging copy (4 MiB)
        r = {"s0": s0, "grant": s0 + window, "stopped": False, "out_rows": out_rows, "max_steps": max_steps,
             "watchdog_ms": watchdog_ms, "pub": pin(3 * W, np.uint64), "tail": pin(W, np.uint64),
             "gate": pin(1, np.uint32), "tok": pin(out_rows * self.B, np.int32),
             "stage": pin(stage_n * abi.CONTEXT_SIZE, np.uint8), "stage_n": stage_n,
             "consumed": np.zeros(W, np.int64), "dropped": 0, "done": s0, "tokens": [],
             "side": cp.cuda.Stream(non_blocking=True), "stream": cp.cuda.Stream(non_blocking=True)}
        params = self._params(max_steps, out_rows, resident=True)
        r["params"] = params                                 # alive until the launch ends
        cp.cuda.runtime.deviceSynchronize()
        self._barrier()
        r["start"], r["end"] = cp.cuda.Event(), cp.cuda.Event()
        self._clear_obsq(r["stream"])      # (an observer-SM build: its queues, and one CTA more)
        r["start"].record(r["stream"])
        self.kernel((self.grid,), (self.block,), (params,), shared_mem=self.smem, stream=r["stream"])
        r["end"].record(r["stream"])
        r["t0"] = time.perf_counter()
        self._res = r

    @property
    def resident(self) -> bool:
        return self._res is not None

    def _h2d(self, dst: int, src: np.ndarray, nbytes: int, side=None) -> None:
        """Copy pinned `src` into device memory a running kernel reads, on a side stream
        (the resident launch's by default): no kernel launch, done when it returns."""
        side = side if side is not None else self._res["side"]
        self.cp.cuda.runtime.memcpyAsync(dst, src.ctypes.data, nbytes, self.cp.cuda.runtime.memcpyHostToDevice,
                                         side.ptr)
        side.synchronize()

    def _write_gate(self, value: int) -> None:
        r = self._res
        r["gate"][0] = value
        self._h2d(int(self.buf["control"].data.ptr) + 4 * CTL_GATE, r["gate"], 4)

    def unstarted_step(self) -> int:
        """The first decode step no worker has started: the resident launch's grant (no
        worker starts a step before it is granted), else the next launch's first step."""
        r = self._res
        return int(r["grant"]) if r is not None else int(self.step)

    def grant(self, until: int) -> None:
        """Let the resident kernel run every step < `until` (absolute decode steps; only
        grows).  Both tensor-parallel ranks must grant the same steps (each rank's workers
        wait for the other's at the all-reduces)."""
        r = self._res
        if r is None:
            raise UserError("Megakernel.grant: no resident launch (start_resident)")
        if r["stopped"]:
            raise UserError("Megakernel.grant: the resident launch was stopped")
        until = int(until)
        if until <= r["grant"]:
            return
        if until - r["done"] > r["out_rows"] or until - r["s0"] > r["max_steps"]:
            raise UserError(f"Megakernel.grant: step {until} is more than out_rows={r['out_rows']} steps "
                            f"ahead of the last polled finished step {r['done']} (its tokens would be overwritten)")
        r["grant"] = until
        self._write_gate(until)

    def stop(self) -> int:
        """End the resident launch at the current grant: every worker stops at that same
        step (one store of grant | stop).  Returns that step."""
        r = self._res
        if r is None:
            raise UserError("Megakernel.stop: no resident launch (start_resident)")
        if not r["stopped"]:
            r["stopped"] = True
            self._write_gate(r["grant"] | GATE_STOP)
        return r["grant"]

    def poll(self) -> Tuple[np.ndarray, int, int]:
        """While resident: (new hook records since the last poll (CTX_DTYPE rows, per
        worker in ring order, workers one after another), records newly dropped by full
        rings, the lowest step every worker has finished: all records of steps below it
        have been returned now or before).  The consumed slots are handed back (tail)."""
        cp, r = self.cp, self._res
        if r is None:
            raise UserError("Megakernel.poll: no resident launch (start_resident)")
        W, cap, size = self.num_workers, self.hook_cap, abi.CONTEXT_SIZE
        d2h, side = cp.cuda.runtime.memcpyDeviceToHost, r["side"]
        pub = r["pub"]
        # steps_done first: a worker publishes records, head and drops before steps_done
        # (copies on one stream run in order: one wait for the three)
        for i, k in enumerate(("steps_done", "hook_head", "hook_drop")):
            cp.cuda.runtime.memcpyAsync(pub[i * W:].ctypes.data, int(self.buf[k].data.ptr), 8 * W, d2h, side.ptr)
        side.synchronize()
        done = int(pub[:W].min())
        head = pub[W:2 * W].astype(np.int64)
        drop_total = int(pub[2 * W:].sum())
        segs = []                                     # (worker, first slot, count)
        for w in np.nonzero(head > r["consumed"])[0]:
            n0, n1 = int(r["consumed"][w]), int(head[w])
            while n0 < n1:
                slot = n0 % cap
                c = min(n1 - n0, cap - slot)
                segs.append((int(w), slot, c))
                n0 += c
        out, stage, room = [], r["stage"], r["stage_n"]
        ring = int(self.buf["hook_ring"].data.ptr)
        i = 0
        while i < len(segs):
            used = 0
            while i < len(segs) and used < room:
                w, slot, c = segs[i]
                take = min(c, room - used)
                cp.cuda.runtime.memcpyAsync(stage.ctypes.data + used * size, ring + (w * cap + slot) * size,
                                            take * size, d2h, side.ptr)
                used += take
                segs[i] = (w, slot + take, c - take)
                if take == c:
                    i += 1
            side.synchronize()
            out.append(stage[:used * size].copy().view(CTX_DTYPE))
        if len(segs):
            r["consumed"][:] = np.maximum(r["consumed"], head)
            r["tail"][:] = r["consumed"].astype(np.uint64)
            self._h2d(int(self.buf["hook_tail"].data.ptr), r["tail"], 8 * W)
        if done > r["done"]:                          # tokens of the newly finished steps
            cp.cuda.runtime.memcpyAsync(r["tok"].ctypes.data, int(self.out_tokens.data.ptr), r["tok"].nbytes,
                                        d2h, side.ptr)
            side.synchronize()
            rows = r["tok"].reshape(r["out_rows"], self.B)
            for k in range(r["done"], done):
                r["tokens"].append(rows[(k - r["s0"]) % r["out_rows"]].copy())
            r["done"] = done
        new_drop = drop_total - r["dropped"]
        r["dropped"] = drop_total
        recs = np.concatenate(out) if out else np.zeros(0, CTX_DTYPE)
        return recs, new_drop, max(done, r["done"])

    def finish_resident(self, host_timeout_s: float = 60.0, raise_on_watchdog: bool = True) -> RunResult:
        """Stop (at the current grant, unless stop() was called), wait for the launch to
        end and collect: RunResult.tokens [steps, B] of every step of the launch, hooks /
        hooks_dropped: what poll() had not returned yet (the last poll), watchdog as in
        run().  The next launch continues at the stopped step."""
        cp, r = self.cp, self._res
        if r is None:
            raise UserError("Megakernel.finish_resident: no resident launch (start_resident)")
        last = self.stop()
        while not r["end"].done:
            if time.perf_counter() - r["t0"] > host_timeout_s and host_timeout_s > 0:
                self.abort(r["side"])
                break
            time.sleep(0.0005)
        r["stream"].synchronize()
        elapsed = cp.cuda.get_elapsed_time(r["start"], r["end"])
        ctl = cp.asnumpy(self.buf["control"])
        wd = None
        if ctl[CTL_ABORT]:
            wd = self.watchdog_report(int(ctl[CTL_ABORT]), int(ctl[CTL_ABORT_WORKER]), r["watchdog_ms"])
        recs, dropped, done = self.poll()
        if wd is None and done != last:
            raise RuntimeError(f"resident megakernel ended at step {done}, stopped at {last}")
        recs = recs[np.argsort(recs["ts_ns"], kind="stable")]
        toks = np.stack(r["tokens"]) if r["tokens"] else np.zeros((0, self.B), np.int32)
        self.step = done if wd is None else max(done, r["s0"])
        self._res = None
        res = RunResult(toks, cp.asnumpy(self.buf["logits"]), None, recs, dropped, np.zeros(0, TRACE_DTYPE), 0,
                        wd, elapsed, done - r["s0"], r["s0"])
        self._barrier()
        if wd is not None and raise_on_watchdog:
            raise WatchdogFired(wd)
        return res

    def _collect(self, steps, step0, elapsed, step_logits, watchdog_ms) -> RunResult:
        cp = self.cp
        toks = cp.asnumpy(self.out_tokens)
        hooks, hd = self.read_hooks()
        trace, td = self.read_trace()
        ctl = cp.asnumpy(self.buf["control"])
        wd = None
        if ctl[CTL_ABORT] and ctl[CTL_ABORT] != ABORT_LEAVE:     # (a handoff's stop is not one)
            wd = self.watchdog_report(int(ctl[CTL_ABORT]), int(ctl[CTL_ABORT_WORKER]), watchdog_ms)
        return RunResult(toks, cp.asnumpy(self.buf["logits"]), step_logits, hooks, hd, trace, td, wd,
                         elapsed, steps, step0)

    def read_hooks(self) -> Tuple[np.ndarray, int]:
        """The records of the last (non-resident) launches and how many a full ring refused
        (outside resident launches the ring does not wrap: hook_head <= hook_cap)."""
        head = self.cp.asnumpy(self.buf["hook_head"]).astype(np.int64)
        ring = self.cp.asnumpy(self.buf["hook_ring"])
        recs, dropped = [], int(self.cp.asnumpy(self.buf["hook_drop"]).sum())
        for w in range(self.num_workers):
            n = int(min(head[w], self.hook_cap))
            dropped += int(head[w]) - n
            if n:
                recs.append(ring[w, :n].reshape(-1).view(CTX_DTYPE))
        out = np.concatenate(recs) if recs else np.zeros(0, CTX_DTYPE)
        return out[np.argsort(out["ts_ns"], kind="stable")], dropped

    def read_trace(self) -> Tuple[np.ndarray, int]:
        head = self.cp.asnumpy(self.buf["trace_head"]).astype(np.int64)
        ring = self.cp.asnumpy(self.buf["trace_ring"])
        recs, dropped = [], 0
        for w in range(self.num_workers):
            n = int(min(head[w], self.trace_cap))
            dropped += int(head[w]) - n
            if n:
                recs.append(ring[w, :n].reshape(-1).view(TRACE_DTYPE))
        out = np.concatenate(recs) if recs else np.zeros(0, TRACE_DTYPE)
        return out[np.argsort(out["t_dispatch"], kind="stable")], dropped

    def watchdog_report(self, reason: int, worker: int, timeout_ms: int) -> Dict[str, Any]:
        ws = self.cp.asnumpy(self.buf["worker_state"])
        ev = self.cp.asnumpy(self.buf["events"])
        g = self.graph
        workers = []
        for w in range(self.num_workers):
            d = dict(zip(WS_NAMES, (int(x) for x in ws[w])))
            d["worker"] = w
            d["state"] = WS_STATES.get(d["state"], str(d["state"]))
            t = d["task"]
            d["class"] = g.tasks[t].class_name if 0 <= t < len(g.tasks) else "-"
            e = d["event"]
            d["event_name"] = g.events[e].name if 0 <= e < len(g.events) else "-"
            if d["state"] in ("waiting", "watchdog", "stopped") and 0 <= e < len(ev):
                d["value"] = int(ev[e])
            workers.append(d)
        return {"rank": g.rank, "reason": {1: "host abort", 2: "watchdog",
                                                3: "worker placement: a block ran on an SM the map leaves out"
                                                }.get(reason, f"abort {reason}"),
                "worker": worker if worker != 0xFFFFFFFF else None, "timeout_ms": timeout_ms,
                "workers": workers, "events": {g.events[i].name: int(v) for i, v in enumerate(ev)}}


# ---------------------------------------------------------------------------------
# Trace export (Chrome / Perfetto JSON)
# ---------------------------------------------------------------------------------

def trace_to_chrome(trace: np.ndarray, graph: TaskGraph, dropped: int = 0) -> Dict[str, Any]:
    """Chrome trace-event JSON: one track per worker, one slice per task (begin..end)
    plus a 'wait' slice from dispatch to begin when the task waited."""
    evs: List[Dict[str, Any]] = []
    if len(trace):
        t0 = int(trace["t_dispatch"].min())
    for r in trace:
        t = graph.tasks[int(r["task_index"])]
        disp = (int(r["t_dispatch"]) - t0) / 1000.0
        begin = disp + int(r["wait_ns"]) / 1000.0
        args = {"task": t.index, "class": t.class_name, "layer": None if t.layer == abi.NONE_U32 else t.layer,
                "expert": None if t.expert == abi.NONE_U32 else t.expert, "tile": list(t.tile),
                "step": int(r["step"]), "sm": int(r["sm"]), "wait_ns": int(r["wait_ns"]),
                "flags": int(r["flags"])}
        if int(r["wait_ns"]) > 0:
            evs.append({"name": "wait", "ph": "X", "pid": 0, "tid": int(r["worker"]), "ts": disp,
                        "dur": int(r["wait_ns"]) / 1000.0, "cat": "wait", "args": {"task": t.index}})
        evs.append({"name": t.class_name, "ph": "X", "pid": 0, "tid": int(r["worker"]), "ts": begin,
                    "dur": int(r["dur_ns"]) / 1000.0, "cat": "task", "args": args})
    return {"traceEvents": evs, "displayTimeUnit": "ns",
            "otherData": {"model": graph.cfg.name, "batch": graph.batch, "dropped": dropped,
                          "schema_hash": graph.schema.hash}}


# ---------------------------------------------------------------------------------
# Entry point of `dtrace-mk run --backend gpu` (docs/dev/megakernel_contract.md)
# ---------------------------------------------------------------------------------

@dataclass
class GpuRunResult:
    step_ns: List[int]
    tokens: int
    result: RunResult


def run(graph: TaskGraph, steps: int, faults=None, sink=None, seed: int = 0) -> GpuRunResult:
    """Run `steps` decode steps of `graph` on the GPU, one launch per step (so step
    times are measured); `sink` gets every hook context as a dict (abi.context.to_dict)."""
    from ..abi import context
    mk = Megakernel(graph.cfg, batch=graph.batch, num_workers=graph.num_workers, seed=seed, graph=graph)
    step_ns: List[int] = []
    hooks_all = []
    res = None
    for _ in range(steps):
        res = mk.run(1, hooks="all" if sink is not None else None, faults=faults)
        step_ns.append(int(res.elapsed_ms * 1e6))
        hooks_all.append(res.hooks)
    if sink is not None:
        for recs in hooks_all:
            raw = recs.tobytes()
            for i in range(len(recs)):
                sink(context.to_dict(raw[i * abi.CONTEXT_SIZE:(i + 1) * abi.CONTEXT_SIZE]))
    return GpuRunResult(step_ns, steps * graph.batch, res)


def hook_dicts(records: np.ndarray) -> List[Dict[str, Any]]:
    from ..abi import context
    raw = records.tobytes()
    return [context.to_dict(raw[i * abi.CONTEXT_SIZE:(i + 1) * abi.CONTEXT_SIZE]) for i in range(len(records))]
