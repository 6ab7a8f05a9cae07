"""gpu_clock without a GPU: min-latency pairing, error bound, the records the agent ships,
the fit the collector makes of them, and the kernel source compiling under NVRTC."""
import pytest

from dtrace_mk.collectors.clock import build_clock_model
from dtrace_mk.collectors.records import ClockSample
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import gpu_clock as G


def test_best_pair_keeps_min_round_trip_and_bounds_it():
    # device stamp 1000 taken at true host time 5000; round trips of 30, 8 (best), 9 ns
    readings = [(4990, 1000, 5020), (4996, 1000, 5004), (4995, 1000, 5004)]
    p = G.best_pair(readings)
    assert (p.device_ns, p.host_ns, p.bound_ns, p.rounds) == (1000, 5000, 4, 3)
    assert abs(p.host_ns - 5000) <= p.bound_ns


def test_best_pair_odd_round_trip_bound_rounds_up():
    p = G.best_pair([(0, 7, 5)])
    assert p.host_ns == 2 and p.bound_ns == 3      # true time anywhere in [0, 5]


def test_best_pair_rejects_empty_and_backwards():
    with pytest.raises(UserError, match="no round trips"):
        G.best_pair([])
    with pytest.raises(UserError, match="backwards"):
        G.best_pair([(10, 1, 5)])


def test_record_is_agent_clock_sample():
    rec = G.best_pair([(100, 2_000_000_000_000_000_000, 120)]).record(3)
    assert rec == ClockSample(3, 2_000_000_000_000_000_000, 110)


def _simulated_readings(t_host, offset_ns, drift_ppm, lat_up, lat_down):
    """A device clock = offset + (1 + drift) * host, stamped lat_up after h0."""
    stamp = t_host + lat_up
    dev = int(offset_ns + stamp * (1.0 + drift_ppm * 1e-6))
    return (t_host, dev, t_host + lat_up + lat_down)


def test_pairs_fit_offset_and_slope_like_the_collector():
    offset, drift = 1_700_000_000_000_000_000, 3.0
    pairs = []
    for k in range(20):
        t = 1_000_000 + k * 50_000_000          # every 50 ms
        # jittery round trips; the best one is symmetric 2 us + 2 us
        rounds = [_simulated_readings(t + 10_000 * j, offset, drift, 2_000 + 300 * ((j + k) % 5),
                                      2_000 + 500 * (j % 3)) for j in range(8)]
        pairs.append(G.best_pair(rounds))
    a, b, mx = G.fit_pairs(pairs)
    assert (b - 1.0) * 1e6 == pytest.approx(-drift, abs=0.05)     # host per device tick
    bound = max(p.bound_ns for p in pairs)
    assert bound <= 2_250 and mx <= bound          # asymmetric picks stay inside the bound
    model = build_clock_model([p.record(0) for p in pairs])
    rep = model.report()["ranks"]["0"]
    assert rep["slope_ppm"][0] == pytest.approx(-drift, abs=0.05)
    # a device stamp maps back to its host time within the pairing bound + residual
    t_true = 123_456_789
    dev = int(offset + t_true * (1.0 + drift * 1e-6))
    got = model.to_global(0, dev) + model.origin_ns
    assert abs(got - t_true) <= bound + mx


def test_kernel_source_compiles_with_nvrtc():
    from dtrace_mk.kernels.build import nvrtc_compile
    try:
        ptx = nvrtc_compile(G.KERNEL_SOURCE, "gpu_clock.cu", target="ptx")
    except (ImportError, OSError) as e:          # pragma: no cover - NVRTC missing
        pytest.skip(f"NVRTC not available: {e}")
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert G.KERNEL_NAME in text and "globaltimer" in text
