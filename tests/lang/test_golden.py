"""Golden tests: query -> disassembly -> printed output over a recorded event file.

Every file under tests/lang/golden/*.golden is one case (format: golden_util.py).
Set DTRACE_MK_UPDATE_GOLDEN=1 to rewrite the generated sections.
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_events  # noqa: E402
import golden_util as gu  # noqa: E402

UPDATE = os.environ.get("DTRACE_MK_UPDATE_GOLDEN") == "1"
CASES = sorted(gu.GOLDEN.glob("*.golden"))


def test_enough_cases():
    assert len(CASES) >= 40, f"only {len(CASES)} golden queries"


def test_the_verifier_runs_on_every_golden_query():
    from dtrace_mk.lang.passes import verify as verify_pass
    assert verify_pass.AVAILABLE, "dtrace_mk.bpf.verifier.verify is missing: goldens would be unverified"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path: Path):
    text = path.read_text()
    sections = gu.parse_golden(text)
    assert "query" in sections and "events" in sections, f"{path}: needs '=== query' and '=== events'"
    want = gu.format_golden(gu.regenerate(sections))
    if UPDATE:
        if want != text:
            path.write_text(want)
        return
    if want != text:
        diff = "".join(difflib.unified_diff(text.splitlines(True), want.splitlines(True),
                                            "expected (file)", "got"))
        pytest.fail(f"{path.name} differs (DTRACE_MK_UPDATE_GOLDEN=1 to accept):\n{diff}")


@pytest.mark.parametrize("kind", gen_events.KINDS)
def test_event_files_are_reproducible(kind):
    path = gu.EVENTS / f"{kind}.jsonl"
    if UPDATE:
        path.write_text(gen_events.render(kind))
    assert path.read_text() == gen_events.render(kind), \
        f"{path} is not what tests/lang/gen_events.py writes; run it"
