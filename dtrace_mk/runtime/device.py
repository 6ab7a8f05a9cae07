"""Device runtime (hot tier): program tables, pre-decoded bytecode, device maps, coverage.

The host half of kernels/bpf_vm.cuh and kernels/bpf_maps.cuh:

* `encode_program(insns, map_descs, map_values)` pre-decodes verified RFC 9669 slots
  into 16-byte `dtmk_dinsn` records (DINSN_DTYPE): compact op (dtrace_mk.bpf.devicegen),
  lddw folded into one record with its value or resolved device address, jump targets
  as absolute record indices, K operands pre-extended, helpers dispatched by op.
  `decode_program` inverts it (a CI round-trip test).
* Layouts (numpy dtypes) of the device structs: MAP_DTYPE, MAP_STATS_DTYPE,
  RB_WORKER_DTYPE, RB_REC_DTYPE, COV_DTYPE, PROG_DTYPE, HOOK_TABLE_DTYPE.  A CI test
  compiles NVRTC static_asserts generated from these dtypes against the CUDA structs.
* `DeviceRuntime` (needs CuPy and a GPU): the ReferenceRuntime's interface on the
  device.  attach = verify, allocate maps, encode, write the hook's program table under
  its seqlock generation (odd while writing; program_gen = gen / 2).  `fire(records)`
  runs kernels/bpf_vm_harness.cu over an array of context records (serial=True: one
  event at a time, the reference's order).  `maps(aid)` reads the device maps back INTO
  the host model (dtrace_mk.bpf.maps.MapSet), so snapshots compare directly with the
  reference runtime's; `coverage(aid)` returns dtrace_mk.bpf.coverage rows.

Results (H200): docs/results/device_vm.md.  Snapshots while a kernel runs are
runtime/live.py's (sequence numbers over these tables).  Not here: ring buffers that
wrap (a launch's records are read after it; a full ring counts lost), trace_printk on
the device (the VM counts it lost), sampling tickets in reference order across warps
(serial mode has it).
"""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..abi import definition as abi
from ..bpf import isa
from ..bpf.coverage import EXECUTED, LOST, THROTTLED, Coverage
from ..bpf.devicegen import CALL_OP, NAME_OF_OP, OP, OP_OF_OPCODE, OPCODE_OF_OP
from ..bpf.isa import Insn, OPCODES
from ..bpf.maps import MapSet, Record
from ..bpf.program import BpfObject, MapDef, Program
from ..errors import Rejected, UserError

from ..kernels import KERNEL_DIR  # the CUDA sources, installed as package data
from ..kernels import build
from .descform import DESC_DTYPE
from .reference import hooks_changed, rearmed_hooks, replaced_attachment

SOURCES = tuple(build.include_closure("bpf_vm_harness.cu", KERNEL_DIR))   # what the harness cache key hashes

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
NUM_HOOKS = abi.MAX_HOOK_ID + 1
MAX_PROGS = 8
COV_ROWS = 64
RB_EPOCHS = 8
EPOCH_NONE = 0xFFFFFFFF
COV_TAG_EMPTY = M64
SLOT_EMPTY, SLOT_BUSY, SLOT_FULL, SLOT_TOMB = 0, 1, 2, 3
H_WARPS = 4                                   # default warps per harness block
MAX_WARPS = 8                                 # most warps per harness block (registers, shared memory)
REG_BYTES_PER_WARP = 11 * 32 * 8
FLAG_CLOCK_FROM_CTX = 1
OUT_NONE, OUT_EXECUTED, OUT_THROTTLED, OUT_LOST, OUT_FAULT, OUT_SAMPLED = range(6)
OUTCOME_NAMES = {OUT_EXECUTED: EXECUTED, OUT_THROTTLED: THROTTLED, OUT_LOST: LOST, OUT_FAULT: LOST,
                 OUT_SAMPLED: THROTTLED}

# ---------------------------------------------------------------------------------
# Layouts (must match kernels/bpf_opcodes.h and kernels/bpf_maps.cuh)
# ---------------------------------------------------------------------------------

DINSN_DTYPE = np.dtype([("op", "u1"), ("dst", "u1"), ("src", "u1"), ("aux", "u1"), ("off", "<i4"),
                        ("imm", "<u8")])
MAP_DTYPE = np.dtype([(n, "<u4") for n in (
    "type", "key_size", "value_size", "max_entries", "capacity", "cap_mask", "key_stride",
    "value_stride", "n_workers", "n_buckets", "read_only", "pad0", "pad1", "pad2")] +
    [("lin_lo", "<i8"), ("lin_hi", "<i8"), ("lin_step", "<i8"), ("budget_bytes", "<u8"),
     ("values", "<u8"), ("keys", "<u8"), ("slots", "<u8"), ("stats", "<u8"), ("pad3", "<u8")])
MAP_STATS_DTYPE = np.dtype([("count", "<u8"), ("lost", "<u8"), ("throttled", "<u8"),
                            ("probe_exhausted", "<u8"), ("pad0", "<u8"), ("pad1", "<u8")])
RB_WORKER_DTYPE = np.dtype([("held", "<u8"), ("nrec", "<u8"), ("ep_tag", "<u4", (RB_EPOCHS,)),
                            ("ep_used", "<u8", (RB_EPOCHS,)), ("slot_busy", "<u8")])
RB_REC_DTYPE = np.dtype([("off", "<u4"), ("len", "<u4"), ("epoch", "<u4"), ("pad", "<u4")])
COV_ROW_DTYPE = np.dtype([(n, "<u8") for n in (
    "tag", "eligible", "executed", "throttled", "lost", "fault", "pad0", "pad1")])
RL_EPOCHS = 8
NO_LIMIT = M32
COV_DTYPE = np.dtype([("seen", "<u8"), ("overflow", "<u8"), ("rl_tag", "<u4", (RL_EPOCHS,)),
                      ("rl_ran", "<u4", (RL_EPOCHS,)), ("pad", "<u8", (6,)),
                      ("rows", COV_ROW_DTYPE, (COV_ROWS,))])
PROG_DTYPE = np.dtype([("insns", "<u8"), ("cov", "<u8")] + [(n, "<u4") for n in (
    "n_insns", "max_insns", "stack_depth", "sample_every", "prog_id", "flags", "max_per_epoch", "first_epoch")] +
    [("descs", "<u8"), ("n_descs", "<u2"), ("desc_at", "<u2"), ("end_epoch", "<u4")])
HOOK_TABLE_DTYPE = np.dtype([("gen", "<u4"), ("n_progs", "<u4"), ("ctx_reads", "<u4"), ("pad", "<u4", (13,)),
                             ("progs", PROG_DTYPE, (MAX_PROGS,))])

# C struct name -> (dtype, {C field: dtype field}) for the NVRTC layout test
C_LAYOUTS: Dict[str, np.dtype] = {
    "dtmk_dinsn": DINSN_DTYPE, "dtmk_map": MAP_DTYPE, "dtmk_map_stats": MAP_STATS_DTYPE,
    "dtmk_rb_worker": RB_WORKER_DTYPE, "dtmk_rb_rec": RB_REC_DTYPE, "dtmk_cov_row": COV_ROW_DTYPE,
    "dtmk_cov": COV_DTYPE, "dtmk_prog": PROG_DTYPE, "dtmk_hook_table": HOOK_TABLE_DTYPE,
    "dtmk_desc": DESC_DTYPE,
}
assert DINSN_DTYPE.itemsize == 16 and MAP_DTYPE.itemsize == 128 and PROG_DTYPE.itemsize == 64
assert HOOK_TABLE_DTYPE.itemsize == 64 + 64 * MAX_PROGS


def layout_asserts() -> str:
    """C static_asserts stating every dtype's field offsets and sizes."""
    out = ['#include "bpf_inline.cuh"   /* struct dtmk_desc (the rest: bpf_maps.cuh / bpf_vm.cuh) */']
    for cname, dt in C_LAYOUTS.items():
        out.append(f'static_assert(sizeof(struct {cname}) == {dt.itemsize}, "{cname} size");')
        for name in dt.names:
            off = dt.fields[name][1]
            out.append(f'static_assert(__builtin_offsetof(struct {cname}, {name}) == {off}, '
                       f'"{cname}.{name}");')
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------

class EncodeError(UserError):
    """A program the device encoding cannot represent (names the slot)."""


def _sext32(v: int) -> int:
    v &= M32
    return v - (1 << 32) if v & 0x80000000 else v


def encode_program(insns: Sequence[Insn], map_descs: Sequence[int] = (),
                   map_values: Sequence[int] = (), name: str = "prog",
                   extremum_stores: Optional[Dict[int, str]] = None) -> np.ndarray:
    """Slots -> dtmk_dinsn records.  map_descs[i]: device address of map i's descriptor;
    map_values[i]: device address of entry 0 of map i's values (array maps; 0 otherwise);
    extremum_stores: slot -> "max" / "min" for the stxdw that end a raise-to / lower-to
    triple on a map value (dtrace_mk.runtime.inline.extremum_stores), encoded as the
    atomic `stxdw_max` / `stxdw_min`."""
    extremum_stores = extremum_stores or {}
    n = len(insns)
    rec_of: Dict[int, int] = {}
    k = 0
    pc = 0
    while pc < n:
        rec_of[pc] = k
        k += 1
        pc += 2 if insns[pc].opcode == isa.LDDW else 1
    rec_of[n] = k                            # one past the end (falls off: never verified)
    out = np.zeros(k, dtype=DINSN_DTYPE)
    for pc, r in rec_of.items():
        if pc == n:
            continue
        ins = insns[pc]
        info = OPCODES.get(ins.opcode)
        if info is None:
            raise EncodeError(f"{name}: insn {pc}: invalid opcode 0x{ins.opcode:02x}")
        op, aux, off, imm = OP_OF_OPCODE[ins.opcode], 0, 0, 0
        kind = info.kind
        if kind == "alu":
            if isa.ALU_OPS[info.op] == "end":
                imm = ins.imm & M32
            elif info.src == isa.BPF_K and isa.ALU_OPS[info.op] != "neg":
                imm = (ins.imm & M64) if info.is64 else (ins.imm & M32)
        elif kind == "jmp":
            tgt = pc + 1 + ins.off
            if tgt not in rec_of or tgt == n:
                raise EncodeError(f"{name}: insn {pc}: jump to {tgt} is not an instruction start")
            off = rec_of[tgt]
            if info.src == isa.BPF_K and info.op != isa.BPF_JA:
                imm = (ins.imm & M64) if info.is64 else (ins.imm & M32)
        elif kind == "call":
            op = CALL_OP.get(ins.imm, OP["call"])
            imm = ins.imm & M32
        elif kind == "exit":
            pass
        elif kind == "ld_imm64":
            if pc + 1 >= n:
                raise EncodeError(f"{name}: insn {pc}: lddw is missing its second slot")
            hi = insns[pc + 1].imm & M32
            value = ins.imm64 if ins.imm64 is not None else (ins.imm & M32) | (hi << 32)
            if ins.src == isa.PSEUDO_NONE:
                imm = value & M64
            else:
                idx = ins.imm & M32
                if idx >= len(map_descs):
                    raise EncodeError(f"{name}: insn {pc}: map #{idx} has no device address")
                if ins.src == isa.PSEUDO_MAP_FD:
                    op, imm = OP["lddw_map"], map_descs[idx]
                elif ins.src == isa.PSEUDO_MAP_VALUE:
                    op, imm = OP["lddw_map_value"], (map_values[idx] + ((value >> 32) & M32)) & M64
                else:
                    raise EncodeError(f"{name}: insn {pc}: invalid lddw pseudo source {ins.src}")
        else:                                    # ldx st stx atomic
            aux = info.size
            off = ins.off
            if kind == "st":
                imm = ins.imm & M64 if ins.imm >= 0 else (ins.imm + (1 << 64)) & M64
            elif kind == "atomic":
                aux = 1 if ins.imm & isa.ATOMIC_FETCH else 0
                if ins.imm not in (isa.ATOMIC_ADD, isa.ATOMIC_ADD | isa.ATOMIC_FETCH):
                    raise EncodeError(f"{name}: insn {pc}: unsupported atomic operation {ins.imm}")
        if pc in extremum_stores:
            if ins.opcode != isa.BPF_STX | isa.BPF_MEM | isa.BPF_DW:
                raise EncodeError(f"{name}: insn {pc}: a {extremum_stores[pc]} store must be stxdw")
            op = OP["stxdw_" + extremum_stores[pc]]
        out[r] = (op, ins.dst, ins.src, aux, off, imm)
    return out


def decode_program(recs: np.ndarray, map_descs: Sequence[int] = (),
                   map_values: Sequence[int] = ()) -> List[Insn]:
    """dtmk_dinsn records -> slots (inverse of encode_program; lddw map_value offsets are
    recovered from the nearest map value base at or below the address)."""
    slot_of, s = [], 0
    for r in recs:
        slot_of.append(s)
        s += 2 if int(r["op"]) in (OP_OF_OPCODE[isa.LDDW], OP["lddw_map"], OP["lddw_map_value"]) else 1
    desc_idx = {a: i for i, a in enumerate(map_descs)}
    out: List[Insn] = []
    for i, r in enumerate(recs):
        op, dst, src, off, imm = int(r["op"]), int(r["dst"]), int(r["src"]), int(r["off"]), int(r["imm"])
        name = NAME_OF_OP[op]
        if name == "lddw":
            out += isa.lddw(dst, imm)
            continue
        if name == "lddw_map":
            out += isa.lddw_map(dst, "", desc_idx[imm])
            continue
        if name == "lddw_map_value":
            best = max((j for j, b in enumerate(map_values) if b and b <= imm), key=lambda j: map_values[j])
            out += isa.lddw_map(dst, "", best, isa.PSEUDO_MAP_VALUE, imm - map_values[best])
            continue
        if name.startswith("call"):
            out.append(Insn(isa.BPF_JMP | isa.BPF_CALL, 0, 0, 0, _sext32(imm)))
            continue
        opcode = OPCODE_OF_OP[op] if name not in ("stxdw_max", "stxdw_min") else isa.BPF_STX | isa.BPF_MEM | isa.BPF_DW
        info = OPCODES[opcode]
        if info.kind == "jmp":
            out.append(Insn(opcode, dst, src, slot_of[off] - slot_of[i] - 1, _sext32(imm)))
        elif info.kind == "atomic":
            out.append(Insn(opcode, dst, src, off, isa.ATOMIC_ADD | (isa.ATOMIC_FETCH if r["aux"] else 0)))
        else:
            out.append(Insn(opcode, dst, src, off, _sext32(imm)))
    return out


def key_hash(key: bytes) -> int:
    """The device hash of a key (bpf_maps.cuh dtmk_key_hash)."""
    key = bytes(key) + b"\0" * (-len(key) % 4)
    h = 2166136261
    for (w,) in struct.iter_unpack("<I", key):
        h = ((h ^ w) * 16777619) & M32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def hash_capacity(max_entries: int) -> int:
    c = 2
    while c < 2 * max_entries:
        c <<= 1
    return c


# ---------------------------------------------------------------------------------
# NVRTC (CI compiles without a GPU)
# ---------------------------------------------------------------------------------

CompileError = build.CompileError
nvrtc_compile = build.nvrtc_compile


def harness_source() -> str:
    return (KERNEL_DIR / "bpf_vm_harness.cu").read_text()


def compile_harness(arch: str = "sm_90a", defines: Sequence[str] = ()) -> Path:
    """The harness cubin, cached under $DTRACE_MK_CACHE by a hash of the sources."""
    h = hashlib.sha256()
    for s in SOURCES:
        h.update(s.encode() + b"\0" + (KERNEL_DIR / s).read_bytes())
    h.update(f"{arch}|{'|'.join(defines)}".encode())
    path = build.cache_dir() / f"bpf_vm_{h.hexdigest()[:20]}.cubin"
    if not path.exists():
        data = nvrtc_compile(harness_source(), arch=arch, defines=defines)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------
# Device maps
# ---------------------------------------------------------------------------------

_COV_ROWS_OFF = COV_DTYPE.fields["rows"][1]
_COV_RL_TAG_OFF = COV_DTYPE.fields["rl_tag"][1]
_COV_RL_RAN_OFF = COV_DTYPE.fields["rl_ran"][1]


#: a coverage row's counters, in the order of _DevProg.retired's lists
_COV_COUNTS = ("eligible", "executed", "throttled", "lost", "fault")


def _fold_row(acc: Dict[Tuple[int, int], List[int]], r: np.void) -> None:
    """Add the counters of device coverage row `r` (a used one) to acc[(epoch, gen)]."""
    tag = int(r["tag"])
    a = acc.setdefault((tag >> 32, tag & M32), [0] * len(_COV_COUNTS))
    for i, f in enumerate(_COV_COUNTS):
        a[i] += int(r[f])


def coverage_rows(dp: "_DevProg", c: np.void) -> List[Coverage]:
    """A program's coverage: its retired rows (host) plus the device table's rows `c`
    (a COV_DTYPE record), one Coverage per (epoch, program_gen)."""
    acc: Dict[Tuple[int, int], List[int]] = {k: list(v) for k, v in dp.retired.items()}
    for r in c["rows"]:
        if int(r["tag"]) != COV_TAG_EMPTY:
            _fold_row(acc, r)
    out = []
    for (epoch, gen), (el, ex, th, lo, fa) in acc.items():
        cv = Coverage(dp.program.name, dp.program.hook.name, epoch, gen, el, ex, th, lo)
        if fa:
            cv.reasons["fault"] = fa
        out.append(cv)
    return out


def _freed_cov_slots(rows: np.ndarray, rl: np.ndarray):
    """The writes that retire coverage rows `rows` and rate-limit slots `rl` of a COV_DTYPE
    record: each slot's counters to 0, then (the second list) its tag to empty.  Returns
    (zero, free) lists of (byte offset, uint8 bytes) for _write_in_order."""
    rsz = COV_ROW_DTYPE.itemsize
    zero = ([(_COV_ROWS_OFF + j * rsz + 8, _ROW_COUNTERS_ZERO) for j in rows] +
            [(_COV_RL_RAN_OFF + 4 * j, _ZERO4) for j in rl])
    free = ([(_COV_ROWS_OFF + j * rsz, _EMPTY_ROW_TAG) for j in rows] +
            [(_COV_RL_TAG_OFF + 4 * j, _NONE_TAG) for j in rl])
    return zero, free


#: the bytes retire_epochs writes: a slot's counters zeroed, then its tag freed
_ZERO4, _ZERO8 = np.zeros(4, np.uint8), np.zeros(8, np.uint8)
_NONE_TAG = np.array([EPOCH_NONE], "<u4").view(np.uint8)
_EMPTY_ROW_TAG = np.array([COV_TAG_EMPTY], "<u8").view(np.uint8)
_ROW_COUNTERS_ZERO = np.zeros(COV_ROW_DTYPE.itemsize - 8, np.uint8)


def _write_in_order(buf, stream, zero, free) -> None:
    """Host-to-device writes of (offset, bytes) into the uint8 device array `buf` on
    `stream`: every `zero` one, THEN every `free` one (a slot becomes claimable only after
    its counters are 0)."""
    for group in (zero, free):
        for off, v in group:
            _put(buf[off:off + len(v)], v, stream)


def _put(dst, v: np.ndarray, stream=None) -> None:
    """A host-to-device copy into `dst` (on `stream` when given: no kernel launch)."""
    dst.set(v) if stream is None else dst.set(v, stream=stream)


def _dzeros(cp, n: int, dtype):
    """Zeroed device memory by a host-to-device copy: no kernel (cupy.zeros launches a
    memset), so maps can be made while a persistent megakernel holds every SM."""
    return cp.asarray(np.zeros(int(n), dtype=dtype))


class DeviceMaps:
    """The maps of one attachment in device memory (CuPy), with readback into the host
    model.  `descs` is an array of MAP_DTYPE; desc_addr(i) is what lddw map:i loads."""

    def __init__(self, cp, defs: Sequence[MapDef], num_workers: int):
        self.cp = cp
        self.defs = list(defs)
        self.W = num_workers
        self.bufs: List[Dict[str, object]] = []
        host = np.zeros(max(len(self.defs), 1), dtype=MAP_DTYPE)
        for i, m in enumerate(self.defs):
            m.validate()
            b: Dict[str, object] = {}
            d = host[i]
            d["type"] = m.type_id
            d["key_size"], d["value_size"], d["max_entries"] = m.key_size, m.value_size, m.max_entries
            d["n_workers"] = num_workers
            d["n_buckets"] = m.hist_buckets
            d["read_only"] = int(bool(m.read_only))
            d["lin_lo"], d["lin_hi"], d["lin_step"] = m.lin_lo, m.lin_hi, m.lin_step
            d["budget_bytes"] = m.budget_bytes
            b["stats"] = _dzeros(cp, MAP_STATS_DTYPE.itemsize, np.uint8)
            d["stats"] = b["stats"].data.ptr
            vstride = _round8(max(m.value_size, 1))
            d["value_stride"] = vstride
            if m.type in ("array", "per_worker_array"):
                b["values"] = cp.asarray(self._array_init(m, vstride))
                d["values"] = b["values"].data.ptr
            elif m.type == "ringbuf":
                b["values"] = _dzeros(cp, num_workers * m.max_entries, np.uint8)
                b["keys"] = _dzeros(cp, num_workers * m.max_entries * RB_REC_DTYPE.itemsize, np.uint8)
                rw = np.zeros(num_workers, dtype=RB_WORKER_DTYPE)
                rw["ep_tag"] = EPOCH_NONE
                b["slots"] = cp.asarray(rw.view(np.uint8))
                d["values"], d["keys"], d["slots"] = (b["values"].data.ptr, b["keys"].data.ptr,
                                                      b["slots"].data.ptr)
            else:
                cap = hash_capacity(m.max_entries)
                kstride = _round8(m.key_size)
                d["capacity"], d["cap_mask"], d["key_stride"] = cap, cap - 1, kstride
                b["keys"] = _dzeros(cp, cap * kstride, np.uint8)
                b["values"] = _dzeros(cp, cap * vstride, np.uint8)
                b["slots"] = _dzeros(cp, cap, np.uint32)
                d["values"], d["keys"], d["slots"] = (b["values"].data.ptr, b["keys"].data.ptr,
                                                      b["slots"].data.ptr)
            self.bufs.append(b)
        self.host_descs = host
        self.descs = cp.asarray(host.view(np.uint8))

    def _array_init(self, m: MapDef, vstride: int) -> np.ndarray:
        """An array map's values as created: zeros, entry 0 the map's init value."""
        copies = self.W if m.type == "per_worker_array" else 1
        init = np.zeros((copies, m.max_entries, vstride), dtype=np.uint8)
        if m.init_value:
            v = m.init_value[:m.value_size].ljust(m.value_size, b"\0")
            init[:, 0, :m.value_size] = np.frombuffer(v, dtype=np.uint8)
        return init.reshape(-1)

    def clear(self, i: int, stream=None) -> None:
        """Map i as its host model's clear() leaves it: a hash map empty (clear_hash), an
        array's values as created (init value included), the counters zeroed.  Host-to-
        device copies only, safe while a kernel runs; updates racing it may survive it or
        not (as in bpftrace, where clear() races the probes).  Ring buffers are drained,
        not cleared."""
        m, b = self.defs[i], self.bufs[i]
        if m.type in ("hash", "hist_log2", "hist_linear"):
            return self.clear_hash(i, stream)
        if m.type == "ringbuf":
            raise UserError(f"map {m.name!r}: a ring buffer is drained, not cleared")
        _put(b["values"], self._array_init(m, int(self.host_descs[i]["value_stride"])), stream)
        _put(b["stats"][0:32], np.zeros(4, "<u8").view(np.uint8), stream)     # count .. probe_exhausted

    def index(self, name: str) -> int:
        for i, m in enumerate(self.defs):
            if m.name == name:
                return i
        raise KeyError(f"no map named {name!r}")

    def desc_addr(self, i: int) -> int:
        return self.descs.data.ptr + i * MAP_DTYPE.itemsize

    @property
    def desc_addrs(self) -> List[int]:
        return [self.desc_addr(i) for i in range(len(self.defs))]

    @property
    def value_addrs(self) -> List[int]:
        return [int(self.host_descs[i]["values"]) if m.type == "array" else 0
                for i, m in enumerate(self.defs)]

    def upload_hash(self, i: int, items: Dict[bytes, bytes]) -> None:
        """Pre-fill a hash map (before any kernel runs) the way the device inserts."""
        m, d, b = self.defs[i], self.host_descs[i], self.bufs[i]
        cap, ks, vs = int(d["capacity"]), int(d["key_stride"]), int(d["value_stride"])
        keys = b["keys"].get().reshape(cap, ks)
        vals = b["values"].get().reshape(cap, vs)
        st = b["slots"].get()
        for k, v in items.items():
            j = key_hash(k) & (cap - 1)
            while st[j] != SLOT_EMPTY:
                j = (j + 1) & (cap - 1)
            keys[j, :m.key_size] = np.frombuffer(bytes(k), np.uint8)
            vals[j, :m.value_size] = np.frombuffer(bytes(v), np.uint8)
            st[j] = SLOT_FULL
        b["keys"].set(keys.reshape(-1))
        b["values"].set(vals.reshape(-1))
        b["slots"].set(st)
        stats = b["stats"].get().view(MAP_STATS_DTYPE).copy()
        stats["count"] = int((st == SLOT_FULL).sum())
        stats["lost"] = stats["throttled"] = stats["probe_exhausted"] = 0
        b["stats"].set(stats.view(np.uint8))

    def clear_hash(self, i: int, stream=None) -> None:
        """Empty hash map i as the host model's clear() does (every slot EMPTY; count, lost,
        throttled, probe_exhausted 0).  Host-to-device copies only (no kernel: safe while a
        persistent megakernel holds every SM).  Updates racing the clear may survive it or
        not, and may leave the counters off by what they added (as with any concurrent
        host write); two inserts of one key that probed before and after the slots were
        emptied can leave it twice (docs/operations.md "Not built yet")."""
        m, b = self.defs[i], self.bufs[i]
        if m.type not in ("hash", "hist_log2", "hist_linear"):
            raise UserError(f"map {m.name!r}: clear_hash needs a hash map, not {m.type}")
        cap = int(self.host_descs[i]["capacity"])          # in stream order: slots, then count
        _put(b["slots"], np.zeros(cap, np.uint32), stream)
        _put(b["stats"][0:32], np.zeros(4, "<u8").view(np.uint8), stream)     # count .. probe_exhausted

    def stats(self, i: int) -> np.void:
        return self.bufs[i]["stats"].get().view(MAP_STATS_DTYPE)[0]

    def retire_epochs(self, upto: int, stream=None) -> None:
        """Free the ring buffers' per-worker budget slots of epochs <= upto
        (DeviceRuntime.retire_epochs; the records already written stay)."""
        tag_off = RB_WORKER_DTYPE.fields["ep_tag"][1]
        used_off = RB_WORKER_DTYPE.fields["ep_used"][1]
        for m, b in zip(self.defs, self.bufs):
            if m.type != "ringbuf":
                continue
            rws = b["slots"].get(stream=stream)
            if stream is not None:
                stream.synchronize()
            tags = rws.view(RB_WORKER_DTYPE)["ep_tag"]
            old = [(int(w), int(j)) for w, j in np.argwhere((tags != EPOCH_NONE) & (tags <= upto))]
            base = RB_WORKER_DTYPE.itemsize
            _write_in_order(b["slots"], stream, [(w * base + used_off + 8 * j, _ZERO8) for w, j in old],
                            [(w * base + tag_off + 4 * j, _NONE_TAG) for w, j in old])

    def readback(self, names: Optional[Sequence[str]] = None) -> MapSet:
        """A host MapSet holding the device maps' contents and stats (`names`: only those
        maps are read; the others stay empty)."""
        ms = MapSet(self.defs, self.W)
        for i, (m, host) in enumerate(zip(self.defs, ms.maps)):
            if names is not None and m.name not in names:
                continue
            d, b = self.host_descs[i], self.bufs[i]
            st = self.stats(i)
            host.stats.lost = int(st["lost"])
            host.stats.throttled = int(st["throttled"])
            vs = int(d["value_stride"])
            if m.type in ("array", "per_worker_array"):
                copies = self.W if m.type == "per_worker_array" else 1
                vals = b["values"].get().reshape(copies, m.max_entries, vs)[:, :, :m.value_size]
                for w in range(copies):
                    init0 = host._initial(0)
                    nz = np.flatnonzero(vals[w].any(axis=1))
                    idxs = set(int(x) for x in nz) | {0}
                    for idx in sorted(idxs):
                        v = vals[w, idx].tobytes()
                        if v != host._initial(idx) or (idx == 0 and v != init0):
                            host._copies[w][idx] = bytearray(v)
            elif m.type == "ringbuf":
                data = b["values"].get().reshape(self.W, m.max_entries)
                recs = b["keys"].get().view(RB_REC_DTYPE).reshape(self.W, m.max_entries)
                rws = b["slots"].get().view(RB_WORKER_DTYPE)
                for w in range(self.W):
                    n = int(rws[w]["nrec"])
                    rs = sorted(recs[w, :n].tolist(), key=lambda r: r[0])
                    host._rings[w] = [Record(w, int(ep), data[w, off:off + ln].tobytes())
                                      for off, ln, ep, _ in rs]
                    host._held[w] = int(rws[w]["held"])
                    for j in range(RB_EPOCHS):
                        if int(rws[w]["ep_tag"][j]) != EPOCH_NONE:
                            host._used[(w, int(rws[w]["ep_tag"][j]))] = int(rws[w]["ep_used"][j])
            else:
                cap, ks = int(d["capacity"]), int(d["key_stride"])
                # states first: a slot turns FULL (release) after its key and value are
                # written, so a FULL slot read here has them whole in the copies after it
                sl = b["slots"].get()
                full = np.flatnonzero(sl == SLOT_FULL)
                keys = b["keys"].get().reshape(cap, ks)[full, :m.key_size].tobytes()
                vals = b["values"].get().reshape(cap, vs)[full, :m.value_size].tobytes()
                kz, vz = m.key_size, m.value_size       # (one bytes object each, cut per entry:
                host._d.update((keys[i * kz:(i + 1) * kz], bytearray(vals[i * vz:(i + 1) * vz]))
                               for i in range(len(full)))   # a window's ~10k entries)
        return ms

    def probe_exhausted(self) -> int:
        return sum(int(self.stats(i)["probe_exhausted"]) for i, m in enumerate(self.defs)
                   if m.type in ("hash", "hist_log2", "hist_linear"))


# ---------------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------------

@dataclass
class _DevProg:
    program: Program
    code: object                 # cupy uint8 array of dinsn records
    n_insns: int
    max_insns: int
    stack_depth: int
    cov: object                  # cupy uint8 array of COV_DTYPE
    facts: object = None         # inline.ProgramFacts: what it does with map values and the context
    #: the descriptor form (runtime/descform.py): its records on the device, or None and
    #: why the program runs as a program
    descs: object = None
    n_descs: int = 0
    desc_why: str = ""
    #: the lean form (descform.lean_layout): whether it runs so, its first cell in the
    #: workers' banks and how many it takes
    lean: bool = False
    lean_at: int = 0
    lean_n: int = 0
    #: coverage rows retired from the device table (DeviceRuntime.retire_epochs):
    #: (epoch, program_gen) -> [eligible, executed, throttled, lost, fault]
    retired: Dict[Tuple[int, int], List[int]] = field(default_factory=dict)


# dtmk_prog.flags bits: kernels/bpf_prog_flags.h (tests/runtime/test_descform.py reads them back)
PROG_F_SERIAL = 4     # run the warp's events one lane at a time
PROG_F_INLINE = 2     # run at the hook site (the site form)
PROG_F_DESC = 8       # ... from aggregation descriptors (dtmk_prog.descs)
PROG_F_LEAN = 16      # ... into dense per-worker cells (the lean form)


@dataclass
class _DevAttachment:
    id: int
    obj: BpfObject
    maps: DeviceMaps
    progs: List[_DevProg]
    sample_every: int
    max_per_epoch: Optional[int] = None
    first_epoch: int = 0
    end_epoch: int = 0           # events of this epoch and later are not eligible (0 = none)
    #: the lowest epoch whose device slots (coverage rows, rate-limit and ring budget slots)
    #: may not be retired yet: retire_epochs skips the attachment below it (set at attach,
    #: raised by retire_epochs, lowered by rearm)
    unretired_from: int = 0

    def holds_slots_upto(self, upto: int) -> bool:
        """Could a slot of an epoch <= upto still be on the device?"""
        if upto < self.unretired_from:
            return False
        return not (self.end_epoch and self.end_epoch <= self.unretired_from)


@dataclass
class FireBatch:
    """Per event and table slot: which program ran and how.  outcome: DTMK_OUT_* codes
    (0 = no program in that slot for the event's hook; 4 = fault, counted lost; 5 =
    sampled out, counted throttled; r0 is meaningful for 1..3)."""
    slots: Dict[int, List[Tuple[int, str]]]      # hook id -> [(attachment, program)] by slot
    hooks: np.ndarray                            # hook id per event
    r0: np.ndarray                               # uint64 [n, MAX_PROGS]
    outcome: np.ndarray                          # uint8 [n, MAX_PROGS]

    def results(self, i: int) -> List[Tuple[int, str, str, Optional[int]]]:
        """(attachment, program, outcome, r0 or None) for event i, in table order (the
        reference runtime's FireResult order)."""
        out = []
        for k, (aid, name) in enumerate(self.slots.get(int(self.hooks[i]), [])):
            o = int(self.outcome[i, k])
            r0 = int(self.r0[i, k]) if o in (OUT_EXECUTED, OUT_LOST, OUT_THROTTLED) else None
            out.append((aid, name, OUTCOME_NAMES.get(o, "none"), r0))
        return out


_MODULES: Dict[Tuple[str, int, Tuple[str, ...]], object] = {}


class DeviceRuntime:
    """ReferenceRuntime's interface on the GPU (CuPy).  See the module docstring."""

    def __init__(self, num_workers: int = 1, *, max_insns: int = abi.MAX_INSNS, code_cap: int = 2048,
                 clock_from_ctx: bool = True, arch: Optional[str] = None, defines: Sequence[str] = (),
                 harness: bool = True, descriptors: bool = False, lean_domains=None):
        """harness=False: tables, maps and coverage only (the megakernel's hook sites run
        the programs, dtrace_mk.runtime.live); fire()/launch() are then unavailable.
        descriptors (for a megakernel built with the site form: gpu.site_form; the
        compiled tier's linked kernels): a program that reduces to aggregation descriptors
        (runtime/aggdesc.py) runs from them at the hook site instead of through the ring
        and the VM (`forms(aid)` says which; a kernel without the site form runs every
        slot through the VM whatever the flags say).  lean_domains (a descform.LeanDomains,
        for a megakernel built with the lean form: gpu.lean_site): a descriptor program
        whose keys have dense domains runs in the lean form (kernels/bpf_inline.cuh)."""
        if (descriptors or lean_domains is not None) and harness:
            raise UserError("descriptors run at a megakernel's hook sites: DeviceRuntime(harness=False)")
        import cupy as cp
        self.cp = cp
        self.descriptors = bool(descriptors)
        self._lean_init(lean_domains)
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.num_workers = num_workers
        self.max_insns = max_insns
        self.code_cap = code_cap
        self.flags = FLAG_CLOCK_FROM_CTX if clock_from_ctx else 0
        if arch is None:
            cc = cp.cuda.Device().compute_capability
            arch = f"sm_{cc}a" if cc == "90" else f"sm_{cc}"
        self.module = self.kernel = self.naive = None
        if harness:
            key = (arch, cp.cuda.Device().id, tuple(defines))
            if key not in _MODULES:              # one compiled module per process, device, variant
                _MODULES[key] = cp.RawModule(path=str(compile_harness(arch, tuple(defines))))
            self.module = _MODULES[key]
            self.kernel = self.module.get_function("dtmk_vm_harness")
            self.naive = self.module.get_function("dtmk_vm_naive")
            self.kernel.max_dynamic_shared_size_bytes = self.smem_bytes(MAX_WARPS)
        self.host_tables = np.zeros(NUM_HOOKS, dtype=HOOK_TABLE_DTYPE)
        self.tables = cp.asarray(self.host_tables.view(np.uint8))
        self.status = _dzeros(cp, 4, np.uint64)   # skipped tables, code too large, clock, ns
        self._gen = {h.id: 0 for h in abi.HOOKS}
        self._by_hook: Dict[int, List[Tuple[_DevAttachment, _DevProg]]] = {h.id: [] for h in abi.HOOKS}
        self._atts: Dict[int, _DevAttachment] = {}
        self._detached: Dict[int, _DevAttachment] = {}
        self._next = 1

    def last_clock_mhz(self) -> float:
        """SM clock of block 0 over the last harness launch (clock64 / %globaltimer)."""
        st = self.status.get()
        return float(st[2]) / float(st[3]) * 1e3 if st[3] else 0.0

    def smem_bytes(self, warps: int) -> int:
        """Dynamic shared memory of a harness block of `warps` warps."""
        return (HOOK_TABLE_DTYPE.itemsize * NUM_HOOKS + 16 * self.code_cap +
                warps * (REG_BYTES_PER_WARP + 32 * abi.CONTEXT_SIZE))

    # -- attach / detach ---------------------------------------------------------------
    def attach(self, obj: BpfObject, verify: bool = True, *, sample_every: int = 1,
               programs: Optional[Sequence[str]] = None, max_per_epoch: Optional[int] = None,
               init_hash: Optional[Dict[str, Dict[bytes, bytes]]] = None, first_epoch: int = 0,
               replaces: Optional[int] = None) -> int:
        """Attach like ReferenceRuntime.attach (sampling, rate limit per program and epoch);
        init_hash pre-fills hash maps by name before anything runs; first_epoch: events of
        earlier decode steps are not eligible (not counted at all: attached from a step
        boundary of a running kernel); replaces: an attachment that counts no epoch >=
        first_epoch any more (its end_epoch), written in the same table change."""
        if obj.abi_version != abi.ABI_VERSION:
            raise UserError(f"{obj.path}: built for hook ABI v{obj.abi_version}, this runtime "
                            f"speaks v{abi.ABI_VERSION}")
        if sample_every < 1:
            raise UserError(f"sample_every must be >= 1, got {sample_every}")
        if max_per_epoch is not None and not 0 <= max_per_epoch < NO_LIMIT:
            raise UserError(f"max_per_epoch must be in 0..{NO_LIMIT - 1}, got {max_per_epoch}")
        if not 0 <= int(first_epoch) <= M32:
            raise UserError(f"first_epoch must be in 0..{M32}, got {first_epoch}")
        pred = replaced_attachment(self._atts, replaces, int(first_epoch))
        progs = [p for p in obj.programs if programs is None or p.name in programs]
        if not progs:
            raise UserError(f"{obj.path}: no programs to attach")
        from .inline import study, verified     # (imports the verifier's checker)
        bounds, facts = {}, {}
        for p in progs:
            if verify:
                try:
                    res, facts[p.name] = verified(p, obj.maps)   # one walk: verdict and inline facts
                except Rejected as e:
                    e.args = (f"{obj.path}: {p.section} {p.name}: {e}",)
                    raise
                bounds[p.name] = (min(res.max_path_insns, self.max_insns), max(res.stack_depth, 0))
            else:
                bounds[p.name] = (self.max_insns, abi.STACK_SIZE)
                facts[p.name] = study(p, obj.maps)
        for hid in {p.hook.id for p in progs}:
            if len(self._by_hook[hid]) + sum(1 for p in progs if p.hook.id == hid) > MAX_PROGS:
                raise UserError(f"{obj.path}: hook {abi.HOOKS_BY_ID[hid].name} already has "
                                f"{len(self._by_hook[hid])} programs; the device table holds {MAX_PROGS}")
        maps = DeviceMaps(self.cp, obj.maps, self.num_workers)
        for name, items in (init_hash or {}).items():
            maps.upload_hash(maps.index(name), items)
        dprogs = []
        desc_used = sum(d.n_descs for a in self._atts.values() for d in a.progs if d.descs is not None)
        for p in progs:
            recs = encode_program(p.insns, maps.desc_addrs, maps.value_addrs, p.name, facts[p.name].extremum_stores)
            cov = np.zeros(1, COV_DTYPE)
            cov["rows"]["tag"] = COV_TAG_EMPTY
            cov["rl_tag"] = EPOCH_NONE
            mi, sd = bounds[p.name]
            padded = np.concatenate([recs, np.zeros(1, DINSN_DTYPE)])   # the VM prefetches one past the end
            dp = _DevProg(p, self.cp.asarray(padded.view(np.uint8)), len(recs), mi, sd,
                          self.cp.asarray(cov.view(np.uint8)), facts[p.name])
            desc_used += self._descriptor_form(dp, obj, maps, verify, sample_every, max_per_epoch, desc_used)
            dprogs.append(dp)
        aid = self._next
        self._next += 1
        att = _DevAttachment(aid, obj, maps, dprogs, sample_every, max_per_epoch, int(first_epoch),
                             unretired_from=int(first_epoch))
        self._atts[aid] = att
        for dp in dprogs:
            self._by_hook[dp.program.hook.id].append((att, dp))
        for hid in sorted(hooks_changed(dprogs, pred, att.first_epoch)):
            self._gen[hid] += 1
            self._publish(hid)
        return aid

    descriptors = False       # (subclasses that skip __init__)
    lean_domains = None

    def _lean_init(self, lean_domains) -> None:
        from .descform import LEAN_CELLS
        self.lean_domains = lean_domains
        self._lean_used = np.zeros(LEAN_CELLS, bool)     # the workers' bank cells taken

    def _lean_alloc(self, n: int) -> Optional[int]:
        """First fit of n cells in the banks (None: no room)."""
        used, run = self._lean_used, 0
        for i in range(len(used)):
            run = 0 if used[i] else run + 1
            if run == n:
                used[i - n + 1:i + 1] = True
                return i - n + 1
        return None

    def _descriptor_form(self, dp: "_DevProg", obj: BpfObject, maps: "DeviceMaps", verified: bool,
                         sample_every: int, max_per_epoch: Optional[int], used: int) -> int:
        """Reduce dp to descriptors when this runtime runs them, every event runs it and
        the site's shared copy has room (`used` of descform.DESC_CAP entries taken);
        returns the entries it takes."""
        from . import aggdesc, descform
        lean = self.lean_domains
        why = ("the runtime runs programs" if not (self.descriptors or lean is not None) else
               "not verified" if not verified else
               "sampling / a rate limit" if sample_every > 1 or max_per_epoch is not None else "")
        if not why:
            try:
                recs = descform.encode(aggdesc.reduce(dp.program, obj.maps, dp.facts), obj.maps, maps.desc_addrs,
                                       dp.program.name)
            except descform.DescError as e:
                why = str(e).split(": ", 1)[-1]
            else:
                if lean is not None:
                    recs, why = self._lean_form(dp, recs)
                if not why and used + len(recs) > descform.DESC_CAP:
                    why = (f"the hook sites hold {descform.DESC_CAP} descriptor entries ({used} in use, "
                           f"this program needs {len(recs)})")
                    self._lean_free(dp)
                if not why:
                    dp.descs = self.cp.asarray(recs.view(np.uint8)) if len(recs) else self.cp.zeros(0, np.uint8)
                    dp.n_descs = len(recs)
                    return len(recs)
        dp.desc_why = why
        return 0

    def _lean_form(self, dp: "_DevProg", recs):
        """(records, "") in the lean form, placed in the banks; or (recs, "") when the
        kernel also runs plain descriptors and the keys are not dense; else (recs, why)."""
        from . import descform
        try:
            lrecs, n = descform.lean_layout(recs, self.lean_domains, dp.program.name)
        except descform.DescError as e:
            return recs, ("" if self.descriptors else str(e).split(": ", 1)[-1])
        at = self._lean_alloc(n) if n else 0
        if at is None:
            return recs, ("" if self.descriptors else
                          f"the lean cells are taken ({int(self._lean_used.sum())} of {descform.LEAN_CELLS} "
                          f"in use, this program needs {n})")
        agg = (lrecs["kind"] & 0x7F) == descform.D_AGG
        lrecs["lbase"][agg] += at
        dp.lean, dp.lean_at, dp.lean_n = True, at, n
        return lrecs, ""

    def _lean_free(self, dp: "_DevProg") -> None:
        if dp.lean:
            self._lean_used[dp.lean_at:dp.lean_at + dp.lean_n] = False
            dp.lean = False

    def _is_lean(self, dp: "_DevProg") -> bool:
        return dp.descs is not None and dp.lean

    def forms(self, aid: int) -> Dict[str, str]:
        """How each program of an attachment runs at the megakernel's hook site:
        "lean", "descriptors", or "program: <why>" (through the ring and the VM)."""
        return {dp.program.name: ("lean" if self._is_lean(dp) else "descriptors") if dp.descs is not None
                else f"program: {dp.desc_why}" for dp in self._atts[aid].progs}

    def detach(self, aid: int) -> None:
        att = self._atts.pop(aid)
        for dp in att.progs:                     # (a worker folds them before it loads the change)
            self._lean_free(dp)
        for hid in sorted({dp.program.hook.id for dp in att.progs}):
            self._by_hook[hid] = [(a, d) for (a, d) in self._by_hook[hid] if a is not att]
            self._gen[hid] += 1
            self._publish(hid)
        self._detached[aid] = att

    def rearm(self, aid: int, first_epoch: int, replaces: Optional[int] = None) -> None:
        """ReferenceRuntime.rearm on the device: the slots' first_epoch / end_epoch
        rewritten (data: the compiled code of a linked program runs on unchanged)."""
        for hid in sorted(rearmed_hooks(self._atts, aid, int(first_epoch), replaces)):
            self._gen[hid] += 1
            self._publish(hid)
        att = self._atts[aid]
        att.unretired_from = min(att.unretired_from, att.first_epoch)

    def forget(self, aid: int) -> None:
        """Drop a detached attachment: its device memory (code, maps, coverage) goes back
        to the pool, where the next allocation may reuse it -- so only once no worker can
        still run it (every worker passed a step gate after the detach, where changed
        tables are reloaded; runtime.summary_windows)."""
        if aid in self._atts:
            raise UserError(f"forget: attachment {aid} is still attached (detach it first)")
        if self._detached.pop(aid, None) is None:
            raise KeyError(f"no attachment {aid}")

    def program_gen(self, hook) -> int:
        from ..abi import context
        return self._gen[context.hook_id(hook)]

    def _fill_slot(self, e, att: "_DevAttachment", dp: "_DevProg") -> None:
        """One dtmk_prog of a hook table (kernels/bpf_maps.cuh)."""
        e["insns"], e["cov"] = dp.code.data.ptr, dp.cov.data.ptr
        e["n_insns"], e["max_insns"], e["stack_depth"] = dp.n_insns, dp.max_insns, dp.stack_depth
        e["sample_every"], e["prog_id"] = att.sample_every, att.id
        e["max_per_epoch"] = NO_LIMIT if att.max_per_epoch is None else att.max_per_epoch
        e["first_epoch"], e["end_epoch"] = att.first_epoch, att.end_epoch
        e["flags"] = PROG_F_SERIAL if dp.facts.writes_values else 0
        if dp.descs is not None:                 # run at the site from its descriptors
            e["flags"] |= PROG_F_INLINE | PROG_F_DESC | (PROG_F_LEAN if self._is_lean(dp) else 0)
            e["descs"], e["n_descs"] = dp.descs.data.ptr, dp.n_descs

    def _publish(self, hid: int) -> None:
        """Write hook hid's table under its seqlock: gen odd, body, gen even."""
        t = self.host_tables[hid]
        base = hid * HOOK_TABLE_DTYPE.itemsize
        t["gen"] = 2 * self._gen[hid] - 1
        self.tables[base:base + 4].set(np.frombuffer(struct.pack("<I", int(t["gen"])), np.uint8))
        entries = self._by_hook[hid]
        t["n_progs"] = len(entries)
        for k in range(MAX_PROGS):
            t["progs"][k] = np.zeros(1, PROG_DTYPE)[0]
        reads = 0
        for k, (att, dp) in enumerate(entries):
            self._fill_slot(t["progs"][k], att, dp)
            reads |= dp.facts.ctx_reads
        t["ctx_reads"] = reads
        body = self.host_tables[hid:hid + 1].view(np.uint8)
        self.tables[base + 4:base + HOOK_TABLE_DTYPE.itemsize].set(body[4:].copy())
        t["gen"] = 2 * self._gen[hid]
        self.tables[base:base + 4].set(np.frombuffer(struct.pack("<I", int(t["gen"])), np.uint8))

    # -- events --------------------------------------------------------------------------
    def launch(self, dev, n: int, r0, out, *, serial: bool = False, epoch: Optional[int] = None,
               blocks: Optional[int] = None, warps: int = H_WARPS, repeat: int = 1) -> None:
        """Launch the harness over n device-resident records (no checks, no sync): what
        fire() does after validating, and what the benchmark times."""
        if self.kernel is None:
            raise UserError("this DeviceRuntime has no harness (harness=False): a megakernel runs its programs")
        if not 1 <= warps <= MAX_WARPS:
            raise ValueError(f"warps must be in 1..{MAX_WARPS}")
        if blocks is None:
            blocks = 1 if serial else max(1, min(1024, (n + 32 * warps - 1) // (32 * warps)))
        args = (self.tables, dev, r0, out, self.status, np.uint32(n), np.uint32(1 if serial else 0),
                np.uint32(self.flags), np.uint32(self.code_cap), np.uint32(epoch or 0),
                np.uint32(0 if epoch is None else 1), np.uint32(repeat))
        self.kernel((blocks,), (32 * warps,), args, shared_mem=self.smem_bytes(warps))

    def fire(self, records, *, serial: bool = False, epoch: Optional[int] = None, blocks: Optional[int] = None,
             warps: int = H_WARPS, repeat: int = 1) -> FireBatch:
        """Run every attached program over context records (bytes records, a bytes blob,
        a CTX numpy array or a CuPy uint8 device array of n*128 bytes)."""
        cp = self.cp
        if isinstance(records, cp.ndarray):
            dev = records
            n = dev.size // abi.CONTEXT_SIZE
            host = None
        else:
            if isinstance(records, (list, tuple)):
                blob = b"".join(bytes(r) for r in records)
            elif isinstance(records, np.ndarray):
                blob = records.tobytes()
            else:
                blob = bytes(records)
            if len(blob) % abi.CONTEXT_SIZE:
                raise UserError(f"context records: {len(blob)} bytes is not a multiple of {abi.CONTEXT_SIZE}")
            host = np.frombuffer(blob, dtype=np.uint8).reshape(-1, abi.CONTEXT_SIZE)
            n = host.shape[0]
            dev = cp.asarray(host.reshape(-1))
        if host is not None and n:
            words = host.view("<u4")
            hooks = words[:, 1]
            workers = words[:, 6]
            bad = np.flatnonzero((hooks < 1) | (hooks > abi.MAX_HOOK_ID))
            if bad.size:
                raise UserError(f"context record {int(bad[0])}: field 'hook': {int(hooks[bad[0]])} is not a hook id")
            badw = np.flatnonzero(workers >= self.num_workers)
            if badw.size:
                raise UserError(f"context record {int(badw[0])}: field 'worker': {int(workers[badw[0]])} is out "
                                f"of range for {self.num_workers} workers")
        else:
            hooks = dev.view(cp.uint32).reshape(-1, abi.CONTEXT_SIZE // 4)[:, 1].get() if n else np.zeros(0, np.uint32)
        r0 = cp.zeros(max(n, 1) * MAX_PROGS, dtype=cp.uint64)
        out = cp.zeros(max(n, 1) * MAX_PROGS, dtype=cp.uint8)
        if n:
            self.launch(dev, n, r0, out, serial=serial, epoch=epoch, blocks=blocks, warps=warps, repeat=repeat)
            cp.cuda.runtime.deviceSynchronize()
            st = self.status.get()
            if st[1]:
                self.status[1:2].fill(0)
                raise UserError(f"device VM: the attached programs' code exceeds the harness's shared "
                                f"memory budget of {self.code_cap} instructions")
        slots = {hid: [(a.id, d.program.name) for a, d in ents] for hid, ents in self._by_hook.items()}
        return FireBatch(slots, np.asarray(hooks), r0.get().reshape(-1, MAX_PROGS)[:n],
                         out.get().reshape(-1, MAX_PROGS)[:n])

    # -- results -------------------------------------------------------------------------
    def _get(self, aid: int) -> _DevAttachment:
        att = self._atts.get(aid) or self._detached.get(aid)
        if att is None:
            raise KeyError(f"no attachment {aid}")
        return att

    def device_maps(self, aid: int) -> DeviceMaps:
        return self._get(aid).maps

    def maps(self, aid: int) -> MapSet:
        return self._get(aid).maps.readback()

    def clear_map(self, aid: int, name: str, stream=None) -> None:
        """A query's clear(@map) on the device (DeviceMaps.clear: while a kernel runs too)."""
        dm = self._get(aid).maps
        dm.clear(dm.index(name), stream)

    def coverage(self, aid: int, check_upto: Optional[int] = None) -> List[Coverage]:
        """The attachment's coverage rows, each checked (eligible = executed + throttled +
        lost) -- only those of epochs <= check_upto when given: a row a running kernel is
        still adding to may be copied between its counters' updates."""
        att = self._get(aid)
        rows: List[Coverage] = []
        for dp in att.progs:
            c = dp.cov.get().view(COV_DTYPE)[0]
            if int(c["overflow"]):
                raise RuntimeError(f"coverage of {dp.program.name}: {int(c['overflow'])} events found no "
                                   f"free row (more than {COV_ROWS} (epoch, gen) rows not retired)")
            for cv in coverage_rows(dp, c):
                if check_upto is None or cv.epoch <= check_upto:
                    cv.check()
                rows.append(cv)
        rows.sort(key=lambda c: (c.program, c.epoch, c.program_gen))
        return rows

    def holds_epochs(self) -> bool:
        """Does any attachment (detached ones too: their last epochs) hold device slots
        that retire_epochs would have to read?"""
        return bool(self._atts or self._detached)

    def retire_epochs(self, upto: int, stream=None) -> int:
        """Free the device's per-epoch slots of epochs <= upto, for every attachment: the
        coverage rows (folded into the host's `retired` rows first: coverage() still
        reports them), the rate-limit slots and the ring buffers' budget slots.  The
        tables hold COV_ROWS / RL_EPOCHS / RB_EPOCHS epochs at a time; a long-running
        kernel (a resident serving launch) would run out of them, so the host retires
        the epochs it knows complete: no event of them can come any more (the caller's
        promise; runtime.live.LiveSession.retire_complete).  Safe while the kernel runs:
        a slot's counters are zeroed by one copy and its tag freed by the next one on
        the same stream, so a worker that claims the freed slot counts from zero.
        Returns the number of coverage rows retired."""
        n = 0
        for att in list(self._atts.values()) + list(self._detached.values()):
            # (a resident serving loop calls this every few steps: an attachment with no
            # slot of an epoch <= upto -- device summaries' next window, an ended one
            # already retired -- costs no device-to-host copy)
            if not att.holds_slots_upto(upto):
                continue
            for dp in att.progs:
                host = dp.cov.get(stream=stream)
                if stream is not None:
                    stream.synchronize()
                c = host.view(COV_DTYPE)[0]
                tags = c["rows"]["tag"]
                rows = np.flatnonzero((tags != COV_TAG_EMPTY) & ((tags >> np.uint64(32)) <= upto))
                rlt = c["rl_tag"]
                rl = np.flatnonzero((rlt != EPOCH_NONE) & (rlt <= upto))
                for j in rows:
                    _fold_row(dp.retired, c["rows"][j])
                _write_in_order(dp.cov, stream, *_freed_cov_slots(rows, rl))
                n += len(rows)
            att.maps.retire_epochs(upto, stream)
            att.unretired_from = max(att.unretired_from, int(upto) + 1)
        return n

    def evidence(self, aid: int) -> List[Tuple[str, Record]]:
        ms = self.maps(aid)
        return [(m.name, r) for m in ms if m.kind == "ringbuf" for r in m.snapshot()]
