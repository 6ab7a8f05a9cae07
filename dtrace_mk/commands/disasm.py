"""`dtrace-mk disasm FILE`: show what an eBPF object holds.

    dtrace-mk disasm mon.o          # ELF object: maps, then each program section, numbered
    dtrace-mk disasm prog.bin       # raw bytecode (8-byte slots): numbered instructions

For objects built with `clang -g`, the C source line of each instruction is shown as a
`;` comment where it changes.  Numbers are slot indices (an lddw takes two slots), the
ones the verifier's and the VM's messages use.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from ..bpf import asm, isa
from ..bpf.program import BpfObject, LoadError, MapDef, Program

NAME = "disasm"
ORDER = 22
HELP = "disassemble an eBPF object (.o) or raw bytecode (.bin): sections, maps, instructions"
DESCRIPTION = __doc__.split("\n\n", 1)[1]

ELF_MAGIC = b"\x7fELF"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="eBPF object (.o) or raw bytecode (.bin)")


def describe_map(i: int, m: MapDef) -> str:
    s = f"#{i} {m.name}: {m.type}"
    if m.type == "ringbuf":
        return s + f", {m.max_entries} bytes, budget {m.budget_bytes} bytes/epoch/worker"
    s += f", key {m.key_size} B, value {m.value_size} B, {m.max_entries} entries"
    if m.type == "hist_linear":
        s += f", buckets [{m.lin_lo}, {m.lin_hi}) step {m.lin_step}"
    if getattr(m, "read_only", False):
        s += ", read-only"
    return s


def program_lines(prog: Program, map_names: List[str]) -> List[str]:
    out, last = [], None
    insns = prog.insns
    for i, ins in enumerate(insns):
        if i > 0 and insns[i - 1].opcode == isa.LDDW:
            continue
        loc = prog.lines.get(i) if prog.lines else None
        if loc is not None and loc.line > 0 and (loc.file, loc.line) != last:
            last = (loc.file, loc.line)
            out.append(f"      ; {loc}" + (f": {loc.text.strip()}" if loc.text else ""))
        out.append(f"{i:6d}: {asm.disassemble_insn(ins, map_names)}")
    return out


def render_object(obj: BpfObject) -> str:
    lines = [f"{obj.path}: eBPF object, hook ABI v{obj.abi_version}"
             + (f", license {obj.license!r}" if obj.license else "")
             + (f", task schema {obj.schema_hash}" if obj.schema_hash else "")]
    names = [m.name for m in obj.maps]
    lines.append(f"maps ({len(obj.maps)}):")
    lines += [f"  {describe_map(i, m)}" for i, m in enumerate(obj.maps)] or ["  (none)"]
    for p in obj.programs:
        lines.append("")
        lines.append(f"section {p.section}: program {p.name} ({p.prog_type}, hook {p.hook.name}, "
                     f"{len(p.insns)} slots)")
        lines += program_lines(p, names)
    return "\n".join(lines) + "\n"


def render_raw(path: Path, data: bytes) -> str:
    try:
        insns = isa.decode(data)
    except ValueError as e:
        raise LoadError(f"{path}: {e}") from None
    prog = Program(path.stem, "", None, insns)      # hook unknown for raw bytecode
    return f"{path}: raw bytecode, {len(insns)} slots\n" + "\n".join(program_lines(prog, [])) + "\n"


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LoadError(f"{path}: cannot read: {e.strerror or e}") from None
    if data[:4] == ELF_MAGIC:
        from ..bpf.elf import load_object
        print(render_object(load_object(data, name=str(path))), end="")
    else:
        if not data:
            raise LoadError(f"{path}: empty file")
        print(render_raw(path, data), end="")
    return 0
