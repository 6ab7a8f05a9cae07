"""The descriptor form: an aggdesc.AggPlan encoded as kernels/bpf_inline.cuh's
`struct dtmk_desc` records, which the megakernel's hook site runs from data -- no
compile, no interpreter, no ring and no drain, in the hot tier as well as the compiled.

    recs = encode(plan, maps, map_addrs)      # numpy DESC_DTYPE records, or DescError

Layout (one record per entry; the device reads them in order): for each case of the
plan, its GUARDs, its AGGs, then END.  The first case whose guards all hold applies its
updates; the plan's cases are disjoint, so at most one does.  An AGG names its map by
device address (the shadow's key, as the compiled inline form's), its key as constant
bytes in place plus up to four parts read at run time (a context field, or the worker
id), its value (a context field, the worker or a constant) and its op: +1 in the value's
bucket of a hist map, or add / raise one 64-bit word of a hash value.  A second AGG on
the same lookup (avg's sum and count) is marked SAME: one shadow entry, one event on it.

What the device cannot take is refused with the reason (the program then runs as a
program): keys over 8 bytes (the shadow's), a min (the shadow combines adds and maxima),
two ops on one value word, a misaligned field.  The constants below are the device's
(kernels/bpf_inline.cuh); tests/runtime/test_descform.py reads them back from the header."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

from ..bpf.program import MapDef
from ..errors import UserError
from . import aggdesc
from .aggdesc import ADD, HIST, MAX, MIN, Const, Ctx, Worker

D_END, D_GUARD, D_AGG, D_SAME = 0, 1, 2, 0x80
SRC_WORKER, SRC_CONST = 0xFE, 0xFF
SH_ADD, SH_MAX = 1, 2                 # also the shadow's per-word op codes (DTMK_SH_*)
HIST_LOG2, HIST_LIN = 4, 5
TAKEN, WIDE = 0x40, 0x80
#: the GUARD op codes, in the device's enum order (DTMK_D_JEQ ...)
GUARD_OPS = ("jeq", "jgt", "jge", "jlt", "jle", "jset", "jne", "jsgt", "jsge", "jslt", "jsle")
MAX_PARTS = 4
MAX_KEY = 8                           # the shadow's key (dtmk_sh_ent.key)
MAX_WORDS = 2                         # the shadow's value words (dtmk_sh_ent.val)
PROG_F_DESC = 8                       # dtmk_prog.flags (with PROG_F_INLINE)
#: entries of all attached descriptor programs together: each worker copies them into
#: shared memory at table load (kernels/megakernel.cu DTMK_OBS_DESC); attach keeps the sum
DESC_CAP = 32
MASK64 = (1 << 64) - 1

DESC_DTYPE = np.dtype([
    ("map", "<u8"), ("kconst", "<u8"), ("vconst", "<u8"),
    ("lin_lo", "<i8"), ("lin_hi", "<i8"), ("lin_step", "<i8"),
    ("kind", "u1"), ("op", "u1"), ("vsrc", "u1"), ("vsize", "u1"),
    ("word", "u1"), ("shops", "u1"), ("nparts", "u1"), ("pad0", "u1"),
    ("ksrc", "u1", (MAX_PARTS,)), ("ksize", "u1", (MAX_PARTS,)), ("kpos", "u1", (MAX_PARTS,)),
    ("nb", "<u4"), ("pad1", "<u4", (2,)),
    ("lbase", "<u2"), ("lper", "<u2"), ("lstride", "<u2", (MAX_PARTS,)), ("ldom", "u1", (MAX_PARTS,))])
assert DESC_DTYPE.itemsize == 96


#: the lean form (kernels/bpf_inline.cuh "the lean form"): 32-bit cells per bank of a worker
#: (DTMK_LEAN_CELLS) that the attached lean programs' regions share; the stride bit that
#: maps a part's DTMK_NONE_U32 to the index past its domain
LEAN_CELLS = 1024
LEAN_NONE = 0x8000
PROG_F_LEAN = 16                      # dtmk_prog.flags (with PROG_F_INLINE | PROG_F_DESC)
#: a hook's op count when the megakernel walks its lean slots' descriptors instead (dtmk_lean_compile)
LEAN_SLOW = 0xFF


class DescError(UserError):
    """A plan the device's descriptor form cannot run (the program keeps its code)."""


def _src(s, size_cap: int, where: str):
    """(source byte, bytes to read) of a scalar; size_cap: the bytes that are kept."""
    if isinstance(s, Ctx):
        n = min(s.size, size_cap)
        if s.off % n:
            raise DescError(f"{where}: context field at byte {s.off} ({n} bytes) is not aligned")
        return s.off, n
    if isinstance(s, Worker):
        return SRC_WORKER, min(4, size_cap)
    return SRC_CONST, min(8, size_cap)


def _shadow_ops(plan: aggdesc.AggPlan, where: str) -> Dict[int, int]:
    """map -> the shadow ops of its value words (2 bits per word), over every case."""
    ops: Dict[int, Dict[int, int]] = {}
    for case in plan.cases:
        for a in case.aggs:
            if a.op == HIST:
                continue
            if a.op == MIN:
                raise DescError(f"{where}: a min (the shadow combines adds and maxima)")
            if a.word >= MAX_WORDS:
                raise DescError(f"{where}: value word {a.word} (the shadow holds {MAX_WORDS})")
            code = SH_ADD if a.op == ADD else SH_MAX
            if ops.setdefault(a.map, {}).setdefault(a.word, code) != code:
                raise DescError(f"{where}: value word {a.word} both added to and raised")
    return {m: sum(c << 2 * w for w, c in words.items()) for m, words in ops.items()}


def encode(plan: aggdesc.AggPlan, maps: Sequence[MapDef], map_addrs: Sequence[int],
           name: str = "prog") -> np.ndarray:
    """The plan's records (DESC_DTYPE); map_addrs[i]: map i's device descriptor address."""
    if not plan.ok:
        raise DescError(f"{name}: {plan.reason}")
    shops = _shadow_ops(plan, name)
    recs = []
    for ci, case in enumerate(plan.cases):
        where = f"{name}: case {ci}"
        for g in case.guards:
            r = np.zeros(1, DESC_DTYPE)[0]
            r["kind"] = D_GUARD
            r["op"] = GUARD_OPS.index(g.op) | (TAKEN if g.taken else 0) | (WIDE if g.is64 else 0)
            r["vsrc"], r["vsize"] = _src(g.value, 8, where)
            r["vconst"] = g.const & MASK64
            recs.append(r)
        prev = None
        for a in case.aggs:
            m = maps[a.map]
            r = np.zeros(1, DESC_DTYPE)[0]
            r["kind"] = D_AGG | (D_SAME if prev is not None and a.op != HIST and prev.op != HIST and
                                 (prev.map, prev.key) == (a.map, a.key) else 0)
            r["map"] = map_addrs[a.map]
            pos, parts, kconst = 0, [], 0
            for s, n in a.key:
                if isinstance(s, Const):
                    kconst |= (s.value & ((1 << 8 * n) - 1)) << 8 * pos
                else:
                    parts.append((*_src(s, n, where), pos))
                pos += n
            if pos != m.key_size or pos > MAX_KEY:
                raise DescError(f"{where}: map '{m.name}': a {pos}-byte key (the shadow takes {MAX_KEY})")
            if len(parts) > MAX_PARTS:
                raise DescError(f"{where}: map '{m.name}': {len(parts)} key fields (at most {MAX_PARTS})")
            r["kconst"], r["nparts"] = kconst, len(parts)
            for i, (src, n, p) in enumerate(parts):
                r["ksrc"][i], r["ksize"][i], r["kpos"][i] = src, n, p
            r["vsrc"], r["vsize"] = _src(a.value, 8, where)
            if isinstance(a.value, Const):
                r["vconst"] = a.value.value & MASK64
            if a.op == HIST:
                r["op"] = HIST_LOG2 if m.type == "hist_log2" else HIST_LIN
                r["nb"] = m.hist_buckets
                r["lin_lo"], r["lin_hi"], r["lin_step"] = m.lin_lo, m.lin_hi, m.lin_step
            else:
                r["op"] = SH_ADD if a.op == ADD else SH_MAX
                r["word"], r["shops"] = a.word, shops[a.map]
            recs.append(r)
            prev = a
        end = np.zeros(1, DESC_DTYPE)[0]
        end["kind"] = D_END
        recs.append(end)
    return np.array(recs, dtype=DESC_DTYPE)


# ---------------------------------------------------------------- the lean form

@dataclass(frozen=True)
class LeanDomains:
    """The dense key domains of one megakernel: context byte offset -> (n, none): the field
    takes the values 0..n-1, and DTMK_NONE_U32 too when `none`.  The worker id and the
    decode step are every worker's own / the epoch's (one value per bank) without a domain."""
    fields: Tuple[Tuple[int, int, bool], ...]

    @classmethod
    def of_model(cls, n_classes: int, n_layers: int, n_experts: int = 0) -> "LeanDomains":
        from ..abi import definition
        off = {f.name: f.offset for f in definition.CONTEXT_FIELDS}
        rows = [(off["task_class"], n_classes, False), (off["layer"], n_layers, True)]
        if n_experts:
            rows.append((off["expert"], n_experts, True))
        return cls(tuple(rows))

    def of(self, src: int):
        return next(((n, none) for o, n, none in self.fields if o == src), None)


def _self_sources() -> frozenset:
    """Key sources that are one value per bank: the worker id (get_worker_id, the context's
    worker) and the decode step (the bank's epoch)."""
    from ..abi import definition
    off = {f.name: f.offset for f in definition.CONTEXT_FIELDS}
    return frozenset((SRC_WORKER, off["worker"], off["decode_step"]))


def lean_layout(recs: np.ndarray, domains: LeanDomains, name: str = "prog") -> Tuple[np.ndarray, int]:
    """recs (encode's) with each lookup's region laid out from cell 0, and the cells they
    take; DescError(why) when a key part has no dense domain (the program then runs from
    its descriptors or as a program).  The caller moves lbase to where its cells are."""
    from ..abi import definition
    sizes = {f.offset: f.size for f in definition.CONTEXT_FIELDS}
    selfs = _self_sources()
    out = recs.copy()
    used = 0
    aggs = [i for i in range(len(out)) if out[i]["kind"] & 0x7F == D_AGG]
    for j, i in enumerate(aggs):
        r = out[i]
        if r["kind"] & D_SAME:                     # the previous AGG's lookup: its region
            for f in ("lbase", "lper", "lstride", "ldom"):
                r[f] = out[aggs[j - 1]][f]
            continue
        hist = r["op"] >= HIST_LOG2
        per = int(r["nb"]) if hist else 2 * (2 if int(r["shops"]) >> 2 else 1) + 1
        dims = []                                  # (part, indices incl. NONE's, none, domain)
        for p in range(int(r["nparts"])):
            src, n = int(r["ksrc"][p]), int(r["ksize"][p])
            if src in selfs:
                continue
            dom = domains.of(src)
            if dom is None:
                raise DescError(f"{name}: a key on the context field at byte {src} (no dense domain)")
            if n != sizes.get(src):
                raise DescError(f"{name}: a key on {n} of the {sizes.get(src)} bytes at byte {src}")
            dims.append((p, dom[0] + (1 if dom[1] else 0), dom[1], dom[0]))
        cells = per
        for p, vals, none, n in reversed(dims):    # mixed radix, the last part fastest
            r["lstride"][p] = cells | (LEAN_NONE if none else 0)
            r["ldom"][p] = n
            cells *= vals
        if cells > LEAN_CELLS:
            raise DescError(f"{name}: a region of {cells} cells (a bank holds {LEAN_CELLS})")
        r["lbase"], r["lper"] = used, per
        used += cells
    return out, used
