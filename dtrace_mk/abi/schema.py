"""Task schema: the versioned JSON side table that gives names to the ids in contexts.

The graph builder emits it (task classes with their source op, device function, region
class and dependency class; events; comm ops; layers); the language resolves
`task.class == "attn"` through it at compile time; the loader checks that an object
compiled against one schema is attached to a kernel running the same one (by hash).

File format (`schema_version` 1):

    {"schema_version": 1, "abi_version": 1, "model": "tiny",
     "task_classes": [{"id": 0, "name": "rmsnorm", "source_op": "RMSNorm",
                       "device_function": "task_rmsnorm", "region_class": "dense",
                       "dependency_class": "local"}, ...],
     "events":   [{"id": 0, "name": "L0.rmsnorm_attn", "producer_class": "rmsnorm",
                   "triggers": 1, "owner_rank": 0}, ...],
     "comm_ops": [{"id": 0, "name": "allreduce_attn"}, ...],
     "layers":   [{"index": 0, "kind": "dense"}, ...],
     "hash": "sha256:<hex of the canonical JSON of everything but 'hash'>"}

Ids are dense and in order (id == position), so an id indexes straight into a table.
"""
from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import UserError
from .definition import ABI_VERSION

SCHEMA_VERSION = 1

# Standard task classes with fixed ids, so queries and scenario files are portable
# between models.  A graph builder may append classes; it never renames or renumbers.
STANDARD_TASK_CLASSES: Tuple[Tuple[str, str, str, str, str], ...] = (
    # name,            source op,         device function,        region,  dependency
    ("rmsnorm",        "RMSNorm",         "task_rmsnorm",         "dense", "local"),
    ("qkv",            "QKVProj",         "task_qkv",             "dense", "local"),
    ("rope_kv_append", "RoPE+KVAppend",   "task_rope_kv_append",  "dense", "local"),
    ("attn",           "Attention",       "task_attn",            "dense", "local"),
    ("attn_o",         "OProj",           "task_attn_o",          "dense", "local"),
    ("mlp_gate_up",    "MLPGateUp",       "task_mlp_gate_up",     "dense", "local"),
    ("mlp_down",       "MLPDown",         "task_mlp_down",        "dense", "local"),
    ("moe_router",     "MoERouter",       "task_moe_router",      "moe",   "local"),
    ("moe_expert",     "MoEExpert",       "task_moe_expert",      "moe",   "dynamic"),
    ("lm_head",        "LMHead",          "task_lm_head",         "head",  "local"),
    ("argmax",         "Argmax",          "task_argmax",          "head",  "local"),
    ("allreduce",      "AllReduceTile",   "task_allreduce",       "comm",  "remote"),
)
STANDARD_COMM_OPS: Tuple[str, ...] = ("allreduce_attn", "allreduce_mlp")

REGION_CLASSES = ("dense", "moe", "head", "comm")
DEPENDENCY_CLASSES = ("local", "dynamic", "remote")
LAYER_KINDS = ("dense", "moe")


class SchemaError(UserError):
    """A bad or mismatched schema; the message names the field and the expected value."""


@dataclass(frozen=True)
class TaskClass:
    id: int
    name: str
    source_op: str
    device_function: str
    region_class: str
    dependency_class: str


@dataclass(frozen=True)
class Event:
    id: int
    name: str
    producer_class: str
    triggers: int
    owner_rank: int = 0


@dataclass(frozen=True)
class CommOp:
    id: int
    name: str


@dataclass(frozen=True)
class Layer:
    index: int
    kind: str


@dataclass
class TaskSchema:
    model: str
    task_classes: List[TaskClass]
    events: List[Event] = field(default_factory=list)
    comm_ops: List[CommOp] = field(default_factory=list)
    layers: List[Layer] = field(default_factory=list)
    abi_version: int = ABI_VERSION
    schema_version: int = SCHEMA_VERSION
    source: str = "<memory>"

    # --- lookups -------------------------------------------------------------------
    def class_id(self, name: str) -> int:
        for c in self.task_classes:
            if c.name == name:
                return c.id
        raise KeyError(name)

    def class_name(self, cid: int) -> str:
        return self.task_classes[cid].name if 0 <= cid < len(self.task_classes) else f"class#{cid}"

    def comm_op_id(self, name: str) -> int:
        for c in self.comm_ops:
            if c.name == name:
                return c.id
        raise KeyError(name)

    def comm_op_name(self, oid: int) -> str:
        return self.comm_ops[oid].name if 0 <= oid < len(self.comm_ops) else f"comm_op#{oid}"

    def event_id(self, name: str) -> int:
        for e in self.events:
            if e.name == name:
                return e.id
        raise KeyError(name)

    def names(self, kind: str) -> List[str]:
        table = {"task_class": self.task_classes, "comm_op": self.comm_ops, "event": self.events}[kind]
        return [x.name for x in table]

    def near_matches(self, kind: str, name: str, n: int = 3) -> List[str]:
        """Closest names of a kind ("task_class", "comm_op", "event") for error messages."""
        return difflib.get_close_matches(name, self.names(kind), n=n, cutoff=0.5)

    # --- serialisation ---------------------------------------------------------------
    def body(self) -> Dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "abi_version": self.abi_version,
            "model": self.model,
            "task_classes": [vars(c).copy() for c in self.task_classes],
            "events": [vars(e).copy() for e in self.events],
            "comm_ops": [vars(c).copy() for c in self.comm_ops],
            "layers": [vars(l).copy() for l in self.layers],
        }

    @property
    def hash(self) -> str:
        return compute_hash(self.body())

    def to_dict(self) -> Dict[str, Any]:
        d = self.body()
        d["hash"] = compute_hash(d)
        return d

    def dump(self, path: Union[str, Path]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, d: Any, source: str = "<memory>") -> "TaskSchema":
        return _parse(d, source)


def compute_hash(body: Dict[str, Any]) -> str:
    body = {k: v for k, v in body.items() if k != "hash"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canon).hexdigest()


def standard_classes() -> List[TaskClass]:
    return [TaskClass(i, *row) for i, row in enumerate(STANDARD_TASK_CLASSES)]


def default_schema(model: str = "default", n_layers: int = 0, moe_layers: Sequence[int] = ()) -> TaskSchema:
    """The standard classes and comm ops without model-specific events: enough to
    compile queries that name task classes when no schema file is given."""
    return TaskSchema(model=model, task_classes=standard_classes(),
                      comm_ops=[CommOp(i, n) for i, n in enumerate(STANDARD_COMM_OPS)],
                      layers=[Layer(i, "moe" if i in moe_layers else "dense") for i in range(n_layers)])


def load_schema(path: Union[str, Path], expect_hash: Optional[str] = None) -> TaskSchema:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SchemaError(f"{p}: cannot read task schema: {e.strerror}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{p}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    s = _parse(d, str(p))
    if expect_hash is not None and s.hash != expect_hash:
        raise SchemaError(f"{p}: hash: expected {expect_hash} (the schema the object was "
                          f"compiled against), got {s.hash}")
    return s


# --- validation ----------------------------------------------------------------------

def _parse(d: Any, src: str) -> TaskSchema:
    def fail(where: str, msg: str) -> SchemaError:
        return SchemaError(f"{src}: {where}: {msg}")

    if not isinstance(d, dict):
        raise fail("top level", f"expected an object, got {type(d).__name__}")

    def get(obj: Dict[str, Any], key: str, typ, where: str):
        if key not in obj:
            raise fail(f"{where}{key}" if where else key, "missing")
        v = obj[key]
        if typ is int and (not isinstance(v, int) or isinstance(v, bool)):
            raise fail(f"{where}{key}", f"expected an integer, got {json.dumps(v)}")
        if typ is str and not isinstance(v, str):
            raise fail(f"{where}{key}", f"expected a string, got {json.dumps(v)}")
        if typ is list and not isinstance(v, list):
            raise fail(f"{where}{key}", f"expected a list, got {json.dumps(v)[:40]}")
        return v

    sv = get(d, "schema_version", int, "")
    if sv != SCHEMA_VERSION:
        raise fail("schema_version", f"expected {SCHEMA_VERSION}, got {sv}")
    av = get(d, "abi_version", int, "")
    if av != ABI_VERSION:
        raise fail("abi_version", f"expected {ABI_VERSION} (this dtrace_mk's hook ABI), got {av}")
    model = get(d, "model", str, "")
    known = {"schema_version", "abi_version", "model", "task_classes", "events", "comm_ops", "layers", "hash"}
    for k in d:
        if k not in known:
            raise fail(k, f"unknown field (expected one of {', '.join(sorted(known))})")

    def table(key: str, cls, spec: Dict[str, Any], id_key: str = "id", required: bool = True):
        rows = get(d, key, list, "") if required or key in d else []
        out, seen = [], set()
        for i, row in enumerate(rows):
            where = f"{key}[{i}]."
            if not isinstance(row, dict):
                raise fail(f"{key}[{i}]", "expected an object")
            for k in row:
                if k not in spec:
                    raise fail(f"{where}{k}", f"unknown field (expected one of {', '.join(spec)})")
            vals = {}
            for k, (typ, choices) in spec.items():
                if typ is int and k in ("owner_rank",) and k not in row:
                    vals[k] = 0
                    continue
                v = get(row, k, typ, where)
                if choices and v not in choices:
                    raise fail(f"{where}{k}", f"expected one of {', '.join(choices)}, got {json.dumps(v)}")
                vals[k] = v
            if vals[id_key] != i:
                raise fail(f"{where}{id_key}", f"expected {i} (ids are dense and in order), got {vals[id_key]}")
            if "name" in vals:
                if vals["name"] in seen:
                    raise fail(f"{where}name", f"duplicate name {json.dumps(vals['name'])}")
                seen.add(vals["name"])
            out.append(cls(**vals))
        return out

    classes = table("task_classes", TaskClass, {
        "id": (int, None), "name": (str, None), "source_op": (str, None), "device_function": (str, None),
        "region_class": (str, REGION_CLASSES), "dependency_class": (str, DEPENDENCY_CLASSES)})
    for i, (name, *_rest) in enumerate(STANDARD_TASK_CLASSES):
        if i < len(classes) and classes[i].name != name:
            raise fail(f"task_classes[{i}].name", f"expected {json.dumps(name)} (standard class ids are "
                       f"fixed), got {json.dumps(classes[i].name)}")
    class_names = {c.name for c in classes}
    events = table("events", Event, {"id": (int, None), "name": (str, None), "producer_class": (str, None),
                                     "triggers": (int, None), "owner_rank": (int, None)}, required=False)
    for i, e in enumerate(events):
        if e.producer_class not in class_names:
            raise fail(f"events[{i}].producer_class", f"expected a task class name, got {json.dumps(e.producer_class)}")
        if e.triggers < 1:
            raise fail(f"events[{i}].triggers", f"expected >= 1, got {e.triggers}")
    comm = table("comm_ops", CommOp, {"id": (int, None), "name": (str, None)}, required=False)
    layers = table("layers", Layer, {"index": (int, None), "kind": (str, LAYER_KINDS)}, id_key="index",
                   required=False)
    s = TaskSchema(model=model, task_classes=classes, events=events, comm_ops=comm, layers=layers,
                   abi_version=av, schema_version=sv, source=src)
    if "hash" in d:
        h = d["hash"]
        if h != s.hash:
            raise fail("hash", f"expected {s.hash} (hash of the content), got {json.dumps(h)}; "
                       "the file was edited after it was written")
    return s
