"""CI (no GPU): the site form (aggregation descriptors, compiled inline programs at the
hook sites; kernels/bpf_inline.cuh) is built with -DDTMK_SITE_FORM (bench variant
siteform) and in the compiled tier's linked kernels, not in the default hook build
(session 10: it cost the off path ~3.5 points on 1b, docs/results/hooks.md)."""
import re

import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel import gpu
from dtrace_mk.runtime import descform
from dtrace_mk.runtime import device as D
from dtrace_mk.kernels import megakernel_text


def _obs_bytes(defines):
    src = megakernel_text()
    ptx = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defines).decode()
    return int(re.search(r"^\.shared \.align 16 \.b8 O\[(\d+)\];", ptx, re.M).group(1))


def test_the_site_form_s_shared_memory_is_only_in_builds_that_have_it():
    plain, site = _obs_bytes(()), _obs_bytes(("DTMK_SITE_FORM",))
    shadow = 128 * 48 + 128 + 512                                      # entries, ctx, stack
    descs = descform.DESC_CAP * descform.DESC_DTYPE.itemsize
    assert shadow + descs <= site - plain <= shadow + descs + 1024, (site, plain)


def test_live_sessions_use_descriptors_only_on_kernels_with_the_site_form():
    assert gpu.site_form(("DTMK_SITE_FORM", "DTMK_ROPE_IN_ATTN")) and not gpu.site_form(("DTMK_ROPE_IN_ATTN",))
    with pytest.raises(UserError, match="hook sites"):
        D.DeviceRuntime(descriptors=True)                              # the harness has no hook site


@pytest.mark.parametrize("variant", ["siteform", "inlcall"])
def test_the_bench_variants_name_their_defines(variant):
    from tests.bench_tables import hooks_table
    assert hooks_table("BUILD_VARIANTS")[variant] == {"siteform": ("DTMK_SITE_FORM",), "inlcall": ("DTMK_INL_NOINLINE",)}[variant]


#: spill bytes (stores, loads) ptxas reports for the per-task functions of the default 1b
#: hook build (a1d0575 = 5292e76).  Hook code reaches them through register allocation
#: across calls: the site form built in raised run_task to (92, 156) and cost the off path
#: ~3.5 points of the step (docs/dev/hook_cost_analysis.md "Session 10").  A change that
#: raises these needs a GPU measurement of off / nohooks before it lands.  Session 60's
#: default (the wait's two copies, hot-first layout; plan 161 measured its off cost +0.35..
#: +0.56% on an H100): copy 0 (100, 72) no more than the no-hook build's wait (116, 84), copy 1
#: (120, 148), the entry (136, 144) against one wait's (128, 136).
PER_TASK_SPILL_BUDGET = {"run_task": (28, 80), "wait_event_off": (116, 84), "wait_event_obs": (128, 168),
                         "dtmk_megakernel": (140, 148)}


@pytest.mark.slow
def test_hook_code_does_not_raise_the_per_task_functions_spills():
    from tests.kernels.test_wstream import _compile_v, _resources
    funcs, _, _ = _resources(_compile_v(("DTMK_ROPE_IN_ATTN",))[1])
    got = {name: next(v for k, v in funcs.items() if (k == name if name == "dtmk_megakernel" else name in k))
           for name in PER_TASK_SPILL_BUDGET}
    over = {n: (got[n], b) for n, b in PER_TASK_SPILL_BUDGET.items() if got[n][0] > b[0] or got[n][1] > b[1]}
    assert not over, f"spill bytes (stores, loads) over budget: {over}"
