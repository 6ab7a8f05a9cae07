"""Task-graph builder: one decode step of a Llama-style decoder in MPK normal form.

`build_graph(cfg, batch, num_workers)` lowers one decode step (one token for each of
`batch` request slots) to tasks and events.  Both the sim backend (`sim.py`) and the
GPU launcher (`gpu.py` + `kernels/megakernel.cu`) consume the result, so their hook
streams name the same tasks (contract: docs/dev/megakernel_contract.md).

Normal form
-----------
* Every task waits on exactly one event and signals exactly one event.
* Events are monotonic u64 counters that are never reset.  `EventDef.triggers` is the
  number of signals an event receives per step (the number of its producer tasks);
  a task of step k (0-based) waiting on event e may run once
  `counter[e] >= wait_count * (k + 1)` where `wait_count == triggers(e)`.
* Task 0 (layer 0's attention RMSNorm) has `wait_event == -1`: it waits on the *step
  boundary*: at step k it may run once `counter[step_event] >= k` (`step_event` is the
  event `argmax` signals, triggers 1), i.e. after the previous step finished; at
  step 0 immediately.
* Tasks are in a topological order: every task's wait event is produced by tasks of
  lower index only.  Every task is upstream of `argmax` (single sink), so when
  `step_event` reaches k+1 every event of step k is complete.

Lowering (per layer l; T = cfg.tile_n output columns per matmul tile)
---------------------------------------------------------------------
| class          | tasks                 | tile (x, y, z, w)        | lo..hi            | waits on (count)            |
|----------------|-----------------------|--------------------------|-------------------|-----------------------------|
| rmsnorm        | 1 (attention norm)    | (0,0,0,0)                | 0..hidden         | prev layer's MLP out / step |
| qkv            | qkv_dim / T           | (x,0,0,0)                | cols of q|k|v     | L.attn_norm (1)             |
| rope_kv_append | n_kv_heads            | (0,kvh,0,0)              | kv head kvh       | L.qkv (qkv tiles)           |
| attn           | n_kv_heads * batch    | (0,kvh,slot,0)           | q heads of kvh    | L.rope (n_kv_heads)         |
| attn_o         | hidden / T            | (x,0,0,0)                | cols (+residual)  | L.attn (n_kv_heads*batch)   |
| rmsnorm        | 1 (MLP norm)          | (1,0,0,0)                | 0..hidden         | L.attn_o (hidden/T)         |
| mlp_gate_up    | ffn / T (dense layer) | (x,0,0,0)                | ffn cols, SiLU*up | L.mlp_norm (1)              |
| mlp_down       | hidden / T            | (x,0,0,0)                | cols (+residual)  | L.gate_up (ffn/T)           |
| moe_router     | 1 (MoE layer)         | (0,0,0,0)                | 0..n_experts      | L.mlp_norm (1)              |
| moe_expert     | n_experts*expert_ffn/T| (x,0,0,0), expert=e      | expert ffn cols   | L.router (1)   dynamic      |

then `rmsnorm` (final, layer NONE, tile (2,0,0,0)), `lm_head` (vocab / T tiles; each
also writes the per-tile max and argmax per slot) and `argmax` (1 task: reduces the
lm_head tiles, writes the next token per slot, signals `step_done` = step_event).
`attn` tasks belong to one request slot (`Task.slot`, also tile z); all other tasks
cover the whole batch (`slot == NONE_U32`).  A `moe_expert` tile computes
h = silu(x Wg[:, lo:hi]) * (x Wu[:, lo:hi]) for the tokens routed to its expert and
adds gate_weight * h Wd[lo:hi, :] into the residual (a split-K partial sum).

Fused norm and split-K (ModelConfig.fuse_norm, split_k; single rank, dense models)
-----------------------------------------------------------------------------------
With `fuse_norm` (on for `1b`) the RMSNorm levels disappear: every `qkv`, `mlp_gate_up`
and `lm_head` tile normalises its input rows itself in its prologue (hidden floats per
slot from L2) and waits directly on what the norm waited on.  Task 0 stays a `rmsnorm`
(layer 0, tile (0,0,0,0), the step boundary): it writes the embedding into h.  With
`split_k = S > 1` every `attn_o` and `mlp_down` output tile becomes S tasks, tile
(x, 0, 0, s), each the partial product over K-slice s, written (no atomics) to a
partial buffer: attn_o -> set 2, mlp_down of layer l -> set l % 2 (part[set][s][B][H]).
The residual after a layer is h plus its pending partials; each reader sums them in one
fixed order (h, then mlp_down(l-1) s = 0..S-1, then attn_o(l) s = 0..S-1), and the
split-0 `mlp_down` tile of layer l first commits h[:, lo:hi] = that sum, so every
consumer and every run computes the same bits.  Per layer: qkv (waits mlp_down of l-1,
or task 0) -> rope -> attn -> attn_o (S x hidden/T) -> gate_up -> mlp_down (S x
hidden/T); then lm_head waits on the last mlp_down.  6 dependency levels per layer
instead of 8.  The kernel reads the options from the task records (`fused_aux`).
`rope_in_attn` (on for `1b`) drops the rope level: each attn task ropes its slot's q
heads and k head and appends its cache row first (5 levels per layer).  `head_events`
narrows two of the level barriers to what a task reads: attn (kv group g) waits on an
event of the qkv tiles holding group g's q, k and v columns (tiles must not straddle
heads), attn_o K-slice s on an event of the attn tasks of slice s's heads.  gate_up ->
mlp_down stays one event (split 0 commits h, which other gate_up tiles still read)
unless `slice_events`: then gate_up tile x signals the event of the K-slice its columns are
in, mlp_down K-slice s waits for that event only, and h is two buffers by layer parity
(layer l's norms read h[l % 2]; down(l)'s split 0 commits the sum into h[(l + 1) % 2], so
the gate_up tiles of other slices still read an unchanged h[l % 2]; the embedding writes
h[0], the final norm reads h[n_layers % 2]).  The kernel takes the parity from
-DDTMK_H_PARITY, which gpu.megakernel_defines adds for such graphs.
Tensor-parallel graphs (ranks > 1) keep the Megatron lowering whatever the
options say: the lowering of the "Tensor parallelism" section (its norm tasks reduce
the all-reduce slots).

Static plans
------------
`worker_plans[w]` is worker w's task order for every step (dense and router tasks;
never `dynamic` ones).  Plans come from deterministic list scheduling: tasks in index
order, each to the worker that can start it first under the estimated costs of
`cost.py` (ties: the worker that became free first, then the lowest id).  A level's tasks
are one class waiting on one event, so the order comes out of the graph's shape and not
of the costs' values (cost.py's module doc).  Each plan is
a subsequence of the topological order, which makes the static part deadlock-free.
Workers repeat their plan every step.

Dynamic queue (MoE expert tasks) -- the GPU kernel implements the same
-----------------------------------------------------------------------
* One FIFO queue per MoE layer (`moe` tables in `device_tables()`), refilled every step.
* The layer's `moe_router` task (static) computes the top-k experts of every slot; at
  its end it (1) pushes the task indices of every (expert, tile) whose expert got at
  least one token, ascending expert then tile (task index = moe_expert_base[l] +
  expert * expert_tiles + tile); (2) adds to the layer's expert-done event, in one
  atomic add, the number of tiles of experts that got no token (it signals on their
  behalf, so the event still reaches triggers x (k+1)); (3) signals its own event
  (`L.router`, what the expert tasks formally wait on).  Queue entries are visible to
  workers when the router's signal is (notification latency, like an event).
* A worker takes (pops, FIFO) a dynamic task whenever the next task of its static plan
  is not ready: it starts waiting on that task's event (dep:wait), and while waiting
  pops and runs dynamic tasks, re-checking its event after each; the wait ends
  (dep:release) the first time it finds the event met.  A worker whose plan is done
  also takes dynamic tasks.  A worker never takes a dynamic task while its static
  task is ready (static first), nor while held by a fault (starve_ready, phantoms).  A dynamic task never waits (its router has finished when it is
  queued) and signals the layer's expert-done event (`L.experts`), which the next
  layer's attention RMSNorm (or the final norm) waits on.
* Hooks of dynamic tasks carry FLAG_DYNAMIC; their `worker` is the worker that popped
  them; their task:ready is fired by the router's worker at push time with
  `queue_depth` = the queue's depth after the push.

Tensor parallelism (ranks > 1) -- Megatron-style, one graph per rank
-------------------------------------------------------------------
`build_graph(cfg, batch, num_workers, rank=r, ranks=R)` lowers rank r's share of a
decode step.  With R == 1 the graph is exactly the single-GPU graph above (pinned by
tests/megakernel/test_mk_single_rank_pin.py).  For R > 1:

* Attention heads are split: rank r owns q heads [r*Hq, (r+1)*Hq), Hq = n_heads / R.
  KV heads are split when `n_kv_heads % R == 0` (Hkv = n_kv_heads / R per rank); when
  instead `R % n_kv_heads == 0` every rank holds the one kv head its q heads belong to
  (kv head r // (R / n_kv_heads), replicated on R / n_kv_heads ranks, as vLLM does).
  Anything else is a UserError naming both rules.  `qkv` computes the rank's q|k|v
  shard ((Hq + 2*Hkv) * head_dim columns, a multiple of tile_n), `rope_kv_append` and
  `attn` run on the rank's kv heads (tile y and lo..hi of `attn` are GLOBAL head
  indices; tile x and lo..hi of every column-parallel task index the rank's shard).
* `attn_o` is row-parallel: hidden/T tiles, each a partial sum over the rank's heads
  (no residual add: the consumer of the all-reduce adds the residual once).
* Dense MLP: `mlp_gate_up` computes the rank's ffn/R columns (column-parallel), then
  `mlp_down` hidden/T tiles of partial sums (row-parallel).  MoE: the router is
  replicated (every rank routes identically); each expert's ffn is split, the rank runs
  (expert_ffn/R)/T tiles per expert (`MoELayer.expert_tiles` is the local count).
* After `attn_o` (comm op `allreduce_attn`) and after `mlp_down` / the experts
  (`allreduce_mlp`) come communication tasks of class `allreduce` (one-shot all-reduce
  in tiles of `cfg.comm_tile` columns, C = hidden / comm_tile tiles).  For every tile x
  and every destination rank q (q = r+1, r+2, ... mod R, the rank itself last) one task:
  tile (x, q, 0, 0), lo..hi = its columns; it waits on the partial-sum event (L.attn_o /
  L.mlp_down / L.experts), writes its partial tile into rank q's receive slot [r] and
  signals the event `L{l}.{op}.r{q}` (owner_rank = q).  The task with q == r copies into
  the rank's own slot and signals locally.
* Every rank's event table has, per layer and op, the R receive events `L{l}.{op}.r{q}`
  (q = 0..R-1, owner_rank q, comm_op = the op, triggers = C * R: C tiles from each of the
  R ranks, the rank's own included).  Event ids are therefore identical on every rank;
  a rank's proxies of peers' receive events (owner_rank != rank) are what its comm tasks
  signal remotely.  The consumer -- the next `rmsnorm` (the MLP norm, the next layer's
  attention norm, or the final norm) -- waits on its own rank's receive event with
  count C * R and reduces the R partial slots (+ residual) before normalising.
* Rank-local events have owner_rank = rank, so schemas of different ranks differ only
  in those owner_rank values (names and ids are the same everywhere).
* `lm_head` and `argmax` are replicated: every rank computes all vocab tiles and the
  same token (no gather); the step boundary stays local.
* comm_gen: the (comm_op, comm_gen) pair names one logical all-reduce on every rank:
  `comm_gen = step * n_layers + layer` (`TaskGraph.comm_gen(step, layer)`), the same
  number on every rank; both ops share the numbering, the op tells them apart.

Remote events
-------------
`EventDef.owner_rank` names the rank whose memory holds the counter;
`EventDef.comm_op` is the comm op id of an all-reduce receive event (-1 otherwise).  A
signal to an event whose owner_rank != rank crosses to that rank (sim: the transport;
GPU: a system-scope release add through the peer's IPC mapping).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..abi.definition import NONE_U32
from ..abi import schema as S
from ..errors import UserError
from .presets import ModelConfig

if TYPE_CHECKING:  # pragma: no cover
    from .cost import ModelCosts

CLASS_IDS: Dict[str, int] = {row[0]: i for i, row in enumerate(S.STANDARD_TASK_CLASSES)}
CLASS_NAMES: Tuple[str, ...] = tuple(row[0] for row in S.STANDARD_TASK_CLASSES)


def pack_tile(tile: Sequence[int]) -> int:
    """x | y<<16 | z<<32 | w<<48 (each coordinate 16 bits), the ABI's `tile` field."""
    x, y, z, w = tile
    return (x & 0xFFFF) | (y & 0xFFFF) << 16 | (z & 0xFFFF) << 32 | (w & 0xFFFF) << 48


@dataclass(frozen=True)
class Task:
    index: int            # position in TaskGraph.tasks (task_index in hook contexts)
    cls: int              # task class id (abi.schema standard ids)
    layer: int            # NONE_U32 when none
    expert: int           # NONE_U32 when none
    tile: Tuple[int, int, int, int]   # (x, y, z, w), see the lowering table
    lo: int
    hi: int               # the op's output range this task covers (cols, heads, experts)
    wait_event: int       # event id waited on (-1: the step boundary, see module doc)
    wait_count: int       # triggers per step of wait_event (target = wait_count * (step+1))
    signal_event: int     # event id incremented by 1 when the task ends
    dynamic: bool = False  # MoE expert task (queued at run time by the router)
    slot: int = NONE_U32  # request slot of a per-request task (attn), else NONE_U32

    @property
    def class_name(self) -> str:
        return CLASS_NAMES[self.cls]

    @property
    def tile_packed(self) -> int:
        return pack_tile(self.tile)


@dataclass(frozen=True)
class EventDef:
    id: int
    name: str             # "L3.qkv", "final_norm", "step_done"
    producer_class: str   # class name of the producing tasks
    triggers: int         # signals per step (number of producer tasks)
    owner_rank: int = 0
    comm_op: int = -1     # comm op id of an all-reduce receive event, else -1


@dataclass(frozen=True)
class MoELayer:
    layer: int
    router_task: int      # task index of the layer's moe_router
    expert_base: int      # task index of (expert 0, tile 0); + expert * expert_tiles + tile
    expert_tiles: int     # tiles per expert (expert_ffn / tile_n)
    router_event: int     # event the router signals (expert tasks wait on it)
    expert_event: int     # expert-done event (the next layer waits on it)


@dataclass
class TaskGraph:
    cfg: ModelConfig
    batch: int
    num_workers: int
    tasks: List[Task]
    events: List[EventDef]
    worker_plans: List[List[int]]   # static per-worker task order (dense part)
    schema: S.TaskSchema
    step_event: int                 # the event argmax signals (step boundary)
    moe: List[MoELayer] = field(default_factory=list)
    rank: int = 0
    ranks: int = 1

    # tensor parallelism --------------------------------------------------------------
    def comm_gen(self, step: int, layer: int) -> int:
        """The comm generation of (step, layer): the same number on every rank for the
        same logical all-reduce (module doc)."""
        return step * self.cfg.n_layers + layer

    def is_remote(self, event: int) -> bool:
        """The event's counter lives on another rank."""
        return self.events[event].owner_rank != self.rank

    def remote_fed(self, event: int) -> bool:
        """A local all-reduce receive event: other ranks signal it."""
        e = self.events[event]
        return e.comm_op >= 0 and e.owner_rank == self.rank and self.ranks > 1

    # derived ---------------------------------------------------------------------
    def consumers(self) -> List[List[int]]:
        """consumers()[e] = task indices waiting on event e (ascending)."""
        out: List[List[int]] = [[] for _ in self.events]
        for t in self.tasks:
            if t.wait_event >= 0:
                out[t.wait_event].append(t.index)
        return out

    def task_worker(self) -> List[int]:
        """Static worker of each task (-1 for dynamic tasks)."""
        owner = [-1] * len(self.tasks)
        for w, plan in enumerate(self.worker_plans):
            for i in plan:
                owner[i] = w
        return owner

    @property
    def static_tasks(self) -> int:
        return sum(1 for t in self.tasks if not t.dynamic)

    def moe_of_layer(self, layer: int) -> Optional[MoELayer]:
        for m in self.moe:
            if m.layer == layer:
                return m
        return None

    def device_tables(self) -> Dict[str, np.ndarray]:
        """Flat arrays for upload.  u32 'none' values (layer, expert, slot) are stored
        as int32 -1 (the same bits).  Names and meanings:

        task_cls, task_layer, task_expert, task_slot, task_lo, task_hi,
        task_wait_event (-1 = step boundary), task_wait_count, task_signal_event,
        task_dynamic (0/1)                                  int32[T]
        task_tile                                            int64[T] packed x|y<<16|z<<32|w<<48
        event_triggers, event_owner_rank                     int32[E]
        event_consumer_offsets int32[E+1], event_consumers int32[...]   (CSR)
        plan_offsets int32[W+1], plan_tasks int32[...]       (CSR: worker w runs
                                                              plan_tasks[plan_offsets[w]:plan_offsets[w+1]])
        layer_moe int32[n_layers]  index into the moe_* arrays, -1 for dense layers
        moe_layer, moe_router_task, moe_expert_base, moe_expert_tiles,
        moe_router_event, moe_expert_event                   int32[n_moe_layers]
        params int64[8]: num_tasks, num_events, num_workers, batch, step_event,
                         n_experts, top_k, expert_tiles

        Only when ranks > 1 (single-rank tables are pinned, keys included):
        event_comm_op int32[E]  comm op id of all-reduce receive events, -1 otherwise
        tp_params int64[4]: rank, ranks, comm_tile (columns per comm task), n_layers
                            (comm_gen = step * n_layers + layer)
        """
        T = self.tasks
        i32 = lambda xs: np.asarray(xs, dtype=np.int64).astype(np.int32)  # noqa: E731
        none = lambda v: -1 if v == NONE_U32 else v  # noqa: E731
        cons = self.consumers()
        c_off = np.zeros(len(self.events) + 1, dtype=np.int32)
        c_off[1:] = np.cumsum([len(c) for c in cons])
        p_off = np.zeros(len(self.worker_plans) + 1, dtype=np.int32)
        p_off[1:] = np.cumsum([len(p) for p in self.worker_plans])
        layer_moe = [-1] * self.cfg.n_layers
        for i, m in enumerate(self.moe):
            layer_moe[m.layer] = i
        et = self.moe[0].expert_tiles if self.moe else 0
        out = {
            "task_cls": i32([t.cls for t in T]),
            "task_layer": i32([none(t.layer) for t in T]),
            "task_expert": i32([none(t.expert) for t in T]),
            "task_slot": i32([none(t.slot) for t in T]),
            "task_tile": np.asarray([t.tile_packed for t in T], dtype=np.int64),
            "task_lo": i32([t.lo for t in T]),
            "task_hi": i32([t.hi for t in T]),
            "task_wait_event": i32([t.wait_event for t in T]),
            "task_wait_count": i32([t.wait_count for t in T]),
            "task_signal_event": i32([t.signal_event for t in T]),
            "task_dynamic": i32([int(t.dynamic) for t in T]),
            "event_triggers": i32([e.triggers for e in self.events]),
            "event_owner_rank": i32([e.owner_rank for e in self.events]),
            "event_consumer_offsets": c_off,
            "event_consumers": i32([i for c in cons for i in c]),
            "plan_offsets": p_off,
            "plan_tasks": i32([i for p in self.worker_plans for i in p]),
            "layer_moe": i32(layer_moe),
            "moe_layer": i32([m.layer for m in self.moe]),
            "moe_router_task": i32([m.router_task for m in self.moe]),
            "moe_expert_base": i32([m.expert_base for m in self.moe]),
            "moe_expert_tiles": i32([m.expert_tiles for m in self.moe]),
            "moe_router_event": i32([m.router_event for m in self.moe]),
            "moe_expert_event": i32([m.expert_event for m in self.moe]),
            "params": np.asarray([len(T), len(self.events), self.num_workers, self.batch,
                                  self.step_event, self.cfg.n_experts, self.cfg.top_k, et],
                                 dtype=np.int64),
        }
        if self.ranks > 1:
            out["event_comm_op"] = i32([e.comm_op for e in self.events])
            out["tp_params"] = np.asarray([self.rank, self.ranks, self.cfg.comm_tile, self.cfg.n_layers],
                                          dtype=np.int64)
        return out


class _Builder:
    def __init__(self, cfg: ModelConfig, batch: int, rank: int = 0, ranks: int = 1):
        self.cfg, self.batch, self.rank, self.ranks = cfg, batch, rank, ranks
        self.tasks: List[Task] = []
        self.events: List[EventDef] = []
        self.moe: List[MoELayer] = []
        self.own_recv: Dict[int, int] = {}   # receive event (any owner) -> this rank's of the same op

    def event(self, name: str, producer: str, triggers: int, owner: Optional[int] = None,
              comm_op: int = -1) -> int:
        owner = self.rank if owner is None else owner
        self.events.append(EventDef(len(self.events), name, producer, triggers, owner, comm_op))
        return len(self.events) - 1

    def task(self, cls: str, layer: int, tile, lo: int, hi: int, wait: Tuple[int, int], signal: int,
             expert: int = NONE_U32, dynamic: bool = False, slot: int = NONE_U32) -> int:
        self.tasks.append(Task(len(self.tasks), CLASS_IDS[cls], layer, expert, tuple(tile), lo, hi,
                               wait[0], wait[1], signal, dynamic, slot))
        return len(self.tasks) - 1

    def tiled(self, cls: str, layer: int, n: int, wait, signal, T: int = 0) -> None:
        """n / T output tiles (x, 0, 0, 0); signal: an event, or a function of the tile's
        first column giving its event (head_events)."""
        T = T or self.cfg.tile_n
        for x in range(n // T):
            self.task(cls, layer, (x, 0, 0, 0), x * T, (x + 1) * T, wait,
                      signal(x * T) if callable(signal) else signal)

    def allreduce(self, layer: int, op: str, src: Tuple[int, int]) -> Tuple[int, int]:
        """Comm tasks of one all-reduce (module doc); returns (own receive event, count)."""
        cfg, R, r = self.cfg, self.ranks, self.rank
        op_id = S.STANDARD_COMM_OPS.index(op)
        ct = cfg.comm_tile
        tiles = cfg.hidden // ct
        recv = [self.event(f"L{layer}.{op}.r{q}", "allreduce", tiles * R, owner=q, comm_op=op_id)
                for q in range(R)]
        for e in recv:
            self.own_recv[e] = recv[r]
        for off in range(1, R + 1):
            q = (r + off) % R
            for x in range(tiles):
                self.task("allreduce", layer, (x, q, 0, 0), x * ct, (x + 1) * ct, src, recv[q])
        return recv[r], tiles * R

    def build(self) -> None:
        cfg, B, T = self.cfg, self.batch, self.cfg.tile_n
        sh = tp_shard(cfg, self.rank, self.ranks)
        tp = self.ranks > 1
        if fused_lowering(cfg, self.ranks):
            self.build_fused()
            return
        group = cfg.n_heads // cfg.n_kv_heads
        kv_heads = range(sh.kv_lo, sh.kv_hi)
        n_kv = len(kv_heads)
        prev: Tuple[int, int] = (-1, 0)                     # the step boundary
        for l in range(cfg.n_layers):
            e = self.event(f"L{l}.attn_norm", "rmsnorm", 1)
            self.task("rmsnorm", l, (0, 0, 0, 0), 0, cfg.hidden, prev, e)
            nq = sh.qkv_cols // T
            e_qkv = self.event(f"L{l}.qkv", "qkv", nq)
            self.tiled("qkv", l, sh.qkv_cols, (e, 1), e_qkv)
            e_rope = self.event(f"L{l}.rope", "rope_kv_append", n_kv)
            for h in kv_heads:
                self.task("rope_kv_append", l, (0, h, 0, 0), h, h + 1, (e_qkv, nq), e_rope)
            e_attn = self.event(f"L{l}.attn", "attn", n_kv * B)
            for h in kv_heads:
                qlo, qhi = max(h * group, sh.q_lo), min((h + 1) * group, sh.q_hi)
                for s in range(B):
                    self.task("attn", l, (0, h, s, 0), qlo, qhi, (e_rope, n_kv), e_attn, slot=s)
            no = cfg.hidden // T
            e_o = self.event(f"L{l}.attn_o", "attn_o", no)
            self.tiled("attn_o", l, cfg.hidden, (e_attn, n_kv * B), e_o)
            after_o = self.allreduce(l, "allreduce_attn", (e_o, no)) if tp else (e_o, no)
            e_n2 = self.event(f"L{l}.mlp_norm", "rmsnorm", 1)
            self.task("rmsnorm", l, (1, 0, 0, 0), 0, cfg.hidden, after_o, e_n2)
            if cfg.is_moe(l):
                e_r = self.event(f"L{l}.router", "moe_router", 1)
                router = self.task("moe_router", l, (0, 0, 0, 0), 0, cfg.n_experts, (e_n2, 1), e_r)
                et = sh.expert_ffn_cols // T
                e_x = self.event(f"L{l}.experts", "moe_expert", cfg.n_experts * et)
                base = len(self.tasks)
                for ex in range(cfg.n_experts):
                    for x in range(et):
                        self.task("moe_expert", l, (x, 0, 0, 0), x * T, (x + 1) * T, (e_r, 1), e_x,
                                  expert=ex, dynamic=True)
                self.moe.append(MoELayer(l, router, base, et, e_r, e_x))
                prev = (e_x, cfg.n_experts * et)
            else:
                ng = sh.ffn_cols // T
                e_gu = self.event(f"L{l}.gate_up", "mlp_gate_up", ng)
                self.tiled("mlp_gate_up", l, sh.ffn_cols, (e_n2, 1), e_gu)
                e_d = self.event(f"L{l}.mlp_down", "mlp_down", no)
                self.tiled("mlp_down", l, cfg.hidden, (e_gu, ng), e_d)
                prev = (e_d, no)
            if tp:
                prev = self.allreduce(l, "allreduce_mlp", prev)
        e_f = self.event("final_norm", "rmsnorm", 1)
        self.task("rmsnorm", NONE_U32, (2, 0, 0, 0), 0, cfg.hidden, prev, e_f)
        nl = cfg.vocab // T
        e_lm = self.event("lm_head", "lm_head", nl)
        self.tiled("lm_head", NONE_U32, cfg.vocab, (e_f, 1), e_lm)
        self.step_event = self.event("step_done", "argmax", 1)
        self.task("argmax", NONE_U32, (0, 0, 0, 0), 0, cfg.vocab, (e_lm, nl), self.step_event)


    def build_fused(self) -> None:
        """Single-rank dense lowering with fuse_norm (and split_k); module doc, "Fused
        norm and split-K"."""
        cfg, B, T, S = self.cfg, self.batch, self.cfg.tile_n, self.cfg.split_k
        group = cfg.n_heads // cfg.n_kv_heads
        no = cfg.hidden // T
        e = self.event("L0.attn_norm", "rmsnorm", 1)
        self.task("rmsnorm", 0, (0, 0, 0, 0), 0, cfg.hidden, (-1, 0), e)   # embedding (+ norm)
        prev: Tuple[int, int] = (e, 1)
        Tq = cfg.qkv_tile_n or T      # narrower qkv tiles: more of the SMs stream W_qkv
        G, hd = cfg.n_kv_heads, cfg.head_dim
        # head_events: one event per kv group (qkv -> rope / attn) and per K-slice
        # (attn -> attn_o) instead of one per level (module doc)
        ng_ev = G if cfg.head_events else 1           # qkv / rope events per layer
        ns_ev = S if cfg.head_events else 1           # attn events per layer
        ng = cfg.ffn // T
        ks_ev = S if cfg.slice_events else 1          # gate_up events per layer (slice_events)

        def qkv_group(c0: int) -> int:
            """the kv group whose q, k or v columns qkv column c0 is in"""
            if c0 < cfg.q_dim:
                return c0 // (group * hd)
            return (c0 - cfg.q_dim) // hd % G

        for l in range(cfg.n_layers):
            nq = cfg.qkv_dim // Tq
            e_qkv = [self.event(f"L{l}.qkv" + (f".g{g}" if ng_ev > 1 else ""), "qkv", nq // ng_ev)
                     for g in range(ng_ev)]
            self.tiled("qkv", l, cfg.qkv_dim, prev, lambda c0: e_qkv[qkv_group(c0) % ng_ev], Tq)
            if cfg.rope_in_attn:          # each attn task ropes its own q / k (fused_aux flags it)
                attn_wait = [(e_qkv[h % ng_ev], nq // ng_ev) for h in range(G)]
            else:
                e_rope = [self.event(f"L{l}.rope" + (f".g{g}" if ng_ev > 1 else ""), "rope_kv_append", G // ng_ev)
                          for g in range(ng_ev)]
                for h in range(G):
                    self.task("rope_kv_append", l, (0, h, 0, 0), h, h + 1, (e_qkv[h % ng_ev], nq // ng_ev),
                              e_rope[h % ng_ev])
                attn_wait = [(e_rope[h % ng_ev], G // ng_ev) for h in range(G)]
            e_attn = [self.event(f"L{l}.attn" + (f".s{k}" if ns_ev > 1 else ""), "attn", G // ns_ev * B)
                      for k in range(ns_ev)]
            for h in range(G):
                for s in range(B):
                    self.task("attn", l, (0, h, s, 0), h * group, (h + 1) * group, attn_wait[h],
                              e_attn[h // (G // ns_ev)], slot=s)
            e_o = self.event(f"L{l}.attn_o", "attn_o", no * S)
            # K-slice k waits for the attn tasks of its heads only
            self.split_tiled("attn_o", l, cfg.hidden, lambda k: (e_attn[k % ns_ev], G // ns_ev * B), e_o)
            # gate_up -> down is one event unless slice_events: down's K-slice 0 commits the
            # residual into h, which gate_up tiles of the other slices still read (their
            # fused norm) -- with slice_events it commits into the other parity's h (module doc)
            e_gu = [self.event(f"L{l}.gate_up" + (f".s{k}" if ks_ev > 1 else ""), "mlp_gate_up", ng // ks_ev)
                    for k in range(ks_ev)]
            self.tiled("mlp_gate_up", l, cfg.ffn, (e_o, no * S), lambda c0: e_gu[c0 * ks_ev // cfg.ffn])
            e_d = self.event(f"L{l}.mlp_down", "mlp_down", no * S)
            self.split_tiled("mlp_down", l, cfg.hidden, lambda k: (e_gu[k % ks_ev], ng // ks_ev), e_d)
            prev = (e_d, no * S)
        nl = cfg.vocab // T
        e_lm = self.event("lm_head", "lm_head", nl)
        self.tiled("lm_head", NONE_U32, cfg.vocab, prev, e_lm)
        self.step_event = self.event("step_done", "argmax", 1)
        self.task("argmax", NONE_U32, (0, 0, 0, 0), 0, cfg.vocab, (e_lm, nl), self.step_event)

    def split_tiled(self, cls: str, layer: int, n: int, wait, signal: int) -> None:
        """n / T output tiles x split_k K-slices: tile (x, 0, 0, s), split-major per tile;
        wait: an (event, count), or a function of the K-slice s giving it (head_events)."""
        T, S = self.cfg.tile_n, self.cfg.split_k
        for x in range(n // T):
            for s in range(S):
                self.task(cls, layer, (x, 0, 0, s), x * T, (x + 1) * T, wait(s) if callable(wait) else wait, signal)


def fused_lowering(cfg: ModelConfig, ranks: int = 1) -> bool:
    """True when build_graph uses the fused-norm lowering (single rank, cfg.fuse_norm).
    Tensor-parallel graphs (ranks > 1) keep the Megatron lowering: the options apply to
    single-rank graphs only (module doc)."""
    return cfg.fuse_norm and ranks == 1


def fused_aux(g: "TaskGraph") -> Dict[int, Tuple[int, int]]:
    """Task records' aux words (kernel task record words 12, 13) of the fused lowering,
    by task index: qkv / mlp_gate_up / lm_head: (norm kind 0 / 1 / 2, split_k);
    attn_o / mlp_down when split_k > 1: (split_k, -1); attn with cfg.rope_in_attn: (1, -1)
    (rope its q / k, append its cache row, then attend).  Empty for other graphs."""
    cfg = g.cfg
    if not fused_lowering(cfg, g.ranks):
        return {}
    S = cfg.split_k
    kinds = {CLASS_IDS["qkv"]: 0, CLASS_IDS["mlp_gate_up"]: 1, CLASS_IDS["lm_head"]: 2}
    split = {CLASS_IDS["attn_o"], CLASS_IDS["mlp_down"]}
    out: Dict[int, Tuple[int, int]] = {}
    for t in g.tasks:
        if t.cls in kinds:
            out[t.index] = (kinds[t.cls], S)
        elif t.cls in split and S > 1:
            out[t.index] = (S, -1)
        elif t.cls == CLASS_IDS["attn"] and cfg.rope_in_attn:
            out[t.index] = (1, -1)
    return out


def split_part_floats(cfg: ModelConfig, batch: int) -> int:
    """Floats of the split-K partial buffer (3 sets x split_k x batch x hidden: mlp_down
    of even / odd layers, attn_o); 0 without split-K."""
    if not cfg.fuse_norm or cfg.split_k <= 1:
        return 0
    return 3 * cfg.split_k * batch * cfg.hidden


@dataclass(frozen=True)
class TPShard:
    """What rank r of R computes (module doc, "Tensor parallelism")."""
    q_lo: int
    q_hi: int              # q heads [q_lo, q_hi)
    kv_lo: int
    kv_hi: int             # kv heads [kv_lo, kv_hi)
    qkv_cols: int          # columns of the rank's q|k|v shard
    ffn_cols: int          # dense MLP columns of the rank
    expert_ffn_cols: int   # columns of each expert's ffn on the rank


def tp_shard(cfg: ModelConfig, rank: int, ranks: int) -> TPShard:
    """Rank `rank`'s shard of `cfg` split `ranks` ways; UserError when it does not split."""
    R, T = ranks, cfg.tile_n
    if R < 1:
        raise UserError(f"ranks: expected >= 1, got {R}")
    if not 0 <= rank < R:
        raise UserError(f"rank: expected 0..{R - 1}, got {rank}")
    if R > 0xFFFF:
        raise UserError(f"ranks: expected at most 65535, got {R}")

    def bad(what: str) -> UserError:
        return UserError(f"ranks: model {cfg.name!r} cannot be split over {R} ranks: {what}")

    if cfg.n_heads % R:
        raise bad(f"n_heads={cfg.n_heads} is not a multiple of {R}")
    hq = cfg.n_heads // R
    if cfg.n_kv_heads % R == 0:
        hkv = cfg.n_kv_heads // R
        kv_lo = rank * hkv
    elif R % cfg.n_kv_heads == 0:
        hkv = 1
        kv_lo = rank // (R // cfg.n_kv_heads)
    else:
        raise bad(f"n_kv_heads={cfg.n_kv_heads} must be a multiple of the ranks (kv heads split) or "
                  f"divide them (kv heads replicated)")
    qkv = (hq + 2 * hkv) * cfg.head_dim
    if qkv % T:
        raise bad(f"the rank's q|k|v shard, {qkv} columns, is not a multiple of tile_n={T}")
    if any(not cfg.is_moe(l) for l in range(cfg.n_layers)) and (cfg.ffn // T) % R:
        raise bad(f"ffn={cfg.ffn} is not {R} x a multiple of tile_n={T}")
    if cfg.moe_layers and (cfg.expert_ffn // T) % R:
        raise bad(f"expert_ffn={cfg.expert_ffn} is not {R} x a multiple of tile_n={T}")
    return TPShard(rank * hq, (rank + 1) * hq, kv_lo, kv_lo + hkv, qkv, cfg.ffn // R,
                   cfg.expert_ffn // R)


def _plan(tasks: List[Task], events: List[EventDef], moe: List[MoELayer], cfg: ModelConfig,
          batch: int, num_workers: int, costs: Optional["ModelCosts"] = None,
          own_recv: Optional[Dict[int, int]] = None, ranks: int = 1) -> List[List[int]]:
    """Deterministic list scheduling by estimated cost (see module doc).  A comm task's
    signal counts toward its own rank's receive event of the op at end + comm_ns (the
    ranks run the same schedule, so the peers' signals are estimated to arrive then)."""
    from .cost import lowered_costs, model_costs
    costs = lowered_costs(costs or model_costs(cfg, ranks=ranks), cfg, ranks)
    own_recv = own_recv or {}
    fixed, per_row = costs.by_class_id()
    kv_est = cfg.max_seq // 2
    moe_by_router = {m.router_task: m for m in moe}
    done = [0.0] * len(events)          # estimated completion of each event
    plans: List[List[int]] = [[] for _ in range(num_workers)]
    free = [(0.0, w) for w in range(num_workers)]   # heap of (free time, worker)
    for t in tasks:
        if t.dynamic:
            continue
        rows = kv_est if t.cls == CLASS_IDS["attn"] else batch
        c = fixed[t.cls] + per_row[t.cls] * rows + costs.dispatch_ns
        ready = done[t.wait_event] + costs.notify_ns if t.wait_event >= 0 else 0.0
        f, w = heapq.heappop(free)
        if f < ready:
            # every worker free before `ready` starts at `ready`: keep the one that
            # became free first (already popped); deterministic
            start = ready
        else:
            start = f
        end = start + c
        heapq.heappush(free, (end, w))
        plans[w].append(t.index)
        if t.signal_event in own_recv:
            e = own_recv[t.signal_event]
            done[e] = max(done[e], end + costs.comm_ns - costs.notify_ns)
        else:
            done[t.signal_event] = max(done[t.signal_event], end)
        m = moe_by_router.get(t.index)
        if m is not None:   # expected expert work spread over all workers
            per_tile = fixed[CLASS_IDS["moe_expert"]] + per_row[CLASS_IDS["moe_expert"]] * (
                batch * cfg.top_k / cfg.n_experts) + costs.dispatch_ns
            active = min(cfg.n_experts, batch * cfg.top_k)
            waves = -(-(active * m.expert_tiles) // num_workers)
            done[m.expert_event] = end + costs.notify_ns + waves * per_tile
    return plans


def build_graph(cfg: ModelConfig, batch: int, num_workers: int, rank: int = 0, ranks: int = 1,
                costs: Optional["ModelCosts"] = None) -> TaskGraph:
    """Lower one decode step of `cfg` for `batch` request slots onto `num_workers` workers;
    with ranks > 1, rank `rank`'s tensor-parallel share (module doc).  `costs` (default:
    the shipped cost table) only steers the static plans."""
    if batch < 1 or batch > 0xFFFF:
        raise UserError(f"--batch: expected 1..65535, got {batch}")
    if num_workers < 1:
        raise UserError(f"num_workers: expected >= 1, got {num_workers}")
    tp_shard(cfg, rank, ranks)          # validates the split
    if fused_lowering(cfg, ranks):
        for f in ("ffn", "q_dim"):
            if getattr(cfg, f) % (8 * cfg.split_k):
                raise UserError(f"model {cfg.name!r}: split_k: {f}={getattr(cfg, f)} is not a multiple of "
                                f"8 x split_k={cfg.split_k}")
    b = _Builder(cfg, batch, rank, ranks)
    b.build()
    plans = _plan(b.tasks, b.events, b.moe, cfg, batch, num_workers, costs, b.own_recv, ranks)
    schema = S.TaskSchema(
        model=cfg.name, task_classes=S.standard_classes(),
        events=[S.Event(e.id, e.name, e.producer_class, e.triggers, e.owner_rank) for e in b.events],
        comm_ops=[S.CommOp(i, n) for i, n in enumerate(S.STANDARD_COMM_OPS)],
        layers=[S.Layer(l, "moe" if cfg.is_moe(l) else "dense") for l in range(cfg.n_layers)])
    return TaskGraph(cfg, batch, num_workers, b.tasks, b.events, plans, schema, b.step_event, b.moe,
                     rank, ranks)
