"""The rank agent's host time per decode step: host summaries vs device summaries.

    .venv/bin/python bench/agent_host.py [--steps 24] [--workers 131] [--repeat 3]

On a GPU rank the agent either runs the summary monitors itself over every hook record
the kernel streams (`serve --summaries host`, the default: the host then paces the
kernel) or leaves their task half to the device VM and is fed only the comm:* records
(`--summaries device`, runtime/summary_windows.py).  This measures the HOST side of both
on this machine, over the records of a 2-rank tensor-parallel tiny run (the demo's job,
with the GPU's worker count) and of a 1-rank 1b run: `feed` of every record it gets plus
the epoch flushes (device mode: the flush of each window's maps).  The reference device
model's firing is the GPU's work and is not timed; its protocol calls (attach, read,
detach) are timed apart: on a GPU rank they are DeviceQueries', not this CPU model's.
Set-up is not timed in either mode.  Both modes must ship the same records (checked
before any timing).  Prints the agent's ms of host time per step per rank, best of
--repeat, and the ratio.
The device's side (the VM's cost in the kernel, a window's device-to-host copy) is the
GPU's to measure (tools/obs_sm_gpu_plan.sh 107).
"""
from __future__ import annotations

import argparse
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path

REQUIRES = "cpu"   # what `dtrace-mk bench agent_host` checks before it runs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtrace_mk.abi import context                            # noqa: E402
from dtrace_mk.collectors.records import EpochSummary, RemoteWait, Signal   # noqa: E402
from dtrace_mk.launch.api import ALL_HOOKS                   # noqa: E402
from dtrace_mk.megakernel.graph import build_graph           # noqa: E402
from dtrace_mk.megakernel.mpi_transport import run_loopback  # noqa: E402
from dtrace_mk.megakernel.presets import get_preset          # noqa: E402
from dtrace_mk.megakernel.sim import pack_ctx                # noqa: E402
from dtrace_mk.runtime.agent import ListChannel, RankAgent   # noqa: E402
from dtrace_mk.runtime.summary_windows import ReferenceDevice   # noqa: E402

FIRST = 2            # the GPU serving loop's warm-up steps: run, never observed


class TimedDevice(ReferenceDevice):
    """The reference device model, its protocol calls timed apart (`calls_s`): on a GPU
    rank those are DeviceQueries' (verify + encode + a table write per attach, a device-
    to-host copy per window read), not this CPU model's (it builds host VMs)."""

    calls_s = 0.0


def _timed(name: str):
    def call(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return getattr(ReferenceDevice, name)(self, *a, **kw)
        finally:
            self.calls_s += time.perf_counter() - t0
    return call


for _name in ("attach", "first_epoch_of", "final_epoch", "detach", "forget", "maps", "coverage"):
    setattr(TimedDevice, _name, _timed(_name))


def records(model: str, ranks: int, steps: int, workers: int, batch: int):
    """(graphs, per rank {step: [packed records]}) of a sim run."""
    cfg = get_preset(model)
    graphs = [build_graph(cfg, batch, workers, rank=r, ranks=ranks) for r in range(ranks)]
    per = [dict() for _ in range(ranks)]
    sinks = [(lambda r: lambda c: per[r].setdefault(c["decode_step"], []).append(pack_ctx(c)))(r)
             for r in range(ranks)]
    run_loopback(cfg, batch, workers, ranks, steps, sinks=sinks, graphs=graphs, hooks=ALL_HOOKS,
                 clock_skew=False)
    return graphs, per


def shipped(ch):
    out = []
    for r in ch.records():
        if isinstance(r, (EpochSummary, RemoteWait, Signal)):
            out.append(r)
    return sorted(out, key=repr)


def host_mode(graph, rank, per, steps, workers):
    ch = ListChannel()
    a = RankAgent(rank, ch, num_workers=workers, schema=graph.schema, escalate=False)
    t0 = time.perf_counter()
    for k in range(FIRST, steps):
        for r in per.get(k, ()):
            a.feed(r)
    a.close()
    return time.perf_counter() - t0, ch


def device_mode(graph, rank, per, steps, workers, window):
    """The serving loop's order (kernel RESIDENT_WINDOW = 4 steps ahead); the device
    model's firing is the GPU's work: outside the timed parts."""
    ch = ListChannel()
    dev = TimedDevice(workers)
    a = RankAgent(rank, ch, num_workers=workers, schema=graph.schema, escalate=False)
    spent = 0.0
    a.summarize_on(dev, FIRST, window)     # set-up, as the agent's construction: not timed
    fed = {context.hook_id(h) for h in a.hooks}
    dev.calls_s = 0.0
    for k in range(FIRST, steps):
        while dev.started < min(steps, k + 5):
            dev.run_step(per.get(dev.started, ()))
        dev.final = k
        # what the kernel's hook mask lets into its ring (the device filters, not the host)
        streamed = [r for r in per.get(k, ()) if struct.unpack_from("<I", r, context.OFF_HOOK)[0] in fed]
        t0 = time.perf_counter()
        for r in streamed:
            a.feed(r)
        a.device_progress(k)
        spent += time.perf_counter() - t0
    t0 = time.perf_counter()
    a.close()
    spent += time.perf_counter() - t0
    return spent - dev.calls_s, dev.calls_s, ch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--workers", type=int, default=131, help="workers per rank (an H200 serving rank: 131)")
    ap.add_argument("--window", type=int, default=16, help="device summary window, steps (default 16)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default="tiny:2,1b:1", help="MODEL:RANKS,... (default tiny:2,1b:1)")
    a = ap.parse_args()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except OSError:
        commit = "?"
    print(f"# agent host time per step, {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}, commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# {a.steps} steps ({a.steps - FIRST} observed), {a.workers} workers, window {a.window}, best of {a.repeat}")
    print("| case | rank | records / step fed: host summaries | device summaries | agent ms / step: host summaries "
          "| device summaries | host / device | (device model's calls, ms / step) |")
    print("|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        model, ranks = case.split(":")
        graphs, per = records(model, int(ranks), a.steps, a.workers, batch=4 if model == "tiny" else 1)
        obs = a.steps - FIRST
        for rank in range(int(ranks)):
            hs, ds, cs = [], [], []
            for _ in range(a.repeat):
                th, ch_h = host_mode(graphs[rank], rank, per[rank], a.steps, a.workers)
                td, tc, ch_d = device_mode(graphs[rank], rank, per[rank], a.steps, a.workers, a.window)
                if shipped(ch_h) != shipped(ch_d):
                    sys.exit(f"{case} rank {rank}: device summaries differ from host summaries -- not timed")
                hs.append(th)
                ds.append(td)
                cs.append(tc)
            n_all = sum(len(per[rank].get(k, ())) for k in range(FIRST, a.steps))
            comm = {context.hook_id("comm:wait"), context.hook_id("comm:signal")}
            n_dev = sum(struct.unpack_from("<I", r, context.OFF_HOOK)[0] in comm
                        for k in range(FIRST, a.steps) for r in per[rank].get(k, ()))
            h, d, c = min(hs) / obs * 1e3, min(ds) / obs * 1e3, min(cs) / obs * 1e3
            print(f"| {model} x{ranks} | {rank} | {n_all / obs:.0f} | {n_dev / obs:.0f} | {h:.2f} | {d:.3f} | "
                  f"{h / d:.0f}x | {c:.2f} |")


if __name__ == "__main__":
    main()
