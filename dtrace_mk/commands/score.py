"""`dtrace-mk score RESULT.json --scenario FILE`: compare a diagnosis with the faults the
scenario injected (precision, recall, false-confident findings)."""
from __future__ import annotations

import json

NAME = "score"
HELP = "score a diagnosis result against its scenario's faults"
DESCRIPTION = """\
Compare a diagnosis result (the JSON that 'dtrace-mk diagnose' writes) with the faults
its scenario file injected.  A finding matches a fault when the cause, the root-cause
rank, the task class or comm op (when the fault names one) agree and the steps overlap.
Prints precision, recall and the false-confident findings (confidence >= 0.8 that
match no fault)."""
ORDER = 60


def add_arguments(p) -> None:
    p.add_argument("result", metavar="RESULT.json", help="diagnosis result file")
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file (YAML or JSON)")
    p.add_argument("--json", action="store_true", help="print the score as JSON")


def run(args) -> int:
    from dtrace_mk.collectors.scenario import load_scenario
    from dtrace_mk.collectors.score import load_result, score
    scenario = load_scenario(args.scenario)
    result = load_result(args.result)
    rep = score(result, scenario)
    print(json.dumps(rep.as_dict(), indent=2) if args.json else rep.render())
    return 0
