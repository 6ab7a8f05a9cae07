"""In-process sim runs with the GPU's comm:wait semantics (`Sim(gpu_comm_wait=True)`) and
an optional per-step launch skew (`launch_skew_ns`), through the real per-rank agents
(default summary monitors) and the collector's `diagnose`, no mpiexec."""
from dtrace_mk.collectors.diagnose import Accumulator
from dtrace_mk.collectors.scenario import device_fault_specs
from dtrace_mk.megakernel.faults import FaultTable
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.mpi_transport import run_loopback
from dtrace_mk.megakernel.presets import SIM_WORKERS, get_preset
from dtrace_mk.runtime.agent import ListChannel, RankAgent


def run_gpu_semantics(sc, *, ranks=None, gpu_comm_wait=True, launch_skew_ns=0, background=None):
    """Diagnose `sc` on the sim with the GPU's semantics.  `background`: {rank: [fault
    spec]} injected besides the scenario's faults but not part of its ground truth (a
    GPU's steady asymmetry, e.g. one rank's signal a little late every step)."""
    ranks = ranks or sc.ranks
    cfg = get_preset(sc.model)
    graphs = [build_graph(cfg, sc.batch, SIM_WORKERS, rank=r, ranks=ranks) for r in range(ranks)]
    chans = [ListChannel() for _ in range(ranks)]
    agents = [RankAgent(r, chans[r], num_workers=SIM_WORKERS, schema=graphs[r].schema)
              for r in range(ranks)]
    for a in agents:
        a.start(pings=0)
    background = background or {}
    faults = {r: FaultTable.from_specs(device_fault_specs(sc, r) + list(background.get(r, [])),
                                       f"{sc.source} rank {r}")
              for r in range(ranks)}
    run_loopback(cfg, sc.batch, SIM_WORKERS, ranks, sc.steps, faults=faults,
                 sinks=[a.sink for a in agents], seed=sc.seed, graphs=graphs,
                 on_clock=[a.clock_sample for a in agents], hooks=agents[0].hooks,
                 gpu_comm_wait=gpu_comm_wait, launch_skew_ns=launch_skew_ns)
    acc = Accumulator()
    for r, (a, ch) in enumerate(zip(agents, chans)):
        a.close()
        for p in ch.payloads:
            acc.on_bytes(r, p)
    return acc.result(sc, ranks=ranks), acc
