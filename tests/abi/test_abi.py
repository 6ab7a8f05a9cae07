"""The hook ABI: one definition, generated headers that never drift, layouts that the
C compilers (host gcc and clang -target bpf) agree with."""
import subprocess
import textwrap

import pytest

from dtrace_mk.abi import cgen
from dtrace_mk.abi import definition as d


def test_generated_headers_match_definition():
    for path, text in cgen.outputs().items():
        assert path.exists(), f"{path} missing: run python -m dtrace_mk.abi.cgen"
        assert path.read_text() == text, f"{path} drifted from definition.py: run python -m dtrace_mk.abi.cgen"


def test_check_mode_reports_drift(tmp_path, monkeypatch):
    fake = tmp_path / "dtrace_mk_abi.h"
    fake.write_text("stale\n")
    monkeypatch.setattr(cgen, "KERNEL_HEADER", fake)
    assert cgen.main(["--check"]) == 1
    assert cgen.main([]) == 0 and cgen.main(["--check"]) == 0
    assert fake.read_text() == cgen.kernel_header()


def test_layout_is_naturally_aligned_and_dense():
    off = 0
    for f in d.CONTEXT_FIELDS:
        assert f.offset == off, f.name
        assert f.offset % f.size == 0, f.name
        off += f.size
    assert off == d.CONTEXT_SIZE == 128


def test_every_hook_field_exists_and_reserved_never_valid():
    for h in d.HOOKS:
        assert len(set(h.valid_fields)) == len(h.valid_fields), h.name
        for name in h.valid_fields:
            assert name in d.FIELDS_BY_NAME
            assert not name.startswith("reserved")
    assert [h.id for h in d.HOOKS] == list(range(1, len(d.HOOKS) + 1))
    assert {h.name for h in d.HOOKS} == {
        "task:ready", "task:dispatch", "task:begin", "task:end", "dep:wait", "dep:release",
        "comm:signal", "comm:wait", "gen:advance", "queue:pressure"}


def test_hook_specific_fields():
    assert "dur_ns" in d.hook("task:end").valid_fields
    assert "dur_ns" not in d.hook("task:begin").valid_fields
    assert "peer_rank" in d.hook("comm:wait").valid_fields
    assert "peer_rank" not in d.hook("dep:wait").valid_fields
    assert d.hook("task/end") is d.hook("task:end")
    with pytest.raises(KeyError):
        d.hook("task:finish")


def test_language_names_resolve_to_abi_fields():
    for alias in ("task.class", "task.dur_ns", "dep.wait_ns", "comm.op", "comm.peer", "comm.gen",
                  "req.gen", "step", "task.layer", "queue.depth"):
        assert alias in d.LANG_FIELDS, alias
    assert d.LANG_FIELDS["comm.peer"].name == "peer_rank"
    assert d.LANG_FIELDS["step"].name == "decode_step"


def test_control_helpers_not_in_observe():
    observe = {h.name for h in d.PROGRAM_TYPES_BY_NAME["observe"].helpers}
    control = {h.name for h in d.PROGRAM_TYPES_BY_NAME["control"].helpers}
    assert "set_priority_hint" in control and "set_priority_hint" not in observe
    assert "ringbuf_output" in observe and "ringbuf_output" not in control
    assert not d.PROGRAM_TYPES_BY_NAME["control"].attachable


def _offset_probe_c(header_include: str, prelude: str = "") -> str:
    lines = [prelude, f'#include "{header_include}"']
    for f in d.CONTEXT_FIELDS:
        lines.append(f"_Static_assert(__builtin_offsetof(struct dtmk_ctx, {f.name}) == {f.offset}, \"{f.name}\");")
        lines.append(f"_Static_assert(sizeof(((struct dtmk_ctx *)0)->{f.name}) == {f.size}, \"{f.name} size\");")
    lines.append(f"_Static_assert(sizeof(struct dtmk_ctx) == {d.CONTEXT_SIZE}, \"size\");")
    return "\n".join(lines) + "\n"


def test_host_compiler_agrees_with_python_layout(tmp_path):
    # the kernel header uses C++ static_assert; check it as C++ and our offsets as C
    src = tmp_path / "probe.cc"
    src.write_text(_offset_probe_c(str(cgen.KERNEL_HEADER)).replace("_Static_assert", "static_assert"))
    r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_bpf_compiler_agrees_with_python_layout(tmp_path, clang):
    src = tmp_path / "probe.c"
    src.write_text(_offset_probe_c(str(cgen.BPF_HEADER)))
    r = subprocess.run([clang, "-target", "bpf", "-O2", "-c", str(src), "-o", str(tmp_path / "p.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_kernel_header_has_no_standard_includes():
    # NVRTC has no C++ standard headers
    assert "#include" not in cgen.kernel_header()


def test_per_hook_field_masks_in_header():
    text = cgen.kernel_header()
    idx = {f.name: i for i, f in enumerate(d.CONTEXT_FIELDS)}
    h = d.hook("task:end")
    mask = sum(1 << idx[n] for n in h.valid_fields)
    assert f"#define DTMK_HOOK_TASK_END_FIELDS 0x{mask:08X}u" in text
