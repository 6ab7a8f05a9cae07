"""runtime/aggdesc.py: which verified programs reduce to aggregation descriptors, what
they are (tables of queries with the exact descriptors or the exact reason), and that
applying the descriptors equals the reference VM's run on the same records (golden
summary and random aggregation queries)."""
from __future__ import annotations

import random
import re

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf.maps import MapSet
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.runtime import aggdesc as A
from dtrace_mk.runtime.aggdesc import ADD, HIST, MAX, Agg, Case, Const, Ctx, Guard, Worker
from dtrace_mk.runtime.inline import study
from dtrace_mk.runtime.live import SUMMARY_QUERY
from dtrace_mk.runtime.reference import ReferenceRuntime
from tests.runtime.test_inline import EPI, LOOKUP_OR_INSERT, hook_contexts, random_query

W = 4


def _field(name):
    f = abi.FIELDS_BY_NAME[name]
    return Ctx(f.offset, {"u32": 4, "u64": 8}[f.ctype])


CLASS, WORKER, LAYER, DUR, WAIT, DEPTH = map(_field, ("task_class", "worker", "layer", "dur_ns", "wait_ns", "queue_depth"))


def _plans(query):
    obj = compile_query(query, None, name="<t>").obj
    return {p.name: A.reduce(p, obj.maps, study(p, obj.maps)) for p in obj.programs}


def test_context_offsets_used_here_are_the_abi_s():
    rec = context.pack("task:end", worker=3, task_class=5, layer=2, dur_ns=7)
    f = lambda c: A.scalar_value(c, rec, 0)   # noqa: E731
    assert (f(WORKER), f(CLASS), f(LAYER), f(DUR), f(Const(9)), A.scalar_value(Worker(), rec, 2)) == (3, 5, 2, 7, 9, 2)


def test_the_summary_reduces_to_three_descriptors():
    plans = _plans(SUMMARY_QUERY)
    assert {n: p.aggs for n, p in plans.items()} == {
        "c0_task_end": (Agg(HIST, 0, ((CLASS, 8),), DUR),),          # @lat[class] = hist(dur_ns)
        "c1_dep_release": (Agg(ADD, 1, ((CLASS, 8),), WAIT),),       # @dep_wait[class] = sum(wait_ns)
        "c2_task_ready": (Agg(MAX, 2, ((WORKER, 8),), DEPTH),),      # @queue[worker] = max(depth)
    }


REDUCE = [
    ("task:end { @n[task.class] = count(); }", (Agg(ADD, 0, ((CLASS, 8),), Const(1)),)),
    ("task:end { @n[5] = count(); }", (Agg(ADD, 0, ((Const(5), 8),), Const(1)),)),        # a constant key
    ("task:end { @a[worker] = avg(task.dur_ns); }",                                       # avg = count, sum
     (Agg(ADD, 0, ((WORKER, 8),), Const(1), 0), Agg(ADD, 0, ((WORKER, 8),), DUR, 1))),
    ("task:end { @h[task.layer] = lhist(task.dur_ns, 0, 1000, 100); }", (Agg(HIST, 0, ((LAYER, 8),), DUR),)),
]


@pytest.mark.parametrize("query,aggs", REDUCE, ids=[q[:40] for q, _ in REDUCE])
def test_queries_that_reduce(query, aggs):
    (plan,) = _plans(query).values()
    assert plan.ok, plan.reason
    assert plan.aggs == aggs


GUARDED = [
    # /pred/ compiles to "skip when not pred": the case that updates carries the guards
    ("task:end /task.class != 2/ { @n[worker] = count(); }",
     (Case((Guard(CLASS, "jeq", 2, True, False),), (Agg(ADD, 0, ((WORKER, 8),), Const(1)),)),)),
    ("task:end /worker == 1 && task.layer < 3/ { @s[task.class] = sum(task.dur_ns); }",
     (Case((Guard(WORKER, "jne", 1, True, False), Guard(LAYER, "jge", 3, True, False)),
           (Agg(ADD, 0, ((CLASS, 8),), DUR),)),)),
]


@pytest.mark.parametrize("query,cases", GUARDED, ids=[q[:40] for q, _ in GUARDED])
def test_predicates_become_guards(query, cases):
    (plan,) = _plans(query).values()
    assert plan.ok, plan.reason
    assert plan.cases == cases and plan.aggs == ()


def test_a_disjunction_is_two_updating_cases():
    (plan,) = _plans("task:end /task.class == 2 || worker == 1/ { @n[task.layer] = count(); }").values()
    assert plan.ok, plan.reason
    assert len(plan.cases) == 2 and all(c.aggs == plan.cases[0].aggs for c in plan.cases)
    # exactly one case holds for any input
    for cls, wk in ((2, 0), (3, 1), (2, 1), (3, 0)):
        rec = context.pack("task:end", worker=wk, task_class=cls)
        holds = [all(A.guard_holds(g, A.scalar_value(g.value, rec, wk)) == g.taken for g in c.guards)
                 for c in plan.cases]
        assert sum(holds) == (cls == 2 or wk == 1)


REFUSE = [
    ("task:end /task.dur_ns > task.wait_ns/ { @n[worker] = count(); }",
     r"insn \d+: j\w+: a comparison that is not a field with a constant"),
    ("task:end { @s[task.class] = sum(task.dur_ns >> 3); }",
     r"insn \d+: \w+: arithmetic on an operand \(descriptors take fields as they are\)"),
    ("task:end { @m[task.layer] = min(task.dur_ns); }", r"not inline: insn \d+: map 'm': a min .*"),
    ("task:end { evidence(task.class); @n[worker] = count(); }", r"not inline: insn \d+: ringbuf_output .*"),
    ("task:end { @n = count(); }",           # keyless: a per-worker array (the inline form's plain helpers)
     r"insn \d+: call map_lookup_elem: map 'n' is a per_worker_array \(descriptors update hash and hist maps\)"),
]


@pytest.mark.parametrize("query,reason", REFUSE, ids=[q[:40] for q, _ in REFUSE])
def test_queries_that_stay_programs(query, reason):
    (plan,) = _plans(query).values()
    assert not plan.ok and plan.aggs == ()
    assert re.fullmatch(reason, plan.reason), plan.reason


def _differential(obj, records):
    """Maps of the reference VM over `records` vs the descriptors applied to the same."""
    plans = {p.name: A.reduce(p, obj.maps, study(p, obj.maps)) for p in obj.programs}
    ref = ReferenceRuntime(num_workers=W)
    aid = ref.attach(obj)
    model = MapSet(obj.maps, W)
    by_hook = {}
    for p in obj.programs:
        by_hook.setdefault(p.hook.id, []).append(plans[p.name])
    for rec in records:
        ref.fire(rec)
        f = context.unpack(rec)
        for plan in by_hook.get(context.hook_of(rec).id, ()):
            A.apply(plan, rec, model, f["worker"])
    return ref.maps(aid).snapshot(), model.snapshot()


def test_the_summary_s_descriptors_equal_the_reference():
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rnd = random.Random(7)
    recs = [r for ep in range(3) for r in hook_contexts(rnd, 300, ep, index0=1000 * ep)]
    want, got = _differential(obj, recs)
    assert want == got and sum(len(v) for v in want.values()) > 10


#: queries built only from what reduces (plain fields, no predicate), to give the
#: differential many programs; random_query (test_inline) mixes in what does not
R_PROBES = [("task:end", ["task.dur_ns", "task.wait_ns"]), ("dep:release", ["dep.wait_ns"]),
            ("task:ready", ["queue.depth"]), ("task:begin", ["queue.depth", "task.wait_ns"]),
            ("task:end, dep:release, task:ready", ["task.layer"])]
R_KEYS = ["task.class", "worker", "layer", "task.layer", ""]
R_AGGS = ["count()", "sum({v})", "max({v})", "hist({v})", "avg({v})", "lhist({v}, 0, 1000, 100)",
          "lhist({v}, 0, 1048576, 65536)"]


def reducible_query(rnd: random.Random, qi: int) -> str:
    probes, vals = rnd.choice(R_PROBES)
    key = rnd.choice(R_KEYS)
    agg = rnd.choice(R_AGGS).format(v=rnd.choice(vals))
    return f"{probes} {{ @r{qi}{'[' + key + ']' if key else ''} = {agg}; }}"


def test_random_aggregation_queries_that_reduce_equal_the_reference():
    rnd = random.Random(20261202)
    reduced = refused = guarded = 0
    for qi in range(120):
        q = random_query(rnd, qi) if qi % 3 == 0 else reducible_query(rnd, qi)
        obj = compile_query(q, None, name=f"<q{qi}>").obj
        plans = [A.reduce(p, obj.maps, study(p, obj.maps)) for p in obj.programs]
        reduced += sum(p.ok for p in plans)
        guarded += sum(p.ok and any(c.guards for c in p.cases) for p in plans)
        refused += sum(not p.ok for p in plans)
        if not all(p.ok for p in plans):
            continue
        recs = [r for ep in range(2) for r in hook_contexts(rnd, 150, ep, index0=1000 * ep)]
        want, got = _differential(obj, recs)
        assert want == got, f"query {qi}"
    assert reduced >= 80 and refused >= 5 and guarded >= 15, (reduced, refused, guarded)   # not vacuous


def test_a_wrong_descriptor_is_caught():
    """The differential is not vacuous: a descriptor reading the wrong field differs."""
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rnd = random.Random(8)
    recs = hook_contexts(rnd, 300, 0)
    real = A.reduce

    def wrong(prog, maps, facts):
        p = real(prog, maps, facts)
        return A.AggPlan(tuple(Case(c.guards, tuple(Agg(a.op, a.map, a.key, WAIT if a.value == DUR else a.value,
                                                         a.word) for a in c.aggs)) for c in p.cases))
    A.reduce = wrong
    try:
        want, got = _differential(obj, recs)
    finally:
        A.reduce = real
    assert want != got



# r7 = the low 32 bits of dur_ns through a 4-byte stack slot, r8 = a 4-byte -1; then
# test_inline's key (task.class at fp-48) and lookup-or-insert, and two adds
NARROW = """
    mov r6, r1
    ldxdw r0, [r6+96]
    stxw [r10-8], r0
    ldxw r7, [r10-8]
    stw [r10-16], -1
    ldxw r8, [r10-16]
    ldxw r1, [r6+28]
    stxdw [r10-48], r1
""" + LOOKUP_OR_INSERT.format(flags=1, init=0) + "xadddw [r0+0], r7\nxadddw [r0+8], r8\n" + EPI


def test_a_narrow_store_keeps_the_low_bytes():
    """A u64 field stored with stxw and loaded back is its low 32 bits (little-endian); a
    constant stored in 4 bytes is truncated (stw -1 -> 0xffffffff): the descriptors say
    so, and applying them equals the reference VM on records with high bits set."""
    from dtrace_mk.bpf import asm
    from dtrace_mk.bpf.program import BpfObject, MapDef, Program
    hook = abi.hook("task:end")
    maps = [MapDef("h", "hash", 8, 16, 64)]
    prog = Program("p", hook.section, hook, asm.assemble(NARROW, ["h"]))
    plan = A.reduce(prog, maps, study(prog, maps))
    assert plan.aggs == (Agg(ADD, 0, ((CLASS, 8),), Ctx(DUR.off, 4), 0), Agg(ADD, 0, ((CLASS, 8),), Const(0xFFFFFFFF), 1))
    obj = BpfObject(programs=[prog], maps=maps)
    rnd = random.Random(5)
    recs = [context.pack("task:end", worker=rnd.randrange(W), task_class=rnd.randrange(4),
                         dur_ns=rnd.getrandbits(64)) for _ in range(50)]
    want, got = _differential(obj, recs)
    assert want == got and want["h"]
