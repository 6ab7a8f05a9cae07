"""Hook ABI v1: the one source of truth.

Everything that describes the boundary between a megakernel and a monitor lives in
this file: hook points, the context record layout, per-hook field validity, the
language names of fields, program types, helper functions and map types.  The C
header the kernels include (`kernels/dtrace_mk_abi.h`) and the header users include
in C monitors (`dtrace_mk_bpf.h`) are generated from these tables by
`dtrace_mk.abi.cgen`; a test regenerates both and fails on any drift.

Changing anything here that a compiled monitor can observe (an offset, a size, a hook
or helper id) requires bumping `ABI_VERSION`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

ABI_VERSION = 1

# ---------------------------------------------------------------------------------
# Context fields.  One fixed-size, naturally aligned, read-only record for every hook.
# Order is layout order; offsets are computed (and asserted aligned) below.
# ---------------------------------------------------------------------------------

_TYPE_SIZE = {"u16": 2, "u32": 4, "u64": 8}


@dataclass(frozen=True)
class Field:
    name: str            # C / ABI name, e.g. "dur_ns"
    ctype: str           # "u32" | "u64"
    doc: str
    lang: Tuple[str, ...] = ()  # names in the query language, e.g. ("task.dur_ns",)
    offset: int = -1     # filled in by _layout
    size: int = 0

    @property
    def c_type(self) -> str:
        return {"u16": "dtmk_u16", "u32": "dtmk_u32", "u64": "dtmk_u64"}[self.ctype]


_FIELD_SPECS: List[Tuple[str, str, str, Tuple[str, ...]]] = [
    # name,          type,  doc,                                                lang names
    ("abi_version",  "u32", "ABI version of this record (always ABI_VERSION)",  ("abi_version",)),
    ("hook",         "u32", "hook id (HOOK_* below)",                           ("hook",)),
    ("ts_ns",        "u64", "event time, %globaltimer ns (sim: simulated ns)",  ("ts", "ts_ns")),
    ("rank",         "u32", "MPI rank of this megakernel",                      ("rank",)),
    ("sm",           "u32", "SM id the worker runs on",                         ("sm",)),
    ("worker",       "u32", "worker (CTA) index",                               ("worker",)),
    ("task_class",   "u32", "task class id (task schema)",                      ("task.class",)),
    ("task_index",   "u32", "task index within the decode-step graph",          ("task.index",)),
    ("task_gen",     "u32", "task generation (iteration that runs it)",         ("task.gen",)),
    ("tile",         "u64", "packed tile coords: x | y<<16 | z<<32 | w<<48",     ("task.tile",)),
    ("request_slot", "u32", "request slot (continuous batching)",               ("req.slot",)),
    ("request_gen",  "u32", "request generation of that slot",                  ("req.gen",)),
    ("decode_step",  "u32", "decode step (epoch)",                              ("step",)),
    ("layer",        "u32", "model layer (0xffffffff when none)",               ("task.layer", "layer")),
    ("expert",       "u32", "MoE expert (0xffffffff when none)",                ("task.expert", "expert")),
    ("event_id",     "u32", "event waited on (begin/dep) or signalled (end)",   ("event.id", "dep.event")),
    ("event_gen",    "u64", "event counter target / value",                     ("event.gen", "dep.target")),
    ("comm_op",      "u32", "communication op id (task schema)",                ("comm.op",)),
    ("comm_gen",     "u32", "communication generation",                         ("comm.gen",)),
    ("peer_rank",    "u32", "remote rank of a comm signal or wait",             ("comm.peer",)),
    ("queue_depth",  "u32", "ready-queue depth of this worker",                 ("queue.depth",)),
    ("dur_ns",       "u64", "task duration, begin to end",                      ("task.dur_ns",)),
    ("wait_ns",      "u64", "wait time: ready->dispatch, dependency or remote",  ("dep.wait_ns", "comm.wait_ns", "task.wait_ns")),
    ("flags",        "u32", "FLAG_* bits",                                      ("flags",)),
    ("reserved0",    "u32", "reserved, always 0 (not readable)",                ()),
    ("reserved1",    "u64", "reserved, always 0 (not readable)",                ()),
]


def _layout(specs) -> Tuple[Tuple[Field, ...], int]:
    out, off = [], 0
    for name, ctype, doc, lang in specs:
        size = _TYPE_SIZE[ctype]
        assert off % size == 0, f"context field {name} at {off} is not {size}-aligned"
        out.append(Field(name, ctype, doc, lang, off, size))
        off += size
    assert off % 8 == 0
    return tuple(out), off


CONTEXT_FIELDS, CONTEXT_SIZE = _layout(_FIELD_SPECS)
FIELDS_BY_NAME: Dict[str, Field] = {f.name: f for f in CONTEXT_FIELDS}
FIELDS_BY_OFFSET: Dict[int, Field] = {f.offset: f for f in CONTEXT_FIELDS}
assert CONTEXT_SIZE == 128, CONTEXT_SIZE

# Context flags.
FLAG_REMOTE = 1 << 0        # the event is owned by / signalled from a remote rank
FLAG_FAULT = 1 << 1         # a fault-table entry modified this task
FLAG_DYNAMIC = 1 << 2       # task came from the dynamic (MoE) queue, not a static plan
FLAG_TRACE_DROP = 1 << 3    # the built-in full trace dropped records before this one
# The worker's own observer (a device-VM drain on its warp 0) ran while this task's
# dependency was met: task:ready and dep:release carry the moment a second warp saw it met,
# task:dispatch comes after the drain and its wait_ns leaves the drain out, so
# ready.ts + dispatch.wait_ns < dispatch.ts by the monitor's own delay.  Set by the GPU
# build's workers (the drain's poller, the default since session 48; not the observer-SM build,
# whose workers drain nothing; docs/results/hooks.md sessions 47-48), never by the sim.
FLAG_OBS_DELAY = 1 << 4
FLAGS = {"REMOTE": FLAG_REMOTE, "FAULT": FLAG_FAULT, "DYNAMIC": FLAG_DYNAMIC,
         "TRACE_DROP": FLAG_TRACE_DROP, "OBS_DELAY": FLAG_OBS_DELAY}

NONE_U32 = 0xFFFFFFFF       # "no layer / no expert / no peer"

# ---------------------------------------------------------------------------------
# Hook points.  `fields` lists what each hook makes valid beyond COMMON_FIELDS; the
# verifier rejects a context read of any other field.
# ---------------------------------------------------------------------------------

COMMON_FIELDS = ("abi_version", "hook", "ts_ns", "rank", "sm", "worker", "decode_step", "flags")
_TASK = ("task_class", "task_index", "task_gen", "tile", "request_slot", "request_gen",
         "layer", "expert")


@dataclass(frozen=True)
class Hook:
    id: int
    name: str            # "task:end"
    section: str         # ELF section of a C monitor: SEC("task/end")
    doc: str
    fields: Tuple[str, ...]

    @property
    def valid_fields(self) -> Tuple[str, ...]:
        return COMMON_FIELDS + self.fields

    @property
    def c_name(self) -> str:
        return "DTMK_HOOK_" + self.name.replace(":", "_").upper()


HOOKS: Tuple[Hook, ...] = (
    Hook(1, "task:ready", "task/ready",
         "a task's dependency is met and it enters a ready queue",
         _TASK + ("event_id", "event_gen", "queue_depth")),
    Hook(2, "task:dispatch", "task/dispatch",
         "the scheduler hands a ready task to a worker; wait_ns = ready to dispatch "
         "(less the worker's own observer drain: FLAG_OBS_DELAY)",
         _TASK + ("queue_depth", "wait_ns")),
    Hook(3, "task:begin", "task/begin",
         "the task body starts (after its dependency wait); wait_ns = dependency wait",
         _TASK + ("event_id", "event_gen", "wait_ns", "queue_depth")),
    Hook(4, "task:end", "task/end",
         "the task body finished; event_id/event_gen = the event it signals",
         _TASK + ("event_id", "event_gen", "dur_ns", "wait_ns")),
    Hook(5, "dep:wait", "dep/wait",
         "a task starts waiting on an event that has not reached its target",
         _TASK + ("event_id", "event_gen")),
    Hook(6, "dep:release", "dep/release",
         "the awaited event reached its target; wait_ns = time spent waiting",
         _TASK + ("event_id", "event_gen", "wait_ns")),
    Hook(7, "comm:signal", "comm/signal",
         "this rank signals a remote event for (comm_op, comm_gen)",
         _TASK + ("event_id", "event_gen", "comm_op", "comm_gen", "peer_rank")),
    Hook(8, "comm:wait", "comm/wait",
         "a task finished waiting on a remote event; wait_ns = remote wait",
         _TASK + ("event_id", "event_gen", "comm_op", "comm_gen", "peer_rank", "wait_ns")),
    Hook(9, "gen:advance", "gen/advance",
         "a decode step completes for a request slot (request generation moves on refill)",
         ("request_slot", "request_gen")),
    Hook(10, "queue:pressure", "queue/pressure",
         "a worker's ready queue passes the declared threshold",
         ("queue_depth", "task_class", "layer")),
)
HOOKS_BY_NAME: Dict[str, Hook] = {h.name: h for h in HOOKS}
HOOKS_BY_SECTION: Dict[str, Hook] = {h.section: h for h in HOOKS}
HOOKS_BY_ID: Dict[int, Hook] = {h.id: h for h in HOOKS}
MAX_HOOK_ID = max(h.id for h in HOOKS)

for _h in HOOKS:
    for _f in _h.valid_fields:
        assert _f in FIELDS_BY_NAME, (_h.name, _f)

# ---------------------------------------------------------------------------------
# Map types (the semantic model is dtrace_mk.bpf.maps; the device maps must match it).
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapType:
    id: int
    name: str            # "hash"
    c_name: str          # "BPF_MAP_TYPE_HASH"
    doc: str


MAP_TYPES: Tuple[MapType, ...] = (
    MapType(1, "hash", "BPF_MAP_TYPE_HASH",
            "bounded hash, linear probing; update into a full map fails with -E2BIG and is counted lost"),
    MapType(2, "array", "BPF_MAP_TYPE_ARRAY", "array indexed by a u32 key; all entries exist, zeroed"),
    MapType(6, "per_worker_array", "BPF_MAP_TYPE_PERCPU_ARRAY",
            "array with one copy per worker (no cross-SM contention); host sums or lists copies"),
    MapType(27, "ringbuf", "BPF_MAP_TYPE_RINGBUF",
            "per-worker ring buffer of raw evidence records, byte budget per epoch"),
    MapType(100, "hist_log2", "DTMK_MAP_TYPE_HIST_LOG2",
            "hash from key to 64 log2 buckets (bucket i counts values v with 2^(i-1) <= v < 2^i; bucket 0: v == 0)"),
    MapType(101, "hist_linear", "DTMK_MAP_TYPE_HIST_LINEAR",
            "hash from key to linear buckets lin_lo..lin_hi by lin_step, plus underflow and overflow"),
)
MAP_TYPES_BY_ID: Dict[int, MapType] = {m.id: m for m in MAP_TYPES}
MAP_TYPES_BY_NAME: Dict[str, MapType] = {m.name: m for m in MAP_TYPES}

MAX_MAP_ENTRIES = 1 << 20
MAX_KEY_SIZE = 64
MAX_VALUE_SIZE = 4096
HIST_LOG2_BUCKETS = 64
HIST_LINEAR_MAX_BUCKETS = 1024

# ---------------------------------------------------------------------------------
# Helpers.  Argument kinds are what the verifier checks; ret is the return type.
#   map       : R is a map pointer (LD_IMM64 pseudo map reference)
#   key       : pointer to initialised stack memory of the map's key_size
#   value     : pointer to initialised stack memory of the map's value_size
#   mem       : pointer to initialised stack (or map value) memory, size in next arg
#   size      : scalar, constant, 1..512, the size of the preceding mem argument
#   scalar    : any initialised scalar
#   opt_scalar: a scalar that may be left unset (trailing printk arguments); never a pointer
# ret: "scalar", "map_value_or_null", "void"
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helper:
    id: int
    name: str
    args: Tuple[str, ...]
    ret: str
    program_types: Tuple[str, ...]
    doc: str
    c_proto: str          # C prototype fragment for dtrace_mk_bpf.h: "(void *map, const void *key)"
    c_ret: str = "long"


HELPERS: Tuple[Helper, ...] = (
    Helper(1, "map_lookup_elem", ("map", "key"), "map_value_or_null", ("observe", "control"),
           "pointer to the value for key, or NULL", "(void *map, const void *key)", "void *"),
    Helper(2, "map_update_elem", ("map", "key", "value", "scalar"), "scalar", ("observe", "control"),
           "insert or replace; flags: 0 any, 1 noexist, 2 exist; -E2BIG when full (counted lost)",
           "(void *map, const void *key, const void *value, dtmk_u64 flags)"),
    Helper(3, "map_delete_elem", ("map", "key"), "scalar", ("observe", "control"),
           "delete key; -ENOENT when absent", "(void *map, const void *key)"),
    Helper(5, "ktime_get_ns", (), "scalar", ("observe", "control"),
           "current device time in ns (%globaltimer)", "(void)", "dtmk_u64"),
    Helper(6, "trace_printk", ("mem", "size", "opt_scalar", "opt_scalar", "opt_scalar"), "scalar",
           ("observe",), "formatted trace line (budgeted like evidence); up to 3 scalar args",
           "(const char *fmt, dtmk_u32 fmt_size, ...)"),
    Helper(8, "get_worker_id", (), "scalar", ("observe", "control"),
           "current worker index", "(void)", "dtmk_u32"),
    Helper(130, "ringbuf_output", ("map", "mem", "size", "scalar"), "scalar", ("observe",),
           "copy a raw evidence record into the ring buffer within the epoch byte budget; "
           "-ENOSPC (counted throttled) when over budget", "(void *ringbuf, void *data, dtmk_u64 size, dtmk_u64 flags)"),
    Helper(200, "hist_add", ("map", "key", "scalar"), "scalar", ("observe",),
           "add one count for value to the key's histogram (log2 or linear by map type)",
           "(void *map, const void *key, dtmk_u64 value)"),
    Helper(300, "set_priority_hint", ("scalar",), "scalar", ("control",),
           "control programs only: a narrow scheduling priority hint (reserved in v1)",
           "(dtmk_u32 hint)"),
)
HELPERS_BY_ID: Dict[int, Helper] = {h.id: h for h in HELPERS}
HELPERS_BY_NAME: Dict[str, Helper] = {h.name: h for h in HELPERS}

# Errno values helpers return (negated), as in Linux.
ENOENT, E2BIG, ENOSPC, EINVAL, EEXIST = 2, 7, 28, 22, 17

# ---------------------------------------------------------------------------------
# Program types.
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramType:
    name: str
    doc: str
    attachable: bool      # can be attached in ABI v1

    @property
    def helpers(self) -> Tuple[Helper, ...]:
        return tuple(h for h in HELPERS if self.name in h.program_types)


PROGRAM_TYPES: Tuple[ProgramType, ...] = (
    ProgramType("observe", "reads the context, updates its own maps, emits budgeted evidence; "
                "cannot touch scheduler state", True),
    ProgramType("control", "reserved: may only return a narrow priority hint; never attachable "
                "where an observe program is expected", False),
)
PROGRAM_TYPES_BY_NAME: Dict[str, ProgramType] = {p.name: p for p in PROGRAM_TYPES}

# Verifier limits (also exported to the headers).
MAX_INSNS = 4096
STACK_SIZE = 512

# ---------------------------------------------------------------------------------
# Language-name lookup (derived, not a second source).
# ---------------------------------------------------------------------------------

LANG_FIELDS: Dict[str, Field] = {}
for _f in CONTEXT_FIELDS:
    for _alias in _f.lang:
        assert _alias not in LANG_FIELDS, _alias
        LANG_FIELDS[_alias] = _f


def hook(name_or_section: str) -> Hook:
    """Look a hook up by name ("task:end") or section ("task/end")."""
    h = HOOKS_BY_NAME.get(name_or_section) or HOOKS_BY_SECTION.get(name_or_section)
    if h is None:
        raise KeyError(name_or_section)
    return h


def field_valid(hook_: Hook, field_name: str) -> bool:
    return field_name in hook_.valid_fields
