"""The observer SM's epoch protocol (kernels/megakernel.cu "observer SM", mk_obs_sm.cuh),
model-checked: every interleaving of two workers, the observer warp(s) and a host
snapshot, for a few decode steps, keeps the promise the host relies on -- an epoch the
host calls final (min(steps finished, min OBS_PENDING) - 1, runtime/live.py) has all its
records counted in the coverage it reads afterwards.

The model is the protocol as the kernel implements it, one atomic action per ordered
group of memory operations (each group is fenced or ordered by the kernel's MEMBARs):

  worker, per task of step s:  hold OBS_PENDING <= s (hold_epoch) ; entry (osq_write_pend)
      ; release signal ; head += 1 (osq_publish).  In a wait (before a task, and once all
      are done): osq_raise -- OBS_PENDING := OSQ_W_LOW, or min(OSQ_W_LOW, the step of the
      oldest entry not yet taken) while tail < head (so epochs become final while the
      observer lags: session 15 found 1b's never did until the end).
  observer warp, a round (osq_observer): run the entries (records into the ring), lower
      OSQ_W_LOW of its slice to min(their epochs, acc_min) when below what it published,
      then the tails.  A drain (obs_sync): the ring into the accumulators (two ways by
      epoch parity: a record of epoch e flushes way e % 2's other epoch); with the ring
      empty, flush epochs < `upto` and publish the lowest epoch still held as OSQ_W_LOW.
  host: read steps finished, then each worker's OBS_PENDING, then the coverage.

Mutants (each one a known way to break the protocol) must be caught, so the checker is
shown to look: tails before the low, a raise that ignores the entries not yet taken, one
that bounds them one step too high, no hold before the signal, a publish while records
are still in the ring."""
from __future__ import annotations

import itertools

import pytest

INF = 1 << 30


def check(n_workers=2, steps=2, warps=1, mutant=None, limit=3_000_000, finals=None, lazy=False, desc=False,
          defer=0, multi=1, split=0, capped=False):
    """Explore every interleaving; return None or the first violation's description.
    `finals` (a set): gets every final epoch a snapshot computed (the check is not vacuous).
    lazy: -DDTMK_OSQ_LAZY_PUB's worker -- per task hold ; release signal ; head += 1 for the
    previous task's entry if still unpublished (ordered by this signal's MEMBAR) ; the
    entry, unpublished.  In a wait, osq_raise first publishes an unpublished entry (fenced),
    then raises.
    desc: -DDTMK_OSQ_DESC's observers -- a drain also puts each record's map update into the
    warp's shadow (sh[k], its epochs); the shadow moves into the maps (vals) only when it
    holds an epoch < upto, and until then its lowest epoch stays held (keep, and the rounds'
    lows, start from it).  The host then also needs every final epoch's map values in.
    defer (N > 0, with lazy): -DDTMK_OSQ_DEFER=N's worker -- the entry staged after the signal
    (no head bump at the next signal); in a wait all staged entries are stored and published
    at once (fenced) before any raise; staging the N-th flushes them at once.
    multi (D > 1): -DDTMK_OSQ_MULTI=D's observer -- a round runs up to D entries of each worker
    (the oldest ones: a prefix of its backlog) and advances its tail by as many.
    split (NH > 0): -DDTMK_OSQ_SPLIT's observers -- warp k's round in two actors: its builder
    reads the next entry of each busy worker at its own cursor (bcur, not the tail) and queues
    them as one block (at most NH queued); its drainer takes the oldest block as the round's
    entries (records into the ring, then the low, then the tails), and drains as before.
    capped (session 54's kernel): a raise is bounded by the step of the task the worker waits
    for as well (its next records'), so the next task's hold finds OBS_PENDING at or below its
    step and stores nothing."""
    NW, S = n_workers, steps
    NP = 4 if lazy else 3                                   # program points per task
    slice_of = [w % warps for w in range(NW)]

    # state: (wpc, pub, row, head, sig, tail, low, ring, accs, cov, opub, seen, rphase, host)
    #  wpc[w]   worker's program point: NP * task + k (k: 0 hold, 1 entry+signal, 2 head; lazy: 1
    #           signal, 2 the previous entry's head, 3 the entry), NP*S = done; lazy: entries
    #           written = wpc // NP, unpublished while head < that
    #  ring[k]  sorted tuple of epochs in warp k's ring; rphase[k]: None or (lanes, lo) mid-round
    #  accs[k]  ((epoch, count) or None) per parity way; cov[e]: records of epoch e counted
    #  host     None, or (phase, F, rows-so-far)
    #  sh[k]    sorted tuple of epochs of warp k's shadow entries (desc); vals[e]: map updates of
    #           epoch e in the maps
    def steps_finished(sig):
        f = 0
        while f < S and sig[f] == NW:
            f += 1
        return f

    start = (tuple([0] * NW), tuple([INF] * NW), tuple([INF] * NW), tuple([0] * NW), tuple([0] * S),
             tuple([0] * NW), tuple([INF] * NW), tuple(() for _ in range(warps)),
             tuple(((None, None), (None, None)) for _ in range(warps)), tuple([0] * S), tuple([INF] * warps),
             tuple([0] * warps), tuple([None] * warps), None, tuple(() for _ in range(warps)), tuple([0] * S),
             tuple([0] * NW), tuple(() for _ in range(warps)))

    def rep(t, i, v):
        return t[:i] + (v,) + t[i + 1:]

    def succ(st):
        wpc, pub, row, head, sig, tail, low, ring, accs, cov, opub, seen, rphase, host, sh, vals, bcur, hq = st
        out = []
        for w in range(NW):                                 # ---- workers
            pc = wpc[w]
            if pc < NP * S:
                s, k = divmod(pc, NP)
                if k == 0:
                    if mutant in ("no_hold", "cap_one_high_no_hold") or s >= pub[w]:
                        out.append(rep(st, 0, rep(wpc, w, pc + 1)))
                    else:
                        out.append((rep(wpc, w, pc + 1), rep(pub, w, s), rep(row, w, s)) + st[3:])
                elif k == 1:                                # (lazy: no entry yet) the release signal
                    out.append((rep(wpc, w, pc + 1),) + st[1:4] + (rep(sig, s, sig[s] + 1),) + st[5:])
                elif k == 3 and defer and s + 1 - head[w] >= defer:   # the N-th staged: all stored now
                    out.append((rep(wpc, w, pc + 1),) + st[1:3] + (rep(head, w, s + 1),) + st[4:])
                elif k == 2 and lazy and not defer and head[w] < s:   # the previous entry's head, after the MEMBAR
                    out.append((rep(wpc, w, pc + 1),) + st[1:3] + (rep(head, w, head[w] + 1),) + st[4:])
                elif k == 2 and not lazy:
                    out.append((rep(wpc, w, pc + 1),) + st[1:3] + (rep(head, w, head[w] + 1),) + st[4:])
                else:                                       # lazy: nothing to publish / the entry, unpublished
                    out.append(rep(st, 0, rep(wpc, w, pc + 1)))
            if pc % NP == 0 and lazy and head[w] < pc // NP:   # a wait: osq_raise publishes it first
                out.append((wpc,) + st[1:3] + (rep(head, w, pc // NP),) + st[4:])   # (defer: every staged one)
                if mutant != "lazy_raise_unpublished":
                    continue
            if pc % NP == 0:                                # osq_raise in a wait: the low, bounded
                target = low[w]                             # by the oldest entry not yet taken (entry i
                if tail[w] < head[w] and mutant != "raise_any":   # is step i; raise_any: unbounded)
                    target = min(target, tail[w] + (1 if mutant == "raise_past_oldest" else 0))
                if capped:                                  # ... and by the awaited task's step (pc // NP)
                    target = min(target, pc // NP + (1 if mutant == "cap_one_high_no_hold" else 0))
                if target != pub[w]:
                    out.append((wpc, rep(pub, w, target), rep(row, w, target)) + st[3:])
        for k in range(warps):                              # ---- observer warps
            mine = [w for w in range(NW) if slice_of[w] == k]
            if split and len(hq[k]) < split:                # the builder: one block of every busy worker's next entry
                busy = tuple(w for w in mine if bcur[w] < head[w])
                # multi > 1: the block holds up to that many entries of a worker (the kernel's builder
                # hands over the entries of several passes at once; its commit is the cursor after them)
                for counts in itertools.product(*(range(1, min(head[w] - bcur[w], multi) + 1) for w in busy)):
                    if not busy:
                        break
                    b2, t2 = bcur, tail
                    for w, n in zip(busy, counts):
                        b2 = rep(b2, w, b2[w] + n)
                        if mutant == "split_builder_tails":  # (the tails moved at build time: the records not held)
                            t2 = rep(t2, w, t2[w] + n)
                    blk = (tuple((w, 0 if mutant == "split_builder_tails" else n) for w, n in zip(busy, counts)),
                           tuple(bcur[w] + d for w, n in zip(busy, counts) for d in range(n)))
                    out.append(st[:5] + (t2,) + st[6:16] + (b2, rep(hq, k, hq[k] + (blk,))))
            if rphase[k] is None and split:
                if hq[k]:                                   # the drainer: the oldest block is its round's entries
                    lanes, eps = hq[k][0]
                    r2 = tuple(sorted(ring[k] + eps))
                    out.append(st[:7] + (rep(ring, k, r2),) + st[8:11] + (rep(seen, k, max(seen[k], max(eps))),
                               rep(rphase, k, (lanes, min(eps), "low")), host) + st[14:17] + (rep(hq, k, hq[k][1:]),))
                for upto in {seen[k], max(seen[k] - 1, 0), INF}:
                    out.append(drain(st, k, upto, mine))
            elif rphase[k] is None:
                busy = tuple(w for w in mine if tail[w] < head[w])
                # run one entry per lane; multi: any prefix of up to D of each worker's backlog
                # (the room cut may drop the highest lanes)
                for counts in itertools.product(*(range(1, min(head[w] - tail[w], multi) + 1) for w in busy)):
                    if not busy:
                        break
                    lanes = tuple(zip(busy, counts))
                    eps = tuple(tail[w] + d for w, n in lanes for d in range(n))   # entry i of a worker is its step i
                    r2 = tuple(sorted(ring[k] + eps))
                    sn = max(seen[k], max(eps))
                    out.append(st[:7] + (rep(ring, k, r2),) + st[8:11] + (rep(seen, k, sn),
                               rep(rphase, k, (lanes, min(eps), "low")), host) + st[14:])
                for upto in {seen[k], max(seen[k] - 1, 0), INF}:
                    out.append(drain(st, k, upto, mine))
                if mutant == "publish_early" and ring[k]:      # the low from the ways alone, records still in the ring
                    out.append(publish(st, k, min((e for e, _ in accs[k] if e is not None), default=INF), mine))
            else:
                lanes, lo, ph = rphase[k]
                if ph == "low" and mutant != "tail_first" or ph == "low2":
                    a_min = min((e for e, _ in accs[k] if e is not None), default=INF)
                    if desc and mutant not in ("shadow_no_hold", "flush_by_newest_no_hold"):
                        a_min = min(a_min, min(sh[k], default=INF))   # (O.acc_min = keep includes sh_lo)
                    lo2 = min(lo, a_min)
                    l2 = low
                    if lo2 < opub[k]:
                        for w in mine:
                            l2 = rep(l2, w, lo2)
                    nxt = "tail" if ph == "low" else None
                    opk = min(opub[k], lo2)
                    out.append(st[:6] + (l2,) + st[7:10] + (rep(opub, k, opk),) + (seen,
                               rep(rphase, k, (lanes, lo, nxt) if nxt else None), host) + st[14:])
                if ph == "tail" or (ph == "low" and mutant == "tail_first"):
                    t2 = tail
                    for w, n in lanes:
                        t2 = rep(t2, w, t2[w] + n)
                    nxt = None if ph == "tail" else (lanes, lo, "low2")
                    out.append(st[:5] + (t2,) + st[6:12] + (rep(rphase, k, nxt), host) + st[14:])
        if host is None:                                    # ---- host snapshot
            out.append(st[:13] + (("rows", steps_finished(sig), ()),) + st[14:])
        elif host[0] == "rows":
            _, F, rows = host
            if len(rows) < NW:
                out.append(st[:13] + (("rows", F, rows + (row[len(rows)],)),) + st[14:])
            else:
                final = min(F, min(rows)) - 1
                if finals is not None:
                    finals.add(min(final, S - 1))
                for e in range(0, min(final, S - 1) + 1):
                    if cov[e] != NW:
                        return None, f"epoch {e} final (F={F}, rows={rows}) with {cov[e]} of {NW} records counted"
                    if desc and vals[e] != NW:
                        return None, f"epoch {e} final (F={F}, rows={rows}) with {vals[e]} of {NW} map updates in"
        return out, None

    def drain(st, k, upto, mine):
        wpc, pub, row, head, sig, tail, low, ring, accs, cov, opub, seen, rphase, host, sh, vals = st[:16]
        ways, c = list(accs[k]), list(cov)
        shk, v = (tuple(sorted(sh[k] + ring[k])) if desc else ()), list(vals)
        for e in ring[k]:                                   # the VM run: coverage into the ways
            way = ways[e % 2]
            if way[0] is not None and way[0] != e:          # dtmk_cov_add: a new key flushes the old
                c[way[0]] += way[1]
                way = (None, None)
            ways[e % 2] = (e, (way[1] or 0) + 1)
        keep = INF
        if shk and (max(shk) if mutant in ("flush_by_newest", "flush_by_newest_no_hold") else min(shk)) < upto:   # the shadow into the maps, all of it
            for e in shk:
                v[e] += 1
            shk = ()
        if shk and mutant not in ("shadow_no_hold", "flush_by_newest_no_hold"):
            keep = min(shk)                                 # its lowest epoch stays held
        for i, (e, n) in enumerate(ways):                   # the ring is empty: flush epochs < upto
            if e is not None and e < upto:
                c[e] += n
                ways[i] = (None, None)
            elif e is not None:
                keep = min(keep, e)
        return publish((wpc, pub, row, head, sig, tail, low, rep(ring, k, ()), rep(accs, k, tuple(ways)), tuple(c),
                        opub, seen, rphase, host, rep(sh, k, shk), tuple(v)) + st[16:], k, keep, mine)

    def publish(st, k, keep, mine):
        """OSQ_W_LOW of warp k's workers := keep (after the flushes it covers)."""
        if keep == st[10][k]:
            return st
        low = st[6]
        for w in mine:
            low = rep(low, w, keep)
        return st[:6] + (low,) + st[7:10] + (rep(st[10], k, keep),) + st[11:]

    seen_states = {start}
    todo = [start]
    while todo:
        st = todo.pop()
        nxt, bad = succ(st)
        if bad:
            return bad
        for n in nxt:
            if n not in seen_states:
                seen_states.add(n)
                todo.append(n)
                if len(seen_states) > limit:
                    raise RuntimeError(f"more than {limit} states")
    return None


@pytest.mark.parametrize("n_workers, steps, warps", [(2, 2, 1), (2, 2, 2), (1, 3, 1)])
def test_every_final_epoch_is_complete(n_workers, steps, warps):
    finals = set()
    assert check(n_workers, steps, warps, finals=finals) is None
    assert finals == set(range(-1, steps)), finals        # snapshots saw every epoch become final


@pytest.mark.parametrize("mutant", ["tail_first", "raise_any", "raise_past_oldest", "no_hold", "publish_early"])
def test_the_checker_catches_a_broken_protocol(mutant):
    assert check(2, 2, 1, mutant=mutant) is not None


@pytest.mark.parametrize("n_workers, steps, warps", [(2, 2, 1), (2, 2, 2), (1, 3, 1)])
def test_lazy_publish_keeps_every_final_epoch_complete(n_workers, steps, warps):
    """-DDTMK_OSQ_LAZY_PUB: a task's entry written after its signal, its head after the next
    one's (or in the next wait, fenced): no store waits on the signal's MEMBAR."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, lazy=True) is None
    assert finals == set(range(-1, steps)), finals


@pytest.mark.parametrize("n_workers, steps, warps, defer", [(2, 2, 1, 0), (2, 2, 2, 16), (1, 3, 1, 16), (1, 3, 1, 0)])
def test_a_raise_capped_at_the_awaited_step_keeps_every_final_epoch_complete(n_workers, steps, warps, defer):
    """Session 54: osq_raise bounded by the awaited task's step too.  Every final epoch stays
    complete and every epoch still becomes final.  The hold stays: a task that no raise
    preceded (a launch's first, one ready at its first look after a higher pending) still
    needs it -- without it the model finds a violation even capped.  A cap one step too high
    is caught when nothing lowers it again."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, lazy=True, defer=defer, capped=True) is None
    assert finals == set(range(-1, steps)), finals
    assert check(n_workers, steps, warps, mutant="no_hold", lazy=True, defer=defer, capped=True) is not None
    assert check(n_workers, steps, warps, mutant="cap_one_high_no_hold", lazy=True, defer=defer, capped=True) is not None


@pytest.mark.parametrize("mutant", ["lazy_raise_unpublished", "no_hold", "raise_past_oldest"])
def test_the_checker_catches_a_broken_lazy_protocol(mutant):
    assert check(2, 2, 1, mutant=mutant, lazy=True) is not None


@pytest.mark.parametrize("n_workers, steps, warps", [(2, 2, 1), (2, 2, 2), (1, 3, 1)])
def test_descriptor_shadow_keeps_every_final_epoch_complete(n_workers, steps, warps):
    """-DDTMK_OSQ_DESC (session 18) with the lazy publish: the observers' map updates wait in
    a shadow per warp and move into the maps only when it holds an epoch < upto; its lowest
    epoch stays held meanwhile, so a final epoch has its map values as well as its coverage."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, lazy=True, desc=True) is None
    assert finals == set(range(-1, steps)), finals


def test_the_shadow_s_hold_is_what_lets_it_flush_late():
    """The hold (keep and the rounds' lows start from the shadow's lowest epoch): with the
    kernel's flush condition (the LOWEST shadow epoch < upto) the model finds no interleaving
    that needs it -- a coverage way is flushed early only by a record two epochs newer, and
    then upto is past the shadow's epoch too (1 worker x 3 steps; 2 x 2).  It is what keeps a
    lazier flush exact: flushing only once the NEWEST entry is < upto is caught without the
    hold and passes with it."""
    assert check(1, 3, 1, mutant="shadow_no_hold", lazy=True, desc=True) is None
    assert check(2, 2, 1, mutant="shadow_no_hold", lazy=True, desc=True) is None
    assert check(2, 2, 1, mutant="flush_by_newest_no_hold", lazy=True, desc=True) is not None
    assert check(2, 2, 1, mutant="flush_by_newest", lazy=True, desc=True) is None


@pytest.mark.parametrize("n_workers, steps, warps, cap", [(2, 2, 1, 4), (2, 2, 2, 4), (1, 3, 1, 4), (1, 3, 1, 2),
                                                          (2, 2, 1, 1), (2, 2, 1, 16), (1, 3, 1, 16)])
def test_deferred_entries_keep_every_final_epoch_complete(n_workers, steps, warps, cap):
    """-DDTMK_OSQ_DEFER=N (session 24): entries staged in shared memory after the signal and
    stored by a later wait (or at once when N are staged) -- the host never calls an epoch
    final while one of its entries is staged, because a raise stores them first."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, lazy=True, defer=cap) is None
    assert finals == set(range(-1, steps)), finals


@pytest.mark.parametrize("n_workers, steps, warps, multi", [(2, 3, 1, 2), (1, 3, 1, 3), (2, 2, 2, 2)])
def test_several_entries_of_a_worker_per_round_keep_every_final_epoch_complete(n_workers, steps, warps, multi):
    """-DDTMK_OSQ_MULTI (session 26): a round takes up to D entries of one worker; the lows
    still cover them before the tail passes them (with the deferred, lazy worker too)."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, multi=multi) is None
    assert check(n_workers, steps, warps, lazy=True, defer=2, multi=multi) is None
    assert finals >= {-1, 0, steps - 1}, finals


@pytest.mark.parametrize("mutant", ["tail_first", "raise_past_oldest"])
def test_the_checker_catches_a_broken_protocol_with_several_entries_per_round(mutant):
    assert check(2, 3, 1, mutant=mutant, multi=2) is not None


def test_a_raise_past_staged_entries_is_caught():
    assert check(2, 2, 1, mutant="lazy_raise_unpublished", lazy=True, defer=4) is not None
    assert check(1, 3, 1, mutant="lazy_raise_unpublished", lazy=True, defer=4) is not None


@pytest.mark.parametrize("n_workers, steps, warps, nh", [(2, 2, 1, 2), (2, 2, 2, 2), (1, 3, 1, 2), (2, 2, 1, 1)])
def test_split_build_and_drain_keep_every_final_epoch_complete(n_workers, steps, warps, nh):
    """-DDTMK_OSQ_SPLIT (session 35): the builder reads entries ahead of the tail and queues
    their records in blocks; the drainer moves the tails only after their epochs are held --
    with the plain, the lazy and the deferred worker."""
    finals = set()
    assert check(n_workers, steps, warps, finals=finals, split=nh) is None
    assert finals == set(range(-1, steps)), finals
    assert check(n_workers, steps, warps, lazy=True, defer=2, split=nh) is None
    assert check(n_workers, steps, warps, lazy=True, defer=2, split=nh, multi=2) is None   # (blocks of several passes)


@pytest.mark.parametrize("mutant", ["split_builder_tails", "tail_first", "raise_past_oldest"])
def test_the_checker_catches_a_broken_split(mutant):
    """The split's own way to break it: the builder moving the tails as it reads the entries
    (its records in flight to the drainer, held by nobody)."""
    assert check(2, 2, 1, mutant=mutant, split=2) is not None
    assert check(2, 2, 1, mutant=mutant, split=1, multi=2) is not None
