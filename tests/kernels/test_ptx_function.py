"""kernels/build.ptx_function: the one helper tests use to read a function out of PTX
(ptx_function_names: the functions a PTX defines); ptx_canonical: the one they use to call two
builds the same code."""
from dtrace_mk.kernels.build import ptx_function, ptx_function_names, ptx_canonical

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


def test_the_names_of_the_definitions_in_order():
    assert ptx_function_names(PTX) == ["_Z4workPi", "_Z5otherv"]     # (not the prototype, not the entry)


def test_a_part_of_the_name_matches_and_an_absent_one_is_none():
    assert ptx_function(PTX, "other").startswith(".func _Z5otherv()")
    assert ptx_function(PTX, "missing") is None


def test_register_file_sizes_are_left_out_and_nothing_else():
    a = "\t.reg .pred \t%p<27>;\n\t.reg .f32 \t%f<325>;\n\tadd.f32 \t%f1, %f2, %f3;\n"
    b = a.replace("%f<325>", "%f<327>")
    assert ptx_canonical(a) == ptx_canonical(b) == "\t.reg\n\t.reg\n\tadd.f32 \t%f1, %f2, %f3;\n"
    assert ptx_canonical(a) != ptx_canonical(a.replace("%f3;", "%f2;"))   # instructions still count
    assert ptx_canonical(a) != ptx_canonical(a.replace("add.f32", "sub.f32"))


F = """.visible .entry k(
\t.param .u64 k_param_0
)
{{
\t.reg .f32 \t%f<400>;
\t.reg .b32 \t%r<9>;
\t.reg .b64 \t%rd<9>;
\tld.param.u64 \t%rd{a}, [k_param_0];
\tmov.u32 \t%r{b}, %tid.x;
\t{{ ld.global.v2.f32 {{%f{c},%f{d}}}, [%rd{a}]; }}
\tadd.f32 \t%f{e}, %f{c}, %f{d};
\tst.global.f32 \t[%rd{a}+8], %f{e};
\tret;
}}
.func g()
{{
\t.reg .f32 \t%f<4>;
\tmov.f32 \t%f{g}, 0f3F800000;
\tret;
}}
"""


def test_register_numbering_is_canonical_per_function():
    """Session 36's CI flake: one build's inline-asm operands numbered %f304.. and the
    other's %f302..; the canonical form renames each function's registers by first use."""
    one = F.format(a=1, b=1, c=304, d=305, e=306, g=3)
    two = F.format(a=7, b=4, c=302, d=303, e=1, g=1)
    assert one != two and ptx_canonical(one) == ptx_canonical(two)
    assert "%f1,%f2}, [%rd1]" in ptx_canonical(one) and "%tid.x" in ptx_canonical(one)
    assert "mov.f32 \t%f1, 0f3F800000" in ptx_canonical(one)          # g's registers are g's own
    same_reg = F.format(a=1, b=1, c=304, d=304, e=306, g=3)           # both loads into one register
    assert ptx_canonical(same_reg) != ptx_canonical(one)
    assert ptx_canonical(one.replace("%rd1+8", "%rd1+16")) != ptx_canonical(one)   # constants count


def test_labels_are_renamed_only_when_asked():
    """One function of two builds whose modules differ: NVRTC numbers its labels by the
    function's place in the module ($L__BB12_3 in one, $L__BB14_3 in the other)."""
    body = "\t.reg .pred \t%p<3>;\n\t@%p{a} bra \t$L__BB{f}_2;\n$L__BB{f}_1:\n\tret;\n$L__BB{f}_2:\n\tbra.uni \t$L__BB{f}_1;\n"
    one, two = body.format(a=1, f=12), body.format(a=2, f=14)
    assert ptx_canonical(one) != ptx_canonical(two)                          # labels kept by default
    assert ptx_canonical(one, labels=True) == ptx_canonical(two, labels=True)
    assert "$L__BB_1;\n$L__BB_2:" in ptx_canonical(one, labels=True)         # first use names them
    swapped = one.replace("bra.uni \t$L__BB12_1", "bra.uni \t$L__BB12_2")    # a branch to the other label
    assert ptx_canonical(swapped, labels=True) != ptx_canonical(one, labels=True)
    assert ptx_canonical("\tret;\n", labels=True) == "\tret;\n"
