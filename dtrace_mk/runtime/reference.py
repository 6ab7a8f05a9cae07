"""The reference runtime: attach eBPF objects, fire hook contexts, account coverage.

This is the CPU runtime that the sim backend, `dtrace-mk run-vm` and the language tests
drive; the device runtime must produce the same maps, evidence and coverage.

    rt = ReferenceRuntime(num_workers=4)
    aid = rt.attach(obj)                              # verifies every program first
    rt.fire(context.pack("task:end", worker=1, dur_ns=1200, decode_step=0))
    rt.maps(aid)["counts"].snapshot(); rt.coverage(aid)

Per attachment: one MapSet (maps shared by the object's programs, one copy per worker
where the map type has copies), one TraceLog (trace_printk budget), one reference VM per
program, coverage rows per (program, hook, epoch, program_gen) (see bpf.coverage).

* The epoch of an event is `epoch=` if given, else the record's decode_step.
* `sample_every=N` runs every N-th eligible event of each program (the 1st, N+1-th, ...);
  the others count as throttled (reason "sampled").
* `max_per_epoch=N` (rate limit) runs at most N events per program per epoch (counted
  after sampling); the rest count as throttled (reason "rate_limit").
* program_gen: one counter per hook, bumped by every attach and detach that touches
  the hook (as the device bumps its program-table generation).
* A VM fault counts the event lost (reason "fault") and is kept in `faults(id)`; map
  changes the program made before the fault stay (as on the device).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ..abi import context
from ..abi import definition as abi
from ..bpf.coverage import LOST, THROTTLED, Coverage, CoverageTable, classify
from ..bpf.maps import MapSet, Record, RingBufMap
from ..bpf.program import BpfObject, Program
from ..bpf.vm import DEFAULT_TRACE_BUDGET, TraceLog, Vm, VMFault
from ..bpf.vmcompile import default_tier
from ..errors import Rejected, UserError

try:  # written concurrently; until it exists, attach(verify=True) says so
    from ..bpf.verifier import verify as _verify
except ImportError:  # pragma: no cover - depends on the tree's state
    _verify = None

# abi_version, hook, worker, decode_step in one unpack
_HEAD = struct.Struct("<II16xI28xI")
assert (context.OFF_HOOK, context.OFF_WORKER, context.OFF_DECODE_STEP) == (4, 24, 56)


class VerifierUnavailable(RuntimeError):
    """attach(verify=True) without a verifier in this build."""


@dataclass(slots=True)
class FireResult:
    """What one program did with one event."""
    attachment: int
    program: str
    outcome: str                    # coverage bucket: executed | throttled | lost
    r0: Optional[int] = None        # None when it did not run or faulted
    reasons: Tuple[str, ...] = ()
    fault: Optional[VMFault] = None


@dataclass
class _ProgState:
    program: Program
    vm: Vm
    seen: int = 0                   # eligible events so far (for sampling)
    ran: Dict[int, int] = field(default_factory=dict)    # epoch -> runs (for the rate limit)
    row: Optional[Coverage] = None                       # coverage row of the last event
    row_key: Tuple[int, int] = (-1, -1)                  # its (epoch, program_gen)


@dataclass
class Attachment:
    id: int
    obj: BpfObject
    maps: MapSet
    trace: TraceLog
    progs: List[_ProgState]
    sample_every: int
    max_per_epoch: Optional[int] = None
    first_epoch: int = 0            # events of earlier epochs are not eligible (the device's dtmk_prog field)
    end_epoch: int = 0              # ... nor of this epoch and later (0 = none; attach(replaces=))
    coverage: CoverageTable = field(default_factory=CoverageTable)
    faults: List[Tuple[str, int, VMFault]] = field(default_factory=list)   # (program, epoch, fault)
    evidence: List[Tuple[str, Record]] = field(default_factory=list)      # (map name, record)
    hints: List[Tuple[str, int, int, int]] = field(default_factory=list)   # (program, worker, epoch, hint)


def replaced_attachment(atts: Dict[int, object], replaces: Optional[int], first_epoch: int):
    """The attachment an attach(replaces=) ends at its successor's first epoch (a summary
    window: runtime/summary_windows.py), checked; None when none."""
    if replaces is None:
        return None
    pred = atts.get(replaces)
    if pred is None:
        raise UserError(f"attach: replaces={replaces}: no such attachment (attached ones: {sorted(atts)})")
    if first_epoch <= pred.first_epoch:
        raise UserError(f"attach: replaces={replaces}: first_epoch {first_epoch} must be after the replaced "
                        f"attachment's first epoch {pred.first_epoch}")
    return pred


def hooks_changed(progs, pred, first_epoch: int) -> Set[int]:
    """The hooks an attach changes (their program_gen moves once): those of its programs
    and, when it replaces `pred`, pred's, which stops counting at `first_epoch` (its
    end_epoch) in the same change.  `progs`, pred.progs: records with a `.program`."""
    hooks = {p.program.hook.id for p in progs}
    if pred is not None:
        pred.end_epoch = first_epoch
        hooks |= {p.program.hook.id for p in pred.progs}
    return hooks


#: first_epoch of an attachment that counts nothing until rearm() (a buffered device
#: query's idle map set: runtime/device_query.py); no decode step reaches it.
PARKED = (1 << 32) - 1


def rearmed_hooks(atts: Dict[int, object], aid: int, first_epoch: int, replaces: Optional[int]) -> Set[int]:
    """rearm(): attachment `aid` -- ended (its end_epoch passed) or parked -- counts the
    epochs >= first_epoch again, and `replaces` (when given) stops there, in one table
    change; checked, then applied.  The hooks whose tables change."""
    att = atts.get(aid)
    if att is None:
        raise UserError(f"rearm: no attachment {aid} (attached ones: {sorted(atts)})")
    if not att.end_epoch and att.first_epoch != PARKED:
        raise UserError(f"rearm: attachment {aid} still counts (from epoch {att.first_epoch} on, no end)")
    if not 0 <= first_epoch < PARKED or first_epoch < att.end_epoch:
        raise UserError(f"rearm: attachment {aid}: first_epoch {first_epoch} must be in "
                        f"{att.end_epoch}..{PARKED - 1} (it counted epochs before {att.end_epoch})")
    if replaces == aid:
        raise UserError(f"rearm: attachment {aid} cannot replace itself")
    pred = replaced_attachment(atts, replaces, first_epoch)
    att.first_epoch, att.end_epoch = first_epoch, 0
    return hooks_changed(att.progs, pred, first_epoch)


class ReferenceRuntime:
    def __init__(self, num_workers: int = 1, rank: int = 0, *, max_insns: int = abi.MAX_INSNS,
                 trace_budget_bytes: int = DEFAULT_TRACE_BUDGET, clock=None,
                 vm_tier: Optional[str] = None):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        # host VM tier of attached programs: compiled (default) or interp
        # ($DTRACE_MK_HOST_VM); both run the same semantics (bpf/vmcompile.py)
        self.vm_tier = vm_tier or default_tier()
        self.num_workers = num_workers
        self.rank = rank
        self.max_insns = max_insns
        self.trace_budget_bytes = trace_budget_bytes
        self.clock = clock
        self._next_id = 1
        self._attachments: Dict[int, Attachment] = {}
        self._detached: Dict[int, Attachment] = {}
        self._by_hook: Dict[int, List[Tuple[Attachment, _ProgState]]] = {h.id: [] for h in abi.HOOKS}
        self._gen: Dict[int, int] = {h.id: 0 for h in abi.HOOKS}

    # -- attach / detach -------------------------------------------------------------
    def attach(self, obj: BpfObject, verify: bool = True, *, sample_every: int = 1,
               programs: Optional[Sequence[str]] = None, max_per_epoch: Optional[int] = None,
               allow_reserved: bool = False, first_epoch: int = 0, replaces: Optional[int] = None) -> int:
        """Attach the object's programs (or the named ones) to their hooks.  Checks the
        ABI version, the map definitions, that each program type is attachable and (by
        default) verifies each program; raises LoadError/Rejected naming the problem.
        `first_epoch`: events of earlier epochs are not eligible (not counted anywhere), as
        the device's attach from a step boundary (runtime.device).  `replaces`: an
        attached attachment that counts no epoch >= first_epoch any more (its end_epoch: a
        summary window's predecessor), in the same change of the hooks' program_gen.
        `allow_reserved=True` (tests only) also attaches program types ABI v1 reserves
        (control), to exercise their helpers; no user-facing path sets it."""
        if obj.abi_version != abi.ABI_VERSION:
            raise UserError(f"{obj.path}: built for hook ABI v{obj.abi_version}, this runtime "
                            f"speaks v{abi.ABI_VERSION}")
        if sample_every < 1:
            raise UserError(f"sample_every must be >= 1, got {sample_every}")
        if max_per_epoch is not None and max_per_epoch < 0:
            raise UserError(f"max_per_epoch must be >= 0, got {max_per_epoch}")
        if not 0 <= first_epoch < (1 << 32):
            raise UserError(f"first_epoch must be in 0..{(1 << 32) - 1}, got {first_epoch}")
        pred = replaced_attachment(self._attachments, replaces, int(first_epoch))
        progs = list(obj.programs)
        if programs is not None:
            names = {p.name for p in progs}
            missing = [n for n in programs if n not in names]
            if missing:
                raise UserError(f"{obj.path}: no program named {', '.join(missing)}")
            progs = [p for p in progs if p.name in programs]
        if not progs:
            raise UserError(f"{obj.path}: no programs to attach")
        for p in progs:
            pt = abi.PROGRAM_TYPES_BY_NAME.get(p.prog_type)
            if pt is None or not (pt.attachable or allow_reserved):
                raise Rejected(f"{obj.path}: program '{p.name}': {p.prog_type} programs cannot "
                               f"be attached in ABI v{abi.ABI_VERSION}")
        if verify:
            if _verify is None:
                raise VerifierUnavailable("no verifier in this build (dtrace_mk.bpf.verifier.verify); "
                                          "attach with verify=False")
            for p in progs:
                try:
                    _verify(p, obj.maps)
                except Rejected as e:     # add the place: file, section, program
                    e.args = (f"{obj.path}: {p.section} {p.name}: {e}",)
                    raise
        maps = MapSet(obj.maps, self.num_workers)
        trace = TraceLog(self.trace_budget_bytes)
        states = [_ProgState(p, Vm(p, maps, max_insns=self.max_insns, trace=trace,
                                   prog_type=p.prog_type, clock=self.clock, tier=self.vm_tier))
                  for p in progs]
        aid = self._next_id
        self._next_id += 1
        att = Attachment(aid, obj, maps, trace, states, sample_every, max_per_epoch, int(first_epoch))
        self._attachments[aid] = att
        for st in states:
            self._by_hook[st.program.hook.id].append((att, st))
        for hid in hooks_changed(states, pred, att.first_epoch):
            self._gen[hid] += 1
        return aid

    def detach(self, aid: int) -> None:
        att = self._get(aid)
        for hid in {st.program.hook.id for st in att.progs}:
            self._by_hook[hid] = [(a, s) for (a, s) in self._by_hook[hid] if a is not att]
            self._gen[hid] += 1
        del self._attachments[aid]
        self._detached[aid] = att       # its maps and coverage stay readable

    def rearm(self, aid: int, first_epoch: int, replaces: Optional[int] = None) -> None:
        """Attachment `aid`, ended or parked (attached with first_epoch=PARKED), counts
        epochs >= first_epoch again (its maps as they are: the caller empties them);
        `replaces` stops counting there, in the same change (rearmed_hooks)."""
        for hid in rearmed_hooks(self._attachments, aid, int(first_epoch), replaces):
            self._gen[hid] += 1

    def forget(self, aid: int) -> None:
        """Drop a detached attachment (its maps, coverage and evidence): a caller that
        attaches and detaches for ever (runtime.summary_windows) keeps memory bounded."""
        if aid in self._attachments:
            raise UserError(f"forget: attachment {aid} is still attached (detach it first)")
        if self._detached.pop(aid, None) is None:
            raise KeyError(f"no attachment {aid}")

    def program_gen(self, hook: Union[str, int, abi.Hook]) -> int:
        return self._gen[context.hook_id(hook)]

    def attachments(self) -> List[int]:
        return list(self._attachments)

    # -- events ------------------------------------------------------------------------
    def fire(self, ctx: Union[bytes, bytearray, Mapping[str, Any]], epoch: Optional[int] = None
             ) -> List[FireResult]:
        """Run every program attached to the record's hook.  `ctx` is a 128-byte record or
        a dict for context.from_dict.  Raises UserError on a malformed record."""
        if type(ctx) is not bytes:
            if isinstance(ctx, (bytearray, memoryview)):
                ctx = bytes(ctx)
            else:
                try:
                    ctx = context.from_dict(ctx)
                except ValueError as e:
                    raise UserError(f"context: {e}") from None
        if len(ctx) != abi.CONTEXT_SIZE:
            raise UserError(f"context: context record is {len(ctx)} bytes, expected {abi.CONTEXT_SIZE}")
        version, hid, worker, step = _HEAD.unpack_from(ctx)
        if version != abi.ABI_VERSION or hid not in self._by_hook:
            try:
                context.check_record(ctx)
            except ValueError as e:
                raise UserError(f"context: {e}") from None
        targets = self._by_hook[hid]
        if not targets:
            return []
        if worker >= self.num_workers:
            raise UserError(f"context field 'worker': {worker} is out of range for "
                            f"{self.num_workers} workers")
        if epoch is None:
            epoch = step
        gen = self._gen[hid]
        hook_name = abi.HOOKS_BY_ID[hid].name
        out = []
        for att, st in targets:
            if epoch >= att.first_epoch and (not att.end_epoch or epoch < att.end_epoch):
                out.append(self._run_one(att, st, ctx, worker, epoch, gen, hook_name))
        return out

    def _run_one(self, att: Attachment, st: _ProgState, ctx: bytes, worker: int, epoch: int,
                 gen: int, hook_name: str) -> FireResult:
        name = st.program.name
        st.seen += 1
        if st.row_key == (epoch, gen):
            row = st.row
        else:
            row = st.row = att.coverage.row(name, hook_name, epoch, gen)
            st.row_key = (epoch, gen)
        if att.sample_every > 1 and (st.seen - 1) % att.sample_every:
            row.record(THROTTLED, ("sampled",))
            return FireResult(att.id, name, THROTTLED, None, ("sampled",))
        if att.max_per_epoch is not None:
            ran = st.ran.get(epoch, 0)
            if ran >= att.max_per_epoch:
                row.record(THROTTLED, ("rate_limit",))
                return FireResult(att.id, name, THROTTLED, None, ("rate_limit",))
            st.ran[epoch] = ran + 1
        vm = st.vm
        nhints = len(vm.hints)
        try:
            res = vm.run(ctx, worker=worker, epoch=epoch)
        except VMFault as e:
            att.faults.append((name, epoch, e))
            row.record(LOST, ("fault",))
            self._collect(att, st, nhints)
            return FireResult(att.id, name, LOST, None, ("fault",), e)
        outcome = classify(res.lost, res.throttled)
        reasons = tuple(res.lost) + tuple(res.throttled)
        row.record(outcome, reasons)
        self._collect(att, st, nhints)
        return FireResult(att.id, name, outcome, res.r0, reasons)

    def _collect(self, att: Attachment, st: _ProgState, nhints: int) -> None:
        if len(st.vm.hints) > nhints:
            att.hints.extend((st.program.name,) + h for h in st.vm.hints[nhints:])

    # -- results -----------------------------------------------------------------------
    def _get(self, aid: int) -> Attachment:
        att = self._attachments.get(aid) or self._detached.get(aid)
        if att is None:
            raise KeyError(f"no attachment {aid}")
        return att

    def attachment(self, aid: int) -> Attachment:
        return self._get(aid)

    def maps(self, aid: int) -> MapSet:
        return self._get(aid).maps

    def coverage(self, aid: int) -> List[Coverage]:
        att = self._get(aid)
        att.coverage.check()
        return att.coverage.rows()

    def coverage_table(self, aid: int) -> CoverageTable:
        return self._get(aid).coverage

    def evidence(self, aid: int, drain: bool = True) -> List[Tuple[str, Record]]:
        """Ring buffer records (map name, record) of the attachment.  drain=True empties
        the rings into the attachment's evidence list (which keeps everything drained)."""
        att = self._get(aid)
        if drain:
            for m in att.maps:
                if isinstance(m, RingBufMap):
                    att.evidence.extend((m.name, r) for r in m.drain())
            return list(att.evidence)
        pending = [(m.name, r) for m in att.maps if isinstance(m, RingBufMap) for r in m.snapshot()]
        return list(att.evidence) + pending

    def trace_lines(self, aid: int) -> List[str]:
        return self._get(aid).trace.texts()

    def hints(self, aid: int) -> List[Tuple[str, int, int, int]]:
        return list(self._get(aid).hints)

    def faults(self, aid: int) -> List[Tuple[str, int, VMFault]]:
        return list(self._get(aid).faults)


def replay(obj, records, num_workers: int):
    """(maps, coverage) of `obj` attached alone to a fresh reference runtime fed
    `records` (CTX_DTYPE rows, e.g. a GPU run's hook records, in order): what a device
    runtime must reproduce exactly over the same events."""
    from ..abi import definition as D
    rt = ReferenceRuntime(num_workers=num_workers)
    aid = rt.attach(obj)
    raw = records.tobytes()
    for i in range(len(records)):
        rt.fire(raw[i * D.CONTEXT_SIZE:(i + 1) * D.CONTEXT_SIZE])
    return rt.maps(aid), rt.coverage(aid)
