"""Fault table: faults are data, the same table on the sim and the GPU.

A fault file is a JSON or YAML list of specs (or an object `{"faults": [...]}`):

    - {kind: slow_task_class, task_class: attn, layer: 3, extra_us: 20, fraction: 0.5, steps: [2, 3, 4, 5]}
    - {kind: routing_skew, expert: 3, share: 0.8}
    - {kind: late_notification, task_class: qkv, delay_us: 15}
    - {kind: queue_saturation, worker: 7, extra_tasks: 40, steps: 3}
    - {kind: starve_ready, task_class: mlp_down, delay_us: 30, fraction: 0.25}
    - {kind: late_comm, comm_op: allreduce_attn, layer: 2, delay_us: 50}

Scope keys every kind accepts: `layer` (int; default any), `steps` (a list of steps as in
scenario files, an int k, "lo-hi" inclusive, or "lo-" open; default all; a list becomes one
row per run of consecutive steps), `seed` (int; default 0).  `fraction`
(0..1, default 1) is accepted by the kinds that select tasks (slow_task_class,
late_notification, starve_ready, late_comm).  Unknown kinds or keys raise UserError
naming the spec index and the key.

`FaultTable.to_array()` gives the device layout, int64 [n, 8]:

    kind, task_class, layer, step_lo, step_hi, param_a, param_b, seed

-1 = any class / any layer; step_hi = INT64_MAX when open.  Per kind:

| kind (id)             | task_class col | param_a    | param_b             |
|-----------------------|----------------|------------|---------------------|
| slow_task_class (1)   | class id       | extra ns   | fraction ppm        |
| routing_skew (2)      | -1             | expert     | share ppm           |
| late_notification (3) | producer class | delay ns   | fraction ppm        |
| queue_saturation (4)  | -1             | worker     | extra tasks         |
| starve_ready (5)      | class id       | delay ns   | fraction ppm        |
| late_comm (6)         | comm_op id     | delay ns   | fraction ppm        |

Selection: a row applies to task i at step k iff its class and layer match (or are -1),
step_lo <= k <= step_hi and (fraction kinds) `fault_pick(seed, i, k) < param_b`.
Matching rows add up.  Effects (sim.py and kernels/megakernel.cu):

* slow_task_class   the task's duration grows by extra ns.
* routing_skew      slot s of MoE layer l at step k sends its first choice to `expert`
                    when fault_pick(seed, (l << 16) | s, k) < share ppm (swapping if the
                    expert was already among its top-k).
* late_notification the task's signal lands delay ns after its end; the worker is not
                    held.  For moe_router (sim) the queue pushes are late too.
* queue_saturation  when `worker` reaches its first task of the step (or of `layer`),
                    extra_tasks phantom entries enter its ready queue (queue_depth) and
                    are drained, filler_ns each, before that task's dispatch.
* starve_ready      the worker holds the task delay ns after it first sees it ready (a
                    dynamic task: after its push) before dispatching it.
* late_comm         a matching comm task (class allreduce, its signal event's comm op;
                    layer = the all-reduce's layer) issues its signal to each peer
                    delay ns after its end (comm:signal is that late; the signal to the
                    rank's own slot is not delayed); the worker is not held.  Only
                    tensor-parallel graphs (ranks > 1) have comm tasks.

fault_pick -- identical in Python and CUDA (kernels/mk_common.cuh has splitmix64):

    u64 splitmix64(u64 x) { x += 0x9E3779B97F4A7C15; x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
                            x = (x ^ (x >> 27)) * 0x94D049BB133111EB; return x ^ (x >> 31); }
    u32 fault_pick(u64 seed, u32 idx, u32 step) {
        return splitmix64(splitmix64(seed) ^ ((u64)idx << 32) ^ (u64)step) % 1000000; }

(all arithmetic mod 2^64; `idx` and `step` truncated to 32 bits).  Test vectors:
`data/fault_pick_vectors.json`, `[[seed, idx, step, pick], ...]`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..abi.schema import STANDARD_COMM_OPS, STANDARD_TASK_CLASSES
from ..errors import UserError

M64 = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1
PPM = 1_000_000
VECTORS_PATH = Path(__file__).with_name("data") / "fault_pick_vectors.json"

KINDS: Dict[str, int] = {"slow_task_class": 1, "routing_skew": 2, "late_notification": 3,
                         "queue_saturation": 4, "starve_ready": 5, "late_comm": 6}
KIND_NAMES: Dict[int, str] = {v: k for k, v in KINDS.items()}
SLOW_TASK_CLASS, ROUTING_SKEW, LATE_NOTIFICATION, QUEUE_SATURATION, STARVE_READY, LATE_COMM = range(1, 7)

_SCOPE = ("kind", "layer", "steps", "seed")
# kind -> (required keys, optional keys beyond the scope keys)
_KEYS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "slow_task_class": (("task_class", "extra_us"), ("fraction",)),
    "routing_skew": (("expert", "share"), ()),
    "late_notification": (("task_class", "delay_us"), ("fraction",)),
    "queue_saturation": (("worker", "extra_tasks"), ()),
    "starve_ready": (("task_class", "delay_us"), ("fraction",)),
    "late_comm": (("comm_op", "delay_us"), ("fraction",)),
}
_CLASS_IDS = {row[0]: i for i, row in enumerate(STANDARD_TASK_CLASSES)}
_COMM_IDS = {n: i for i, n in enumerate(STANDARD_COMM_OPS)}


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fault_pick(seed: int, task_index: int, step: int) -> int:
    """Deterministic draw in [0, 1e6) for (seed, task_index, step); see module doc."""
    k = splitmix64(seed & M64) ^ ((task_index & 0xFFFFFFFF) << 32) ^ (step & 0xFFFFFFFF)
    return splitmix64(k) % PPM


def fault_pick_vectors() -> List[List[int]]:
    """The test-vector table (also shipped as data/fault_pick_vectors.json)."""
    seeds = (0, 1, 7, 42, 0xDEADBEEF, (1 << 63) + 12345, M64)
    idxs = (0, 1, 2, 63, 1000, 0xFFFF, 0x10000, 0xFFFFFFFF)
    steps = (0, 1, 5, 1 << 20, 0xFFFFFFFF)
    return [[s, i, k, fault_pick(s, i, k)] for s in seeds for i in idxs for k in steps]


@dataclass(frozen=True)
class FaultRow:
    kind: int
    task_class: int     # or comm_op for late_comm; -1 = any
    layer: int          # -1 = any
    step_lo: int
    step_hi: int
    param_a: int
    param_b: int
    seed: int

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    def in_scope(self, step: int, layer: int, task_class: int = -1) -> bool:
        return (self.step_lo <= step <= self.step_hi and (self.layer < 0 or self.layer == layer)
                and (self.task_class < 0 or self.task_class == task_class))

    def picks(self, task_index: int, step: int) -> bool:
        """Fraction selection (kinds with a fraction in param_b)."""
        return self.param_b >= PPM or fault_pick(self.seed, task_index, step) < self.param_b


class FaultTable:
    def __init__(self, rows: Sequence[FaultRow] = (), source: str = "<memory>"):
        self.rows: List[FaultRow] = list(rows)
        self.source = source

    def __len__(self) -> int:
        return len(self.rows)

    def of_kind(self, kind: int) -> List[FaultRow]:
        return [r for r in self.rows if r.kind == kind]

    def to_array(self) -> np.ndarray:
        a = np.zeros((len(self.rows), 8), dtype=np.int64)
        for i, r in enumerate(self.rows):
            a[i] = (r.kind, r.task_class, r.layer, r.step_lo, r.step_hi, r.param_a, r.param_b,
                    _signed64(r.seed))
        return a

    @classmethod
    def from_array(cls, a: np.ndarray) -> "FaultTable":
        return cls([FaultRow(*(int(v) for v in row[:7]), int(row[7]) & M64) for row in np.asarray(a)])

    @classmethod
    def from_specs(cls, specs: Any, source: str = "faults") -> "FaultTable":
        if isinstance(specs, dict) and set(specs) == {"faults"}:
            specs = specs["faults"]
        if specs is None:
            specs = []
        if not isinstance(specs, list):
            raise UserError(f"{source}: expected a list of fault specs (or {{\"faults\": [...]}}), "
                            f"got {type(specs).__name__}")
        return cls([row for i, s in enumerate(specs) for row in _parse_spec(s, f"{source}[{i}]")], source)

    @classmethod
    def load(cls, path: Union[str, Path]) -> "FaultTable":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise UserError(f"{p}: cannot read fault file: {e.strerror}") from None
        if p.suffix in (".yaml", ".yml"):
            import yaml
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
                raise UserError(f"{p}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise UserError(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
        return cls.from_specs(data, str(p))


def _signed64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v >> 63 else v


def _parse_spec(spec: Any, where: str) -> List[FaultRow]:
    def fail(key: Optional[str], msg: str) -> UserError:
        return UserError(f"{where}{'.' + key if key else ''}: {msg}")

    if not isinstance(spec, dict):
        raise fail(None, f"expected an object with a 'kind', got {json.dumps(spec)[:40]}")
    kind = spec.get("kind")
    if kind is None:
        raise fail("kind", f"missing (one of {', '.join(KINDS)})")
    if kind not in KINDS:
        raise fail("kind", f"unknown fault kind {json.dumps(kind)} (known: {', '.join(KINDS)})")
    required, optional = _KEYS[kind]
    allowed = _SCOPE + required + optional
    for k in spec:
        if k not in allowed:
            raise fail(str(k), f"unknown parameter for {kind} (expected {', '.join(allowed[1:])})")
    for k in required:
        if k not in spec:
            raise fail(k, f"missing (required by {kind})")

    def num(key: str, lo: float, hi: float, integer: bool = False, default=None):
        if key not in spec:
            return default
        v = spec[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise fail(key, f"expected {'an integer' if integer else 'a number'}, got {json.dumps(v)}")
        if not lo <= v <= hi:
            raise fail(key, f"expected {lo}..{hi}, got {v}")
        return v

    def name(key: str, table: Dict[str, int], what: str) -> int:
        v = spec[key]
        if isinstance(v, int) and not isinstance(v, bool):
            if v in table.values():
                return v
            raise fail(key, f"unknown {what} id {v} (known: 0..{len(table) - 1})")
        if not isinstance(v, str) or v not in table:
            raise fail(key, f"unknown {what} {json.dumps(v)} (known: {', '.join(table)})")
        return table[v]

    layer = num("layer", 0, 0xFFFF, integer=True, default=-1)
    seed = num("seed", 0, M64, integer=True, default=0)
    runs = _steps(spec.get("steps"), fail)
    frac_ppm = int(round(num("fraction", 0.0, 1.0, default=1.0) * PPM))
    tc, a, b = -1, 0, PPM
    us = lambda key: int(round(num(key, 0, 1e9) * 1000))  # noqa: E731
    if kind == "slow_task_class":
        tc, a, b = name("task_class", _CLASS_IDS, "task class"), us("extra_us"), frac_ppm
    elif kind == "routing_skew":
        a = num("expert", 0, 0xFFFF, integer=True)
        b = int(round(num("share", 0.0, 1.0) * PPM))
    elif kind == "late_notification":
        tc, a, b = name("task_class", _CLASS_IDS, "task class"), us("delay_us"), frac_ppm
    elif kind == "queue_saturation":
        a = num("worker", 0, 0xFFFF, integer=True)
        b = num("extra_tasks", 0, 1 << 20, integer=True)
    elif kind == "starve_ready":
        tc, a, b = name("task_class", _CLASS_IDS, "task class"), us("delay_us"), frac_ppm
    elif kind == "late_comm":
        tc, a, b = name("comm_op", _COMM_IDS, "comm op"), us("delay_us"), frac_ppm
    return [FaultRow(KINDS[kind], tc, layer, lo, hi, a, b, seed) for lo, hi in runs]


def _steps(v: Any, fail) -> List[Tuple[int, int]]:
    """Inclusive (lo, hi) runs of the steps a fault is active in."""
    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if v is None:
        return [(0, INT64_MAX)]
    if is_int(v):
        lo = hi = v
    elif isinstance(v, list) and v and all(is_int(x) for x in v):
        if any(x < 0 for x in v):
            raise fail("steps", f"expected steps >= 0, got {json.dumps(v)}")
        runs: List[List[int]] = []
        for k in sorted(set(v)):
            if runs and k == runs[-1][1] + 1:
                runs[-1][1] = k
            else:
                runs.append([k, k])
        return [(lo, hi) for lo, hi in runs]
    elif isinstance(v, str) and "-" in v:
        a, _, b = v.partition("-")
        try:
            lo, hi = int(a), (int(b) if b.strip() else INT64_MAX)
        except ValueError:
            raise fail("steps", f"expected \"lo-hi\", got {json.dumps(v)}") from None
    else:
        raise fail("steps", f"expected a list of steps, a step, \"lo-hi\" or \"lo-\", got {json.dumps(v)}")
    if lo < 0 or hi < lo:
        raise fail("steps", f"expected 0 <= lo <= hi, got {lo}..{hi}")
    return [(lo, hi)]


if __name__ == "__main__":
    VECTORS_PATH.parent.mkdir(exist_ok=True)
    VECTORS_PATH.write_text(json.dumps({
        "doc": "fault_pick(seed, idx, step) test vectors: [seed, idx, step, pick]; see "
               "dtrace_mk/megakernel/faults.py",
        "vectors": fault_pick_vectors()}, indent=None) + "\n")
    print(f"wrote {VECTORS_PATH}")
