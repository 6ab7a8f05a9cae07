"""The diagnosis's first line (launch.launcher.summary_lines, what launch / demo / serve
print): the count it names is the confident findings' (>= score.CONFIDENT); a verdict
"fault" that rests only on findings below that (the classifier's verdict threshold is
lower) says so instead of "0 finding(s)"."""
import pytest

from dtrace_mk.launch.launcher import summary_lines


def _f(conf):
    return {"cause": "late_notification", "rank": 0, "task_class": "qkv", "steps": [4, 5, 9],
            "observed_on": [0], "confidence": conf, "impact_us": 40.0}


@pytest.mark.parametrize("verdict, confs, first", [
    ("none", [], "verdict none: 0 finding(s)"),
    ("fault", [0.93], "verdict fault: 1 finding(s)"),
    ("fault", [0.93, 0.6], "verdict fault: 1 finding(s) (+ 1 below confidence 0.80)"),
    ("fault", [0.75, 0.6], "verdict fault: no finding at confidence 0.80 or more (2 below it, listed apart)"),
])
def test_the_first_line_counts_confident_findings(verdict, confs, first):
    res = {"verdict": verdict, "findings": [_f(c) for c in confs],
           "coverage": {"eligible": 10, "executed": 10, "throttled": 0, "lost": 0}}
    lines = summary_lines(res)
    assert lines[0] == first
    assert sum("late_notification rooted at rank 0 (qkv), steps 4-5, 9" in ln for ln in lines) == len(confs)
