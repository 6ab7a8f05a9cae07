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


def test_enough_cases():
    assert len(CASES) >= 25


def test_update():
    if not UPDATE:
        pytest.skip("set DTRACE_MK_UPDATE_GOLDEN=1 to rewrite errors.golden")
    out = []
    for title, q, _ in CASES:
        out.append(f"### {title}\n{q}\n---\n{render(q)}\n")
    FILE.write_text("\n".join(out))


@pytest.mark.parametrize("title,query,expected", CASES, ids=[c[0] for c in CASES])
def test_error(title, query, expected):
    if UPDATE:
        pytest.skip("updating")
    got = render(query)
    assert got == expected, f"{title}\n--- expected\n{expected}\n--- got\n{got}"
