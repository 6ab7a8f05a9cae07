"""The build-variant tables of bench/hooks.py (BUILD_VARIANTS, BUILD_VARIANT_RUNS), read
from its source: the bench imports the GPU stack, the tests that check these tables run
in CI without it."""
import ast

from dtrace_mk.kernels import KERNEL_DIR


def hooks_table(name: str) -> dict:
    """The literal assigned to `name` at the top level of bench/hooks.py."""
    tree = ast.parse((KERNEL_DIR.parents[0] / "bench" / "hooks.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench/hooks.py assigns no {name}")
