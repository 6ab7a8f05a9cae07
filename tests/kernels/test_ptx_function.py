"""kernels/build.ptx_function: the one helper tests use to read a function out of PTX;
ptx_sans_reg_sizes: the one they use to call two builds the same code."""
from dtrace_mk.kernels.build import ptx_function, ptx_sans_reg_sizes

PTX = """
.func _Z4workPi
(
\t.param .b64 _Z4workPi_param_0
)
;
.visible .entry kern(
\t.param .u64 kern_param_0
)
{
\tcall.uni _Z4workPi, (p);
}
.func  (.param .b32 func_retval0) _Z4workPi(
\t.param .b64 _Z4workPi_param_0
)
{
\t.reg .b32 \t%r<3>;
\t{
\t.reg .b32 tmp;
\tmov.u32 tmp, 1;
\t}
\tst.global.u32 [%rd1], %r1;
\tret;
}
.func _Z5otherv()
{
\tret;
}
"""


def test_the_definition_not_the_prototype_to_its_closing_brace():
    body = ptx_function(PTX, "_Z4workPi")
    assert body.startswith(".func  (.param .b32 func_retval0) _Z4workPi(")
    assert "st.global.u32" in body and body.endswith("\tret;\n}")   # past the nested block
    assert "_Z5otherv" not in body and "kern" not in body


def test_a_part_of_the_name_matches_and_an_absent_one_is_none():
    assert ptx_function(PTX, "other").startswith(".func _Z5otherv()")
    assert ptx_function(PTX, "missing") is None


def test_register_file_sizes_are_left_out_and_nothing_else():
    a = "\t.reg .pred \t%p<27>;\n\t.reg .f32 \t%f<325>;\n\tadd.f32 \t%f1, %f2, %f3;\n"
    b = a.replace("%f<325>", "%f<327>")
    assert ptx_sans_reg_sizes(a) == ptx_sans_reg_sizes(b) == "\t.reg\n\t.reg\n\tadd.f32 \t%f1, %f2, %f3;\n"
    assert ptx_sans_reg_sizes(a) != ptx_sans_reg_sizes(a.replace("%f3;", "%f4;"))   # instructions still count
