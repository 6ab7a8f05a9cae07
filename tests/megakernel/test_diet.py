"""CI (no GPU): -DDTMK_DIET (session 58, measurement; bench/hooks.py variant diet) -- the task
bodies' helpers that the default build inlines in several places (ws_desc, ws_issue, mk_resid4,
op_split_proj, op_fused_proj, op_argmax_row: kernels/mk_ops.cuh MK_DIET_*) become one function each, called from every site,
so that the workers run fewer distinct lines of code per step.  PTX shapes; the GPU side is
its tokens (bench/hooks.py --offpath checks them equal to the default no-hook build's)."""

import re

import pytest

from dtrace_mk.kernels.build import ptx_function
from dtrace_mk.megakernel import gpu

#: mangled name prefixes of the helpers the diet calls instead of inlining
DIET_FUNCS = ("_Z7ws_desc", "_Z8ws_issue", "_Z9mk_resid4", "_Z13op_split_proj", "_Z13op_fused_proj",
              "_Z13op_argmax_row")


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))


def _ptx(defines) -> str:
    return gpu.compile_source("sm_90a", "ptx", defines=defines, use_cache=False).decode()


@pytest.mark.parametrize("hooks", [(), ("DTMK_NO_HOOKS",)], ids=["hooks", "nohooks"])
def test_diet_calls_one_copy(fresh_cache, hooks):
    diet, default = _ptx(hooks + ("DTMK_DIET",)), _ptx(hooks)
    body = ptx_function(diet, "_Z8run_body")
    assert body, "run_body not in the PTX"
    for f in DIET_FUNCS:
        assert re.search(r"^\.func\s+(\(\.param [^)]*func_retval0[^)]*\)\s+)?" + f, diet, re.M), f
        assert f not in default, f          # the default build inlines them
    # run_body calls the split-K and fused-norm tiles (attn_o / mlp_down and qkv / lm_head)
    assert body.count("_Z13op_split_proj") >= 2 and "_Z13op_fused_proj" in body
    # ... and ws_desc is called by every stream user, not inlined into any
    for f in ("_Z13op_split_proj", "_Z13op_fused_proj", "_Z16op_fused_gate_up", "_Z12ws_task_desc"):
        fn = ptx_function(diet, f) or body          # (op_fused_gate_up: inlined into run_body)
        assert "_Z7ws_desc" in fn, f


def test_hot_first_renames(fresh_cache):
    """-DDTMK_HOT_FIRST (measurement): the workers' hot functions under names that sort right after
    the kernel's entry (the cubin orders subroutines by mangled name)."""
    ptx = _ptx(("DTMK_HOT_FIRST",))
    names = re.findall(r"^\.func\s+(?:\(\.param [^)]*func_retval0[^)]*\)\s+)?(\w+)", ptx, re.M)
    hot = [n for n in names if n.startswith("_Z10a")]
    for f in ("a0run_task", "a1run_body", "a2ws_projx", "a3wsgateup", "a4stagenrm", "a6wait_evt"):
        assert any(n.startswith(f"_Z10{f}") for n in hot), f
    assert not any(n.startswith(("_Z8run_body", "_Z10wait_event")) for n in names)
    assert all(n < "_Z10hook_event" for n in hot) and not any("_Z10a" <= n < "_Z10hook_event" for n in set(names) - set(hot))
