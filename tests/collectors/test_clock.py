"""Clock recovery on synthetic clocks: offsets 37-236 us, drift 1-4 ppm, 32 ns ticks,
sampling noise; the aligned time must be within 2 us of the truth."""
import numpy as np
import pytest

from dtrace_mk.collectors.clock import (ClockModel, build_clock_model, causal_check,
                                        fit_device_clock, fit_host_offsets)
from dtrace_mk.collectors.records import ClockSample, PingPong


def _device(t, off, drift):
    return (np.floor((t + off) * (1 + drift) / 32) * 32).astype(np.int64)


def _samples(rank, off, drift, host_off, rng, t_end=10e9, every=50e6, drift_change=None):
    ts = np.arange(0, t_end, every)
    dev = []
    for t in ts:
        d = drift if drift_change is None or t < drift_change[0] else drift_change[1]
        # integrate the drift piecewise so the device clock stays continuous
        if drift_change is not None and t >= drift_change[0]:
            base = (drift_change[0] + off) * (1 + drift)
            dev.append(int((base + (t - drift_change[0]) * (1 + d)) // 32 * 32))
        else:
            dev.append(int((t + off) * (1 + d) // 32 * 32))
    host = ts + host_off + np.abs(rng.normal(0, 200.0, len(ts)))   # read-out jitter
    return [ClockSample(rank, int(d), int(h)) for d, h in zip(dev, host)], ts, np.array(dev)


@pytest.mark.parametrize("seed", range(5))
def test_device_fit_recovers_within_2us(seed):
    rng = np.random.default_rng(seed)
    off = rng.uniform(37e3, 236e3) + 3e9
    drift = rng.uniform(1e-6, 4e-6) * rng.choice([-1, 1])
    samples, ts, dev = _samples(0, off, drift, 0.0, rng)
    fit = fit_device_clock(samples)[0]
    t_test = rng.uniform(0, 10e9, 200)
    d_test = _device(t_test, off, drift)
    err = np.abs(fit.to_host(d_test) - t_test)
    assert err.max() < 2000, err.max()
    assert fit.max_ns < 2000
    assert abs((fit.segments[0].slope - 1) - (-drift)) < 0.5e-6   # host per device tick, per 1 s window


def test_piecewise_fit_follows_a_drift_change():
    rng = np.random.default_rng(7)
    samples, ts, dev = _samples(0, 100e3, 3e-6, 0.0, rng, drift_change=(5e9, -2e-6))
    single = fit_device_clock(samples, window_ns=1 << 62)[0]
    piece = fit_device_clock(samples, window_ns=1_000_000_000)[0]
    assert len(piece.segments) == 10 and len(single.segments) == 1
    e_single = np.abs(single.to_host(dev) - ts).max()
    e_piece = np.abs(piece.to_host(dev) - ts).max()
    assert e_single > 2000 and e_piece < 2000, (e_single, e_piece)


def test_ping_pong_uses_min_rtt():
    # true offset 250 us; asymmetric delays elsewhere, the min-RTT sample is symmetric
    pps = [PingPong(1, 0, 250_000 + 9_000, 10_000),        # rtt 10 us, asymmetric
           PingPong(1, 100, 250_000 + 100 + 1_000, 2_100),  # rtt 2 us, symmetric
           PingPong(1, 500, 250_000 + 500 + 4_500, 5_500)]  # rtt 5 us
    off = fit_host_offsets(pps)[1]
    assert off.offset_ns == 250_000 and off.half_rtt_ns == 1_000 and off.samples == 3


def test_full_model_two_hosts_within_bound():
    rng = np.random.default_rng(3)
    host_off = 180_000.0
    samples, ts, dev = _samples(1, 50e3, -2.5e-6, host_off, rng)
    pps = [PingPong(1, int(t0), int(t0 + 1_000 + host_off + a), int(t0 + 2_000 + a + b))
           for t0, a, b in zip(rng.uniform(0, 1e6, 20), np.abs(rng.normal(0, 800, 20)),
                               np.abs(rng.normal(0, 800, 20)))]
    m = build_clock_model(samples, pps)
    err = np.abs(m.to_global(1, dev) + m.origin_ns - ts).max()
    assert err <= m.error_bound_ns(1) and err < 2000, (err, m.error_bound_ns(1))
    rep = m.report()
    assert rep["ranks"]["1"]["half_min_rtt_ns"] > 0 and rep["unaligned_ranks"] == []


def test_epoch_scale_device_clock_keeps_ns_precision():
    # %globaltimer counts ns since the epoch: ~1.7e18, beyond float64's exact integers
    rng = np.random.default_rng(11)
    boot = 1_700_000_000_000_000_000
    samples, ts, dev = _samples(0, boot, 2e-6, float(boot), rng)
    m = build_clock_model(samples)
    got = m.to_global(0, dev)                     # relative to origin_ns
    want = (ts + boot) - m.origin_ns              # true host time, relative
    assert np.abs(got - want).max() < 2000


def test_unknown_rank_passes_through():
    m = ClockModel()
    assert m.to_global(5, 1234) == 1234.0 and m.error_bound_ns(5) == 0.0


def test_causal_check_counts_and_clamps():
    sigs, rep = causal_check([(100.0, 5_000.0), (4_500.0, 5_000.0), (9_000.0, 5_000.0)], 1_000)
    assert sigs == [100.0, 4_000.0, 4_000.0]
    assert (rep.checked, rep.violations, rep.max_violation_ns) == (3, 2, 5_000.0)
