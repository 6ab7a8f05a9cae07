"""CI parts of live observation (no GPU): `dtrace-mk top` on the sim backend, the
summary monitor, and the megakernel's observer variants compiling through NVRTC."""
from __future__ import annotations

import re

import pytest

from dtrace_mk.commands import top
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import get_preset
from dtrace_mk.runtime.live import SUMMARY_QUERY, summary_monitor
from dtrace_mk.kernels import megakernel_text


def test_summary_monitor_verifies_and_hooks():
    from dtrace_mk.bpf.verifier import verify
    mon = summary_monitor()
    assert sorted(p.hook.name for p in mon.obj.programs) == ["dep:release", "task:end", "task:ready"]
    for p in mon.obj.programs:
        assert verify(p, mon.obj.maps).max_path_insns <= 64      # a short, bounded monitor
    assert {m.name for m in mon.obj.maps} == {"lat", "dep_wait", "queue"}
    assert "hist(task.dur_ns)" in SUMMARY_QUERY


def test_hist_quantile():
    b = [0] * 64
    assert top.hist_quantile(b, 0.5) == 0
    b[10] = 9
    b[20] = 1
    assert top.hist_quantile(b, 0.5) == (1 << 10) - 1
    assert top.hist_quantile(b, 0.99) == (1 << 20) - 1


def _tasks(frame: str) -> int:
    n = 0
    for line in frame.splitlines()[2:]:
        m = re.match(r"^(\S+)\s+(\d+)\s", line)
        if m and not line.startswith(("queue", "coverage")):
            n += int(m.group(2))
    return n


def test_top_sim_frames_refresh_and_end_exact():
    steps, workers = 4, 8
    frames = list(top.sim_frames("tiny", steps=steps, interval_ms=0.2, workers=workers))
    assert len(frames) >= 3
    counts = [_tasks(f) for f in frames]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    for f in frames:
        assert f.startswith("dtrace-mk top  model tiny  backend sim")
        assert "coverage eligible" in f and f.rstrip().endswith("OK")
    last = frames[-1]
    assert "[run finished]" in last
    g = build_graph(get_preset("tiny"), 1, workers)
    assert counts[-1] == steps * len(g.tasks)          # every task:end counted once
    for name in ("qkv", "attn", "lm_head", "argmax"):
        assert re.search(rf"^{name}\s", last, re.M), name
    assert "queue depth max" in last


def test_top_cli_sim(capsys):
    from dtrace_mk.cli import main
    rc = main(["top", "--backend", "sim", "--model", "tiny", "--steps", "3", "--frames", "2",
               "--interval-ms", "0.2", "--workers", "8", "--no-clear"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("dtrace-mk top") == 2 and "frame 2" in out


def test_top_rejects_bad_interval(capsys):
    from dtrace_mk.cli import main
    assert main(["top", "--backend", "sim", "--interval-ms", "0"]) != 0
    assert "--interval-ms" in capsys.readouterr().err


def test_top_observer_choice(capsys, megakernel_builds):
    """--observer sm runs the observer-SM build on the GPU; the sim has no such placement
    and says so (instead of ignoring the flag)."""
    from dtrace_mk.cli import main
    assert main(["top", "--backend", "sim", "--observer", "sm", "--steps", "2"]) != 0
    assert "--observer sm" in capsys.readouterr().err
    assert main(["top", "--backend", "sim", "--observer-sms", "2", "--steps", "2"]) != 0
    assert "--observer-sms: only with --observer sm" in capsys.readouterr().err
    assert top.OBSERVERS == ("workers", "sm")
    from dtrace_mk.megakernel import gpu
    built, Stop = megakernel_builds
    for choice, m in (("workers", None), ("sm", None), ("sm", 1), ("sm", 2)):
        with pytest.raises(Stop):
            next(top.gpu_frames("tiny", steps=2, observer=choice, observer_sms=m))
    lazy = ("DTMK_OSQ_LAZY_PUB", f"DTMK_OSQ_DEFER={gpu.OSQ_DEFER_DEFAULT}")
    pin = ("DTMK_SM_WORKER",)                  # (--observer-place auto: observer SMs calibrated)
    assert built == [(), ("DTMK_OBS_SM", f"DTMK_OBS_SMS={gpu.OBS_SMS_DEFAULT}") + lazy + pin,
                     ("DTMK_OBS_SM",) + lazy + pin, ("DTMK_OBS_SM", "DTMK_OBS_SMS=2") + lazy + pin]
    with pytest.raises(UserError, match="want 1..8 observer SMs, got 0"):
        next(top.gpu_frames("tiny", steps=2, observer="sm", observer_sms=0))


@pytest.fixture(scope="module")
def nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from dtrace_mk.megakernel import gpu
    return gpu


def test_megakernel_observer_sources(nvrtc):
    src = megakernel_text()
    for needle in ("DTMK_RUN_RECORDS(O.tabs, O.ring", "dtmk_vm_load_table", "dtmk_cov_acc_flush",
                   "CTL_GEN", "OBS_PENDING"):
        assert needle in src, needle
    assert nvrtc.CTL_GEN == 7 and nvrtc.CTL_TABLES == 8 and nvrtc.CTL_OBS == 10 and nvrtc.CTL_STAMP == 12
    for name, val in (("CTL_GEN", 7), ("CTL_TABLES", 8), ("CTL_OBS", 10), ("CTL_STAMP", 12),
                      ("CTL_WORDS", 32), ("OBS_WORDS", nvrtc.OBS_WORDS)):
        assert re.search(rf"#define {name} {val}\b", src), name
    for i, n in enumerate(nvrtc.OBS_NAMES):
        assert re.search(rf"#define OBS_{n.upper()} {i}\b", src), n


def test_megakernel_variants_compile(nvrtc, tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))
    cubin = nvrtc.compile_source("sm_90a", "cubin", defines=("DTMK_NO_HOOKS",), use_cache=False)
    assert cubin[:4] == b"\x7fELF" and b"dtmk_vm_run_records" not in cubin
    lto = nvrtc.compile_source("sm_90a", "ltoir", defines=("DTMK_COMPILED_TIER",), use_cache=False)
    assert len(lto) > 1000


def test_nvrtc_wrapper_leaves_interned_bytes_alone(nvrtc):
    """An NVRTC compile with an empty log once overwrote the interned b" " (the log
    buffer was b" " * 1); afterwards the query lowering emitted 'ldxwr0,' on the
    device's Python 3.12 and bench/hooks.py could not compile its monitor."""
    from dtrace_mk.kernels import build
    build.nvrtc_compile('extern "C" __global__ void k() {}', "k.cu", "sm_90a", "cubin", ())
    assert bytes([32]) == b" " and " ".encode() == b"\x20"
    assert "    ldxw r0, [r6+" in summary_monitor().lowered.asm["c0_task_end"]


def test_a_table_change_is_written_with_the_step_it_is_due_at():
    """LiveSession._bump: control[CTL_GEN_DUE] is copied before CTL_GEN (stream order: a
    worker that sees the generation sees its due step), and a change some worker has not
    loaded yet keeps its earlier due (min), so a lazy change written after an urgent one
    never postpones it (kernels/megakernel.cu, the step gate)."""
    import ctypes
    import types

    import numpy as np

    from dtrace_mk.megakernel import gpu
    from dtrace_mk.runtime import live

    control, pinned = np.zeros(gpu.CTL_WORDS, np.uint32), np.zeros(16, np.uint32)
    base, order = control.ctypes.data, []

    def memcpy(dst, src, n, kind, stream):
        order.append((dst - base) // 4)
        ctypes.memmove(dst, src, n)

    s = object.__new__(live.LiveSession)
    s.gpu, s.clock_offset, s.stamps, s.gen, s._due = gpu, 0, {}, 0, 0
    s.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        memcpyAsync=memcpy, memcpyHostToDevice=1)))
    s.mk = types.SimpleNamespace(buf={"control": types.SimpleNamespace(data=types.SimpleNamespace(ptr=base))})
    s._pinned, s._word = types.SimpleNamespace(ptr=pinned.ctypes.data), pinned
    s.side = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    loaded = [0]
    s.loaded_gen = lambda: loaded[0]
    got = []
    for loaded[0], due in ((0, 20), (0, 40), (2, live.NEVER_DUE), (2, 0), (4, 36)):
        s._bump(0, due)
        got.append((int(control[gpu.CTL_GEN]), int(control[gpu.CTL_GEN_DUE])))
    assert got == [(1, 20), (2, 20), (3, live.NEVER_DUE), (4, 0), (5, 36)]
    assert order[:3] == [gpu.CTL_GEN_DUE, gpu.CTL_STAMP, gpu.CTL_GEN]


def test_a_rearm_is_one_table_change_due_at_its_first_step():
    """LiveSession.rearm: the runtime rewrites the slots (on the side stream), and the
    generation is written due at the rearmed first step, whose gate must load it (a
    NEVER_DUE would leave workers counting the ended range's replacement late)."""
    import contextlib
    import types

    from dtrace_mk.runtime import live

    calls = []
    s = object.__new__(live.LiveSession)
    s.side = contextlib.nullcontext()
    s.rt = types.SimpleNamespace(rearm=lambda aid, f, replaces=None: calls.append(("rearm", aid, f, replaces)))
    s._bump = lambda t_cmd, due=0: calls.append(("bump", due))
    s.rearm(3, 17, replaces=2)
    assert calls == [("rearm", 3, 17, 2), ("bump", 17)]


@pytest.mark.parametrize("tier,want", [("auto", "follow"), ("compiled", "request")])
def test_a_parked_twin_attached_with_follows_is_promoted_with_its_partner(tier, want):
    """LiveSession.attach(follows=a): in "auto" the tier manager promotes it whenever a is
    (TierManager.follow); in "compiled" it is requested like any attach.  follows never
    reaches the runtime's attach."""
    import contextlib
    import types

    from dtrace_mk.lang.pipeline import compile_query
    from dtrace_mk.runtime import live

    calls = []
    s = object.__new__(live.LiveSession)
    s.tier, s.side, s.mk = tier, contextlib.nullcontext(), types.SimpleNamespace()
    s.rt = types.SimpleNamespace(attach=lambda obj, verify=True, **kw: calls.append(("attach", kw)) or 7)
    s.tiers = types.SimpleNamespace(request=lambda aid: calls.append(("request", aid)),
                                    follow=lambda aid, lead: calls.append(("follow", aid, lead)),
                                    pin=lambda aid: calls.append(("pin", aid)))
    s._bump = lambda t_cmd, due=0: calls.append(("bump", due))
    obj = compile_query("task:end { @n = count(); }").obj
    assert s.attach(obj, first_epoch=live.NEVER_DUE, follows=3) == 7
    assert calls[0] == ("attach", {"first_epoch": live.NEVER_DUE})
    assert calls[1] == (("follow", 7, 3) if want == "follow" else ("request", 7))
    assert calls[2] == ("bump", live.NEVER_DUE)


def test_start_pairs_the_clocks_again_when_the_pairing_is_stale(monkeypatch):
    """LiveSession.start: attach stamps are host time + the pairing's offset, and with a
    pairing taken ~140 s of launches before, attach latencies read -2.2..-2.7 ms (H100,
    session 49).  start() re-pairs one older than RECALIBRATE_S (before the launch holds
    the SMs), keeps a fresh one, and records how far the offset moved."""
    import types

    from dtrace_mk.runtime import live

    clock = [1000.0]
    offsets = iter([(5_000, 40), (7_700, 30)])
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(live, "_calibrate", lambda: next(offsets))
    s = object.__new__(live.LiveSession)
    s.clock_drift = []
    s._calibrate_clock()
    assert (s.clock_offset, s.clock_err, s.clock_drift) == (5_000, 40, [])
    started = []
    s.handle, s.tiers, s.refresh, s.watchdog_ms = None, None, 16, 2000
    s.rt = types.SimpleNamespace(_atts={})
    s.boundary = lambda: None
    s.mk = types.SimpleNamespace(start=lambda steps, **kw: started.append(steps) or "h", done=lambda h: True)
    clock[0] += live.RECALIBRATE_S / 2
    s.start(10)                                   # fresh: the same pairing
    assert s.clock_offset == 5_000 and s.clock_drift == []
    clock[0] += live.RECALIBRATE_S
    s.start(10)                                   # stale: paired again before the launch
    assert (s.clock_offset, s.clock_err) == (7_700, 30)
    assert s.clock_drift == [(live.RECALIBRATE_S * 1.5, 2_700)]
    assert started == [10, 10]


def test_link_compiled_splits_into_a_host_half_fixed_at_the_call_and_a_load(monkeypatch):
    """LiveSession.link_work fixes the monitor source when called (bench/hooks.py queues
    links, then runs them side by side): a program attached afterwards is not in that link;
    load_linked loads the module; link_compiled is the two in a row."""
    from types import SimpleNamespace
    from dtrace_mk.runtime import live as live_mod
    linked, loads = [], []
    monkeypatch.setattr(live_mod, "link_megakernel",
                        lambda src, arch, stage, defines: linked.append((src, arch, stage, defines)) or (b"cubin:" + src.encode(), 2.5))
    s = live_mod.LiveSession.__new__(live_mod.LiveSession)
    srcs = iter(["monitor v1", "monitor v2"])
    s.rt = SimpleNamespace(monitor=lambda stage: next(srcs) + f" s{stage}")
    s.mk = SimpleNamespace(arch="sm_90a", defines=("DTMK_X",), load_cubin=lambda c, tag: loads.append((c, tag)))
    work = s.link_work()
    assert linked == []                                        # nothing linked until the work runs
    assert s.link_compiled(stage=1) == 2.5                     # (takes "monitor v2")
    assert work() == (b"cubin:monitor v1 s2", 2.5)             # the source of the call, not the latest
    s.load_linked(b"cubin:monitor v1 s2")
    assert linked == [("monitor v2 s1", "sm_90a", 1, ("DTMK_X",)), ("monitor v1 s2", "sm_90a", 2, ("DTMK_X",))]
    assert loads == [(b"cubin:monitor v2 s1", "cm_s1"), (b"cubin:monitor v1 s2", "cm_s2")]
