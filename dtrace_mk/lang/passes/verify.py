"""Pass 5, verify: `LoweredProgram` -> the same `LoweredProgram`, every program accepted.

Runs `dtrace_mk.bpf.verifier.verify` on each generated program.  A rejection is a
compiler bug or a limit (the language is meant to generate only safe code), but it is
shown to the user like any other error: the verifier's own message, attached to the
statement whose code the rejected instruction came from (LoweredProgram.origins).
"""
from __future__ import annotations

from ...errors import Rejected
from ..diagnostics import CompileError, Diagnostic
from .lower import LoweredProgram

try:  # written concurrently; without it the pass reports that nothing was verified
    from ...bpf.verifier import verify as _bpf_verify
except ImportError:  # pragma: no cover - depends on the tree's state
    _bpf_verify = None

AVAILABLE = _bpf_verify is not None


def verify(lp: LoweredProgram) -> LoweredProgram:
    """The pass (raises CompileError on a rejection; a no-op without a verifier)."""
    if _bpf_verify is None:
        return lp
    diags = []
    for prog in lp.obj.programs:
        try:
            _bpf_verify(prog, lp.obj.maps)
        except Rejected as e:
            pc = getattr(e, "pc", None)
            org = lp.origins.get(prog.name, [])
            span = org[pc] if pc is not None and 0 <= pc < len(org) and org[pc] else None
            if span is None:
                cl = lp.resolved.clauses[int(prog.name[1:].split("_", 1)[0])].clause
                span = cl.span
            diags.append(Diagnostic(span, f"the verifier rejected program '{prog.name}' "
                                          f"(probe '{prog.hook.name}'): {e}"))
    if diags:
        raise CompileError(diags)
    return lp
