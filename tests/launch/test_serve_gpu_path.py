"""The GPU serving path (`serve --backend gpu`) on a machine without a GPU: CuPy, the
megakernel, the clock pairing and the device VM are replaced by stand-ins that keep their
contracts (one step per `run(1)`, the step's hook records as CTX_DTYPE rows, queries run
by the "device" over the kernel's own records, never fed by the host), so the loop's
logic is checked here: attach through the control socket at a step boundary, output
streamed back, every task:end of every step counted exactly once (a query also fed by the
host would count twice), the agent's records reaching the in-process collector, and the
stop at the end.  The real thing runs in tests/gpu/test_launch_gpu.py."""
import signal
import sys
import threading
import time
import types

import numpy as np
import pytest

from dtrace_mk.megakernel.graph import build_graph

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "fake_gpu"))
from fake_device import FakeDeviceQueries, FakeResident  # noqa: E402  (shared with fake_gpu/sitecustomize.py)
from dtrace_mk.megakernel.presets import get_preset

STEPS = 10
BATCH = 2
WORKERS = 8


class FakeMegakernel(FakeResident):
    """Resident launches (fake_device.FakeResident) over the sim's records of each step
    (the kernel's hook ring); `run(1)`: one step per launch (not used by serve)."""
    instances = []

    def __init__(self, cfg, batch, seed=0, tp=None, num_workers=None):
        from dtrace_mk.launch.api import ALL_HOOKS
        from dtrace_mk.megakernel.sim import Sim, pack_ctx
        assert tp is None
        assert num_workers == WORKERS - 1            # one SM left for the clock kernel
        self.graph = build_graph(cfg, batch, num_workers)
        self.num_workers = num_workers
        self._res_init()
        self.step = 0
        self.observer = None
        self.runs = 0
        per = {}
        self.per_step = per
        Sim(self.graph, STEPS + 4, sink=lambda c: per.setdefault(c["decode_step"], []).append(pack_ctx(c)),
            hooks=ALL_HOOKS, seed=seed).run()
        self.per_step = per
        FakeMegakernel.instances.append(self)

    def _records_of(self, k):
        return self.per_step.get(k, [])

    def _collective(self, what):
        pass

    def run(self, steps, hooks=None, faults=None):
        from dtrace_mk.megakernel import gpu
        assert steps == 1
        recs = self.per_step.get(self.step, [])
        if self.observer is not None:            # the "device VM" runs attached queries
            for r in recs:
                self.observer.rt.fire(r)
        self.step += 1
        self.runs += 1
        arr = np.frombuffer(b"".join(recs), dtype=gpu.CTX_DTYPE) if recs else np.zeros(0, gpu.CTX_DTYPE)
        return types.SimpleNamespace(hooks=arr, hooks_dropped=0, elapsed_ms=0.05)


class FakeClock:
    def feed(self, host, rounds=None):
        t = time.monotonic_ns()
        host.clock_sample(t, t)


def _fake_cupy():
    dev = types.SimpleNamespace(id=0, use=lambda: None, attributes={"MultiProcessorCount": WORKERS})
    cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
                                 Device=lambda i=0: dev)
    return types.SimpleNamespace(cuda=cuda)


def test_gpu_loop_attaches_in_the_device_runtime_and_counts_every_task_once(runtime_dir, monkeypatch, tmp_path):
    pytest.importorskip("mpi4py")
    from dtrace_mk.commands.attach import compile_for_attach
    from dtrace_mk.launch import device_live, jobs, serve
    from dtrace_mk.launch.control import ControlClient, wait_for_socket
    from dtrace_mk.megakernel import gpu, gpu_clock

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(gpu, "Megakernel", FakeMegakernel)
    monkeypatch.setattr(gpu_clock, "GpuClock", FakeClock)
    monkeypatch.setattr(device_live, "DeviceQueries", FakeDeviceQueries)
    job = jobs.new_job(1, ["serve"], "gpu")
    monkeypatch.setenv(jobs.ENV_JOB_DIR, str(job.dir))
    raw, name, text = compile_for_attach("task:end { @task_end[step] = count(); }", None)
    got = {"outputs": [], "error": None}

    def client():
        try:
            assert wait_for_socket(job, time.monotonic() + 60)
            reply, stream = ControlClient(job).attach(raw, name, text, stream=True, interval_s=0.01)
            got["reply"] = reply
            for msg in stream:
                if msg.get("type") == "output":
                    got["outputs"].append(msg)
                elif msg.get("type") == "end":
                    got["end"] = msg
                    break
        except Exception as e:        # reported by the main thread
            got["error"] = e

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    th = threading.Thread(target=client, daemon=True)
    th.start()
    result = tmp_path / "r.json"
    try:
        rc = serve.main(["--backend", "gpu", "--model", "tiny", "--batch", str(BATCH), "--steps", str(STEPS),
                         "--await-attach", "30", "--quiet", "--result", str(result), "--tier", "auto"])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        job.remove()
    th.join(30)
    assert rc == 0 and got["error"] is None, got["error"]
    (mk,) = FakeMegakernel.instances[-1:]
    assert mk.segments == [(0, STEPS)] and mk.runs == 0      # ONE resident launch for every step
    dq = FakeDeviceQueries.instances[-1]
    assert dq.tier == "auto"                                  # --tier reaches the live session
    assert dq.boundaries == [0]                               # a tier boundary before the launch
    final = got["outputs"][-1]
    assert final["final"] and got["end"]["reason"] == "job ended"
    part = final["ranks"]["0"]
    (block,) = [b for b in part["blocks"] if b.get("type") == "map"]
    counts = {int(e["key"][0]): int(e["value"]) for e in block["entries"]}
    apply_at = got["reply"]["apply_at"]
    assert sorted(counts) == list(range(apply_at, STEPS))     # attached at a step boundary
    from dtrace_mk.abi import definition as D
    from dtrace_mk.abi import context
    end_id = D.hook("task:end").id
    for k, n in counts.items():
        want = sum(1 for r in mk.per_step[k]
                   if int.from_bytes(r[context.OFF_HOOK:context.OFF_HOOK + 4], "little") == end_id)
        assert n == want == len(mk.graph.tasks), (k, n, want)   # once: not also fed by the host
    assert block["coverage"]["eligible"] == sum(counts.values())
    import json
    res = json.loads(result.read_text())
    assert res["coverage"]["eligible"] > 0 and res["verdict"] in ("none", "fault")


def _serve_fake(monkeypatch, tmp_path, extra=(), dq_cls=FakeDeviceQueries, drop_every=0):
    """serve --backend gpu with the stand-ins, no job; returns (mk, dq, fed records per
    step as {step: count}, rank 0's diagnosis)."""
    pytest.importorskip("mpi4py")
    import json
    from dtrace_mk.launch import api, device_live, serve
    from dtrace_mk.megakernel import gpu, gpu_clock
    from dtrace_mk.abi import context
    monkeypatch.delenv("DTRACE_MK_JOB_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(gpu, "Megakernel", FakeMegakernel)
    monkeypatch.setattr(FakeMegakernel, "drop_every", drop_every)
    monkeypatch.setattr(gpu_clock, "GpuClock", FakeClock)
    monkeypatch.setattr(device_live, "DeviceQueries", dq_cls)
    fed = {}
    orig = api.ServingHost.feed

    def feed(self, rec):
        k = int.from_bytes(rec[context.OFF_DECODE_STEP:context.OFF_DECODE_STEP + 4], "little")
        assert not fed or k >= max(fed), f"a record of step {k} after one of step {max(fed)}"
        fed[k] = fed.get(k, 0) + 1
        orig(self, rec)
    monkeypatch.setattr(api.ServingHost, "feed", feed)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    result = tmp_path / "r.json"
    try:
        rc = serve.main(["--backend", "gpu", "--model", "tiny", "--batch", str(BATCH), "--steps", str(STEPS),
                         "--quiet", "--result", str(result), *extra])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert rc == 0
    return FakeMegakernel.instances[-1], dq_cls.instances[-1], fed, json.loads(result.read_text())


def test_device_ring_drops_are_counted_lost_in_coverage(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, drop_every=7)
    total = sum(len(mk.per_step[k]) for k in range(STEPS))
    assert mk.dropped_total == total // 7 > 0
    assert sum(fed.values()) == total - mk.dropped_total          # every stored record fed once
    # ... and every refused one reported lost by the rank's agent (as diagnose's GPU path does)
    assert res["transport"]["lost_records"] == {"0": mk.dropped_total}


def test_no_drops_no_loss_and_every_step_fed_in_order(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path)
    assert mk.segments == [(0, STEPS)]
    assert fed == {k: len(mk.per_step[k]) for k in range(STEPS)}
    assert res["transport"]["lost_records"] in ({}, {"0": 0})


class SwappingQueries(FakeDeviceQueries):
    instances = []

    def __init__(self, mk, tier="hot"):
        super().__init__(mk, tier)
        self.swap_after = 3
        SwappingQueries.instances.append(self)


def test_a_pending_tier_swap_ends_the_resident_launch_and_starts_the_next(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--tier", "compiled"), dq_cls=SwappingQueries)
    (a, g), (g2, b) = mk.segments                 # two launches, back to back
    assert (a, b) == (0, STEPS) and g == g2 and 3 <= g < STEPS
    assert dq.swapped == 1 and dq.boundaries == [0, 1]     # the swap at the boundary between them
    assert fed == {k: len(mk.per_step[k]) for k in range(STEPS)}   # no step lost or fed twice
