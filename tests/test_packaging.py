"""The distribution installs the non-core folders under the dtrace_mk namespace only."""
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_python_package_dir_is_listed():
    tool = _pyproject()["tool"]["setuptools"]
    listed, mapping = set(tool["packages"]), tool["package-dir"]
    found = set()
    for top, ns in (("dtrace_mk", "dtrace_mk"), ("collectors", "dtrace_mk.collectors"),
                    ("exporters", "dtrace_mk.exporters"), ("launch", "dtrace_mk.launch"),
                    ("kernels", "dtrace_mk.kernels")):
        assert mapping[ns] == top
        for init in (REPO / top).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / top).parts
            found.add(".".join((ns,) + rel))
    assert found <= listed, f"packages missing from pyproject: {sorted(found - listed)}"


def test_no_generic_top_level_names():
    for name in _pyproject()["tool"]["setuptools"]["packages"]:
        assert name == "dtrace_mk" or name.startswith("dtrace_mk."), name


def test_namespaced_imports_work():
    import dtrace_mk.collectors
    import dtrace_mk.exporters
    import dtrace_mk.kernels
    import dtrace_mk.launch
    assert (dtrace_mk.kernels.KERNEL_DIR / "dtrace_mk_abi.h").exists()


def test_readme_opens_with_two_commands_and_ci_calls_the_test_one():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash|console)?\n(.*?)```", readme, re.S)
    first = [l for l in blocks[0].splitlines() if l.strip() and not l.startswith("#")]
    assert len(first) == 2, first
    ci = (REPO / ".ci" / "run").read_text()
    assert first[1].strip() in ci
