"""Context records: pack, unpack, bulk arrays and event files.

Everything here is derived from `definition.CONTEXT_FIELDS`; there is no second table.

* `pack(hook, **fields) -> bytes` builds one 128-byte record.  `abi_version` and `hook`
  are filled in; fields not given are 0, except the "none" fields `layer`, `expert` and
  `peer_rank`, which default to `NONE_U32` (0xffffffff) because 0 is a real layer, expert
  and rank.  `DEFAULTS` states this; pass the field explicitly to override.
* `unpack(record) -> dict` gives every field by its ABI name (hook as its numeric id).
* `CTX_DTYPE` is a NumPy structured dtype with the C layout of `struct dtmk_ctx`, for
  code that handles records in bulk (sim backend, GPU buffers): `to_array`, `from_array`.
* Event files (`dtrace-mk run-vm --events FILE`):
    - JSON Lines (any extension but `.ctx`): one object per record, field names as in
      the ABI, `"hook"` a hook name ("task:end") or id; blank lines and lines starting
      with `#` are skipped.  Example:
          {"hook": "task:end", "task_class": 3, "dur_ns": 1200, "worker": 1}
    - `.ctx`: raw concatenated 128-byte records (what `write_events(..., binary)` writes).
  Problems are `UserError`s naming the file, the line (or record index) and the field.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Sequence, Union

import numpy as np

from ..errors import UserError
from . import definition as d

_NP_TYPE = {"u16": "<u2", "u32": "<u4", "u64": "<u8"}
_ST_TYPE = {"u16": "H", "u32": "I", "u64": "Q"}
_MAX = {"u16": 0xFFFF, "u32": 0xFFFFFFFF, "u64": 0xFFFFFFFFFFFFFFFF}

CTX_DTYPE = np.dtype({
    "names": [f.name for f in d.CONTEXT_FIELDS],
    "formats": [_NP_TYPE[f.ctype] for f in d.CONTEXT_FIELDS],
    "offsets": [f.offset for f in d.CONTEXT_FIELDS],
    "itemsize": d.CONTEXT_SIZE,
})

# Fields whose "absent" value is NONE_U32 rather than 0.
DEFAULTS: Dict[str, int] = {"layer": d.NONE_U32, "expert": d.NONE_U32, "peer_rank": d.NONE_U32}

# The whole record as one struct (offsets are natural, so no padding is needed between
# fields; asserted below).
_STRUCT = struct.Struct("<" + "".join(_ST_TYPE[f.ctype] for f in d.CONTEXT_FIELDS))
assert _STRUCT.size == d.CONTEXT_SIZE
_NAMES = tuple(f.name for f in d.CONTEXT_FIELDS)
_TEMPLATE = tuple(DEFAULTS.get(n, 0) for n in _NAMES)
_INDEX = {n: i for i, n in enumerate(_NAMES)}
_I_VERSION, _I_HOOK = _INDEX["abi_version"], _INDEX["hook"]

# Byte offsets the hot paths read directly (runtime: hook id, worker, epoch).
OFF_HOOK = d.FIELDS_BY_NAME["hook"].offset
OFF_WORKER = d.FIELDS_BY_NAME["worker"].offset
OFF_DECODE_STEP = d.FIELDS_BY_NAME["decode_step"].offset
OFF_TS_NS = d.FIELDS_BY_NAME["ts_ns"].offset


def hook_id(hook: Union[str, int, d.Hook]) -> int:
    """A hook name, section, id or `Hook` -> its id; ValueError when unknown."""
    if isinstance(hook, d.Hook):
        return hook.id
    if isinstance(hook, bool):
        raise ValueError(f"unknown hook {hook!r}")
    if isinstance(hook, int):
        if hook not in d.HOOKS_BY_ID:
            raise ValueError(f"unknown hook id {hook}")
        return hook
    if isinstance(hook, str):
        try:
            return d.hook(hook).id
        except KeyError:
            raise ValueError(f"unknown hook '{hook}' (expected one of "
                             f"{', '.join(h.name for h in d.HOOKS)})") from None
    raise ValueError(f"unknown hook {hook!r}")


def pack(hook: Union[str, int, d.Hook], /, **fields: int) -> bytes:
    """One context record.  Raises ValueError naming the field on an unknown field name,
    a non-integer or an out-of-range value, and on a wrong `abi_version`."""
    vals = list(_TEMPLATE)
    vals[_I_VERSION] = d.ABI_VERSION
    vals[_I_HOOK] = hook_id(hook)
    for name, v in fields.items():
        i = _INDEX.get(name)
        if i is None:
            raise ValueError(f"field '{name}': not a context field")
        f = d.CONTEXT_FIELDS[i]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"field '{name}': expected an integer, got {v!r}")
        v = int(v)
        if not 0 <= v <= _MAX[f.ctype]:
            raise ValueError(f"field '{name}': {v} does not fit in {f.ctype}")
        if name == "abi_version" and v != d.ABI_VERSION:
            raise ValueError(f"field 'abi_version': {v}, this build speaks ABI v{d.ABI_VERSION}")
        if name == "hook" and v != vals[_I_HOOK]:
            raise ValueError(f"field 'hook': {v} disagrees with hook {hook!r}")
        vals[i] = v
    return _STRUCT.pack(*vals)


_HOOK_IDS = {h.name: h.id for h in d.HOOKS}


def pack_trusted(ctx: Mapping[str, Any]) -> bytes:
    """A producer's context dict ({"hook": name, field: value, ...}) -> record, without
    per-field checks: for producers whose values are in range by construction (the sim
    backend), ~10x faster than `from_dict`.  Unknown names still raise KeyError."""
    vals = list(_TEMPLATE)
    idx = _INDEX
    for k, v in ctx.items():
        vals[idx[k]] = v
    vals[_I_HOOK] = _HOOK_IDS[ctx["hook"]]
    vals[_I_VERSION] = d.ABI_VERSION
    return _STRUCT.pack(*vals)


def unpack(record: Union[bytes, bytearray, memoryview]) -> Dict[str, int]:
    """All fields of one record by ABI name.  ValueError when not 128 bytes."""
    if len(record) != d.CONTEXT_SIZE:
        raise ValueError(f"context record is {len(record)} bytes, expected {d.CONTEXT_SIZE}")
    return dict(zip(_NAMES, _STRUCT.unpack(bytes(record))))


def hook_of(record: bytes) -> d.Hook:
    """The hook a record is for; ValueError on an unknown id."""
    hid = struct.unpack_from("<I", record, OFF_HOOK)[0]
    h = d.HOOKS_BY_ID.get(hid)
    if h is None:
        raise ValueError(f"field 'hook': unknown hook id {hid}")
    return h


def check_record(record: bytes) -> None:
    """ValueError naming the field when a raw record is malformed."""
    if len(record) != d.CONTEXT_SIZE:
        raise ValueError(f"context record is {len(record)} bytes, expected {d.CONTEXT_SIZE}")
    v = struct.unpack_from("<I", record, 0)[0]
    if v != d.ABI_VERSION:
        raise ValueError(f"field 'abi_version': {v}, this build speaks ABI v{d.ABI_VERSION}")
    hook_of(record)


def to_array(records: Iterable[bytes]) -> np.ndarray:
    """Records -> a structured array of CTX_DTYPE (one copy)."""
    buf = b"".join(records)
    return np.frombuffer(buf, dtype=CTX_DTYPE).copy()


def from_array(arr: np.ndarray) -> List[bytes]:
    """A structured array of CTX_DTYPE -> list of 128-byte records."""
    if arr.dtype != CTX_DTYPE:
        raise ValueError(f"expected dtype CTX_DTYPE, got {arr.dtype}")
    raw = np.ascontiguousarray(arr).tobytes()
    n = d.CONTEXT_SIZE
    return [raw[i:i + n] for i in range(0, len(raw), n)]


def from_dict(obj: Mapping[str, Any]) -> bytes:
    """A JSON-style dict with a "hook" key (name or id) -> record (ValueError on problems)."""
    if "hook" not in obj:
        raise ValueError("field 'hook': missing")
    fields = dict(obj)
    hook = fields.pop("hook")
    if not isinstance(hook, (str, int)) or isinstance(hook, bool):
        raise ValueError(f"field 'hook': expected a hook name or id, got {hook!r}")
    try:
        hid = hook_id(hook)
    except ValueError as e:
        raise ValueError(f"field 'hook': {e}") from None
    return pack(hid, **fields)


def to_dict(record: bytes, *, hook_name: bool = True, skip_defaults: bool = False) -> Dict[str, Any]:
    """Record -> JSON-style dict (inverse of from_dict).  abi_version is left out."""
    out: Dict[str, Any] = unpack(record)
    del out["abi_version"]
    if hook_name:
        h = d.HOOKS_BY_ID.get(out["hook"])
        if h is not None:
            out["hook"] = h.name
    if skip_defaults:
        out = {k: v for k, v in out.items() if k == "hook" or v != DEFAULTS.get(k, 0)}
    return out


# ---------------------------------------------------------------------------------
# Event files
# ---------------------------------------------------------------------------------

def iter_events(path: Union[str, Path]) -> Iterator[bytes]:
    """Records of an events file (JSON Lines, or raw records when the name ends in .ctx).
    UserError names the file, the line (record) and the field."""
    p = Path(path)
    try:
        if p.suffix == ".ctx":
            data = p.read_bytes()
        else:
            text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{p}: cannot read events: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{p}: events file is not UTF-8 JSON Lines (use the .ctx extension "
                        f"for raw 128-byte records)") from None
    if p.suffix == ".ctx":
        if len(data) % d.CONTEXT_SIZE:
            raise UserError(f"{p}: {len(data)} bytes is not a whole number of "
                            f"{d.CONTEXT_SIZE}-byte context records")
        for i in range(0, len(data), d.CONTEXT_SIZE):
            rec = data[i:i + d.CONTEXT_SIZE]
            try:
                check_record(rec)
            except ValueError as e:
                raise UserError(f"{p}: record {i // d.CONTEXT_SIZE}: {e}") from None
            yield rec
        return
    for ln, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}:{ln}: not a JSON object: {e.msg} at column {e.colno}") from None
        if not isinstance(obj, dict):
            raise UserError(f"{p}:{ln}: expected a JSON object, got {type(obj).__name__}")
        try:
            yield from_dict(obj)
        except ValueError as e:
            raise UserError(f"{p}:{ln}: {e}") from None


def read_events(path: Union[str, Path]) -> List[bytes]:
    return list(iter_events(path))


def write_events(path: Union[str, Path], records: Sequence[bytes]) -> None:
    """Write records as JSON Lines, or raw when the name ends in .ctx."""
    p = Path(path)
    if p.suffix == ".ctx":
        p.write_bytes(b"".join(records))
        return
    with p.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(to_dict(r, skip_defaults=True)) + "\n")
