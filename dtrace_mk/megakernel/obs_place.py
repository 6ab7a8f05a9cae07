"""Where an observer-SM build's observers run, chosen by measuring (-DDTMK_OBS_SM with
-DDTMK_SM_WORKER; Megakernel.place_observers pins them).

The observers' code slows the other SMs of their GPC: it pushes the workers' code out of
the instruction cache the GPC's SMs share (docs/dev/hook_cost_analysis.md sessions 29-30).
So a monitor's cost depends on which SMs the observers sit on.  Pinned, launches agree
within +-0.3% whatever the workers' placement, but on one H100 three sets read +6.35 /
+6.87 / +9.51% (1b hot summary over its own off), and the set that was cheapest on another
H100 (+1.9%) was not the cheapest there (docs/results/hooks.md sessions 50-51): no fixed
list of SMs is cheap on every card.  calibrate() measures a few candidate sets on this card,
rounds interleaved so that drift hits every set alike, and keeps the cheapest: its ranking
is reproducible (within 0.4% across runs) and holds under the placement it measures, the
workers in id order around the observers -- top's: the calibrated set +2.96 / +3.28% vs
+6.23% for the highest SMs (session 52).

The functions here take the placing and the measuring as callables, so the choice itself is
tested without a GPU (tests/megakernel/test_obs_place.py); tests/gpu/test_obs_place_gpu.py
runs it on the megakernel."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np

from ..errors import UserError

#: candidate sets calibrate() tries by default: the tail (the SMs a sorted placement gives
#: the observers) and random draws.  Each costs `rounds` short launches.
CANDIDATES_DEFAULT = 12


def observer_order(ids: Sequence[int], observers: Sequence[int]) -> List[int]:
    """A place_workers order for the grid's SMs `ids` with the observers on `observers`:
    the workers on the other SMs in id order, the observers last (worker k on order[k];
    megakernel.cu "worker placement": the map's last DTMK_OBS_SMS entries are observers)."""
    obs = [int(x) for x in observers]
    have = set(int(x) for x in ids)
    bad = [x for x in obs if x not in have]
    if bad:
        raise UserError(f"observer SMs {bad} are not among the {len(have)} SMs the grid gets "
                        f"({min(have)}..{max(have)})")
    if len(set(obs)) != len(obs):
        raise UserError(f"observer SMs: each SM once, got {obs}")
    return [x for x in sorted(have) if x not in obs] + obs


def candidate_sets(ids: Sequence[int], m: int, k: int = CANDIDATES_DEFAULT, seed: int = 0) -> List[List[int]]:
    """k distinct sets of m observer SMs among `ids`: the m highest ids first (a sorted
    placement's), then random draws (seeded: the same candidates on every run)."""
    ids = sorted(int(x) for x in ids)
    if not 1 <= m < len(ids):
        raise UserError(f"candidate_sets: {m} observer SMs of {len(ids)}")
    if k < 1:
        raise UserError(f"candidate_sets: want at least one candidate, got {k}")
    out, seen = [], set()
    rng = np.random.default_rng(seed)
    cand = ids[-m:]
    for _ in range(64 * k):                      # (k may exceed the distinct sets of a tiny grid)
        key = tuple(sorted(cand))
        if key not in seen:
            seen.add(key)
            out.append(sorted(cand))
            if len(out) == k:
                break
        cand = [int(x) for x in rng.choice(ids, size=m, replace=False)]
    return out


@dataclass
class Calibration:
    """calibrate()'s result: the chosen set and what each candidate measured."""
    best: List[int]
    us_per_step: List[List[float]] = field(default_factory=list)   # [candidate][round]
    candidates: List[List[int]] = field(default_factory=list)

    def medians(self) -> List[float]:
        return [statistics.median(u) for u in self.us_per_step]

    def lines(self) -> List[str]:
        """One line per candidate: its SMs, median us/step and its excess over the best."""
        med = self.medians()
        lo = min(med)
        return [f"{'*' if c == self.best else ' '} observers on SMs {','.join(map(str, c)):<24} "
                f"{m:9.1f} us/step  {100 * (m / lo - 1):+6.2f}%" for c, m in zip(self.candidates, med)]


def calibrate(place: Callable[[List[int]], None], measure: Callable[[], float],
              candidates: Sequence[Sequence[int]], rounds: int = 2,
              progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """Measure each candidate observer set `rounds` times and keep the cheapest.

    place(set) pins the observers (Megakernel.place_observers); measure() runs one launch
    with the monitor the job will run and returns its us/step.  Round r visits the
    candidates rotated by r, so a slow drift (clocks, temperature) is not charged to the
    candidates late in each round.  The cheapest median wins (the earlier candidate on a
    tie); the observers are left on it."""
    cands = [[int(x) for x in c] for c in candidates]
    if not cands:
        raise UserError("calibrate: no candidate observer sets")
    if rounds < 1:
        raise UserError(f"calibrate: want at least one round, got {rounds}")
    us: List[List[float]] = [[] for _ in cands]
    n = len(cands)
    for r in range(rounds):
        for j in range(n):
            i = (j + r) % n
            place(cands[i])
            us[i].append(float(measure()))
        if progress is not None:
            progress(f"observer placement: round {r + 1}/{rounds} of {n} candidate sets")
    med = [statistics.median(u) for u in us]
    best = cands[min(range(n), key=lambda i: (med[i], i))]
    place(best)
    return Calibration(best=best, us_per_step=us, candidates=cands)


def calibrate_session(live, obj, steps: int = 16, k: int = CANDIDATES_DEFAULT, rounds: int = 2,
                      progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """calibrate() on a LiveSession's observer-SM megakernel: `obj` (the monitor the job will
    run, in the hot tier whatever the session's) attached for the calibration's launches of
    `steps` decode steps each, then detached (its maps and coverage do not carry the
    calibration's steps into the job's).
    k candidate sets x rounds launches: 1b's 16 steps take ~20 ms each."""
    mk = live.mk
    if not getattr(mk, "obs_sm", False):
        raise UserError("observer placement: the build has no observer SMs (--observer sm)")
    aid = live.attach(obj, tier="hot")          # (named: a compiled-tier session does not link it)

    def measure() -> float:
        live.start(steps)
        return live.wait().elapsed_ms * 1e3 / steps
    try:
        return calibrate(mk.place_observers, measure, candidate_sets(mk.sm_ids(), mk.obs_sms, k),
                         rounds, progress)
    finally:
        live.detach(aid)


def calibrate_twin(twin, obj, k: int = CANDIDATES_DEFAULT, steps: int = 16, rounds: int = 2,
                   progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """calibrate_session on `twin`, a Megakernel of the job's build sharing its weights and
    graph (Megakernel(..., weights=mk.weights, graph=mk.graph)): the job's own megakernel
    then starts with none of the calibration's steps, generations or epochs (serve's
    resident kernel names device steps from 0).  The caller pins the job's observers on
    the result's `best` (place_observers: the SM ids are the chip's, not the instance's)."""
    from ..runtime.live import LiveSession
    live = LiveSession(twin, tier="hot")
    try:
        return calibrate_session(live, obj, steps=steps, k=k, rounds=rounds, progress=progress)
    finally:
        live.close()
