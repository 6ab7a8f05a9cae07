"""The collector saves its result whether or not the OpenTelemetry SDK imports: only the
modules that export spans need it (dtrace_mk.exporters loads them at first use), and a
missing SDK is then named.  (The device image had no SDK: the collector died saving its
diagnosis after the job ran, and the launcher's partial-result replay crashed.)"""
import os
import subprocess
import sys

import pytest


def _env_without_otel(tmp_path):
    fake = tmp_path / "nootel" / "opentelemetry"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("No module named \'opentelemetry\' (blocked by the test)")\n')
    path = [str(tmp_path / "nootel")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def test_results_save_without_the_sdk_and_span_export_names_it(tmp_path):
    code = ("from dtrace_mk.exporters import records_path_for, save_result, MetricsRegistry\n"
            "save_result(r'%s', {'findings': []})\n"
            "try:\n    from dtrace_mk.exporters import export_result\n"
            "except ImportError as e:\n    print('ERR', e)\n") % (tmp_path / "r.json")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env_without_otel(tmp_path))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "r.json").is_file()
    assert "ERR exporting spans needs the OpenTelemetry SDK" in p.stdout and "blocked by the test" in p.stdout


@pytest.mark.mpi
def test_a_job_whose_collector_has_no_sdk_still_ends_with_its_diagnosis(runtime_dir, tmp_path):
    from dtrace_mk.commands.diagnose import find_mpiexec
    find_mpiexec()
    out = tmp_path / "res.json"
    p = subprocess.run([sys.executable, "-m", "dtrace_mk", "launch", "-n", "1", "--backend", "sim", "--quiet",
                        "--out", str(out), "--", sys.executable, "-m", "dtrace_mk.launch.serve", "--model", "tiny",
                        "--steps", "8"], capture_output=True, text=True, env=_env_without_otel(tmp_path), timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "verdict none" in p.stdout and out.is_file()
