"""Every word the verifier says, in one place.

`RULES` is the list of rule ids with a one-line meaning (docs/verifier.md mirrors it).
`MESSAGES` holds the detail templates, keyed "rule" or "rule/variant"; `error()` builds
the one message format:

    insn {pc}: {rule}: {detail}        (instruction-level)
    {rule}: {detail}                   (program-level, pc is None)
"""
from __future__ import annotations

from typing import Optional

from ...errors import Rejected
from . import types as T

RULES = {
    # program level
    "empty-program": "a program has at least one instruction",
    "program-too-large": "a program has at most abi.MAX_INSNS (4096) slots",
    "prog-type-unknown": "the program type is one of abi.PROGRAM_TYPES",
    "prog-type-not-attachable": "control programs are not attachable to ABI v1 hooks unless requested explicitly",
    # instruction encoding
    "invalid-opcode": "the opcode byte is in the ISA table (isa.OPCODES)",
    "unused-field": "fields the opcode does not use are zero",
    "field-range": "off and imm fit their encoded widths (16 and 32 bits, signed)",
    "bad-register": "register numbers are r0..r10",
    "write-r10": "r10 (the frame pointer) is read-only",
    "invalid-imm": "immediates with a fixed meaning are valid (byte-swap width, atomic operation)",
    "shift-range": "a constant shift amount is below the operand width",
    "lddw-missing-slot": "lddw has a second slot",
    "lddw-second-slot": "the second slot of lddw has opcode, registers and offset zero",
    "lddw-pseudo": "lddw's src is 0 (constant), 1 (map) or 2 (map value)",
    "map-index": "a map reference names a map of the object",
    "map-value-ref": "lddw map_value references an array map at an offset inside its value",
    "jump-out-of-range": "jump targets lie inside the program",
    "jump-into-lddw": "no jump lands on the second slot of lddw",
    # control flow
    "unreachable": "every instruction is reachable from the entry",
    "back-edge": "the control-flow graph has no cycle (v1 rejects all loops)",
    "fall-off-end": "execution never runs past the last instruction",
    # registers and types
    "uninit-reg": "a register is written before it is read",
    "reg-type": "a register has one type on all paths that reach a use",
    "mem-not-pointer": "memory is accessed through a pointer (ctx, stack or map value)",
    "null-check": "a map_value_or_null is compared with 0 before it is used",
    # context
    "ctx-bounds": "ctx accesses lie inside the context record",
    "ctx-align": "ctx accesses are aligned to their size",
    "ctx-access": "a ctx load starts at a field's start and is no wider than the field",
    "ctx-field-invalid": "the field read is valid for the program's hook (reserved fields never)",
    "ctx-store": "the context is read-only",
    "ctx-arith": "ctx pointers move only by constants",
    "ctx-leak": "the ctx pointer is never stored, passed to a helper or returned",
    # stack
    "stack-bounds": "stack accesses lie in [r10-512, r10)",
    "stack-align": "stack accesses are aligned to their size",
    "stack-uninit-read": "stack bytes are written before they are read",
    "spill-partial-read": "a spilled pointer is read back whole (8 bytes)",
    "stack-var-offset": "stack pointers move only by constants",
    # map values
    "map-value-bounds": "map value accesses lie inside value_size for every possible offset",
    "map-value-align": "map value accesses are aligned to their size for every possible offset",
    "atomic-target": "atomic add targets map values",
    # pointers
    "pointer-arith": "pointers take only add/sub of scalars (no other ALU, no ALU32)",
    "pointer-compare": "pointers are compared only with 0 (null checks of map values)",
    "pointer-leak": "pointers are not stored into map values, stored narrower than 8 bytes or passed as scalar helper arguments",
    # helpers
    "helper-unknown": "call targets are helpers of abi.HELPERS",
    "helper-not-allowed": "the helper is allowed for the program type",
    "helper-arg": "helper arguments have the kinds abi.Helper.args states",
    "helper-map-type": "the map passed suits the helper (no lookup on a ringbuf, hist_add on a hist map, ...)",
    "helper-mem": "memory passed to a helper is initialised and in bounds",
    "helper-size": "a size argument is a constant in 1..512",
    # exit
    "exit-r0": "r0 holds an initialised scalar at exit",
}

MESSAGES = {
    "empty-program": "program '{name}' has no instructions",
    "program-too-large": "program '{name}' has {n} slots, more than the limit of {limit}",
    "prog-type-unknown": "unknown program type '{ptype}' (expected one of {known})",
    "prog-type-not-attachable": "control programs are not attachable in ABI v1 (hook {hook}); "
                                "pass prog_type='control' to verify one explicitly",
    "invalid-opcode": "invalid opcode {opcode:#04x}",
    "invalid-opcode/cont": "opcode 0x00 outside the second slot of an lddw",
    "unused-field": "{mnemonic} does not use {field}, which must be 0 (got {value})",
    "unused-field/call": "call with src={value}: only helper calls (src=0) are supported",
    "field-range": "{field} {value} does not fit in {bits} bits",
    "bad-register": "{mnemonic} uses r{reg} as {field}; registers are r0..r10",
    "write-r10": "{mnemonic} writes r10, the read-only frame pointer",
    "invalid-imm/swap": "{mnemonic} width {imm} is not 16, 32 or 64",
    "invalid-imm/atomic": "atomic operation {imm:#x} is not add (0x00) or fetch-add (0x01)",
    "shift-range": "{mnemonic} by {imm} is out of range 0..{maxshift}",
    "lddw-missing-slot": "lddw in the last slot has no second slot",
    "lddw-second-slot": "second slot of the lddw at insn {first} must have opcode, registers "
                        "and offset 0 (got opcode {opcode:#04x}, dst r{dst}, src r{src}, off {off})",
    "lddw-pseudo": "lddw src={src} is not a known pseudo source (0 constant, 1 map, 2 map value)",
    "map-index": "map index {index} out of range: the object has {count} map(s)",
    "map-value-ref/type": "lddw map_value needs an array map; map '{map}' is {mtype}",
    "map-value-ref/off": "lddw map_value offset {off} outside value_size {vsize} of map '{map}'",
    "jump-out-of-range": "jump to insn {target} is outside the program (0..{last})",
    "jump-into-lddw": "jump to insn {target}, the second slot of an lddw",
    "unreachable": "insn {at} is unreachable",
    "back-edge": "jump back to insn {target} forms a loop; loops are not allowed in v1",
    "fall-off-end": "execution falls off the end of the program after insn {at}",
    "uninit-reg": "r{reg} is read before it is written",
    "reg-type": "r{reg} has different types on the paths reaching here ({kinds})",
    "mem-not-pointer": "{access} through r{reg}, which is {what}, not a pointer to memory",
    "null-check": "r{reg} may be NULL ({what}); compare it with 0 before {use}",
    "ctx-bounds": "{access} of ctx{off:+d} ({size} bytes) is outside the context record (0..{limit})",
    "ctx-align": "{access} of ctx{off:+d} ({size} bytes) is not aligned to {size}",
    "ctx-access": "read of ctx{off:+d} ({size} bytes) is not a load of field {field} "
                  "(offset {foff}, {fsize} bytes) from its start",
    "ctx-field-invalid": "read of ctx{off:+d} ({field}, {size} bytes) is not valid for hook "
                         "{hook} (valid: {valid})",
    "ctx-field-invalid/reserved": "read of ctx{off:+d} ({field}, {size} bytes): reserved fields "
                                  "are never readable",
    "ctx-store": "{access} to ctx{off:+d}: the context is read-only",
    "ctx-arith": "{op} of {what} to the ctx pointer r{reg}; ctx pointers move only by constants",
    "ctx-leak": "ctx pointer r{reg} {use}; it may only be used for loads",
    "stack-bounds": "{access} of fp{off:+d} ({size} bytes) is outside the stack [fp-512, fp)",
    "stack-align": "{access} of fp{off:+d} ({size} bytes) is not aligned to {size}",
    "stack-uninit-read": "{access} of fp{off:+d} ({size} bytes) reads uninitialised stack at fp{first:+d}",
    "spill-partial-read": "read of fp{off:+d} ({size} bytes) reads part of a spilled {what} at fp{slot:+d}",
    "stack-var-offset": "{op} of {what} to the stack pointer r{reg}; stack pointers move only by constants",
    "map-value-bounds": "access [r{reg}{off}, {size} bytes] outside value_size {vsize} of map '{map}'",
    "map-value-align": "access [r{reg}{off}, {size} bytes] of map '{map}' is not provably aligned to {size}",
    "atomic-target": "atomic add through r{reg}, which is {what}; atomics target map values",
    "pointer-arith": "{op} on r{reg}, which is {what}; pointers take only add/sub of scalars",
    "pointer-arith/null": "{op} on r{reg}, which may be NULL ({what}); null-check it first",
    "pointer-compare": "{op} compares r{reg} ({what}) with {other}; pointers are only compared with 0",
    "pointer-leak/store": "storing r{reg} ({what}) {where} would leak a pointer",
    "pointer-leak/narrow": "{mnemonic} stores {size} bytes of r{reg} ({what}); pointers are spilled with 8-byte stores only",
    "pointer-leak/arg": "r{reg} ({what}) passed as scalar argument {arg} of {helper}",
    "helper-unknown": "call to unknown helper id {id}",
    "helper-not-allowed": "helper {helper} (id {id}) is not allowed in {ptype} programs (allowed: {allowed})",
    "helper-arg": "argument {arg} of {helper} (r{reg}) must be {expected}, got {what}",
    "helper-map-type": "{helper} needs {expected}; map '{map}' is {mtype}",
    "helper-mem/bounds": "argument {arg} of {helper}: {size} bytes at {where} are out of bounds ({bounds})",
    "helper-mem/uninit": "argument {arg} of {helper}: {size} bytes at fp{off:+d} are not initialised (fp{first:+d})",
    "helper-mem/pointer": "argument {arg} of {helper}: {size} bytes at fp{off:+d} contain a spilled pointer at fp{slot:+d}",
    "helper-size": "argument {arg} of {helper} (r{reg}) must be a constant size in 1..{limit}, got {what}",
    "exit-r0": "r0 is {what} at exit; programs return an initialised scalar",
}

assert all(k.split("/")[0] in RULES for k in MESSAGES), "a message key names an unknown rule"


class VerifierError(Rejected):
    """A program the verifier rejected: `pc` (slot index or None), `rule` (kebab id),
    `detail`; str(e) is "insn {pc}: {rule}: {detail}" or "{rule}: {detail}"."""

    def __init__(self, pc: Optional[int], rule: str, detail: str):
        self.pc, self.rule, self.detail = pc, rule, detail
        super().__init__(f"insn {pc}: {rule}: {detail}" if pc is not None else f"{rule}: {detail}")


def error(pc: Optional[int], key: str, **kw) -> VerifierError:
    return VerifierError(pc, key.split("/")[0], MESSAGES[key].format(**kw))


# --------------------------------------------------------------------------- wording of values

def describe(r: "T.Reg", maps=None) -> str:
    """A register's type in words: 'scalar 5', 'stack pointer fp-16', ..."""
    k = r.kind
    mname = (f"'{maps[r.map].name}'" if maps is not None and r.map is not None
             and r.map < len(maps) else f"#{r.map}")
    if k == T.UNINIT:
        return "uninitialised"
    if k == T.SCALAR:
        return r.num.describe()
    if k == T.CTX:
        return f"ctx pointer ctx{offset_text(r.off)}"
    if k == T.STACK:
        return f"stack pointer fp{offset_text(r.off)}"
    if k == T.MAP_PTR:
        return f"map pointer {mname}"
    if k == T.MAP_VALUE:
        return f"map value pointer {mname}{offset_text(r.off)}"
    if k == T.MAP_VALUE_OR_NULL:
        return f"map_value_or_null of map {mname}"
    return "mixed types (" + ", ".join(r.kinds) + ")"


def offset_text(off) -> str:
    """'+8', '-16' or '+[0, 56]' for an offset Scalar."""
    c = off.const
    if c is not None:
        from .scalar import to_signed
        return f"{to_signed(c):+d}"
    return f"+[{off.smin}, {off.smax}]"
