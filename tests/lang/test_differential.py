"""Differential test: a query and an equivalent hand-written C monitor (built with clang
-target bpf) give identical maps over the same recorded events."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dtrace_mk.abi import context
from dtrace_mk.bpf.elf import load_object
from dtrace_mk.bpf.elfwrite import write_object
from dtrace_mk.lang import host
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.runtime.reference import ReferenceRuntime

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EVENTS = HERE / "golden" / "events" / "comm.jsonl"

QUERY = """
task:end /task.class == "attn"/ { @lat[task.layer] = hist(task.dur_ns);
                                  @n[task.class, step] = count(); }
comm:wait { @wait[comm.op] = sum(comm.wait_ns); @mx = max(comm.wait_ns); }
"""


def _maps_after(obj, records):
    rt = ReferenceRuntime(num_workers=host.workers_needed(records))
    aid = rt.attach(obj)
    for r in records:
        rt.fire(r)
    snap = rt.maps(aid).snapshot()
    return {name: dict(v) for name, v in snap.items()}, rt.coverage(aid)


@pytest.fixture(scope="module")
def c_monitor(tmp_path_factory, clang):
    out = tmp_path_factory.mktemp("mon") / "diff_attn_comm.o"
    subprocess.run([clang, "-target", "bpf", "-O2", "-g", "-c", str(HERE / "monitors" / "diff_attn_comm.c"),
                    "-I", str(REPO / "dtrace_mk" / "abi" / "include"), "-o", str(out)],
                   check=True, capture_output=True)
    return load_object(str(out))


def test_query_and_c_monitor_agree(c_monitor):
    records = context.read_events(EVENTS)
    q = compile_query(QUERY)
    # through the ELF writer and loader, as `dtrace-mk compile -o` + `run-vm` would
    q_obj = load_object(write_object(q.obj))
    q_maps, q_cov = _maps_after(q_obj, records)
    c_maps, c_cov = _maps_after(c_monitor, records)
    assert set(q_maps) == set(c_maps) == {"lat", "n", "wait", "mx"}
    for name in q_maps:
        assert q_maps[name] == c_maps[name], f"map {name} differs"
    # the maps are not trivially empty
    assert sum(sum(b) for b in q_maps["lat"].values()) == 64          # 4 steps x 4 layers x 4 attn tiles
    assert len(q_maps["wait"]) == 2
    assert sum(c.eligible for c in q_cov) == sum(c.eligible for c in c_cov)


def test_map_definitions_match(c_monitor):
    q = compile_query(QUERY)
    for m in q.obj.maps:
        c = c_monitor.map_by_name(m.name)
        assert (m.type, m.key_size, m.value_size, m.max_entries) == \
               (c.type, c.key_size, c.value_size, c.max_entries), m.name
