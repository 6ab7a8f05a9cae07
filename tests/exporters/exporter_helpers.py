"""Inputs for exporter tests: a 2-rank synthetic run with a remote stall (through the real
diagnosis), and a tiny hand-made batch whose spans are pinned by a golden file."""
from dtrace_mk.collectors.diagnose import diagnose
from dtrace_mk.collectors.records import (ClassStat, Coverage, EpochSummary, RemoteWait, Signal)
from dtrace_mk.collectors.scenario import parse_scenario
from dtrace_mk.collectors.synth import SynthConfig, synthesize
from dtrace_mk.exporters.batch import RankInfo, RawEvidence, RecordSet, build_batch

LATE = dict(kind="late_comm", rank=1, steps=[2], comm_op="allreduce_attn", delay_us=200)
RANK_INFO = {0: RankInfo("node-a", 0), 1: RankInfo("node-a", 1)}


def two_rank_run(steps=4, faults=(LATE,), **cfg):
    """(result, SynthTrace) of a 2-rank run with skewed, drifting clocks."""
    sc = parse_scenario(dict(name="exp2", ranks=2, model="tiny", steps=steps, batch=4, seed=1,
                             faults=list(faults)))
    tr = synthesize(SynthConfig.from_scenario(sc, **cfg))
    res = diagnose(tr.summaries, tr.waits, tr.signals, tr.clock_samples, sc, pingpongs=tr.pingpongs)
    return res, tr


def two_rank_batch(**kw):
    res, tr = two_rank_run(**kw)
    return build_batch(res, tr, job_id="job-2r", rank_info=RANK_INFO)


def tiny_records():
    """2 ranks x 2 steps, identity clocks (no ClockSamples): every time is exact."""
    cov = Coverage(100, 90, 6, 4)
    cls = (ClassStat(3, 4, 40_000, 12_000, 2_000, 1_000, 500),)
    sums = [EpochSummary(r, k, 1_000_000 + k * 200_000, 1_150_000 + k * 200_000 + r * 1_000, cls,
                         queue_depth_max=5 + r + k, queue_depth_worker=r, remote_wait_count=2,
                         remote_wait_sum_ns=30_000, remote_wait_max_ns=20_000, coverage=cov)
            for r in (0, 1) for k in (0, 1)]
    sigs, waits = [], []
    for k in (0, 1):
        base = 1_050_000 + k * 200_000
        for snd, rcv in ((0, 1), (1, 0)):
            late = 40_000 if (snd == 1 and k == 1) else 0
            sigs.append(Signal(snd, rcv, 0, k, k, 0, base + late))
            # two tiles of the wait on the receiver
            for tile in range(2):
                waits.append(RemoteWait(rcv, snd, 0, k, k, 0, 11, base + tile * 100,
                                        base + late + 2_500 + tile * 50))
    # a wait whose signal never came (unjoined)
    waits.append(RemoteWait(0, 1, 1, 9, 1, 1, 11, 1_300_000, 1_310_000))
    return RecordSet(sums, waits, sigs)


TINY_RESULT = {
    "scenario": "tiny", "verdict": "fault", "telemetry_bytes": 1,
    "coverage": {"eligible": 400, "executed": 360, "throttled": 24, "lost": 16},
    "findings": [{"cause": "remote_stall", "rank": 1, "observed_on": [0], "comm_op": "allreduce_attn",
                  "layer": 0, "steps": [1], "confidence": 0.9, "impact_us": 40.0,
                  "coverage": {"eligible": 200, "executed": 180, "throttled": 12, "lost": 8}},
                 {"cause": "slow_task_class", "rank": 0, "observed_on": [0], "task_class": "qkv",
                  "steps": [0], "confidence": 0.3, "impact_us": 5.5, "worker": 2,
                  "coverage": {"eligible": 100, "executed": 90, "throttled": 6, "lost": 4}}],
}


def tiny_batch():
    ev = [RawEvidence(1, 1, "late signal allreduce_attn", 1_250_000, 1_290_000,
                      {"comm_gen": 1, "delay_ns": 40_000})]
    return build_batch(TINY_RESULT, tiny_records(), job_id="job-tiny", rank_info=RANK_INFO,
                       evidence=ev)
