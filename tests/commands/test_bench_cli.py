"""`dtrace-mk bench`: the benchmarks' declarations (REQUIRES / CPU_MODE read from their
sources), the refusal of a GPU benchmark without enough GPUs, the command line it runs,
and real runs of a CPU benchmark and of a GPU benchmark's --help."""
import ast
import sys
from pathlib import Path

import pytest

from dtrace_mk.cli import main
from dtrace_mk.commands import bench as B
from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import gpu_build

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _has_main(path: Path) -> bool:
    return "__main__" in path.read_text()


def test_every_runnable_script_of_bench_is_listed_with_a_declaration():
    """A script with a __main__ guard is a benchmark: it must declare REQUIRES (read_bench
    raises otherwise), and only helpers without one are left out of the list."""
    found = B.benchmarks(BENCH)
    runnable = {p.stem for p in BENCH.glob("*.py") if _has_main(p)}
    assert set(found) == runnable
    assert set(B.HELPERS) == {p.stem for p in BENCH.glob("*.py")} - runnable
    assert all(b.summary and b.path.parent == BENCH for b in found.values())


@pytest.mark.parametrize("name, requires, gpus, cpu_mode", [
    ("hooks", "gpu", 1, None),
    ("megakernel", "gpu", 1, None),
    ("tp", "gpu:2", 2, None),
    ("compiled", "gpu", 1, "--cpu"),
    ("vm", "cpu", 0, None),
    ("collector", "cpu", 0, None),
    ("agent_host", "cpu", 0, None),
])
def test_declarations(name, requires, gpus, cpu_mode):
    b = B.benchmarks(BENCH)[name]
    assert (b.requires, b.gpus, b.cpu_mode) == (requires, gpus, cpu_mode)


def test_cpu_benchmarks_import_no_cupy():
    """A "cpu" declaration agrees with the code: the script imports no CuPy itself."""
    for b in B.benchmarks(BENCH).values():
        src = b.path.read_text()
        names = {a.name.split(".")[0] for n in ast.walk(ast.parse(src))
                 if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        if b.requires == "cpu":
            assert "cupy" not in names, b.name


@pytest.mark.parametrize("source, message", [
    ('"""x"""\nimport os\n', 'REQUIRES: expected "cpu", "gpu" or "gpu:N", got None'),
    ('"""x"""\nREQUIRES = "tpu"\n', "got 'tpu'"),
    ('"""x"""\nREQUIRES = "gpu:0"\n', "got 'gpu:0'"),
    ('"""x"""\nREQUIRES = "gpu:"\n', "got 'gpu:'"),
    ('"""x"""\nREQUIRES = 1\n', "got 1"),
    ('def (:\n', "cannot read the benchmark"),
])
def test_a_bad_declaration_names_the_file(tmp_path, source, message):
    p = tmp_path / "b.py"
    p.write_text(source)
    with pytest.raises(UserError) as e:
        B.read_bench(p)
    assert str(e.value).startswith(f"{p}: ") and message in str(e.value), str(e.value)


def test_summary_is_the_first_sentence():
    assert B._summary("One thing.  Two.\nThree\n\nNext paragraph.") == "One thing."
    assert B._summary("Wrapped first\nline. And more.") == "Wrapped first line."
    long = "word " * 40
    s = B._summary(long)
    assert len(s) == 100 and s.endswith("...")


NONE = lambda: (0, "CUDA reports no device")   # noqa: E731
ONE = lambda: (1, "")                           # noqa: E731


@pytest.mark.parametrize("name, args, count, why", [
    ("hooks", [], NONE, "hooks needs 1 GPU, this machine has 0 GPUs (CUDA reports no device)"),
    ("hooks", [], ONE, None),
    ("hooks", ["--help"], NONE, None),
    ("hooks", ["-h"], NONE, None),
    ("compiled", [], NONE, "compiled needs 1 GPU, this machine has 0 GPUs (CUDA reports no device); "
                           "'--cpu' runs its CPU-only part"),
    ("compiled", ["--cpu", "--out", "x"], NONE, None),
    ("tp", [], ONE, "tp needs 2 GPUs, this machine has 1 GPU"),
    ("tp", [], lambda: (2, ""), None),
    ("vm", [], NONE, None),
])
def test_refusal(name, args, count, why):
    assert B.refusal(B.benchmarks(BENCH)[name], args, count) == why


def test_command_lines(monkeypatch):
    from dtrace_mk.commands import diagnose
    found = B.benchmarks(BENCH)
    assert B.command(found["hooks"], ["--reps", "3"]) == [sys.executable, str(BENCH / "hooks.py"), "--reps", "3"]
    monkeypatch.setattr(diagnose, "find_mpiexec", lambda: "/x/mpirun")
    monkeypatch.setattr(diagnose, "mpi_flavour", lambda exe: "openmpi")
    cmd = B.command(found["tp"], ["--presets", "tiny"])
    assert cmd[0] == "/x/mpirun" and "--oversubscribe" in cmd
    assert cmd[cmd.index("-n"):] == ["-n", "2", sys.executable, str(BENCH / "tp.py"), "--presets", "tiny"]
    monkeypatch.setattr(diagnose, "mpi_flavour", lambda exe: "mpich")
    assert B.command(found["tp"], []) == ["/x/mpirun", "-n", "2", sys.executable, str(BENCH / "tp.py")]


def test_cli_lists_the_benchmarks(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    rows = {l.split()[0]: l.split()[1] for l in out.splitlines()[2:-1]}
    assert rows == {n: b.requires + ("*" if b.cpu_mode else "") for n, b in B.benchmarks(BENCH).items()}


def test_cli_unknown_benchmark(capsys):
    assert main(["bench", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "dtrace-mk bench: no benchmark 'nosuch' in" in err and "known: agent_host, collector, compiled," in err


def test_cli_refuses_a_gpu_benchmark_without_a_gpu_before_starting_it(capsys, monkeypatch):
    monkeypatch.setattr(gpu_build, "gpu_count", NONE)
    monkeypatch.setattr(B.subprocess, "run", lambda *a, **k: pytest.fail("started anyway"))
    assert main(["bench", "hooks", "--presets", "1b"]) == 2
    assert capsys.readouterr().err.strip() == ("dtrace-mk bench: hooks needs 1 GPU, this machine has 0 GPUs "
                                               "(CUDA reports no device)")


def test_cli_runs_a_cpu_benchmark(capfd):
    """bench/vm.py for real (a short run): its table, and the status of the script."""
    assert main(["bench", "vm", "--seconds", "0.02"]) == 0
    out, err = capfd.readouterr()
    assert f"dtrace-mk bench: {sys.executable} {BENCH / 'vm.py'} --seconds 0.02" in err
    assert "verifier on" in out and "straight line" in out


def test_agent_host_bench_runs_only_when_device_and_host_summaries_agree(capfd):
    """bench/agent_host.py (a short run): both modes ship the same records for both ranks
    of the 2-rank job (else it exits before timing), and device summaries feed the host
    agent only the comm records."""
    assert main(["bench", "agent_host", "--steps", "8", "--repeat", "1", "--window", "3", "--cases", "tiny:2"]) == 0
    out, _ = capfd.readouterr()
    rows = [ln.split("|") for ln in out.splitlines() if ln.startswith("| tiny x2 |")]
    assert [r[2].strip() for r in rows] == ["0", "1"]
    assert all(0 < int(r[4]) < int(r[3]) for r in rows), out        # records fed per step: device < host


def test_cli_passes_options_through_and_the_status_back(capfd, monkeypatch):
    monkeypatch.setattr(gpu_build, "gpu_count", NONE)      # --help is never refused
    assert main(["bench", "hooks", "--help"]) == 0
    assert "usage: hooks.py" in capfd.readouterr().out
    assert main(["bench", "vm", "--no-such-option"]) == 2   # argparse's status, from the script
    assert "unrecognized arguments: --no-such-option" in capfd.readouterr().err


def test_missing_bench_directory(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(B.ENV_BENCH_DIR, str(tmp_path / "nope"))
    assert main(["bench"]) == 2
    assert "no bench/ directory at" in capsys.readouterr().err
