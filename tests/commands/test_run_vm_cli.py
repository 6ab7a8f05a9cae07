"""`dtrace-mk run-vm` and `dtrace-mk disasm`: output on objects and raw bytecode, JSON
shape, one-line errors."""
from __future__ import annotations

import json

import pytest

from dtrace_mk import cli
from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm
from dtrace_mk.bpf.elfwrite import write_object
from dtrace_mk.bpf.program import BpfObject, MapDef, Program

MAPS = [MapDef("lat", "hist_log2", 4, 512, 2), MapDef("pw", "per_worker_array", 4, 8, 1)]
TEXT = """
    ldxw r6, [r1+28]
    stxw [r10-4], r6
    ldxdw r3, [r1+96]
    lddw r1, map:lat
    mov r2, r10
    add r2, -4
    call hist_add
    stw [r10-8], 0
    lddw r1, map:pw
    mov r2, r10
    add r2, -8
    call map_lookup_elem
    jeq r0, 0, out
    mov r1, 1
    xadddw [r0+0], r1
out:
    mov r0, 0
    exit
"""


@pytest.fixture
def files(tmp_path):
    insns = asm.assemble(TEXT, [m.name for m in MAPS])
    h = abi.hook("task:end")
    obj = BpfObject([Program("lat_by_class", h.section, h, insns)], MAPS, license="GPL")
    (tmp_path / "mon.o").write_bytes(write_object(obj))
    (tmp_path / "p.bin").write_bytes(b"".join(i.encode() for i in asm.assemble("mov r0, 1\nexit")))
    recs = [context.pack("task:end", task_class=c % 3, dur_ns=100 * c, worker=c % 2, decode_step=c // 4)
            for c in range(8)]
    context.write_events(tmp_path / "ev.jsonl", recs)
    context.write_events(tmp_path / "ev.ctx", recs)
    return tmp_path


def cli_run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_vm_text(files, capsys):
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--events", files / "ev.jsonl")
    assert rc == 0, err
    assert "8 events, 1 program(s), 2 worker(s)" in out
    assert "@pw (per_worker_array):\n  [0]: 4 4  (sum 8)" in out
    assert "[256, 512)" in out
    lines = [l.split() for l in out.splitlines() if l.strip().startswith("lat_by_class")]
    # lat holds 2 keys; task class 2 is a third key, lost once per epoch
    assert [l[2:] for l in lines] == [["0", "1", "4", "3", "0", "1", "map_full:lat", "x1"],
                                      ["1", "1", "4", "3", "0", "1", "map_full:lat", "x1"]]
    assert "@lat (hist_log2, 2 lost):" in out


def test_run_vm_json_and_binary_events(files, capsys):
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--events", files / "ev.ctx", "-f", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["events"] == 8
    assert sum(c["eligible"] for c in doc["coverage"]) == 8
    for c in doc["coverage"]:
        assert c["eligible"] == c["executed"] + c["throttled"] + c["lost"]
    lat = {e["key"]["int"]: e["buckets"] for e in doc["maps"]["lat"]["entries"]}
    assert lat[0][0] == {"bucket": 0, "range": "0", "count": 1}          # dur 0
    assert doc["maps"]["pw"]["entries"][0]["per_worker"] == [{"hex": "0400000000000000", "int": 4}] * 2


def test_run_vm_raw_bytecode_needs_hook(files, capsys):
    rc, out, err = cli_run(capsys, "run-vm", files / "p.bin", "--hook", "task:end", "--events", files / "ev.ctx",
                           "--workers", "4")
    assert rc == 0 and "4 worker(s)" in out
    rc, out, err = cli_run(capsys, "run-vm", files / "p.bin", "--events", files / "ev.ctx")
    assert rc == 2 and "for raw bytecode give --hook" in err and len(err.splitlines()) == 1


def test_run_vm_bad_events_one_line(files, capsys):
    bad = files / "bad.jsonl"
    bad.write_text('{"hook": "task:end"}\n{"hook": "task:end", "dur_ns": -5}\n')
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--events", bad)
    assert rc == 2
    assert err.strip() == f"dtrace-mk run-vm: {bad}:2: field 'dur_ns': -5 does not fit in u64"
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--events", files / "missing.jsonl")
    assert rc == 2 and "cannot read events" in err and len(err.splitlines()) == 1


def test_run_vm_worker_out_of_range(files, capsys):
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--events", files / "ev.ctx", "--workers", "1")
    assert rc == 2 and "event 2: context field 'worker': 1 is out of range for 1 workers" in err


def test_run_vm_rejected_program_exit_1(files, capsys):
    # dur_ns is not a field of dep:wait: the verifier refuses before any event runs
    rc, out, err = cli_run(capsys, "run-vm", files / "mon.o", "--hook", "dep:wait", "--events", files / "ev.ctx")
    assert rc == 1 and "lat_by_class" in err and len(err.splitlines()) == 1


def test_disasm_object_and_raw(files, capsys):
    rc, out, err = cli_run(capsys, "disasm", files / "mon.o")
    assert rc == 0, err
    assert "#0 lat: hist_log2, key 4 B, value 512 B, 2 entries" in out
    assert "section task/end: program lat_by_class (observe, hook task:end" in out
    assert "     3: lddw r1, map:lat\n     5: mov r2, r10" in out
    rc, out, err = cli_run(capsys, "disasm", files / "p.bin")
    assert rc == 0 and out.splitlines()[1:] == ["     0: mov r0, 1", "     1: exit"]


def test_disasm_errors(files, capsys):
    (files / "odd.bin").write_bytes(b"\x18" + bytes(7))
    rc, out, err = cli_run(capsys, "disasm", files / "odd.bin")
    assert rc == 2 and "lddw is missing its second slot" in err
    rc, out, err = cli_run(capsys, "disasm", files / "nope.o")
    assert rc == 2 and "cannot read" in err
