"""Clock alignment: device clocks -> host clocks -> one reference clock.

Three pure steps, each a function over measured tuples:

1. `fit_device_clock(samples)`: per rank, fit `host = a + b * device` by least squares
   over `ClockSample`s, piecewise over re-calibration windows (`window_ns` of device
   time; one line per window).  `%globaltimer` ticks in 32 ns steps and drifts a few ppm,
   so both the offset `a` and the slope `b` are fitted.
2. `fit_host_offsets(pingpongs)`: Score-P-style ping-pong between the collector's host
   and each rank's host: of all round trips, take the one with the smallest round trip
   time; `offset = t_remote - (t0 + t1) / 2`; its error is at most half that round trip.
3. `ClockModel.to_global(rank, device_ns)` = device -> rank's host clock -> the
   collector's host clock (`host - offset`).

Then `causal_check(pairs, min_latency_ns)`: a release (wait end on the receiver) is
observed no earlier than its signal (on the sender) plus the minimum latency.  Violations
are counted and the signal time clamped to `release - min_latency`.

The error bound of one rank's mapping is `residual_max + half_min_rtt` (fit residual
rms is reported as well); between two ranks it is the sum of their bounds.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from ..errors import UserError
from .records import ClockSample, PingPong

#: Default re-calibration window: one line per second of device time.
DEFAULT_WINDOW_NS = 1_000_000_000
#: A window with fewer samples than this is merged into its neighbour.
MIN_SAMPLES_PER_WINDOW = 3


@dataclass(frozen=True)
class Segment:
    """host = host0 + intercept + slope * (device - device0), valid from device `start` on.

    `device0`/`host0` are integer ns (a sample of the window) so that the float part stays
    small: `%globaltimer` counts ns since the epoch (~1.7e18), beyond float64's exact
    integers; all float arithmetic here is on differences."""
    start: int
    device0: int
    host0: int
    intercept: float
    slope: float
    n: int
    rms_ns: float
    max_ns: float

    def map(self, device_ns, origin_ns: int = 0):
        """host - origin_ns, as float ns."""
        d = np.asarray(device_ns)
        x = (d.astype(np.int64) - self.device0).astype(np.float64) if d.dtype.kind in "iu" else \
            d.astype(np.float64) - float(self.device0)
        return float(self.host0 - origin_ns) + self.intercept + self.slope * x


@dataclass(frozen=True)
class DeviceFit:
    rank: int
    segments: Tuple[Segment, ...]

    @property
    def rms_ns(self) -> float:
        n = sum(s.n for s in self.segments)
        return float(np.sqrt(sum(s.rms_ns ** 2 * s.n for s in self.segments) / max(n, 1)))

    @property
    def max_ns(self) -> float:
        return max((s.max_ns for s in self.segments), default=0.0)

    def to_host(self, device_ns, origin_ns: int = 0):
        """Device ns -> host ns - origin_ns (float); scalars or arrays."""
        starts = [s.start for s in self.segments]
        d = np.asarray(device_ns)
        if d.ndim == 0:
            i = max(bisect.bisect_right(starts, int(d)) - 1, 0)
            return float(self.segments[i].map(d, origin_ns))
        idx = np.clip(np.searchsorted(np.asarray(starts, dtype=np.int64), d, side="right") - 1,
                      0, len(self.segments) - 1)
        out = np.empty(d.shape, dtype=np.float64)
        for i, seg in enumerate(self.segments):
            m = idx == i
            if m.any():
                out[m] = seg.map(d[m], origin_ns)
        return out


def _fit_line(dev: np.ndarray, host: np.ndarray) -> Tuple[int, int, float, float, float, float]:
    d0, h0 = int(dev[0]), int(host[0])
    x = (dev - d0).astype(np.float64)
    y = (host - h0).astype(np.float64)
    xm, ym = x.mean(), y.mean()
    xc, yc = x - xm, y - ym
    sxx = float((xc * xc).sum())
    slope = 1.0 if len(dev) == 1 or sxx == 0.0 else float((xc * yc).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    return d0, h0, intercept, slope, float(np.sqrt((resid ** 2).mean())), float(np.abs(resid).max())


def fit_device_clock(samples: Iterable[ClockSample], window_ns: int = DEFAULT_WINDOW_NS
                     ) -> Dict[int, DeviceFit]:
    """Fit each rank's device clock against its host clock, piecewise per window."""
    by_rank: Dict[int, List[Tuple[int, int]]] = {}
    for s in samples:
        by_rank.setdefault(s.rank, []).append((s.device_ns, s.host_ns))
    fits = {}
    for rank, pts in by_rank.items():
        pts.sort()
        dev = np.array([p[0] for p in pts], dtype=np.int64)
        host = np.array([p[1] for p in pts], dtype=np.int64)
        # window boundaries in device time
        w = (dev - dev[0]) // int(window_ns)
        groups: List[np.ndarray] = []
        for k in np.unique(w):
            idx = np.nonzero(w == k)[0]
            if groups and (len(idx) < MIN_SAMPLES_PER_WINDOW or len(groups[-1]) < MIN_SAMPLES_PER_WINDOW):
                groups[-1] = np.concatenate([groups[-1], idx])
            else:
                groups.append(idx)
        segs = []
        for gi, idx in enumerate(groups):
            d0, h0, icpt, slope, rms, mx = _fit_line(dev[idx], host[idx])
            start = int(dev[idx[0]]) if gi else -(1 << 63)
            segs.append(Segment(start, d0, h0, icpt, slope, len(idx), rms, mx))
        fits[rank] = DeviceFit(rank, tuple(segs))
    return fits


@dataclass(frozen=True)
class HostOffset:
    rank: int
    offset_ns: float        # remote host clock - collector host clock
    half_rtt_ns: float      # error bound of the offset
    samples: int


def fit_host_offsets(pingpongs: Iterable[PingPong]) -> Dict[int, HostOffset]:
    """Score-P-style: per rank, the minimum-RTT round trip gives the offset."""
    best: Dict[int, Tuple[int, PingPong]] = {}
    count: Dict[int, int] = {}
    for p in pingpongs:
        rtt = p.t1_ns - p.t0_ns
        if rtt < 0:
            raise UserError(f"ping-pong for rank {p.rank}: t1 {p.t1_ns} before t0 {p.t0_ns}")
        count[p.rank] = count.get(p.rank, 0) + 1
        if p.rank not in best or rtt < best[p.rank][0]:
            best[p.rank] = (rtt, p)
    return {r: HostOffset(r, p.t_remote_ns - (p.t0_ns + p.t1_ns) / 2.0, rtt / 2.0, count[r])
            for r, (rtt, p) in best.items()}


@dataclass
class ClockModel:
    """Maps (rank, device ns) to the aligned clock: the collector host's clock minus
    `origin_ns`, as float ns (small numbers, so float64 keeps ns precision)."""
    device: Dict[int, DeviceFit] = field(default_factory=dict)
    host: Dict[int, HostOffset] = field(default_factory=dict)
    origin_ns: Optional[int] = None

    def __post_init__(self):
        if self.origin_ns is None:
            firsts = [f.segments[0].host0 for _, f in sorted(self.device.items()) if f.segments]
            self.origin_ns = firsts[0] if firsts else 0

    def to_global(self, rank: int, device_ns):
        """Aligned ns (float; arrays in, arrays out).  An unaligned rank's device clock is
        taken as its host clock."""
        fit = self.device.get(rank)
        if fit is not None:
            t = fit.to_host(device_ns, self.origin_ns)
        else:
            d = np.asarray(device_ns)
            t = (d.astype(np.int64) - self.origin_ns).astype(np.float64)
            t = float(t) if t.ndim == 0 else t
        off = self.host.get(rank)
        return t - off.offset_ns if off is not None else t

    def aligned(self, rank: int) -> bool:
        return rank in self.device

    def error_bound_ns(self, rank: int) -> float:
        fit = self.device.get(rank)
        off = self.host.get(rank)
        return (fit.max_ns if fit else 0.0) + (off.half_rtt_ns if off else 0.0)

    def report(self) -> Dict[str, object]:
        ranks = sorted(set(self.device) | set(self.host))
        per = {}
        for r in ranks:
            fit = self.device.get(r)
            off = self.host.get(r)
            per[str(r)] = {
                "segments": len(fit.segments) if fit else 0,
                "slope_ppm": [round((s.slope - 1.0) * 1e6, 3) for s in fit.segments] if fit else [],
                "residual_rms_ns": round(fit.rms_ns, 1) if fit else None,
                "residual_max_ns": round(fit.max_ns, 1) if fit else None,
                "host_offset_ns": round(off.offset_ns, 1) if off else 0.0,
                "half_min_rtt_ns": round(off.half_rtt_ns, 1) if off else 0.0,
                "error_bound_ns": round(self.error_bound_ns(r), 1),
            }
        def worst_pair(vals):
            vals = sorted(vals, reverse=True)
            return (vals[0] + vals[1]) if len(vals) > 1 else (vals[0] if vals else 0.0)
        pair = worst_pair([self.error_bound_ns(r) for r in ranks])
        same_host = worst_pair([f.max_ns for f in self.device.values()])
        return {"ranks": per,
                # two ranks on different hosts: both fits + both ping-pong bounds
                "pair_error_bound_ns": round(pair, 1),
                # two GPUs of one host: the host clock is shared, only the fits count
                "same_host_pair_error_bound_ns": round(same_host, 1),
                "unaligned_ranks": [r for r in ranks if r not in self.device]}


def build_clock_model(samples: Iterable[ClockSample], pingpongs: Iterable[PingPong] = (),
                      window_ns: int = DEFAULT_WINDOW_NS) -> ClockModel:
    return ClockModel(fit_device_clock(samples, window_ns), fit_host_offsets(pingpongs))


@dataclass
class CausalReport:
    checked: int = 0
    violations: int = 0
    max_violation_ns: float = 0.0

    def as_dict(self) -> Dict[str, object]:
        return {"checked": self.checked, "violations": self.violations,
                "max_violation_ns": round(self.max_violation_ns, 1)}


def causal_clamp(signal_ns: float, release_ns: float, min_latency_ns: float,
                 report: Optional[CausalReport] = None) -> float:
    """Return the signal time clamped so that release >= signal + min_latency."""
    latest = release_ns - min_latency_ns
    if report is not None:
        report.checked += 1
    if signal_ns > latest:
        if report is not None:
            report.violations += 1
            report.max_violation_ns = max(report.max_violation_ns, signal_ns - latest)
        return latest
    return signal_ns


def causal_check(pairs: Iterable[Tuple[float, float]], min_latency_ns: float
                 ) -> Tuple[List[float], CausalReport]:
    """pairs: (signal_aligned_ns, release_aligned_ns).  Returns clamped signal times."""
    rep = CausalReport()
    return [causal_clamp(s, r, min_latency_ns, rep) for s, r in pairs], rep
