"""Golden files of the language: one query per file, discovered, regenerated on demand.

File format (tests/lang/golden/NAME.golden), sections introduced by '=== NAME':

    === query
    task:end { @[task.class] = count(); }
    === events
    decode.jsonl                  (a file under tests/lang/golden/events/)
    === format                    (optional: text (default) or json)
    json
    === disassembly               (generated: every program, dtrace_mk.bpf.asm)
    ...
    === output                    (generated: printed output over the events)
    ...

Adding a case is writing the first two sections and running
`DTRACE_MK_UPDATE_GOLDEN=1 pytest tests/lang/test_golden.py`; without the variable the
test compares and shows a diff.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

from dtrace_mk.abi import context
from dtrace_mk.lang import host, printing
from dtrace_mk.lang.pipeline import compile_query

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
EVENTS = GOLDEN / "events"
INPUT_SECTIONS = ("query", "events", "format")
ORDER = ("query", "events", "format", "disassembly", "output")

_event_cache: Dict[str, list] = {}


def parse_golden(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    cur = None
    for line in text.splitlines(keepends=True):
        if line.startswith("=== "):
            cur = line[4:].strip()
            out[cur] = ""
        elif cur is not None:
            out[cur] += line
    return out


def format_golden(sections: Dict[str, str]) -> str:
    parts = []
    for k in ORDER:
        if k in sections:
            body = sections[k]
            if body and not body.endswith("\n"):
                body += "\n"
            parts.append(f"=== {k}\n{body}")
    return "".join(parts)


def events(name: str) -> list:
    if name not in _event_cache:
        _event_cache[name] = context.read_events(EVENTS / name)
    return _event_cache[name]


def regenerate(sections: Dict[str, str]) -> Dict[str, str]:
    """Compile the query, disassemble, run it over the events, render the output."""
    query = sections["query"].rstrip("\n")
    res = compile_query(query)
    out = {k: sections[k] for k in INPUT_SECTIONS if k in sections}
    out["disassembly"] = res.disassembly()
    blocks = host.run_events(res.obj, events(sections["events"].strip()), res.plan)
    fmt = sections.get("format", "text").strip() or "text"
    out["output"] = printing.render_json(blocks) if fmt == "json" else printing.render_text(blocks)
    return out
