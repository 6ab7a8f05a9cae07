"""What the demo on GPU ranks must show (shared by tests/gpu/test_launch_gpu.py on 2 GPUs
and tests/launch/test_demo_gpu_fake.py with stand-ins on a CPU machine)."""
import json

from dtrace_mk.commands.diagnose import GPU_LAUNCH_WARMUP_STEPS


def check_gpu_demo(stdout: str, spans_path, workers: int, steps: int, batch: int, model: str = "tiny",
                   warmup: int = GPU_LAUNCH_WARMUP_STEPS):
    """`stdout` of `dtrace-mk demo --backend gpu -f json`: the served steps keep the
    device's numbers: the first launch's `warmup` steps are run but not observed, so the
    `steps` observed ones are warmup .. warmup+steps-1.  The live query's final output on
    both ranks counts task:end per step (attached after the warm-up, early, to the last
    step), the same count every step = the tasks of one step of the rank's graph, its
    coverage exactly that many events (count x steps observed); the diagnosis's confident
    findings (the ones scoring counts: confidence >= 0.8) are ONLY remote_stall rooted at
    rank 1, within the steps of the demo's fault (device steps steps//2 .. steps-1), and
    NO finding (any confidence) names a step outside the observed window (the cold
    warm-up steps above all); `workers`: the rank's megakernel workers (serve: SMs - 1);
    the spans file has spans of both ranks for every observed step, none of a warm-up
    step, and links from each rank's remote waits to the other rank's signal spans, every
    one resolving in the file."""
    first, last = warmup, warmup + steps - 1          # the observed window (device steps)
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import get_preset
    rows = [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]
    assert rows, f"no JSON rows in the demo's output: {stdout[-2000:]}"
    diag = rows[-1]
    assert diag["type"] == "diagnosis" and diag["backend"] == "gpu", diag
    assert diag["query"].startswith("task:end")

    maps = [r for r in rows if r.get("type") == "map" and r.get("name") == "@task_end"]
    assert {r["rank"] for r in maps} == {0, 1}, rows[:-1]
    for m in maps:
        entries = {int(e["key"][0]): int(e["value"]) for e in m["entries"]}
        assert entries, f"rank {m['rank']}: no task:end counted"
        ks = sorted(entries)
        assert ks == list(range(ks[0], ks[-1] + 1)), ks           # contiguous steps
        # attached early (the await-attach command applies 2 steps on and counts from the
        # first step no worker had started: at most RESIDENT_WINDOW further), ran to the end
        assert ks[-1] == last and first < ks[0] <= first + 2 + 4 + 1, ks
        per_step = set(entries.values())
        assert len(per_step) == 1, f"rank {m['rank']}: task:end per step differs: {entries}"
        (tasks,) = per_step
        g = build_graph(get_preset(model), batch, workers, rank=m["rank"], ranks=2)
        assert tasks == len(g.tasks), (m["rank"], tasks, len(g.tasks))
        cov = m["coverage"]
        assert cov["eligible"] == cov["executed"] == tasks * len(ks), cov
        assert cov["lost"] == 0 and cov["throttled"] == 0, cov

    from dtrace_mk.collectors.score import CONFIDENT
    confident = [f for f in diag["findings"] if f["confidence"] >= CONFIDENT]
    assert confident, diag["findings"]
    assert all((f["cause"], f["rank"]) == ("remote_stall", 1) for f in confident), diag["findings"]
    fault_steps = set(range(steps // 2, steps))        # commands/demo.py fault_spec (device steps)
    assert fault_steps <= set(range(first, last + 1))  # ... inside the observed window
    for f in confident:
        assert f["steps"] and set(f["steps"]) <= fault_steps, (f, sorted(fault_steps))
    for f in diag["findings"]:                         # nothing at a warm-up (or unserved) step
        assert set(f["steps"]) <= set(range(first, last + 1)), (f, first, last)

    lines = [json.loads(x) for x in open(spans_path).read().splitlines() if x.strip()]
    assert {s["attributes"]["dtrace_mk.rank"] for s in lines} == {0, 1}
    have = {(s["attributes"]["dtrace_mk.rank"], s["attributes"]["dtrace_mk.step"])
            for s in lines if s["name"].startswith("step ")}
    assert have >= {(r, k) for r in (0, 1) for k in range(first, last + 1)}, sorted(have)[:6]
    early = sorted({s["attributes"].get("dtrace_mk.step") for s in lines
                    if isinstance(s["attributes"].get("dtrace_mk.step"), int)
                    and s["attributes"]["dtrace_mk.step"] < first})
    assert not early, f"spans of warm-up steps {early}"
    assert diag["cross_rank_links"] > 0 and diag["cross_rank_links"] == diag["links"], diag
    by_id = {s["span_id"]: s for s in lines}
    assert len(by_id) == len(lines), "a span id twice in the file"
    for s in lines:
        for ln in s["links"]:
            target = by_id[ln["span_id"]]
            assert target["name"].startswith("comm:signal")
            assert target["attributes"]["dtrace_mk.rank"] != s["attributes"]["dtrace_mk.rank"]
    return diag


def check_aligned_interval_cuts(env, steps: int, interval_ms: int, workers: int, batch: int,
                                model: str = "tiny", warmup: int = GPU_LAUNCH_WARMUP_STEPS):
    """`dtrace-mk launch -n 2 --backend gpu` serving `steps` steps (environment `env`), a
    query attached with an interval clause that prints and clears: rank 0 decides each
    tick and the step its cut starts at, so every tick names the same steps on both ranks;
    the ranges run on without a gap or overlap, each holds exactly its steps' task:end
    events on each rank (the rank's tasks per step times the steps: `workers` per rank),
    and `--merge` renders each tick once with those steps."""
    import subprocess
    import sys
    import threading
    import time
    from dtrace_mk.commands.attach import compile_for_attach
    from dtrace_mk.commands.diagnose import find_mpiexec
    from dtrace_mk.launch import jobs
    from dtrace_mk.launch.api import render_output
    from dtrace_mk.launch.control import ControlClient, wait_for_socket
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import get_preset
    find_mpiexec()
    p = subprocess.Popen([sys.executable, "-m", "dtrace_mk", "launch", "-n", "2", "--backend", "gpu", "--quiet",
                          "--", "python", "-m", "dtrace_mk.launch.serve", "--model", model, "--steps", str(steps),
                          "--batch", str(batch), "--await-attach", "60", "--quiet", "--progress-s", "100"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not jobs.list_jobs() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        started = jobs.list_jobs()
        assert len(started) == 1, f"{len(started)} jobs; the launch: {''.join(lines)[-3000:]}"
        job = started[0]
        assert wait_for_socket(job, time.monotonic() + 120), "".join(lines)[-3000:]
        raw, name, text = compile_for_attach(
            f"task:end {{ @n = count(); }} interval:ms:{interval_ms} {{ print(@n); clear(@n); }}", None)
        _, stream = ControlClient(job).attach(raw, name, text, stream=True, interval_s=600)
        outputs = []
        for msg in stream:
            if msg.get("type") == "output":
                outputs.append(msg)
            elif msg.get("type") == "end":
                break
        assert p.wait(timeout=300) == 0, "".join(lines)[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
    per_rank = {}
    for o in outputs:
        for r, part in o["ranks"].items():
            per_rank.setdefault(int(r), []).extend(part["blocks"])
    assert set(per_rank) == {0, 1}
    ticks = {}
    for r, blocks in per_rank.items():
        ticks[r] = [(b["steps"], blocks[i + 1]) for i, b in enumerate(blocks) if b["type"] == "interval"]
        assert all(m["type"] == "map" and m["name"] == "@n" for _, m in ticks[r])
    assert len(ticks[0]) >= 2, ticks[0]
    # the same steps on each rank; rank 0 may tick once more at the very end (its last
    # clause reaching rank 1 after rank 1's final report: those steps are in rank 1's final map)
    steps_of = {r: [s for s, _ in t] for r, t in ticks.items()}
    assert steps_of[0][:len(steps_of[1])] == steps_of[1], steps_of
    assert len(ticks[1]) >= len(ticks[0]) - 1 and ticks[0][-1][0][1] <= warmup + steps - 1
    for r in (0, 1):
        tasks = len(build_graph(get_preset(model), batch, workers, rank=r, ranks=2).tasks)
        nxt = None
        for (lo, hi), m in ticks[r]:
            assert nxt is None or lo == nxt, (r, steps_of[r])
            assert m["entries"][0]["value"] == m["coverage"]["eligible"] == tasks * (hi - lo + 1), (r, lo, hi, m)
            nxt = hi + 1
    merged = "".join(render_output(o, merge=True) for o in outputs)
    (lo, hi), _ = ticks[0][0]
    assert f", steps {lo}-{hi} (ranks 0, 1) --" in merged, merged
    assert merged.count("(rank 0: steps") <= 1, merged
    return ticks
