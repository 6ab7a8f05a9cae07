"""Spans reach an OTLP/HTTP backend while a launched job runs (sim backend, 2 ranks +
the collector under real mpiexec), and the final set equals the end-of-job export of the
saved result (same spans, parents, links, attributes).

The job serves until stopped; the test stops it only after the receiver got the spans of
steps 0-3 of both ranks, so "arrived before the job ended" holds by construction; every
wait is on a condition with a deadline."""
import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
from test_otlp import Receiver, _val  # noqa: E402

from test_launch_e2e import Proc, _mpiexec_or_fail  # noqa: E402

TIME_ATTRS = {"dtrace_mk.comm.late_us", "dtrace_mk.comm.transfer_us"}


def _attrs(sp):
    return {a.key: _val(a.value) for a in sp.attributes}


def test_spans_arrive_per_step_while_the_job_runs(runtime_dir, tmp_path):
    _mpiexec_or_fail()
    from dtrace_mk.exporters import load_records, load_result, records_path_for
    from dtrace_mk.exporters.batch import build_batch
    from dtrace_mk.exporters.spans import build_spans
    rcv = Receiver()
    out = tmp_path / "run.json"
    try:
        env = dict(os.environ)
        launch = Proc("launch", "-n", "2", "--otlp", rcv.base, "--out", str(out), "--quiet", "--",
                      "python", "-m", "dtrace_mk.launch.serve", "--model", "tiny", "--duration", "120",
                      "--quiet", "--fault",
                      "late_comm:rank=1,steps=4-400,comm_op=allreduce_attn,layer=0,delay_us=200", env=env)
        want = {(r, k) for r in (0, 1) for k in range(4)}
        deadline = time.monotonic() + 90
        while True:
            have = {(_attrs(sp)["dtrace_mk.rank"], _attrs(sp)["dtrace_mk.step"])
                    for _, sp in rcv.spans() if sp.name.startswith("step ")}
            if want <= have:
                break
            assert launch.p.poll() is None, "the job ended before any span arrived"
            assert time.monotonic() < deadline, f"no spans of steps 0-3 within 90 s: {sorted(have)[:8]}"
            time.sleep(0.05)
        assert launch.p.poll() is None and not out.exists()     # the job is still running
        early = {sp.span_id for _, sp in rcv.spans()}
        assert not any(sp.name.startswith("finding") for _, sp in rcv.spans())
        launch.p.send_signal(signal.SIGINT)
        rc, stdout, stderr = launch.finish()
        assert rc == 0, stderr[-2000:]
    finally:
        if launch.p.poll() is None:
            launch.p.kill()
        rcv.close()
    got = rcv.spans()
    ids = [sp.span_id for _, sp in got]
    assert len(ids) == len(set(ids)), "a span was sent twice"
    assert early < set(ids)
    res = load_result(out)
    assert res["export"]["live_spans"] > 0 and res["export"]["exporters"][0]["dropped"] == 0
    end = {sp.context.span_id.to_bytes(8, "big"): sp
           for sp in build_spans(build_batch(res, load_records(records_path_for(out))))}
    assert set(ids) == set(end)
    links = cross = 0
    rank_of = {sp.span_id: _attrs(sp)["dtrace_mk.rank"] for _, sp in got}
    for r, sp in got:
        e = end[sp.span_id]
        assert sp.name == e.name
        assert sp.parent_span_id == (e.parent.span_id.to_bytes(8, "big") if e.parent else b"")
        assert [l.span_id for l in sp.links] == [l.context.span_id.to_bytes(8, "big") for l in e.links]
        a = _attrs(sp)
        ea = {k: (list(v) if isinstance(v, tuple) else v) for k, v in e.attributes.items()}
        assert {k: v for k, v in a.items() if k not in TIME_ATTRS} == \
            {k: v for k, v in ea.items() if k not in TIME_ATTRS}, sp.name
        assert abs(sp.start_time_unix_nano - e.start_time) < 20_000, sp.name
        for ln in sp.links:
            links += 1
            cross += rank_of[ln.span_id] != a["dtrace_mk.rank"]
    assert links > 0 and cross == links            # every link resolves, to the other rank
    assert any(sp.name.startswith("finding: remote_stall") for _, sp in got)
