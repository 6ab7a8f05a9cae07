"""Serving on one GPU with the summaries on: where the monitors run, as ratios measured in one run.

    python bench/serve.py [--presets tiny,1b] [--steps 400] [--batch 4] [--reps 2]
                          [--configs kernel,workers,sm] [--summaries device] [--dump] [--out DIR]

Each config is one job, run as a user runs it (a subprocess, one rank, its own CUDA context):

  kernel    `dtrace-mk run --backend gpu`: the build without hook code, one launch of the
            same steps (no host loop, no monitors; every SM a worker, serve leaves one for
            the clock pairs): the floor
  workers   `python -m dtrace_mk.launch.serve --backend gpu --observer workers`: every hook
            record built on each worker's thread 0, the summary monitors in the workers'
            device VM (--summaries device) or on the host (host)
  sm        the same with `--observer sm`: the workers only capture; 4 observer SMs of their
            own build the records and run the monitors (kernels/mk_obs_sm.cuh)
  smpin     sm with `--observer-place calibrate` (not in the default list): the observers
            pinned on the cheapest of 12 calibrated SM sets, in a grid of every SM with the
            clock pairs' SM idle (hooks.md session 52); its ratio is over sm
  NAME:wW   workers, sm or smpin with `--summary-window W` (device summaries read every W steps
            instead of 16: e.g. workers,workers:w64)
  NAME+D    workers, sm or smpin (with or without :wW) built with the measurement define D too
            (`--kernel-define D`, repeatable: workers+DTMK_NO_DRAIN_POLL, workers+DTMK_DRAIN_POLL_ACQ)

Figures per job: us/step of launch time (the resident launches' GPU time over the device
steps they ran, as serve prints it: what the kernel took, its waits for the host at the step
gate included; the ratios use it), wall us/step over the served steps (serve prints its
wall time to 0.1 s: coarse), the diagnosis -- verdict, each finding's cause, class and
confidence: a fault-free job should find nothing -- and coverage (lost must be 0).  Rounds
alternate the configs' order; each figure is the median over --reps rounds.  The ratios are
against `kernel` and `sm` against `workers`.  --dump keeps each serve job's collector input
(DIR/dumps/PRESET_CONFIG_ROUND.pkl: `python -m dtrace_mk.collectors.replay FILE` diagnoses it
again on any machine).

Writes DIR/serve.json and DIR/serve.log; prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REQUIRES = "gpu"   # what `dtrace-mk bench serve` checks before it runs: cpu, gpu, or gpu:N

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIGS = ("kernel", "workers", "sm")
#: each serve config's observer flags (smpin: named in --configs, not in the default list)
OBSERVER_ARGS = {"workers": ["--observer", "workers"], "sm": ["--observer", "sm"],
                 "smpin": ["--observer", "sm", "--observer-place", "calibrate"]}
#: the configs a --configs list may name
NAMES = ("kernel",) + tuple(OBSERVER_ARGS)
SERVED = re.compile(r"served (\d+) steps.* in ([\d.]+) s wall .*?, (\d+) us/step of launch time")
DECODE = re.compile(r"decode step: mean ([\d.]+) us")
FED = re.compile(r"(\d+) records fed to the host agent")


def config_parts(config: str):
    """'workers:w64' -> ('workers', 64, ()); 'sm+DTMK_X' -> ('sm', None, ('DTMK_X',)); a
    ValueError names a bad one."""
    head, *defines = config.split("+")
    name, _, opt = head.partition(":")
    if name not in NAMES or (opt and (name == "kernel" or not opt.startswith("w") or not opt[1:].isdigit())):
        raise ValueError(f"config {config!r}: expected one of {', '.join(NAMES)}, workers, sm or smpin with :wW "
                         f"(a summary window of W steps) and +DTMK_NAME (a measurement define)")
    from dtrace_mk.launch.serve import KERNEL_DEFINE
    bad = [d for d in defines if not KERNEL_DEFINE.fullmatch(d)]
    if bad or (defines and name == "kernel"):
        raise ValueError(f"config {config!r}: +{bad[0] if bad else defines[0]}: a define is DTMK_NAME or "
                         f"DTMK_NAME=N, on workers or sm (serve --kernel-define)")
    return name, (int(opt[1:]) if opt else None), tuple(defines)


def job_argv(config: str, preset: str, steps: int, batch: int, summaries: str, result: Path) -> list:
    name, window, defines = config_parts(config)
    if name == "kernel":
        return [sys.executable, "-m", "dtrace_mk", "run", "--backend", "gpu", "--model", preset,
                "--steps", str(steps), "--batch", str(batch)]
    return [sys.executable, "-m", "dtrace_mk.launch.serve", "--backend", "gpu", "--model", preset,
            "--steps", str(steps), "--batch", str(batch)] + OBSERVER_ARGS[name] + \
        ["--summaries", summaries, "--result", str(result)] + \
        (["--summary-window", str(window)] if window else []) + \
        [x for d in defines for x in ("--kernel-define", d)]


def parse(config: str, out: str, result: Path) -> dict:
    """One job's figures from its output (and --result file); a ValueError names what is missing."""
    if config_parts(config)[0] == "kernel":
        m = DECODE.search(out)
        if not m:
            raise ValueError(f"kernel: no 'decode step: mean' line in:\n{out[-1500:]}")
        us = float(m.group(1))
        return {"launch_us": us, "wall_us": us}
    m = SERVED.search(out)
    if not m:
        raise ValueError(f"{config}: no 'served N steps ... us/step of launch time' line in:\n{out[-1500:]}")
    served, wall_s, launch_us = int(m.group(1)), float(m.group(2)), float(m.group(3))
    res = json.loads(result.read_text())
    fed = FED.search(out)
    return {"launch_us": launch_us, "wall_us": wall_s * 1e6 / max(served, 1), "served": served,
            "verdict": res.get("verdict"), "lost": res.get("coverage", {}).get("lost"),
            "eligible": res.get("coverage", {}).get("eligible"),
            "records_fed": int(fed.group(1)) if fed else None,
            "findings": [finding_line(f) for f in res.get("findings", [])]}


def finding_line(f: dict) -> str:
    """'late_notification rmsnorm layer 3 steps 20-22 conf 0.71' (a finding of the result JSON)."""
    steps = f.get("steps") or []
    where = " ".join(str(x) for x in (f.get("task_class") or f.get("comm_op"),
                                      f"layer {f['layer']}" if "layer" in f else None) if x)
    span = f"steps {steps[0]}-{steps[-1]}" if steps else ""
    return " ".join(x for x in (f.get("cause", "?"), where, span, f"conf {f.get('confidence')}") if x)


def run_job(config: str, preset: str, a, log, rnd: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "result.json"
        argv = job_argv(config, preset, a.steps, a.batch, a.summaries, result)
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        env.pop("DTRACE_MK_JOB_DIR", None)
        if a.dump and config != "kernel":
            dumps = Path(a.out) / "dumps"
            dumps.mkdir(parents=True, exist_ok=True)
            env["DTRACE_MK_COLLECTOR_DUMP"] = str(dumps / f"{preset}_{config.replace(':', '_').replace('+', '_')}_{rnd}.pkl")
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=a.job_timeout)
        out = p.stdout + p.stderr
        if p.returncode != 0:
            raise RuntimeError(f"{preset} {config}: exit {p.returncode}:\n{out[-3000:]}")
        fig = parse(config, out, result)
    log(f"{preset} {config}: " + ", ".join(f"{k} {v}" for k, v in fig.items()))
    return fig


def bench_preset(preset: str, a, log) -> dict:
    configs = a.configs.split(",")
    runs = {c: [] for c in configs}
    for r in range(a.reps):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            runs[c].append(run_job(c, preset, a, log, r))
    med = {c: {k: statistics.median(f[k] for f in runs[c]) for k in ("launch_us", "wall_us")} for c in configs}
    ratios = {}
    base = "kernel" if "kernel" in configs else None
    for c in configs:
        if base and c != base:
            ratios[f"{c}/kernel"] = med[c]["launch_us"] / med[base]["launch_us"]
    if "workers" in configs and "sm" in configs:
        ratios["sm/workers"] = med["sm"]["launch_us"] / med["workers"]["launch_us"]
    if "sm" in configs and "smpin" in configs:
        ratios["smpin/sm"] = med["smpin"]["launch_us"] / med["sm"]["launch_us"]
    for c in configs:                   # a :wW / +D config over the same observer's plain one
        name = config_parts(c)[0]
        if c != name and name in configs:
            ratios[f"{c}/{name}"] = med[c]["launch_us"] / med[name]["launch_us"]
    return {"preset": preset, "steps": a.steps, "batch": a.batch, "summaries": a.summaries,
            "median": med, "ratios": ratios, "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,1b")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"a subset of {','.join(NAMES)} (default {','.join(CONFIGS)}); workers / sm / smpin may take "
                         f":wW (--summary-window W) "
                         f"and +DTMK_NAME (serve --kernel-define)")
    ap.add_argument("--summaries", choices=("device", "host"), default="device")
    ap.add_argument("--job-timeout", type=float, default=240.0, help="seconds per job")
    ap.add_argument("--dump", action="store_true", help="keep each serve job's collector input under OUT/dumps")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    for c in a.configs.split(","):
        try:
            config_parts(c)
        except ValueError as e:
            ap.error(f"--configs: {e}")
    from benchio import run_presets
    res = run_presets(a.out, "serve", a.presets, lambda p, log: bench_preset(p, a, log))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (median over {a.reps} rounds; us/step)")
    for r in res["presets"]:
        print(f"{r['preset']}  batch {r['batch']}, {r['steps']} steps, summaries {r['summaries']}")
        for c, m in r["median"].items():
            jobs = r["runs"][c]
            extra = "" if c == "kernel" else (f"  verdicts {'/'.join(j['verdict'] for j in jobs)}, lost "
                                              f"{sum(j['lost'] or 0 for j in jobs)}, records fed "
                                              f"{sum(j['records_fed'] or 0 for j in jobs)}")
            print(f"  {c:<8} launch {m['launch_us']:>9.1f}  wall {m['wall_us']:>9.1f}{extra}")
            for i, j in enumerate(jobs):
                for f in j.get("findings", [])[:4]:
                    print(f"           round {i}: {f}")
        print("  " + "  ".join(f"{k} {v:.3f}" for k, v in r["ratios"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
