"""CI (no GPU, no nvdisasm): tools/sass_size.py attributes each instruction of `nvdisasm -g`
output to the source function whose body holds its line, inlined copies summed."""
import pytest


@pytest.fixture(scope="module")
def ss(load_tool):
    return load_tool("sass_size")


OPS = """// ops
__device__ __forceinline__ float dot(const float *a) {
    return a[0] * a[1];
}
__device__ void helper(int x);
template <int N>
__device__ __noinline__ void op_tile(float *o) {
    o[0] = dot(o);
}
"""
MAIN = """extern "C" __global__ void __launch_bounds__(512, 1) kern(float *o) {
    op_tile<4>(o);
}
"""
SASS = """        /*0000*/                   MOV R1, c[0x0][0x28] ;
	//## File "/k/main.cu", line 2
        /*0010*/                   S2R R0, SR_TID.X ;
	//## File "/k/ops.cuh", line 3
        /*0020*/                   FMUL R2, R2, R3 ;
        /*0030*/                   FMUL R4, R2, R3 ;
	//## File "/k/ops.cuh", line 8
        /*0040*/                   STG.E [R6.64], R2 ;
	//## File "/k/ops.cuh", line 3
        /*0050*/                   FMUL R2, R2, R5 ;
	//## File "/k/other.cuh", line 9
        /*0060*/                   EXIT ;
.L_x_0:
"""


def test_function_starts_skip_declarations_and_take_templates(ss):
    assert ss.function_starts(OPS) == [(2, "dot"), (7, "op_tile")]
    assert ss.function_starts(MAIN) == [(1, "kern")]


def test_attribute_sums_inlined_copies_per_function(ss):
    cnt = ss.attribute(SASS, {"/k/ops.cuh": OPS, "/k/main.cu": MAIN})
    assert cnt == {("?", "?"): 1,                  # before any line info
                   ("main.cu", "kern"): 1,
                   ("ops.cuh", "dot"): 3,          # two copies of its line 3
                   ("ops.cuh", "op_tile"): 1,      # line 8: inside op_tile (starts at 7)
                   ("other.cuh", "?"): 1}          # a file not given
    assert sum(cnt.values()) * ss.SASS_BYTES == 7 * 16


def test_instruction_functions_lists_each_instruction_in_address_order(ss):
    got = ss.instruction_functions(SASS, {"/k/ops.cuh": OPS, "/k/main.cu": MAIN})
    assert got == [("?", "?"), ("main.cu", "kern"), ("ops.cuh", "dot"), ("ops.cuh", "dot"),
                   ("ops.cuh", "op_tile"), ("ops.cuh", "dot"), ("other.cuh", "?")]


def test_instruction_lines_keep_the_line(ss):
    got = ss.instruction_lines(SASS, {"/k/ops.cuh": OPS, "/k/main.cu": MAIN})
    assert got[0] == ("?", "?", 0) and got[2] == ("ops.cuh", "dot", 3) and got[-1] == ("other.cuh", "?", 9)


def test_instruction_symbols_name_the_sass_function_each_instruction_lies_in(ss):
    sass = ("dtmk_megakernel:\n.text.dtmk_megakernel:\n" + "        /*0000*/  MOV R1, R2 ;\n.L_x_0:\n"
            "        /*0010*/  BRA `(.L_x_0) ;\n$dtmk_megakernel$_Z10hook_flushRK8MkParamsR6Worker:\n"
            "        /*0020*/  LDG.E R0, [R2.64] ;\n.L_x_1:\n        /*0030*/  RET.REL.NODEC R20 ;\n"
            "$dtmk_megakernel$__internal_0_$__cuda_sm3x_div_u64:\n        /*0040*/  IADD3 R0, R1, R2, RZ ;\n")
    # local labels (.L_x_N) do not start a function; mangled names lose their signature
    assert ss.instruction_symbols(sass) == ["dtmk_megakernel", "dtmk_megakernel", "hook_flush", "hook_flush",
                                            "__internal_0_$__cuda_sm3x_div_u64"]
    assert ss.demangle("_Z12osq_observerRK8MkParams") == "osq_observer"
    assert ss.demangle("_Z99short") == "_Z99short"          # (a length past the end: left as is)
    assert ss.demangle("_Z10wait_eventILj0EEvRK8MkParams") == "wait_event<0>"   # (a template on one integer)
    assert ss.demangle("_Z8run_taskILj1EEvRK8MkParams") == "run_task<1>"
