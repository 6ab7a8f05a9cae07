"""Context records: pack/unpack, the NumPy dtype and event files agree with the generated
C header (kernels/dtrace_mk_abi.h), which is what the kernels and monitors compile against."""
import json
import re
import struct

import numpy as np
import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as d
from dtrace_mk.errors import UserError


def _header_offsets(repo):
    text = (repo / "kernels" / "dtrace_mk_abi.h").read_text()
    offs = {m.group(1).lower(): int(m.group(2))
            for m in re.finditer(r"^#define DTMK_OFF_(\w+) (\d+)$", text, re.M)}
    size = int(re.search(r"^#define DTMK_CTX_SIZE (\d+)$", text, re.M).group(1))
    types = {m.group(2): m.group(1) for m in re.finditer(r"^\s+dtmk_(u\d+) (\w+); /\*", text, re.M)}
    return offs, size, types


def test_dtype_matches_c_header(repo):
    offs, size, types = _header_offsets(repo)
    assert context.CTX_DTYPE.itemsize == size == 128
    assert list(context.CTX_DTYPE.names) == list(offs)          # same fields, same order
    for name, off in offs.items():
        dt, o = context.CTX_DTYPE.fields[name][:2]
        assert o == off, name
        assert dt.itemsize * 8 == int(types[name][1:]), name


def test_pack_places_each_field_at_header_offset(repo):
    offs, _, types = _header_offsets(repo)
    for i, (name, off) in enumerate(offs.items()):
        if name in ("abi_version", "hook"):
            continue
        bits = int(types[name][1:])
        val = (0x0102030405060708 + i) & ((1 << bits) - 1)
        rec = context.pack("task:end", **{name: val})
        assert int.from_bytes(rec[off:off + bits // 8], "little") == val, name
    rec = context.pack("dep:wait")
    assert struct.unpack_from("<II", rec, 0) == (d.ABI_VERSION, d.HOOKS_BY_NAME["dep:wait"].id)


def test_defaults_and_roundtrip():
    rec = context.pack("task:end", dur_ns=1200, task_class=3)
    u = context.unpack(rec)
    assert len(rec) == 128
    assert u["dur_ns"] == 1200 and u["task_class"] == 3 and u["ts_ns"] == 0
    assert u["layer"] == u["expert"] == u["peer_rank"] == d.NONE_U32      # DEFAULTS
    assert context.pack("task:end", layer=0)[60:64] == bytes(4)
    assert context.pack(4, **{k: v for k, v in u.items() if k not in ("abi_version", "hook")}) == rec
    assert context.from_dict(context.to_dict(rec)) == rec
    assert context.to_dict(rec, skip_defaults=True) == {"hook": "task:end", "task_class": 3, "dur_ns": 1200}


@pytest.mark.parametrize("kw,msg", [
    ({"bogus": 1}, "field 'bogus': not a context field"),
    ({"dur_ns": -1}, "field 'dur_ns': -1 does not fit in u64"),
    ({"worker": 1 << 32}, "field 'worker': 4294967296 does not fit in u32"),
    ({"worker": "3"}, "field 'worker': expected an integer"),
    ({"abi_version": 2}, "field 'abi_version': 2"),
    ({"hook": 3}, "field 'hook': 3 disagrees"),
])
def test_pack_errors_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        context.pack("task:end", **kw)


def test_unknown_hook():
    with pytest.raises(ValueError, match="unknown hook 'task:bogus'"):
        context.pack("task:bogus")
    with pytest.raises(ValueError, match="unknown hook id 99"):
        context.pack(99)


def test_bulk_array_roundtrip():
    recs = [context.pack("task:end", worker=i, dur_ns=i * 10) for i in range(5)]
    arr = context.to_array(recs)
    assert arr.dtype == context.CTX_DTYPE and arr.shape == (5,)
    assert list(arr["dur_ns"]) == [0, 10, 20, 30, 40]
    assert context.from_array(arr) == recs
    arr["layer"][2] = 7
    assert context.unpack(context.from_array(arr)[2])["layer"] == 7


def test_events_jsonl_and_binary(tmp_path):
    p = tmp_path / "ev.jsonl"
    p.write_text('# comment\n{"hook": "task:end", "task_class": 3, "dur_ns": 1200}\n\n'
                 '{"hook": 8, "peer_rank": 1, "wait_ns": 5}\n')
    recs = context.read_events(p)
    assert [context.hook_of(r).name for r in recs] == ["task:end", "comm:wait"]
    assert context.unpack(recs[0])["dur_ns"] == 1200
    b = tmp_path / "ev.ctx"
    context.write_events(b, recs)
    assert b.stat().st_size == 256 and context.read_events(b) == recs
    j = tmp_path / "out.jsonl"
    context.write_events(j, recs)
    assert context.read_events(j) == recs
    assert json.loads(j.read_text().splitlines()[1]) == {"hook": "comm:wait", "peer_rank": 1, "wait_ns": 5}


@pytest.mark.parametrize("text,msg", [
    ('{"hook": "task:end"}\n{"hook": "task:end", "dur_ns": "x"}\n', r"ev.jsonl:2: field 'dur_ns': expected an integer"),
    ('{"dur_ns": 1}\n', r"ev.jsonl:1: field 'hook': missing"),
    ('{"hook": "nope"}\n', r"ev.jsonl:1: field 'hook': unknown hook 'nope'"),
    ('{"hook": "task:end", "wrong": 1}\n', r"ev.jsonl:1: field 'wrong': not a context field"),
    ('[1, 2]\n', r"ev.jsonl:1: expected a JSON object, got list"),
    ('{"hook": \n', r"ev.jsonl:1: not a JSON object"),
])
def test_bad_events_name_line_and_field(tmp_path, text, msg):
    p = tmp_path / "ev.jsonl"
    p.write_text(text)
    with pytest.raises(UserError, match=msg):
        context.read_events(p)


def test_bad_binary_events(tmp_path):
    p = tmp_path / "ev.ctx"
    p.write_bytes(b"\0" * 100)
    with pytest.raises(UserError, match="100 bytes is not a whole number of 128-byte"):
        context.read_events(p)
    rec = bytearray(context.pack("task:end"))
    rec[4:8] = (77).to_bytes(4, "little")
    p.write_bytes(context.pack("task:end") + bytes(rec))
    with pytest.raises(UserError, match="record 1: field 'hook': unknown hook id 77"):
        context.read_events(p)
    with pytest.raises(UserError, match="cannot read events"):
        context.read_events(p.parent / "missing.jsonl")
