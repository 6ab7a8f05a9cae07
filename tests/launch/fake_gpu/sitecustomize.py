"""Stand-ins for CuPy, the GPU megakernel, tensor parallelism, the clock pairing and the
device VM, installed at interpreter start when DTRACE_MK_FAKE_GPUS=N is set and this
folder is on PYTHONPATH (tests/launch/test_demo_gpu_fake.py: the GPU demo's processes
under mpiexec on a machine without a GPU).  They keep the contracts the serving loop
relies on: `Megakernel.run(1)` is one collective step returning that step's hook records
(CTX_DTYPE rows, here from a 2-rank sim of the same graph and fault tables), attached
queries are run by the "device" over those records (never fed by the host)."""
import os
import sys
import types

N = int(os.environ.get("DTRACE_MK_FAKE_GPUS") or 0)
SMS = 8
STEPS = int(os.environ.get("DTRACE_MK_FAKE_STEPS") or 40)


def _install():
    import numpy as np

    class _Dev:
        def __init__(self, i=None):
            self.id = 0 if i is None else int(i)
            self.attributes = {"MultiProcessorCount": SMS}

        def use(self):
            pass

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: N),
                                      Device=_Dev)
    sys.modules["cupy"] = cupy

    class TPGroup:
        def __init__(self, comm):
            self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()

    tp = types.ModuleType("dtrace_mk.megakernel.tp")
    tp.TPGroup = TPGroup
    sys.modules["dtrace_mk.megakernel.tp"] = tp

    from dtrace_mk.megakernel import gpu, gpu_clock
    from dtrace_mk.launch import device_live

    class Megakernel:
        def __init__(self, cfg, batch, seed=0, tp=None):
            from dtrace_mk.megakernel.graph import build_graph
            self.cfg, self.batch, self.seed, self.tp = cfg, batch, seed, tp
            self.rank, self.ranks = (tp.rank, tp.size) if tp is not None else (0, 1)
            self.graph = build_graph(cfg, batch, SMS, rank=self.rank, ranks=self.ranks)
            self.num_workers = SMS
            self.step = 0
            self.observer = None
            self.per_step = None
            self.last_ts = 0

        def _simulate(self, faults):
            from dtrace_mk.launch.api import ALL_HOOKS
            from dtrace_mk.megakernel.mpi_transport import run_loopback
            from dtrace_mk.megakernel.sim import pack_ctx
            tables = self.tp.comm.allgather(faults) if self.tp is not None else [faults]
            per = [dict() for _ in range(self.ranks)]
            sinks = [(lambda r: lambda c: per[r].setdefault(c["decode_step"], []).append(pack_ctx(c)))(r)
                     for r in range(self.ranks)]
            run_loopback(self.cfg, self.batch, SMS, self.ranks, STEPS, faults=tables, sinks=sinks,
                         seed=self.seed, clock_skew=False, hooks=ALL_HOOKS)
            self.per_step = per[self.rank]

        def run(self, steps, hooks=None, faults=None, **kw):
            assert steps == 1, "one step per launch"
            if self.per_step is None:
                self._simulate(faults)
            if self.tp is not None:
                self.tp.comm.Barrier()               # a collective launch
            recs = self.per_step.get(self.step, [])
            if self.observer is not None:
                for r in recs:
                    self.observer.rt.fire(r)
            self.step += 1
            arr = np.frombuffer(b"".join(recs), dtype=gpu.CTX_DTYPE) if recs else np.zeros(0, gpu.CTX_DTYPE)
            if len(arr):
                self.last_ts = int(arr["ts_ns"].max())
            return types.SimpleNamespace(hooks=arr, hooks_dropped=0, elapsed_ms=0.05)

    from fake_device import FakeDeviceQueries as DeviceQueries   # beside this file

    class GpuClock:
        """Identity clocks (the sim ran with clock_skew=False): device = host."""
        def feed(self, host, rounds=None):
            from dtrace_mk.collectors.transport import host_clock
            t = host_clock()
            host.clock_sample(t, t)

    gpu.Megakernel = Megakernel
    gpu_clock.GpuClock = GpuClock
    device_live.DeviceQueries = DeviceQueries


if N > 0:
    _install()
