"""`diagnose --backend gpu` without a GPU: backend resolution, the mpiexec override, the
chunk sizing, and the GPU serving path end to end with the megakernel and the clock
replaced by fakes that replay the sim's hook contexts as device records (CTX_DTYPE):
chunks of launches, ts-ordered feeding, clock pairs, device drops counted as lost."""
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dtrace_mk.collectors import transport as T
from dtrace_mk.collectors.scenario import load_scenario
from dtrace_mk.collectors.score import score, validate_result
from dtrace_mk.commands import diagnose as D
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import SIM_WORKERS
from dtrace_mk.megakernel.sim import Sim

SCEN = Path(__file__).resolve().parents[1] / "scenarios"


# -- backend resolution / launcher ------------------------------------------------------

@pytest.mark.parametrize("gpus, tp, requested, ranks, want", [
    (0, False, "auto", 2, "sim"), (2, True, "auto", 2, "gpu"), (1, True, "auto", 2, "sim"),
    (2, False, "auto", 2, "sim"), (1, False, "auto", 1, "gpu"), (8, True, "sim", 2, "sim"),
    (2, True, "gpu", 2, "gpu")])
def test_resolve_backend(monkeypatch, gpus, tp, requested, ranks, want):
    monkeypatch.setattr(D, "gpu_count", lambda: (gpus, "" if gpus else "CuPy is not installed"))
    monkeypatch.setattr(D, "gpu_tp_available", lambda: tp)
    assert D.resolve_backend(requested, ranks) == want


def test_gpu_backend_without_enough_gpus_is_a_user_error(monkeypatch):
    monkeypatch.setattr(D, "gpu_count", lambda: (1, ""))
    monkeypatch.setattr(D, "gpu_tp_available", lambda: True)
    with pytest.raises(UserError, match="2 rank.*one GPU each.*1 GPU"):
        D.resolve_backend("gpu", 2)
    monkeypatch.setattr(D, "gpu_count", lambda: (2, ""))
    monkeypatch.setattr(D, "gpu_tp_available", lambda: False)
    with pytest.raises(UserError, match="dtrace_mk.megakernel.tp"):
        D.resolve_backend("gpu", 2)


def test_mpiexec_override(monkeypatch, tmp_path):
    exe = tmp_path / "mpirun"
    exe.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.6'\n")
    exe.chmod(0o755)
    monkeypatch.setenv(D.ENV_MPIEXEC, str(exe))
    assert D.find_mpiexec() == str(exe)
    assert D.mpi_flavour(str(exe)) == "openmpi"
    monkeypatch.setenv(D.ENV_MPIEXEC, str(tmp_path / "nope"))
    with pytest.raises(UserError, match="DTRACE_MK_MPIEXEC"):
        D.find_mpiexec()


def test_chunk_steps_keep_the_ring_half_free():
    from dtrace_mk.megakernel.presets import get_preset
    g = build_graph(get_preset("tiny"), 4, 8, rank=0, ranks=2)
    per_step = max(len(p) for p in g.worker_plans) * 5
    n = D.gpu_chunk_steps(g, 5, 4096)
    assert n * per_step <= 2048 < (n + 1) * per_step
    assert D.gpu_chunk_steps(g, 5, 1) == 1


# -- the serving path with fakes ----------------------------------------------------------

class FakeMegakernel:
    """Replays the sim of the same graph: run(n) returns the next n steps' contexts as
    CTX_DTYPE records sorted by ts (hook_cap per worker; beyond it records are dropped)."""
    launches = []
    fault_steps = []

    def __init__(self, cfg, batch, num_workers=None, seed=0, tp=None, steps=64, hook_cap=64):
        self.graph = build_graph(cfg, batch, SIM_WORKERS)
        self.cfg, self.seed, self.steps, self.hook_cap = cfg, seed, steps, hook_cap
        self.step = 0
        self.resets = 0
        self.recs = None

    def reset(self):
        self.step = 0
        self.resets += 1

    def run(self, n, hooks=None, faults=None, watchdog_ms=0):
        if hooks is None:                   # the warm-up: before the reset, not fed
            assert faults is None and self.resets == 0
            self.step += n
            return None
        # this launch's fault table is in kernel steps (the launch's warm-up steps first):
        # simulate up to the launch's last step with it
        FakeMegakernel.fault_steps.append(sorted({int(k) for row in faults.to_array()
                                                  for k in range(int(row[3]), int(row[4]) + 1)})
                                          if len(faults) else [])
        ctxs = []
        Sim(self.graph, self.step + n, faults=faults, sink=ctxs.append, hooks=hooks,
            seed=self.seed).run()
        a = np.zeros(len(ctxs), gpu.CTX_DTYPE)
        from dtrace_mk.abi import definition as abi
        for name in gpu.CTX_DTYPE.names:
            a[name] = [abi.hook(c["hook"]).id if name == "hook" else (c.get(name) or 0)
                       for c in ctxs]
        m = (a["decode_step"] >= self.step) & (a["decode_step"] < self.step + n)
        out = a[m]
        out = out[np.argsort(out["ts_ns"], kind="stable")]
        keep = np.zeros(len(out), bool)
        for w in np.unique(out["worker"]):
            idx = np.nonzero(out["worker"] == w)[0][: self.hook_cap]
            keep[idx] = True
        FakeMegakernel.launches.append((self.step, n))
        self.step += n
        return types.SimpleNamespace(hooks=out[keep], hooks_dropped=int((~keep).sum()))


class FakeClock:
    """Identity device clock (the sim's ts are host ns), bound 0."""

    def __init__(self):
        self.t = 0
        self.n = 0

    def feed(self, agent):
        self.t += 200_000
        self.n += 1
        agent.clock_sample(self.t, self.t)

    def report(self):
        return {"pairs": self.n, "bound_ns_min": 0, "bound_ns_max": 0}


def _serve(monkeypatch, sc, hook_cap):
    import dtrace_mk.megakernel.gpu_clock as GC
    FakeMegakernel.launches = []
    FakeMegakernel.fault_steps = []
    monkeypatch.setattr(gpu, "Megakernel",
                        lambda cfg, batch, seed=0, **kw: FakeMegakernel(cfg, batch, seed=seed,
                                                                        steps=sc.steps, hook_cap=hook_cap))
    monkeypatch.setattr(GC, "GpuClock", FakeClock)
    monkeypatch.setattr(D, "gpu_tp_available", lambda: False)
    monkeypatch.setattr(D, "GPU_CLOCK_SPACING_S", 0.0)
    acc = T.CollectorSink(use_pingpongs=True)
    loop = T.CollectorLoop(None, [0], acc)
    ch = T.DirectChannel(loop, 0)
    D.serve_rank(sc, 0, 1, None, ch, backend="gpu", say=lambda s: None, start_pings=0)
    return D._result(acc, loop, sc, 1), acc


def test_gpu_path_feeds_the_agent_in_chunks_and_diagnoses(monkeypatch):
    sc = replace(load_scenario(SCEN / "slow_task_class_layer_r0.yaml"), ranks=1)
    res, acc = _serve(monkeypatch, sc, hook_cap=1 << 14)
    validate_result(res)
    W = D.GPU_LAUNCH_WARMUP_STEPS
    # all steps fit one launch, after its W warm-up steps; the faults moved by W
    assert FakeMegakernel.launches == [(0, W + sc.steps)]
    want = sorted(k + W for f in sc.faults for k in f.steps if f.rank == 0)
    assert FakeMegakernel.fault_steps == [want]
    # only scenario steps reach the agent: every finding's steps are the scenario's
    assert all(0 <= k < sc.steps for f in res["findings"] for k in f["steps"])
    rep = score(res, sc)
    assert rep.recall == 1.0 and rep.false_confident == [], rep.render()
    cov = res["coverage"]
    assert cov["lost"] == 0 and cov["eligible"] == cov["executed"] > 0
    # 4 pairs before, one after each launch, 4 after
    assert len(acc.clock_samples) == 4 + 1 + 4


def test_small_rings_split_the_run_and_count_drops(monkeypatch):
    sc = replace(load_scenario(SCEN / "slow_task_class_layer_r0.yaml"), ranks=1)
    res, acc = _serve(monkeypatch, sc, hook_cap=16)
    launches = FakeMegakernel.launches
    W = D.GPU_LAUNCH_WARMUP_STEPS
    assert len(launches) > 1 and sum(n - W for _, n in launches) == sc.steps
    assert all(n > W for _, n in launches)
    rep = score(res, sc)                  # faults shifted per launch, records renumbered back
    assert rep.recall == 1.0 and rep.false_confident == [], rep.render()
    assert [s for s, _ in launches] == list(np.cumsum([0] + [n for _, n in launches[:-1]]))
    assert len(acc.clock_samples) == 4 + len(launches) + 4



def test_device_ring_drops_are_reported_lost(monkeypatch):
    sc = replace(load_scenario(SCEN / "slow_task_class_layer_r0.yaml"), ranks=1)
    full, _ = _serve(monkeypatch, sc, hook_cap=1 << 14)
    cut, _ = _serve(monkeypatch, sc, hook_cap=2)          # rings far too small
    assert full["telemetry"]["records_lost"] == 0
    missing = full["coverage"]["eligible"] - cut["coverage"]["eligible"]
    assert missing > 0
    # a launch's drops are counted in full: with rings this small they include records of
    # the launch's warm-up steps (an upper bound; sized rings drop nothing)
    assert cut["telemetry"]["records_lost"] == cut["transport"]["lost_records"]["0"] >= missing


@pytest.mark.mpi
def test_gpu_scenarios_also_hold_on_the_sim():
    """tests/scenarios/gpu (not globbed by tests/e2e) diagnosed on the sim backend: the same
    causes and ranks the GPU test expects, so a GPU failure is the GPU path's, not the
    scenario's."""
    try:
        D.find_mpiexec()
    except UserError as e:
        pytest.skip(str(e))
    files = sorted((SCEN / "gpu").glob("*.yaml"))
    assert [p.stem for p in files] == ["gpu_local_imbalance_r0", "gpu_remote_stall_r1"]
    out = D.run_job([(p, None) for p in files], "sim", 300.0, lambda s: None, quiet=True)
    want = {"gpu_local_imbalance_r0": ("local_imbalance", 0), "gpu_remote_stall_r1": ("remote_stall", 1)}
    for p, res in zip(files, out):
        sc = load_scenario(p)
        assert sc.backend == "gpu" and sc.ranks == 2
        validate_result(res)
        rep = score(res, sc)
        assert rep.recall == 1.0 and rep.precision == 1.0 and rep.false_confident == [], rep.render()
        assert [(f["cause"], f["rank"]) for f in res["findings"]] == [want[p.stem]]


# -- per-launch warm-up: fault shift and renumbering ----------------------------------------

def test_launch_fault_specs_move_the_launchs_steps_only():
    specs = [{"kind": "late_comm", "steps": [3, 4, 9], "delay_us": 5},
             {"kind": "starve_ready", "steps": [12], "delay_us": 1},
             {"kind": "slow_task_class", "steps": None, "extra_us": 1}]
    out = D.launch_fault_specs(specs, 2, 4, 7)            # scenario steps 2..5 at kernel 9..12
    assert out == [{"kind": "late_comm", "steps": [10, 11], "delay_us": 5},
                   {"kind": "slow_task_class", "steps": [9, 10, 11, 12], "extra_us": 1}]
    assert specs[0]["steps"] == [3, 4, 9]                 # not modified in place


def test_renumber_ctx_moves_step_generations_together():
    L = 2
    k, off = 7, 2                                         # kernel step 7 = scenario step 5
    w = {"hook": "comm:wait", "decode_step": k, "task_gen": k, "comm_gen": k * L + 1,
         "event_gen": 3 * (k + 1), "comm_op": 0}
    assert D.renumber_ctx(dict(w), off, L) == {**w, "decode_step": 5, "task_gen": 5,
                                               "comm_gen": 5 * L + 1, "event_gen": 3 * 6}
    d = {"hook": "dep:wait", "decode_step": k, "task_gen": k, "comm_gen": 0, "event_gen": k}
    assert D.renumber_ctx(dict(d), off, L) == {**d, "decode_step": 5, "task_gen": 5, "event_gen": 5}
    assert D.renumber_ctx(dict(w), 0, L) == w


def test_gpu_evidence_table_is_written_when_asked(monkeypatch, tmp_path):
    sc = replace(load_scenario(SCEN / "slow_task_class_layer_r0.yaml"), ranks=1)
    monkeypatch.setenv(D.ENV_GPU_EVIDENCE, str(tmp_path))
    _serve(monkeypatch, sc, hook_cap=1 << 14)
    import json
    ev = json.loads((tmp_path / f"{sc.name}.rank0.json").read_text())
    W = D.GPU_LAUNCH_WARMUP_STEPS
    assert ev["launches"] == [{"kernel_step0": 0, "warm": W, "offset": W, "records": ev["launches"][0]["records"]}]
    steps = {(r["step"], r["warm"]) for r in ev["rows"]}
    assert steps == {(k, k < 0) for k in range(-W, sc.steps)}
    f = sc.faults[0]
    slow = [r for r in ev["rows"] if r["class"] == f.params["task_class"]]
    hit = [r["dur_us"] for r in slow if r["step"] in f.steps]
    rest = [r["dur_us"] for r in slow if r["step"] not in f.steps and not r["warm"]]
    assert min(hit) > max(rest), (hit, rest)      # the injected slowdown is in the table
