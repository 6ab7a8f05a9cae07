"""Pairs of (host clock ns, GPU `%globaltimer` ns) on the current CUDA device.

    from dtrace_mk.megakernel.gpu_clock import GpuClock
    clk = GpuClock()                   # compiles a 1-thread kernel (NVRTC, no std headers)
    s = clk.sample(rank=1)             # -> ClockSample(rank, device_ns, host_ns)
    agent.clock_sample(s.device_ns, s.host_ns)     # or: clk.feed(agent)

One round trip: read the host clock (`h0`), launch a kernel that stores `%globaltimer`,
synchronize, read the host clock again (`h1`).  The device stamp was taken somewhere in
[h0, h1], so the pair (device, (h0 + h1) / 2) is off by at most (h1 - h0) / 2.  Of
`rounds` round trips the one with the smallest h1 - h0 is kept (the same min-latency rule
as the Score-P ping-pong in collectors/clock.py); its half round trip is the error bound
(`Pairing.bound_ns`).

The host clock is the transport's (`collectors.transport.host_clock`, monotonic ns): the
collector's ping-pongs compare that clock, so the two alignments chain.  The collector
fits offset AND slope per rank (`collectors.clock.fit_device_clock`), so one sample is
not enough: take samples spread over the run (before, between and after launches; a
sample cannot run while a persistent megakernel holds every SM, the launch would queue).

The pairing (`best_pair`) and a local fit (`fit_pairs`) are pure functions over injected
readings, tested without a GPU (tests/megakernel/test_gpu_clock.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from ..collectors.records import ClockSample
from ..errors import UserError

KERNEL_NAME = "dtmk_read_globaltimer"

#: NVRTC source: no headers at all (NVRTC 13 has no C++ std headers).
KERNEL_SOURCE = r"""
extern "C" __global__ void dtmk_read_globaltimer(unsigned long long* out)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[0] = t;
}
"""

DEFAULT_ROUNDS = 8


@dataclass(frozen=True)
class Pairing:
    """One calibrated pair: the device stamp and the host midpoint of the best round trip."""
    device_ns: int
    host_ns: int          # (h0 + h1) // 2 of the kept round trip
    bound_ns: int         # (h1 - h0) // 2 rounded up: |true host time of the stamp - host_ns|
    rounds: int           # round trips measured

    def record(self, rank: int) -> ClockSample:
        return ClockSample(int(rank), int(self.device_ns), int(self.host_ns))


def best_pair(readings: Iterable[Tuple[int, int, int]]) -> Pairing:
    """readings: (h0, device, h1) per round trip.  Keeps the one with the smallest round trip
    (ties: the first).  Raises on an empty list or a round trip that goes backwards."""
    best = None
    n = 0
    for h0, dev, h1 in readings:
        h0, dev, h1 = int(h0), int(dev), int(h1)
        if h1 < h0:
            raise UserError(f"gpu clock: round trip {n}: host clock went backwards "
                            f"(h0 {h0} > h1 {h1})")
        n += 1
        if best is None or h1 - h0 < best[2] - best[0]:
            best = (h0, dev, h1)
    if best is None:
        raise UserError("gpu clock: no round trips measured")
    h0, dev, h1 = best
    rtt = h1 - h0
    return Pairing(dev, h0 + rtt // 2, (rtt + 1) // 2, n)


def fit_pairs(pairs: Sequence[Pairing]) -> Tuple[float, float, float]:
    """Least-squares host = host0 + a + b * (device - device0) over pairs (the fit the
    collector does, for reporting here): returns (a ns, slope b, max residual ns)."""
    if not pairs:
        raise UserError("gpu clock: no pairs to fit")
    d0, h0 = pairs[0].device_ns, pairs[0].host_ns
    xs = [float(p.device_ns - d0) for p in pairs]
    ys = [float(p.host_ns - h0) for p in pairs]
    n = len(xs)
    xm, ym = sum(xs) / n, sum(ys) / n
    sxx = sum((x - xm) ** 2 for x in xs)
    b = 1.0 if sxx == 0.0 else sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sxx
    a = ym - b * xm
    return a, b, max(abs(y - (a + b * x)) for x, y in zip(xs, ys))


def _default_host_clock() -> Callable[[], int]:
    from ..collectors.transport import host_clock
    return host_clock


class GpuClock:
    """Samples the current CuPy device's `%globaltimer` against the host clock."""

    def __init__(self, rounds: int = DEFAULT_ROUNDS,
                 host_clock: Optional[Callable[[], int]] = None):
        import cupy as cp
        import numpy as np
        if rounds < 1:
            raise UserError(f"gpu clock: rounds must be >= 1, got {rounds}")
        self.rounds = int(rounds)
        self.host_clock = host_clock or _default_host_clock()
        self._cp = cp
        self._kernel = cp.RawKernel(KERNEL_SOURCE, KERNEL_NAME)
        self._buf = cp.zeros(1, dtype=cp.uint64)
        self._host = cp.cuda.alloc_pinned_memory(8)
        self._out = np.frombuffer(self._host, dtype=np.uint64, count=1)
        self._stream = cp.cuda.Stream(non_blocking=True)
        self.pairs: List[Pairing] = []
        self.read_once()                        # compile + load + warm up outside any timing

    def read_once(self) -> Tuple[int, int, int]:
        """One round trip: (h0, device ns, h1)."""
        s = self._stream
        h0 = self.host_clock()
        self._kernel((1,), (1,), (self._buf,), stream=s)
        s.synchronize()
        h1 = self.host_clock()
        rt = self._cp.cuda.runtime
        rt.memcpyAsync(self._host.ptr, self._buf.data.ptr, 8, rt.memcpyDeviceToHost, s.ptr)
        s.synchronize()
        return h0, int(self._out[0]), h1

    def pair(self, rounds: Optional[int] = None) -> Pairing:
        p = best_pair(self.read_once() for _ in range(rounds or self.rounds))
        self.pairs.append(p)
        return p

    def sample(self, rank: int, rounds: Optional[int] = None) -> ClockSample:
        """The ClockSample record the agent ships (`RankAgent.clock_sample(device, host)`)."""
        return self.pair(rounds).record(rank)

    def feed(self, agent, rounds: Optional[int] = None) -> Pairing:
        """Take one pair and hand it to `agent.clock_sample`."""
        p = self.pair(rounds)
        agent.clock_sample(p.device_ns, p.host_ns)
        return p

    def report(self) -> dict:
        """Pairs taken so far: count, worst/best bound, local fit slope (ppm) and residual."""
        if not self.pairs:
            return {"pairs": 0}
        a, b, mx = fit_pairs(self.pairs)
        return {"pairs": len(self.pairs), "bound_ns_min": min(p.bound_ns for p in self.pairs),
                "bound_ns_max": max(p.bound_ns for p in self.pairs),
                "slope_ppm": round((b - 1.0) * 1e6, 3), "residual_max_ns": round(mx, 1)}


def sample_clock(rank: int, rounds: int = DEFAULT_ROUNDS) -> ClockSample:
    """One-shot convenience (compiles the kernel each call: prefer a `GpuClock`)."""
    return GpuClock(rounds).sample(rank)
