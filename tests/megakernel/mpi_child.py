"""Child program of test_mk_mpi.py, started under mpiexec (not a test module).

    mpiexec -n R python mpi_child.py fail   # rank 1's hook sink raises mid-run
"""
import sys

from dtrace_mk.megakernel.mpi_transport import run_mpi
from dtrace_mk.megakernel.presets import PRESETS


def main(mode: str) -> int:
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    seen = [0]

    def sink(ctx):
        seen[0] += 1
        if mode == "fail" and rank == 1 and seen[0] == 300:
            raise ValueError("sink of rank 1 broke")

    try:
        res = run_mpi(PRESETS["tiny"], 2, 8, 6, sink=sink)
    except Exception as e:          # every rank must get here, none may hang
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 3
    print(f"rank {rank}: ok {res.tasks_run}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
