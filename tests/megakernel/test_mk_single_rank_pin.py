"""Single-rank graphs are pinned: the GPU kernel consumes them, and tensor-parallel
lowering (ranks > 1) must not change one task, event, plan or schema byte of ranks == 1.

The hashes were computed from `build_graph` before the tensor-parallel lowering existed
(commit 836b4a8).  Plans are built with the cost *estimate* passed explicitly, so a new
measured cost table cannot move them (with the measured table of 2026-11-30 the plans
were the same)."""
import hashlib
from dataclasses import replace

import numpy as np
import pytest

from dtrace_mk.megakernel.cost import estimate_costs
from dtrace_mk.megakernel.graph import build_graph
from dtrace_mk.megakernel.presets import PRESETS

# (preset, batch, workers) -> (all device tables, schema hash prefix)
PINNED = {
    ("tiny", 4, 8): ("33fc804e431c74c5", "3d43e9ffbc9f9ea6"),
    ("tiny", 4, 132): ("d4613539383eac9a", "3d43e9ffbc9f9ea6"),
    ("small-moe", 8, 16): ("5facab3bf9edb8c1", "d0f315e6c2ec91b1"),
    ("small-moe", 4, 132): ("39e270780384d239", "27c93bb01fedb882"),
    ("1b", 8, 132): ("c88e671dfc49bd33", "2d5b99e0caaee354"),
}


def tables_hash(tables) -> str:
    m = hashlib.sha256()
    for k in sorted(tables):
        a = np.ascontiguousarray(tables[k])
        m.update(k.encode())
        m.update(str(a.dtype).encode())
        m.update(str(a.shape).encode())
        m.update(a.tobytes())
    return m.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(PINNED), ids=lambda c: f"{c[0]}-b{c[1]}-w{c[2]}")
def test_single_rank_graph_is_unchanged(case):
    name, batch, workers = case
    # the standard lowering is pinned; the fused one (1b's default since session 2) is
    # covered by tests/megakernel/test_graph_fused.py
    cfg = replace(PRESETS[name], fuse_norm=False, split_k=1)
    g = build_graph(cfg, batch, workers, costs=estimate_costs(cfg))
    want_tables, want_schema = PINNED[case]
    assert tables_hash(g.device_tables()) == want_tables, "ranks=1 device tables changed"
    assert g.schema.hash[len("sha256:"):][:16] == want_schema, "ranks=1 schema changed"
    assert g.rank == 0 and g.ranks == 1
    assert all(e.owner_rank == 0 and e.comm_op == -1 for e in g.events)


def test_default_costs_and_explicit_rank_zero_of_one_agree():
    cfg = PRESETS["tiny"]
    a = build_graph(cfg, 4, 8)
    b = build_graph(cfg, 4, 8, rank=0, ranks=1, costs=estimate_costs(cfg))
    assert a.tasks == b.tasks and a.events == b.events and a.schema.hash == b.schema.hash
