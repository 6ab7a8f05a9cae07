"""The off path as PAIRED ratios: every build runs on the same instance's memory.

    python bench/paired.py [--presets 1b,tiny] [--reps 7] [--instances 3] [--out DIR]

Why: two Megakernels of the SAME build ran up to 1.64% apart (1b, 2026-12-01), more than
the 0.5% off target, so a ratio of two builds in two instances measures their memory as
much as their code.  Here each instance (one Megakernel: its own weights and buffers)
runs every build's kernel on its own memory (the builds share MkParams and the dynamic
shared-memory layout), and a build's figure is the mean over instances of its ratio to
the baseline ON THE SAME instance.

Codes (kernels of megakernel.cu, loaded as modules):
  nohooks    -DDTMK_NO_HOOKS (the baseline)          nohooks'  a second load of the same cubin
  default    the hook build, nothing enabled
  (session 11's lean builds, -DDTMK_NO_HOOKS -DDTMK_HANDOFF [-DDTMK_HO_AFTER_SYNC], ran here
  on 2026-12-01 at adc5f50: +2.58% / +2.20% on 1b; they are gone: bench/handoff.py)
and the handoff launches of the instance (each instance is a Megakernel(handoff=True)):
  lean       start(lean=True): the lean grid as LiveSession runs a job with nothing
             attached (the off path WITH handoff, workers placed)
  swap       lean, handed to the hook build by every worker after its 8th task
  hook       the handoff hook build (-DDTMK_HANDOFF -DDTMK_SM_WORKER) alone, nothing attached
Instances: `--instances` Megakernels with their own weights and buffers, and one more
("w0") with its own buffers but instance 0's weight arrays.  Read together:
  nohooks' vs nohooks on one instance   -> code placement (a second module load)
  nohooks across instances              -> memory placement
  w0 vs instance 0 and the others       -> is it the weights or the other buffers

Timing: one launch of K decode steps (device events), rep 0 a warm-up, then --reps rounds,
each running every (instance, code) pair, the order reversed every other round; median per
pair.  Tokens of every pair checked equal.  Writes DIR/paired.json; a short table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np

REQUIRES = "gpu"   # what `dtrace-mk bench paired` checks before it runs: cpu, gpu, or gpu:N (N ranks, N GPUs)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STEPS = {"tiny": 128, "1b": 48}
CODES = {"nohooks": ("DTMK_NO_HOOKS",), "nohooks'": ("DTMK_NO_HOOKS",), "default": ()}
MODES = {"lean": {"lean": True}, "swap": {"handoff_after": 8}, "hook": {}}
BASE = "nohooks"


def summarize(med: Dict[str, Dict[str, float]], base: str = BASE) -> Dict[str, dict]:
    """med[instance][code] -> per code: the paired ratio (code / base on the same
    instance, in %) per instance, their mean and range, and the code's own spread across
    instances (max / min - 1, in %: what an unpaired comparison would carry)."""
    insts = list(med)
    codes = list(med[insts[0]])
    out = {}
    for c in codes:
        per = {i: 100.0 * (med[i][c] / med[i][base] - 1.0) for i in insts}
        vals = [med[i][c] for i in insts]
        out[c] = {"paired_pct": per, "mean_pct": statistics.fmean(per.values()),
                  "min_pct": min(per.values()), "max_pct": max(per.values()),
                  "us_mean": statistics.fmean(vals),
                  "spread_pct": 100.0 * (max(vals) / min(vals) - 1.0)}
    return out


#: launch options a --codes entry may add after "@" (NAME=DEFS@trace: the built-in trace on)
CODE_OPTS = {"trace": {"trace": True}}


def parse_codes(spec: str):
    """--codes "name=DEF1+DEF2,name2=DEF3@trace" -> ({name: (DEF1, DEF2), ...} extra builds,
    {name: launch kwargs})"""
    out, kw = {}, {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, rest = item.partition("=")
        defs, _, opt = rest.partition("@")
        if not sep or not name or name in CODES or name in MODES or (opt and opt not in CODE_OPTS):
            raise SystemExit(f"--codes: {item!r}: want NAME=DEFINE[+DEFINE...][@{'|'.join(CODE_OPTS)}] with a new name")
        out[name] = tuple(filter(None, defs.split("+")))
        kw[name] = CODE_OPTS[opt] if opt else {}
    return out, kw


def bench_preset(name: str, reps: int, instances: int, log, extra: Optional[Dict[str, tuple]] = None,
                 extra_kw: Optional[Dict[str, dict]] = None) -> dict:
    from benchio import kernels_on, timed_rounds
    from dtrace_mk.megakernel import gpu
    from dtrace_mk.megakernel.presets import PRESETS
    from dtrace_mk.megakernel.reference import make_weights
    cfg = PRESETS[name]
    steps = STEPS.get(name, 16)
    w = make_weights(cfg, 0)
    inst = {str(k): gpu.Megakernel(cfg, batch=1, weights=w, handoff=True) for k in range(instances)}
    inst["w0"] = gpu.Megakernel(cfg, batch=1, weights=inst["0"].weights, handoff=True)
    hook_kernel = {i: m.kernel for i, m in inst.items()}     # the successor of lean / swap
    assert inst["w0"].weights["qkv"].data.ptr == inst["0"].weights["qkv"].data.ptr
    m0 = inst["0"]
    codes, extra_kw = {**CODES, **(extra or {})}, extra_kw or {}
    kern = kernels_on(m0, codes)

    def timed(i: str, c: str):
        m = inst[i]
        m.kernel = kern[c] if c in kern else hook_kernel[i]
        try:
            m.reset()
            h = m.start(steps, poison=False, **MODES.get(c, {}), **extra_kw.get(c, {}))
            return m.finish(h)
        finally:
            m.kernel = hook_kernel[i]

    rows = tuple(codes) + tuple(MODES)
    pairs = [(i, c) for i in inst for c in rows]
    times, last = timed_rounds(pairs, reps, steps, lambda p: timed(*p))
    med = {i: {c: statistics.median(times[(i, c)]) for c in rows} for i in inst}
    ref = last[(next(iter(inst)), BASE)].tokens
    out = {"preset": name, "steps_per_launch": steps, "reps": reps, "us_per_step": med,
           "all_us_per_step": {f"{i}/{c}": t for (i, c), t in times.items()},
           "tokens_equal": all(np.array_equal(r.tokens, ref) for r in last.values()),
           "codes": summarize(med)}
    log(json.dumps({k: out[k] for k in ("preset", "us_per_step", "tokens_equal")}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="1b,tiny")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--instances", type=int, default=3, help="Megakernels with their own weights (plus w0)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--codes", default="", help="extra builds NAME=DEFINE[+DEFINE...], comma separated "
                    "(e.g. r120=DTMK_NO_HOOKS+DTMK_MAXNREG=120); NAME=DEFS@trace: launched with the built-in trace on")
    a = ap.parse_args(argv)
    extra, extra_kw = parse_codes(a.codes)
    from benchio import run_presets
    res = run_presets(a.out, "paired", a.presets, lambda p, log: bench_preset(p, a.reps, a.instances, log, extra, extra_kw))
    print(f"\n{res['card']}  {res['date']}  {res['commit']}  (median us/step per instance; "
          f"% = code / nohooks on the SAME instance)")
    for r in res["presets"]:
        med = r["us_per_step"]
        print(f"{r['preset']}  tokens equal: {r['tokens_equal']}")
        print(f"{'code':<10} " + " ".join(f"{i:>9}" for i in med) + f" {'paired %':>9} {'range %':>15} {'unpaired spread':>15}")
        for c, s in r["codes"].items():
            print(f"{c:<10} " + " ".join(f"{med[i][c]:>9.1f}" for i in med)
                  + f" {s['mean_pct']:>+8.2f}% {s['min_pct']:>+6.2f}..{s['max_pct']:+.2f}% {s['spread_pct']:>14.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
