from pathlib import Path

from dtrace_mk.collectors import classify, patterns
from dtrace_mk.collectors.scenario import FAULT_PARAMS

DOC = Path(__file__).resolve().parents[2] / "docs" / "patterns.md"


def test_records_are_well_formed():
    ids = [p.id for p in patterns.PATTERNS]
    assert len(ids) == len(set(ids))
    for p in patterns.PATTERNS:
        assert p.parent is None or p.parent in patterns.PATTERN_BY_ID, p.id
        assert "\n" not in p.info and p.definition and p.diagnosis and p.unit
    assert set(patterns.CAUSES) == {"remote_stall", "local_imbalance", "queue_saturation",
                                    "late_notification", "slow_task_class", "routing_skew"}


def test_every_cause_has_exactly_one_detector_in_the_order():
    assert set(classify.DETECTORS) == set(patterns.CAUSES)
    assert sorted(classify.DETECTION_ORDER) == sorted(patterns.CAUSES)


def test_fault_kind_mapping_matches_the_issue():
    assert patterns.FAULT_KIND_CAUSE == {
        "late_comm": "remote_stall", "starve_ready": "local_imbalance",
        "slow_task_class": "slow_task_class", "routing_skew": "routing_skew",
        "late_notification": "late_notification", "queue_saturation": "queue_saturation"}
    assert set(FAULT_PARAMS) == set(patterns.FAULT_KIND_CAUSE)


def test_docs_patterns_md_is_up_to_date():
    want = patterns.render_markdown()
    assert DOC.read_text() == want, (
        "docs/patterns.md is stale: regenerate with\n  .venv/bin/python -c 'from dtrace_mk."
        "collectors.patterns import render_markdown; open(\"docs/patterns.md\",\"w\")"
        ".write(render_markdown())'")
    for p in patterns.PATTERNS:
        assert f"## `{p.id}`" in want
