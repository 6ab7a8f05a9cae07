"""Error tests: bad queries and the exact rendered diagnostic (file:line:col, message,
the source line and the caret), as the CLI prints it.

Cases live in tests/lang/errors.golden, one per block:

    ### short description
    <query, one or more lines>
    ---
    <expected rendering>

DTRACE_MK_UPDATE_GOLDEN=1 rewrites the expected renderings (review the diff!).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple

import pytest

from dtrace_mk.lang.diagnostics import CompileError
from dtrace_mk.lang.pipeline import compile_query

FILE = Path(__file__).resolve().parent / "errors.golden"
UPDATE = os.environ.get("DTRACE_MK_UPDATE_GOLDEN") == "1"


def load() -> List[Tuple[str, str, str]]:
    cases, title, query, expect, part = [], None, [], [], None
    for line in FILE.read_text().splitlines():
        if line.startswith("### "):
            if title is not None:
                cases.append((title, "\n".join(query), "\n".join(expect).rstrip("\n")))
            title, query, expect, part = line[4:].strip(), [], [], "q"
        elif line == "---" and part == "q":
            part = "e"
        elif part == "q":
            query.append(line)
        elif part == "e":
            expect.append(line)
    if title is not None:
        cases.append((title, "\n".join(query), "\n".join(expect).rstrip("\n")))
    return cases


CASES = load()


def render(query: str) -> str:
    try:
        compile_query(query)
    except CompileError as e:
        return str(e)
    return "<compiled without error>"


def _rewrite_expected() -> None:
    out = []
    for title, q, _ in CASES:
        out.append(f"### {title}\n{q}\n---\n{render(q)}\n")
    FILE.write_text("\n".join(out))


if UPDATE:      # DTRACE_MK_UPDATE_GOLDEN=1 pytest tests/lang/test_errors.py rewrites, then compares
    _rewrite_expected()
    CASES = load()


def test_enough_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("title,query,expected", CASES, ids=[c[0] for c in CASES])
def test_error(title, query, expected):
    got = render(query)
    assert got == expected, f"{title}\n--- expected\n{expected}\n--- got\n{got}"
