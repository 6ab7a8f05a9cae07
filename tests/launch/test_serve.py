"""The reference server: arrivals and continuous batching, fault options, and a run under
plain mpiexec where serving rank 0 also collects (no launcher)."""
import subprocess
import sys

import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.launch.serve import ArrivalProcess, fault_scenario, parse_fault, resolve_backend


def test_arrivals_are_seeded_and_slots_are_refilled_in_arrival_order():
    def drive(seed):
        a = ArrivalProcess(batch=2, rate=0.5, mean_len=3, seed=seed, max_seq=64)
        first = [a.req_len(s, 0, 64) for s in range(2)]          # the warm start
        for k in range(40):
            a.on_step(k)
            for s in range(2):       # pretend every slot finishes each step (length 1)
                a.req_len(s, k + 1, 64)
        return first, a
    f1, a1 = drive(7)
    f2, a2 = drive(7)
    assert f1 == f2 and a1.stats() == a2.stats()                 # same seed, same sequence
    st = a1.stats()
    assert st["finished"] + st["queued"] + sum(1 for r in a1.slot_req.values() if r) == st["arrived"]
    assert st["idle_slot_steps"] > 0                             # 0.5 arrivals/step < 2 slots
    assert all(x >= 1 for x in a1.latency_steps)
    assert drive(8)[1].stats() != st


def test_fault_option_syntax_and_validation():
    f = parse_fault("late_comm:rank=1,steps=8-11,comm_op=allreduce_attn,delay_us=200")
    assert f == {"kind": "late_comm", "rank": 1, "steps": [8, 9, 10, 11],
                 "comm_op": "allreduce_attn", "delay_us": 200}
    sc = fault_scenario([f], "tiny", 2, 64, 4, 1, "--fault")
    assert sc.faults[0].rank == 1
    with pytest.raises(UserError, match="rank must be an integer in 0..1"):
        fault_scenario([dict(f, rank=2)], "tiny", 2, 64, 4, 1, "--fault")
    with pytest.raises(UserError, match="unknown fault kind 'late_com'"):
        fault_scenario([dict(f, kind="late_com")], "tiny", 2, 64, 4, 1, "--fault")
    with pytest.raises(UserError, match="expected key=value"):
        parse_fault("late_comm:rank")
    assert resolve_backend("gpu") == "gpu" and resolve_backend("sim") == "sim"
    with pytest.raises(UserError, match="expected auto, sim or gpu"):
        resolve_backend("tpu")


def test_auto_backend_is_gpu_only_with_a_gpu_per_rank(monkeypatch):
    from dtrace_mk.launch import serve
    monkeypatch.delenv("DTRACE_MK_BACKEND", raising=False)
    monkeypatch.setattr(serve, "gpu_count", lambda: 0)
    assert serve.resolve_backend(None, ranks=2) == "sim"
    monkeypatch.setattr(serve, "gpu_count", lambda: 1)
    assert serve.resolve_backend("auto", ranks=2) == "sim"
    monkeypatch.setattr(serve, "gpu_count", lambda: 2)
    assert serve.resolve_backend("auto", ranks=2) == "gpu"
    monkeypatch.setenv("DTRACE_MK_BACKEND", "sim")
    assert serve.resolve_backend(None, ranks=2) == "sim"


@pytest.mark.mpi
def test_serve_under_plain_mpiexec_collects_on_rank_0(tmp_path):
    from dtrace_mk.commands.diagnose import find_mpiexec
    out = tmp_path / "r.json"
    p = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-m", "dtrace_mk.launch.serve",
                        "--model", "tiny", "--steps", "12", "--result", str(out),
                        "--fault", "late_comm:rank=1,steps=6-11,comm_op=allreduce_attn,delay_us=200"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "served 12 steps" in p.stderr and "requests arrived" in p.stderr
    res = __import__("json").loads(out.read_text())
    (f,) = res["findings"]
    assert (f["cause"], f["rank"], f["steps"]) == ("remote_stall", 1, list(range(6, 12)))
