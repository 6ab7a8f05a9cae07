"""CI (no GPU): bench/level_profile.py's per-level arithmetic on a synthetic trace of the
real 1b graph (levels, spans, handoffs, post times), and the -DDTMK_OBS_PROF build it
profiles compiles and exports the counters it reads."""

import numpy as np
import pytest

from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.kernels import megakernel_text


@pytest.fixture(scope="module")
def lp(load_bench):
    return load_bench("level_profile")


def _trace(graph, steps, level_ns=10_000, dur_ns=8_000, wait_ns=500):
    """Every level starts level_ns after the previous one; a task waits wait_ns, runs dur_ns."""
    levels, rows = {}, []
    for s in range(steps):
        for t in graph.tasks:
            if t.dynamic:
                continue
            li = levels.setdefault((t.layer, t.class_name), len(levels))
            begin = 10 ** 9 + s * (len(levels) + 1) * level_ns + li * level_ns if s else 10 ** 9 + li * level_ns
            rows.append((begin - wait_ns, wait_ns, dur_ns, t.index, s, 0, t.index % graph.num_workers, 0, t.cls))
    return np.array(rows, dtype=gpu.TRACE_DTYPE), levels


def test_level_stats_on_a_synthetic_trace(lp):
    g = build_graph(PRESETS["1b"], batch=1, num_workers=132)
    tr, levels = _trace(g, steps=3)
    st = lp.level_stats(tr, g, skip_steps=1)
    n_layers = PRESETS["1b"].n_layers
    # per layer: qkv, rope, attn, attn_o, gate/up, down; 1b's 24-column qkv tiles: 128 per layer
    assert st["qkv"]["levels_per_step"] == n_layers and st["qkv"]["tasks_per_step"] == 128 * n_layers
    assert st["mlp_gate_up"]["dur_med_ns"] == 8000
    # a level's tasks all start together: span = dur; the handoff = level gap - dur
    assert st["mlp_down"]["span_us_per_step"] == pytest.approx(8.0 * n_layers)
    assert st["mlp_down"]["handoff_us_per_step"] == pytest.approx(2.0 * n_layers)
    # the step's first task (rmsnorm) waits on the step boundary: no producer level, no handoff
    assert st["rmsnorm"]["handoff_us_per_step"] == 0
    # critical sum = sum of spans + handoffs = the trace's step span
    assert st["_total"]["critical_us"] == pytest.approx(st["_total"]["step_span_us"])
    assert st["_total"]["step_span_us"] == pytest.approx((len(levels) - 1) * 10.0 + 8.0)


def test_level_stats_refuses_an_empty_trace(lp):
    g = build_graph(PRESETS["tiny"], batch=1, num_workers=4)
    tr, _ = _trace(g, steps=1)
    with pytest.raises(ValueError, match="no trace records"):
        lp.level_stats(tr, g, skip_steps=1)


def test_obs_prof_build_exports_its_counters(lp):
    """The profiled build compiles and has the counter array level_profile reads (its
    size = the kernel's PROF_N = what print_prof indexes); the default build has none."""
    from dtrace_mk.kernels.build import nvrtc_compile
    src = megakernel_text()
    ptx = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_PROF",)).decode()
    assert f".global .align 8 .b8 dtmk_obs_prof[{8 * lp.PROF_N}];" in ptx      # PROF_N u64 counters
    top = max(k for _, cols in lp.PROF_TABLES for _, k in cols)
    assert top + 2 == lp.PROF_N == 50
    dflt = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx").decode()
    assert "dtmk_obs_prof" not in dflt
    # the compiled tier's build counts its inline events and shadow flushes too (28..31)
    cm = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=("DTMK_OBS_PROF", "DTMK_COMPILED_TIER"))
    assert f".global .align 8 .b8 dtmk_obs_prof[{8 * lp.PROF_N}];" in cm.decode()


def test_print_prof_reads_each_counter_pair_per_step_per_worker(lp):
    """print_prof's rows: count / steps / workers, cycles -> us at the given clock, and us per
    event; the observer-SM worker counters (post path, signal, push, ...) sit at 32..49."""
    steps, workers, ghz = 4, 8, 2.0
    v = [0] * lp.PROF_N
    v[32], v[33] = 2 * steps * workers, 2 * steps * workers * 5000   # post path: 2 per step per worker, 2.5 us each
    v[40], v[41] = steps * workers, steps * workers * 1000           # push: 1 per step per worker, 0.5 us each
    v[48], v[49] = steps * workers, steps * workers * 400            # of which the head: 0.2 us each
    lines = []
    lp.print_prof({"summary": v}, steps, workers, ghz=ghz, emit=lines.append)
    titles = [i for i, ln in enumerate(lines) if ln.startswith("--- DTMK_OBS_PROF observer-SM workers")]
    assert len(titles) == 1
    row = lines[titles[0] + 2].split()
    assert row[0] == "summary"
    assert [float(x) for x in row[1:4]] == [2.0, 5.0, 2.5]          # post: n, us, us/each
    assert [float(x) for x in row[4:]] == [0.0] * 9                  # signal, raise, rlate: none
    push = lines[[i for i, ln in enumerate(lines) if "the push (observer-SM builds)" in ln][0] + 2].split()
    assert [float(x) for x in push[1:4]] == [1.0, 0.5, 0.5]
    head = lines[[i for i, ln in enumerate(lines) if "the queue head's publish alone" in ln][0] + 2].split()
    assert head[0] == "summary" and [float(x) for x in head[1:4]] == [1.0, 0.2, 0.2]


def _worker_trace():
    """Two workers, steps 0..2: worker 0 on SM 7 runs two tasks per step (wait 1 us, dur
    3 us, next dispatch 2 us after the end); worker 1 on SM 20 one task per step (wait
    5 us, dur 4 us, its next dispatch the next step's, 11 us after its end)."""
    rows = []
    for s in range(3):
        t0 = 10 ** 9 + s * 20_000
        rows.append((t0, 1000, 3000, 0, s, 7, 0, 0, 0))
        rows.append((t0 + 6000, 1000, 3000, 1, s, 7, 0, 0, 0))
        rows.append((t0, 5000, 4000, 2, s, 20, 1, 0, 0))
    return np.array(rows, dtype=gpu.TRACE_DTYPE)


def test_worker_stats_sums_dur_wait_and_post_per_step(lp):
    st = {r["worker"]: r for r in lp.worker_stats(_worker_trace(), skip_steps=1)}
    w0, w1 = st[0], st[1]
    assert (w0["sm"], w0["tasks_per_step"], w1["sm"], w1["tasks_per_step"]) == (7, 2, 20, 1)
    assert w0["dur_us"] == pytest.approx(6.0) and w0["wait_us"] == pytest.approx(2.0)
    assert w1["dur_us"] == pytest.approx(4.0) and w1["wait_us"] == pytest.approx(5.0)
    # post: worker 0's gaps 2 us (task 0 -> 1) and 20 - 10 = 10 us (task 1 -> next step's
    # task 0), the last record none: (2 + 10 + 2) / 2 steps; worker 1: 20 - 9 = 11 once
    assert w0["post_us"] == pytest.approx(7.0) and w1["post_us"] == pytest.approx(5.5)


def test_worker_stats_marks_a_worker_that_moved_between_sms(lp):
    tr = _worker_trace()
    tr["sm"][(tr["worker"] == 1) & (tr["step"] == 2)] = 21       # (an unplaced launch: not in one launch, but)
    st = {r["worker"]: r for r in lp.worker_stats(tr, skip_steps=1)}
    assert st[1]["sm"] == -1 and st[0]["sm"] == 7
    with pytest.raises(ValueError, match="no trace records"):
        lp.worker_stats(tr, skip_steps=3)


def test_print_workers_groups_by_the_first_configs_sms(lp):
    per = {"off": lp.worker_stats(_worker_trace()), "summary": lp.worker_stats(_worker_trace())}
    per["summary"][0]["post_us"] += 4.0                         # the observing config slows worker 0's post path
    lines = []
    lp.print_workers(per, emit=lines.append, group=8)
    grp = {ln.split()[0]: ln.split() for ln in lines if ln.startswith("  ") and ln.split()[0] in ("0-7", "16-23")}
    # SMs 0-7: worker 0 (1 worker, 2 tasks/step, off 6.0 / 2.0 / 7.0, summary post 11.0)
    assert grp["0-7"][1:] == ["1", "2.0", "6.0", "2.0", "7.0", "6.0", "2.0", "11.0", "+0"]
    assert grp["16-23"][1:] == ["1", "1.0", "4.0", "5.0", "5.5", "4.0", "5.0", "5.5", "+0"]
    # worker 0's dur unchanged: no SM slowed; then +0.5 us per task on worker 1 (SM 20)
    assert "--- SMs whose tasks run > 150 ns longer in summary than in off: 0 [] (+nan ns per task on them, +0 on the other 2)" in lines
    per["summary"][1]["dur_us"] += 0.5
    lines2 = []
    lp.print_workers(per, emit=lines2.append)
    assert ("--- SMs whose tasks run > 150 ns longer in summary than in off: 1 [20] (+500 ns per task on them, +0 on "
            "the other 1)") in lines2
    per_worker = [ln.split() for ln in lines[lines.index("--- per worker (by SM)") + 2:]]
    assert [r[:2] for r in per_worker] == [["7", "0"], ["20", "1"]]


def test_print_workers_groups_by_gpc_with_the_extra_ns_per_task(lp):
    """--gpcs: rows per GPC (tools/gpc_probe.py's groups), an SM the map lacks under "GPC ?";
    the last column: extra ns per task over the first config (session 29's per-GPC table)."""
    per = {"off": lp.worker_stats(_worker_trace()), "summary": lp.worker_stats(_worker_trace())}
    per["summary"][0]["dur_us"] += 0.3                         # worker 0 (SM 7): 2 tasks/step, +150 ns each
    lines = []
    lp.print_workers(per, emit=lines.append, gpc_of={7: 3})
    rows = {" ".join(ln.split()[:2]): ln.split() for ln in lines if ln.startswith("  GPC")}
    assert rows["GPC 3"][2:4] == ["1", "2.0"] and rows["GPC 3"][-1] == "+150"
    assert rows["GPC ?"][2:4] == ["1", "1.0"] and rows["GPC ?"][-1] == "+0"      # SM 20: not in the map
    assert lines[0].startswith("--- per GPC")
