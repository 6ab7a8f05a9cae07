"""`dtrace-mk verify`: summary lines, rejections (exit 1), load errors (exit 2, one line)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dtrace_mk import cli
from dtrace_mk.abi.schema import default_schema
from dtrace_mk.bpf import asm, isa
from dtrace_mk.bpf.elf import load_object
from dtrace_mk.bpf.elfwrite import write_object

REPO = Path(__file__).resolve().parents[2]
INCLUDE = REPO / "dtrace_mk" / "abi" / "include"


def cc(tmp_path: Path, clang: str, body: str, name: str = "mon", abi_note: str = "DTMK_ABI_NOTE;") -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text('#include "dtrace_mk_bpf.h"\n' + body + f'\nDTMK_LICENSE("GPL");\n{abi_note}\n')
    out = tmp_path / f"{name}.o"
    subprocess.run([clang, "-target", "bpf", "-O2", "-g", "-c", f"-I{INCLUDE}", str(src), "-o", str(out)],
                   check=True, capture_output=True)
    return out


def verify_cli(capsys, *argv):
    rc = cli.main(["verify", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


COUNTS = """
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1024); __type(key, dtmk_u32);
         __type(value, dtmk_u64); } counts SEC(".maps");
SEC("task/end") int count_layers(struct dtmk_ctx *ctx) {
    dtmk_u32 k = ctx->layer;
    dtmk_u64 *v = bpf_map_lookup_elem(&counts, &k);
    if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
SEC("dep/wait") int nothing(struct dtmk_ctx *ctx) { return 0; }
"""


@pytest.fixture
def counts_o(tmp_path, clang):
    return cc(tmp_path, clang, COUNTS)


def test_accepted_prints_one_line_per_program(capsys, counts_o):
    rc, out, err = verify_cli(capsys, counts_o)
    assert (rc, err) == (0, "")
    n = len(load_object(counts_o).program("count_layers").insns)
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"task/end count_layers: accepted, {n} insns, max path ")
    assert lines[0].endswith(", maps: counts, helpers: map_lookup_elem")
    assert lines[1] == "dep/wait nothing: accepted, 2 insns, max path 2, maps: none, helpers: none"


def test_program_option(capsys, counts_o):
    rc, out, _ = verify_cli(capsys, counts_o, "--program", "nothing")
    assert rc == 0 and out.startswith("dep/wait nothing: accepted") and len(out.splitlines()) == 1
    rc, out, err = verify_cli(capsys, counts_o, "--program", "nope")
    assert rc == 2 and out == ""
    assert err == f"dtrace-mk verify: {counts_o}: --program: no program 'nope' (the object has count_layers, nothing)\n"


def test_rejected_exit_1_names_file_section_program_insn(capsys, tmp_path, clang):
    o = cc(tmp_path, clang, 'SEC("task/begin") int early(struct dtmk_ctx *ctx) { return ctx->dur_ns > 5; }')
    rc, out, err = verify_cli(capsys, o)
    assert rc == 1 and out == ""
    assert err.startswith(f"dtrace-mk verify: {o}: task/begin early: insn ")
    assert "ctx-field-invalid" in err and "dur_ns" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    # the source line of the rejected instruction (line info from -g)
    src = tmp_path / "mon.c"
    assert f" (at {src}:2:" in err
    assert err.rstrip().endswith(': SEC("task/begin") int early(struct dtmk_ctx *ctx) { return ctx->dur_ns > 5; })')


def test_raw_bytecode_needs_hook(capsys, tmp_path):
    binf = tmp_path / "prog.bin"
    binf.write_bytes(isa.encode(asm.assemble("ldxdw r0, [r1+96]\nexit")))      # reads dur_ns
    rc, out, _ = verify_cli(capsys, binf, "--hook", "task:end")
    assert rc == 0
    assert out == "task/end prog: accepted, 2 insns, max path 2, maps: none, helpers: none\n"
    rc, out, err = verify_cli(capsys, binf, "--hook", "task/begin")
    assert rc == 1 and f"{binf}: task/begin prog: insn 0: ctx-field-invalid" in err
    rc, out, err = verify_cli(capsys, binf)
    assert rc == 2
    assert err.startswith(f"dtrace-mk verify: {binf}: not an eBPF object: expected an ELF file")
    assert err.rstrip().endswith("for raw bytecode give --hook")
    rc, out, err = verify_cli(capsys, binf, "--hook", "task:nope")
    assert rc == 2 and "--hook: unknown hook 'task:nope' (expected one of task:ready" in err


def test_hook_overrides_section_for_objects(capsys, tmp_path, clang):
    o = cc(tmp_path, clang, 'SEC("task/end") int p(struct dtmk_ctx *ctx) { return ctx->dur_ns > 5; }')
    assert verify_cli(capsys, o)[0] == 0
    rc, out, err = verify_cli(capsys, o, "--hook", "dep:wait")
    assert rc == 1 and f"{o}: dep/wait p: insn " in err


@pytest.mark.parametrize("case", ["missing", "text", "host", "abi"])
def test_load_errors_are_one_line_exit_2(capsys, tmp_path, clang, case):
    if case == "missing":
        path, expect = tmp_path / "nope.o", "cannot read: No such file or directory"
    elif case == "text":
        path, expect = tmp_path / "notes.o", "not an eBPF object: expected an ELF file"
        path.write_text("just text")
    elif case == "host":
        src = tmp_path / "h.c"
        src.write_text("int f(void) { return 1; }\n")
        path = tmp_path / "h.o"
        subprocess.run([clang, "-c", str(src), "-o", str(path)], check=True)
        expect = "not an eBPF object: ELF machine is "
    else:
        path = cc(tmp_path, clang, 'SEC("task/end") int p(struct dtmk_ctx *c) { return 0; }',
                  abi_note='unsigned int _dtmk_abi SEC("dtmk_abi") = 2;')
        expect = "section 'dtmk_abi': object built for hook ABI v2, this dtrace_mk expects ABI v1"
    rc, out, err = verify_cli(capsys, path)
    assert rc == 2 and out == ""
    assert err.startswith(f"dtrace-mk verify: {path}: ") and expect in err
    assert err.count("\n") == 1


def test_schema_hash_checked(capsys, tmp_path, counts_o):
    schema = default_schema("tiny")
    sfile = tmp_path / "schema.json"
    schema.dump(sfile)
    # no hash in the object: nothing to compare, the schema must still load
    assert verify_cli(capsys, counts_o, "--schema", sfile)[0] == 0
    obj = load_object(counts_o)
    obj.schema_hash = schema.hash
    good = tmp_path / "good.o"
    good.write_bytes(write_object(obj))
    assert verify_cli(capsys, good, "--schema", sfile)[0] == 0
    obj.schema_hash = "sha256:" + "0" * 64
    bad = tmp_path / "bad.o"
    bad.write_bytes(write_object(obj))
    rc, out, err = verify_cli(capsys, bad, "--schema", sfile)
    assert rc == 2 and out == ""
    assert err == (f"dtrace-mk verify: {bad}: section 'dtmk_schema': object was compiled against task "
                   f"schema sha256:{'0' * 64}, {sfile} is {schema.hash}\n")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    rc, _, err = verify_cli(capsys, good, "--schema", broken)
    assert rc == 2 and f"{broken}:1:2: not valid JSON" in err


def test_entry_point_no_traceback(tmp_path):
    p = tmp_path / "x.o"
    p.write_bytes(b"\x7fELF\x01\x01")
    r = subprocess.run([sys.executable, "-m", "dtrace_mk", "verify", str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == f"dtrace-mk verify: {p}: not an eBPF object: truncated ELF header (6 bytes)\n"
