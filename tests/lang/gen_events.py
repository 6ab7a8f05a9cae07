"""Deterministic hook-context event files for the language golden tests.

    python tests/lang/gen_events.py            # rewrites tests/lang/golden/events/*.jsonl

A tiny stand-in for the sim backend (which will produce files of the same form): a
4-layer decoder on 4 workers for a few decode steps, emitting every hook with plausible
fields.  No randomness but a fixed LCG, so the files are byte-for-byte reproducible
(tests/lang/test_golden.py checks that the committed files equal this output).

Files:
  decode.jsonl  task:* (ready/dispatch/begin/end), dep:wait/release, gen:advance,
                queue:pressure; attn in layer 2 is slow from step 2 on (FLAG_FAULT)
  comm.jsonl    the same graph on rank 0 of 2 with allreduce tiles: comm:signal and
                comm:wait with comm ops, generations and peer waits; rank 1 is late for
                allreduce_mlp in step 1
  moe.jsonl     a MoE layer: router + experts from the dynamic queue (FLAG_DYNAMIC),
                expert skew (expert 5 gets most tokens)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
OUT = HERE / "golden" / "events"
sys.path.insert(0, str(HERE.parents[1]))

from dtrace_mk.abi import context  # noqa: E402
from dtrace_mk.abi import definition as abi  # noqa: E402
from dtrace_mk.abi.schema import default_schema  # noqa: E402

SCHEMA = default_schema()
CID = {c.name: c.id for c in SCHEMA.task_classes}
OP = {c.name: c.id for c in SCHEMA.comm_ops}


class Lcg:
    def __init__(self, seed: int):
        self.s = seed & 0xFFFFFFFF

    def next(self, n: int) -> int:
        self.s = (1103515245 * self.s + 12345) & 0x7FFFFFFF
        return self.s % n


# class -> (base duration ns, tiles per layer)
DENSE = [("rmsnorm", 1500, 1), ("qkv", 6000, 4), ("rope_kv_append", 1200, 2), ("attn", 9000, 4),
         ("attn_o", 4000, 4), ("mlp_gate_up", 12000, 4), ("mlp_down", 8000, 4)]


def _graph(kind: str):
    """Yield (layer, class name, tiles, base) in graph order for one decode step."""
    layers = 4 if kind != "moe" else 2
    for l in range(layers):
        for name, base, tiles in DENSE:
            if kind == "moe" and name in ("mlp_gate_up", "mlp_down"):
                yield l, "moe_router", 1, 3000
                yield l, "moe_expert", 8, 7000
                continue
            yield l, name, tiles, base
            if kind == "comm" and name in ("attn_o", "mlp_down"):
                yield l, "allreduce", 2, 2500
    yield layers, "lm_head", 4, 10000
    yield layers, "argmax", 1, 800


def generate(kind: str) -> List[Dict]:
    rng = Lcg({"decode": 1, "comm": 2, "moe": 3}[kind])
    nworkers, steps = 4, 4 if kind != "moe" else 3
    evs: List[Dict] = []
    seq = 0
    free = [0] * nworkers           # when each worker is next free
    t = 1_000_000
    req_gen = [0, 0, 0, 0]

    def emit(hook: str, ts: int, **f):
        nonlocal seq
        d = {"hook": hook, "ts_ns": ts, **f}
        evs.append((ts, seq, d))
        seq += 1

    for step in range(steps):
        index = 0
        for layer, name, tiles, base in _graph(kind):
            for tile in range(tiles):
                w = index % nworkers
                ready = t + rng.next(400)
                dispatch = max(ready, free[w]) + 200 + rng.next(300)
                dep_wait = 0
                flags = 0
                common = dict(worker=w, sm=w * 2, decode_step=step, task_class=CID[name],
                              task_index=index, task_gen=step, tile=tile, layer=layer,
                              request_slot=tile % 4, request_gen=req_gen[tile % 4])
                expert = None
                if name == "moe_expert":
                    expert = 5 if rng.next(3) else rng.next(8)
                    common["expert"] = expert
                    flags |= abi.FLAG_DYNAMIC
                depth = 1 + (index * 7 + step) % 9
                emit("task:ready", ready, **common, event_id=index, event_gen=step + 1,
                     queue_depth=depth, flags=flags)
                emit("task:dispatch", dispatch, **common, queue_depth=depth,
                     wait_ns=dispatch - ready, flags=flags)
                if depth > 7:
                    emit("queue:pressure", dispatch, worker=w, sm=w * 2, decode_step=step,
                         queue_depth=depth, task_class=CID[name], layer=layer)
                begin = dispatch + 100
                if index % 5 == 3:
                    dep_wait = 500 + rng.next(2000)
                    emit("dep:wait", begin, **common, event_id=index, event_gen=step + 1, flags=flags)
                    begin += dep_wait
                    emit("dep:release", begin, **common, event_id=index, event_gen=step + 1,
                         wait_ns=dep_wait, flags=flags)
                dur = base + rng.next(base // 2 + 1)
                if name == "attn" and layer == 2 and step >= 2 and kind == "decode":
                    dur *= 8
                    flags |= abi.FLAG_FAULT
                if name == "allreduce":
                    op = "allreduce_attn" if tile == 0 or rng.next(2) == 0 else "allreduce_mlp"
                    cgen = step * 8 + layer
                    emit("comm:signal", begin + 300, **common, event_id=index, event_gen=step + 1,
                         comm_op=OP[op], comm_gen=cgen, peer_rank=1, flags=flags | abi.FLAG_REMOTE)
                    remote = 2500 + rng.next(1500)
                    if op == "allreduce_mlp" and step == 1:
                        remote += 40000
                    emit("comm:wait", begin + 300 + remote, **common, event_id=index,
                         event_gen=step + 1, comm_op=OP[op], comm_gen=cgen, peer_rank=1,
                         wait_ns=remote, flags=flags | abi.FLAG_REMOTE)
                    dur = max(dur, 300 + remote + 200)
                emit("task:begin", begin, **common, event_id=index, event_gen=step + 1,
                     wait_ns=dep_wait, queue_depth=depth, flags=flags)
                end = begin + dur
                emit("task:end", end, **common, event_id=index + 1, event_gen=step + 1,
                     dur_ns=dur, wait_ns=dep_wait, flags=flags)
                free[w] = end
                index += 1
            t = max(free) + 100
        for slot in range(4):
            if (step + slot) % 3 == 2:
                req_gen[slot] += 1
            emit("gen:advance", t + slot, worker=slot % nworkers, decode_step=step,
                 request_slot=slot, request_gen=req_gen[slot])
        t += 400_000                 # host-side gap between decode steps
    evs.sort(key=lambda e: (e[0], e[1]))
    for _, _, d in evs:
        context.from_dict(d)          # every record is valid for the ABI
    return [d for _, _, d in evs]


KINDS = ("decode", "comm", "moe")


def render(kind: str) -> str:
    return "".join(json.dumps(d, separators=(", ", ": ")) + "\n" for d in generate(kind))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for k in KINDS:
        (OUT / f"{k}.jsonl").write_text(render(k))
        print(f"{OUT / (k + '.jsonl')}: {len(generate(k))} records")


if __name__ == "__main__":
    main()
