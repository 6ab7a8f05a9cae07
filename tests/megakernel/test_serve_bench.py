"""CI (no GPU): bench/serve.py reads the figures off the jobs' own output lines -- the GPU
serve loop's "served ... us/step of launch time" and `dtrace-mk run`'s decode step -- and a
job whose output lacks them is an error that names the line, not a zero."""

import json
import re

import pytest

SERVE_LINE = ("[rank 0] served 400 steps (2..401) in 1.937 s wall (1 resident launch), 3841 us/step of launch "
              "time, 1600 tokens; the first 2 steps warmed the kernel up, not observed (0 records not fed); "
              "hook records dropped by full rings: 0 (counted lost)\n"
              "[rank 0] device summaries: 25 windows of 16 steps (the last ones shorter) read; 0 records fed "
              "to the host agent\n")


@pytest.fixture(scope="module")
def serve(load_bench):
    return load_bench("serve")


def test_a_serve_job_gives_launch_and_wall_time_and_its_diagnosis(serve, tmp_path):
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"verdict": "fault", "coverage": {"eligible": 123, "lost": 0}, "findings": [
        {"cause": "late_notification", "task_class": "rmsnorm", "layer": 3, "steps": [20, 21, 22],
         "confidence": 0.71}]}))
    fig = serve.parse("sm", SERVE_LINE, res)
    assert fig["launch_us"] == 3841.0 and fig["wall_us"] == pytest.approx(1.937e6 / 400)
    assert (fig["verdict"], fig["lost"], fig["eligible"], fig["records_fed"]) == ("fault", 0, 123, 0)
    assert fig["findings"] == ["late_notification rmsnorm layer 3 steps 20-22 conf 0.71"]


def test_the_kernel_floor_is_run_s_decode_step(serve, tmp_path):
    out = "model 1b, batch 4, 400 steps, 132 workers, backend gpu\ndecode step: mean 1312.5 us, min 1312.5 us\n"
    assert serve.parse("kernel", out, tmp_path / "none.json") == {"launch_us": 1312.5, "wall_us": 1312.5}


def test_output_without_the_figure_is_an_error_naming_the_line(serve, tmp_path):
    with pytest.raises(ValueError, match="us/step of launch time"):
        serve.parse("workers", "[rank 0] served 400 steps in 1.0 s wall (stopped): 3 requests", tmp_path / "r.json")
    with pytest.raises(ValueError, match="decode step: mean"):
        serve.parse("kernel", "decode step (simulated): mean 5.0 us", tmp_path / "r.json")


def test_jobs_are_the_user_s_commands(serve, tmp_path):
    argv = serve.job_argv("sm", "1b", 400, 4, "device", tmp_path / "r.json")
    assert argv[1:] == ["-m", "dtrace_mk.launch.serve", "--backend", "gpu", "--model", "1b", "--steps", "400",
                        "--batch", "4", "--observer", "sm", "--summaries", "device", "--result", str(tmp_path / "r.json")]
    assert serve.job_argv("kernel", "tiny", 8, 1, "device", tmp_path / "r.json")[1:4] == ["-m", "dtrace_mk", "run"]


def test_a_config_may_name_a_summary_window(serve, tmp_path):
    argv = serve.job_argv("workers:w64", "tiny", 400, 4, "device", tmp_path / "r.json")
    assert argv[argv.index("--observer") + 1] == "workers" and argv[-2:] == ["--summary-window", "64"]
    assert serve.config_parts("sm") == ("sm", None, ()) and serve.config_parts("sm:w8") == ("sm", 8, ())
    for bad in ("kernel:w8", "workers:64", "workers:wx", "gpu"):
        with pytest.raises(ValueError, match="expected one of kernel, workers, sm, smpin"):
            serve.config_parts(bad)


def test_smpin_is_sm_with_its_observers_calibrated_and_pinned(serve, tmp_path):
    """smpin: `serve --observer sm --observer-place calibrate` (session 52), named, not in the
    default list; the ratio smpin/sm compares it with the hardware's placement."""
    argv = serve.job_argv("smpin:w32", "1b", 200, 4, "device", tmp_path / "r.json")
    assert argv[argv.index("--observer") + 1] == "sm" and argv[argv.index("--observer-place") + 1] == "calibrate"
    assert argv[-2:] == ["--summary-window", "32"]
    assert "--observer-place" not in serve.job_argv("sm", "1b", 200, 4, "device", tmp_path / "r.json")
    assert "smpin" not in serve.CONFIGS and serve.config_parts("smpin") == ("smpin", None, ())


def test_a_config_may_add_measurement_defines(serve, tmp_path):
    """workers+DTMK_DRAIN_POLL: serve --kernel-define per define (session 47's poller A/B)."""
    assert serve.config_parts("workers:w64+DTMK_DRAIN_POLL+DTMK_DRAIN_POLL_ACQ") == \
        ("workers", 64, ("DTMK_DRAIN_POLL", "DTMK_DRAIN_POLL_ACQ"))
    argv = serve.job_argv("workers+DTMK_DRAIN_POLL", "1b", 400, 4, "device", tmp_path / "r.json")
    assert argv[argv.index("--observer") + 1] == "workers" and argv[-2:] == ["--kernel-define", "DTMK_DRAIN_POLL"]
    for bad, what in (("kernel+DTMK_X", "+DTMK_X"), ("workers+DRAIN", "+DRAIN"), ("sm+DTMK_A=b", "+DTMK_A=b")):
        with pytest.raises(ValueError, match=re.escape(what) + ": a define is DTMK_NAME or DTMK_NAME=N"):
            serve.config_parts(bad)


def test_rounds_alternate_and_ratios_pair_the_medians(serve, monkeypatch):
    """Each round runs every config (odd rounds in reverse order); the ratios are medians over
    medians: each config over kernel, sm over workers, smpin over sm."""
    from types import SimpleNamespace
    us = {"kernel": [1400.0, 1420.0], "workers": [4000.0, 4100.0], "sm": [4600.0, 4800.0], "smpin": [5200.0, 5400.0]}
    order = []

    def job(config, preset, a, log, rnd=0):
        order.append(config)
        x = us[config][rnd]
        return {"launch_us": x, "wall_us": x}
    monkeypatch.setattr(serve, "run_job", job)
    res = serve.bench_preset("1b", SimpleNamespace(configs="kernel,workers,sm,smpin", reps=2, steps=200, batch=4,
                                                   summaries="device"), print)
    assert order == ["kernel", "workers", "sm", "smpin", "smpin", "sm", "workers", "kernel"]
    r = res["ratios"]
    assert r["smpin/sm"] == pytest.approx(5300 / 4700) and r["sm/workers"] == pytest.approx(4700 / 4050)
    assert r["smpin/kernel"] == pytest.approx(5300 / 1410) and "smpin/smpin" not in r
