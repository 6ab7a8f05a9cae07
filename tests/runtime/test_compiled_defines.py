"""The compiled tier links the megakernel with the defines that change what the kernel
computes.  gpu.megakernel_defines adds DTMK_ROPE_IN_ATTN for rope_in_attn graphs (1b's
default since session 6); a linked kernel without it skips the attn tasks' rope and gives
wrong tokens (bench/hooks.py caught it on the GPU: summary_cm tokens != nohooks)."""
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.runtime import compiled as C


def test_every_define_the_model_adds_reaches_the_linked_kernel():
    for name, cfg in PRESETS.items():
        added = set(gpu.megakernel_defines(cfg, 1))
        spec = C.megakernel_spec(gpu.megakernel_defines(cfg, 1))
        assert added <= set(spec.defines), (name, added, spec.defines)
    assert "DTMK_ROPE_IN_ATTN" in C.megakernel_spec(gpu.megakernel_defines(PRESETS["1b"], 1)).defines
    assert C.megakernel_spec(gpu.megakernel_defines(PRESETS["tiny"], 1)) is C.MEGAKERNEL_SPEC


def test_every_bench_variant_and_the_profiler_reach_the_linked_kernel():
    """bench/hooks.py runs summary_cm in each BUILD_VARIANTS build and bench/level_profile.py
    links summary_cm with -DDTMK_OBS_PROF: a define the compiled tier drops would measure
    (or profile) the default kernel under the variant's name (session 9: lazyhold, OBS_PROF)."""
    from tests.bench_tables import hooks_table
    variants, runs = hooks_table("BUILD_VARIANTS"), hooks_table("BUILD_VARIANT_RUNS")
    linked = {n: d for n, d in variants.items() if "summary_cm" in runs.get(n, ("summary_cm",))}
    assert "eagerhold" in linked and "idealsite" not in linked
    for name, defs in list(linked.items()) + [("prof", ("DTMK_OBS_PROF",)), ("place", ("DTMK_SM_WORKER", "DTMK_SM_IDLE"))]:
        spec = C.megakernel_spec(defs)
        assert set(defs) <= set(spec.defines), (name, defs, spec.defines)
        assert spec.defines[:len(C.MK_DEFINES)] == C.MK_DEFINES
