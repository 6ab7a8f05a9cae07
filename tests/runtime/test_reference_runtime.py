"""The reference runtime: attach (verified by default), fire, coverage per epoch, program
generations, sampling, evidence and trace output."""
from pathlib import Path
import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm
from dtrace_mk.bpf.coverage import Coverage, CoverageError, CoverageTable, classify
from dtrace_mk.bpf.program import BpfObject, MapDef, Program
from dtrace_mk.errors import Rejected, UserError
from dtrace_mk.runtime.reference import ReferenceRuntime

COUNT_BY_CLASS = (Path(__file__).resolve().parents[2] / "examples" / "monitors" / "count_by_class.s").read_text()


def _obj(text=COUNT_BY_CLASS, hook="task:end", maps=None, name="count", prog_type="observe"):
    maps = maps if maps is not None else [MapDef("counts", "hash", 4, 8, 2)]
    h = abi.hook(hook)
    insns = asm.assemble(text, [m.name for m in maps])
    return BpfObject([Program(name, h.section, h, insns, prog_type)], maps)


def _ev(**kw):
    return context.pack("task:end", **kw)


def test_attach_verifies_by_default_and_fires():
    rt = ReferenceRuntime(num_workers=2)
    aid = rt.attach(_obj())
    for c in (1, 2, 1):
        res = rt.fire(_ev(task_class=c, worker=c % 2))
        assert [r.outcome for r in res] == ["executed"]
    assert rt.maps(aid)["counts"].snapshot() == {
        (1).to_bytes(4, "little"): (2).to_bytes(8, "little"),
        (2).to_bytes(4, "little"): (1).to_bytes(8, "little")}
    [cov] = rt.coverage(aid)
    assert (cov.program, cov.hook, cov.epoch, cov.program_gen) == ("count", "task:end", 0, 1)
    assert (cov.eligible, cov.executed, cov.throttled, cov.lost) == (3, 3, 0, 0)


def test_verifier_rejects_before_anything_is_attached():
    rt = ReferenceRuntime()
    bad = _obj("ldxdw r0, [r1+96]\nexit", hook="dep:wait", maps=[])   # dur_ns not valid on dep:wait
    with pytest.raises(Rejected):
        rt.attach(bad)
    assert rt.attachments() == [] and rt.program_gen("dep:wait") == 0


def test_other_hooks_do_not_fire_and_dicts_are_accepted():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj())
    assert rt.fire(context.pack("task:begin", task_class=1)) == []
    assert rt.fire({"hook": "task:end", "task_class": 1})[0].r0 == 0
    assert [c.eligible for c in rt.coverage(aid)] == [1]


def test_map_full_counts_lost_per_epoch():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj())
    for step, cls in [(0, 1), (0, 2), (0, 3), (1, 4), (1, 1)]:
        rt.fire(_ev(task_class=cls, decode_step=step))
    rows = {c.epoch: c for c in rt.coverage(aid)}
    assert (rows[0].eligible, rows[0].executed, rows[0].lost) == (3, 2, 1)
    assert (rows[1].eligible, rows[1].executed, rows[1].lost) == (2, 1, 1)
    assert rows[0].reasons == {"map_full:counts": 1}
    assert rt.maps(aid)["counts"].stats.lost == 2
    t = rt.coverage_table(aid).totals()
    assert (t.eligible, t.executed, t.throttled, t.lost) == (5, 3, 0, 2)


def test_epoch_argument_overrides_decode_step():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj())
    rt.fire(_ev(task_class=1, decode_step=3), epoch=9)
    assert [c.epoch for c in rt.coverage(aid)] == [9]


def test_sampling_counts_throttled():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj(), sample_every=4)
    out = [rt.fire(_ev(task_class=1))[0].outcome for _ in range(9)]
    assert out == ["executed", "throttled", "throttled", "throttled"] * 2 + ["executed"]
    [cov] = rt.coverage(aid)
    assert (cov.eligible, cov.executed, cov.throttled, cov.lost) == (9, 3, 6, 0)
    assert cov.reasons == {"sampled": 6}


def test_rate_limit_per_epoch_counts_throttled():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj(), max_per_epoch=2)
    out = [rt.fire(_ev(task_class=1, decode_step=s))[0].outcome for s in (0, 0, 0, 1, 1, 1, 1)]
    assert out == ["executed", "executed", "throttled", "executed", "executed", "throttled", "throttled"]
    rows = {c.epoch: c for c in rt.coverage(aid)}
    assert (rows[0].executed, rows[0].throttled) == (2, 1)
    assert (rows[1].executed, rows[1].throttled, rows[1].reasons) == (2, 2, {"rate_limit": 2})


def test_program_gen_bumps_on_attach_and_detach_and_splits_rows():
    rt = ReferenceRuntime()
    a = rt.attach(_obj())
    rt.fire(_ev(task_class=1))
    b = rt.attach(_obj(name="other"))
    assert rt.program_gen("task:end") == 2 and rt.program_gen("task:begin") == 0
    rt.fire(_ev(task_class=1))
    rt.detach(b)
    assert rt.program_gen("task:end") == 3
    rt.fire(_ev(task_class=1))
    assert [(c.program_gen, c.eligible) for c in rt.coverage(a)] == [(1, 1), (2, 1), (3, 1)]
    assert [(c.program_gen, c.eligible) for c in rt.coverage(b)] == [(2, 1)]   # still readable
    assert rt.attachments() == [a]


def test_fault_is_lost_and_kept():
    rt = ReferenceRuntime()
    aid = rt.attach(_obj("ldxw r0, [r1+200]\nexit", maps=[]), verify=False)
    [res] = rt.fire(_ev())
    assert res.outcome == "lost" and res.fault is not None
    assert "pc 0: load of 4 bytes at ctx+200" in str(rt.faults(aid)[0][2])
    [cov] = rt.coverage(aid)
    assert cov.lost == 1 and cov.reasons == {"fault": 1}


def test_evidence_and_trace_lines():
    maps = [MapDef("rb", "ringbuf", 0, 0, 4096, budget_bytes=8)]
    text = """
        ldxw r2, [r1+28]
        stxw [r10-8], r2
        stw [r10-4], 0
        lddw r1, map:rb
        mov r2, r10
        add r2, -8
        mov r3, 8
        mov r4, 0
        call ringbuf_output
        stw [r10-16], 0x00642563   ; "c%d"
        ldxw r3, [r10-8]
        mov r1, r10
        add r1, -16
        mov r2, 4
        mov r4, 0
        mov r5, 0
        call trace_printk
        mov r0, 0
        exit
    """
    rt = ReferenceRuntime(num_workers=1)
    aid = rt.attach(_obj(text, maps=maps))
    rt.fire(_ev(task_class=7))
    rt.fire(_ev(task_class=8))          # over the 8-byte ring budget: throttled
    ev = rt.evidence(aid)
    assert [(name, r.data[:4]) for name, r in ev] == [("rb", (7).to_bytes(4, "little"))]
    assert rt.evidence(aid) == ev                       # drained records are kept
    assert rt.trace_lines(aid) == ["c7", "c8"]
    [cov] = rt.coverage(aid)
    assert (cov.executed, cov.throttled) == (1, 1) and cov.reasons == {"ring_budget:rb": 1}


def test_attach_refusals():
    rt = ReferenceRuntime()
    with pytest.raises(Rejected, match="control programs cannot be attached"):
        rt.attach(_obj("mov r0, 0\nexit", maps=[], prog_type="control"), verify=False)
    obj = _obj()
    obj.abi_version = 2
    with pytest.raises(UserError, match="built for hook ABI v2"):
        rt.attach(obj)
    with pytest.raises(UserError, match="no program named nope"):
        rt.attach(_obj(), programs=["nope"])
    with pytest.raises(UserError, match="sample_every must be >= 1"):
        rt.attach(_obj(), sample_every=0)


def test_fire_rejects_bad_records():
    rt = ReferenceRuntime(num_workers=2)
    rt.attach(_obj())
    with pytest.raises(UserError, match="context field 'worker': 5 is out of range for 2 workers"):
        rt.fire(_ev(worker=5))
    with pytest.raises(UserError, match="context: context record is 3 bytes"):
        rt.fire(b"abc")
    with pytest.raises(UserError, match="context: field 'bogus'"):
        rt.fire({"hook": "task:end", "bogus": 1})


def test_coverage_invariant_and_precedence():
    assert classify(["x"], ["y"]) == "lost"
    assert classify([], ["y"]) == "throttled"
    assert classify() == "executed"
    t = CoverageTable()
    for o in ("executed", "lost", "throttled", "executed"):
        t.record("p", "task:end", 0, 1, o)
    t.check()
    [row] = t.rows()
    assert (row.eligible, row.executed, row.throttled, row.lost) == (4, 2, 1, 1)
    bad = Coverage("p", "task:end", 0, 1, eligible=3, executed=1)
    with pytest.raises(CoverageError, match="eligible 3 != executed 1"):
        bad.check()
    with pytest.raises(ValueError):
        row.record("bogus")


def test_coverage_table_retire_epochs():
    from dtrace_mk.bpf.coverage import CoverageTable
    t = CoverageTable()
    for epoch in (1, 2, 3):
        t.record("p", "task:end", epoch, 0, "executed")
    t.retire_epochs(2)
    assert [c.epoch for c in t.rows()] == [3]
    t.check()


def test_replay_of_context_rows_equals_firing_them_in_order():
    """runtime.reference.replay: what the GPU tests compare device maps against."""
    import numpy as np
    from dtrace_mk.runtime.reference import replay
    rows = np.frombuffer(b"".join(_ev(task_class=c, worker=c % 2, decode_step=s)
                                  for s in (0, 1) for c in (1, 2, 1, 3)), dtype=context.CTX_DTYPE)
    maps, cov = replay(_obj(), rows, 2)
    assert maps["counts"].snapshot() == {
        (1).to_bytes(4, "little"): (4).to_bytes(8, "little"),
        (2).to_bytes(4, "little"): (2).to_bytes(8, "little")}     # 3: the hash map (2) is full
    assert [(c.epoch, c.eligible, c.executed, c.lost) for c in cov] == [(0, 4, 3, 1), (1, 4, 3, 1)]
