"""Host map model: the semantics every map implementation (sim, device) must match.

Keys and values are bytes; each stored value lives in its own `bytearray` so the
reference VM can hand a program a pointer into it (writes through the pointer change the
map, as in Linux).  Return codes are Linux's: 0 or a negated errno from
`abi.definition` (ENOENT, E2BIG, ENOSPC, EINVAL, EEXIST).

Map kinds (abi.MAP_TYPES):

  hash              up to max_entries keys.  update(new key) into a full map -> -E2BIG,
                    counted in `stats.lost`.  Replacing an existing key always works.
                    Iteration (snapshot) order is insertion order; devices may differ,
                    so compare snapshots as dicts.
  array             u32 little-endian key; entries 0..max_entries-1 always exist, zeroed.
                    lookup out of range -> None; update out of range -> -E2BIG (counted
                    lost); update with NOEXIST -> -EEXIST; delete -> -EINVAL (as Linux).
  per_worker_array  an array per worker; the VM passes the worker, so a program on
                    worker w sees copy w.  Host: snapshot(per_worker=True) lists copies,
                    `sum_values` / snapshot(per_worker=False) sums them word-wise.
  hist_log2         hash from key to 64 u64 buckets; `hist_add(key, v)` adds 1 to bucket
                    `log2_bucket(v)`: 0 for v == 0, else floor(log2 v) + 1, clamped to 63.
  hist_linear       hash from key to buckets: 0 underflow (v < lin_lo), 1 + (v - lin_lo)
                    // lin_step for lin_lo <= v < lin_hi, last = overflow (v >= lin_hi).
                    v is read as a signed 64-bit value (so lin_lo may be negative).
                    Histograms are hashes: a new key into a full map -> -E2BIG, lost.
  ringbuf           per-worker records.  Each record costs len(data) bytes against the
                    worker's `budget_bytes` per epoch: over budget -> -ENOSPC, counted in
                    `stats.throttled` (budget refusals are throttling, not loss).  The
                    ring itself holds max_entries bytes per worker until drained: a record
                    that does not fit -> -ENOSPC, counted in `stats.lost`.  `drain()`
                    returns and removes the records.

Update flags: 0 ANY, 1 NOEXIST (-EEXIST if present), 2 EXIST (-ENOENT if absent); other
flags -> -EINVAL.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ..abi import definition as abi
from .program import MapDef

BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
E2BIG, ENOENT, ENOSPC, EINVAL, EEXIST = abi.E2BIG, abi.ENOENT, abi.ENOSPC, abi.EINVAL, abi.EEXIST
U64 = 0xFFFFFFFFFFFFFFFF


@dataclass
class MapStats:
    """Results a map refused since the last clear(): `lost` (full map, full ring, out of
    range) and `throttled` (evidence refused by the byte budget)."""
    lost: int = 0
    throttled: int = 0


def log2_bucket(v: int) -> int:
    """hist_log2 bucket of an unsigned 64-bit value."""
    v &= U64
    return 0 if v == 0 else min(v.bit_length(), abi.HIST_LOG2_BUCKETS - 1)


def linear_bucket(mdef: MapDef, v: int) -> int:
    """hist_linear bucket of a value read as signed 64-bit."""
    v &= U64
    if v >> 63:
        v -= 1 << 64
    if v < mdef.lin_lo:
        return 0
    if v >= mdef.lin_hi:
        return mdef.hist_buckets - 1
    return 1 + (v - mdef.lin_lo) // mdef.lin_step


class Map:
    """Base of all map kinds.  `worker` selects the per-worker copy where there is one and
    is ignored otherwise.  lookup returns the live bytearray (not a copy)."""

    kind = ""
    per_worker = False

    def __init__(self, mdef: MapDef, num_workers: int = 1):
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        self.mdef = mdef
        self.name = mdef.name
        self.num_workers = num_workers
        self.stats = MapStats()

    # -- program-facing ------------------------------------------------------------
    def lookup(self, key: bytes, worker: int = 0) -> Optional[bytearray]:
        raise NotImplementedError

    def update(self, key: bytes, value: bytes, flags: int = 0, worker: int = 0) -> int:
        raise NotImplementedError

    def delete(self, key: bytes, worker: int = 0) -> int:
        raise NotImplementedError

    # -- host-facing ---------------------------------------------------------------
    def snapshot(self, **kw):
        raise NotImplementedError

    def clear(self) -> None:
        self.stats = MapStats()

    def _check_key(self, key: bytes) -> bytes:
        key = bytes(key)
        if len(key) != self.mdef.key_size:
            raise ValueError(f"map '{self.name}': key of {len(key)} bytes, expected {self.mdef.key_size}")
        return key

    def _check_value(self, value: bytes) -> bytes:
        value = bytes(value)
        if len(value) != self.mdef.value_size:
            raise ValueError(f"map '{self.name}': value of {len(value)} bytes, expected {self.mdef.value_size}")
        return value


class HashMap(Map):
    kind = "hash"

    def __init__(self, mdef: MapDef, num_workers: int = 1):
        super().__init__(mdef, num_workers)
        self._d: Dict[bytes, bytearray] = {}

    def __len__(self) -> int:
        return len(self._d)

    def lookup(self, key, worker=0):
        return self._d.get(bytes(key))

    def _slot_for_new(self, key: bytes) -> bool:
        """True when a new key may be inserted; counts the loss otherwise."""
        if len(self._d) >= self.mdef.max_entries:
            self.stats.lost += 1
            return False
        return True

    def update(self, key, value, flags=0, worker=0):
        key = self._check_key(key)
        value = self._check_value(value)
        if flags not in (BPF_ANY, BPF_NOEXIST, BPF_EXIST):
            return -EINVAL
        cur = self._d.get(key)
        if cur is not None:
            if flags == BPF_NOEXIST:
                return -EEXIST
            cur[:] = value       # in place: pointers the program holds see the new value
            return 0
        if flags == BPF_EXIST:
            return -ENOENT
        if not self._slot_for_new(key):
            return -E2BIG
        self._d[key] = bytearray(value)
        return 0

    def delete(self, key, worker=0):
        return 0 if self._d.pop(bytes(key), None) is not None else -ENOENT

    def snapshot(self, skip_zero: bool = False, **kw) -> Dict[bytes, bytes]:
        return {k: bytes(v) for k, v in self._d.items() if not (skip_zero and not any(v))}

    def raw_entries(self) -> Tuple[bytes, bytes]:
        """Every key, then every value, each concatenated in insertion order (for readers
        that decode thousands of entries at once, e.g. with numpy)."""
        return b"".join(self._d.keys()), b"".join(self._d.values())

    def clear(self):
        super().clear()
        self._d.clear()


class _Hist(HashMap):
    """Histograms: a hash whose value is hist_buckets little-endian u64 counters."""

    def bucket(self, v: int) -> int:
        raise NotImplementedError

    def hist_add(self, key: bytes, v: int, worker: int = 0) -> int:
        key = self._check_key(key)
        cur = self._d.get(key)
        if cur is None:
            if not self._slot_for_new(key):
                return -E2BIG
            cur = self._d[key] = bytearray(self.mdef.value_size)
        off = 8 * self.bucket(v)
        n = (int.from_bytes(cur[off:off + 8], "little") + 1) & U64
        cur[off:off + 8] = n.to_bytes(8, "little")
        return 0

    def snapshot(self, skip_zero: bool = False, **kw) -> Dict[bytes, List[int]]:
        nb = self.mdef.hist_buckets
        return {k: [int.from_bytes(v[8 * i:8 * i + 8], "little") for i in range(nb)]
                for k, v in self._d.items() if not (skip_zero and not any(v))}


class HistLog2Map(_Hist):
    kind = "hist_log2"

    def bucket(self, v):
        return log2_bucket(v)


class HistLinearMap(_Hist):
    kind = "hist_linear"

    def bucket(self, v):
        return linear_bucket(self.mdef, v)


class ArrayMap(Map):
    kind = "array"

    def __init__(self, mdef: MapDef, num_workers: int = 1):
        super().__init__(mdef, num_workers)
        self._copies: List[Dict[int, bytearray]] = [{} for _ in range(self._ncopies)]

    @property
    def _ncopies(self) -> int:
        return 1

    def _index(self, key: bytes) -> int:
        if len(key) != 4:
            raise ValueError(f"map '{self.name}': array key must be 4 bytes, got {len(key)}")
        return int.from_bytes(key, "little")

    def _entry(self, idx: int, worker: int) -> bytearray:
        copy = self._copies[worker if self.per_worker else 0]
        e = copy.get(idx)
        if e is None:           # entries exist from the start; storage is allocated lazily
            e = copy[idx] = bytearray(self._initial(idx))
        return e

    def _initial(self, idx: int) -> bytes:
        """The value an entry starts with: zero, except entry 0 of a map with init_value
        (the loader's internal .rodata map)."""
        if idx == 0 and getattr(self.mdef, "init_value", None):
            return self.mdef.init_value[:self.mdef.value_size].ljust(self.mdef.value_size, b"\0")
        return bytes(self.mdef.value_size)

    def lookup(self, key, worker=0):
        idx = self._index(bytes(key))
        if idx >= self.mdef.max_entries:
            return None
        return self._entry(idx, worker)

    def update(self, key, value, flags=0, worker=0):
        idx = self._index(bytes(key))
        value = self._check_value(value)
        if flags not in (BPF_ANY, BPF_NOEXIST, BPF_EXIST):
            return -EINVAL
        if idx >= self.mdef.max_entries:
            self.stats.lost += 1
            return -E2BIG
        if flags == BPF_NOEXIST:
            return -EEXIST
        self._entry(idx, worker)[:] = value
        return 0

    def delete(self, key, worker=0):
        return -EINVAL

    def value_of(self, idx: int, worker: int = 0) -> bytes:
        if not 0 <= idx < self.mdef.max_entries:
            raise IndexError(f"map '{self.name}': index {idx} out of range 0..{self.mdef.max_entries - 1}")
        return bytes(self._entry(idx, worker))

    def snapshot(self, skip_zero: bool = False, **kw) -> Dict[bytes, bytes]:
        zero = bytes(self.mdef.value_size)
        copy = self._copies[0]
        out = {}
        idxs = range(self.mdef.max_entries) if not skip_zero else sorted(set(copy) | {0})
        for i in idxs:
            if i >= self.mdef.max_entries:
                continue
            v = bytes(copy[i]) if i in copy else self._initial(i)
            if skip_zero and v == zero:
                continue
            out[i.to_bytes(4, "little")] = v
        return out

    def clear(self):
        super().clear()
        self._copies = [{} for _ in range(self._ncopies)]


def _word_size(n: int) -> int:
    for w in (8, 4, 2):
        if n % w == 0:
            return w
    return 1


def sum_values(values: Sequence[bytes]) -> bytes:
    """Word-wise sum of equal-size values: little-endian unsigned words of 8 bytes when the
    size is a multiple of 8 (else 4, 2, 1), each wrapping at its width."""
    if not values:
        raise ValueError("nothing to sum")
    n = len(values[0])
    w = _word_size(n)
    mask = (1 << (8 * w)) - 1
    out = bytearray(n)
    for o in range(0, n, w):
        s = sum(int.from_bytes(v[o:o + w], "little") for v in values) & mask
        out[o:o + w] = s.to_bytes(w, "little")
    return bytes(out)


class PerWorkerArrayMap(ArrayMap):
    kind = "per_worker_array"
    per_worker = True

    @property
    def _ncopies(self) -> int:
        return self.num_workers

    def lookup(self, key, worker=0):
        self._check_worker(worker)
        return super().lookup(key, worker)

    def update(self, key, value, flags=0, worker=0):
        self._check_worker(worker)
        return super().update(key, value, flags, worker)

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"map '{self.name}': worker {worker} out of range 0..{self.num_workers - 1}")

    def snapshot(self, skip_zero: bool = False, per_worker: bool = True, **kw):
        """per_worker=True: {key: [value of worker 0, 1, ...]}; False: {key: summed value}."""
        zero = bytes(self.mdef.value_size)
        if skip_zero:
            idxs = sorted(set().union(*(c.keys() for c in self._copies)))
        else:
            idxs = range(self.mdef.max_entries)
        out = {}
        for i in idxs:
            vals = [bytes(c[i]) if i in c else self._initial(i) for c in self._copies]
            if skip_zero and all(v == zero for v in vals):
                continue
            out[i.to_bytes(4, "little")] = vals if per_worker else sum_values(vals)
        return out


@dataclass(frozen=True)
class Record:
    """One ring buffer record."""
    worker: int
    epoch: int
    data: bytes


class RingBufMap(Map):
    kind = "ringbuf"

    def __init__(self, mdef: MapDef, num_workers: int = 1):
        super().__init__(mdef, num_workers)
        self._rings: List[List[Record]] = [[] for _ in range(num_workers)]
        self._held = [0] * num_workers                 # bytes in ring (not yet drained)
        self._used: Dict[Tuple[int, int], int] = {}    # (worker, epoch) -> budget used

    def lookup(self, key, worker=0):
        return None

    def update(self, key, value, flags=0, worker=0):
        return -EINVAL

    def delete(self, key, worker=0):
        return -EINVAL

    def output(self, data: bytes, worker: int = 0, epoch: int = 0) -> int:
        """Append a record: 0, or -ENOSPC over budget (throttled) or ring full (lost)."""
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"map '{self.name}': worker {worker} out of range 0..{self.num_workers - 1}")
        n = len(data)
        used = self._used.get((worker, epoch), 0)
        if used + n > self.mdef.budget_bytes:
            self.stats.throttled += 1
            return -ENOSPC
        if self._held[worker] + n > self.mdef.max_entries:
            self.stats.lost += 1
            return -ENOSPC
        self._used[(worker, epoch)] = used + n
        self._held[worker] += n
        self._rings[worker].append(Record(worker, epoch, bytes(data)))
        return 0

    def budget_left(self, worker: int, epoch: int) -> int:
        return self.mdef.budget_bytes - self._used.get((worker, epoch), 0)

    def retire_epochs(self, upto: int) -> None:
        """Forget the budget use of epochs <= upto (their records were shipped)."""
        for k in [k for k in self._used if k[1] <= upto]:
            del self._used[k]

    def drain(self) -> List[Record]:
        """All records, worker by worker in output order; the rings are emptied (budget use
        of the epoch stays)."""
        out = [r for ring in self._rings for r in ring]
        self._rings = [[] for _ in range(self.num_workers)]
        self._held = [0] * self.num_workers
        return out

    def snapshot(self, **kw) -> List[Record]:
        return [r for ring in self._rings for r in ring]

    def clear(self):
        super().clear()
        self._rings = [[] for _ in range(self.num_workers)]
        self._held = [0] * self.num_workers
        self._used.clear()


MAP_CLASSES = {c.kind: c for c in (HashMap, ArrayMap, PerWorkerArrayMap, HistLog2Map,
                                   HistLinearMap, RingBufMap)}
assert set(MAP_CLASSES) == set(abi.MAP_TYPES_BY_NAME), "every ABI map type needs a host model"


def create_map(mdef: MapDef, num_workers: int = 1) -> Map:
    """A map for a definition (validated first: LoadError naming the map and field)."""
    mdef.validate()
    return MAP_CLASSES[mdef.type](mdef, num_workers)


class MapSet:
    """The maps of one object, indexed as in `BpfObject.maps` (the LD_IMM64 imm) and by name."""

    def __init__(self, defs: Sequence[MapDef], num_workers: int = 1):
        self.maps: List[Map] = [create_map(m, num_workers) for m in defs]
        self.by_name: Dict[str, Map] = {m.name: m for m in self.maps}
        self.num_workers = num_workers

    def __len__(self) -> int:
        return len(self.maps)

    def __iter__(self):
        return iter(self.maps)

    def __getitem__(self, k: Union[int, str]) -> Map:
        return self.maps[k] if isinstance(k, int) else self.by_name[k]

    def snapshot(self, **kw) -> Dict[str, object]:
        return {m.name: m.snapshot(**kw) for m in self.maps}

    def clear(self) -> None:
        for m in self.maps:
            m.clear()
