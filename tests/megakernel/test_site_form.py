"""CI (no GPU): the site form (descriptors, compiled inline; kernels/bpf_inline.cuh) is
part of every hook build since session 10; -DDTMK_NO_SITE_FORM (bench variant nosite,
measurement only) builds the hook kernel as it was before: no shadow, no descriptor copy,
every slot through the ring and the VM."""
import re

import pytest

from dtrace_mk.kernels.build import nvrtc_compile
from dtrace_mk.megakernel.gpu import KERNEL_DIR
from dtrace_mk.runtime import descform


def _obs_bytes(defines):
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    ptx = nvrtc_compile(src, "megakernel.cu", "sm_90a", "ptx", defines=defines).decode()
    return int(re.search(r"^\.shared \.align 16 \.b8 O\[(\d+)\];", ptx, re.M).group(1))


def test_the_site_form_s_shared_memory_is_only_in_builds_that_have_it():
    site, nosite = _obs_bytes(()), _obs_bytes(("DTMK_NO_SITE_FORM",))
    shadow = 128 * 48 + 128 + 512                                      # entries, ctx, stack
    descs = descform.DESC_CAP * descform.DESC_DTYPE.itemsize
    assert shadow + descs <= site - nosite <= shadow + descs + 1024, (site, nosite)


@pytest.mark.parametrize("variant", ["nosite", "inlcall"])
def test_the_bench_variants_name_their_defines(variant):
    import ast
    src = (KERNEL_DIR.parents[0] / "bench" / "hooks.py").read_text()
    variants = ast.literal_eval(re.search(r"^BUILD_VARIANTS = (\{.*?\})\n", src, re.M | re.S).group(1))
    assert variants[variant] == {"nosite": ("DTMK_NO_SITE_FORM",), "inlcall": ("DTMK_INL_NOINLINE",)}[variant]
