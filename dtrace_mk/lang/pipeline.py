"""The compiler pipeline: query text -> verified `BpfObject` + printing plan.

One ordered list of passes.  Each pass is a function in `dtrace_mk/lang/passes/<name>.py`
with a typed input and output; none prints, all report `CompileError`s with source
spans, and `compile_query` renders them in one place (`diagnostics.render`).

Why this order:

1. parse    Source -> ast.Program.  Pure syntax; needs nothing else.
2. resolve  ast.Program -> ResolvedProgram.  Needs the whole tree first: map
            aggregations are checked across clauses (a map used with two aggregations
            in different clauses), print(@m) may name a map defined later, and the
            probes of a clause decide which fields are valid in it.
3. fold     ResolvedProgram -> ResolvedProgram, constant expressions folded.  After
            resolve (names, FLAG_* constants and schema ids are only constants once
            resolved) and before lower: the verifier rejects unreachable code, so a
            constant condition must never reach code generation as a branch.
4. lower    ResolvedProgram -> LoweredProgram.  Needs resolved fields (offsets, sizes),
            schema ids for names and the final map table (sizes and types come from
            every use of a map), so it runs after resolve and never reports user errors
            other than limits (registers, stack, instructions).
5. verify   LoweredProgram -> LoweredProgram.  Needs the finished programs and maps;
            last, so a rejection is mapped back through the origins lower recorded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from ..abi.schema import TaskSchema, default_schema, load_schema
from ..bpf import asm
from ..bpf.program import BpfObject
from .diagnostics import CompileError, Source
from .passes import fold as _fold
from .passes import lower as _lower
from .passes import parse as _parse
from .passes import resolve as _resolve
from .passes import verify as _verify
from .passes.lower import NOTE_PLAN, LoweredProgram, Options


@dataclass
class Context:
    """What every pass may read besides its input."""
    source: Source
    schema: TaskSchema
    options: Options


# The pipeline: (name, pass) in order; each pass takes the previous pass's output.
PASSES: List[Tuple[str, Callable]] = [
    ("parse", lambda _none, c: _parse.parse(c.source)),                 # Source -> ast.Program
    ("resolve", lambda tree, c: _resolve.resolve(tree, c.source, c.schema)),  # -> ResolvedProgram
    ("fold", lambda rp, c: _fold.fold_program(rp)),                   # -> ResolvedProgram
    ("lower", lambda rp, c: _lower.lower(rp, c.options)),              # -> LoweredProgram
    ("verify", lambda lp, c: _verify.verify(lp)),                      # -> LoweredProgram
]


@dataclass
class CompileResult:
    source: Source
    obj: BpfObject
    plan: dict
    lowered: LoweredProgram

    def disassembly(self) -> str:
        """Every program's instructions (dtrace_mk.bpf.asm.disassemble), with headers."""
        out = []
        names = [m.name for m in self.obj.maps]
        for p in self.obj.programs:
            out.append(f"{p.name} ({p.section}, {len(p.insns)} insns):")
            out.append(asm.disassemble(p.insns, names, numbered=True).rstrip("\n"))
        return "\n".join(out) + "\n"


def compile_query(text: str, schema: Optional[TaskSchema] = None, *, name: str = "<query>",
                  options: Optional[Options] = None, verify: bool = True) -> CompileResult:
    """Compile a query.  Raises CompileError whose str() is the full rendering."""
    src = Source(text, name)
    ctx = Context(src, schema or default_schema(), options or Options())
    x = None
    try:
        for pass_name, run in PASSES:
            if pass_name == "verify" and not verify:
                continue
            x = run(x, ctx)
    except CompileError as e:
        raise e.with_source(src) from None
    return CompileResult(src, x.obj, x.plan, x)


def plan_of(obj: BpfObject) -> Optional[dict]:
    """The printing plan embedded in an object (None for a clang-built monitor)."""
    text = (obj.notes or {}).get(NOTE_PLAN)
    return json.loads(text) if text else None


def load_query_source(expr: Optional[str], path: Optional[str]) -> Source:
    """-e QUERY or a file: the Source to compile (UserError when the file is unreadable)."""
    from ..errors import UserError
    if expr is not None:
        return Source(expr, "<query>")
    try:
        return Source(Path(path).read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise UserError(f"{path}: cannot read query: {e.strerror or e}") from None


def schema_from(path: Optional[str]) -> TaskSchema:
    return load_schema(path) if path else default_schema()
