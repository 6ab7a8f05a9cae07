"""The verifier's case table: programs with their expected verdicts, discovered from
tests/bpf/verifier_cases/*.s (Linux selftests / PREVAIL style: the expectation sits
beside the program; adding a case is writing one program).  A failing case prints the
expected and the actual verdict and the program's listing.

A case file holds several cases; each starts with a header of `; key: value` lines, the first
being `; case:`, and runs until the next `; case:`.  Keys:

    ; case: <name>                      required, unique within the file
    ; hook: task:end                    hook name (default task:end)
    ; maps: NAME=TYPE,KEY,VALUE,ENTRIES[,field=value...] ...
                                        maps of the object, in index order
    ; type: control                     Program.prog_type (default observe)
    ; verify-as: control                the prog_type argument of verify()
    ; expect: accept
    ; expect: reject <substring of str(VerifierError)>
    ; max-path: N   ; stack-depth: N   ; helpers: ID,...   ; maps-used: IDX,...
                                        checked on accepted programs when given

The body is assembly for dtrace_mk.bpf.asm.assemble (labels work).  A line
`.insn OPCODE DST SRC OFF IMM` emits one raw slot (for encodings the assembler refuses),
and `.repeat N <insn>` emits an instruction N times.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf.asm import assemble
from dtrace_mk.bpf.isa import Insn
from dtrace_mk.bpf.program import MapDef, Program
from dtrace_mk.bpf.verifier import VerifierError, verify

CASE_DIR = Path(__file__).parent / "verifier_cases"
_HEADER = re.compile(r"^\s*;\s*([a-z][a-z-]*)\s*:\s*(.*?)\s*$")
_KEYS = {"case", "hook", "maps", "type", "verify-as", "expect", "max-path", "stack-depth",
         "helpers", "maps-used"}


@dataclass
class Case:
    file: str
    line: int
    name: str
    headers: Dict[str, str]
    body: List[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}:{self.name}"

    @property
    def accept(self) -> bool:
        return self.headers["expect"] == "accept"

    @property
    def reject_substring(self) -> Optional[str]:
        e = self.headers["expect"]
        return e[len("reject "):] if e.startswith("reject ") else None

    def maps(self) -> List[MapDef]:
        out = []
        for spec in self.headers.get("maps", "").split():
            name, rest = spec.split("=", 1)
            parts = rest.split(",")
            mtype, key, value, entries = parts[0], *map(int, parts[1:4])
            extra = {k: int(v) for k, v in (p.split("=") for p in parts[4:])}
            out.append(MapDef(name, mtype, key, value, entries, **extra))
        return out

    def program(self) -> Program:
        maps = [m.name for m in self.maps()]
        lines, raw, slot = [], {}, 0
        for text in self.body:
            s = text.strip()
            m = re.match(r"^\.repeat\s+(\d+)\s+(.*)$", s)
            if m:
                lines += [m.group(2)] * int(m.group(1))
                slot += int(m.group(1)) * _slots(m.group(2))
                continue
            if s.startswith(".insn"):
                op, dst, src, off, imm = (int(x, 0) for x in s.split()[1:])
                raw[slot] = Insn(op, dst, src, off, imm)
                text = "mov r0, 0   ; placeholder for a raw slot"
            lines.append(text)
            slot += _slots(text)
        insns = assemble("\n".join(lines), maps=maps)
        for at, ins in raw.items():
            insns[at] = ins
        hook = abi.hook(self.headers.get("hook", "task:end"))
        return Program(self.name, hook.section, hook, insns,
                       prog_type=self.headers.get("type", "observe"))


def _slots(text: str) -> int:
    """Slots a line of assembly takes: labels and comments 0, lddw 2, others 1."""
    s = re.split(r";|//", text)[0].strip()
    while True:
        m = re.match(r"^[A-Za-z_][\w.]*:\s*(.*)$", s)
        if not m:
            break
        s = m.group(1)
    if not s:
        return 0
    return 2 if s.split()[0].lower() == "lddw" else 1


def load_cases(directory: Path = CASE_DIR) -> List[Case]:
    cases: List[Case] = []
    for path in sorted(directory.glob("*.s")):
        cur: Optional[Case] = None
        in_header = False
        for ln, text in enumerate(path.read_text().splitlines(), 1):
            m = _HEADER.match(text)
            if m and m.group(1) == "case":
                cur = Case(path.name, ln, m.group(2), {"case": m.group(2)})
                cases.append(cur)
                in_header = True
                continue
            if cur is None:
                continue                       # file preamble
            if in_header and m and m.group(1) in _KEYS:
                cur.headers[m.group(1)] = m.group(2)
                continue
            in_header = False
            cur.body.append(text)
    for c in cases:
        if "expect" not in c.headers:
            raise ValueError(f"{c.id}: missing '; expect:' header")
    return cases


CASES = load_cases()


def test_table_is_large_enough():
    assert len(CASES) >= 80, len(CASES)
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids)


def test_every_rule_has_a_reject_case():
    from dtrace_mk.bpf.verifier.messages import RULES
    seen = set()
    for c in CASES:
        sub = c.reject_substring
        if sub:
            m = re.match(r"^(?:insn \d+: )?([a-z0-9-]+):", sub)
            assert m, f"{c.id}: expectation should start with 'insn N: rule:' or 'rule:'"
            seen.add(m.group(1))
    missing = sorted(set(RULES) - seen)
    assert not missing, f"rules without a reject case: {missing}"


def _listing(prog) -> str:
    from dtrace_mk.bpf.asm import disassemble
    return disassemble(prog.insns, numbered=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case):
    prog = case.program()
    maps = case.maps()
    try:
        res = verify(prog, maps, prog_type=case.headers.get("verify-as"))
        got = "accept"
    except VerifierError as e:
        res, got = None, f"reject {e}"
    if case.accept:
        assert got == "accept", (f"{case.id}\nexpected: accept\n     got: {got}\n"
                                 f"program:\n{_listing(prog)}")
        for key, attr in (("max-path", "max_path_insns"), ("stack-depth", "stack_depth")):
            if key in case.headers:
                assert getattr(res, attr) == int(case.headers[key]), (
                    f"{case.id}: {attr} expected {case.headers[key]}, got {getattr(res, attr)}")
        for key, attr in (("helpers", "helpers_used"), ("maps-used", "maps_used")):
            if key in case.headers:
                want = {int(x) for x in case.headers[key].split(",") if x.strip()}
                assert getattr(res, attr) == want, (
                    f"{case.id}: {attr} expected {sorted(want)}, got {sorted(getattr(res, attr))}")
    else:
        want = case.reject_substring
        assert got.startswith("reject ") and want in got[len("reject "):], (
            f"{case.id}\nexpected: reject ...{want}...\n     got: {got}\n"
            f"program:\n{_listing(prog)}")


ACCEPTED = [c for c in CASES if c.accept]


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_case_runs_in_the_reference_vm(case: Case):
    """Engine cross-check: every accepted case runs without a fault in the reference VM
    (all-zero and all-ones contexts, an existing and a missing hash key), within
    max_path_insns instructions."""
    from dtrace_mk.bpf import vm
    from dtrace_mk.bpf.maps import MapSet
    prog = case.program()
    res = verify(prog, case.maps(), prog_type=case.headers.get("verify-as"))
    for fill, populate in ((0x00, True), (0xFF, False), (0x01, True)):
        maps = MapSet(case.maps())
        if populate:
            for m in maps:
                if m.mdef.type == "hash":
                    m.update(bytes(m.mdef.key_size), bytes(m.mdef.value_size))
        machine = vm.Vm(prog, maps, prog_type=case.headers.get("verify-as") or prog.prog_type)
        try:
            run = machine.run(bytes([fill]) * abi.CONTEXT_SIZE, worker=0, epoch=0)
        except vm.VMFault as e:
            raise AssertionError(f"{case.id}: accepted program faulted in the VM: {e}\n"
                                 f"{_listing(prog)}") from None
        assert run.insns <= res.max_path_insns, (case.id, run.insns, res.max_path_insns)


def test_every_rule_is_documented():
    from dtrace_mk.bpf.verifier.messages import RULES
    doc = (Path(__file__).resolve().parents[2] / "docs" / "verifier.md").read_text()
    missing = [r for r in RULES if f"`{r}`" not in doc]
    assert not missing, f"rules missing from docs/verifier.md: {missing}"
