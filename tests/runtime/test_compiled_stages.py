"""Two-stage builds of the compiled tier (dtrace_mk.runtime.compiled "Two-stage builds"):
stage 1 links a cached relocatable kernel cubin with the monitor's own cubin (no LTO:
the hook entry points stay real functions), stage 2 is the full LTO link (inlined).
Both for the compiled harness and for the megakernel itself (-DDTMK_COMPILED_TIER).
nvJitLink and NVRTC run without a GPU."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from dtrace_mk.runtime import compiled as C
from dtrace_mk.runtime import device as D

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu"))
import device_progs as G                      # noqa: E402

pytestmark = pytest.mark.skipif(not C.nvjitlink_available(), reason="nvJitLink is not installed")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path_factory.getbasetemp() / "cm_stage_cache"))


def _monitor(seed=6, n_progs=2):
    obj = G.random_object(random.Random(seed), parallel_safe=False, n_progs=n_progs)
    progs = []
    for k, p in enumerate(obj.programs):
        from dtrace_mk.bpf.verifier import verify
        res = verify(p, obj.maps)
        descs = [0x7F00_0000_0000 + 128 * j for j in range(len(obj.maps))]
        vals = [0x7E00_0000_0000 if m.type == "array" else 0 for m in obj.maps]
        progs.append(C.MonitorProgram(p.hook.id, k, p.name, D.encode_program(p.insns, descs, vals),
                                      res.max_path_insns, res.stack_depth))
    return C.monitor_source(progs), {p.hook_id for p in progs}


def test_stage1_harness_link_calls_the_monitor_and_caches():
    mon, hooks = _monitor()
    path, t = C.build_linked(mon, C.HARNESS_SPEC, C.STAGE_FAST)
    cubin = path.read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"dtmk_compiled_harness" in cubin and t.stage == 1
    for h in hooks:                                       # not inlined: the hook site calls it
        assert f"dtmk_cm_hook_{h}".encode() in cubin
    assert b"dtmk_map_lookup" in cubin
    assert t.cached == "" and t.link_s > 0 and t.monitor_ltoir_s > 0
    path2, t2 = C.build_linked(mon, C.HARNESS_SPEC, C.STAGE_FAST)
    assert path2 == path and t2.cached == "cubin"
    # a different monitor reuses the cached kernel cubin: only the monitor is compiled
    mon3, _ = _monitor(seed=7, n_progs=1)
    _, t3 = C.build_linked(mon3, C.HARNESS_SPEC, C.STAGE_FAST)
    assert t3.harness_ltoir_s == 0.0 and t3.monitor_ltoir_s > 0 and t3.cached == ""


def test_stage2_harness_link_inlines_and_differs_from_stage1():
    mon, hooks = _monitor()
    p1, _ = C.build_linked(mon, C.HARNESS_SPEC, C.STAGE_FAST)
    p2, t2 = C.build_linked(mon, C.HARNESS_SPEC, C.STAGE_LTO)
    c2 = p2.read_bytes()
    assert p1 != p2 and t2.stage == 2
    assert b"dtmk_compiled_harness" in c2 and not any(f"dtmk_cm_hook_{h}".encode() in c2 for h in hooks)


def test_stage1_refuses_a_monitor_without_hook_entry_points():
    part = C.PRELUDE + ('extern "C" __device__ int dtmk_cm_hook_1(dtmk_u32 a, const struct dtmk_ctx *c, '
                        'dtmk_u32 w, dtmk_u32 e, dtmk_u32 f, dtmk_u64 *r) { return 4; }\n')
    with pytest.raises(C.LinkError, match=r"dtmk_cm_hook_\d+"):
        C.build_linked(part, C.HARNESS_SPEC, C.STAGE_FAST)


def test_megakernel_stage1_link_with_the_summary_monitor():
    """What LiveSession promotions link: megakernel.cu -DDTMK_COMPILED_TIER as a
    relocatable cubin (register limit of its __launch_bounds__) + the summary monitor's
    cubin.  Catches a kernel change that breaks the -rdc build (e.g. a callee over the
    entry's register limit)."""
    from dtrace_mk.runtime.live import link_megakernel, summary_monitor
    mon = summary_monitor()
    rt = C.HostCompiledRuntime(4)
    rt.attach(mon.obj)
    cubin, _ = link_megakernel(rt.monitor(), "sm_90a", stage=1)
    assert cubin[:4] == b"\x7fELF" and b"dtmk_megakernel" in cubin
    assert b"dtmk_cm_run_records" in cubin
    hooks = {p.hook.id for p in mon.obj.programs}
    assert all(f"dtmk_cm_hook_{h}".encode() in cubin for h in hooks)


@pytest.mark.parametrize("stage", [1, 2])
def test_observer_sm_compiled_tier_links(stage):
    """The compiled tier of an observer-SM build (-DDTMK_OBS_SM: no site form; the
    observer's warps run the linked programs over the records through
    dtmk_cm_run_records): the define reaches the link, both stages link, and at stage 2
    the monitor is inlined into the observer's drain (no hook entry point left)."""
    from dtrace_mk.runtime.live import link_megakernel, summary_monitor
    defines = ("DTMK_OBS_SM",)
    assert "DTMK_OBS_SM" in C.megakernel_spec(defines).defines
    mon = summary_monitor()
    rt = C.HostCompiledRuntime(4)
    rt.attach(mon.obj)
    cubin, _ = link_megakernel(rt.monitor(), "sm_90a", stage=stage, defines=defines)
    assert cubin[:4] == b"\x7fELF" and b"dtmk_megakernel" in cubin
    hooks = {p.hook.id for p in mon.obj.programs}
    entry = [f"dtmk_cm_hook_{h}".encode() in cubin for h in hooks]
    assert all(entry) if stage == 1 else not any(entry)
    if stage == 1:                                         # not the default kernel (its cubin is cached)
        assert cubin != link_megakernel(rt.monitor(), "sm_90a", stage=1)[0]


def test_several_observer_sms_reach_the_compiled_tiers_link():
    """-DDTMK_OBS_SMS=3 (three observer SMs) is one of the defines the compiled tier's
    kernel is built with (else the linked kernel would run one observer's slices on a grid
    planned for three) and that kernel links."""
    from dtrace_mk.runtime.live import link_megakernel, summary_monitor
    defines = ("DTMK_OBS_SM", "DTMK_OBS_SMS=3")
    assert set(defines) <= set(C.megakernel_spec(defines).defines)
    rt = C.HostCompiledRuntime(4)
    rt.attach(summary_monitor().obj)
    cubin, _ = link_megakernel(rt.monitor(), "sm_90a", stage=1, defines=defines)
    assert cubin[:4] == b"\x7fELF" and b"osq_observer" in cubin


def test_kernel_cache_key_covers_every_include(tmp_path, monkeypatch):
    """The stage-1 kernel cubin is cached by the hash of the kernel's include closure: an
    edit to any included file (here a copy of kernels/ with mk_ops.cuh touched) changes it."""
    import shutil
    closure = C.include_closure("megakernel.cu")
    assert {"megakernel.cu", "mk_ops.cuh", "bpf_vm.cuh", "bpf_compiled.cuh", "bpf_maps.cuh"} <= set(closure)
    k0 = C.MEGAKERNEL_SPEC.key("sm_90a")
    d = tmp_path / "k"
    shutil.copytree(C.KERNEL_DIR, d, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(C.link, "KERNEL_DIR", d)   # (read by link._sources_hash)
    assert C.MEGAKERNEL_SPEC.key("sm_90a") == k0
    (d / "mk_ops.cuh").write_text((d / "mk_ops.cuh").read_text() + "\n/* touched */\n")
    assert C.MEGAKERNEL_SPEC.key("sm_90a") != k0


def test_top_launch_plan_and_tier_flag():
    from dtrace_mk.commands.top import launch_plan
    from dtrace_mk.errors import UserError
    assert launch_plan(200, "auto") == [50, 50, 50, 50]
    assert launch_plan(200, "compiled") == [200] and launch_plan(3, "auto", 8) == [1, 1, 1]
    assert sum(launch_plan(10, "hot", 3)) == 10
    with pytest.raises(UserError):
        launch_plan(10, "auto", -1)


def test_two_threads_that_build_one_key_write_it_through_tmp_files_of_their_own(tmp_path, monkeypatch):
    """link._write_atomic: bench/hooks.py's side-by-side links (and the tier manager's
    background builds) may both miss one cache key; with a tmp name per process only, the
    second replace() found the first one's tmp gone."""
    import threading
    from pathlib import Path
    from dtrace_mk.runtime.compiled import link
    gate = threading.Barrier(2, timeout=10)
    real = Path.write_bytes
    tmps = []

    def write_bytes(self, data):
        tmps.append(self.name)
        n = real(self, data)
        gate.wait()                                   # both tmp files written before either replace
        return n
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    target = tmp_path / "cm_key.cubin"
    errs = []

    def build(data):
        try:
            link._write_atomic(target, data)
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errs.append(e)
    th = [threading.Thread(target=build, args=(b"cubin",)) for _ in range(2)]
    [t.start() for t in th]
    [t.join() for t in th]
    assert errs == [] and len(set(tmps)) == 2 and target.read_bytes() == b"cubin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cm_key.cubin"]
