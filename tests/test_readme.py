"""The README's examples are real: its C monitor builds with clang, loads, verifies and
counts; its queries compile and verify; its commands exist."""
import re
import subprocess
from pathlib import Path

from dtrace_mk.abi import context
from dtrace_mk.bpf.elf import load_object
from dtrace_mk.cli import build_parser
from dtrace_mk.lang.pipeline import compile_query
from dtrace_mk.runtime.reference import ReferenceRuntime

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_c_monitor_builds_verifies_and_counts(tmp_path, clang):
    src = re.search(r"```c\n(.*?)```", README, re.S).group(1)
    (tmp_path / "mon.c").write_text(src)
    subprocess.run([clang, "-target", "bpf", "-O2", "-g", "-c", "mon.c", "-o", "mon.o",
                    "-I", str(REPO / "dtrace_mk/abi/include")], cwd=tmp_path, check=True)
    obj = load_object(tmp_path / "mon.o")
    rt = ReferenceRuntime(num_workers=1)
    aid = rt.attach(obj)          # verifies
    for dur in (100, 3000, 3500):
        rt.fire(context.pack("task:end", task_class=3, dur_ns=dur))
    snap = rt.maps(aid)["lat"].snapshot()
    (key, buckets), = snap.items()
    assert sum(buckets) == 3 and buckets[7] == 1 and buckets[12] == 2
    cov, = rt.coverage(aid)
    assert (cov.eligible, cov.executed) == (3, 3)


def test_queries_compile_and_verify():
    queries = re.findall(r"-e '([^']+)'", README)
    assert len(queries) >= 3
    for q in queries:
        compile_query(q)


def test_commands_table_names_real_commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in re.findall(r"^\| `([a-z-]+)", README, re.M):
        assert name in sub.choices, name
