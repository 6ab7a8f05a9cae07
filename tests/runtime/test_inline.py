"""The compiled tier's inline form without a GPU (dtrace_mk.runtime.inline,
kernels/bpf_inline.cuh, compiled.translate(shadow=...)).

* analyse(): the exact verdict for real queries of the language (the summary's three
  programs with their InlineMaps, count / sum / max / avg / hist / lhist) and for what
  must stay on the ring path, with the reason (evidence, map_delete_elem, a value read
  or written outside an add / max, a max triple entered in its middle, a fetching add,
  16-byte keys, a read hist_add result, an update other than a zero NOEXIST insert, a
  lookup with no insert or with a side effect on its null path, two shadow updates in
  one run).
* Differential on the CPU: HostCompiledRuntime(W, inline=True) -- the hook site's
  dtmk_inl_event per record, the shadow and coverage accumulators flushed at the end of
  every fire() (the epoch end) -- against the reference VM on random aggregation queries
  over four hooks: maps, map stats and coverage rows equal; the inline slots really ran
  (table flag PROG_F_INLINE), a broken shadow update is caught; inline=False agrees too.
  The hand-written programs too (the refused ones would differ inline: a lookup with no
  insert, a side effect on the null path, a fetched or re-used value); tables
  republished between epochs (attach / detach); first_epoch; sampling and rate limits
  never inline.
* A full map: losses counted as the helpers would (map stats.lost, coverage lost per
  epoch = the events whose key never got in; a program with two shadow maps would lose
  an event twice, so it stays on the ring path); a full shadow probe window falls back
  to the ordinary helpers and stays exact.
* NVRTC: the summary monitor with its inline forms compiles to LTO-IR for sm_90a; with
  nvJitLink the megakernel's compiled-tier build links with it (slow: the kernel compile).
"""
from __future__ import annotations

import dataclasses
import random
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm
from dtrace_mk.bpf.program import BpfObject, MapDef, Program
from dtrace_mk.errors import UserError
from dtrace_mk.lang import printing
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime import device as D
from dtrace_mk.runtime.inline import ADD, MAX, InlineMap, analyse
from dtrace_mk.runtime.live import SUMMARY_QUERY
from dtrace_mk.runtime.reference import PARKED, ReferenceRuntime
from dtrace_mk.runtime.summary_windows import ReferenceDevice

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))

import device_progs as G                      # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the host build needs g++")
INLINE_H = (D.KERNEL_DIR / "bpf_inline.cuh").read_text()
SH_N = int(re.search(r"#define DTMK_SH_N (\d+)u", INLINE_H).group(1))


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "cm_inline_cache"))


def test_constants_agree_with_the_kernel_header():
    flags_h = (D.KERNEL_DIR / "bpf_prog_flags.h").read_text()
    defs = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (DTMK_\w+) (\d+)u", INLINE_H + flags_h)}
    assert (defs["DTMK_SH_ADD"], defs["DTMK_SH_MAX"], defs["DTMK_PROG_F_INLINE"]) == (ADD, MAX, C.PROG_F_INLINE)


# ------------------------------------------------------------------ analyse(): the table

def _plans(query):
    obj = compile_query(query, None, name="<t>").obj
    return {p.name: analyse(p, obj.maps) for p in obj.programs}


def _hash(i, ops, key=8):
    return InlineMap(i, "hash", key, ops)


def _log2(i, key=8):
    return InlineMap(i, "hist_log2", key, ADD, (0, 0, 0, 64))


QUALIFY = [
    ("task:end { @c[task.class] = count(); }", {"c0_task_end": {0: _hash(0, ADD)}}),
    ("dep:release /task.class != 3/ { @s[worker] = sum(dep.wait_ns); }", {"c0_dep_release": {0: _hash(0, ADD)}}),
    ("task:ready { @m[layer] = max(queue.depth); }", {"c0_task_ready": {0: _hash(0, MAX)}}),
    ("task:end { @a[task.class] = avg(task.dur_ns); }", {"c0_task_end": {0: _hash(0, ADD | ADD << 2)}}),
    ("task:begin { @h[task.class] = hist(task.wait_ns); }", {"c0_task_begin": {0: _log2(0)}}),
    ("task:end { @h = hist(task.dur_ns); }", {"c0_task_end": {0: _log2(0, key=4)}}),
    ("task:ready { @m = max(queue.depth); }", {"c0_task_ready": {0: _hash(0, MAX, key=4)}}),
    ("task:end { @l[worker] = lhist(task.dur_ns, 0, 1000, 100); }",
     {"c0_task_end": {0: InlineMap(0, "hist_linear", 8, ADD, (0, 1000, 100, 12))}}),
    # no key: a per_worker_array, used through the ordinary helpers (nothing in the shadow)
    ("task:end { @n = count(); }", {"c0_task_end": {}}),
    ("task:end { exit(); }", {"c0_task_end": {}}),
    # one shadow update per path: if / else, a second map that is an array
    ("task:end { if (task.class == 1) { @a[worker] = sum(task.dur_ns); } else { @b[worker] = hist(task.dur_ns); } }",
     {"c0_task_end": {0: _hash(0, ADD), 1: _log2(1)}}),
    ("task:end { @a[task.class] = max(task.dur_ns); @n = count(); }", {"c0_task_end": {0: _hash(0, MAX)}}),
    ("task:begin, task:end { @w[task.class] = sum(task.wait_ns); }",
     {"c0_task_begin": {0: _hash(0, ADD)}, "c0_task_end": {0: _hash(0, ADD)}}),
]


def test_the_summary_monitor_qualifies_with_its_exact_plan():
    plans = _plans(SUMMARY_QUERY)
    assert {n: (p.reason, p.maps) for n, p in plans.items()} == {
        "c0_task_end": (None, {0: _log2(0)}),                 # hist -> ADD 1 into the bucket
        "c1_dep_release": (None, {1: _hash(1, ADD)}),         # sum -> ADD
        "c2_task_ready": (None, {2: _hash(2, MAX)}),          # max -> MAX
    }


@pytest.mark.parametrize("query,expect", QUALIFY, ids=[q[:40] for q, _ in QUALIFY])
def test_queries_that_qualify(query, expect):
    plans = _plans(query)
    assert {n: p.reason for n, p in plans.items()} == {n: None for n in expect}
    assert {n: p.maps for n, p in plans.items()} == expect


REFUSE_QUERIES = [
    ("task:end { evidence(task.class); @n[worker] = count(); }",
     r"insn \d+: ringbuf_output keeps the program on the ring path"),
    ("task:end { @m[task.layer] = min(task.dur_ns); }", r"insn \d+: map 'm': a min \(the shadow combines adds and maxima\)"),
    ("task:end { @m[task.layer] = stats(task.dur_ns); }", r"insn \d+: map 'm': value access at 16 size 8"),
    ("task:end { @k[task.class, worker] = count(); }", r"map 'k': 16-byte keys \(inline: <= 8\)"),
    # two shadow updates in one run: a refused key would lose the event twice
    ("task:end { @a[task.class] = count(); @b[task.class] = sum(task.dur_ns); }",
     r"insn \d+: 2 shadow map updates in one run \(inline: at most one\)"),
    ("task:end { @a[task.class] = count(); @a[worker] = count(); }", r"insn \d+: 2 shadow map updates in one run .*"),
]


@pytest.mark.parametrize("query,reason", REFUSE_QUERIES, ids=[q[:40] for q, _ in REFUSE_QUERIES])
def test_queries_that_stay_on_the_ring_path(query, reason):
    (plan,) = _plans(query).values()
    assert not plan.ok and plan.maps == {}
    assert re.fullmatch(reason, plan.reason), plan.reason


# hand-written programs on task:end: r6 = ctx, r7 = task.dur_ns, key task.class at fp-48 (16 bytes
# written: a 16-byte key is allowed too), zero value at fp-24 (24 bytes)
HOOK = abi.hook("task:end")
PRO = """
    mov r6, r1
    ldxdw r7, [r6+96]
    ldxw r1, [r6+28]
    stxdw [r10-48], r1
    stxdw [r10-40], r1
"""
LOOKUP_OR_INSERT = """
    lddw r1, map:h
    mov r2, r10
    add r2, -48
    call map_lookup_elem
    jne r0, 0, have
    mov r1, {init}
    stxdw [r10-24], r1
    stxdw [r10-16], r1
    stxdw [r10-8], r1
    lddw r1, map:h
    mov r2, r10
    add r2, -48
    mov r3, r10
    add r3, -24
    mov r4, {flags}
    call map_update_elem
    lddw r1, map:h
    mov r2, r10
    add r2, -48
    call map_lookup_elem
    jeq r0, 0, out
have:
"""
EPI = """
out:
    mov r0, 0
    exit
"""
XADD = "xadddw [r0+0], r7\n"
RAISE = "ldxdw r1, [r0+8]\njge r1, r7, +1\nstxdw [r0+8], r7\n"


def _prog(body, flags=1, key=8, value=16, init=0):
    maps = [MapDef("h", "hash", key, value, 64)]
    text = PRO + LOOKUP_OR_INSERT.format(flags=flags, init=init) + body + EPI
    return Program("p", HOOK.section, HOOK, asm.assemble(text, [m.name for m in maps])), maps


def _first_seen_prog():
    """lookup-or-insert that also counts first sightings (into an array) on its null path:
    inline, the shadow's lookup never returns null, so that count would stay 0."""
    maps = [MapDef("h", "hash", 8, 16, 64), MapDef("firsts", "array", 4, 8, 1)]
    count = """
    mov r1, 0
    stxw [r10-52], r1
    lddw r1, map:firsts
    mov r2, r10
    add r2, -52
    call map_lookup_elem
    jeq r0, 0, out
    mov r1, 1
    xadddw [r0+0], r1
    mov r1, 0
    stxdw [r10-24], r1"""
    text = PRO + LOOKUP_OR_INSERT.format(flags=1, init=0).replace("\n    mov r1, 0\n    stxdw [r10-24], r1", count, 1)
    return Program("p", HOOK.section, HOOK, asm.assemble(text + XADD + EPI, [m.name for m in maps])), maps


#: after a hist_add: r0 written before it is read on both edges of a branch
HIST_BRANCH = "jgt r7, 100, big\nmov r0, 0\nexit\nbig:\nmov r0, 1\nexit\n"


def _hist_prog(after):
    maps = [MapDef("g", "hist_log2", 8, 512, 64)]
    text = PRO + "lddw r1, map:g\nmov r2, r10\nadd r2, -48\nmov r3, r7\ncall hist_add\n" + after
    return Program("p", HOOK.section, HOOK, asm.assemble(text, ["g"])), maps


def test_a_hand_written_add_and_raise_value_qualifies():
    """word 0 only added, word 1 only raised: ops = ADD | MAX << 2 (a jump to the triple's
    first instruction is fine); the r0 of a hist_add written before it is read is fine."""
    plan = analyse(*_prog(XADD + "jgt r7, 100, tri\n" + "tri:\n" + RAISE))
    assert plan.ok and plan.maps == {0: InlineMap(0, "hash", 8, ADD | MAX << 2)}
    plan = analyse(*_prog(XADD, key=4))
    # (4-byte key: the stack key is the low half of the u64 above)
    assert plan.ok and plan.maps[0].key_size == 4 and plan.maps[0].ops == ADD
    plan = analyse(*_hist_prog("mov r0, 0\nexit\n"))
    assert plan.ok and plan.maps == {0: _log2(0)}


def test_verified_keeps_an_accepted_answer_and_never_a_rejection(monkeypatch):
    """inline.verified (every device attach): the same program over the same maps again is
    not walked again (device summaries attach one monitor per window of steps) and gets
    the same answer; one instruction changed, or the same instructions over a map too small
    for them, is walked -- and a rejection is walked again every time, never kept."""
    from dtrace_mk.errors import Rejected
    from dtrace_mk.runtime import inline as I
    walks = []
    real = I.verify
    monkeypatch.setattr(I, "verify", lambda *a, **kw: walks.append(a[0]) or real(*a, **kw))
    monkeypatch.setattr(I, "_VERIFIED", {})
    prog, maps = _prog(XADD)
    first = I.verified(prog, maps)
    again = I.verified(*_prog(XADD))                   # equal, not the same objects
    assert len(walks) == 1 and again == first and first[1].plan.ok
    other = I.verified(*_prog(XADD.replace("r0+0", "r0+8")))
    assert len(walks) == 2 and other[1].plan.maps[0].ops != first[1].plan.maps[0].ops
    small = _prog(XADD.replace("r0+0", "r0+8"), value=8)
    for n in (3, 4):
        with pytest.raises(Rejected, match="out of bounds|outside"):
            I.verified(*small)
        assert len(walks) == n
    monkeypatch.setattr(I, "_VERIFIED_CAP", 2)           # bounded: the oldest answer goes first
    I.verified(*_prog(RAISE))
    assert len(I._VERIFIED) == 2 and I._verify_key(prog, maps) not in I._VERIFIED


def _delete_prog():
    maps = [MapDef("h", "hash", 8, 16, 64)]
    text = PRO + "lddw r1, map:h\nmov r2, r10\nadd r2, -48\ncall map_delete_elem\nmov r0, 0\nexit\n"
    return Program("p", HOOK.section, HOOK, asm.assemble(text, ["h"])), maps


def _lookup_only_prog():
    maps = [MapDef("h", "hash", 8, 16, 64)]
    text = PRO + "lddw r1, map:h\nmov r2, r10\nadd r2, -48\ncall map_lookup_elem\njeq r0, 0, out\n" + XADD + EPI
    return Program("p", HOOK.section, HOOK, asm.assemble(text, ["h"])), maps


REFUSE_ASM = [
    ("delete", _delete_prog, r"insn \d+: map_delete_elem keeps the program on the ring path"),
    ("read into a predicate", lambda: _prog("ldxdw r1, [r0+0]\njgt r1, 5, out\n" + XADD),
     r"insn \d+: map 'h': value read outside an add or max"),
    ("plain store", lambda: _prog("stxdw [r0+0], r7\n"), r"insn \d+: map 'h': value write outside an add or max"),
    ("fetching add", lambda: _prog("mov r8, r7\nxadddw_fetch [r0+0], r8\njgt r8, 3000000, out\nxadddw [r0+8], r7\n"),
     r"insn \d+: map 'h': value atomic outside an add or max"),
    ("max triple entered in its middle", lambda: _prog("jgt r7, 100, mid\n" + RAISE.replace("stxdw", "mid:\nstxdw")),
     r"insn \d+: map 'h': value read outside an add or max"),
    ("raised value used after", lambda: _prog(RAISE + "jgt r1, 900000, out\n" + XADD),
     r"insn \d+: map 'h': value read outside an add or max"),
    ("both added and raised", lambda: _prog(XADD + RAISE.replace("+8]", "+0]")),
     r"map 'h': value word 0 both added and raised"),
    ("value word past 16 bytes", lambda: _prog("xadddw [r0+16], r7\n", value=24),
     r"insn \d+: map 'h': value access at 16 size 8"),
    ("16-byte key", lambda: _prog(XADD, key=16), r"map 'h': 16-byte keys \(inline: <= 8\)"),
    ("24-byte value", lambda: _prog(XADD, value=24), r"map 'h': 24-byte values \(inline: 8 or 16\)"),
    ("update BPF_ANY", lambda: _prog(XADD, flags=0), r"map 'h': map_update_elem other than a zero NOEXIST insert"),
    ("update BPF_EXIST", lambda: _prog(XADD, flags=2), r"map 'h': map_update_elem other than a zero NOEXIST insert"),
    ("insert a non-zero value", lambda: _prog(XADD, init=1),
     r"map 'h': map_update_elem other than a zero NOEXIST insert"),
    ("lookup with no insert", _lookup_only_prog, r"map 'h': looked up without a zero NOEXIST insert"),
    ("side effect on the null path", _first_seen_prog,
     r"insn \d+: a lookup whose null result does more than insert the key \(the shadow never returns null\)"),
    ("insert of another key", lambda: _other_key_prog(2),
     r"insn \d+: a lookup whose null result does more than insert the key \(the shadow never returns null\)"),
    ("key changed before the insert", lambda: _other_key_prog(1),
     r"insn \d+: a lookup whose null result does more than insert the key \(the shadow never returns null\)"),
    ("hist_add result kept", lambda: _hist_prog("mov r8, r0\nmov r0, 0\nexit\n"),
     r"insn \d+: hist_add's return value is read"),
    ("hist_add result returned", lambda: _hist_prog("exit\n"), r"insn \d+: hist_add's return value is read"),
    ("hist_add result returned on one path", lambda: _hist_prog(HIST_BRANCH.replace("mov r0, 1\n", "")),
     r"insn \d+: hist_add's return value is read"),
    ("hist value read", lambda: _hist_lookup_prog(), r"insn \d+: map 'g': a hist value read directly"),
]


def _other_key_prog(which):
    """A lookup-or-insert whose insert (and second lookup) use the key at fp-40 (which=2),
    or whose null path rewrites the key's bytes first (which=1): the shadow would count
    the first key where the reference inserts and counts another."""
    text = LOOKUP_OR_INSERT.format(flags=1, init=0)
    if which == 2:
        head, tail = text.split("call map_lookup_elem", 1)
        tail = tail.replace("add r2, -48", "add r2, -40")
        text = head + "call map_lookup_elem" + tail
    else:
        text = text.replace("    stxdw [r10-8], r1\n", "    stxdw [r10-8], r1\n    stxdw [r10-48], r7\n", 1)
    maps = [MapDef("h", "hash", 8, 16, 64)]
    return Program("p", HOOK.section, HOOK, asm.assemble(PRO + text + XADD + EPI, ["h"])), maps


def _hist_lookup_prog():
    maps = [MapDef("g", "hist_log2", 8, 512, 64)]
    text = PRO + "lddw r1, map:g\nmov r2, r10\nadd r2, -48\ncall map_lookup_elem\nmov r0, 0\nexit\n"
    return Program("p", HOOK.section, HOOK, asm.assemble(text, ["g"])), maps


@pytest.mark.parametrize("name,make,reason", REFUSE_ASM, ids=[n for n, _, _ in REFUSE_ASM])
def test_hand_written_programs_that_stay_on_the_ring_path(name, make, reason):
    prog, maps = make()
    from dtrace_mk.bpf.verifier import verify
    verify(prog, maps)                        # a real, verified program: refused by the analysis only
    plan = analyse(prog, maps)
    assert not plan.ok and plan.maps == {}, name
    assert re.fullmatch(reason, plan.reason), plan.reason


# ------------------------------------------------------------------ CPU differential

W = 4
HOOKS = ("task:end", "dep:release", "task:ready", "task:begin")
# (probes of a clause, values valid at all of them)
PROBES = [
    ("task:end", ["task.dur_ns", "task.wait_ns", "task.dur_ns >> 3", "task.dur_ns + task.wait_ns"]),
    ("dep:release", ["dep.wait_ns", "dep.wait_ns * 3"]),
    ("task:ready", ["queue.depth", "queue.depth + task.layer"]),
    ("task:begin", ["queue.depth", "task.wait_ns"]),
    ("task:begin, task:end", ["task.wait_ns"]),
    ("task:ready, task:begin", ["queue.depth"]),
    ("task:end, dep:release, task:ready", ["task.layer"]),
]
KEYS = ["task.class", "worker", "layer", "", "task.class & 3", "task.class, worker"]
PREDS = ["", "", "/task.class != 2/ ", "/worker == 1/ ", "/task.layer < 3/ "]
AGGS = ["count()", "sum({v})", "max({v})", "hist({v})", "avg({v})", "min({v})",
        "lhist({v}, 0, 1000, 100)", "lhist({v}, -500, 500, 50)", "lhist({v}, 0, 1048576, 65536)"]


def random_query(rnd: random.Random, qi: int) -> str:
    out = []
    for ci in range(rnd.randint(1, 3)):
        probes, vals = rnd.choice(PROBES)
        key = rnd.choice(KEYS)
        agg = rnd.choice(AGGS[:5] * 3 + AGGS[5:]).format(v=rnd.choice(vals))
        out.append(f"{probes} {rnd.choice(PREDS)}{{ @q{qi}_{ci}{'[' + key + ']' if key else ''} = {agg}; }}")
    return "\n".join(out)


def _val(rnd: random.Random, bits: int) -> int:
    r = rnd.random()
    return rnd.randrange(100) if r < 0.3 else rnd.randrange(1 << 20) if r < 0.8 else rnd.getrandbits(bits)


def hook_contexts(rnd: random.Random, n: int, epoch: int, classes: int = 12, hooks=HOOKS, index0: int = 0):
    """n records of the given hooks in decode step `epoch`, fields valid at each hook."""
    out = []
    for i in range(n):
        h = abi.hook(rnd.choice(hooks))
        f = dict(worker=rnd.randrange(W), decode_step=epoch, task_class=rnd.randrange(classes), task_index=index0 + i,
                 layer=rnd.randrange(6) if rnd.random() < 0.9 else 0xFFFFFFFF, ts_ns=1000 * (index0 + i))
        for nm, bits in (("dur_ns", 64), ("wait_ns", 64), ("queue_depth", 32)):
            if nm in h.valid_fields:
                f[nm] = _val(rnd, bits)
        out.append(context.pack(h, **f))
    return out


@needs_gxx
@pytest.mark.parametrize("inline,descriptors", [(False, False), (True, False), (True, True)],
                         ids=["ring", "inline", "descriptors"])
def test_a_replaced_attachment_ends_where_its_successor_starts(inline, descriptors):
    """attach(first_epoch=f, replaces=a) (a summary window's successor): a counts epochs
    < f only, on the device's code (kernels/bpf_run_prog.cuh, bpf_inline.cuh: the predecessor's
    end_epoch, written in the same table change) as in the reference; a third window
    replacing the second ends it in turn."""
    query = SUMMARY_QUERY + "task:end { @n[step] = count(); }\ntask:ready { @q[step] = max(queue.depth); }\n"
    obj = compile_query(query, None, name="<window>").obj
    rnd = random.Random(41)
    epochs = [hook_contexts(rnd, 80, ep, index0=1000 * ep) for ep in range(7)]
    ref, host = ReferenceRuntime(num_workers=W), C.HostCompiledRuntime(W, inline=inline, opt="-O0",
                                                                        descriptors=descriptors)
    pairs, probs = [], []
    for ep, batch in enumerate(epochs):
        if ep in (0, 2, 4):          # windows [1, 3), [3, 5), [5, ...) attached one epoch ahead
            prev = pairs[-1] if pairs else (None, None)
            pairs.append((ref.attach(obj, first_epoch=ep + 1, replaces=prev[0]),
                          host.attach(obj, first_epoch=ep + 1, replaces=prev[1])))
        for c in batch:              # (outcomes not compared: the device lists a slot whose event
            ref.fire(c)              # is outside the attachment's epochs, the reference does not)
        host.fire(batch)
    for (ra, ha), want in zip(pairs, ({1, 2}, {3, 4}, {5, 6})):
        probs += G.compare_maps(ref.maps(ra), host.maps(ha), ordered=True)
        rc, hc = G.coverage_dict(ref.coverage(ra)), G.coverage_dict(host.coverage(ha))
        if rc != hc:
            probs.append(f"coverage {ra}: reference {rc} host {hc}")
        steps = {int.from_bytes(k, "little") for k in ref.maps(ra)["n"].snapshot()}
        assert steps == want, (ra, steps)
        assert {c.epoch for c in ref.coverage(ra)} == want
    assert not probs, "\n".join(probs[:20])
    ends = {att.id: int(host.host_tables[hid]["progs"][k]["end_epoch"])
            for hid in C.HOOK_IDS for k, (att, _) in enumerate(host._by_hook[hid])}
    assert ends == {pairs[0][1]: 3, pairs[1][1]: 5, pairs[2][1]: 0}
    if descriptors:
        assert set(host.forms(pairs[0][1]).values()) == {"descriptors"}


@needs_gxx
@pytest.mark.parametrize("inline,descriptors", [(False, False), (True, False), (True, True)],
                         ids=["ring", "inline", "descriptors"])
def test_a_rearmed_attachment_counts_its_new_range_only(inline, descriptors):
    """rearm() (a buffered device query's turn: runtime/device_query.py): an attachment
    parked from the start, then an ended one emptied with clear_map, counts exactly the
    range it is rearmed for, on the device's code as in the reference -- its compiled
    code unchanged, only the slot's first_epoch / end_epoch rewritten."""
    query = "task:end { @n[step] = count(); @d = hist(task.dur_ns); }\ntask:ready { @q[worker] = max(queue.depth); }\n"
    obj = compile_query(query, None, name="<buffered>").obj
    rnd = random.Random(43)
    epochs = [hook_contexts(rnd, 80, ep, index0=1000 * ep) for ep in range(9)]
    ref, host = ReferenceRuntime(num_workers=W), C.HostCompiledRuntime(W, inline=inline, opt="-O0",
                                                                        descriptors=descriptors)
    a = (ref.attach(obj, first_epoch=1), host.attach(obj, first_epoch=1))
    b = (ref.attach(obj, first_epoch=PARKED), host.attach(obj, first_epoch=PARKED))
    probs, seen = [], []

    def fold(pair, want):
        """pair's maps hold exactly the epochs `want`; then emptied (as the query does)."""
        probs.extend(G.compare_maps(ref.maps(pair[0]), host.maps(pair[1]), ordered=True))
        steps = {int.from_bytes(k, "little") for k in ref.maps(pair[0])["n"].snapshot()}
        hsteps = {int.from_bytes(k, "little") for k in host.maps(pair[1])["n"].snapshot()}
        seen.append((steps, hsteps, want))
        for name in ("n", "d", "q"):
            ref.maps(pair[0])[name].clear()
            host.clear_map(pair[1], name)

    for ep, batch in enumerate(epochs):
        if ep == 2:                  # b from 3 on, a ends there
            ref.rearm(b[0], 3, replaces=a[0]), host.rearm(b[1], 3, replaces=a[1])
        if ep == 4:                  # a's steps 1-2 final: folded, emptied, rearmed from 5
            fold(a, {1, 2})
            ref.rearm(a[0], 5, replaces=b[0]), host.rearm(a[1], 5, replaces=b[1])
        if ep == 6:
            fold(b, {3, 4})
        for c in batch:
            ref.fire(c)
        host.fire(batch)
    fold(a, {5, 6, 7, 8})
    assert not probs, "\n".join(probs[:20])
    assert all(s == h == w for s, h, w in seen), seen
    rc, hc = G.coverage_dict(ref.coverage(a[0])), G.coverage_dict(host.coverage(a[1]))
    assert rc == hc and {c.epoch for c in ref.coverage(a[0])} == {1, 2, 5, 6, 7, 8}


class _CompiledDevice(ReferenceDevice):
    """runtime.summary_windows.ReferenceDevice (the device runtime protocol) over
    HostCompiledRuntime instead of the reference runtime: the device's tables, maps and
    compiled code built by g++, every attach compiled (the compiled tier's session after its
    first swap); a step's records fired as one batch, a map emptied by the device layout's
    clear."""

    def __init__(self, **kw):
        super().__init__(W)
        self.rt = C.HostCompiledRuntime(W, opt="-O0", **kw)
        self.rt.DEFAULT_TIER = self.tier = "compiled"

    def run_step(self, records):
        self.rt.fire(records)
        self.started += 1

    def clear_map(self, aid, name):
        self.cleared.append(name)
        self.rt.clear_map(aid, name)

    def first_epoch_of(self, aid):
        return self.rt._get(aid).first_epoch


@needs_gxx
@pytest.mark.parametrize("inline,descriptors", [(False, False), (True, False), (True, True)],
                         ids=["ring", "inline", "descriptors"])
def test_a_buffered_device_query_is_exact_per_interval_on_the_devices_compiled_code(inline, descriptors):
    """runtime.device_query.BufferedQueryRun end to end on the device's code (g++): the
    query and its parked twin compiled, a cut every few steps rearms the idle one, a folded
    one is emptied with clear_map (the device layout's clear); every interval's maps and
    coverage equal a reference attachment fed exactly the steps its header names."""
    from dtrace_mk.runtime.device_query import BufferedQueryRun, device_query_run
    text = ("task:end { @n[task.class] = count(); @d = hist(task.dur_ns); @m[worker] = max(task.dur_ns); }\n"
            "interval:ms:1 { print(@n); print(@d); print(@m); clear(@n); clear(@d); clear(@m); }\n")
    res = compile_query(text, None, name="<buffered>")
    rnd = random.Random(44)
    steps = [hook_contexts(rnd, 60, ep, index0=1000 * ep) for ep in range(12)]
    dev = _CompiledDevice(inline=inline, descriptors=descriptors)
    q = device_query_run(res.obj, dev)
    assert isinstance(q, BufferedQueryRun)
    q.begin()
    q.tick(0)
    clock = 0
    for k, batch in enumerate(steps):
        dev.run_step(batch)
        dev.final = k - 1                        # the kernel one step ahead of its flushes
        if k in (2, 5, 8):
            clock += 1_000_000
        q.tick(clock)
    dev.final = len(steps) - 1
    blocks = q.finish()
    heads = [i for i, b in enumerate(blocks) if b["type"] == "interval"]
    assert [blocks[i]["steps"] for i in heads] == [[0, 2], [3, 5], [6, 8]]
    assert [f for _, f in dev.rearmed] == [3, 6, 9] and len(dev.rt._atts) == 2
    for i in heads:
        lo, hi = blocks[i]["steps"]
        ref = ReferenceRuntime(num_workers=W)
        ra = ref.attach(res.obj, first_epoch=lo)
        for k in range(lo, hi + 1):
            for c in steps[k]:
                ref.fire(c)
        want = {pm["name"]: printing.map_block(pm, ref.maps(ra), ref.coverage(ra), q.plan["names"], "x")
                for pm in q.plan["maps"]}
        for m in blocks[i + 1:i + 4]:
            w = want[m["name"]]
            key = lambda e: str(e["key"])      # noqa: E731  (merge orders entries its own way)
            assert sorted(m["entries"], key=key) == sorted(w["entries"], key=key), (lo, hi, m["name"])
            assert m["coverage"] == w["coverage"], (lo, hi, m["name"])


def test_rearm_is_checked():
    obj = compile_query("task:end { @n[step] = count(); }", None, name="<w>").obj
    ref = ReferenceRuntime(num_workers=W)
    a = ref.attach(obj, first_epoch=4)
    b = ref.attach(obj, first_epoch=PARKED)
    with pytest.raises(UserError, match=r"rearm: attachment 1 still counts \(from epoch 4 on, no end\)"):
        ref.rearm(a, 9)
    with pytest.raises(UserError, match=r"rearm: no attachment 7 \(attached ones: \[1, 2\]\)"):
        ref.rearm(7, 9)
    with pytest.raises(UserError, match="rearm: attachment 2 cannot replace itself"):
        ref.rearm(b, 9, replaces=b)
    ref.rearm(b, 9, replaces=a)
    assert (ref._get(a).end_epoch, ref._get(b).first_epoch, ref._get(b).end_epoch) == (9, 9, 0)
    c = ref.attach(obj, first_epoch=PARKED)
    ref.rearm(c, 12, replaces=b)
    with pytest.raises(UserError, match=r"rearm: attachment 1: first_epoch 7 must be in 9..4294967294 "
                                        r"\(it counted epochs before 9\)"):
        ref.rearm(a, 7)


def test_replaces_is_checked():
    obj = compile_query("task:end { @n[step] = count(); }", None, name="<w>").obj
    ref = ReferenceRuntime(num_workers=W)
    a = ref.attach(obj, first_epoch=4)
    with pytest.raises(UserError, match=r"replaces=9: no such attachment \(attached ones: \[1\]\)"):
        ref.attach(obj, first_epoch=8, replaces=9)
    with pytest.raises(UserError, match="first_epoch 4 must be after the replaced attachment's first epoch 4"):
        ref.attach(obj, first_epoch=4, replaces=a)
    assert ref.attachments() == [a] and ref._get(a).end_epoch == 0      # refused: nothing changed


def _slot_flags(rt):
    """{(hook id, program name): table flags} of every published slot."""
    out = {}
    for hid in C.HOOK_IDS:
        t = rt.host_tables[hid]
        for k, (att, dp) in enumerate(rt._by_hook[hid]):
            out[(hid, att.id, dp.program.name)] = (int(t["progs"][k]["flags"]), dp, att)
    return out


def _run(objs, epochs, *, inline, opt="-O0", fires=True, descriptors=False, lean_domains=None):
    """Reference and host-compiled runtimes, the same objects, one fire() per epoch batch.
    fires=False: per-event outcomes not compared (an inline event whose key the flush
    refuses is EXECUTED at the site and lost at the epoch end: only coverage says so)."""
    ref = ReferenceRuntime(num_workers=W)
    host = C.HostCompiledRuntime(W, inline=inline, opt=opt, descriptors=descriptors, lean_domains=lean_domains)
    pairs = [(ref.attach(o), host.attach(o)) for o in objs]
    probs = []
    for batch in epochs:
        rres = [ref.fire(c) for c in batch]
        res = host.fire(batch)
        if fires:
            probs += G.compare_fires(rres, res)
    for ra, ha in pairs:
        probs += G.compare_maps(ref.maps(ra), host.maps(ha), ordered=True)
        rc, hc = G.coverage_dict(ref.coverage(ra)), G.coverage_dict(host.coverage(ha))
        if rc != hc:
            probs.append(f"coverage of attachment {ra}: reference {rc} host {hc}")
    return ref, host, pairs, probs


def _groups(objs, limit=D.MAX_PROGS):
    """Objects packed so that no hook gets more than `limit` programs (one build each)."""
    group, per_hook = [], defaultdict(int)
    for o in objs:
        need = defaultdict(int)
        for p in o.programs:
            need[p.hook.id] += 1
        if any(per_hook[h] + k > limit for h, k in need.items()):
            yield group
            group, per_hook = [], defaultdict(int)
        group.append(o)
        for h, k in need.items():
            per_hook[h] += k
    if group:
        yield group


N_QUERIES = 20
# one map updated by an inline program and by one on the ring path (refused: two maps, evidence)
MIXED = ["task:end { @mix[task.class] = count(); @other[worker] = sum(task.dur_ns); }\n"
         "task:begin { @mix[task.class] = count(); }",
         "task:ready { @mx[worker] = max(queue.depth); }\n"
         "task:begin /queue.depth > 1000/ { @mx[worker] = max(queue.depth); evidence(worker, queue.depth); }"]


@needs_gxx
def test_random_aggregation_queries_inline_match_the_reference():
    rnd = random.Random(20261201)
    objs = [compile_query(random_query(rnd, qi), None, name=f"<q{qi}>").obj for qi in range(N_QUERIES)]
    objs.append(compile_query(SUMMARY_QUERY, None, name="<summary>").obj)
    objs.extend(compile_query(q, None, name="<mixed>").obj for q in MIXED)
    ran_inline, ran_ring, executed, kinds = 0, 0, 0, set()
    for gi, group in enumerate(_groups(objs)):
        epochs = [hook_contexts(rnd, 240, ep, index0=1000 * ep) for ep in range(4)]
        ref, host, pairs, probs = _run(group, epochs, inline=True)
        assert not probs, f"group {gi}:\n" + "\n".join(probs[:20])
        for (hid, aid, name), (flags, dp, att) in _slot_flags(host).items():
            plan = analyse(dp.program, att.maps.defs)
            ok = plan.ok
            assert bool(flags & C.PROG_F_INLINE) == ok and flags & C.PROG_F_COMPILED, (aid, name)
            kinds |= {(im.kind, im.ops) for im in plan.maps.values()}
            ran_inline += ok
            ran_ring += not ok
        executed += sum(c.executed for ra, _ in pairs for c in ref.coverage(ra))
        # the harness's path (inline=False): the same result, no slot flagged inline
        ref2, host2, _, probs2 = _run(group, epochs, inline=False)
        assert not probs2, f"group {gi}, inline=False:\n" + "\n".join(probs2[:20])
        assert not any(f & C.PROG_F_INLINE for f, _, _ in _slot_flags(host2).values())
    # not vacuous: most programs ran inline, some on the ring path, many events executed
    assert ran_inline >= 20 and ran_ring >= 2 and executed > 3000, (ran_inline, ran_ring, executed)
    assert {("hash", ADD), ("hash", MAX), ("hash", ADD | ADD << 2), ("hist_log2", ADD),
            ("hist_linear", ADD)} <= kinds, kinds


@needs_gxx
def test_a_broken_shadow_update_is_caught(monkeypatch):
    """hist through the shadow adding 2 per event: the differential test must see it."""
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    rnd = random.Random(3)
    epochs = [hook_contexts(rnd, 100, ep) for ep in range(2)]
    assert not _run([obj], epochs, inline=True)[3]
    orig = C.translator._inline_call
    monkeypatch.setattr(C.translator, "_inline_call", lambda *a: orig(*a).replace("e_->val[0] += 1;", "e_->val[0] += 2;"))
    probs = _run([obj], epochs, inline=True)[3]
    assert any(p.startswith("map lat:") for p in probs), probs
    assert not any(p.startswith(("map dep_wait", "map queue")) for p in probs), probs


# ------------------------------------------------------------------ full maps, full shadow

def _shrunk(query, entries):
    obj = compile_query(query, None, name="<full>").obj
    obj.maps[:] = [dataclasses.replace(m, max_entries=entries) if m.type != "per_worker_array" else m
                   for m in obj.maps]
    return obj


FULL_QUERIES = ["task:end { @c[task.class] = count(); }",
                "task:end { @s[task.class] = sum(task.dur_ns); }",
                "task:end { @m[task.class] = max(task.dur_ns); }",
                "task:end { @a[task.class] = avg(task.dur_ns); }",
                "task:end { @h[task.class] = hist(task.dur_ns); }",
                "task:end { @l[task.class] = lhist(task.dur_ns, 0, 1048576, 65536); }"]


@needs_gxx
def test_a_map_filled_in_an_earlier_epoch_loses_exactly_as_the_reference():
    """3 entries taken in epoch 0; later epochs bring new keys, which the flush (inline)
    and the insert path (reference) both refuse: maps, stats.lost and coverage rows equal.
    A two-map program (on the ring path) too: its refused event is lost once, not twice."""
    objs = [_shrunk(q, 3) for q in FULL_QUERIES] + [
        _shrunk("task:end { @a[task.class] = count(); @b[task.class] = sum(task.dur_ns); }", 3)]
    rnd = random.Random(11)
    epochs = [hook_contexts(rnd, 60, 0, classes=3, hooks=("task:end",))]
    epochs += [hook_contexts(rnd, 120, ep, classes=8, hooks=("task:end",), index0=1000 * ep) for ep in (1, 2, 3)]
    ref, host, pairs, probs = _run(objs, epochs, inline=True, fires=False)
    assert not probs, "\n".join(probs[:20])
    flags = [f & C.PROG_F_INLINE for f, _, _ in _slot_flags(host).values()]
    assert sum(map(bool, flags)) == len(FULL_QUERIES)          # the two-map program stays on the ring
    for ra, _ in pairs:
        assert sum(m.stats.lost for m in ref.maps(ra)) > 100
        assert sum(c.lost for c in ref.coverage(ra)) > 100


def _events_by_class(epochs):
    """{epoch: {class: number of task:end events}}"""
    out = defaultdict(lambda: defaultdict(int))
    for batch in epochs:
        for rec in batch:
            f = context.unpack(rec)
            out[f["decode_step"]][f["task_class"]] += 1
    return out


def _key_class(k: bytes) -> int:
    return int.from_bytes(k, "little")


@needs_gxx
def test_new_keys_competing_for_the_last_entries():
    """8 classes for 3 entries within one epoch: which keys get in may differ from the
    reference's (the flush inserts in shadow order, as workers race on the device), but
    each runtime keeps exactly 3 keys whose values are complete (the unshrunk map's), and
    loses every event of the other keys: stats.lost and each epoch's coverage say so."""
    rnd = random.Random(12)
    epochs = [hook_contexts(rnd, 150, ep, classes=8, hooks=("task:end",), index0=1000 * ep) for ep in range(3)]
    per_epoch = _events_by_class(epochs)
    for q in FULL_QUERIES:
        obj = _shrunk(q, 3)
        ref, host, pairs, _ = _run([obj], epochs, inline=True, fires=False)
        full = ReferenceRuntime(num_workers=W)
        fa = full.attach(compile_query(q, None, name="<unshrunk>").obj)
        for batch in epochs:
            for c in batch:
                full.fire(c)
        (ra, ha), = pairs
        name = obj.maps[0].name
        complete = full.maps(fa)[name].snapshot()
        for rt, aid in ((ref, ra), (host, ha)):
            m = rt.maps(aid)[name]
            snap = m.snapshot()
            kept = {_key_class(k) for k in snap}
            assert len(kept) == 3, (q, rt, kept)
            assert all(snap[k] == complete[k] for k in snap), (q, rt)
            lost = {ep: sum(n for cl, n in by.items() if cl not in kept) for ep, by in per_epoch.items()}
            assert m.stats.lost == sum(lost.values()) > 0, (q, rt)
            rows = {c.epoch: (c.eligible, c.executed, c.throttled, c.lost) for c in rt.coverage(aid)}
            assert rows == {ep: (sum(by.values()), sum(by.values()) - lost[ep], 0, lost[ep])
                            for ep, by in per_epoch.items()}, (q, rt)
        assert _slot_flags(host)[(HOOK.id, ha, "c0_task_end")][0] & C.PROG_F_INLINE


@needs_gxx
def test_more_keys_than_the_shadow_holds_fall_back_to_the_helpers():
    """~600 distinct keys per program in one fire() (two epochs interleaved): far more
    than the DTMK_SH_N shadow entries and 16-probe windows; every map stays exact."""
    queries = ["task:end { @c[task.index] = count(); }",
               "task:end { @s[task.index & 511] = sum(task.dur_ns); }",
               "task:end { @m[task.index % 300] = max(task.dur_ns); }",
               "task:end { @h[task.index] = hist(task.dur_ns); }",
               "task:end { @l[task.index & 255] = lhist(task.dur_ns, -500, 500, 50); }"]
    objs = [compile_query(q, None, name=f"<many{i}>").obj for i, q in enumerate(queries)]
    rnd = random.Random(13)
    batch = hook_contexts(rnd, 600, 0, hooks=("task:end",)) + hook_contexts(rnd, 600, 1, hooks=("task:end",),
                                                                             index0=600)
    rnd.shuffle(batch)
    ref, host, pairs, probs = _run(objs, [batch, hook_contexts(rnd, 50, 2, hooks=("task:end",))], inline=True)
    assert not probs, "\n".join(probs[:20])
    assert all(f & C.PROG_F_INLINE for f, _, _ in _slot_flags(host).values())
    sizes = [len(host.maps(ha)[o.maps[0].name].snapshot()) for (_, ha), o in zip(pairs, objs)]
    assert min(sizes) > SH_N, sizes


HAND_QUALIFY = [
    ("add and raise", lambda: _prog(XADD + "jgt r7, 100, tri\n" + "tri:\n" + RAISE)),
    ("4-byte key", lambda: _prog(XADD, key=4)),
    ("hist_add", lambda: _hist_prog("mov r0, 0\nexit\n")),
    ("hist_add then a branch", lambda: _hist_prog(HIST_BRANCH)),
]


@needs_gxx
def test_hand_written_programs_match_the_reference():
    """Every hand-written program above, qualifying or not, gives the reference's maps and
    coverage with inline=True (the refused ones on the ring path: a lookup with no insert,
    a fetched or re-used value would differ inline)."""
    objs = []
    for name, make, *_ in REFUSE_ASM + HAND_QUALIFY:
        prog, maps = make()
        objs.append(BpfObject([dataclasses.replace(prog, name=re.sub(r"\W", "_", name))], maps, path=f"<{name}>"))
    rnd = random.Random(14)
    epochs = [hook_contexts(rnd, 150, ep, classes=6, hooks=("task:end",), index0=1000 * ep) for ep in range(4)]
    n_inline = 0
    for group in _groups(objs):
        ref, host, pairs, probs = _run(group, epochs, inline=True)
        assert not probs, "\n".join(probs[:20])
        n_inline += sum(bool(f & C.PROG_F_INLINE) for f, _, _ in _slot_flags(host).values())
    assert n_inline == len(HAND_QUALIFY)


@needs_gxx
def test_attach_detach_between_epochs_and_what_never_runs_inline():
    """Tables republished between fire() calls (attach, detach: new program_gen rows) give
    the reference's maps and coverage; sampled or rate-limited attachments stay on the
    ring path (the warp's tickets); first_epoch is honoured inline as on the ring path."""
    summary = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    extra = compile_query("task:end { @n[task.class] = count(); }\ntask:ready { @r = count(); }", None, name="<x>").obj
    rnd = random.Random(15)
    epochs = [hook_contexts(rnd, 120, ep, index0=1000 * ep) for ep in range(5)]
    ref, host = ReferenceRuntime(num_workers=W), C.HostCompiledRuntime(W, inline=True, opt="-O0")
    a = (ref.attach(summary), host.attach(summary))
    probs = []
    for ep, batch in enumerate(epochs):
        if ep == 1:
            b = (ref.attach(extra), host.attach(extra))
        if ep == 3:
            ref.detach(a[0])
            host.detach(a[1])
        rres = [ref.fire(c) for c in batch]
        probs += G.compare_fires(rres, host.fire(batch))
    for ra, ha in (a, b):
        probs += G.compare_maps(ref.maps(ra), host.maps(ha), ordered=True)
        rc, hc = G.coverage_dict(ref.coverage(ra)), G.coverage_dict(host.coverage(ha))
        assert len({k[3] for k in rc}) >= 2                          # rows of several program_gens
        if rc != hc:
            probs.append(f"coverage {ra}: reference {rc} host {hc}")
    assert not probs, "\n".join(probs[:20])
    assert all(f & C.PROG_F_INLINE for f, _, _ in _slot_flags(host).values())

    # sampling / rate limit: compiled, not inline; first_epoch: same rows inline or not
    for kw in (dict(sample_every=3), dict(max_per_epoch=5)):
        rt = C.HostCompiledRuntime(W, inline=True, opt="-O0")
        rt.attach(summary, **kw)
        assert {f & (C.PROG_F_INLINE | C.PROG_F_COMPILED) for f, _, _ in _slot_flags(rt).values()} == \
            {C.PROG_F_COMPILED}, kw
    # (first_epoch 2 = the reference fed from epoch 2 on; compiled.py's _publish once dropped it)
    ref = ReferenceRuntime(num_workers=W)
    ra = ref.attach(summary)
    for batch in epochs[2:]:
        for c in batch:
            ref.fire(c)
    want = (G.snapshot(ref.maps(ra)), G.coverage_dict(ref.coverage(ra)))
    for inline in (True, False):
        rt = C.HostCompiledRuntime(W, inline=inline, opt="-O0")
        aid = rt.attach(summary, first_epoch=2)
        for batch in epochs:
            rt.fire(batch)
        assert (G.snapshot(rt.maps(aid)), G.coverage_dict(rt.coverage(aid))) == want, inline
        assert bool(_slot_flags(rt)[(HOOK.id, aid, "c0_task_end")][0] & C.PROG_F_INLINE) == inline


# ------------------------------------------------------------------ NVRTC / nvJitLink

def _summary_monitor_source():
    """The summary's monitor as a runtime publishes it: programs and their inline forms."""
    rt = C.HostCompiledRuntime(4, inline=True)
    rt.attach(compile_query(SUMMARY_QUERY, None, name="<summary>").obj)
    return rt.monitor()


def test_the_summary_monitor_with_inline_forms_compiles_to_ltoir():
    pytest.importorskip("cuda.bindings.nvrtc")
    src = _summary_monitor_source()
    assert len(re.findall(r"int dtmk_cm_iprog_\d+\(", src)) == 3
    assert src.count("dtmk_sh_get(S, ") == 5 and "dtmk_bucket_log2(r3)" in src
    for h in ("task:end", "dep:release", "task:ready"):
        hid = abi.hook(h).id
        body = src[src.index(f"int dtmk_cm_inline_{hid}("):]
        assert "return dtmk_cm_iprog_" in body[:body.index("\n}\n")], h
    ir = C.ltoir(src, "summary_inline.cu")
    assert len(ir) > 10000


@pytest.mark.slow
def test_the_megakernel_links_with_the_summary_inline_monitor():
    """What a promotion links (stage 1): megakernel.cu -DDTMK_COMPILED_TIER + the summary
    monitor with its inline forms; every inline entry point resolves."""
    pytest.importorskip("cuda.bindings.nvrtc")
    if not C.nvjitlink_available():
        pytest.skip("nvJitLink is not installed (pip nvidia-nvjitlink)")
    path, _ = C.build_linked(_summary_monitor_source(), C.megakernel_spec(), C.STAGE_FAST)
    cubin = path.read_bytes()
    kernel, _ = C.kernel_object(C.megakernel_spec(), C.STAGE_FAST)     # cached by build_linked
    assert b"dtmk_cm_inline_4" in kernel                               # the hook sites call the inline form
    assert cubin[:4] == b"\x7fELF" and b"dtmk_megakernel" in cubin
    assert all(f"dtmk_cm_inline_{abi.hook(h).id}".encode() in cubin for h in ("task:end", "dep:release", "task:ready"))


# ------------------------------------------------------------------ device encoding of the ring form

def test_raise_and_lower_to_stores_become_atomics_on_the_device_and_decode_back():
    """extremum_stores names exactly the stxdw of a well-formed raise-to (jge) / lower-to
    (jle) triple; encode_program turns it into the device-only `stxdw_max` / `stxdw_min`
    (atomic: lanes and workers racing on one key keep the extreme value) and
    decode_program gives the stxdw back; the summary's task:ready program, min() and
    stats() therefore need no serial warp (DTMK_PROG_F_SERIAL)."""
    from dtrace_mk.bpf.devicegen import NAME_OF_OP, OP
    from dtrace_mk.runtime.inline import extremum_stores, writes_values
    lower = RAISE.replace("jge", "jle")
    for body, kind in ((XADD + RAISE, "max"), (XADD + lower, "min")):
        prog, maps = _prog(body)
        es = extremum_stores(prog, maps)
        assert list(es.values()) == [kind]
        (pc,) = es
        assert prog.insns[pc].opcode == 0x7b and prog.insns[pc - 2].opcode == 0x79   # stxdw after ldxdw
        recs = D.encode_program(prog.insns, [0x1000], [0], "p", es)
        names = [NAME_OF_OP[int(r["op"])] for r in recs]
        plain = D.encode_program(prog.insns, [0x1000], [0], "p")
        assert names.count("stxdw_" + kind) == 1
        assert [n if n != "stxdw_" + kind else "stxdw" for n in names] == [NAME_OF_OP[int(r["op"])] for r in plain]
        assert [i.opcode for i in D.decode_program(recs, [0x1000], [0])] == [i.opcode for i in prog.insns]
        assert not writes_values(prog, maps)
        assert OP["stxdw_" + kind] >> 4 == OP["stxdw"] >> 4      # the memory group of the VM's switch
    # a plain store, a triple whose loaded value is used after, one entered in its middle: no
    for text in ("stxdw [r0+0], r7\n", RAISE + "jgt r1, 900000, out\n" + XADD,
                 "jgt r7, 100, mid\n" + RAISE.replace("stxdw", "mid:\nstxdw")):
        p, m = _prog(text)
        assert extremum_stores(p, m) == {} and writes_values(p, m), text
    sm = compile_query(SUMMARY_QUERY, name="summary").obj
    assert [list(extremum_stores(p, sm.maps).values()) for p in sm.programs] == [[], [], ["max"]]
    assert not any(writes_values(p, sm.maps) for p in sm.programs)
    q = compile_query("task:end { @lo[task.class] = min(task.dur_ns); @st[task.class] = stats(task.dur_ns); }").obj
    (p,) = q.programs
    assert sorted(extremum_stores(p, q.maps).values()) == ["max", "min", "min"] and not writes_values(p, q.maps)


def test_a_triple_followed_by_a_branch_is_an_extremum_store_when_its_register_dies_on_every_path():
    """The loaded register must be dead after the triple on EVERY path: a conditional jump
    after it is followed both ways (session 40: a min() followed by an `if` was missed, so
    the agent's task:ready program stored t_begin plainly and raced between workers on the
    GPU).  Written on both paths: a triple; read on one of them: not."""
    from dtrace_mk.runtime.inline import extremum_stores, writes_values
    both = RAISE + "jgt r7, 5, +2\nmov r1, 1\nja +1\nmov r1, 2\nxadddw [r0+0], r1\n"
    p, m = _prog(both)
    assert list(extremum_stores(p, m).values()) == ["max"] and not writes_values(p, m)
    one = RAISE + "jgt r7, 5, +2\nmov r1, 1\nja +1\nxadddw [r0+0], r1\n"      # the taken edge reads r1
    p, m = _prog(one)
    assert extremum_stores(p, m) == {} and writes_values(p, m)
    q = compile_query("task:ready { @a[step] = min(ts); if (!(flags & 1)) { @b[step, event.id] = min(ts); } }").obj
    (p,) = q.programs
    assert sorted(extremum_stores(p, q.maps).values()) == ["min", "min"] and not writes_values(p, q.maps)


@needs_gxx
def test_table_flags_serial_only_for_plain_value_writes():
    """DTMK_PROG_F_SERIAL (4) is published for a program with a plain map-value store and
    for no program of the summary; compiled slots carry it next to their own flags."""
    rt = C.HostCompiledRuntime(2)
    rt.attach(compile_query(SUMMARY_QUERY, name="summary").obj)
    p, m = _prog("stxdw [r0+0], r7\n")
    rt.attach(BpfObject(programs=[p], maps=m))
    flags = [int(rt.host_tables[h]["progs"][k]["flags"]) for h in range(1, abi.MAX_HOOK_ID + 1)
             for k in range(int(rt.host_tables[h]["n_progs"]))]
    assert sum(bool(f & D.PROG_F_SERIAL) for f in flags) == 1
    assert all(f & C.PROG_F_COMPILED for f in flags)


@needs_gxx
def test_forms_say_which_programs_run_inline_and_why_not():
    """runtime.forms(aid): "inline" per program, else "ring: <reason>" (the plan's refusal,
    sampling, or a runtime that runs compiled programs through the ring); `dtrace-mk top`
    shows the count in its header."""
    from dtrace_mk.commands.top import _inline_note
    summary = compile_query(SUMMARY_QUERY, name="summary").obj
    rt = C.HostCompiledRuntime(2, inline=True)
    a = rt.attach(summary)
    assert set(rt.forms(a).values()) == {"inline"}
    b = rt.attach(compile_query("task:end { @m[task.class] = min(task.dur_ns); }").obj)
    (why,) = rt.forms(b).values()
    assert re.fullmatch(r"ring: insn \d+: map 'm': a min \(the shadow combines adds and maxima\)", why), why
    c = rt.attach(summary, sample_every=4)
    assert all(f.startswith("ring: sampling") for f in rt.forms(c).values())
    ring = C.HostCompiledRuntime(2)
    d = ring.attach(summary)
    assert set(ring.forms(d).values()) == {"ring: the runtime runs compiled programs through the ring"}

    class Live:                                 # what top reads of a LiveSession
        pass
    live = Live()
    live.rt = rt
    assert _inline_note(live, a) == " (inline 3/3)" and _inline_note(live, b) == " (inline 0/1)"


@needs_gxx
def test_tables_publish_the_context_words_their_programs_read():
    """dtmk_hook_table.ctx_reads: bit i when a program of the hook reads context word i
    (from the verifier's context offsets); the megakernel's lazy hold (default) keeps the
    pre-signal request_gen read (word 13) only when some program's bit 13 is set."""
    from dtrace_mk.runtime.inline import ctx_reads
    sm = compile_query(SUMMARY_QUERY, name="summary").obj
    words = {p.hook.name: [i for i in range(32) if ctx_reads(p, sm.maps) >> i & 1] for p in sm.programs}
    assert words == {"task:end": [7, 24, 25], "dep:release": [7, 26, 27], "task:ready": [6, 23]}
    rt = C.HostCompiledRuntime(2)
    rt.attach(sm)
    end = abi.hook("task:end").id
    assert int(rt.host_tables[end]["ctx_reads"]) == 1 << 7 | 1 << 24 | 1 << 25
    rt.attach(compile_query("task:end { @g[req.gen] = count(); }").obj)
    assert int(rt.host_tables[end]["ctx_reads"]) >> 13 & 1                  # request_gen: word 13
    assert int(rt.host_tables[abi.hook("task:ready").id]["ctx_reads"]) == 1 << 6 | 1 << 23


# ------------------------------------------------------------------ one walk at attach

def test_verified_gives_the_verdict_and_the_facts_of_one_walk(monkeypatch):
    """The device runtimes' attach verifies and studies each program in ONE verifier walk
    (inline.verified): the same VerifyResult as verify(), the same ProgramFacts as
    study(), and a rejected program raises what verify() raises."""
    from dtrace_mk.bpf.verifier import VerifierError, checker, verify
    from dtrace_mk.runtime import inline
    obj = compile_query(SUMMARY_QUERY, None, name="<summary>").obj
    monkeypatch.setattr(inline, "_VERIFIED", {})           # (nothing kept from earlier tests)
    runs = []
    real_run = checker.Checker.run
    monkeypatch.setattr(checker.Checker, "run", lambda self, order: (runs.append(1), real_run(self, order))[1])
    for p in obj.programs:
        runs.clear()
        res, facts = inline.verified(p, obj.maps)
        assert len(runs) == 1
        assert res == verify(p, obj.maps) and facts == inline.study(p, obj.maps)
        assert facts.plan.ok and facts.ctx_reads
    bad = dataclasses.replace(obj.programs[0], insns=list(obj.programs[0].insns[:-1]))   # no exit
    with pytest.raises(VerifierError) as want:
        verify(bad, obj.maps)
    with pytest.raises(VerifierError) as got:
        inline.verified(bad, obj.maps)
    assert str(got.value) == str(want.value)
