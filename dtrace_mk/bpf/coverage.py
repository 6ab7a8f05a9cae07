"""Coverage accounting: how much of what a monitor should have seen it actually saw.

One `Coverage` row per (program, hook, epoch, program_gen):

  eligible   the hook fired with the program attached
  throttled  skipped before running (sampling, rate limit), or it ran but its evidence
             was refused by a byte budget (ring buffer budget, trace_printk budget)
  lost       it ran but some result was lost: map full, ring full, helper error, VM
             fault or instruction budget exhausted
  executed   everything else

Each eligible event lands in exactly one bucket; when several things happen in one run
the precedence is lost > throttled > executed.  Invariant, always exact:

    eligible == executed + throttled + lost

`program_gen` is the hook's program-table generation (bumped on every attach/detach of
that hook); a generation change inside an epoch starts a new row, so every row counts
events seen by one program table.  `reasons` counts why events were throttled or lost
("sampled", "map_full:counts", "fault", ...): diagnostic detail, not part of the
invariant (one event may have several reasons).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

EXECUTED, THROTTLED, LOST = "executed", "throttled", "lost"
OUTCOMES = (EXECUTED, THROTTLED, LOST)


class CoverageError(AssertionError):
    """The invariant eligible == executed + throttled + lost does not hold (a bug)."""


def classify(lost: Sequence[str] = (), throttled: Sequence[str] = ()) -> str:
    """The one bucket of an event, by precedence lost > throttled > executed."""
    if lost:
        return LOST
    if throttled:
        return THROTTLED
    return EXECUTED


@dataclass
class Coverage:
    program: str
    hook: str
    epoch: int
    program_gen: int
    eligible: int = 0
    executed: int = 0
    throttled: int = 0
    lost: int = 0
    reasons: Dict[str, int] = field(default_factory=dict)

    def record(self, outcome: str, reasons: Iterable[str] = ()) -> None:
        """Count one eligible event in the bucket `outcome`."""
        if outcome == EXECUTED:
            self.executed += 1
        elif outcome == THROTTLED:
            self.throttled += 1
        elif outcome == LOST:
            self.lost += 1
        else:
            raise ValueError(f"unknown coverage outcome {outcome!r}")
        self.eligible += 1
        for r in reasons:
            self.reasons[r] = self.reasons.get(r, 0) + 1

    def check(self) -> None:
        if self.eligible != self.executed + self.throttled + self.lost or min(
                self.eligible, self.executed, self.throttled, self.lost) < 0:
            raise CoverageError(
                f"coverage of {self.program} on {self.hook} epoch {self.epoch}: eligible "
                f"{self.eligible} != executed {self.executed} + throttled {self.throttled} + "
                f"lost {self.lost}")

    @property
    def key(self) -> Tuple[str, str, int, int]:
        return (self.program, self.hook, self.epoch, self.program_gen)

    @property
    def ratio(self) -> float:
        """executed / eligible (1.0 when nothing was eligible)."""
        return self.executed / self.eligible if self.eligible else 1.0

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)

    def merge(self, other: "Coverage") -> None:
        """Add another row's counts (e.g. the same program from another rank)."""
        self.eligible += other.eligible
        self.executed += other.executed
        self.throttled += other.throttled
        self.lost += other.lost
        for r, n in other.reasons.items():
            self.reasons[r] = self.reasons.get(r, 0) + n


class CoverageTable:
    """Rows keyed by (program, hook, epoch, program_gen), in first-seen order."""

    def __init__(self) -> None:
        self._rows: Dict[Tuple[str, str, int, int], Coverage] = {}

    def row(self, program: str, hook: str, epoch: int, program_gen: int) -> Coverage:
        k = (program, hook, epoch, program_gen)
        c = self._rows.get(k)
        if c is None:
            c = self._rows[k] = Coverage(program, hook, epoch, program_gen)
        return c

    def record(self, program: str, hook: str, epoch: int, program_gen: int, outcome: str,
               reasons: Iterable[str] = ()) -> None:
        self.row(program, hook, epoch, program_gen).record(outcome, reasons)

    def rows(self) -> List[Coverage]:
        return list(self._rows.values())

    def retire_epochs(self, upto: int) -> None:
        """Forget the rows of epochs <= upto (a consumer that has shipped them keeps
        memory bounded)."""
        for k in [k for k in self._rows if k[2] <= upto]:
            del self._rows[k]

    def check(self) -> None:
        for c in self._rows.values():
            c.check()

    def totals(self, program: Optional[str] = None) -> Coverage:
        """All rows (of one program) summed into one row (epoch -1, gen -1)."""
        t = Coverage(program or "*", "*", -1, -1)
        for c in self._rows.values():
            if program is None or c.program == program:
                t.merge(c)
        return t


def check_all(rows: Iterable[Coverage]) -> None:
    for c in rows:
        c.check()
