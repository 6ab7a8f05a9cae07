"""Compiled queries on the device VM (GPU): the maps equal the reference runtime's.

Every golden query (tests/lang/golden/*.golden) is compiled, attached to the reference
runtime and to `dtrace_mk.runtime.device.DeviceRuntime`, and fed its event file:

* serial mode (one event at a time, the reference's order): every map byte-identical;
* parallel mode (events spread over warps): every map identical too.  count, sum, avg,
  hist, lhist update with atomic adds and hist_add; min / max / stats store through
  compare-and-store triples, which the device encodes as atomic min / max (devicegen
  `stxdw_min` / `stxdw_max`, session 8).  Before that (H200, 2026-11-30) 11 min / max /
  stats maps of 10 queries differed in parallel mode.

Skipped without CuPy and a CUDA GPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lang"))
import golden_util as gu  # noqa: E402


def _gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


if not _gpu():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

from dtrace_mk.lang import host  # noqa: E402
from dtrace_mk.lang.pipeline import compile_query  # noqa: E402
from dtrace_mk.runtime.device import DeviceRuntime  # noqa: E402
from dtrace_mk.runtime.reference import ReferenceRuntime  # noqa: E402

CASES = sorted(gu.GOLDEN.glob("*.golden"))


def _snap(ms, plan):
    out = {}
    for pm in plan["maps"]:
        m = ms[pm["bpf_map"]]
        if pm["map_type"] == "per_worker_array":
            out[pm["name"]] = m.snapshot(per_worker=False)
        else:
            out[pm["name"]] = {k: (list(v) if isinstance(v, list) else bytes(v)) for k, v in m.snapshot().items()}
    return out


def _run(path, serial):
    sections = gu.parse_golden(path.read_text())
    res = compile_query(sections["query"].rstrip("\n"))
    if not res.obj.programs:
        pytest.skip("host clauses only")
    recs = gu.events(sections["events"].strip())
    workers = host.workers_needed(recs)
    ref = ReferenceRuntime(num_workers=workers)
    raid = ref.attach(res.obj)
    for r in recs:
        ref.fire(r)
    dev = DeviceRuntime(num_workers=workers)
    daid = dev.attach(res.obj)
    dev.fire(recs, serial=serial)
    return res, _snap(ref.maps(raid), res.plan), _snap(dev.maps(daid), res.plan)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_serial_device_maps_equal_reference(path):
    res, ref, dev = _run(path, serial=True)
    assert ref == dev


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_parallel_device_maps_equal_reference(path):
    res, ref, dev = _run(path, serial=False)
    for pm in res.plan["maps"]:
        assert ref[pm["name"]] == dev[pm["name"]], (pm["name"], pm["agg"])
