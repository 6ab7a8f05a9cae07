"""Stand-ins for CuPy, the GPU megakernel, tensor parallelism, the clock pairing and the
device VM, installed at interpreter start when DTRACE_MK_FAKE_GPUS=N is set and this
folder is on PYTHONPATH (tests/launch/test_demo_gpu_fake.py: the GPU demo's processes
under mpiexec on a machine without a GPU).  They keep the contracts the serving loop
relies on: one resident launch per segment (`start_resident` / `grant` / `poll` /
`finish`, fake_device.FakeResident) streaming the hook records (CTX_DTYPE rows, here from
a 2-rank sim of the same graph and fault tables; the ranks must end every launch at the
same step, or finish() fails), attached queries are run by the "device" over those
records (never fed by the host)."""
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
    from fake_device import FakeResident   # beside this file

    class Megakernel(FakeResident):
        def __init__(self, cfg, batch, seed=0, tp=None, num_workers=None):
            from dtrace_mk.megakernel.graph import build_graph
            self.cfg, self.batch, self.seed, self.tp = cfg, batch, seed, tp
            self.rank, self.ranks = (tp.rank, tp.size) if tp is not None else (0, 1)
            self.num_workers = num_workers or SMS
            self.graph = build_graph(cfg, batch, self.num_workers, rank=self.rank, ranks=self.ranks)
            self._res_init()
            if os.environ.get("DTRACE_MK_FAKE_UNEVEN"):  # rank 0 sees finished steps in bigger groups
                self.report_every = 3 if self.rank == 0 else 1
            sig_at = int(os.environ.get("DTRACE_MK_FAKE_SIGINT_AT") or -1)
            if sig_at >= 0 and self.rank == 1:           # rank 1 asks to stop (SIGINT) at that step
                import signal
                sent = []
                self.on_done = lambda d: (d >= sig_at and not sent and
                                          (sent.append(1) or os.kill(os.getpid(), signal.SIGINT)))
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
            run_loopback(self.cfg, self.batch, self.num_workers, self.ranks, STEPS, faults=tables, sinks=sinks,
                         seed=self.seed, clock_skew=False, hooks=ALL_HOOKS)
            self.per_step = per[self.rank]

        def start_resident(self, hooks=None, faults=None, **kw):
            if self.per_step is None:
                self._simulate(faults)
            super().start_resident(hooks, faults, **kw)

        def _records_of(self, k):
            return self.per_step.get(k, [])

        def _collective(self, what):
            if self.tp is not None:               # a collective launch; the same stop step
                got = self.tp.comm.allgather(what)
                if any(g != what for g in got):
                    raise RuntimeError(f"rank {self.rank}: ranks disagree at a launch boundary: {got}")

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
