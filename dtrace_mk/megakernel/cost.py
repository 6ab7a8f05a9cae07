"""Timing model of the sim backend (and the cost estimate the graph builder plans with).

A task of class c costs

    ns = fixed_ns[c] + per_row_ns[c] * rows

where `rows` is what the task's work scales with: the batch for dense tasks, the KV
length of its request slot for `attn`, the number of tokens routed to its expert for
`moe_expert`, the batch for `allreduce` (one comm tile of every slot).  Besides task
bodies the model has five global costs:

    notify_ns        an event signal becomes visible to waiting workers this long after
                     the producing task's end (memory fence + flag propagation)
    dispatch_ns      from task:dispatch to task:begin (dequeue, argument decode)
    step_overhead_ns between a step's last event and the next step's first task
                     (request bookkeeping, refill of finished slots)
    filler_ns        one phantom queue entry of a queue_saturation fault
    comm_ns          a signal to another rank's event lands this long after the comm
                     task issued it (one-way flag latency; ~2.5 us measured over NVLink
                     between two H200s); also the lookahead of the multi-rank sim

The numbers live in `data/cost_table.json`, per preset and class:

    {"source": "estimate" | "measured", "card": ..., "date": ..., "commit": ...,
     "defaults": {"notify_ns": .., "dispatch_ns": .., "step_overhead_ns": .., "filler_ns": ..},
     "presets": {"tiny": {"classes": {"qkv": {"fixed_ns": .., "per_row_ns": ..}, ...},
                          "notify_ns": ..  (optional per-preset override of a default),
                          "lowerings": {"fuse_norm+split_k4+rope_in_attn": {"classes": ..., ...}},
                          "gpu_step_us": {"1": ..}  (the GPU's step at that batch, same run)}, ...}}

A preset's entry describes its standard lowering (or the one its "lowering" names); an
entry under "lowerings" is the same preset measured as built with that lowering
(`lowering_name`) and is used as is for graphs of that lowering; without one, the rule of
`lowered_costs` derives the fused lowering's costs from the standard entry.  The shipped
file holds GPU measurements (`bench/megakernel.py --costs`, then `--from-json ...
--write-cost-table`; card, date and commit in the file); a model absent from it gets
`estimate_costs`, a bandwidth/FMA model of one H200 SM.

The planner (graph._plan) reads the same table, yet the plans of every graph the builder
makes do not depend on the class costs: each level's tasks are one class waiting on one
event, so list scheduling hands them out in an order set by the graph's shape alone
(tests/megakernel/test_cost_table.py checks it with random costs).  Re-measuring the
table therefore changes the sim's timing and no GPU plan.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from ..abi.schema import STANDARD_TASK_CLASSES
from ..errors import UserError
from .presets import PRESETS, ModelConfig

COST_TABLE_PATH = Path(__file__).with_name("data") / "cost_table.json"
CLASS_NAMES: Tuple[str, ...] = tuple(row[0] for row in STANDARD_TASK_CLASSES)

DEFAULTS = {"notify_ns": 700, "dispatch_ns": 200, "step_overhead_ns": 3000, "filler_ns": 1000,
            "comm_ns": 2500}

# H200 model for the estimate: HBM bandwidth shared by 132 SMs (~4.8 TB/s), fp32 FMA
# issue rate of one SM (128 lanes at ~1.9 GHz), bf16 weights.
_BYTES_PER_NS_PER_SM = 36.0
_FMA_PER_NS_PER_SM = 243.0
_NVLINK_BYTES_PER_NS_PER_SM = 3.4


@dataclass(frozen=True)
class ClassCost:
    fixed_ns: float
    per_row_ns: float

    def ns(self, rows: int) -> int:
        return int(self.fixed_ns + self.per_row_ns * rows)


@dataclass
class ModelCosts:
    """Costs of one model: `classes[class_name]` plus the global latencies."""
    model: str
    classes: Dict[str, ClassCost]
    notify_ns: int = DEFAULTS["notify_ns"]
    dispatch_ns: int = DEFAULTS["dispatch_ns"]
    step_overhead_ns: int = DEFAULTS["step_overhead_ns"]
    filler_ns: int = DEFAULTS["filler_ns"]
    comm_ns: int = DEFAULTS["comm_ns"]
    source: str = "estimate"
    lowering: str = "standard"   # the graph lowering the class costs describe (lowering_name)
    measured: str = ""           # when, on which tree and card (the table entry's "measured")
    mapped_from: str = ""        # the lowering whose costs lowered_costs' rule mapped to this one

    def provenance(self) -> str:
        """One line for users: where these numbers come from."""
        if self.source != "measured":
            return "estimate (no GPU measurement for this model)"
        out = "measured" + (f" ({self.measured})" if self.measured else "")
        if self.mapped_from:
            out += f"; {self.mapped_from} lowering's costs mapped to {self.lowering} by rule"
        return out

    def by_class_id(self) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
        """(fixed_ns, per_row_ns) indexed by standard class id (0 for unknown classes)."""
        fx = tuple(self.classes[n].fixed_ns if n in self.classes else 0.0 for n in CLASS_NAMES)
        pr = tuple(self.classes[n].per_row_ns if n in self.classes else 0.0 for n in CLASS_NAMES)
        return fx, pr


def estimate_costs(cfg: ModelConfig) -> ModelCosts:
    """Analytic estimate for one H200 SM: weight bytes / per-SM bandwidth + FMAs / rate."""
    bw, fma, t, h = _BYTES_PER_NS_PER_SM, _FMA_PER_NS_PER_SM, cfg.tile_n, cfg.hidden
    group = cfg.n_heads // cfg.n_kv_heads

    def mm(k: int, n: int, mats: int = 1, fixed: float = 1200.0) -> ClassCost:
        return ClassCost(fixed + mats * k * n * 2 / bw, mats * k * n / fma)

    c = {
        "rmsnorm": ClassCost(900.0, h * 8 / bw + h * 3 / fma * 4),
        "qkv": mm(h, t),
        "rope_kv_append": ClassCost(800.0, (group + 2) * cfg.head_dim * 12 / fma * 4),
        # per KV-cache row: K and V (fp32) of one kv head, group q-heads of FMAs each
        "attn": ClassCost(1500.0, 2 * cfg.head_dim * 4 / bw + 2 * group * cfg.head_dim / fma),
        "attn_o": mm(cfg.q_dim, t),
        "mlp_gate_up": mm(h, t, mats=2),
        "mlp_down": mm(cfg.ffn, t),
        "lm_head": mm(h, t),
        "argmax": ClassCost(1000.0, (cfg.vocab // t) * 4.0),
        # one comm tile (comm_tile columns, fp32) stored into a peer over NVLink:
        # ~450 GB/s per GPU shared by 132 SMs
        "allreduce": ClassCost(1000.0, cfg.comm_tile * 4 / _NVLINK_BYTES_PER_NS_PER_SM),
    }
    if cfg.moe_layers:
        c["moe_router"] = mm(h, cfg.n_experts, fixed=1500.0)
        c["moe_expert"] = mm(h, t, mats=3, fixed=1500.0)
    c = {k: ClassCost(round(v.fixed_ns, 1), round(v.per_row_ns, 2)) for k, v in c.items()}
    return ModelCosts(cfg.name, c)


# Cost rule of the fused lowering (graph.py "Fused norm and split-K") applied to class
# costs measured on the standard lowering: a split-K tile streams 1/S of the weights
# (fixed and per-row parts scale by 1/S above a per-task floor); a fused consumer pays
# the norm prologue (its input row(s) from L2, plus the pending partials); with
# rope_in_attn an attn task also does one slot's rope work (rope_kv_append's per-row cost).
SPLIT_FLOOR_NS = 2500.0
PROLOGUE_FIXED_NS = 1200.0
PROLOGUE_PER_ROW_NS = 400.0
PROLOGUE_PER_PARTIAL_ROW_NS = 150.0
ROPE_IN_ATTN_FIXED_NS = 300.0     # rope_in_attn: the attn task's extra CTA barrier + q/k reload


def lowering_name(cfg: ModelConfig, ranks: int = 1) -> str:
    """'standard', or 'fuse_norm' / 'fuse_norm+split_kS' (+ '+rope_in_attn') for graphs
    built with the options."""
    if not cfg.fuse_norm or ranks != 1:
        return "standard"
    name = "fuse_norm" if cfg.split_k <= 1 else f"fuse_norm+split_k{cfg.split_k}"
    return name + "+rope_in_attn" if cfg.rope_in_attn else name


def lowered_costs(costs: ModelCosts, cfg: ModelConfig, ranks: int = 1) -> ModelCosts:
    """`costs` for the graph `build_graph(cfg, ..., ranks=ranks)` builds: unchanged when
    they already describe its lowering; standard-lowering costs are mapped by the rule
    above."""
    want = lowering_name(cfg, ranks)
    if want == costs.lowering or want == "standard" or costs.lowering != "standard":
        return costs
    S = cfg.split_k
    c = dict(costs.classes)

    def split(name: str) -> None:
        if name in c and S > 1:
            v = c[name]
            fx = max(SPLIT_FLOOR_NS, SPLIT_FLOOR_NS + (v.fixed_ns - SPLIT_FLOOR_NS) / S)
            c[name] = ClassCost(round(min(fx, v.fixed_ns), 1), round(v.per_row_ns / S, 2))

    def fused(name: str, partial_sets: float) -> None:
        if name in c:
            v = c[name]
            per_row = PROLOGUE_PER_ROW_NS + (PROLOGUE_PER_PARTIAL_ROW_NS * partial_sets * S if S > 1 else 0.0)
            c[name] = ClassCost(round(v.fixed_ns + PROLOGUE_FIXED_NS, 1), round(v.per_row_ns + per_row, 2))

    if cfg.rope_in_attn and "rope_kv_append" in c and "attn" in c:
        # each attn task (one slot) does one slot's rope work before its CTA barrier
        r, a = c["rope_kv_append"], c["attn"]
        c["attn"] = ClassCost(round(a.fixed_ns + r.per_row_ns + ROPE_IN_ATTN_FIXED_NS, 1), a.per_row_ns)
    split("attn_o")
    split("mlp_down")
    fused("qkv", 1)
    fused("mlp_gate_up", 2)
    fused("lm_head", 1)
    return replace(costs, classes=c, lowering=want, mapped_from=costs.lowering)


class CostTable:
    """The cost table file: `CostTable.load().for_model(cfg)`."""

    def __init__(self, data: Dict[str, Any], source: str = "<memory>"):
        self.data = data
        self.source = source

    @classmethod
    def load(cls, path: Union[str, Path, None] = None) -> "CostTable":
        p = Path(path) if path is not None else COST_TABLE_PATH
        try:
            d = json.loads(p.read_text())
        except OSError as e:
            raise UserError(f"{p}: cannot read cost table: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
        if not isinstance(d, dict) or not isinstance(d.get("presets", {}), dict):
            raise UserError(f"{p}: presets: expected an object")
        return cls(d, str(p))

    def for_model(self, cfg: ModelConfig, ranks: int = 1) -> ModelCosts:
        """`cfg`'s costs: its lowering's entry when the table has one ("lowerings"), else
        the preset's entry (the lowering it names, standard by default), else the estimate;
        classes an entry leaves out keep the estimate."""
        est = estimate_costs(cfg)
        defaults = dict(DEFAULTS)
        defaults.update({k: v for k, v in self.data.get("defaults", {}).items() if k in DEFAULTS})
        entry = self.data.get("presets", {}).get(cfg.name)
        if entry is None:
            return ModelCosts(cfg.name, est.classes, source="estimate", **defaults)
        where = f"presets.{cfg.name}"
        lowerings = entry.get("lowerings", {})
        if not isinstance(lowerings, dict):
            raise UserError(f"{self.source}: {where}.lowerings: expected an object")
        want = lowering_name(cfg, ranks)
        if want in lowerings:
            entry, where = lowerings[want], f"{where}.lowerings.{want}"
            if not isinstance(entry, dict):
                raise UserError(f"{self.source}: {where}: expected an object")
            entry = {"lowering": want, **entry}
        classes = dict(est.classes)
        for name, row in entry.get("classes", {}).items():
            if name not in CLASS_NAMES:
                raise UserError(f"{self.source}: {where}.classes.{name}: unknown task class "
                                f"(known: {', '.join(CLASS_NAMES)})")
            try:
                classes[name] = ClassCost(float(row["fixed_ns"]), float(row.get("per_row_ns", 0.0)))
            except (KeyError, TypeError, ValueError):
                raise UserError(f"{self.source}: {where}.classes.{name}: expected "
                                f"{{\"fixed_ns\": number, \"per_row_ns\": number}}") from None
        for k in DEFAULTS:
            if k in entry:
                defaults[k] = int(entry[k])
        source = str(entry.get("source", self.data.get("source", "estimate")))
        when = entry.get("measured") or ", ".join(str(self.data[k]) for k in ("card", "date", "commit")
                                                  if self.data.get(k))
        return ModelCosts(cfg.name, classes, source=source, lowering=str(entry.get("lowering", "standard")),
                          measured=str(when) if source == "measured" else "", **defaults)


_cached: Optional[CostTable] = None


def model_costs(cfg: ModelConfig, path: Union[str, Path, None] = None, ranks: int = 1) -> ModelCosts:
    """Costs of `cfg` (as built for `ranks`) from the shipped table (or `path`), falling
    back to the estimate."""
    global _cached
    if path is not None:
        return CostTable.load(path).for_model(cfg, ranks)
    if _cached is None:
        _cached = CostTable.load() if COST_TABLE_PATH.exists() else CostTable({})
    return _cached.for_model(cfg, ranks)


def estimate_table() -> Dict[str, Any]:
    """The content of the shipped estimate file (`python -m dtrace_mk.megakernel.cost`)."""
    return {
        "source": "estimate",
        "note": "ESTIMATE, not a measurement: weight bytes / (4.8 TB/s / 132 SMs) + FMAs / "
                "(128 lanes x 1.9 GHz) per H200 SM, written by dtrace_mk.megakernel.cost."
                "estimate_table(). The GPU owner overwrites this file with measured numbers "
                "(source: measured, card, date, commit).",
        "card": None, "date": None, "commit": None,
        "defaults": dict(DEFAULTS),
        "presets": {name: {"classes": {k: vars(v) for k, v in estimate_costs(cfg).classes.items()}}
                    for name, cfg in PRESETS.items()},
    }


if __name__ == "__main__":
    COST_TABLE_PATH.parent.mkdir(exist_ok=True)
    COST_TABLE_PATH.write_text(json.dumps(estimate_table(), indent=1) + "\n")
    print(f"wrote {COST_TABLE_PATH}")
