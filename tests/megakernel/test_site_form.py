"""CI (no GPU): the site form (aggregation descriptors, compiled inline programs at the
hook sites; kernels/bpf_inline.cuh) is built with -DDTMK_SITE_FORM (bench variant
siteform) and in the compiled tier's linked kernels, not in the default hook build
(session 10: it cost the off path ~3.5 points on 1b, docs/results/hooks.md)."""
import re

import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.gpu import KERNEL_DIR
from dtrace_mk.runtime import descform
from dtrace_mk.runtime import device as D


def _obs_bytes(defines):
    src = (KERNEL_DIR / "megakernel.cu").read_text()
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
    import ast
    src = (KERNEL_DIR.parents[0] / "bench" / "hooks.py").read_text()
    variants = ast.literal_eval(re.search(r"^BUILD_VARIANTS = (\{.*?\})\n", src, re.M | re.S).group(1))
    assert variants[variant] == {"siteform": ("DTMK_SITE_FORM",), "inlcall": ("DTMK_INL_NOINLINE",)}[variant]
