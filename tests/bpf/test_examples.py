"""The example C monitors (examples/monitors/*.c), built with the distro clang: what the
loader makes of them, that the verifier accepts them, and what they compute in the
reference runtime over a few context records."""
from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import isa
from dtrace_mk.bpf.elf import RODATA_MAP, load_object
from dtrace_mk.bpf.elfwrite import write_object
from dtrace_mk.bpf.maps import linear_bucket, log2_bucket
from dtrace_mk.bpf.verifier import verify
from dtrace_mk.runtime.reference import ReferenceRuntime

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "monitors"


def _build_module():
    spec = importlib.util.spec_from_file_location("monitors_build", EXAMPLES / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _build_module()


@pytest.fixture(scope="module")
def objs(tmp_path_factory, clang):
    out = tmp_path_factory.mktemp("monitors")
    return {src.stem: load_object(build.compile_monitor(src, out, clang=clang)) for src in build.EXAMPLES}


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64s(b: bytes):
    return struct.unpack(f"<{len(b) // 8}Q", b)


def refs(prog):
    return [ins.map_ref for ins in prog.insns if ins.is_lddw and ins.src]


def test_every_example_is_built(objs):
    assert set(objs) == {"task_latency", "dep_wait", "slow_tasks"}
    for name, obj in objs.items():
        assert obj.abi_version == abi.ABI_VERSION and obj.license == "Dual MIT/GPL", name


def test_examples_round_trip_through_the_writer(objs):
    for name, obj in objs.items():
        again = load_object(write_object(obj), name=name)
        assert again.maps == obj.maps, name
        assert [(p.name, p.section, p.insns) for p in again.programs] == \
               [(p.name, p.section, p.insns) for p in obj.programs], name


def test_examples_disassemble_and_reassemble(objs):
    from dtrace_mk.bpf import asm
    for name, obj in objs.items():
        names = [m.name for m in obj.maps]
        for p in obj.programs:
            assert asm.assemble(asm.disassemble(p.insns), names) == p.insns, (name, p.name)


def test_examples_verify(objs):
    seen = {}
    for name, obj in objs.items():
        for p in obj.programs:
            res = verify(p, obj.maps)
            seen[p.name] = {abi.HELPERS_BY_ID[h].name for h in res.helpers_used}
            assert res.max_path_insns <= res.insn_count
    assert seen == {
        "task_latency": {"hist_add"},
        "dispatch_queue_depth": {"hist_add"},
        "dep_wait_by_layer": {"map_lookup_elem", "map_update_elem"},
        "remote_wait_by_peer": {"map_lookup_elem"},
        "slow_task_evidence": {"ringbuf_output", "map_lookup_elem", "trace_printk"},
    }


# --- task_latency.c ----------------------------------------------------------------------

def test_task_latency_object(objs):
    obj = objs["task_latency"]
    assert [(p.name, p.hook.name) for p in obj.programs] == [
        ("task_latency", "task:end"), ("dispatch_queue_depth", "task:dispatch")]
    lat, q = obj.map_by_name("lat_by_class"), obj.map_by_name("queue_depth_hist")
    assert (lat.type, lat.key_size, lat.value_size, lat.max_entries) == ("hist_log2", 4, 512, 64)
    assert (q.type, q.lin_lo, q.lin_hi, q.lin_step, q.hist_buckets) == ("hist_linear", 0, 64, 4, 18)
    assert refs(obj.program("task_latency")) == ["lat_by_class"]
    assert refs(obj.program("dispatch_queue_depth")) == ["queue_depth_hist"]


def test_task_latency_runs(objs):
    obj = objs["task_latency"]
    rt = ReferenceRuntime(num_workers=2)
    aid = rt.attach(obj)
    ends = [(3, 1100), (3, 1500), (3, 70000), (5, 0), (5, 9)]
    for i, (cls, dur) in enumerate(ends):
        rt.fire(context.pack("task:end", worker=i % 2, task_class=cls, dur_ns=dur, layer=i))
    depths = [0, 3, 4, 63, 64, 1000]
    for d in depths:
        rt.fire(context.pack("task:dispatch", worker=1, queue_depth=d, task_class=1))
    hist = rt.maps(aid)["lat_by_class"].snapshot()
    expect = {}
    for cls, dur in ends:
        expect.setdefault(u32(cls), [0] * 64)[log2_bucket(dur)] += 1
    assert hist == expect
    assert hist[u32(3)][11] == 2 and hist[u32(3)][17] == 1     # 1100, 1500 in [1024, 2048); 70000 in [2^16, 2^17)
    qh = rt.maps(aid)["queue_depth_hist"].snapshot()
    qdef = obj.map_by_name("queue_depth_hist")
    want = [0] * qdef.hist_buckets
    for d in depths:
        want[linear_bucket(qdef, d)] += 1
    assert qh == {u32(0): want}
    assert want[1] == 2 and want[-1] == 2                      # 0 and 3 in [0,4); 64, 1000 overflow
    cov = {c.program: c for c in rt.coverage(aid)}
    assert (cov["task_latency"].eligible, cov["task_latency"].executed) == (5, 5)
    assert (cov["dispatch_queue_depth"].eligible, cov["dispatch_queue_depth"].executed) == (6, 6)


# --- dep_wait.c ---------------------------------------------------------------------------

def test_dep_wait_object(objs):
    obj = objs["dep_wait"]
    assert [(p.name, p.hook.name) for p in obj.programs] == [
        ("dep_wait_by_layer", "dep:release"), ("remote_wait_by_peer", "comm:wait")]
    dw = obj.map_by_name("dep_wait")
    assert (dw.type, dw.key_size, dw.value_size, dw.value_desc) == ("hash", 4, 16, "struct wait_stat")
    assert obj.map_by_name("remote_wait_ns").type == "per_worker_array"
    # lookup then insert: two references to the same map; atomic adds on the looked-up value
    assert refs(obj.program("dep_wait_by_layer")) == ["dep_wait", "dep_wait"]
    atomics = [i for i in obj.program("dep_wait_by_layer").insns if i.info and i.info.kind == "atomic"]
    assert len(atomics) == 2


def test_dep_wait_runs(objs):
    rt = ReferenceRuntime(num_workers=2)
    aid = rt.attach(objs["dep_wait"])
    waits = [(0, 100), (1, 250), (0, 300), (0, 5), (7, 1)]
    for i, (layer, w) in enumerate(waits):
        rt.fire(context.pack("dep:release", worker=i % 2, layer=layer, wait_ns=w))
    for worker, peer, w in [(0, 1, 700), (1, 1, 50), (1, 3, 9), (0, 99, 1000)]:
        rt.fire(context.pack("comm:wait", worker=worker, peer_rank=peer, wait_ns=w))
    dw = {struct.unpack("<I", k)[0]: u64s(v) for k, v in rt.maps(aid)["dep_wait"].snapshot().items()}
    assert dw == {0: (405, 3), 1: (250, 1), 7: (1, 1)}
    rw = rt.maps(aid)["remote_wait_ns"].snapshot(skip_zero=True)
    assert {struct.unpack("<I", k)[0]: [u64s(x)[0] for x in v] for k, v in rw.items()} == {
        1: [700, 50], 3: [0, 9]}                               # peer 99 >= 64 is ignored


# --- slow_tasks.c -------------------------------------------------------------------------

REC = struct.Struct("<QQQIIIIII")      # struct slow_task


def test_slow_tasks_object(objs):
    obj = objs["slow_tasks"]
    (p,) = obj.programs
    assert (p.name, p.hook.name) == ("slow_task_evidence", "task:end")
    rb = obj.map_by_name("slow_evidence")
    assert (rb.type, rb.budget_bytes, rb.max_entries) == ("ringbuf", 4096, 4096)
    ro = obj.map_by_name(RODATA_MAP)
    assert ro.read_only and ro.init_value == b"slow task class %u layer %u: %llu ns\0"
    assert refs(p) == ["slow_evidence", "slow_count", RODATA_MAP]
    (fmt_ref,) = [i for i in p.insns if i.is_lddw and i.src == isa.PSEUDO_MAP_VALUE]
    assert fmt_ref.imm == obj.maps.index(ro) and (fmt_ref.imm64 >> 32) == 0


def test_slow_tasks_runs_with_budget(objs):
    rt = ReferenceRuntime(num_workers=2)
    aid = rt.attach(objs["slow_tasks"])
    rt.fire(context.pack("task:end", worker=1, dur_ns=20000, task_class=2, layer=0))   # not slow
    rt.fire(context.pack("task:end", worker=1, dur_ns=20001, task_class=2, layer=4, task_index=17,
                         request_slot=3, decode_step=0, ts_ns=123456, tile=0x10002))
    n = 4096 // REC.size + 3                                   # 3 more than the budget holds
    for i in range(n):
        rt.fire(context.pack("task:end", worker=0, dur_ns=50000 + i, task_class=1, layer=i % 4))
    counts = {struct.unpack("<I", k)[0]: u64s(v)[0] for k, v in rt.maps(aid)["slow_count"].snapshot().items()}
    assert counts == {0: n + 1 - 3, 1: 3}                      # [1] = records refused by the budget
    ev = rt.evidence(aid)
    assert len(ev) == n + 1 - 3 and all(name == "slow_evidence" for name, _ in ev)
    first = [r for _, r in ev if r.worker == 1]
    assert len(first) == 1
    assert REC.unpack(first[0].data) == (123456, 20001, 0x10002, 2, 17, 4, 3, 1, 0)
    assert sum(len(r.data) for _, r in ev if r.worker == 0) <= 4096
    lines = rt.trace_lines(aid)
    assert lines[0] == "slow task class 2 layer 4: 20001 ns"
    assert lines[1] == "slow task class 1 layer 0: 50000 ns"
    (cov,) = rt.coverage(aid)
    assert cov.eligible == n + 2 == cov.executed + cov.throttled + cov.lost
    assert cov.throttled >= 3
