"""The scalar abstract domain: what the verifier knows about a number.

A `Scalar` is the conjunction of three facts about a `bits`-wide value (bits = 64, or
32 for the low half used by ALU32/JMP32):

* unsigned bounds  umin <= v <= umax        (0 <= umin, umax < 2**bits)
* signed bounds    smin <= s(v) <= smax     (s = two's complement reading)
* a tnum           (value, mask): bits set in mask are unknown, the others equal value

as in Linux (kernel/bpf/tnum.c, reg_bounds_sync).  Every operation returns an
over-approximation of the set of results; `sync` intersects the three views and answers
None when the set is empty (an infeasible branch).  Nothing here knows about pointers.
"""
from __future__ import annotations

from typing import Optional, Tuple

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1


def _mask(bits: int) -> int:
    return (1 << bits) - 1


def to_signed(v: int, bits: int = 64) -> int:
    v &= _mask(bits)
    return v - (1 << bits) if v >> (bits - 1) else v


# --------------------------------------------------------------------------- tnum

class Tnum:
    """Tristate number: known bits in value, unknown bits in mask (value & mask == 0)."""
    __slots__ = ("value", "mask")

    def __init__(self, value: int, mask: int):
        self.value = value
        self.mask = mask

    def __eq__(self, o) -> bool:
        return isinstance(o, Tnum) and self.value == o.value and self.mask == o.mask

    def __hash__(self) -> int:
        return hash((self.value, self.mask))

    def __repr__(self) -> str:
        return f"Tnum({self.value:#x}, {self.mask:#x})"

    def contains(self, v: int) -> bool:
        return (v & ~self.mask) == self.value


def t_const(v: int, bits: int = 64) -> Tnum:
    return Tnum(v & _mask(bits), 0)


def t_unknown(bits: int = 64) -> Tnum:
    return Tnum(0, _mask(bits))


def t_range(lo: int, hi: int, bits: int = 64) -> Tnum:
    chi = lo ^ hi
    n = chi.bit_length()
    if n >= bits:
        return t_unknown(bits)
    delta = (1 << n) - 1
    return Tnum(lo & ~delta, delta)


def t_add(a: Tnum, b: Tnum, bits: int) -> Tnum:
    m = _mask(bits)
    sm = (a.mask + b.mask) & m
    sv = (a.value + b.value) & m
    sigma = (sm + sv) & m
    chi = sigma ^ sv
    mu = (chi | a.mask | b.mask) & m
    return Tnum(sv & ~mu, mu)


def t_sub(a: Tnum, b: Tnum, bits: int) -> Tnum:
    m = _mask(bits)
    dv = (a.value - b.value) & m
    alpha = (dv + a.mask) & m
    beta = (dv - b.mask) & m
    chi = alpha ^ beta
    mu = (chi | a.mask | b.mask) & m
    return Tnum(dv & ~mu, mu)


def t_and(a: Tnum, b: Tnum) -> Tnum:
    alpha = a.value | a.mask
    beta = b.value | b.mask
    v = a.value & b.value
    return Tnum(v, alpha & beta & ~v)


def t_or(a: Tnum, b: Tnum) -> Tnum:
    v = a.value | b.value
    mu = a.mask | b.mask
    return Tnum(v, mu & ~v)


def t_xor(a: Tnum, b: Tnum) -> Tnum:
    v = a.value ^ b.value
    mu = a.mask | b.mask
    return Tnum(v & ~mu, mu)


def t_lshift(a: Tnum, k: int, bits: int) -> Tnum:
    m = _mask(bits)
    return Tnum((a.value << k) & m, (a.mask << k) & m)


def t_rshift(a: Tnum, k: int) -> Tnum:
    return Tnum(a.value >> k, a.mask >> k)


def t_arshift(a: Tnum, k: int, bits: int) -> Tnum:
    m = _mask(bits)
    return Tnum((to_signed(a.value, bits) >> k) & m, (to_signed(a.mask, bits) >> k) & m)


def t_mul(a: Tnum, b: Tnum, bits: int) -> Tnum:
    m = _mask(bits)
    acc_v = (a.value * b.value) & m
    acc_m = Tnum(0, 0)
    while a.value or a.mask:
        if a.value & 1:
            acc_m = t_add(acc_m, Tnum(0, b.mask), bits)
        elif a.mask & 1:
            acc_m = t_add(acc_m, Tnum(0, (b.value | b.mask) & m), bits)
        a = t_rshift(a, 1)
        b = t_lshift(b, 1, bits)
    return t_add(Tnum(acc_v, 0), acc_m, bits)


def t_intersect(a: Tnum, b: Tnum) -> Optional[Tnum]:
    if (a.value ^ b.value) & ~(a.mask | b.mask):
        return None
    v = a.value | b.value
    mu = a.mask & b.mask
    return Tnum(v & ~mu, mu)


def t_union(a: Tnum, b: Tnum) -> Tnum:
    mu = a.mask | b.mask | (a.value ^ b.value)
    return Tnum(a.value & ~mu, mu)


# --------------------------------------------------------------------------- Scalar

class Scalar:
    """Bounds + tnum of one value.  Immutable; build through `make` (which syncs)."""
    __slots__ = ("umin", "umax", "smin", "smax", "tnum")

    def __init__(self, umin: int, umax: int, smin: int, smax: int, tnum: Tnum):
        self.umin, self.umax, self.smin, self.smax, self.tnum = umin, umax, smin, smax, tnum

    def __eq__(self, o) -> bool:
        return (isinstance(o, Scalar) and self.umin == o.umin and self.umax == o.umax
                and self.smin == o.smin and self.smax == o.smax and self.tnum == o.tnum)

    def __hash__(self) -> int:
        return hash((self.umin, self.umax, self.smin, self.smax))

    @property
    def const(self) -> Optional[int]:
        """The value when it is known exactly (unsigned reading), else None."""
        return self.umin if self.umin == self.umax else None

    def contains(self, v: int, bits: int = 64) -> bool:
        v &= _mask(bits)
        return (self.umin <= v <= self.umax and self.smin <= to_signed(v, bits) <= self.smax
                and self.tnum.contains(v))

    def __repr__(self) -> str:
        return f"Scalar(u[{self.umin:#x},{self.umax:#x}] s[{self.smin},{self.smax}] {self.tnum})"

    def describe(self) -> str:
        c = self.const
        if c is not None:
            s = to_signed(c)
            return f"scalar {s}" if -4096 <= s < 4096 else f"scalar {c:#x}"
        if self.smin >= 0 or self.smax < 0:
            return f"scalar in [{self.smin}, {self.smax}]"
        if self.umax == M64 and self.umin == 0:
            return "unknown scalar"
        return f"scalar in [{self.umin:#x}, {self.umax:#x}] (unsigned)"


def make(umin: int, umax: int, smin: int, smax: int, tnum: Tnum, bits: int = 64) -> Optional[Scalar]:
    """Intersect the three views; None when no value satisfies all of them."""
    m = _mask(bits)
    h = 1 << (bits - 1)
    full = 1 << bits
    umin, umax = max(umin, 0), min(umax, m)
    smin, smax = max(smin, -h), min(smax, h - 1)
    for _ in range(2):
        umin = max(umin, tnum.value)
        umax = min(umax, tnum.value | tnum.mask)
        # signed -> unsigned when the signed range does not cross zero
        if smin >= 0:
            umin, umax = max(umin, smin), min(umax, smax)
        elif smax < 0:
            umin, umax = max(umin, smin + full), min(umax, smax + full)
        # unsigned -> signed when the unsigned range does not cross the sign bit
        if umax < h:
            smin, smax = max(smin, umin), min(smax, umax)
        elif umin >= h:
            smin, smax = max(smin, umin - full), min(smax, umax - full)
        if umin > umax or smin > smax:
            return None
        t = t_intersect(tnum, t_range(umin, umax, bits))
        if t is None:
            return None
        tnum = t
    if umin > umax or smin > smax:
        return None
    return Scalar(umin, umax, smin, smax, tnum)


def const(v: int, bits: int = 64) -> Scalar:
    v &= _mask(bits)
    s = to_signed(v, bits)
    return Scalar(v, v, s, s, Tnum(v, 0))


def unknown(bits: int = 64) -> Scalar:
    h = 1 << (bits - 1)
    return Scalar(0, _mask(bits), -h, h - 1, t_unknown(bits))


def urange(lo: int, hi: int, bits: int = 64) -> Scalar:
    s = make(lo, hi, -(1 << 63), (1 << 63) - 1, t_unknown(bits), bits)
    assert s is not None
    return s


def from_tnum(t: Tnum, bits: int = 64) -> Scalar:
    s = make(0, _mask(bits), -(1 << (bits - 1)), (1 << (bits - 1)) - 1, t, bits)
    assert s is not None
    return s


def _unsure(x: Optional[Scalar], bits: int) -> Scalar:
    return x if x is not None else unknown(bits)


def join(a: Scalar, b: Scalar) -> Scalar:
    """Smallest Scalar containing both (bits agree: joins are only done on 64-bit values)."""
    if a == b:
        return a
    return Scalar(min(a.umin, b.umin), max(a.umax, b.umax), min(a.smin, b.smin),
                  max(a.smax, b.smax), t_union(a.tnum, b.tnum))


def meet(a: Scalar, b: Scalar, bits: int = 64) -> Optional[Scalar]:
    t = t_intersect(a.tnum, b.tnum)
    if t is None:
        return None
    return make(max(a.umin, b.umin), min(a.umax, b.umax), max(a.smin, b.smin),
                min(a.smax, b.smax), t, bits)


def trunc32(a: Scalar) -> Scalar:
    """The low 32 bits of a 64-bit scalar, as a 32-bit scalar."""
    t = Tnum(a.tnum.value & M32, a.tnum.mask & M32)
    if a.umax <= M32:
        return _unsure(make(a.umin, a.umax, -(1 << 31), (1 << 31) - 1, t, 32), 32)
    if a.smin >= -(1 << 31) and a.smax < (1 << 31):
        return _unsure(make(0, M32, a.smin, a.smax, t, 32), 32)
    return from_tnum(t, 32)


def zext32(a: Scalar) -> Scalar:
    """A 32-bit scalar zero-extended to 64 bits."""
    return _unsure(make(a.umin, a.umax, a.umin, a.umax, a.tnum, 64), 64)


# --------------------------------------------------------------------------- ALU

def _add(a: Scalar, b: Scalar, bits: int) -> Scalar:
    m, h = _mask(bits), 1 << (bits - 1)
    umin, umax = a.umin + b.umin, a.umax + b.umax
    if umax > m:
        umin, umax = 0, m
    smin, smax = a.smin + b.smin, a.smax + b.smax
    if smin < -h or smax >= h:
        smin, smax = -h, h - 1
    return _unsure(make(umin, umax, smin, smax, t_add(a.tnum, b.tnum, bits), bits), bits)


def _sub(a: Scalar, b: Scalar, bits: int) -> Scalar:
    m, h = _mask(bits), 1 << (bits - 1)
    if a.umin >= b.umax:
        umin, umax = a.umin - b.umax, a.umax - b.umin
    else:
        umin, umax = 0, m
    smin, smax = a.smin - b.smax, a.smax - b.smin
    if smin < -h or smax >= h:
        smin, smax = -h, h - 1
    return _unsure(make(umin, umax, smin, smax, t_sub(a.tnum, b.tnum, bits), bits), bits)


def _mul(a: Scalar, b: Scalar, bits: int) -> Scalar:
    m, h = _mask(bits), 1 << (bits - 1)
    umin, umax = a.umin * b.umin, a.umax * b.umax
    if umax > m:
        umin, umax = 0, m
    corners = [x * y for x in (a.smin, a.smax) for y in (b.smin, b.smax)]
    smin, smax = min(corners), max(corners)
    if smin < -h or smax >= h:
        smin, smax = -h, h - 1
    return _unsure(make(umin, umax, smin, smax, t_mul(a.tnum, b.tnum, bits), bits), bits)


def _div(a: Scalar, b: Scalar, bits: int) -> Scalar:
    # RFC 9669: unsigned division; dividing by zero gives 0
    if b.const == 0:
        return const(0, bits)
    if a.const is not None and b.const is not None:
        return const(a.const // b.const, bits)
    if b.umin > 0:
        return urange(a.umin // b.umax, a.umax // b.umin, bits)
    return urange(0, a.umax, bits)


def _mod(a: Scalar, b: Scalar, bits: int) -> Scalar:
    # RFC 9669: unsigned modulo; modulo by zero leaves dst unchanged
    if b.const == 0:
        return a
    if a.const is not None and b.const is not None:
        return const(a.const % b.const, bits)
    if b.umin > 0:
        if a.umax < b.umin:
            return a
        return urange(0, min(a.umax, b.umax - 1), bits)
    return urange(0, a.umax, bits)


def _and(a: Scalar, b: Scalar, bits: int) -> Scalar:
    t = t_and(a.tnum, b.tnum)
    return _unsure(make(t.value, min(a.umax, b.umax), -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                        t, bits), bits)


def _or(a: Scalar, b: Scalar, bits: int) -> Scalar:
    t = t_or(a.tnum, b.tnum)
    return _unsure(make(max(a.umin, b.umin), _mask(bits), -(1 << (bits - 1)),
                        (1 << (bits - 1)) - 1, t, bits), bits)


def _xor(a: Scalar, b: Scalar, bits: int) -> Scalar:
    return from_tnum(t_xor(a.tnum, b.tnum), bits)


def _shift_amount(b: Scalar, bits: int) -> Optional[int]:
    k = b.const
    return k if k is not None and k < bits else None


def _lsh(a: Scalar, b: Scalar, bits: int) -> Scalar:
    k = _shift_amount(b, bits)
    if k is None:
        return unknown(bits)
    m = _mask(bits)
    umin, umax = a.umin << k, a.umax << k
    if umax > m:
        umin, umax = 0, m
    return _unsure(make(umin, umax, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                        t_lshift(a.tnum, k, bits), bits), bits)


def _rsh(a: Scalar, b: Scalar, bits: int) -> Scalar:
    k = _shift_amount(b, bits)
    if k is None:
        return urange(0, a.umax, bits) if b.umax < bits else unknown(bits)
    return _unsure(make(a.umin >> k, a.umax >> k, -(1 << (bits - 1)), (1 << (bits - 1)) - 1,
                        t_rshift(a.tnum, k), bits), bits)


def _arsh(a: Scalar, b: Scalar, bits: int) -> Scalar:
    k = _shift_amount(b, bits)
    if k is None:
        return unknown(bits)
    return _unsure(make(0, _mask(bits), a.smin >> k, a.smax >> k,
                        t_arshift(a.tnum, k, bits), bits), bits)


def _mov(a: Scalar, b: Scalar, bits: int) -> Scalar:
    return b


def _neg(a: Scalar, b: Scalar, bits: int) -> Scalar:
    return _sub(const(0, bits), a, bits)


ALU = {"add": _add, "sub": _sub, "mul": _mul, "div": _div, "mod": _mod, "and": _and,
       "or": _or, "xor": _xor, "lsh": _lsh, "rsh": _rsh, "arsh": _arsh, "mov": _mov,
       "neg": _neg}


def alu(op: str, a: Scalar, b: Scalar, is64: bool) -> Scalar:
    """dst = dst OP src on 64-bit scalars; ALU32 works on the low halves and zero-extends."""
    if is64:
        return ALU[op](a, b, 64)
    return zext32(ALU[op](trunc32(a), trunc32(b), 32))


def byteswap(a: Scalar, width: int, to_be: bool) -> Scalar:
    """le16/le32/le64 (truncate on a little-endian machine) and be16/32/64 (swap)."""
    c = a.const
    m = _mask(width)
    if c is not None:
        v = c & m
        if to_be:
            v = int.from_bytes(v.to_bytes(width // 8, "little"), "big")
        return const(v)
    if not to_be:
        if width == 64:
            return a
        return _and(a, const(m), 64)
    return urange(0, m)


# --------------------------------------------------------------------------- branches

def _lt(a: Scalar, b: Scalar, strict: bool, signed: bool, bits: int):
    d = 1 if strict else 0
    if signed:
        na = make(a.umin, a.umax, a.smin, min(a.smax, b.smax - d), a.tnum, bits)
        nb = make(b.umin, b.umax, max(b.smin, a.smin + d), b.smax, b.tnum, bits)
    else:
        na = make(a.umin, min(a.umax, b.umax - d), a.smin, a.smax, a.tnum, bits)
        nb = make(max(b.umin, a.umin + d), b.umax, b.smin, b.smax, b.tnum, bits)
    if na is None or nb is None:
        return None
    return na, nb


def _ne(a: Scalar, c: int, bits: int) -> Optional[Scalar]:
    umin, umax, smin, smax = a.umin, a.umax, a.smin, a.smax
    cs = to_signed(c, bits)
    if umin == c:
        umin += 1
    if umax == c:
        umax -= 1
    if smin == cs:
        smin += 1
    if smax == cs:
        smax -= 1
    return make(umin, umax, smin, smax, a.tnum, bits)


NEGATE = {"jeq": "jne", "jne": "jeq", "jgt": "jle", "jle": "jgt", "jge": "jlt", "jlt": "jge",
          "jsgt": "jsle", "jsle": "jsgt", "jsge": "jslt", "jslt": "jsge", "jset": "!jset",
          "!jset": "jset"}


def refine(op: str, a: Scalar, b: Scalar, bits: int = 64) -> Optional[Tuple[Scalar, Scalar]]:
    """(a', b') narrowed by assuming `a OP b` holds; None when it cannot hold."""
    if op == "jeq":
        x = meet(a, b, bits)
        return None if x is None else (x, x)
    if op == "jne":
        if a.const is not None and a.const == b.const:
            return None
        na = _ne(a, b.const, bits) if b.const is not None else a
        nb = _ne(b, a.const, bits) if a.const is not None else b
        if na is None or nb is None:
            return None
        return na, nb
    if op == "jset":
        t = t_and(a.tnum, b.tnum)
        if t.value == 0 and t.mask == 0:
            return None
        return a, b
    if op == "!jset":
        if t_and(a.tnum, b.tnum).value:
            return None
        if b.const is not None:
            na = make(a.umin, a.umax, a.smin, a.smax,
                      Tnum(a.tnum.value & ~b.const, a.tnum.mask & ~b.const), bits)
            return None if na is None else (na, b)
        return a, b
    signed = op.startswith("js")
    base = op[2:] if signed else op[1:]
    if base == "lt":
        return _lt(a, b, True, signed, bits)
    if base == "le":
        return _lt(a, b, False, signed, bits)
    r = _lt(b, a, base == "gt", signed, bits)
    return None if r is None else (r[1], r[0])


def branch(op: str, a: Scalar, b: Scalar, is64: bool):
    """(taken, fallthrough): each (a', b') or None when that edge is infeasible.
    JMP32 compares the low halves; a 64-bit value is narrowed only when it fits in 32 bits
    (then its low half is the whole value)."""
    if is64:
        return refine(op, a, b), refine(NEGATE[op], a, b)
    a32, b32 = trunc32(a), trunc32(b)
    out = []
    for o in (op, NEGATE[op]):
        r = refine(o, a32, b32, 32)
        if r is None:
            out.append(None)
            continue
        na = meet(a, zext32(r[0])) if a.umax <= M32 else a
        nb = meet(b, zext32(r[1])) if b.umax <= M32 else b
        out.append(None if na is None or nb is None else (na, nb))
    return out[0], out[1]
