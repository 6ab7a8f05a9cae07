"""Real collector input from two GPU demo runs (2 x H200, 2026-11-30 ~15:55 UTC, commit
384044b: `dtrace-mk demo --steps 150`, late_comm on rank 1 at allreduce_attn layer 0, +200
us, steps 75-149; DTRACE_MK_COLLECTOR_DUMP, re-packed in the wire format per rank).  Before
the two collector fixes of that session, run b lost fault steps 84-86, 114-116, 138-140
(the cost bounced between the ranks' concurrent waits; a marginal "slow all-reduce"
on the root swallowed the rest) and both runs added slow_task_class allreduce findings (0.60-0.78).
The diagnosis must be: remote_stall rooted at rank 1, allreduce_attn, every fault step,
observed on rank 0, confident; nothing else confident."""
import gzip
from pathlib import Path

import pytest

from dtrace_mk.collectors.diagnose import Accumulator
from dtrace_mk.collectors.score import CONFIDENT

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("run", ["b", "c"])
def test_gpu_demo_input_diagnoses_the_injected_remote_stall(run):
    blob = gzip.decompress((DATA / f"gpu_demo_late_comm_{run}.msgpack.gz").read_bytes())
    n0 = int.from_bytes(blob[:8], "little")
    acc = Accumulator()
    acc.on_bytes(0, blob[8:8 + n0])
    acc.on_bytes(1, blob[8 + n0:])
    assert not acc.bad_messages and len(acc.summaries) == 300 and len(acc.waits) == 1200
    res = acc.result(ranks=2)
    confident = [f for f in res["findings"] if f["confidence"] >= CONFIDENT]
    assert len(confident) == 1, res["findings"]
    (f,) = confident
    assert (f["cause"], f["rank"], f["comm_op"], f["layer"]) == ("remote_stall", 1, "allreduce_attn", 0)
    assert f["steps"] == list(range(75, 150)) and f["observed_on"] == [0]
    # what stays below confidence: all-reduce tasks ~25 us slower in a few steps (real,
    # small, irregular on the GPU), none folding a remote stall step into itself
    assert all(g["impact_us"] < 0.2 * f["impact_us"] for g in res["findings"] if g is not f)


def _serve_records(tmp_path, name):
    """A serving job's RESULT.records.msgpack kept as DATA/NAME.records.msgpack.gz."""
    from dtrace_mk.exporters import load_records
    p = tmp_path / "r.records.msgpack"
    p.write_bytes(gzip.decompress((DATA / f"{name}.records.msgpack.gz").read_bytes()))
    return load_records(str(p))


def _diagnose_one_rank(rs, **kw):
    from dtrace_mk.collectors.diagnose import diagnose
    return diagnose(rs.summaries, rs.waits, rs.signals, rs.clock_samples, pingpongs=rs.pingpongs, ranks=1, **kw)


def test_fault_free_1b_serving_on_the_gpu_has_no_finding(tmp_path):
    """Real records of a fault-free serving run (1 rank, 1b, batch 4, 400 steps, device
    summaries; NVIDIA H100, 2026-12-05 15:53 UTC, commit 71cb1bb; the collector's
    RESULT.records.msgpack).  Its qkv notification lag wanders by ~10-25 ns per task in a
    few steps: that said `verdict fault` (late_notification, confidence 0.79) until the
    margin took the class's task time into account (Thresholds.notify_work_rel)."""
    rs = _serve_records(tmp_path, "gpu_serve_1b_clean")
    assert len(rs.summaries) == 400
    res = _diagnose_one_rank(rs)
    assert res["verdict"] == "none" and res["findings"] == [], res["findings"]
    assert res["coverage"]["eligible"] == res["coverage"]["executed"] > 0


def test_fault_free_1b_serving_with_pinned_observers_has_no_finding(tmp_path):
    """Real records of fault-free serving with the observers pinned (1 rank, 1b, batch 4, 200
    steps, `serve --observer sm --observer-place calibrate`; NVIDIA H100 80GB HBM3,
    2026-12-06 08:10 UTC, commit df71485, bench/serve.py --configs smpin --dump, round 1).
    lm_head's 500 tasks wait 55-75 us (summed) to be dispatched, and 40-85 us more in a few
    steps -- under 0.5% of their task time: that said local_imbalance lm_head (confidence
    0.56-0.71, verdict fault) in 5 of 5 pinned runs, until its margin, like late_notification's,
    took the class's task time into account (Thresholds.dispatch_work_rel)."""
    from dtrace_mk.collectors import classify
    rs = _serve_records(tmp_path, "gpu_serve_1b_pinned")
    assert len(rs.summaries) == 200
    res = _diagnose_one_rank(rs)
    assert res["verdict"] == "none" and res["findings"] == [], res["findings"]
    # the excess is real (what the old margin flagged), only too small to move a step
    loose = _diagnose_one_rank(rs, thresholds=classify.Thresholds(dispatch_work_rel=0.0))
    assert {(f["cause"], f["task_class"]) for f in loose["findings"]} == {("local_imbalance", "lm_head")}


def _tiny_rotations(tmp_path):
    return _serve_records(tmp_path, "gpu_serve_tiny_rotations")


# Real records of fault-free tiny serving (1 rank, batch 4, 400 steps, device summaries in
# windows of 16 steps, the workers' build before the drain's poller; NVIDIA H100 80GB HBM3,
# commit 2c048f9, session 46: bench/serve.py --dump).  Every such job said `verdict fault`
# (docs/results/hooks.md "Session 46"): a wait's VM drain hid a met dependency.  The host's
# window work parks the kernel 7-10 ms before steps 21, 37, ... (5 mod 16); two steps later
# one class's summed notification lag jumps ~20 us.


def test_fault_free_tiny_serving_findings_sit_two_steps_after_each_window_park(tmp_path):
    """What the diagnosis says of these records now: late_notification only, below the
    display's confidence, at steps two after a long park (or one lone step)."""
    rs = _tiny_rotations(tmp_path)
    s = sorted(rs.summaries, key=lambda x: x.epoch)
    assert len(s) == 400
    parks = {b.epoch for a, b in zip(s, s[1:]) if b.begin_ns - a.end_ns > 5_000_000}
    assert parks and all(e % 16 == 5 for e in parks), sorted(parks)
    res = _diagnose_one_rank(rs)
    assert res["findings"] and all(f["cause"] == "late_notification" and f["confidence"] < CONFIDENT
                                   for f in res["findings"]), res["findings"]
    after_park = [st for f in res["findings"] for st in f["steps"] if st - 2 in parks]
    assert len(after_park) >= 0.8 * sum(len(f["steps"]) for f in res["findings"])


def test_fault_free_tiny_serving_with_the_drain_poller_has_no_finding(tmp_path):
    """The same job with the drain's poller (the default since session 48; these records:
    NVIDIA H100 80GB HBM3, 2026-12-05 21:21 UTC, cfb26d2 built with -DDTMK_DRAIN_POLL, its
    form now the default; bench/serve.py --dump, tiny, batch 4, 400 steps, windows of 16):
    the same 24 window parks, but no lag spike two steps after them, and verdict none (the
    records above, without the poller: late_notification)."""
    from dtrace_mk.collectors.replay import shape
    rs = _serve_records(tmp_path, "gpu_serve_tiny_drain_poll")
    lines = shape(rs.summaries).splitlines()
    assert lines[0].startswith("400 epochs, step 182 us median") and lines[0].endswith("24 parks (> 5 ms)")
    assert lines[1] == "  notification-lag spikes: 1"          # (none after a park)
    assert lines[2] == "  spiking (class epoch): qkv 16"        # the first window's end
    res = _diagnose_one_rank(rs)
    assert res["verdict"] == "none" and res["findings"] == [], res["findings"]
    assert res["coverage"]["eligible"] == res["coverage"]["executed"] == 142300


def test_replay_shape_puts_the_lag_spikes_two_steps_after_the_parks(tmp_path, capsys):
    """collectors.replay --shape: a dump's step lengths and period, parks, notification-lag
    spikes (class and epoch, the first few) and where they sit after a park (session 47's A/B
    read them side by side): these records' 22 of 23 spikes two steps after one of the 24
    window parks; a rank it lacks is an error."""
    from dtrace_mk.collectors.replay import shape
    rs = _tiny_rotations(tmp_path)
    lines = shape(rs.summaries).splitlines()
    # period: one epoch's end to the next one's, parks left out (the step, 40 us more than
    # the epochs' own begin-to-end here)
    assert lines[0] == "400 epochs, step 180 us median (p90 193), period 221.8 us, 24 parks (> 5 ms)"
    assert lines[1] == "  notification-lag spikes: 23 -- after a park: +1 x1, +2 x22"
    assert lines[2] == ("  spiking (class epoch): qkv 23, qkv 39, qkv 55, qkv 71, qkv 87, qkv 103, "
                        "rope_kv_append 119, rope_kv_append 135, ... 15 more")
    assert lines[3] == "  dispatch-wait outlier epochs: none"
    with pytest.raises(ValueError, match="rank 3 has no epoch"):
        shape(rs.summaries, rank=3)
    import pickle
    from dtrace_mk.collectors.replay import main
    dump = tmp_path / "d.pkl"
    dump.write_bytes(pickle.dumps({"summaries": rs.summaries}))
    assert main(["--shape", str(dump), str(dump)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{dump}: " + lines[0] and out[4].startswith(f"{dump}: ") and len(out) == 8
    assert main(["--shape", str(dump), "--rank", "2"]) == 2
    assert "rank 2 has no epoch" in capsys.readouterr().err
    assert main(["--shape"]) == 2 and "name one or more dumps" in capsys.readouterr().err


def test_replay_steps_prints_each_epoch_s_gap_length_and_class_lags(tmp_path):
    """collectors.replay --steps: one line per epoch -- the park before step 21 (8.3 ms), the
    back-to-back steps 23-24 after it, and qkv's notification lag at 23 -- and a range the
    rank does not hold is an error naming what it holds."""
    from dtrace_mk.collectors.replay import _range, step_table
    rs = _tiny_rotations(tmp_path)
    lines = step_table(rs.summaries, 20, 24).splitlines()
    head = lines[0].split()
    assert head[:3] == ["step", "gap_us", "len_us"] and head[3:5] == ["rmsnorm", "qkv"]
    rows = {int(x.split()[0]): x.split() for x in lines[2:]}
    assert sorted(rows) == [20, 21, 22, 23, 24]
    assert float(rows[21][1]) > 5000 and float(rows[24][1]) < 10          # the park; back to back
    qkv = {e: float(r[4].split("/")[0]) for e, r in rows.items()}          # (lag/wait cells after len)
    assert qkv[23] > 20 and all(v < 6 for e, v in qkv.items() if e != 23), qkv
    with pytest.raises(ValueError, match=r"rank 0 has no epoch there \(2\.\.401 held\)"):
        step_table(rs.summaries, 900, 910)
    assert _range("20-24") == (20, 24) and _range("7") == (7, 7)
    with pytest.raises(ValueError, match="expected A-B or A"):
        _range("x-3")
