"""`dtrace-mk compile`, `dtrace-mk probes` and `verify -e` from the command line."""
from __future__ import annotations

import json


from dtrace_mk import cli
from dtrace_mk.abi import definition as abi
from dtrace_mk.abi.schema import CommOp, TaskClass, default_schema
from dtrace_mk.bpf.elf import load_object
from dtrace_mk.lang.host import find_plan


def main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_compile_writes_object_and_plan(tmp_path, capsys):
    out = tmp_path / "q.o"
    rc, stdout, err = main(capsys, "compile", "-e", 'task:end /task.class == "attn"/ '
                           '{ @slow[task.layer] = hist(task.dur_ns); }', "-o", str(out))
    assert rc == 0, err
    assert stdout == f"{out}: 1 program(s) (task/end), 1 map(s) (slow)\n"
    obj = load_object(str(out))
    assert [p.section for p in obj.programs] == ["task/end"]
    assert obj.map_by_name("slow").type == "hist_log2"
    plan = find_plan(obj)
    assert plan["maps"][0]["name"] == "@slow"
    assert json.loads(obj.notes["dtmk_plan"]) == plan       # inside the object (ELF note)
    assert json.loads((tmp_path / "q.plan.json").read_text()) == plan


def test_compile_error_is_the_rendered_diagnostic(capsys):
    rc, out, err = main(capsys, "compile", "-e", 'task:end /task.class == "atn"/ { @n = count(); }',
                        "-o", "/nonexistent/q.o")
    assert rc == 1 and out == ""
    assert err == ('<query>:1:25: error: unknown task class "atn"; did you mean "attn", "attn_o"?\n'
                   'task:end /task.class == "atn"/ { @n = count(); }\n'
                   '                        ^~~~~\n')
    assert "Traceback" not in err


def test_compile_file_with_schema(tmp_path, capsys):
    s = default_schema()
    s.task_classes.append(TaskClass(len(s.task_classes), "my_fused_op", "Fused", "task_fused",
                                    "dense", "local"))
    s.comm_ops.append(CommOp(len(s.comm_ops), "alltoall_moe"))
    schema = tmp_path / "schema.json"
    s.dump(schema)
    q = tmp_path / "q.d"
    q.write_text('task:end /task.class == "my_fused_op"/ { @n = count(); }\n'
                 'comm:wait /comm.op == "alltoall_moe"/ { @w = sum(comm.wait_ns); }\n')
    rc, out, err = main(capsys, "compile", str(q), "--schema", str(schema), "-S")
    assert rc == 0, err
    assert "jne r0, 12, " in out and "jne r0, 2, " in out
    # without the schema the names are unknown; the file name is in the message
    rc, out, err = main(capsys, "compile", str(q), "-S")
    assert rc == 1
    assert err.startswith(f'{q}:1:25: error: unknown task class "my_fused_op"')


def test_compile_cuda_prints_the_compiled_tiers_source(capsys):
    """--cuda: the monitor the compiled tier links -- the map's shape of constants, the
    program calling the folded operation, the hook's entry point."""
    rc, out, err = main(capsys, "compile", "-e", "task:end { @lat[task.class] = hist(task.dur_ns); }", "--cuda")
    assert rc == 0, err
    assert "DTMK_CONST_SHAPE(dtmk_cm_map0, 0x" in out and "/* hist_log2: key 8 B" in out
    assert "r0 = dtmk_hist_add_t(dtmk_cm_map0(), (const void *)r2, r3, &lost);" in out
    hook = abi.hook("task:end").id
    assert f'extern "C" __device__ int dtmk_cm_hook_{hook}(' in out and "case 0: return dtmk_cm_prog_0(" in out


def test_compile_needs_a_query(capsys):
    rc, out, err = main(capsys, "compile", "-o", "x.o")
    assert rc == 2 and "give a query with -e QUERY or a query FILE" in err


def test_probes_lists_every_hook_and_host_probe(capsys):
    rc, out, _ = main(capsys, "probes")
    assert rc == 0
    assert out.split() == [h.name for h in abi.HOOKS] + ["BEGIN", "END", "interval:ms:N"]


def test_probes_verbose_shows_fields_valid_per_hook(capsys):
    rc, out, _ = main(capsys, "probes", "-v", "comm:wait")
    assert rc == 0
    assert out.startswith("comm:wait    # a task finished waiting on a remote event")
    assert "comm.op" in out and "comm.peer" in out and "comm.wait_ns" in out
    assert "task.dur_ns" not in out           # not valid at comm:wait
    assert "allreduce_attn, allreduce_mlp" in out


def test_verify_e_accepts_a_query(capsys):
    rc, out, err = main(capsys, "verify", "-e", "task:end, dep:release { @[task.class] = hist(task.wait_ns); }")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("task/end c0_task_end: accepted")
    assert lines[1].startswith("dep/release c0_dep_release: accepted")


def test_verify_e_reports_compile_errors(capsys):
    rc, out, err = main(capsys, "verify", "-e", "task:end { @[task.clas] = count(); }")
    assert rc == 1
    assert "unknown field 'task.clas'" in err and "Traceback" not in err


EVENTS = str(__import__("pathlib").Path(__file__).resolve().parent / "golden" / "events" / "comm.jsonl")


def test_run_vm_e_prints_like_bpftrace(capsys):
    rc, out, err = main(capsys, "run-vm", "-e", "comm:wait { @remote_wait[comm.op, comm.peer] = "
                        "sum(comm.wait_ns); }", "--events", EVENTS)
    assert rc == 0, err
    assert out == ("@remote_wait[allreduce_attn, 1]: 156116\n"
                   "@remote_wait[allreduce_mlp, 1]: 213928\n"
                   "coverage @remote_wait: eligible 64, executed 64, throttled 0, lost 0\n\n")


def test_run_vm_compiled_object_json(tmp_path, capsys):
    obj = tmp_path / "rw.o"
    assert main(capsys, "compile", "-e", 'comm:wait /comm.op == "allreduce_mlp"/ '
                "{ @w = stats(comm.wait_ns); }", "-o", str(obj))[0] == 0
    rc, out, err = main(capsys, "run-vm", str(obj), "--events", EVENTS, "-f", "json")
    assert rc == 0, err
    (block,) = [json.loads(l) for l in out.splitlines()]
    assert block["name"] == "@w" and block["agg"] == "stats"
    assert block["entries"][0]["key"] == [] and block["entries"][0]["value"]["count"] == 16
    assert block["coverage"] == {"eligible": 64, "executed": 64, "throttled": 0, "lost": 0, "reasons": {}}


def test_run_vm_e_compile_error(capsys):
    rc, out, err = main(capsys, "run-vm", "-e", "task:end { @x = hist(); }", "--events", EVENTS)
    assert rc == 1 and "hist() takes 1 argument, got 0" in err and "Traceback" not in err


def test_language_doc_names_every_field_and_probe():
    text = (__import__("pathlib").Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text()
    for name in abi.LANG_FIELDS:
        assert f"`{name}`" in text, name
    for h in abi.HOOKS:
        assert f"`{h.name}`" in text, h.name
