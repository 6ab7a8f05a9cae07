"""Device VM sources and host encoding, without a GPU.

* kernels/bpf_opcodes.h is what dtrace_mk.bpf.devicegen generates from the ISA table;
* the device sources compile through NVRTC to a cubin for sm_90a, together with static
  asserts (generated from dtrace_mk.runtime.device's numpy layouts) that the host and
  CUDA agree on every table, map and coverage struct;
* encode_program / decode_program round-trip every vm_cases program and random verified
  programs, and the encoding resolves what the device must not compute (jump targets
  with lddw folded, pre-extended operands, map addresses, helper ops).
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from dtrace_mk.abi import definition as abi
from dtrace_mk.bpf import asm, devicegen, isa
from dtrace_mk.bpf.verifier import verify
from dtrace_mk.runtime import device as D

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))
sys.path.insert(0, str(HERE.parent / "bpf" / "vm_cases"))

import device_progs as G                      # noqa: E402


# ------------------------------------------------------------------ generated header

def test_opcode_header_matches_isa_table():
    assert devicegen.HEADER.exists(), "kernels/bpf_opcodes.h missing: run python -m dtrace_mk.bpf.devicegen"
    assert devicegen.HEADER.read_text() == devicegen.header(), \
        "kernels/bpf_opcodes.h drifted from dtrace_mk/bpf/isa.py: run python -m dtrace_mk.bpf.devicegen"


def test_check_mode_reports_drift(tmp_path, monkeypatch):
    fake = tmp_path / "bpf_opcodes.h"
    fake.write_text("stale\n")
    monkeypatch.setattr(devicegen, "HEADER", fake)
    assert devicegen.main(["--check"]) == 1
    assert devicegen.main([]) == 0 and devicegen.main(["--check"]) == 0


def test_device_ops_cover_the_isa_and_helpers():
    assert set(devicegen.OP_OF_OPCODE) == set(isa.OPCODES)
    assert len(set(devicegen.OP.values())) == len(devicegen.OP)          # one code per op
    assert devicegen.OP["invalid"] == 0 and max(devicegen.OP.values()) < 256
    assert set(devicegen.CALL_OP) == set(abi.HELPERS_BY_ID)
    text = devicegen.header()
    for name in devicegen.DEVICE_OPS:
        assert f"#define {devicegen.c_name(name)} 0x{devicegen.OP[name]:02x}" in text


def test_op_groups_carry_the_rfc_operation():
    """ALU/JMP codes are group << 4 | (RFC operation >> 4): the VM's inner switches
    read the RFC operation straight from the low nibble."""
    G = devicegen.GROUPS
    for opcode, code in devicegen.OP_OF_OPCODE.items():
        info = isa.OPCODES[opcode]
        name = devicegen.NAME_OF_OP[code]
        if name in devicegen.MISC_OPS:
            assert code >> 4 == G.index("misc")
        elif info.kind in ("alu", "jmp"):
            want = f"{info.kind}{64 if info.is64 else 32}_{'x' if info.src == isa.BPF_X else 'k'}"
            assert (G[code >> 4], code & 15) == (want, info.op >> 4), name
        else:
            assert G[code >> 4] == "mem", name
    for h in abi.HELPERS:
        assert devicegen.CALL_OP[h.id] >> 4 == G.index("call")


def test_vm_handles_every_group_and_helper():
    src = (D.KERNEL_DIR / "bpf_vm.cuh").read_text()
    for g in devicegen.GROUPS:
        assert f"case DTMK_OPG_{g.upper()}" in src, g
    for name in devicegen.MISC_OPS[1:] + tuple("call_" + h.name for h in abi.HELPERS):
        if name != "call":
            assert f"case {devicegen.c_name(name)}" in src, name


# ------------------------------------------------------------------ NVRTC

@pytest.fixture(scope="module")
def cubin():
    pytest.importorskip("cuda.bindings.nvrtc")
    return D.nvrtc_compile(D.harness_source() + "\n" + D.layout_asserts() + HOOK_SITE_PROBE, arch="sm_90a")


# the entry point a megakernel hook site calls (not used by the harness): compiled too
HOOK_SITE_PROBE = r"""
extern "C" __global__ void dtmk_hook_site_probe(const struct dtmk_hook_table *g_tables, const struct dtmk_ctx *g_recs,
                                                 dtmk_u32 n) {
    __shared__ struct dtmk_hook_table tabs[DTMK_NUM_HOOKS];
    __shared__ struct dtmk_ctx ring[32];
    __shared__ dtmk_u64 regs[DTMK_VM_NREGS * 32];
    __shared__ struct dtmk_cov_acc accs[DTMK_MAX_PROGS];
    if (threadIdx.x == 0) {
        for (int h = 1; h < DTMK_NUM_HOOKS; h++) dtmk_vm_load_table(g_tables + h, &tabs[h]);
        tabs[0].n_progs = 0;
        for (int k = 0; k < DTMK_MAX_PROGS; k++) { accs[k].cov = 0; accs[k].eligible = 0; }
    }
    if (threadIdx.x < n) ring[threadIdx.x] = g_recs[threadIdx.x];
    __syncthreads();
    if (threadIdx.x < 32) {
        dtmk_vm_run_records(tabs, ring, n, regs, accs, blockIdx.x, 0);
        if (threadIdx.x == 0)
            for (int k = 0; k < DTMK_MAX_PROGS; k++) dtmk_cov_acc_flush(&accs[k]);
    }
}
"""


def test_sources_compile_to_sm_90a_cubin_with_host_layouts(cubin):
    assert cubin[:4] == b"\x7fELF"
    assert b"dtmk_vm_harness" in cubin and b"dtmk_vm_naive" in cubin and b"dtmk_hook_site_probe" in cubin


def test_layout_asserts_catch_a_wrong_offset():
    pytest.importorskip("cuda.bindings.nvrtc")
    src = '#include "bpf_vm.cuh"\n' + D.layout_asserts().replace(
        "struct dtmk_prog, n_insns) == 16", "struct dtmk_prog, n_insns) == 20")
    with pytest.raises(D.CompileError, match="dtmk_prog.n_insns"):
        D.nvrtc_compile(src, name="layout_probe.cu")


# ------------------------------------------------------------------ encoding

DESCS = [0x7000_0000 + 128 * i for i in range(8)]


def _values(maps):
    return [0x9000_0000 + 0x10000 * i if m.type == "array" else 0 for i, m in enumerate(maps)]


def _roundtrip(insns, maps):
    recs = D.encode_program(insns, DESCS[:len(maps)], _values(maps))
    assert recs.dtype == D.DINSN_DTYPE and recs.itemsize == 16
    back = D.decode_program(recs, DESCS[:len(maps)], _values(maps))
    assert isa.encode(back) == isa.encode(insns)
    return recs


def test_roundtrip_vm_cases():
    from harness import all_cases, parse_case
    n = 0
    for path in all_cases():
        case = parse_case(path)
        try:
            obj = case.object()
            recs = D.encode_program(obj.programs[0].insns, DESCS[:len(obj.maps)], _values(obj.maps))
        except (D.EncodeError, ValueError):
            continue                     # cases that exist to be malformed
        back = D.decode_program(recs, DESCS[:len(obj.maps)], _values(obj.maps))
        assert isa.encode(back) == isa.encode(obj.programs[0].insns), case.name
        n += 1
    assert n >= 40


def test_roundtrip_random_verified_programs():
    for seed in range(40):
        rnd = random.Random(seed)
        obj = G.random_object(rnd, parallel_safe=seed % 2 == 0)
        verify(obj.programs[0], obj.maps)
        _roundtrip(obj.programs[0].insns, obj.maps)


def test_encoding_resolves_targets_operands_and_maps():
    from dtrace_mk.bpf.program import MapDef
    maps = [MapDef("h", "hash", 4, 8, 4), MapDef("a", "array", 4, 16, 2)]
    insns = asm.assemble("""
        lddw r1, map:h
        lddw r2, 0x1122334455667788
        add32 r3, -1
        add r3, -1
        jeq32 r3, -1, out
        stb [r10-1], -1
        call hist_add
        call 9999
    out:
        exit
    """, ["h", "a"])
    recs = _roundtrip(insns, maps)
    ops = [devicegen.NAME_OF_OP[int(r["op"])] for r in recs]
    assert ops == ["lddw_map", "lddw", "add32_k", "add_k", "jeq32_k", "stb", "call_hist_add", "call", "exit"]
    assert int(recs[0]["imm"]) == DESCS[0]
    assert int(recs[1]["imm"]) == 0x1122334455667788
    assert int(recs[2]["imm"]) == 0xFFFFFFFF and int(recs[3]["imm"]) == (1 << 64) - 1
    assert int(recs[4]["off"]) == 8 and int(recs[4]["imm"]) == 0xFFFFFFFF   # record index, lddw folded
    assert int(recs[5]["aux"]) == 1 and int(recs[5]["off"]) == -1
    assert int(recs[7]["imm"]) == 9999


def test_map_value_reference_resolves_to_the_value_address():
    from dtrace_mk.bpf.program import MapDef
    maps = [MapDef("h", "hash", 4, 8, 4), MapDef("a", "array", 4, 16, 2)]
    insns = isa.lddw_map(3, "a", 1, isa.PSEUDO_MAP_VALUE, 8) + [isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
    recs = _roundtrip(insns, maps)
    assert devicegen.NAME_OF_OP[int(recs[0]["op"])] == "lddw_map_value"
    assert int(recs[0]["imm"]) == _values(maps)[1] + 8


def test_encoding_refuses_a_jump_into_lddw():
    insns = isa.lddw(1, 5) + [isa.Insn(isa.BPF_JMP | isa.BPF_JA, off=-2), isa.Insn(isa.BPF_JMP | isa.BPF_EXIT)]
    with pytest.raises(D.EncodeError, match="insn 2: jump to 1"):
        D.encode_program(insns)


def test_key_hash_is_pinned():
    # bpf_maps.cuh dtmk_key_hash must compute the same: the GPU tests pre-fill hash maps
    # from the host with it and count on device lookups finding those keys
    assert D.key_hash(b"\x01\x00\x00\x00") == 0x5644487
    assert D.key_hash(b"abcdefgh") == 0x5964D6A7
    assert D.key_hash(b"abc") == D.key_hash(b"abc\x00")          # zero-padded to words
    assert D.hash_capacity(4) == 8 and D.hash_capacity(5) == 16 and D.hash_capacity(1) == 2


def test_table_layout_sizes():
    assert D.HOOK_TABLE_DTYPE.itemsize == 576 and D.COV_DTYPE.itemsize == 128 + 64 * D.COV_ROWS
    assert D.NUM_HOOKS == abi.MAX_HOOK_ID + 1 == 11
