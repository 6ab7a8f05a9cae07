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


def test_wheel_ships_kernels_headers_and_data(tmp_path):
    """A real (non-editable) build carries what the code loads at run time."""
    import subprocess
    import sys
    import zipfile
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(tmp_path)],
                   check=True, capture_output=True)
    (whl,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for must in ("dtrace_mk/kernels/megakernel.cu", "dtrace_mk/kernels/dtrace_mk_abi.h",
                 "dtrace_mk/kernels/bpf_vm.cuh", "dtrace_mk/kernels/build.py",
                 "dtrace_mk/abi/include/dtrace_mk_bpf.h", "dtrace_mk/megakernel/data/cost_table.json",
                 "dtrace_mk/runtime/monitors/summary_tasks.d", "dtrace_mk/runtime/monitors/summary_comm.d",
                 "dtrace_mk/collectors/diagnose.py",
                 "dtrace_mk/exporters/spans.py", "dtrace_mk/launch/__init__.py"):
        assert must in names, must
    assert not any(n.split("/")[0] in ("collectors", "exporters", "launch", "kernels") for n in names)
