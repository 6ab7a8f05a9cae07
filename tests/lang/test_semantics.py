"""What compiled queries compute: expressions, predicates, aggregations and map layouts,
checked by running the generated programs on the reference runtime."""
from __future__ import annotations

import pytest

from dtrace_mk.abi import context
from dtrace_mk.abi import definition as abi
from dtrace_mk.lang import host, printing
from dtrace_mk.lang.passes import verify as verify_pass
from dtrace_mk.lang.passes.lower import Options
from dtrace_mk.lang.pipeline import compile_query, plan_of

U64 = (1 << 64) - 1


def run(query, records, **kw):
    res = compile_query(query, options=kw.pop("options", None))
    return res, host.run_events(res.obj, records, res.plan, **kw)


def block(blocks, name):
    return next(b for b in blocks if b.get("type") == "map" and b["name"] == name)


A, B = 1_000_003, 77


@pytest.mark.parametrize("expr,want", [
    ("task.dur_ns", A),
    ("(task.dur_ns - task.wait_ns) * 2 + 1", (A - B) * 2 + 1),
    ("task.dur_ns / 3 % 7", A // 3 % 7),
    ("task.dur_ns << 2 >> 1", (A << 2) >> 1),
    ("~task.dur_ns & 0xff", ~A & 0xFF),
    ("-task.wait_ns", (-B) & U64),
    ("task.wait_ns - task.dur_ns", (B - A) & U64),
    ("task.dur_ns > task.wait_ns", 1),
    ("task.dur_ns < task.wait_ns", 0),
    ("!(task.dur_ns == 1000003)", 0),
    ("task.dur_ns && 0", 0),
    ("task.wait_ns || 0", 1),
    ("task.dur_ns ^ task.wait_ns | 1", (A ^ B) | 1),
    ("0x123456789", 0x123456789),
    ("1s + 2ms + 3us + 4ns", 1_002_003_004),
    ("task.class == \"attn\"", 1),
    ("probe", abi.HOOKS_BY_NAME["task:end"].id),
    ("FLAG_FAULT | FLAG_REMOTE", abi.FLAG_FAULT | abi.FLAG_REMOTE),
    ("task.dur_ns / (task.wait_ns - 77)", 0),          # eBPF: division by zero is 0
    ("task.dur_ns % (task.wait_ns - 77)", A),          # modulo by zero keeps the dividend
    ("task.dur_ns && 1", 1),                           # folded to task.dur_ns != 0
    ("(2 > 1) || task.dur_ns", 1),
    ("10 * 1000 - 1", 9999),
])

def test_expression_values(expr, want):
    rec = context.pack("task:end", dur_ns=A, wait_ns=B, task_class=3)
    _, blocks = run(f"task:end {{ @v = sum({expr}); }}", [rec])
    assert block(blocks, "@v")["entries"][0]["value"] == want


def test_predicates_and_scratch_variables():
    recs = [context.pack("task:end", dur_ns=d, task_class=c, layer=l)
            for d, c, l in [(10, 3, 0), (30_000, 3, 1), (50_000, 1, 1), (70_000, 3, 2)]]
    _, blocks = run('task:end /task.class == "attn" && task.dur_ns > 20us/ '
                    '{ $ms = task.dur_ns / 1000; @n[task.layer] = sum($ms); }', recs)
    assert [(e["key"], e["value"]) for e in block(blocks, "@n")["entries"]] == [([1], 30), ([2], 70)]


def test_aggregations_keyed_and_unkeyed():
    vals = [5, 1, 9, 0, 1024]
    recs = [context.pack("task:end", dur_ns=v, worker=i % 3, task_class=i % 2) for i, v in enumerate(vals)]
    q = ("task:end { @c = count(); @s = sum(task.dur_ns); @a = avg(task.dur_ns); @mn = min(task.dur_ns); "
         "@mx = max(task.dur_ns); @st = stats(task.dur_ns); @k[task.class] = stats(task.dur_ns); "
         "@h = hist(task.dur_ns); @l = lhist(task.dur_ns, 0, 10, 5); }")
    res, blocks = run(q, recs)
    v = {b["name"]: b["entries"] for b in blocks if b.get("type") == "map"}
    assert v["@c"][0]["value"] == 5            # per-worker copies summed
    assert v["@s"][0]["value"] == sum(vals)
    assert v["@a"][0]["value"] == {"count": 5, "sum": sum(vals), "avg": sum(vals) // 5}
    assert v["@mn"][0]["value"] == 0 and v["@mx"][0]["value"] == 1024
    assert v["@st"][0]["value"] == {"count": 5, "sum": sum(vals), "avg": sum(vals) // 5, "min": 0, "max": 1024}
    by = {tuple(e["key"]): e["value"] for e in v["@k"]}
    assert by[("rmsnorm",)]["count"] == 3 and by[("qkv",)]["max"] == 1
    assert [(b["label"], b["count"]) for b in v["@h"][0]["value"]] == \
        [("[0]", 1), ("[1]", 1), ("[2, 4)", 0), ("[4, 8)", 1), ("[8, 16)", 1)] + \
        [(f"[{lo}, {hi})", 0) for lo, hi in (("16", "32"), ("32", "64"), ("64", "128"), ("128", "256"),
                                             ("256", "512"), ("512", "1K"))] + [("[1K, 2K)", 1)]
    assert [(b["label"], b["count"]) for b in v["@l"][0]["value"]] == \
        [("[0, 5)", 2), ("[5, 10)", 2), ("[10, ...)", 1)]
    types = {m.name: (m.type, m.key_size, m.value_size) for m in res.obj.maps}
    assert types["c"] == ("per_worker_array", 4, 8)
    assert types["a"] == ("per_worker_array", 4, 16)
    assert types["mn"] == ("hash", 4, 8)
    assert types["st"] == ("hash", 4, 32)
    assert types["k"] == ("hash", 8, 32)
    assert types["h"] == ("hist_log2", 4, 512)
    assert types["l"] == ("hist_linear", 4, 8 * 4)


def test_one_program_per_probe_and_plan_is_embedded():
    res = compile_query("task:begin, task:end { @[probe] = count(); } comm:* { @c = count(); }")
    assert [(p.name, p.section) for p in res.obj.programs] == [
        ("c0_task_begin", "task/begin"), ("c0_task_end", "task/end"),
        ("c1_comm_signal", "comm/signal"), ("c1_comm_wait", "comm/wait")]
    plan = plan_of(res.obj)
    assert plan == res.plan
    assert plan["maps"][0]["keys"] == [{"name": "probe", "type": "hook", "size": 8}]
    assert plan["maps"][0]["programs"] == ["c0_task_begin", "c0_task_end"]


def test_map_full_is_reported_as_lost_with_a_warning():
    recs = [context.pack("task:end", task_class=c, dur_ns=1) for c in range(6)]
    _, blocks = run("task:end { @n[task.class] = count(); }", recs, options=Options(max_entries=2))
    b = block(blocks, "@n")
    assert len(b["entries"]) == 2
    assert b["coverage"]["eligible"] == 6 and b["coverage"]["lost"] == 4
    text = printing.render_text(blocks)
    assert "coverage @n: eligible 6, executed 2, throttled 0, lost 4" in text
    assert "WARNING: @n: 4 lost of 6 eligible events" in text


def test_evidence_budget_throttles_and_warns():
    recs = [context.pack("task:end", task_class=3, dur_ns=i, decode_step=0) for i in range(10)]
    _, blocks = run("task:end { evidence(task.class, task.dur_ns); }", recs,
                    options=Options(evidence_budget=24 * 3))
    ev = [b for b in blocks if b["type"] == "evidence"]
    assert [e["fields"] for e in ev] == [{"task.class": "attn", "task.dur_ns": i} for i in range(3)]
    assert any(b["type"] == "warning" and "7 records refused" in b["text"] for b in blocks)


def test_device_exit_stops_and_end_runs():
    recs = [context.pack("task:end", dur_ns=d) for d in (1, 2, 100, 3, 4)]
    _, blocks = run('task:end { @n = count(); if (task.dur_ns > 50) { exit(); } } END { print("bye"); }', recs)
    assert block(blocks, "@n")["entries"][0]["value"] == 3
    assert {"type": "text", "when": "END", "text": "bye"} in blocks


def test_verifier_rejection_maps_back_to_the_statement(monkeypatch):
    from dtrace_mk.bpf.verifier.messages import VerifierError

    def reject(prog, maps):
        # reject at the first helper call: the code of the second statement
        pc = next(i for i, ins in enumerate(prog.insns) if ins.opcode == 0x85)
        raise VerifierError(pc, "null-check", "r0 is map_value_or_null")

    query = "task:end {\n  $x = 1;\n  @n = count();\n}"
    pc = next(i for i, ins in enumerate(compile_query(query, verify=False).obj.programs[0].insns)
              if ins.opcode == 0x85)
    monkeypatch.setattr(verify_pass, "_bpf_verify", reject)
    with pytest.raises(Exception) as ei:
        compile_query(query)
    assert str(ei.value) == (
        "<query>:3:3: error: the verifier rejected program 'c0_task_end' (probe 'task:end'): "
        f"insn {pc}: null-check: r0 is map_value_or_null\n"
        "  @n = count();\n"
        "  ^~~~~~~~~~~~")


@pytest.mark.parametrize("query", [
    "task:end /0/ { @v = count(); }",
    "task:end /1 == 1/ { @v = count(); }",
    "task:end { if (0) { @v = count(); } else { @w = count(); } }",
    "task:end { if (FLAG_FAULT) { @v = count(); } }",
    "task:end { @v = lhist(task.dur_ns, 0, 10 * 1000, 1 << 10); }",
])
def test_constant_conditions_compile_to_verifiable_code(query):
    res = compile_query(query)          # the verifier rejects unreachable instructions
    assert res.obj.programs


def test_event_names_resolve_through_a_schema_with_events():
    from dtrace_mk.abi.schema import Event, default_schema
    s = default_schema()
    s.events = [Event(0, "L0.rmsnorm_attn", "rmsnorm", 1), Event(1, "L0.attn_done", "attn", 4)]
    res = compile_query('dep:wait /event.id == "L0.attn_done"/ { @w[event.id] = count(); }', s)
    recs = [context.pack("dep:wait", event_id=i % 2) for i in range(5)]
    blocks = host.run_events(res.obj, recs, res.plan)
    assert block(blocks, "@w")["entries"] == [{"key": ["L0.attn_done"], "value": 2}]
    with pytest.raises(Exception) as ei:
        compile_query('dep:wait /event.id == "L0.attn_dne"/ { @w = count(); }', s)
    assert 'unknown event "L0.attn_dne"; did you mean "L0.attn_done", "L0.rmsnorm_attn"?' in str(ei.value)


def test_named_types_flow_through_variables():
    res, blocks = run('task:end { $c = task.class; @n[$c] = count(); }',
                      [context.pack("task:end", task_class=4)])
    assert block(blocks, "@n")["entries"] == [{"key": ["attn_o"], "value": 1}]


def test_interval_seconds_and_begin():
    recs = [context.pack("task:end", ts_ns=t * 500_000_000) for t in range(5)]   # 0 .. 2 s
    _, blocks = run('BEGIN { print("start"); } task:end { @n = count(); } '
                    'interval:s:1 { print(@n); }', recs)
    assert blocks[0] == {"type": "text", "when": "BEGIN", "text": "start"}
    ticks = [b["ts_ns"] for b in blocks if b["type"] == "interval"]
    assert ticks == [1_000_000_000, 2_000_000_000]
    counts = [b["entries"][0]["value"] for b in blocks if b["type"] == "map"]
    assert counts == [2, 4, 5]          # at 1 s, at 2 s, at exit


def test_coverage_of_a_map_sums_the_programs_that_write_it():
    recs = [context.pack("task:dispatch", wait_ns=5), context.pack("task:begin", wait_ns=7),
            context.pack("task:end", dur_ns=1)]
    _, blocks = run("task:dispatch { @w = sum(task.wait_ns); } task:begin { @w = sum(task.wait_ns); } "
                    "task:end { @d = count(); }", recs)
    assert block(blocks, "@w")["coverage"]["eligible"] == 2
    assert block(blocks, "@w")["entries"][0]["value"] == 12
    assert block(blocks, "@d")["coverage"]["eligible"] == 1


@pytest.mark.parametrize("query", [
    "task:end /(task.dur_ns / 1000) > 20/ { @n = count(); }",             # division needs ()
    "/* c */ task:end // trailing\n { @n = count(); ; }",
    "task:end{@n=count()}",
    "task:end { if (task.dur_ns > 1) { @a = count(); } @b = count(); }",  # no ; after if
    "task:end { @[task.class, task.layer, step] = count() ; }",
])
def test_syntax_variants_compile(query):
    assert compile_query(query).obj.programs


def test_query_of_host_clauses_only():
    res, blocks = run('BEGIN { print("hello"); } END { print("bye"); }', [context.pack("task:end")])
    assert res.obj.programs == [] and res.obj.maps == []
    assert [b["text"] for b in blocks] == ["hello", "bye"]
