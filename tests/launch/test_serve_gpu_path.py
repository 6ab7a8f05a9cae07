"""The GPU serving path (`serve --backend gpu`) on a machine without a GPU: CuPy, the
megakernel, the clock pairing and the device VM are replaced by stand-ins that keep their
contracts (one step per `run(1)`, the step's hook records as CTX_DTYPE rows, queries run
by the "device" over the kernel's own records, never fed by the host), so the loop's
logic is checked here: attach through the control socket at a step boundary, output
streamed back, every task:end of every step counted exactly once (a query also fed by the
host would count twice), the agent's records reaching the in-process collector, and the
stop at the end.  The first launch's warm-up steps (diagnose's GPU_LAUNCH_WARMUP_STEPS,
device steps 0..W-1) run but are never fed; the served steps keep the device's numbers
W..W+STEPS-1.  The real thing runs in tests/gpu/test_launch_gpu.py."""
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
from dtrace_mk.commands.diagnose import GPU_LAUNCH_WARMUP_STEPS as W

STEPS = 10                      # observed steps: device steps W .. W + STEPS - 1
BATCH = 2
WORKERS = 8


class FakeMegakernel(FakeResident):
    """Resident launches (fake_device.FakeResident) over the sim's records of each step
    (the kernel's hook ring); `run(1)`: one step per launch (not used by serve)."""
    instances = []

    def __init__(self, cfg, batch, seed=0, tp=None, num_workers=None, defines=()):
        from dtrace_mk.launch.api import ALL_HOOKS
        from dtrace_mk.megakernel.sim import Sim, pack_ctx
        assert tp is None
        self.defines = tuple(defines)
        assert num_workers == WORKERS - 1            # one SM left for the clock kernel
        self.graph = build_graph(cfg, batch, num_workers)
        self.num_workers = num_workers
        self._res_init()
        self.step = 0
        self.observer = None
        self.runs = 0
        per = {}
        self.per_step = per
        Sim(self.graph, W + STEPS + 4, sink=lambda c: per.setdefault(c["decode_step"], []).append(pack_ctx(c)),
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


def _host_summaries_unless_named(extra):
    """serve's extra arguments with --summaries host unless they name a mode: the tests that
    count what is fed (every record) must not follow DEFAULT_SUMMARIES."""
    return tuple(extra) if "--summaries" in extra else ("--summaries", "host", *extra)


def _serve_with_query(monkeypatch, query, interval_s=30.0, extra=()):
    """serve --backend gpu (stand-ins) with `query` attached through the job's control
    socket before the first served step, its output streamed every `interval_s`; returns
    (rc, {"outputs", "end", "reply"}).  Host summaries unless `extra` names the mode (the
    device runtime then holds the query alone)."""
    pytest.importorskip("mpi4py")
    extra = _host_summaries_unless_named(extra)
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
    raw, name, text = compile_for_attach(query, None)
    got = {"outputs": [], "error": None}

    def client():
        try:
            assert wait_for_socket(job, time.monotonic() + 60)
            reply, stream = ControlClient(job).attach(raw, name, text, stream=True, interval_s=interval_s)
            got["reply"] = reply
            for msg in stream:
                if msg.get("type") == "output":
                    got["outputs"].append(msg)
                elif msg.get("type") == "end":
                    got["end"] = msg
                    break
        except Exception as e:
            got["error"] = e

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    th = threading.Thread(target=client, daemon=True)
    th.start()
    try:
        rc = serve.main(["--backend", "gpu", "--model", "tiny", "--batch", str(BATCH), "--steps", str(STEPS),
                         "--await-attach", "30", "--quiet", *extra])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        job.remove()
    th.join(30)
    assert got["error"] is None, got["error"]
    return rc, got


def test_gpu_loop_attaches_in_the_device_runtime_and_counts_every_task_once(runtime_dir, monkeypatch, tmp_path):
    result = tmp_path / "r.json"
    rc, got = _serve_with_query(monkeypatch, "task:end { @task_end[step] = count(); }", interval_s=0.01,
                                extra=("--result", str(result), "--tier", "auto"))
    assert rc == 0
    from dtrace_mk.launch import serve
    (mk,) = FakeMegakernel.instances[-1:]
    assert mk.segments == [(0, W + STEPS)] and mk.runs == 0  # ONE resident launch: warm-up + every step
    dq = FakeDeviceQueries.instances[-1]
    assert dq.tier == "auto"                                  # --tier reaches the live session
    assert dq.boundaries == [0]                               # a tier boundary before the launch
    final = got["outputs"][-1]
    assert final["final"] and got["end"]["reason"] == "job ended"
    part = final["ranks"]["0"]
    (block,) = [b for b in part["blocks"] if b.get("type") == "map"]
    counts = {int(e["key"][0]): int(e["value"]) for e in block["entries"]}
    apply_at = got["reply"]["apply_at"]
    assert apply_at > W                                       # never at a warm-up step (device numbers)
    # attached at a step boundary: the first step no worker had started when the attach
    # applied (host.step(apply_at): the grant was apply_at - 1 + RESIDENT_WINDOW), with no
    # parking (the kernel ran the whole launch without waiting for the attach)
    first = min(W + STEPS, apply_at - 1 + serve.RESIDENT_WINDOW)
    assert sorted(counts) == list(range(first, W + STEPS))
    from dtrace_mk.abi import definition as D
    from dtrace_mk.abi import context
    end_id = D.hook("task:end").id
    for k, n in counts.items():
        want = sum(1 for r in mk.per_step[k]
                   if int.from_bytes(r[context.OFF_HOOK:context.OFF_HOOK + 4], "little") == end_id)
        assert n == want == len(mk.graph.tasks), (k, n, want)   # once: not also fed by the host
    assert block["coverage"]["eligible"] == sum(counts.values())
    # the device tables' complete epochs were retired every RETIRE_EVERY fed steps (a
    # resident launch outlives the 64 coverage rows), each after the steps it frees finished
    assert len(dq.retire_calls) >= STEPS // serve.RETIRE_EVERY - 1
    assert dq.retire_calls == sorted(dq.retire_calls)
    import json
    res = json.loads(result.read_text())
    assert res["coverage"]["eligible"] > 0 and res["verdict"] in ("none", "fault")


@pytest.mark.parametrize("tier", ["hot", "compiled"])
def test_interval_clauses_of_a_device_query_cut_at_step_boundaries(runtime_dir, monkeypatch, tier):
    """interval: clauses of a query in the device runtime fire on the host's clock (it
    sees no records); each print + clear is a cut at a step boundary, its maps read once
    those steps are final (runtime.device_query).  Hot tier: the query attached again from
    the first unstarted step, replacing the last attachment -- no device map cleared, every
    ended attachment detached.  --tier compiled: attaching again would start a build and a
    launch-ending swap every interval, so the query and a parked twin are attached once and
    take turns (BufferedQueryRun: rearm, the folded one emptied).  Either way each interval
    prints exactly the task:end events of the steps its header names; the steps run on from
    the query's first step to the last served, none twice, none missed."""
    from dtrace_mk.abi import definition as D
    from dtrace_mk.abi import context
    rc, got = _serve_with_query(monkeypatch, "task:end { @n = count(); } interval:ms:1 { print(@n); clear(@n); }",
                                extra=() if tier == "hot" else ("--tier", tier))
    assert rc == 0
    dq = FakeDeviceQueries.instances[-1]
    mk = FakeMegakernel.instances[-1]
    end_id = D.hook("task:end").id
    ends = lambda k: sum(1 for r in mk.per_step[k]                                   # noqa: E731
                         if int.from_bytes(r[context.OFF_HOOK:context.OFF_HOOK + 4], "little") == end_id)
    value = lambda b: sum(int(e["value"]) for e in b["entries"])                      # noqa: E731
    blocks = [b for o in got["outputs"] for b in o["ranks"]["0"]["blocks"]]
    heads = [i for i, b in enumerate(blocks) if b["type"] == "interval"]
    assert len(heads) >= 2, blocks
    first = dq.firsts[dq.attached[0]]
    nxt = first
    for i in heads:
        lo, hi = blocks[i]["steps"]
        assert lo == nxt and hi >= lo - 1, (blocks[i], nxt)     # contiguous ranges
        (m,) = [blocks[i + 1]]
        assert m["type"] == "map" and m["when"] == "interval:ms:1"
        assert value(m) == sum(ends(k) for k in range(lo, hi + 1)) == m["coverage"]["eligible"]
        nxt = hi + 1
    assert nxt > first + 1                                       # the cuts saw more than one step
    final = [b for b in got["outputs"][-1]["ranks"]["0"]["blocks"] if b["type"] == "map"]
    assert value(final[-1]) == sum(ends(k) for k in range(nxt, W + STEPS))
    assert sorted(dq.detached) == sorted(dq.attached)
    if tier == "hot":
        assert dq.cleared == [] and dq.rearmed == []             # no in-place clear on the device
        assert len(dq.attached) >= 2
        assert [dq.firsts[a] for a in dq.attached] == sorted(dq.firsts[a] for a in dq.attached)
    else:
        assert len(dq.attached) == 2 and dq.rearmed and "n" in dq.cleared     # two, taking turns


def test_exit_in_a_device_query_ends_it_at_a_step_boundary(runtime_dir, monkeypatch):
    """exit() in a query that runs in the device runtime (never fed by the host): the host
    reads its exit map once a step, tells rank 0, which detaches it at the next step
    boundary; the client gets the final maps and `exit() on rank 0 at step S`; serving goes
    on to its last step."""
    at = W + STEPS - 2             # after the query's first step (the grant at the attach)
    rc, got = _serve_with_query(monkeypatch, f"task:end {{ @n[step] = count(); }} task:end /step == {at}/ {{ exit(); }}")
    assert rc == 0
    assert got["end"]["reason"].startswith("exit() on rank 0 at step"), got["end"]
    exit_step = int(got["end"]["reason"].split()[-1])
    final = got["outputs"][-1]
    assert final["final"]
    (block,) = [b for b in final["ranks"]["0"]["blocks"] if b.get("type") == "map"]
    counts = {int(e["key"][0]): int(e["value"]) for e in block["entries"]}
    assert at in counts and exit_step < W + STEPS         # detached before the end of serving
    dq = FakeDeviceQueries.instances[-1]
    assert dq.detached == [dq.attached[-1]]               # the query left the device


def _serve_fake(monkeypatch, tmp_path, extra=(), dq_cls=FakeDeviceQueries, drop_every=0, quiet=True,
                spy=None):
    """serve --backend gpu with the stand-ins, no job; returns (mk, dq, fed records per
    step as {step: count}, rank 0's diagnosis).  spy: a dict that gets the host.step
    calls ("steps") and the collector's epochs per rank ("epochs": {rank: [epoch...]}).
    Host summaries unless `extra` names the mode (what is fed is what these tests count:
    every record, whatever the default)."""
    extra = _host_summaries_unless_named(extra)
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
    if spy is not None:
        from dtrace_mk.collectors.diagnose import Accumulator
        orig_step, orig_result = api.ServingHost.step, Accumulator.result
        spy["steps"], spy["epochs"] = [], {}

        def step(self, k):
            spy["steps"].append(k)
            orig_step(self, k)

        def result(self, *a, **kw):
            for s in self.summaries:
                spy["epochs"].setdefault(s.rank, []).append(s.epoch)
            spy["summaries"] = list(self.summaries)
            return orig_result(self, *a, **kw)
        monkeypatch.setattr(api.ServingHost, "step", step)
        monkeypatch.setattr(Accumulator, "result", result)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    result = tmp_path / "r.json"
    try:
        rc = serve.main(["--backend", "gpu", "--model", "tiny", "--batch", str(BATCH), "--steps", str(STEPS),
                         *(["--quiet"] if quiet else []), "--result", str(result), *extra])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert rc == 0
    return FakeMegakernel.instances[-1], dq_cls.instances[-1], fed, json.loads(result.read_text())


def test_device_ring_drops_are_counted_lost_in_coverage(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, drop_every=7)
    ran = sum(len(mk.per_step[k]) for k in range(W + STEPS))      # warm-up steps' records too
    assert mk.dropped_total == ran // 7 > 0
    observed = sum(len(mk.per_step[k]) for k in range(W, W + STEPS))
    dropped_observed = sum(n for k, n in mk.dropped_by_step.items() if k >= W)
    assert sum(fed.values()) == observed - dropped_observed       # every stored record fed once
    # ... and every refused one reported lost by the rank's agent (as diagnose's GPU path
    # does): a drop has no step, so the warm-up's drops count too (an upper bound)
    assert res["transport"]["lost_records"] == {"0": mk.dropped_total}


def test_no_drops_no_loss_and_every_step_fed_in_order(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path)
    assert mk.segments == [(0, W + STEPS)] and mk.defines == ()        # (the standard build)
    assert fed == {k: len(mk.per_step[k]) for k in range(W, W + STEPS)}
    assert res["transport"]["lost_records"] in ({}, {"0": 0})


def test_warmup_steps_run_but_are_never_fed_and_served_steps_keep_device_numbers(monkeypatch, tmp_path,
                                                                                 capsys):
    assert W >= 1
    spy = {}
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, quiet=False, spy=spy)
    assert mk.segments == [(0, W + STEPS)]                        # the kernel ran the warm-up steps
    assert all(len(mk.per_step[k]) for k in range(W))             # ... which had records
    assert min(fed) == W and sorted(fed) == list(range(W, W + STEPS))   # none of them fed
    # the host never is at a warm-up step: host.step(W) first, then W+1 .. W+STEPS (the end)
    assert spy["steps"][0] == W and set(spy["steps"]) == set(range(W, W + STEPS + 1))
    assert spy["steps"] == sorted(spy["steps"])
    # the collector's result is made of exactly the STEPS observed epochs
    assert sorted(set(spy["epochs"][0])) == list(range(W, W + STEPS)), spy["epochs"]
    assert res["transport"]["lost_records"] in ({}, {"0": 0})    # warm-up records are not "lost"
    assert res["incomplete_ranks"] == {} and not res["partial"]
    err = capsys.readouterr().err
    assert f"first {W} steps warm the kernel up, not observed; steps {W}..{W + STEPS - 1} served" in err
    warm_recs = sum(len(mk.per_step[k]) for k in range(W))
    assert (f"served {STEPS} steps ({W}..{W + STEPS - 1}) in " in err
            and f"the first {W} steps warmed the kernel up, not observed ({warm_recs} records not fed)" in err), err


def test_a_fault_at_a_warmup_step_is_refused(monkeypatch, capsys):
    from dtrace_mk.launch import serve
    monkeypatch.delenv("DTRACE_MK_JOB_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    rc = serve.main(["--backend", "gpu", "--model", "tiny", "--steps", str(STEPS), "--quiet",
                     "--fault", f"late_comm:rank=0,steps=0-{W + 3},comm_op=allreduce_attn,delay_us=50"])
    err = capsys.readouterr().err
    assert rc != 0 and "warm-up steps" in err and f"{list(range(W))}" in err, err
    assert f"observed steps are {W}..{W + STEPS - 1}" in err, err


def test_device_summaries_ship_what_host_summaries_ship_and_only_used_hooks_stream(monkeypatch, tmp_path,
                                                                                  capsys):
    """--summaries device: the agent's task half runs in the "device VM" (the fake's
    reference runtime over the kernel's own records), in windows of 3 steps from the first
    observed step; the kernel streams only the hooks the host agent still uses (comm:*:
    none on one rank), and the collector gets the same summaries as with every record
    streamed to the host."""
    from dtrace_mk.runtime import summary_windows
    host_spy, dev_spy = {}, {}
    _serve_fake(monkeypatch, tmp_path, spy=host_spy)
    monkeypatch.setattr(summary_windows, "DEFAULT_WINDOW", 3)
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--summaries", "device"), spy=dev_spy,
                                   quiet=False)
    assert mk.hooks_streamed == ["comm:signal", "comm:wait"] and fed == {}
    want = {s.epoch: s for s in host_spy["summaries"]}
    got = {s.epoch: s for s in dev_spy["summaries"]}
    assert sorted(got) == list(range(W, W + STEPS)) and got == want
    assert all(s.coverage.eligible == s.coverage.executed > 0 for s in got.values())
    # windows from W: [W, W+3), [W+3, W+6), ...: each read once, detached, most given back
    assert dq.attached[0] not in dq.rt.attachments() and len(dq.attached) >= STEPS // 3
    assert [dq.firsts[a] for a in dq.attached[:3]] == [W, W + 3, W + 6]
    assert dq.forgotten and set(dq.forgotten) <= set(dq.detached)
    err = capsys.readouterr().err
    assert "summaries on the device" in err and "device summaries: " in err and "windows of 3 steps" in err


def test_summary_window_sets_the_device_windows_and_bad_ones_are_refused_before_a_build(monkeypatch, tmp_path,
                                                                                        capsys):
    """--summary-window W: the device summaries' windows are W steps from the first observed
    step; with host summaries, on the sim or outside 2..256 it is refused, no kernel built."""
    spy = {}
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--summaries", "device", "--summary-window", "4"),
                                   spy=spy, quiet=False)
    assert [dq.firsts[a] for a in dq.attached[:3]] == [W, W + 4, W + 8]
    assert sorted(s.epoch for s in spy["summaries"]) == list(range(W, W + STEPS))
    assert "windows of 4 steps" in capsys.readouterr().err
    from dtrace_mk.launch import serve
    built = []
    monkeypatch.setattr(FakeMegakernel, "__init__", lambda self, *a, **kw: built.append(a) or (_ for _ in ()).throw(
        AssertionError("a kernel was built")))
    gpu_args = ["--backend", "gpu", "--model", "tiny", "--steps", str(STEPS), "--quiet"]
    for extra, want in ((["--summaries", "host", "--summary-window", "8"],
                         "--summary-window 8: only with device summaries (--summaries device)"),
                        (["--summary-window", "1"], "--summary-window: expected 2..256 steps, got 1"),
                        (["--summary-window", "257"], "--summary-window: expected 2..256 steps, got 257")):
        assert serve.main(gpu_args + extra) != 0
        assert want in capsys.readouterr().err, extra
    assert serve.main(["--backend", "sim", "--steps", "2", "--quiet", "--summary-window", "8"]) != 0
    assert "--summary-window: windows are the GPU backend's device summaries" in capsys.readouterr().err
    assert built == []


def test_kernel_define_reaches_the_build_and_bad_ones_are_refused_before_it(monkeypatch, tmp_path, capsys):
    """--kernel-define DTMK_NAME (repeatable, measurement): added to the GPU build's defines
    (bench/serve.py's workers+DTMK_DRAIN_POLL); a name that is not a DTMK_ macro, or the sim
    backend, is refused before any kernel is built."""
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--kernel-define", "DTMK_DRAIN_POLL",
                                                                 "--kernel-define", "DTMK_OSQ_DEFER=16"))
    assert mk.defines == ("DTMK_DRAIN_POLL", "DTMK_OSQ_DEFER=16") and res["verdict"] == "none"
    from dtrace_mk.launch import serve
    built = []
    monkeypatch.setattr(FakeMegakernel, "__init__", lambda self, *a, **kw: built.append(a) or (_ for _ in ()).throw(
        AssertionError("a kernel was built")))
    for bad in ("DRAIN_POLL", "DTMK_X=y", "DTMK_A;rm"):
        assert serve.main(["--backend", "gpu", "--model", "tiny", "--steps", str(STEPS), "--quiet",
                           "--kernel-define", bad]) != 0
        assert f"--kernel-define {bad!r}: expected DTMK_NAME or DTMK_NAME=N" in capsys.readouterr().err, bad
    assert serve.main(["--backend", "sim", "--steps", "2", "--quiet", "--kernel-define", "DTMK_DRAIN_POLL"]) != 0
    assert "--kernel-define DTMK_DRAIN_POLL: a variant of the GPU megakernel's build" in capsys.readouterr().err
    assert built == []


def test_device_summaries_refuse_a_bad_environment_value(monkeypatch, capsys):
    from dtrace_mk.launch import serve
    monkeypatch.delenv("DTRACE_MK_JOB_DIR", raising=False)
    monkeypatch.setenv("DTRACE_MK_SUMMARIES", "gpu")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(__import__("dtrace_mk.megakernel.gpu", fromlist=["x"]), "Megakernel", FakeMegakernel)
    monkeypatch.setattr(__import__("dtrace_mk.megakernel.gpu_clock", fromlist=["x"]), "GpuClock", FakeClock)
    from dtrace_mk.launch import device_live
    monkeypatch.setattr(device_live, "DeviceQueries", FakeDeviceQueries)
    rc = serve.main(["--backend", "gpu", "--model", "tiny", "--steps", str(STEPS), "--quiet"])
    err = capsys.readouterr().err
    assert rc != 0 and "$DTRACE_MK_SUMMARIES: expected host or device, got 'gpu'" in err, err


def test_device_summaries_are_refused_on_the_sim_backend(monkeypatch, capsys):
    from dtrace_mk.launch import serve
    monkeypatch.delenv("DTRACE_MK_JOB_DIR", raising=False)
    rc = serve.main(["--backend", "sim", "--steps", "2", "--quiet", "--summaries", "device"])
    err = capsys.readouterr().err
    assert rc != 0 and "--summaries device: the summaries run in the GPU megakernel's device VM" in err, err


class SwappingQueries(FakeDeviceQueries):
    instances = []

    def __init__(self, mk, tier="hot"):
        super().__init__(mk, tier)
        self.swap_after = 3
        SwappingQueries.instances.append(self)


def test_a_pending_tier_swap_ends_the_resident_launch_and_starts_the_next(monkeypatch, tmp_path):
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--tier", "compiled"), dq_cls=SwappingQueries)
    (a, g), (g2, b) = mk.segments                 # two launches, back to back (warm-up: the first only)
    assert (a, b) == (0, W + STEPS) and g == g2 and W < g < W + STEPS and g >= 3
    assert dq.swapped == 1 and dq.boundaries == [0, 1]     # the swap at the boundary between them
    assert fed == {k: len(mk.per_step[k]) for k in range(W, W + STEPS)}   # no step lost or fed twice


def test_device_summary_windows_carry_across_a_tier_swap_between_launches(monkeypatch, tmp_path):
    """A compiled-tier swap ends the resident launch and starts the next: the summary
    windows attached on the device go on across the boundary (a window may span both
    launches), and the collector gets the same summaries as with host summaries."""
    from dtrace_mk.runtime import summary_windows
    host_spy, dev_spy = {}, {}
    _serve_fake(monkeypatch, tmp_path, spy=host_spy)
    monkeypatch.setattr(summary_windows, "DEFAULT_WINDOW", 4)
    mk, dq, fed, res = _serve_fake(monkeypatch, tmp_path, extra=("--tier", "compiled", "--summaries", "device"),
                                   dq_cls=SwappingQueries, spy=dev_spy)
    assert len(mk.segments) == 2 and dq.swapped == 1 and fed == {}
    want = {s.epoch: s for s in host_spy["summaries"]}
    got = {s.epoch: s for s in dev_spy["summaries"]}
    assert sorted(got) == list(range(W, W + STEPS)) and got == want


def test_observer_sm_serving_builds_the_observer_sm_kernel_with_m_workers_fewer(monkeypatch, capsys):
    """--observer sm (one rank): the megakernel is the observer-SM build, planned for M
    workers fewer than the default serving kernel (one SM stays free for the clock pairs, M
    run the observers: --observer-sms, default 4); the sim backend refuses the flag, and
    --observer-sms outside 1..8 or without --observer sm is refused."""
    from dtrace_mk.launch import serve
    from dtrace_mk.megakernel import gpu
    monkeypatch.delenv("DTRACE_MK_JOB_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    built = []

    class Built(Exception):
        pass

    def fake(cfg, batch, seed=0, tp=None, num_workers=None, defines=(), idle_sms=0, **shared):
        built.append((num_workers, defines) + ((idle_sms, sorted(shared)) if idle_sms else ()))
        if not idle_sms:
            raise Built
        return types.SimpleNamespace(weights="the job's weights", graph="the job's graph", tag=len(built))
    monkeypatch.setattr(gpu, "Megakernel", fake)
    placed = []

    def place(mk, twin):
        placed.append((mk.tag, twin.tag))
        raise Built
    monkeypatch.setattr(serve, "place_observers_calibrated", place)
    args = ["--backend", "gpu", "--model", "tiny", "--steps", str(STEPS), "--quiet", "--observer", "sm"]
    with pytest.raises(Built):
        serve.main(args)
    with pytest.raises(Built):
        serve.main(args + ["--observer-sms", "1"])
    with pytest.raises(Built):
        serve.main(args + ["--observer-sms", "3"])
    # (the CLI's observer SM publishes entries lazily, staged: gpu.observer_defines)
    lazy = ("DTMK_OSQ_LAZY_PUB", f"DTMK_OSQ_DEFER={gpu.OSQ_DEFER_DEFAULT}")
    assert built == [(WORKERS - 1 - gpu.OBS_SMS_DEFAULT, ("DTMK_OBS_SM", f"DTMK_OBS_SMS={gpu.OBS_SMS_DEFAULT}") + lazy),
                     (WORKERS - 2, ("DTMK_OBS_SM",) + lazy), (WORKERS - 4, ("DTMK_OBS_SM", "DTMK_OBS_SMS=3") + lazy)]
    # --observer-place calibrate: as many workers, the grid one CTA larger (every SM, one idle),
    # the job's kernel and a twin sharing its weights and graph, the twin calibrated
    del built[:]
    with pytest.raises(Built):
        serve.main(args + ["--observer-place", "calibrate"])
    pin = ("DTMK_OBS_SM", f"DTMK_OBS_SMS={gpu.OBS_SMS_DEFAULT}") + lazy + ("DTMK_SM_WORKER", "DTMK_SM_IDLE")
    assert built == [(WORKERS - 1 - gpu.OBS_SMS_DEFAULT, pin, 1, []),
                     (WORKERS - 1 - gpu.OBS_SMS_DEFAULT, pin, 1, ["graph", "weights"])]
    assert placed == [(1, 2)]
    del built[:3]
    capsys.readouterr()
    assert serve.main(args + ["--observer-sms", "9"]) != 0
    assert "--observer-sms: want 1..8 observer SMs, got 9" in capsys.readouterr().err
    assert serve.main(["--backend", "gpu", "--steps", "2", "--quiet", "--observer-sms", "2"]) != 0
    assert "--observer-sms: only with --observer sm" in capsys.readouterr().err
    assert not built                                        # (neither refusal built a kernel)
    assert serve.main(["--backend", "sim", "--steps", "2", "--quiet", "--observer", "sm"]) != 0
    assert "--observer sm" in capsys.readouterr().err
