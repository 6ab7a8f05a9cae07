"""Shared helpers for collector tests: run a scenario through the synthetic model and
the diagnosis."""
from dataclasses import replace
from pathlib import Path

from dtrace_mk.collectors.diagnose import diagnose
from dtrace_mk.collectors.scenario import Scenario, parse_scenario
from dtrace_mk.collectors.synth import SynthConfig, synthesize

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"

BASE = dict(model="tiny", steps=8, batch=4, seed=1)


def scenario(name="t", ranks=2, faults=(), **kw) -> Scenario:
    d = dict(BASE, name=name, ranks=ranks, faults=list(faults))
    d.update(kw)
    return parse_scenario(d)


def run(sc: Scenario, ranks=None, **cfg):
    if ranks is not None:
        sc = replace(sc, ranks=ranks)
    tr = synthesize(SynthConfig.from_scenario(sc, **cfg))
    res = diagnose(tr.summaries, tr.waits, tr.signals, tr.clock_samples, sc,
                   pingpongs=tr.pingpongs)
    return res, tr


def brief(res):
    return [(f["cause"], f["rank"], f.get("task_class") or f.get("comm_op"), f["steps"],
             f["confidence"]) for f in res["findings"]]


def inputs_for(sc: Scenario, **cfg):
    """The detectors' Inputs for a scenario run through the synthetic model."""
    from dtrace_mk.collectors.classify import Inputs, align_signals, align_waits
    from dtrace_mk.collectors.clock import build_clock_model
    from dtrace_mk.collectors.join import join
    from dtrace_mk.collectors.records import Names
    tr = synthesize(SynthConfig.from_scenario(sc, **cfg))
    clock = build_clock_model(tr.clock_samples, tr.pingpongs)
    joined = join(tr.waits, tr.signals)
    waits, _ = align_waits(joined, clock, 1000)
    return Inputs({(s.rank, s.epoch): s for s in tr.summaries}, waits, Names.standard(),
                  signal_times=align_signals(joined, clock))
