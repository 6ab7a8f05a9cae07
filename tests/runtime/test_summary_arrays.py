"""The summary query's task half reduced per epoch (runtime/summary_arrays.py): a device
window's maps reduced as arrays (WindowTasks) give exactly what the per-entry form
(parts_of_entries) gives for every epoch -- over random windows full of the ties that
decide a notification lag's class and the deepest queue's worker, unset ready stamps,
experts past MAX_EXPERTS and event ids past 32 bits.  (The agent's summaries from device
windows equal its host summaries of the same records: tests/runtime/test_device_summaries.py.)"""
from __future__ import annotations

import random
import struct

import pytest

from dtrace_mk.bpf.maps import HashMap
from dtrace_mk.bpf.program import MapDef
from dtrace_mk.collectors.records import MAX_EXPERTS
from dtrace_mk.runtime.agent import TASK_MAPS as KEYS
from dtrace_mk.runtime.summary_arrays import U64, TaskParts, WindowTasks, parts_of_entries


def _window(rng: random.Random, steps: range, wide_events: bool = False):
    """Host maps as a device window's readback leaves them: {name: HashMap}, and the same
    entries as {name: {key words: value bytes}} (insertion order = the maps')."""
    ents = {n: {} for n in KEYS}
    ev_base = 1 << 33 if wide_events else 0
    for k in list(steps) + [steps.stop, steps.start - 1]:          # and entries outside the range
        for c in rng.sample(range(12), rng.randint(0, 6)):
            n = rng.randint(1, 9)
            ents["dur"][(k, c)] = struct.pack("<4Q", n, n * 50, 10, rng.choice([60, 90, 90]))
            ents["dispatch_wait"][(k, c)] = struct.pack("<Q", rng.randint(0, 500))
            if rng.random() < 0.7:
                ents["dep_wait"][(k, c)] = struct.pack("<Q", rng.randint(0, 500))
        for ev in rng.sample(range(40), rng.randint(0, 20)):
            ev += ev_base
            for c in rng.sample(range(12), rng.randint(1, 3)):
                ents["end_ts"][(k, ev, c)] = struct.pack("<Q", rng.choice([1000, 1000, 1200, rng.randint(0, 3000)]))
            if rng.random() < 0.8:
                ents["ready_ts"][(k, ev)] = struct.pack("<Q", rng.choice([U64, 1100, 1200, rng.randint(0, 3000)]))
        for ev in rng.sample(range(40, 50), 2):                       # ready without producers
            ents["ready_ts"][(k, ev + ev_base)] = struct.pack("<Q", 5)
        for w in rng.sample(range(16), rng.randint(0, 16)):
            ents["queue_max"][(k, w)] = struct.pack("<Q", rng.choice([0, 0, 3, 7, 7]))
        for e in rng.sample(range(MAX_EXPERTS + 3), rng.randint(0, 4)):
            ents["expert_ns"][(k, e)] = struct.pack("<Q", rng.randint(1, 10**6))
        if rng.random() < 0.9:
            ents["t_begin"][(k,)] = struct.pack("<Q", rng.choice([U64, rng.randint(0, 900)]))
    items = list(ents.items())
    maps = {}
    for name, d in items:
        keys = list(d.items())
        rng.shuffle(keys)                                          # the device's slot order
        ents[name] = dict(keys)
        m = HashMap(MapDef(name, "hash", 8 * KEYS[name], 32 if name == "dur" else 8, 4096))
        for key, v in keys:
            assert m.update(struct.pack(f"<{len(key)}Q", *key), v) == 0
        maps[name] = m
    return maps, ents


@pytest.mark.parametrize("seed", range(40))
def test_a_window_reduced_as_arrays_equals_its_entries_reduced_one_by_one(seed):
    rng = random.Random(seed)
    steps = range(16 + seed, 32 + seed)
    maps, ents = _window(rng, steps, wide_events=seed % 5 == 4)
    half = WindowTasks(maps, steps.start, steps.stop, KEYS)
    for k in range(steps.start - 1, steps.stop + 1):
        want = parts_of_entries(k, ents) if k in steps else TaskParts()
        assert half.of(k) == want, k
    local = {}
    for (k, ev, _c), v in ents["end_ts"].items():
        if k in steps:
            local[(k, ev)] = max(local.get((k, ev), 0), struct.unpack("<Q", v)[0])
    assert half.local_end() == local


def test_ties_go_to_the_first_entry_and_the_lowest_worker():
    """Two producers of one event end at the same time: the lag goes to the class of the
    entry first in the map (the dictionary form's rule); two workers equally deep: the
    lower one is named."""
    maps, _ = _window(random.Random(0), range(1, 1))
    for m in maps.values():
        m.clear()
    maps["end_ts"].update(struct.pack("<3Q", 5, 9, 7), struct.pack("<Q", 100))
    maps["end_ts"].update(struct.pack("<3Q", 5, 9, 3), struct.pack("<Q", 100))
    maps["ready_ts"].update(struct.pack("<2Q", 5, 9), struct.pack("<Q", 130))
    maps["queue_max"].update(struct.pack("<2Q", 5, 6), struct.pack("<Q", 4))
    maps["queue_max"].update(struct.pack("<2Q", 5, 2), struct.pack("<Q", 4))
    p = WindowTasks(maps, 5, 6, KEYS).of(5)
    assert p.classes == {7: [0, 0, 0, 0, 0, 30]} and (p.qmax, p.qworker) == (4, 2) and p.end == 100
