"""The descriptor form (dtrace_mk/runtime/descform.py, kernels/bpf_inline.cuh
dtmk_desc_run): encoding tables with exact records and refusals, the constants read back
from the kernel header, and the differential on the CPU -- HostCompiledRuntime(W,
inline=True, descriptors=True) runs every reducible program from its descriptors with
the device's own code (g++) and must give the reference runtime's maps and coverage."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf.program import MapDef
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.runtime import aggdesc as A
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime import descform as F
from dtrace_mk.runtime import device as D
from dtrace_mk.runtime.aggdesc import ADD, HIST, MAX, MIN, Agg, AggPlan, Case, Const, Ctx, Guard, Worker
from dtrace_mk.runtime.inline import study
from dtrace_mk.runtime.live import SUMMARY_QUERY
from tests.runtime.test_aggdesc import reducible_query
from tests.runtime.test_inline import W, _groups, _run, _slot_flags, hook_contexts, needs_gxx, random_query
from dtrace_mk.kernels import megakernel_text

INLINE_H = (D.KERNEL_DIR / "bpf_inline.cuh").read_text()


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "cm_desc_cache"))


def test_constants_agree_with_the_kernel_header():
    flags_h = (D.KERNEL_DIR / "bpf_prog_flags.h").read_text()
    defs = {m.group(1): int(m.group(2), 0)
            for m in re.finditer(r"#define (DTMK_\w+) (0x[0-9a-f]+|\d+)u", INLINE_H + flags_h)}
    assert (defs["DTMK_D_END"], defs["DTMK_D_GUARD"], defs["DTMK_D_AGG"], defs["DTMK_D_SAME"]) == \
        (F.D_END, F.D_GUARD, F.D_AGG, F.D_SAME)
    assert (defs["DTMK_D_SRC_WORKER"], defs["DTMK_D_SRC_CONST"]) == (F.SRC_WORKER, F.SRC_CONST)
    assert (defs["DTMK_D_HIST_LOG2"], defs["DTMK_D_HIST_LIN"], defs["DTMK_SH_ADD"], defs["DTMK_SH_MAX"]) == \
        (F.HIST_LOG2, F.HIST_LIN, F.SH_ADD, F.SH_MAX)
    assert (defs["DTMK_D_TAKEN"], defs["DTMK_D_WIDE"], defs["DTMK_PROG_F_DESC"]) == (F.TAKEN, F.WIDE, F.PROG_F_DESC)
    assert defs["DTMK_PROG_F_DESC"] == D.PROG_F_DESC and defs["DTMK_PROG_F_INLINE"] == D.PROG_F_INLINE
    assert (defs["DTMK_PROG_F_SERIAL"], defs["DTMK_PROG_F_COMPILED"]) == (D.PROG_F_SERIAL, C.PROG_F_COMPILED)
    mk = megakernel_text()
    assert int(re.search(r"#define DTMK_OBS_DESC (\d+)", mk).group(1)) == F.DESC_CAP
    enum = re.search(r"enum \{ (DTMK_D_JEQ[^}]*)\}", INLINE_H).group(1)
    assert [n.strip().removeprefix("DTMK_D_").lower() for n in enum.split(",") if n.strip()] == list(F.GUARD_OPS)
    # and the comparisons are the VM's: every operator of its table
    from dtrace_mk.bpf.vm import JMP_COND
    assert set(F.GUARD_OPS) == set(JMP_COND)


# ------------------------------------------------------------------ encode(): the table

HASH = MapDef("h", "hash", 4, 16, 64)
LOG2 = MapDef("l", "hist_log2", 4, 8 * 64, 64)
LIN = MapDef("n", "hist_linear", 8, 8 * 12, 64, lin_lo=0, lin_hi=1000, lin_step=100)
BIG = MapDef("b", "hash", 16, 8, 64)
MAPS = [HASH, LOG2, LIN, BIG]
ADDRS = [0x1000, 0x2000, 0x3000, 0x4000]
CLS, DUR, WAIT, QD = Ctx(28, 4), Ctx(96, 8), Ctx(104, 8), Ctx(92, 4)


def _plan(*cases):
    return AggPlan(cases=tuple(Case(tuple(g), tuple(a)) for g, a in cases))


def _rows(recs):
    """Each record as a tuple of its non-zero fields (readable expectations)."""
    out = []
    for r in recs:
        d = {n: (tuple(int(x) for x in r[n]) if r[n].shape else int(r[n])) for n in F.DESC_DTYPE.names}
        out.append(tuple((n, v) for n, v in d.items() if v not in (0, (0, 0, 0, 0), (0, 0))))
    return out


def test_a_histogram_keyed_by_class_is_one_agg_and_the_end():
    recs = F.encode(_plan(((), [Agg(HIST, 1, ((CLS, 4),), DUR)])), MAPS, ADDRS)
    assert _rows(recs) == [
        (("map", 0x2000), ("kind", F.D_AGG), ("op", F.HIST_LOG2), ("vsrc", 96), ("vsize", 8), ("nparts", 1),
         ("ksrc", (28, 0, 0, 0)), ("ksize", (4, 0, 0, 0)), ("nb", 64)),
        ()]


def test_guards_then_aggs_with_avg_s_second_word_on_the_same_entry():
    g = Guard(QD, "jgt", 7, False, True)
    recs = F.encode(_plan(((g,), [Agg(ADD, 0, ((Worker(), 4),), WAIT, 0), Agg(ADD, 0, ((Worker(), 4),), Const(1), 1)])),
                    MAPS, ADDRS)
    assert _rows(recs) == [
        (("vconst", 7), ("kind", F.D_GUARD), ("op", 1 | F.TAKEN), ("vsrc", 92), ("vsize", 4)),
        (("map", 0x1000), ("kind", F.D_AGG), ("op", F.SH_ADD), ("vsrc", 104), ("vsize", 8), ("shops", 1 | 1 << 2),
         ("nparts", 1), ("ksrc", (F.SRC_WORKER, 0, 0, 0)), ("ksize", (4, 0, 0, 0))),
        (("map", 0x1000), ("vconst", 1), ("kind", F.D_AGG | F.D_SAME), ("op", F.SH_ADD), ("vsrc", F.SRC_CONST),
         ("vsize", 8), ("word", 1), ("shops", 1 | 1 << 2), ("nparts", 1), ("ksrc", (F.SRC_WORKER, 0, 0, 0)),
         ("ksize", (4, 0, 0, 0))),
        ()]


def test_constant_key_bytes_go_in_place_and_a_wide_field_is_truncated_to_its_bytes():
    # key: 2 constant bytes, then the low 2 bytes of dur_ns (a u64 stored with stxh) -> 4 bytes
    plan = _plan(((Guard(DUR, "jsle", -5, True, False),),
                  [Agg(MAX, 0, ((Const(0xABCD), 2), (DUR, 2)), QD, 1)]))
    recs = F.encode(plan, MAPS, ADDRS)
    assert _rows(recs) == [
        (("vconst", (1 << 64) - 5), ("kind", F.D_GUARD), ("op", F.GUARD_OPS.index("jsle") | F.WIDE), ("vsrc", 96),
         ("vsize", 8)),
        (("map", 0x1000), ("kconst", 0xABCD), ("kind", F.D_AGG), ("op", F.SH_MAX), ("vsrc", 92), ("vsize", 4),
         ("word", 1), ("shops", F.SH_MAX << 2), ("nparts", 1), ("ksrc", (96, 0, 0, 0)), ("ksize", (2, 0, 0, 0)),
         ("kpos", (2, 0, 0, 0))),
        ()]


def test_a_linear_histogram_carries_its_buckets():
    recs = F.encode(_plan(((), [Agg(HIST, 2, ((CLS, 4), (Worker(), 4)), WAIT)])), MAPS, ADDRS)
    r = recs[0]
    assert (int(r["op"]), int(r["nb"]), int(r["lin_lo"]), int(r["lin_hi"]), int(r["lin_step"])) == \
        (F.HIST_LIN, LIN.hist_buckets, 0, 1000, 100)
    assert tuple(r["ksrc"][:2]) == (28, F.SRC_WORKER) and tuple(r["kpos"][:2]) == (0, 4)


REFUSE = [
    ("min", _plan(((), [Agg(MIN, 0, ((CLS, 4),), DUR, 0)])), "p: a min (the shadow combines adds and maxima)"),
    ("word", _plan(((), [Agg(ADD, 0, ((CLS, 4),), DUR, 2)])), "p: value word 2 (the shadow holds 2)"),
    ("ops", _plan(((Guard(CLS, "jeq", 1, True, True),), [Agg(ADD, 0, ((CLS, 4),), DUR, 0)]),
                  ((Guard(CLS, "jeq", 1, True, False),), [Agg(MAX, 0, ((CLS, 4),), DUR, 0)])),
     "p: value word 0 both added to and raised"),
    ("key", _plan(((), [Agg(ADD, 3, ((CLS, 4), (Const(0), 4), (DUR, 8)), DUR, 0)])),
     "p: case 0: map 'b': a 16-byte key (the shadow takes 8)"),
    ("align", _plan(((), [Agg(ADD, 0, ((Ctx(30, 4), 4),), DUR, 0)])),
     "p: case 0: context field at byte 30 (4 bytes) is not aligned"),
    ("reason", AggPlan(reason="insn 3: arithmetic"), "p: insn 3: arithmetic"),
]


@pytest.mark.parametrize("name,plan,msg", REFUSE, ids=[r[0] for r in REFUSE])
def test_what_the_device_form_refuses(name, plan, msg):
    with pytest.raises(F.DescError) as e:
        F.encode(plan, MAPS, ADDRS, "p")
    assert str(e.value) == msg


def test_the_summary_encodes_to_one_agg_per_program():
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    for p in obj.programs:
        recs = F.encode(A.reduce(p, obj.maps, study(p, obj.maps)), obj.maps, range(len(obj.maps)), p.name)
        assert [int(k) for k in recs["kind"]] == [F.D_AGG, F.D_END], p.name


# ------------------------------------------------------------------ the differential (g++)

def _desc_run(objs, epochs):
    return _run(objs, epochs, inline=True, descriptors=True)


@needs_gxx
def test_descriptor_form_equals_the_reference_on_random_queries():
    rnd = random.Random(20261203)
    qs = [random_query(rnd, qi) if qi % 3 == 0 else reducible_query(rnd, qi) for qi in range(36)]
    objs = [compile_query(q, None, name=f"<q{qi}>").obj for qi, q in enumerate(qs)]
    objs.append(compile_query(SUMMARY_QUERY, None, name="<summary>").obj)
    as_desc = as_prog = guarded = 0
    for gi, group in enumerate(_groups(objs)):
        epochs = [hook_contexts(rnd, 200, ep, index0=1000 * ep) for ep in range(3)]
        ref, host, pairs, probs = _desc_run(group, epochs)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])
        for (hid, aid, name), (flags, dp, att) in _slot_flags(host).items():
            plan = A.reduce(dp.program, att.maps.defs, dp.facts)
            form = host.forms(aid)[name]
            assert (form == "descriptors") == plan.ok == bool(flags & F.PROG_F_DESC), (aid, name, form)
            as_desc += plan.ok
            as_prog += not plan.ok
            guarded += plan.ok and any(c.guards for c in plan.cases)
    assert as_desc >= 20 and as_prog >= 3 and guarded >= 3, (as_desc, as_prog, guarded)   # not vacuous


@needs_gxx
def test_a_map_too_small_loses_in_the_descriptor_form_exactly_as_the_reference():
    q = "task:end { @few[task.class] = sum(task.dur_ns); }\ntask:end { @h[task.class] = hist(task.dur_ns); }"
    obj = compile_query(q, None, name="<few>").obj
    for m in obj.maps:
        m.max_entries = 3                 # filled by epoch 0's 3 classes; epoch 1's other 9 are lost
    rnd = random.Random(7)                # (which new keys of ONE epoch win may differ from event order)
    epochs = [hook_contexts(rnd, 150, 0, classes=3, hooks=["task:end"]),
              hook_contexts(rnd, 150, 1, hooks=["task:end"], index0=1000)]
    ref, host, pairs, probs = _run([obj], epochs, inline=True, descriptors=True, fires=False)
    assert not probs, "\n".join(probs[:20])
    assert set(host.forms(pairs[0][1]).values()) == {"descriptors"}
    assert sum(c.lost for c in ref.coverage(pairs[0][0])) > 0


@needs_gxx
def test_a_broken_descriptor_is_caught(monkeypatch):
    """The differential is not vacuous: a guard whose sense is flipped differs."""
    real = F.encode

    def flipped(plan, *a, **kw):
        recs = real(plan, *a, **kw)
        g = recs["kind"] == F.D_GUARD
        recs["op"][g] ^= F.TAKEN
        return recs
    monkeypatch.setattr(F, "encode", flipped)
    obj = compile_query("task:end /task.class != 2/ { @c[task.class] = count(); }", None, name="<g>").obj
    rnd = random.Random(3)
    _, host, pairs, probs = _desc_run([obj], [hook_contexts(rnd, 100, 0, hooks=["task:end"])])
    assert set(host.forms(pairs[0][1]).values()) == {"descriptors"}
    assert probs


def test_without_descriptors_the_runtime_says_why_each_program_is_a_program():
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rt = C.HostCompiledRuntime(2, inline=True)
    aid = rt.attach(obj)
    assert set(rt.forms(aid).values()) == {"inline"}       # compiled: its code, not descriptors
    rt2 = C.HostCompiledRuntime(2, inline=True, descriptors=True)
    assert set(rt2.forms(rt2.attach(obj)).values()) == {"descriptors"}
    s = rt2.attach(obj, sample_every=2)
    assert set(rt2.forms(s).values()) == {"ring: sampling / a rate limit needs the warp's tickets"}
    flags = [int(t["progs"][k]["flags"]) for t in rt2.host_tables for k in range(int(t["n_progs"]))]
    assert sum(bool(f & F.PROG_F_DESC) for f in flags) == 3 and all(f & D.PROG_F_INLINE for f in flags[:1])
    assert np.all(rt.host_tables["progs"]["n_descs"] == 0)


def test_a_compiled_slot_runs_its_code_not_its_descriptors():
    """The megakernel's linked runtime makes descriptors (no harness) and compiles on
    promotion: a compiled slot then drops the descriptor flag and pointer (its code runs)."""
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rt = C.HostCompiledRuntime(2, inline=True, descriptors=True)
    rt.desc_over_compiled = False                           # as live.linked_runtime's
    aid = rt.attach(obj)
    assert set(rt.forms(aid).values()) == {"inline"}
    slots = [rt.host_tables[h]["progs"][0] for h in range(len(rt.host_tables)) if rt.host_tables[h]["n_progs"]]
    assert len(slots) == 3
    for e in slots:
        f = int(e["flags"])
        assert f & C.PROG_F_COMPILED and f & C.PROG_F_INLINE and not f & F.PROG_F_DESC, hex(f)
        assert int(e["descs"]) == 0 and int(e["n_descs"]) == 0


def test_attach_keeps_the_descriptor_entries_within_the_sites_copy():
    """Every worker copies all descriptor programs into DESC_CAP shared entries: once
    they are taken, a further reducible program runs as a program (and says why); a
    detach frees its entries for later attaches."""
    probes = [("task:end", "task.dur_ns"), ("task:begin", "queue.depth"), ("dep:release", "dep.wait_ns")]
    q = "{p} /task.class != {c}/ {{ @h{c}[task.class] = hist({v}); }}"   # 3 entries: guard, agg, end
    rt = C.HostCompiledRuntime(2, inline=True, descriptors=True)
    aids, forms = [], []
    for c in range(F.DESC_CAP // 3 + 2):
        p, v = probes[c % 3]
        aids.append(rt.attach(compile_query(q.format(p=p, c=c, v=v), None, name=f"<h{c}>").obj))
        (form,) = D.DeviceRuntime.forms(rt, aids[-1]).values()   # (rt.forms: compiled -> "inline")
        forms.append(form)
    per = 3
    fit = F.DESC_CAP // per
    assert forms[:fit] == ["descriptors"] * fit
    assert forms[fit] == (f"program: the hook sites hold {F.DESC_CAP} descriptor entries ({fit * per} in use, "
                          f"this program needs {per})")
    assert sum(int(t["progs"][k]["n_descs"]) for t in rt.host_tables for k in range(int(t["n_progs"]))) == fit * per
    rt.detach(aids[0])
    again = rt.attach(compile_query(q.format(p="task:end", c=99, v="task.dur_ns"), None, name="<again>").obj)
    assert list(rt.forms(again).values()) == ["descriptors"]


# ------------------------------------------------------------------ the lean form (session 63)

DOM = F.LeanDomains.of_model(12, 6)


def _lean(q, domains=DOM):
    obj = compile_query(q, None, name="<lean>").obj
    (p,) = obj.programs
    recs = F.encode(A.reduce(p, obj.maps, study(p, obj.maps)), obj.maps, range(len(obj.maps)), p.name)
    return F.lean_layout(recs, domains, p.name)


def test_lean_constants_agree_with_the_kernel_header():
    flags_h = (D.KERNEL_DIR / "bpf_prog_flags.h").read_text()
    defs = {m.group(1): int(m.group(2), 0)
            for m in re.finditer(r"#define (DTMK_\w+) (0x[0-9a-f]+|\d+)u", INLINE_H + flags_h)}
    assert (defs["DTMK_LEAN_CELLS"], defs["DTMK_LEAN_NONE"], defs["DTMK_PROG_F_LEAN"], defs["DTMK_LEAN_SLOW"]) == \
        (F.LEAN_CELLS, F.LEAN_NONE, F.PROG_F_LEAN, F.LEAN_SLOW) and D.PROG_F_LEAN == F.PROG_F_LEAN


@pytest.mark.parametrize("q,cells,per,stride,dom", [
    # a class-keyed histogram: 12 classes x 64 buckets, the class part strides a key's buckets
    ("task:end { @h[task.class] = hist(task.dur_ns); }", 12 * 64, 64, [64, 0, 0, 0], [12, 0, 0, 0]),
    # a sum by layer: (lo, hi, count) per key, 6 layers and NONE (the stride's NONE bit)
    ("dep:release { @s[task.layer] = sum(dep.wait_ns); }", 7 * 3, 3, [3 | F.LEAN_NONE, 0, 0, 0], [6, 0, 0, 0]),
    # avg: two words on one lookup (lo, hi) x 2 + count; the worker is each worker's own
    ("task:end { @a[worker] = avg(task.dur_ns); }", 5, 5, [0, 0, 0, 0], [0, 0, 0, 0]),
    # a linear histogram by layer: its buckets per key
    ("task:end { @l[task.layer] = lhist(task.dur_ns, 0, 1000, 100); }", 7 * 12, 12, [12 | F.LEAN_NONE, 0, 0, 0],
     [6, 0, 0, 0]),
])
def test_lean_layout_table(q, cells, per, stride, dom):
    recs, n = _lean(q)
    (agg,) = [r for r in recs if r["kind"] == F.D_AGG]
    assert (n, int(agg["lbase"]), int(agg["lper"]), [int(x) for x in agg["lstride"]],
            [int(x) for x in agg["ldom"]]) == (cells, 0, per, stride, dom)


@pytest.mark.parametrize("q,msg", [
    ("task:ready { @q[queue.depth] = count(); }", "c0_task_ready: a key on the context field at byte 92 (no dense domain)"),
    ("task:end { @t[task.index] = sum(task.dur_ns); }", "c0_task_end: a key on the context field at byte 32 (no dense domain)"),
])
def test_what_the_lean_form_refuses(q, msg):
    with pytest.raises(F.DescError) as e:
        _lean(q)
    assert str(e.value) == msg


def test_the_summary_fits_the_lean_banks_and_a_detach_frees_its_cells():
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rt = C.HostCompiledRuntime(2, inline=True, lean_domains=DOM)
    a = rt.attach(obj)
    assert set(D.DeviceRuntime.forms(rt, a).values()) == {"lean"}
    assert int(rt._lean_used.sum()) == 12 * 64 + 12 * 3 + 3
    b = rt.attach(obj)                       # a second summary does not fit: programs, saying why
    assert D.DeviceRuntime.forms(rt, b)["c0_task_end"] == \
        "program: the lean cells are taken (807 of 1024 in use, this program needs 768)"
    rt.detach(b)
    rt.detach(a)
    assert not rt._lean_used.any()
    flags = [int(t["progs"][k]["flags"]) for t in rt.host_tables for k in range(int(t["n_progs"]))]
    assert flags == []


def _lean_paths(host):
    """{hook name: the op count of its lean slots as the megakernel compiles them at a table load,
    or "walk"} (dtmk_lean_compile in the g++ host build; hooks without lean slots left out)"""
    out = {}
    for h in abi.HOOKS:
        n = host._lib.dtmk_host_lean_ops(host.tables.ctypes.data, h.id)
        if n:
            out[h.name] = "walk" if n == F.LEAN_SLOW else n
    return out


@needs_gxx
@pytest.mark.parametrize("q,paths", [
    (SUMMARY_QUERY, {"task:end": 1, "dep:release": 1, "task:ready": 1}),
    # one unguarded AGG each, ADD of a constant / MAX: ops; two programs on one hook: two ops
    ("task:end { @c[task.class] = count(); }\ntask:end { @m[task.layer] = max(task.dur_ns); }", {"task:end": 2}),
    # a guard, a linear histogram, avg's two words (two AGGs on one lookup): the walk
    ("task:end /task.dur_ns > 100/ { @c[task.class] = count(); }", {"task:end": "walk"}),
    ("task:end { @l[task.layer] = lhist(task.dur_ns, 0, 1000, 100); }", {"task:end": "walk"}),
    ("task:end { @a[task.class] = avg(task.dur_ns); }", {"task:end": "walk"}),
    # a hook with one slot the walk takes runs all its lean slots so
    ("task:end { @c[task.class] = count(); }\ntask:end { @a[worker] = avg(task.dur_ns); }", {"task:end": "walk"}),
])
def test_which_lean_slots_the_megakernel_compiles_to_ops(q, paths):
    obj = compile_query(q, None, name="<ops>").obj
    rnd = random.Random(11)
    ref, host, pairs, probs = _run([obj], [hook_contexts(rnd, 120, 0)], inline=True, lean_domains=DOM)
    assert not probs, "\n".join(probs[:20])
    assert set(D.DeviceRuntime.forms(host, pairs[0][1]).values()) == {"lean"}
    assert _lean_paths(host) == paths


@needs_gxx
def test_lean_form_equals_the_reference_on_random_queries():
    """The lean form on the device's own code (g++): every reducible random query whose keys
    are dense runs lean, and maps and coverage equal the reference runtime's."""
    rnd = random.Random(20261207)
    qs = [random_query(rnd, qi) if qi % 3 == 0 else reducible_query(rnd, qi) for qi in range(36)]
    objs = [compile_query(q, None, name=f"<q{qi}>").obj for qi, q in enumerate(qs)]
    objs.append(compile_query(SUMMARY_QUERY, None, name="<summary>").obj)
    n_lean, paths = 0, set()
    for gi, group in enumerate(_groups(objs)):
        epochs = [hook_contexts(rnd, 200, ep, index0=1000 * ep) for ep in range(3)]
        ref, host, pairs, probs = _run(group, epochs, inline=True, lean_domains=DOM)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])
        paths |= {"walk" if p == "walk" else "ops" for p in _lean_paths(host).values()}
        for _, ha in pairs:
            for dp in host._atts[ha].progs:
                n_lean += dp.lean
                assert dp.lean == (D.DeviceRuntime.forms(host, ha)[dp.program.name] == "lean")
    assert n_lean >= 30, n_lean                                           # not vacuous
    assert paths == {"ops", "walk"}                                       # both of the site's paths ran


@needs_gxx
def test_a_broken_lean_layout_is_caught(monkeypatch):
    """The differential is not vacuous: a layout that folds two classes onto one key differs."""
    real = F.lean_layout

    def merged(recs, *a, **kw):
        out, n = real(recs, *a, **kw)
        agg = out["kind"] == F.D_AGG
        out["ldom"][agg, 0] = np.where(out["ldom"][agg, 0] > 1, out["ldom"][agg, 0] - 1, out["ldom"][agg, 0])
        return out, n
    monkeypatch.setattr(F, "lean_layout", merged)
    obj = compile_query("task:end { @c[task.class] = count(); }", None, name="<b>").obj
    rnd = random.Random(5)
    _, host, pairs, probs = _run([obj], [hook_contexts(rnd, 100, 0, hooks=["task:end"])], inline=True,
                                 lean_domains=DOM)
    assert set(D.DeviceRuntime.forms(host, pairs[0][1]).values()) == {"lean"}
    assert probs


@needs_gxx
def test_a_map_too_small_loses_in_the_lean_form_exactly_as_the_reference():
    q = "task:end { @few[task.class] = sum(task.dur_ns); }\ntask:end { @h[task.class] = hist(task.dur_ns); }"
    obj = compile_query(q, None, name="<few>").obj
    for m in obj.maps:
        m.max_entries = 3
    rnd = random.Random(7)
    epochs = [hook_contexts(rnd, 150, 0, classes=3, hooks=["task:end"]),
              hook_contexts(rnd, 150, 1, hooks=["task:end"], index0=1000)]
    ref, host, pairs, probs = _run([obj], epochs, inline=True, lean_domains=DOM, fires=False)
    assert not probs, "\n".join(probs[:20])
    assert set(D.DeviceRuntime.forms(host, pairs[0][1]).values()) == {"lean"}
    assert sum(c.lost for c in ref.coverage(pairs[0][0])) > 0
