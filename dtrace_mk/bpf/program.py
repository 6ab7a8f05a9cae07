"""The loaded-object model shared by the ELF loader, the language, the verifier and the VMs.

A `BpfObject` is what one `.o` file (clang-built or written by `dtrace_mk.lang`)
holds: programs (one per hook section), map definitions, license and ABI notes.
Inside a program, map references are LD_IMM64 pseudo instructions whose imm is an
index into `BpfObject.maps` (the loader relocates names to indices).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..abi import definition as abi
from ..errors import UserError
from .isa import Insn


class LoadError(UserError):
    """A problem with an object file or program, worded for the user: it names the file
    and the place (section, symbol, instruction) and what was expected."""


@dataclass
class MapDef:
    name: str
    type: str                  # an abi.MAP_TYPES name: "hash", "array", ...
    key_size: int
    value_size: int
    max_entries: int
    # hist_linear only: bucket range [lin_lo, lin_hi) in steps of lin_step
    lin_lo: int = 0
    lin_hi: int = 0
    lin_step: int = 0
    # ringbuf only: raw evidence bytes allowed per epoch (per worker)
    budget_bytes: int = 0
    # optional descriptions used only for printing (e.g. from BTF or the language)
    key_desc: Optional[str] = None
    value_desc: Optional[str] = None
    # internal maps made by the loader (".rodata": constants such as trace_printk
    # formats): an array whose single entry starts as `init_value`; programs may only
    # read it (the verifier refuses writes; VMs pre-fill entry 0)
    init_value: Optional[bytes] = None
    read_only: bool = False

    @property
    def type_id(self) -> int:
        return abi.MAP_TYPES_BY_NAME[self.type].id

    @property
    def hist_buckets(self) -> int:
        """Number of u64 buckets in a histogram value (0 for other map types)."""
        if self.type == "hist_log2":
            return abi.HIST_LOG2_BUCKETS
        if self.type == "hist_linear":
            return (self.lin_hi - self.lin_lo + self.lin_step - 1) // self.lin_step + 2
        return 0

    def validate(self) -> None:
        """Raise LoadError naming the map and field when a limit is broken."""
        where = f"map '{self.name}'"
        if self.type not in abi.MAP_TYPES_BY_NAME:
            raise LoadError(f"{where}: unknown map type '{self.type}' (expected one of "
                            f"{', '.join(abi.MAP_TYPES_BY_NAME)})")
        if not 1 <= self.max_entries <= abi.MAX_MAP_ENTRIES:
            raise LoadError(f"{where}: max_entries {self.max_entries} not in 1..{abi.MAX_MAP_ENTRIES}")
        if self.type == "ringbuf":
            if self.budget_bytes <= 0:
                raise LoadError(f"{where}: ringbuf needs budget_bytes > 0")
            return
        if self.type in ("array", "per_worker_array") and self.key_size != 4:
            raise LoadError(f"{where}: key_size must be 4 for {self.type}, got {self.key_size}")
        if not 1 <= self.key_size <= abi.MAX_KEY_SIZE:
            raise LoadError(f"{where}: key_size {self.key_size} not in 1..{abi.MAX_KEY_SIZE}")
        if self.type == "hist_linear":
            if self.lin_step <= 0 or self.lin_hi <= self.lin_lo:
                raise LoadError(f"{where}: hist_linear needs lin_lo < lin_hi and lin_step > 0, got "
                                f"{self.lin_lo}, {self.lin_hi}, {self.lin_step}")
            if self.hist_buckets > abi.HIST_LINEAR_MAX_BUCKETS:
                raise LoadError(f"{where}: {self.hist_buckets} linear buckets exceed "
                                f"{abi.HIST_LINEAR_MAX_BUCKETS}")
        if self.type in ("hist_log2", "hist_linear"):
            if self.value_size != 8 * self.hist_buckets:
                raise LoadError(f"{where}: value_size must be {8 * self.hist_buckets} "
                                f"({self.hist_buckets} u64 buckets), got {self.value_size}")
        if not 1 <= self.value_size <= abi.MAX_VALUE_SIZE:
            raise LoadError(f"{where}: value_size {self.value_size} not in 1..{abi.MAX_VALUE_SIZE}")


@dataclass(frozen=True)
class SourceLine:
    """Where an instruction came from (C monitors: .BTF.ext line info)."""
    file: str
    line: int
    col: int
    text: str = ""             # the source line, when the object carries it

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass
class Program:
    name: str                  # symbol name (C function or generated clause name)
    section: str               # "task/end"
    hook: abi.Hook
    insns: List[Insn]
    prog_type: str = "observe"
    # slot index -> source location, where known (not part of equality)
    lines: Dict[int, SourceLine] = field(default_factory=dict, compare=False, repr=False)

    @property
    def map_indices(self) -> List[int]:
        return sorted({i.imm & 0xFFFFFFFF for i in self.insns if i.is_lddw and i.src in (1, 2)})

    def source_at(self, pc: int) -> Optional[SourceLine]:
        """The source line of slot `pc`: the nearest line-info entry at or before it."""
        best = None
        for slot, loc in self.lines.items():
            if slot <= pc and loc.line > 0 and (best is None or slot > best[0]):
                best = (slot, loc)
        return best[1] if best else None


@dataclass
class BpfObject:
    programs: List[Program]
    maps: List[MapDef]
    license: str = ""
    abi_version: int = abi.ABI_VERSION
    schema_hash: Optional[str] = None   # task schema the object was compiled against
    path: str = "<memory>"
    notes: Dict[str, str] = field(default_factory=dict)

    def map_by_name(self, name: str) -> MapDef:
        for m in self.maps:
            if m.name == name:
                return m
        raise KeyError(name)

    def program(self, name: str) -> Program:
        for p in self.programs:
            if p.name == name:
                return p
        raise KeyError(name)
