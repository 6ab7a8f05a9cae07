"""Which compiled programs run inline at the hook site (kernels/bpf_inline.cuh).

The inline form runs a compiled program on the event's thread at the hook site and
combines its map updates in a per-worker shadow table that moves into the device maps
at epoch ends.  That is exact only for updates that commute, so a program qualifies when
every map it updates is one of (decided on the verified bytecode, from the verifier's own
register types, not from what the compiler that made it says):

* a hist_log2 / hist_linear map with keys <= 8 bytes, used only through `hist_add`
  whose return value the program never reads (the shadow cannot know the map is full);
* a hash map with keys <= 8 bytes and an 8- or 16-byte value whose words, reached only
  through `map_lookup_elem`, are each either only `xadddw`-ed (ADD) or only changed by
  the "raise to" triple `ldxdw rT, [rP+o]; jge rT, rV, +1; stxdw [rP+o], rV` (MAX, rT
  dead after it; an add never fetches), and whose `map_update_elem` calls insert a zero
  value with BPF_NOEXIST (the insert path of a lookup-or-insert: in the shadow it is what
  the flush's insert does).  Such an insert must exist, and every lookup is either the
  first of a lookup-or-insert (its null edge leads straight to the insert and a second
  lookup that rejoins it: the shadow never returns null) or that second lookup;
* at most one shadow access (hist_add or first lookup) on any path of one run: the flush
  loses a refused key's events once per entry, which is once per event only then.

Array maps are used through the ordinary helpers (a few cached loads, no probing).
Anything else -- ringbuf evidence, map_delete_elem, trace_printk, a value read for any
other purpose -- keeps the program on the ring + drain path, with the reason recorded.

    plan = analyse(program, maps)      # InlinePlan: .ok, .reason, .maps {index: InlineMap}
    facts = study(program, maps)       # ProgramFacts: the plan and what the device runtimes need
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, field, replace
from typing import Dict, Optional, Sequence, Set, Tuple

from ..abi import definition as abi
from ..bpf import isa
from ..bpf.program import MapDef, Program
from ..bpf.verifier import cfg as _cfg
from ..bpf.verifier import scalar as S
from ..bpf.verifier import types as T
from ..bpf.verifier.checker import Checker
from ..bpf.verifier import VerifyResult, verify

ADD, MAX = 1, 2                               # kernels/bpf_inline.cuh DTMK_SH_ADD / DTMK_SH_MAX
MAX_KEY = 8
HIST_TYPES = ("hist_log2", "hist_linear")
PURE_HELPERS = ("ktime_get_ns", "get_worker_id", "set_priority_hint")
MAP_HELPERS = ("map_lookup_elem", "map_update_elem", "hist_add")
NOEXIST = 1


@dataclass(frozen=True)
class InlineMap:
    """How the shadow combines one map: kind 'hash' (ops: 2 bits per value word) or a
    hist type (lin = (lo, hi, step, n_buckets) for hist_linear)."""
    index: int
    kind: str
    key_size: int
    ops: int = 0
    lin: Tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass
class InlinePlan:
    maps: Dict[int, InlineMap] = field(default_factory=dict)
    reason: Optional[str] = None              # why the program stays on the ring path

    @property
    def ok(self) -> bool:
        return self.reason is None


class _Facts(Checker):
    """The verifier's walk, noting per instruction what the inline analysis needs."""

    def __init__(self, insns, maps, hook, ptype):
        super().__init__(insns, maps, hook, ptype)
        self.value_access: Dict[int, Set[Tuple[int, Optional[int], int, str]]] = {}
        self.calls: Dict[int, Set[Tuple[str, Optional[int], Optional[int], bool]]] = {}
        self.key_at: Dict[int, Set[Optional[int]]] = {}   # call pc -> r2's stack offset (None: not one)
        self.ctx_bytes: Set[int] = set()                     # context bytes the program reads

    def check_MemAccess(self, a, st, pc):
        super().check_MemAccess(a, st, pc)
        base = st.regs[a.base]
        if base.kind == T.CTX:                # the verifier keeps context offsets constant
            off = S.to_signed(base.off.const) + a.off
            self.ctx_bytes.update(range(off, off + a.size))
        if base.kind == T.MAP_VALUE:
            c = base.off.const
            off = None if c is None else S.to_signed(c) + a.off
            self.value_access.setdefault(pc, set()).add((base.map, off, a.size, a.mode))

    def check_Call(self, a, st, pc):
        super().check_Call(a, st, pc)
        h = abi.HELPERS_BY_ID[a.helper_id]
        r1, r3, r4 = st.regs[1], st.regs[3], st.regs[4]
        m = r1.map if r1.kind == T.MAP_PTR else None
        flags = r4.num.const if r4.kind == T.SCALAR and r4.num is not None else None
        zero = False
        if h.name == "map_update_elem" and m is not None and r3.kind == T.STACK and r3.off.const is not None:
            off, size = S.to_signed(r3.off.const), self.maps[m].value_size
            if off % 8 == 0 and size % 8 == 0:
                slots = [st.spills.get(s) for s in range(off, off + size, 8)]
                zero = all(r is not None and r.kind == T.SCALAR and r.num is not None and r.num.const == 0
                           for r in slots)
        self.calls.setdefault(pc, set()).add((h.name, m, flags, zero))
        r2 = st.regs[2]
        koff = S.to_signed(r2.off.const) if r2.kind == T.STACK and r2.off.const is not None else None
        self.key_at.setdefault(pc, set()).add(koff)


def _jump_targets(insns: Sequence[isa.Insn]) -> Set[int]:
    out: Set[int] = set()
    for pc, ins in enumerate(insns):
        info = isa.OPCODES.get(ins.opcode)
        if info is not None and info.kind == "jmp":
            out.add(pc + 1 + ins.off)
    return out


_TRIPLE_JUMPS = {isa.BPF_JMP | isa.BPF_X | isa.BPF_JGE: "max", isa.BPF_JMP | isa.BPF_X | 0xB0: "min"}


def _triple(insns: Sequence[isa.Insn], pc: int, targets: Set[int]) -> Optional[str]:
    """"max" when insns[pc:pc+3] is the raise-to triple `ldxdw rT, [rP+o]; jge rT, rV, +1;
    stxdw [rP+o], rV`, "min" for the lower-to triple (jle), entered only at pc; else None."""
    if pc < 0 or pc + 2 >= len(insns) or pc + 1 in targets or pc + 2 in targets:
        return None
    ld, j, stx = insns[pc], insns[pc + 1], insns[pc + 2]
    kind = _TRIPLE_JUMPS.get(j.opcode)
    ok = (kind is not None and ld.opcode == isa.BPF_LDX | isa.BPF_MEM | isa.BPF_DW
          and j.off == 1 and j.dst == ld.dst
          and stx.opcode == isa.BPF_STX | isa.BPF_MEM | isa.BPF_DW
          and stx.dst == ld.src and stx.off == ld.off and stx.src == j.src and j.src != ld.dst)
    return kind if ok else None


def _max_triple(insns: Sequence[isa.Insn], pc: int, targets: Set[int]) -> bool:
    return _triple(insns, pc, targets) == "max"


def _reg_dead_after(insns: Sequence[isa.Insn], start: int, reg: int) -> bool:
    """`reg` is written before it is read on every path from `start`: both edges of a
    conditional jump are followed (a jump reads its operands), an instruction reached
    again adds no path; exit: dead unless it is r0; a call taking it as an argument (r1-r5)
    or a path off the end: not provably dead."""
    seen: Set[int] = set()
    todo = [start]
    while todo:
        pc = todo.pop()
        while pc not in seen:
            if not 0 <= pc < len(insns):
                return False
            seen.add(pc)
            ins = insns[pc]
            info = isa.OPCODES.get(ins.opcode)
            if info is None:
                return False
            if info.kind == "exit":
                if reg == 0:
                    return False
                break
            x = info.src == isa.BPF_X
            if info.kind == "jmp":
                if info.mnemonic != "ja" and (ins.dst == reg or (x and ins.src == reg)):
                    return False
                if info.mnemonic != "ja":
                    todo.append(pc + 1)               # the fall-through edge
                pc = pc + 1 + ins.off
                continue
            if info.kind == "call":
                if 1 <= reg <= 5:
                    return False
                if reg == 0:
                    break                             # clobbered unread on this path
                pc += 1
                continue
            if info.kind == "alu":
                reads = (ins.dst == reg and isa.ALU_OPS[info.op] != "mov") or (x and ins.src == reg)
            elif info.kind == "ldx":
                reads = ins.src == reg
            elif info.kind == "st":
                reads = ins.dst == reg
            elif info.kind in ("stx", "atomic"):
                reads = reg in (ins.dst, ins.src)
            else:                                            # ld_imm64
                reads = False
            if reads:
                return False
            if ins.dst == reg and info.kind in ("alu", "ldx", "ld_imm64"):
                break                                 # written: dead on this path
            pc += 2 if info.kind == "ld_imm64" else 1
    return True


def _null_edge(insns: Sequence[isa.Insn], pc: int, targets: Set[int]) -> Optional[Tuple[int, int]]:
    """The edge a null result of the lookup call at pc takes: the first instruction after it
    that is a jump, when that is `jeq/jne r0, 0` on a straight line entered only at pc
    and r0 is not written before it; else None."""
    j = pc + 1
    while j < len(insns) and j not in targets:
        ins = insns[j]
        info = isa.OPCODES.get(ins.opcode)
        if info is None or info.kind in ("exit", "call"):
            return None
        if info.kind == "jmp":
            if (info.is64 and info.src == isa.BPF_K and ins.dst == 0 and ins.imm == 0 and ins.off != 0
                    and info.op in (isa.BPF_JEQ, isa.BPF_JNE)):
                return (j, j + 1 + ins.off) if info.op == isa.BPF_JEQ else (j, j + 1)
            return None
        if ins.dst == 0 and info.kind in ("alu", "ldx", "ld_imm64"):
            return None
        j += 2 if info.kind == "ld_imm64" else 1
    return None


def _insert_path(insns: Sequence[isa.Insn], pc: int, m: int, calls, targets: Set[int],
                 key_at: Optional[Dict[int, Set[Optional[int]]]] = None, key_size: int = 8) -> Optional[int]:
    """The lookup-or-insert's second lookup, when the null edge of the lookup of map m at
    pc leads, on a straight line, only to register ops, loads, stack stores that leave the
    key's bytes alone, m's insert and a second lookup of m -- both of the same stack key
    (key_at: the verifier's r2 per call) -- whose non-null edge goes where pc's goes (so a
    shadow that never returns null skips only what the insert would have done); else None."""
    e = _null_edge(insns, pc, targets)
    if e is None:
        return None
    key = key_at.get(pc, {None}) if key_at is not None else {0}
    if len(key) != 1 or None in key:
        return None
    (koff,) = key

    def same_key(k: int) -> bool:
        return key_at is None or key_at.get(k) == {koff}
    nonnull = [s for s in _cfg.successors(insns, e[0]) if s != e[1]]
    k, inserted = e[1], False
    while k < len(insns):
        if k != e[1] and k in targets:
            return None                                  # entered from elsewhere too
        ins = insns[k]
        info = isa.OPCODES.get(ins.opcode)
        if info is None:
            return None
        if info.kind == "call":
            what = {(name, mm) for name, mm, _, _ in calls.get(k, ())}
            if what == {("map_update_elem", m)} and not inserted and same_key(k):
                inserted = True
            elif what == {("map_lookup_elem", m)} and inserted and same_key(k):
                e2 = _null_edge(insns, k, targets)
                ok = e2 is not None and [s for s in _cfg.successors(insns, e2[0]) if s != e2[1]] == nonnull
                return k if ok else None
            else:
                return None
        elif info.kind in ("st", "stx"):
            if ins.dst != 10:
                return None                              # stores: the stack only
            if ins.off < koff + key_size and koff < ins.off + info.size:
                return None                              # ... and not over the key
        elif info.kind not in ("alu", "ldx", "ld_imm64"):
            return None
        k += 2 if info.kind == "ld_imm64" else 1
    return None


def _most_per_run(insns: Sequence[isa.Insn], graph, sites: Set[int], lookups: Set[int],
                  targets: Set[int]) -> Tuple[int, int]:
    """(most shadow accesses -- calls at `sites` -- one run can make, the site where a path
    first makes that many), over the CFG without the null edges of the shadow's lookups
    (the shadow never returns null; a lookup-or-insert's second lookup is on that edge)."""
    pruned = {e for e in (_null_edge(insns, pc, targets) for pc in lookups) if e is not None}
    inc: Dict[int, int] = {0: 0}
    best, where = 0, -1
    for pc in graph.order:
        cur = inc.get(pc)
        if cur is None:
            continue                                     # reached only through pruned edges
        if pc in sites:
            cur += 1
            if cur > best:
                best, where = cur, pc
        for s in graph.succ.get(pc, ()):
            if (pc, s) not in pruned:
                inc[s] = max(inc.get(s, 0), cur)
    return best, where


def analyse(prog: Program, maps: Sequence[MapDef]) -> InlinePlan:
    """The inline plan of a verified program (see the module doc)."""
    return study(prog, maps).plan


def _plan(prog: Program, maps: Sequence[MapDef], f: _Facts) -> InlinePlan:
    insns = prog.insns
    targets = _jump_targets(insns)
    used_maps: Set[int] = set()
    update_ok: Dict[int, bool] = {}
    for pc, calls in sorted(f.calls.items()):
        for name, m, flags, zero in calls:
            if name in PURE_HELPERS:
                continue
            if name not in MAP_HELPERS:
                return InlinePlan(reason=f"insn {pc}: {name} keeps the program on the ring path")
            if m is None:
                return InlinePlan(reason=f"insn {pc}: {name} on an unknown map")
            used_maps.add(m)
            md = maps[m]
            if name == "hist_add":
                if not _reg_dead_after(insns, pc + 1, 0):
                    return InlinePlan(reason=f"insn {pc}: hist_add's return value is read")
            elif name == "map_update_elem":
                update_ok[m] = update_ok.get(m, True) and flags == NOEXIST and zero
            elif md.type in HIST_TYPES:
                return InlinePlan(reason=f"insn {pc}: map '{md.name}': a hist value read directly")
    ops: Dict[int, Dict[int, int]] = {}       # map -> word -> op
    for pc, accs in sorted(f.value_access.items()):
        for m, off, size, mode in accs:
            md = maps[m]
            if md.type != "hash":
                continue                      # arrays: ordinary helpers
            if off is None or size != 8 or off % 8 or off >= 16:
                return InlinePlan(reason=f"insn {pc}: map '{md.name}': value access at {off} size {size}")
            word = off // 8
            if mode == "atomic" and not insns[pc].imm & isa.ATOMIC_FETCH:
                op = ADD                      # (a fetch would read the shadow's partial value)
            elif mode == "read" and _max_triple(insns, pc, targets) and _reg_dead_after(insns, pc + 3, insns[pc].dst):
                op = MAX                      # (the value read must not be used past the triple)
            elif mode == "write" and pc >= 2 and _max_triple(insns, pc - 2, targets):
                op = MAX
            elif _triple(insns, pc if mode == "read" else pc - 2, targets) == "min":
                return InlinePlan(reason=f"insn {pc}: map '{md.name}': a min (the shadow combines adds and maxima)")
            else:
                return InlinePlan(reason=f"insn {pc}: map '{md.name}': value {mode} outside an add or max")
            prev = ops.setdefault(m, {}).setdefault(word, op)
            if prev != op:
                return InlinePlan(reason=f"map '{md.name}': value word {word} both added and raised")
    plan = InlinePlan()
    for m in sorted(used_maps):
        md = maps[m]
        if md.type in ("array", "per_worker_array"):
            continue
        if md.key_size > MAX_KEY:
            return InlinePlan(reason=f"map '{md.name}': {md.key_size}-byte keys (inline: <= {MAX_KEY})")
        if md.type in HIST_TYPES:
            n = md.value_size // 8
            plan.maps[m] = InlineMap(m, md.type, md.key_size, ADD, (md.lin_lo, md.lin_hi, md.lin_step, n))
        elif md.type == "hash":
            if md.value_size not in (8, 16):
                return InlinePlan(reason=f"map '{md.name}': {md.value_size}-byte values (inline: 8 or 16)")
            if m not in update_ok:            # the flush inserts every key looked up
                return InlinePlan(reason=f"map '{md.name}': looked up without a zero NOEXIST insert")
            if not update_ok[m]:
                return InlinePlan(reason=f"map '{md.name}': map_update_elem other than a zero NOEXIST insert")
            bits = 0
            for word, op in ops.get(m, {}).items():
                bits |= op << (2 * word)
            plan.maps[m] = InlineMap(m, "hash", md.key_size, bits)
        else:
            return InlinePlan(reason=f"map '{md.name}': type {md.type}")
    # one shadow access per run at most: the flush loses a refused key's events one per
    # entry event, which is one per run only then (two entries of one run: lost twice)
    sites = {pc for pc, calls in f.calls.items() for name, m, _, _ in calls
             if m in plan.maps and name in ("map_lookup_elem", "hist_add")}
    lookups = {pc for pc, calls in f.calls.items() for name, m, _, _ in calls
               if m in plan.maps and name == "map_lookup_elem"}
    # a shadow lookup never returns null: every one must be a lookup-or-insert's first
    # lookup (its null edge only inserts the key) or its second
    firsts: Dict[int, Optional[int]] = {}
    for pc in sorted(lookups):
        ms = {mm for name, mm, _, _ in f.calls[pc] if name == "map_lookup_elem"}
        mi = ms.pop() if len(ms) == 1 else None
        firsts[pc] = (_insert_path(insns, pc, mi, f.calls, targets, f.key_at, maps[mi].key_size)
                      if mi is not None else None)
    seconds = {k for k in firsts.values() if k is not None}
    for pc in sorted(lookups):
        if firsts[pc] is None and pc not in seconds:
            return InlinePlan(reason=f"insn {pc}: a lookup whose null result does more than insert the key "
                                     f"(the shadow never returns null)")
    most, where = _most_per_run(insns, f.graph, sites, lookups, targets)
    if most > 1:
        return InlinePlan(reason=f"insn {where}: {most} shadow map updates in one run (inline: at most one)")
    return plan


def _extremum_stores(prog: Program, f: _Facts) -> Dict[int, str]:
    insns, targets = prog.insns, _jump_targets(prog.insns)
    out: Dict[int, str] = {}
    for pc, accs in f.value_access.items():
        if pc < 2 or not any(mode == "write" for _, _, _, mode in accs):
            continue
        kind = _triple(insns, pc - 2, targets)
        if kind and _reg_dead_after(insns, pc + 1, insns[pc - 2].dst):
            out[pc] = kind
    return out


@dataclass
class ProgramFacts:
    """What a verified program does with map values and the context, from one walk of the
    verifier (`study`); the runtimes keep it per attached program.

    plan             the inline plan (`analyse`)
    extremum_stores  slot -> "max" / "min": each stxdw that ends a raise-to / lower-to
                     triple on a map value (entered only at its load, the loaded register
                     dead after it).  The device encodes them as an atomic max / min
                     (devicegen `stxdw_max` / `stxdw_min`): serially (the reference) the
                     triple IS a max or min; on the device, lanes and workers racing on one
                     key would otherwise keep an arbitrary one's value
    writes_values    a store into a map value without an atomic, other than those (a plain
                     assignment, a read-modify-write that is no triple): a warp must then run
                     its events one at a time (DTMK_PROG_F_SERIAL), as the reference does,
                     or two lanes of one key lose an update
    ctx_reads        bit i: the program reads context word i (bytes 4i..4i+3) on some path;
                     published per hook table (dtmk_hook_table.ctx_reads) for the
                     megakernel's lazy pre-signal hold (its default since session 9)
    A program the verifier refuses gets a refused plan, no extremum stores, no value
    writes and every context word (it is never attached anyway)."""
    plan: InlinePlan
    extremum_stores: Dict[int, str] = field(default_factory=dict)
    writes_values: bool = False
    ctx_reads: int = 0xFFFFFFFF


def study(prog: Program, maps: Sequence[MapDef]) -> ProgramFacts:
    """ProgramFacts of `prog` (one verifier walk)."""
    try:
        walk = verify(prog, maps, checker=_Facts).walk   # the verifier's walk with the inline notes
    except Exception as e:                    # noqa: BLE001 - not verifiable: never inline / attached
        return ProgramFacts(InlinePlan(reason=f"not verified: {e}"))
    return _program_facts(prog, maps, walk)


def verified(prog: Program, maps: Sequence[MapDef]) -> Tuple[VerifyResult, ProgramFacts]:
    """verify(prog, maps) and study(prog, maps) from ONE verifier walk (the device
    runtimes' attach: the walk is most of an attach's host time, hot attach <= 10 ms).
    Raises what verify raises.  Both are pure functions of the program's hook, type and
    instructions and of the maps' definitions, so an accepted program's answer is kept
    (_VERIFIED): device summaries attach the same monitor afresh for every window of
    steps, and re-walking it each time paced the GPU serving loop (~5 ms a program on the
    device image's host).  A rejected program is walked again each time (nothing kept)."""
    key = _verify_key(prog, maps)
    got = _VERIFIED.get(key)
    if got is None:
        res = verify(prog, maps, checker=_Facts)
        got = (replace(res, walk=None), _program_facts(prog, maps, res.walk))
        if len(_VERIFIED) >= _VERIFIED_CAP:
            _VERIFIED.pop(next(iter(_VERIFIED)))     # the oldest (insertion order)
        _VERIFIED[key] = got
    return got


#: verified()'s accepted programs: (hook, type, instructions, map definitions) -> answer
_VERIFIED: Dict[tuple, Tuple[VerifyResult, "ProgramFacts"]] = {}
_VERIFIED_CAP = 128


def _verify_key(prog: Program, maps: Sequence[MapDef]) -> tuple:
    return (prog.hook.id, prog.prog_type, tuple(prog.insns), tuple(astuple(m) for m in maps))


def _program_facts(prog: Program, maps: Sequence[MapDef], f: "_Facts") -> ProgramFacts:
    ext = _extremum_stores(prog, f)
    bits = 0
    for b in f.ctx_bytes:
        bits |= 1 << (b // 4)
    writes = any(mode == "write" and pc not in ext for pc, accs in f.value_access.items() for _, _, _, mode in accs)
    return ProgramFacts(_plan(prog, maps, f), ext, writes, bits)


def extremum_stores(prog: Program, maps: Sequence[MapDef]) -> Dict[int, str]:
    """ProgramFacts.extremum_stores of `prog`."""
    return study(prog, maps).extremum_stores


def ctx_reads(prog: Program, maps: Sequence[MapDef]) -> int:
    """ProgramFacts.ctx_reads of `prog`."""
    return study(prog, maps).ctx_reads


def writes_values(prog: Program, maps: Sequence[MapDef]) -> bool:
    """ProgramFacts.writes_values of `prog`."""
    return study(prog, maps).writes_values
