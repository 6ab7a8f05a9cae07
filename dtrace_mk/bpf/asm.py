"""Assembler (text -> slots) and disassembler (slots -> text) derived from isa.OPCODES.

Syntax (uBPF style, one instruction per line; `;`, `#` and `//` start comments):

    mov r0, 0            add32 r1, r2          neg r3            be16 r1
    ldxw r0, [r1+28]     stxdw [r10-8], r1     stw [r10-4], 7    xadddw [r0+0], r1
    lddw r1, 0x1122334455667788                lddw r1, map:counts
    lddw r1, map_value:stats+8                 lddw r1, map#0     (index form)
    jeq r1, 3, +2        jgt32 r1, r2, out     ja -4             call map_lookup_elem
    out:                 exit

Jump targets are signed slot offsets (`+2`) or labels.  `disassemble(assemble(t))`
is canonical text, and `assemble(disassemble(b)) == b` for every valid program.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from ..abi.definition import HELPERS_BY_ID, HELPERS_BY_NAME
from . import isa
from .isa import Insn, OPCODES, MNEMONICS


class AsmError(ValueError):
    """An assembly error naming the line."""

    def __init__(self, line_no: int, text: str, message: str):
        super().__init__(f"line {line_no}: {message}: {text.strip()}")
        self.line_no = line_no
        self.message = message


_REG = r"r(?:10|[0-9])"
_NUM = r"[-+]?(?:0x[0-9a-fA-F]+|[0-9]+)"
_MEM = re.compile(rf"^\[\s*({_REG})\s*(?:([-+])\s*(0x[0-9a-fA-F]+|[0-9]+))?\s*\]$")


def _reg(tok: str, ln: int, text: str) -> int:
    if not re.fullmatch(_REG, tok):
        raise AsmError(ln, text, f"expected a register r0..r10, got '{tok}'")
    return int(tok[1:])


def _num(tok: str, ln: int, text: str) -> int:
    if not re.fullmatch(_NUM, tok):
        raise AsmError(ln, text, f"expected a number, got '{tok}'")
    return int(tok, 0)


def _mem(tok: str, ln: int, text: str) -> Tuple[int, int]:
    m = _MEM.match(tok.replace(" ", ""))
    if not m:
        raise AsmError(ln, text, f"expected a memory operand like [r1+8], got '{tok}'")
    off = int(m.group(3), 0) if m.group(3) else 0
    if m.group(2) == "-":
        off = -off
    return int(m.group(1)[1:]), off


def _split_operands(rest: str) -> List[str]:
    out, depth, cur = [], 0, ""
    for ch in rest:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _strip_comment(line: str) -> str:
    for c in (";", "#", "//"):
        # '#' inside "map#3" is an operand, not a comment
        idx = line.find(c)
        while c == "#" and idx > 0 and line[idx - 1:idx].isalnum():
            idx = line.find(c, idx + 1)
        if idx >= 0:
            line = line[:idx]
    return line.strip()


_BYTE_SWAP = re.compile(r"^(le|be)(16|32|64)$")


def assemble(text: str, maps: Optional[Sequence[str]] = None) -> List[Insn]:
    """Assemble text into slots.  `maps` (names in object order) resolves `map:NAME` to
    an index; without it, names get indices in order of first use."""
    map_index: Dict[str, int] = {n: i for i, n in enumerate(maps or [])}
    lines: List[Tuple[int, str, str]] = []
    labels: Dict[str, int] = {}
    slot = 0
    for ln, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        while True:
            m = re.match(r"^([A-Za-z_][\w.]*):\s*(.*)$", line)
            if not m:
                break
            if m.group(1) in labels:
                raise AsmError(ln, raw, f"label '{m.group(1)}' defined twice")
            labels[m.group(1)] = slot
            line = m.group(2).strip()
        if not line:
            continue
        mnem = line.split(None, 1)[0].lower()
        lines.append((ln, raw, line))
        slot += 2 if mnem == "lddw" else 1

    out: List[Insn] = []
    for ln, raw, line in lines:
        parts = line.split(None, 1)
        mnem = parts[0].lower()
        ops = _split_operands(parts[1]) if len(parts) > 1 else []
        here = len(out)

        def target(tok: str) -> int:
            if tok in labels:
                return labels[tok] - here - 1
            v = _num(tok, ln, raw)
            return v

        def need(n: int) -> None:
            if len(ops) != n:
                raise AsmError(ln, raw, f"'{mnem}' takes {n} operand(s), got {len(ops)}")

        if mnem == "lddw":
            need(2)
            dst = _reg(ops[0], ln, raw)
            m = re.fullmatch(r"(map|map_value):([A-Za-z_.][\w.]*)(?:\+(\d+))?|map#(\d+)|map_value#(\d+)(?:\+(\d+))?", ops[1])
            if m:
                if m.group(4) is not None:
                    out += isa.lddw_map(dst, None, int(m.group(4)))
                    continue
                if m.group(5) is not None:
                    out += isa.lddw_map(dst, None, int(m.group(5)), isa.PSEUDO_MAP_VALUE, int(m.group(6) or 0))
                    continue
                name = m.group(2)
                if name not in map_index:
                    if maps is not None:
                        raise AsmError(ln, raw, f"unknown map '{name}'")
                    map_index[name] = len(map_index)
                pseudo = isa.PSEUDO_MAP_FD if m.group(1) == "map" else isa.PSEUDO_MAP_VALUE
                out += isa.lddw_map(dst, name, map_index[name], pseudo, int(m.group(3) or 0))
                continue
            out += isa.lddw(dst, _num(ops[1], ln, raw))
            continue

        bs = _BYTE_SWAP.match(mnem)
        if bs:
            need(1)
            info = MNEMONICS[(bs.group(1), isa.END_TO_LE if bs.group(1) == "le" else isa.END_TO_BE)]
            out.append(Insn(info.opcode, _reg(ops[0], ln, raw), 0, 0, int(bs.group(2))))
            continue

        if mnem == "exit":
            need(0)
            out.append(Insn(isa.BPF_JMP | isa.BPF_EXIT))
            continue
        if mnem == "call":
            need(1)
            h = HELPERS_BY_NAME.get(ops[0])
            out.append(Insn(isa.BPF_JMP | isa.BPF_CALL, imm=h.id if h else _num(ops[0], ln, raw)))
            continue
        if mnem == "ja":
            need(1)
            out.append(Insn(isa.BPF_JMP | isa.BPF_JA, off=target(ops[0])))
            continue

        atomic_fetch = mnem.endswith("_fetch")
        base = mnem[:-6] if atomic_fetch else mnem
        cand = [i for (mn, _src), i in MNEMONICS.items() if mn == base]
        if not cand:
            raise AsmError(ln, raw, f"unknown mnemonic '{mnem}'")
        kind = cand[0].kind
        if kind == "alu":
            if cand[0].op == isa.BPF_NEG:
                need(1)
                out.append(Insn(cand[0].opcode, _reg(ops[0], ln, raw)))
                continue
            need(2)
            dst = _reg(ops[0], ln, raw)
            if re.fullmatch(_REG, ops[1]):
                info = MNEMONICS[(base, isa.BPF_X)]
                out.append(Insn(info.opcode, dst, _reg(ops[1], ln, raw)))
            else:
                info = MNEMONICS[(base, isa.BPF_K)]
                out.append(Insn(info.opcode, dst, 0, 0, _imm32(_num(ops[1], ln, raw), ln, raw)))
        elif kind == "jmp":
            need(3)
            dst = _reg(ops[0], ln, raw)
            off = target(ops[2])
            if re.fullmatch(_REG, ops[1]):
                info = MNEMONICS[(base, isa.BPF_X)]
                out.append(Insn(info.opcode, dst, _reg(ops[1], ln, raw), _off16(off, ln, raw)))
            else:
                info = MNEMONICS[(base, isa.BPF_K)]
                out.append(Insn(info.opcode, dst, 0, _off16(off, ln, raw), _imm32(_num(ops[1], ln, raw), ln, raw)))
        elif kind == "ldx":
            need(2)
            dst = _reg(ops[0], ln, raw)
            src, off = _mem(ops[1], ln, raw)
            out.append(Insn(cand[0].opcode, dst, src, _off16(off, ln, raw)))
        elif kind in ("st", "stx", "atomic"):
            need(2)
            dst, off = _mem(ops[0], ln, raw)
            if kind == "st":
                out.append(Insn(cand[0].opcode, dst, 0, _off16(off, ln, raw), _imm32(_num(ops[1], ln, raw), ln, raw)))
            else:
                imm = (isa.ATOMIC_ADD | (isa.ATOMIC_FETCH if atomic_fetch else 0)) if kind == "atomic" else 0
                out.append(Insn(cand[0].opcode, dst, _reg(ops[1], ln, raw), _off16(off, ln, raw), imm))
        else:
            raise AsmError(ln, raw, f"unknown mnemonic '{mnem}'")
    return out


def _imm32(v: int, ln: int, raw: str) -> int:
    if not -(1 << 31) <= v < (1 << 32):
        raise AsmError(ln, raw, f"immediate {v} does not fit in 32 bits")
    return isa._s32(v)


def _off16(v: int, ln: int, raw: str) -> int:
    if not -(1 << 15) <= v < (1 << 15):
        raise AsmError(ln, raw, f"offset {v} does not fit in 16 bits")
    return v


def _fmt_off(off: int) -> str:
    return f"+{off}" if off >= 0 else str(off)


def _fmt_mem(reg: int, off: int) -> str:
    return f"[r{reg}{_fmt_off(off)}]"


def disassemble_insn(ins: Insn, map_names: Optional[Sequence[str]] = None) -> str:
    """One slot to text; continuation slots of lddw render as '' (callers skip them)."""
    info = OPCODES.get(ins.opcode)
    if info is None:
        return f".invalid 0x{ins.opcode:02x}"
    k = info.kind
    if k == "ld_imm64":
        if ins.src in (isa.PSEUDO_MAP_FD, isa.PSEUDO_MAP_VALUE):
            idx = ins.imm & 0xFFFFFFFF
            name = ins.map_ref or (map_names[idx] if map_names and idx < len(map_names) else None)
            voff = ((ins.imm64 or 0) >> 32) & 0xFFFFFFFF
            kind = "map" if ins.src == isa.PSEUDO_MAP_FD else "map_value"
            ref = f"{kind}:{name}" if name else f"{kind}#{idx}"
            if ins.src == isa.PSEUDO_MAP_VALUE and voff:
                ref += f"+{voff}"
            return f"lddw r{ins.dst}, {ref}"
        v = ins.imm64 if ins.imm64 is not None else ins.imm & 0xFFFFFFFF
        return f"lddw r{ins.dst}, 0x{v:x}"
    if k == "exit":
        return "exit"
    if k == "call":
        h = HELPERS_BY_ID.get(ins.imm)
        return f"call {h.name if h else ins.imm}"
    if k == "jmp" and info.op == isa.BPF_JA:
        return f"ja {_fmt_off(ins.off)}"
    if k == "alu":
        if info.op == isa.BPF_END:
            return f"{info.mnemonic}{ins.imm} r{ins.dst}"
        if info.op == isa.BPF_NEG:
            return f"{info.mnemonic} r{ins.dst}"
        rhs = f"r{ins.src}" if info.src == isa.BPF_X else str(ins.imm)
        return f"{info.mnemonic} r{ins.dst}, {rhs}"
    if k == "jmp":
        rhs = f"r{ins.src}" if info.src == isa.BPF_X else str(ins.imm)
        return f"{info.mnemonic} r{ins.dst}, {rhs}, {_fmt_off(ins.off)}"
    if k == "ldx":
        return f"{info.mnemonic} r{ins.dst}, {_fmt_mem(ins.src, ins.off)}"
    if k == "st":
        return f"{info.mnemonic} {_fmt_mem(ins.dst, ins.off)}, {ins.imm}"
    if k == "stx":
        return f"{info.mnemonic} {_fmt_mem(ins.dst, ins.off)}, r{ins.src}"
    if k == "atomic":
        sfx = "_fetch" if ins.imm & isa.ATOMIC_FETCH else ""
        return f"{info.mnemonic}{sfx} {_fmt_mem(ins.dst, ins.off)}, r{ins.src}"
    raise AssertionError(k)


def disassemble(insns: Sequence[Insn], map_names: Optional[Sequence[str]] = None,
                numbered: bool = False) -> str:
    lines = []
    for i, ins in enumerate(insns):
        if i > 0 and insns[i - 1].opcode == isa.LDDW:
            continue
        t = disassemble_insn(ins, map_names)
        lines.append(f"{i:4d}: {t}" if numbered else t)
    return "\n".join(lines) + ("\n" if lines else "")
