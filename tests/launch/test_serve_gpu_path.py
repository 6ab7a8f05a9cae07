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
from fake_device import FakeDeviceQueries  # noqa: E402  (shared with fake_gpu/sitecustomize.py)
from dtrace_mk.megakernel.presets import get_preset

STEPS = 10
BATCH = 2
WORKERS = 8


class FakeMegakernel:
    """One step per run(1): the sim's records of that step (the kernel's hook ring)."""
    instances = []

    def __init__(self, cfg, batch, seed=0, tp=None):
        from dtrace_mk.launch.api import ALL_HOOKS
        from dtrace_mk.megakernel.sim import Sim, pack_ctx
        assert tp is None
        self.graph = build_graph(cfg, batch, WORKERS)
        self.num_workers = WORKERS
        self.step = 0
        self.observer = None
        self.runs = 0
        per = {}
        Sim(self.graph, STEPS + 4, sink=lambda c: per.setdefault(c["decode_step"], []).append(pack_ctx(c)),
            hooks=ALL_HOOKS, seed=seed).run()
        self.per_step = per
        FakeMegakernel.instances.append(self)

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
    dev = types.SimpleNamespace(id=0, use=lambda: None)
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
    assert mk.runs == STEPS                                   # one launch per step
    dq = FakeDeviceQueries.instances[-1]
    assert dq.tier == "auto"                                  # --tier reaches the live session
    assert dq.boundaries == list(range(STEPS))                # a tier boundary before every launch
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
