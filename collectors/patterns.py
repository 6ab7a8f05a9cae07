"""Wait-state patterns: one declarative record each (in the manner of Scalasca's pattern
specifications).  Code constants, the fault-kind mapping and `docs/patterns.md` are all
derived from `PATTERNS`; the detectors live in `collectors/classify.py` (one per concrete
pattern, registered by id) and the upstream delay analysis in `collectors/rootcause.py`.

Notation used in the definitions (all times on the aligned clock, see `collectors.clock`):

* a joined wait `w` = a `RemoteWait` on receiver `r` for sender `p` and key
  `(comm_op, comm_gen)`, with `S` = the release (the last `Signal` of that key from `p` to
  `r`, clamped so that `S <= wait_end - min_latency`);
* per `(rank, epoch)` and task class `c`, an `EpochSummary` gives sums over the class's
  tasks; `excess(m) = m_sum - count * base_c(m)` where `base_c(m)` is the class's robust
  per-task baseline of metric `m` (25th percentile of `m_sum / count` over all ranks and
  epochs);
* a value is *anomalous* when it exceeds `center + max(abs_floor, rel * expected,
  k * scale)`, with `center`/`scale` robust statistics over all ranks and epochs (see
  `classify.Threshold`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Pattern:
    id: str
    parent: Optional[str]
    name: str
    info: str              # one line
    definition: str        # precise, in terms of record fields
    diagnosis: str         # what to do about it
    unit: str
    abstract: bool = False  # a group: no detector, never a finding's cause
    fault_kinds: Tuple[str, ...] = ()   # scenario fault kinds whose cause this is


PATTERNS: Tuple[Pattern, ...] = (
    Pattern(
        id="wait_time", parent=None, name="Wait time", abstract=True, unit="us",
        info="Time a rank's tasks spent not doing their own work.",
        definition="The sum of all wait states below, per rank and epoch.",
        diagnosis="Descend into the child patterns; the largest child names the cause."),
    Pattern(
        id="remote_wait", parent="wait_time", name="Remote wait", abstract=True, unit="us",
        info="Time a task spent in comm:wait on an event owned by another rank.",
        definition="For each RemoteWait: wait_end - wait_begin.  It splits into the late-"
                   "sender part (remote_stall) and the rest (transfer or local).",
        diagnosis="See remote_stall; a remote wait that is mostly transfer points at the "
                  "interconnect, not at either rank's scheduler."),
    Pattern(
        id="remote_stall", parent="remote_wait", name="Remote stall (late sender)", unit="us",
        fault_kinds=("late_comm",),
        info="The remote data was not there yet: the sender signalled late.",
        definition="For a joined wait w: late(w) = max(0, min(S, wait_end) - wait_begin), "
                   "S the sender's last signal.  Only a rank's own lateness counts: each "
                   "rank's sync point is its step start (summaries' first hook, aligned "
                   "clock) or, if later, the end of its latest earlier wait of the step in "
                   "an all-reduce in which sender and receiver signalled each other (both "
                   "leave it together); with d = the sender's sync point before S minus "
                   "the receiver's before wait_begin (launch skew, or a rank held longer), "
                   "late_own(w) = max(0, S - d - wait_begin).  A wait is a stall when "
                   "late_own(w) minus its baseline (the larger 25th percentile over the "
                   "steps of the receiver's series (receiver, comm_op, layer; at least 4 "
                   "steps) and the sender's (sender, comm_op, layer; one value per step, "
                   "covering at least 3/4 of the steps), capped at 50 us; else 0: a small lateness every step "
                   "shows is normal) is anomalous over all joined waits, or when "
                   "transfer(w) = wait_end - max(wait_begin, S) exceeds its baseline; the "
                   "stall is that excess.  Its cost is followed upstream (rootcause.py): "
                   "the sender's delay since the last point both ranks share (its previous "
                   "wait on the receiver: its end, or its begin when the receiver was late "
                   "there, but no earlier than the receiver passed that all-reduce; its "
                   "latest wait on a third rank in an all-reduce the receiver also "
                   "signalled it in: its end, likewise clipped; or its previous signal to "
                   "the receiver) is split into direct cost and the late "
                   "parts of the sender's own remote waits in that interval (indirect; other "
                   "ranks' waits of the same all-reduce excepted, and waits that had not "
                   "ended when S left: another worker's, they cannot have delayed it), scaled to late(w) (for the "
                   "stalled wait, with b = the part of late(w) not in the stall (skew or "
                   "usual lateness), the indirect share is min(max(I - b, 0), late(w) - b) / "
                   "(late(w) - b): that part is explained first by the sender's waiting); "
                   "the indirect part recurses into those senders.  The finding's rank is the "
                   "rank holding the direct cost (the root); observed_on lists the waiting "
                   "ranks (the root excepted).  A RemoteWait starts no earlier than the last "
                   "local producer of the awaited event ended (the agent's rule: before, the "
                   "task also waited on local work; it makes the GPU's comm:wait, whose "
                   "wait_ns is the whole dependency wait, equivalent to the sim's).  If the root rank has a local finding in the same or an adjacent "
                   "epoch whose own impact there is at least half the cost, the cost is folded "
                   "into that finding instead (the waiting ranks are never blamed).",
        diagnosis="Look at the root rank, not at the rank that waited: its comm task for "
                  "comm_op was late (delayed signal, or slow work before it).  If the root "
                  "holds a local finding, fix that one."),
    Pattern(
        id="local_delay", parent="wait_time", name="Local delay", abstract=True, unit="us",
        info="Time lost on the rank itself, with its inputs available.",
        definition="Dispatch wait, local dependency wait and excess task time per rank "
                   "and epoch (EpochSummary).",
        diagnosis="Descend into the child patterns."),
    Pattern(
        id="local_imbalance", parent="local_delay", name="Local scheduler imbalance",
        unit="us", fault_kinds=("starve_ready",),
        info="The data or dependency was there; the local scheduler did not run the ready work.",
        definition="For rank r, epoch e, class c: excess(dispatch_wait) is anomalous (ready "
                   "-> dispatch took longer than the class's baseline, so the dependency was "
                   "already satisfied), at least dispatch_work_rel (1%) of the class's task "
                   "time dur_sum in (r, e), and no queue_saturation, slow_task_class, "
                   "late_notification or routing_skew finding on (r, e) explains it.  "
                   "Impact: excess(dispatch_wait).",
        diagnosis="The in-kernel scheduler left ready tasks of this class waiting while "
                  "workers were free: check the dispatch policy, per-SM plans and "
                  "priorities for the class."),
    Pattern(
        id="queue_saturation", parent="local_imbalance", name="Queue saturation", unit="tasks",
        fault_kinds=("queue_saturation",),
        info="A worker queue held far more tasks than usual, so ready work queued behind it.",
        definition="For rank r, epoch e: queue_depth_max is anomalous over all ranks and "
                   "epochs.  The finding names queue_depth_worker.  Impact: the summed "
                   "excess dispatch wait of all classes on (r, e).",
        diagnosis="One worker was oversubscribed: rebalance the static plan or let the "
                  "dynamic queue steal from it."),
    Pattern(
        id="late_notification", parent="local_delay", name="Late dependency notification",
        unit="us", fault_kinds=("late_notification",),
        info="A producer finished but the event it signals was released late.",
        definition="For rank r, epoch e, producer class c: excess(notify_lag) (task:end of "
                   "the producer -> dep:release of its event) is anomalous, and at least "
                   "notify_work_rel (1%) of the class's task time dur_sum in (r, e) (a lag of "
                   "a few ns per task summed over thousands of parallel tasks moves no step).  "
                   "Impact: excess(notify_lag).",
        diagnosis="The dependency notification path (event counter update, fence, or "
                  "polling) is slow for this class; its consumers sat in dep:wait."),
    Pattern(
        id="slow_task_class", parent="local_delay", name="Slow task class", unit="us",
        fault_kinds=("slow_task_class",),
        info="Tasks of one class ran longer than their baseline.",
        definition="For rank r, epoch e, class c: excess(dur) (task:begin -> task:end) is "
                   "anomalous and no routing_skew finding on (r, e) explains it (for the MoE "
                   "expert class).  Impact: excess(dur).",
        diagnosis="The class's device function is slower on this rank: look at the tile "
                  "(PC sampling on that function), clocks, or contention."),
    Pattern(
        id="routing_skew", parent="local_delay", name="MoE routing skew", unit="share",
        fault_kinds=("routing_skew",),
        info="The router sent a much larger share of tokens to one expert than usual.",
        definition="For rank r, epoch e: share = max(expert_counts) / sum(expert_counts); "
                   "its excess over the median share of the other ranks in epoch e (tensor-"
                   "parallel ranks route the same tokens with a replicated router) is "
                   "anomalous over all ranks and epochs (one rank: the share itself, over "
                   "all epochs).  expert_counts is the agent's task time per expert, which "
                   "grows with the tokens routed to it.  The finding names the expert.  "
                   "Impact: the excess of the expert class's dur_max over its baseline "
                   "(the longest expert task sits on the critical path; a lower bound).",
        diagnosis="Routing is skewed toward one expert: capacity factor, load-balancing "
                  "loss, or replicate the hot expert."),
)

PATTERN_BY_ID: Dict[str, Pattern] = {p.id: p for p in PATTERNS}
#: The causes a finding can name (concrete patterns).
CAUSES: Tuple[str, ...] = tuple(p.id for p in PATTERNS if not p.abstract)

REMOTE_STALL = "remote_stall"
LOCAL_IMBALANCE = "local_imbalance"
QUEUE_SATURATION = "queue_saturation"
LATE_NOTIFICATION = "late_notification"
SLOW_TASK_CLASS = "slow_task_class"
ROUTING_SKEW = "routing_skew"

#: Scenario fault kind -> the cause a correct diagnosis names.
FAULT_KIND_CAUSE: Dict[str, str] = {k: p.id for p in PATTERNS for k in p.fault_kinds}


def children(pattern_id: Optional[str]) -> List[Pattern]:
    return [p for p in PATTERNS if p.parent == pattern_id]


def render_markdown() -> str:
    """docs/patterns.md, generated from PATTERNS (tests check the file is up to date)."""
    out = ["# Wait-state patterns",
           "",
           "<!-- Generated by dtrace_mk.collectors.patterns.render_markdown(); do not edit. -->",
           "",
           "Each pattern is one record in `collectors/patterns.py`; its detector is in "
           "`collectors/classify.py`, the upstream delay analysis of remote stalls in "
           "`collectors/rootcause.py`.  A finding's `cause` is one of the concrete "
           "patterns: " + ", ".join(f"`{c}`" for c in CAUSES) + ".",
           "",
           "## Hierarchy",
           ""]

    def tree(pid, depth):
        for p in children(pid):
            out.append("  " * depth + f"- `{p.id}`" + (" (group)" if p.abstract else "")
                       + f": {p.info}")
            tree(p.id, depth + 1)
    tree(None, 0)
    out += ["", "## Fault kinds and causes", "", "| scenario fault kind | cause |", "|---|---|"]
    for k, c in FAULT_KIND_CAUSE.items():
        out.append(f"| `{k}` | `{c}` |")
    for p in PATTERNS:
        out += ["", f"## `{p.id}` — {p.name}", "",
                f"*{p.info}*", "",
                f"- parent: {('`' + p.parent + '`') if p.parent else '(none)'}",
                f"- unit: {p.unit}",
                f"- group: {'yes (never a cause)' if p.abstract else 'no'}",
                "", "**Definition.** " + p.definition, "",
                "**Diagnosis.** " + p.diagnosis]
    return "\n".join(out) + "\n"
