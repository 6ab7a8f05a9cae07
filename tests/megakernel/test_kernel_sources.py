"""CI (no GPU): the CUDA sources compile through NVRTC for sm_90a to cubin and to
LTO-IR, and the host's view of the kernel's parameter block and records agrees with
the sources."""
import re

import numpy as np
import pytest

from dtrace_mk.abi import definition as D
from dtrace_mk.megakernel import gpu, gpu_build
from dtrace_mk.kernels.build import include_closure as build_include_closure
from dtrace_mk.kernels import megakernel_text


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))
    return tmp_path


def _is_elf(b: bytes) -> bool:
    return b[:4] == b"\x7fELF"


def test_megakernel_compiles_to_cubin_and_ltoir(fresh_cache):
    cubin = gpu.compile_source("sm_90a", "cubin", use_cache=True)
    assert _is_elf(cubin) and len(cubin) > 10_000
    # cached by source hash: the second call reads the file
    assert list(fresh_cache.glob("*.cubin"))
    assert gpu.compile_source("sm_90a", "cubin") == cubin
    ltoir = gpu.compile_source("sm_90a", "ltoir", use_cache=False)
    assert len(ltoir) > 1000 and not _is_elf(ltoir)


def _sections(elf: bytes) -> dict:
    """{name: bytes} of a 64-bit little-endian ELF's sections."""
    import struct
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab_off, strtab_size = hdrs[shstrndx][4], hdrs[shstrndx][5]
    names = elf[strtab_off:strtab_off + strtab_size]
    return {names[h[0]:names.index(b"\0", h[0])].decode(): elf[h[4]:h[4] + h[5]] for h in hdrs}


def test_lineinfo_adds_a_line_table_and_leaves_the_code_alone(fresh_cache, monkeypatch):
    """$DTRACE_MK_LINEINFO=1 (profiling, tools/ncu_footprint.py): its own cache key, the
    kernel's machine code byte for byte the same, a line table added; never for LTO-IR."""
    plain = gpu.compile_source("sm_90a", "cubin", defines=("DTMK_NO_HOOKS",))
    key = gpu.source_hash("sm_90a", "cubin", ("DTMK_NO_HOOKS",))
    monkeypatch.setenv("DTRACE_MK_LINEINFO", "1")
    assert gpu.lineinfo_options("cubin") == ("-lineinfo",) and gpu.lineinfo_options("ltoir") == ()
    assert gpu.source_hash("sm_90a", "cubin", ("DTMK_NO_HOOKS",)) != key
    lined = gpu.compile_source("sm_90a", "cubin", defines=("DTMK_NO_HOOKS",))
    a, b = _sections(plain), _sections(lined)
    text = [n for n in a if n.startswith(".text.")]
    assert ".text.dtmk_megakernel" in text and all(a[n] == b[n] for n in text)
    assert ".nv_debug_line_sass" in b and ".nv_debug_line_sass" not in a


def test_baseline_compiles(fresh_cache):
    cubin = gpu.compile_source("sm_90a", "cubin", name="baseline.cu", use_cache=False)
    assert _is_elf(cubin)


def test_compile_error_names_file_and_line(fresh_cache, monkeypatch, tmp_path):
    bad = tmp_path / "k"
    bad.mkdir()
    for n in build_include_closure("megakernel.cu"):
        (bad / n).write_bytes((gpu.KERNEL_DIR / n).read_bytes())
    (bad / "megakernel.cu").write_text(megakernel_text() + "\nint broken = no_such_symbol;\n")
    monkeypatch.setattr(gpu_build, "KERNEL_DIR", bad)   # (compile_source reads it there)
    with pytest.raises(gpu.CompileError, match=r"megakernel\.cu\(\d+\)"):
        gpu.compile_source("sm_90a", "cubin", use_cache=False)


def test_param_block_matches_struct():
    src = (gpu.KERNEL_DIR / "mk_ops.cuh").read_text()
    body = src[src.index("struct MkParams {"):]
    body = body[:body.index("};")]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in re.findall(r"dtmk_u64\s+([^;]+);", body):
        names += [n.strip() for n in decl.split(",")]
    assert tuple(names) == gpu.PARAM_FIELDS


def test_record_layouts():
    assert gpu.CTX_DTYPE.itemsize == D.CONTEXT_SIZE == 128
    for f in D.CONTEXT_FIELDS:
        assert gpu.CTX_DTYPE.fields[f.name][1] == f.offset
    assert gpu.TRACE_DTYPE.itemsize == 32
    src = megakernel_text()
    assert "#define TRACE_BYTES 32" in src and "#define TREC_WORDS 16" in src


def test_pack_tables_layout():
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import PRESETS
    g = build_graph(PRESETS["small-moe"], batch=2, num_workers=16)
    t = gpu.pack_tables(g)
    tasks = t["tasks"]
    assert tasks.shape == (len(g.tasks), gpu.TREC_WORDS) and tasks.dtype == np.int32
    for task in g.tasks[:200]:
        row = tasks[task.index]
        assert row[0] == task.cls and row[8] == task.signal_event and row[9] == int(task.dynamic)
        tile = (int(row[10]) & 0xFFFFFFFF) | (int(row[11]) & 0xFFFFFFFF) << 32
        assert tile == task.tile_packed
    # rmsnorms after a MoE layer fold that layer's expert partials
    folds = {int(r[13]) for r in tasks if r[0] == 0 and r[13] >= 0}
    assert folds == set(range(len(g.moe)))
    assert t["plan_off"][-1] == sum(len(p) for p in g.worker_plans)
    # word 15: bit 0 first task of its layer in its worker's plan; bits 1..: the triggers
    # of its signal event (task:end's event_gen without a global load, megakernel.cu)
    firsts = set()
    for plan in g.worker_plans:
        seen = set()
        for i in plan:
            if g.tasks[i].layer not in seen:
                seen.add(g.tasks[i].layer)
                firsts.add(i)
    for task in g.tasks:
        w15 = int(tasks[task.index, 15])
        assert w15 & 1 == (task.index in firsts)
        assert w15 >> 1 == g.events[task.signal_event].triggers
    src = megakernel_text()
    assert "(r[15] & 1)" in src and "P.event_triggers)[sig]" not in src


def test_fault_pick_matches_vectors():
    """The CUDA fault_pick is the shared formula; check the Python twin on the vectors
    and that the CUDA source spells the same constants."""
    import json
    from dtrace_mk.megakernel import faults
    vec = json.loads(faults.VECTORS_PATH.read_text())["vectors"]
    for s, i, k, p in vec[:50]:
        assert faults.fault_pick(s, i, k) == p
    src = (gpu.KERNEL_DIR / "mk_common.cuh").read_text()
    for c in ("0x9E3779B97F4A7C15", "0xBF58476D1CE4E5B9", "0x94D049BB133111EB", "% 1000000"):
        assert c in src


def test_no_barrier_between_a_finished_wait_and_the_next_task():
    """Session 7 (-2.5% per 1b step): a wait whose event arrived leaves right after the
    barrier that publishes the outcome (thread 0 writes none of W.ready / aborted /
    dyn_task / dyn_step / s_t0 before run_task's first barrier), and run_task ends without
    a barrier (the CTA next meets at wait_event's).  -DDTMK_EXTRA_SYNC restores both."""
    src = megakernel_text()
    we = src[src.index("__device__ __noinline__ void wait_event("):]
    spin = we[we.index("int ready = W.ready, aborted = W.aborted"):]
    default = spin[:spin.index("#else")]
    assert default.index("if (ready || aborted) break;") < default.index("MK_SYNC();")
    rt = src[src.index("__device__ __noinline__ void run_task("):]
    rt = rt[:rt.index("\n}\n")]
    tail = rt[rt.rindex("refresh_control(P, W, false);"):]
    assert "#ifdef DTMK_EXTRA_SYNC\n    MK_SYNC();\n#endif" in tail and tail.count("MK_SYNC()") == 1
