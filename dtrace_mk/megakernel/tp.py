"""Tensor-parallel group of GPU megakernels: one MPI rank per GPU, CUDA IPC between them.

    from mpi4py import MPI
    from dtrace_mk.megakernel.tp import TPGroup
    from dtrace_mk.megakernel import gpu
    tp = TPGroup(MPI.COMM_WORLD)                     # collective; picks GPU rank % count
    mk = gpu.Megakernel(cfg, batch=4, seed=0, tp=tp) # collective: shards, buffers, IPC exchange
    res = mk.run(8, hooks="all")                     # collective: every rank calls it

`TPGroup(comm)`: `comm` is an mpi4py communicator of the serving ranks (None: a group of
one, single-GPU behaviour).  Construction selects CUDA device `rank % device_count`
(cupy) and checks that every rank sits on one host with its own GPU (CUDA IPC is
intra-node; two persistent kernels cannot share one GPU's SMs).  Attributes `rank`,
`ranks`, `comm`, `device`.

`exchange(ptrs)` (collective, called by `Megakernel.__init__` only) sends the CUDA IPC
handles of this rank's buffers (`cudaIpcGetMemHandle`; each pointer must be the base
of a cudaMalloc allocation: `alloc_shared`) to every rank with one `comm.allgather`
and opens the peers' (`cudaIpcOpenMemHandle`, lazy peer access): returns
`ptrs[q][i]` = rank q's buffer i mapped in this process (own: the pointers given).
`barrier()` is a no-op for a group of one.  `close()` unmaps the peers' buffers (after a
barrier, so no peer still writes).

The kernel side (comm tasks, system-scope signals, comm hooks) is kernels/mk_comm.cuh;
the lowering is graph.py's "Tensor parallelism".
"""
from __future__ import annotations

import socket
from typing import Any, List, Optional, Sequence

from ..errors import UserError


class TPGroup:
    def __init__(self, comm: Any = None):
        import cupy as cp
        self.cp = cp
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.ranks = comm.Get_size() if comm is not None else 1
        n = cp.cuda.runtime.getDeviceCount()
        if n < 1:
            raise UserError(f"TPGroup: rank {self.rank}: no CUDA device")
        self.device = self.rank % n
        cp.cuda.Device(self.device).use()
        self._opened: List[int] = []
        if self.ranks > 1:
            host = socket.gethostname()
            seen = comm.allgather((host, self.device))
            hosts = {h for h, _ in seen}
            if len(hosts) > 1:
                raise UserError(f"TPGroup: ranks span hosts {sorted(hosts)}: CUDA IPC needs one host")
            if len(set(seen)) != len(seen):
                raise UserError(f"TPGroup: {self.ranks} ranks but {n} GPU(s) on {host}: every rank "
                                f"needs its own GPU (persistent kernels cannot share one)")

    # -- collectives ------------------------------------------------------------------
    def barrier(self) -> None:
        if self.comm is not None and self.ranks > 1:
            self.comm.Barrier()

    def exchange(self, ptrs: Sequence[int]) -> List[List[int]]:
        """Collective: ptrs[q][i] = rank q's buffer i mapped here (see module doc)."""
        ptrs = [int(p) for p in ptrs]
        if self.ranks == 1:
            return [ptrs]
        rt = self.cp.cuda.runtime
        handles = [bytes(rt.ipcGetMemHandle(p)) for p in ptrs]
        every = self.comm.allgather(handles)
        out: List[List[int]] = []
        for q, hs in enumerate(every):
            if q == self.rank:
                out.append(ptrs)
                continue
            if len(hs) != len(ptrs):
                raise UserError(f"TPGroup: rank {q} registered {len(hs)} buffers, rank {self.rank} "
                                f"{len(ptrs)} (every rank must build the same Megakernel)")
            mapped = []
            for h in hs:
                p = int(rt.ipcOpenMemHandle(h))
                self._opened.append(p)
                mapped.append(p)
            out.append(mapped)
        return out

    def alloc_shared(self, shape, dtype):
        """A zeroed cupy array on its own cudaMalloc allocation (not the memory pool, whose
        chunks are sub-allocated: an IPC handle maps a whole allocation)."""
        import numpy as np
        cp = self.cp
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = cp.cuda.memory.Memory(max(n, 256))
        a = cp.ndarray(shape, dtype, memptr=cp.cuda.MemoryPointer(mem, 0))
        a.fill(0)
        return a

    def close(self) -> None:
        self.barrier()
        rt = self.cp.cuda.runtime
        for p in self._opened:
            try:
                rt.ipcCloseMemHandle(p)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._opened = []

    def __repr__(self) -> str:
        return f"TPGroup(rank={self.rank}, ranks={self.ranks}, device={self.device})"


def world_group() -> Optional[TPGroup]:
    """TPGroup over MPI.COMM_WORLD when launched with more than one rank, else None."""
    from .mpi_transport import mpi_world
    rank, size = mpi_world()
    if size <= 1:
        return None
    from mpi4py import MPI
    return TPGroup(MPI.COMM_WORLD)
