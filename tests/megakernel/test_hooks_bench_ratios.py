"""CI (no GPU): bench/hooks.py's last table, each build's monitors over its own off with the
launches' range (own_off), and benchio.launch_ratios' pairing by round."""
import pytest


def test_launch_ratios_pair_launches_by_round(load_bench):
    lr = load_bench("benchio").launch_ratios
    # off is timed again after the rounds (bench/hooks.py's live_idle loop): only the first
    # len(summary) off launches pair with the summary's
    r = lr({"summary": [110.0, 132.0, 111.0], "off": [100.0, 110.0, 100.0, 50.0, 50.0]}, "summary", "off")
    assert r["n"] == 3
    assert r["ratios"] == pytest.approx([0.10, 0.20, 0.11])
    assert (r["median"], r["lo"], r["hi"]) == pytest.approx((0.11, 0.10, 0.20))
    assert lr({"summary": [1.0]}, "summary", "off") == {}
    assert lr({"summary": [], "off": [1.0]}, "summary", "off") == {}


def test_own_off_takes_each_build_over_its_own_off(load_bench):
    hooks = load_bench("hooks")
    times = {"nohooks": [1000.0, 1000.0], "off": [1010.0, 1010.0, 990.0, 990.0], "off2": [1010.0, 1020.1],
             "summary": [1373.6, 1383.7], "off_obssm4defer": [1030.0, 1060.0],
             "summary_obssm4defer": [1102.1, 1166.0], "summary_cm_obssm4defer": [1081.5, 1123.6],
             "summary_cmgen_obssm4defer": [1091.8, 1144.8]}
    t = hooks.own_off(times, ("obssm4defer",))
    d, b = t["default"], t["obssm4defer"]
    assert d["off"]["median"] == pytest.approx(0.01)                      # over nohooks
    assert d["summary"]["ratios"] == pytest.approx([0.36, 0.37])          # over the default's off
    assert "summary_cm" not in d                                          # not run: left out, not zero
    assert b["off"]["ratios"] == pytest.approx([0.03, 0.06])              # the build's off over nohooks
    assert b["summary"]["ratios"] == pytest.approx([0.07, 0.10])          # over its OWN off, not the default's
    assert (b["summary"]["lo"], b["summary"]["hi"]) == pytest.approx((0.07, 0.10))
    assert b["summary_cm"]["median"] == pytest.approx(0.055)
    assert b["summary_cmgen"]["ratios"] == pytest.approx([0.06, 0.08])   # the generic helpers' A/B run
    lines = hooks.own_off_lines("1b", t)
    assert len(lines) == 3 and lines[0].split()[:2] == ["preset", "build"]
    row = lines[2]
    assert row.split()[:2] == ["1b", "obssm4defer"]
    assert "+8.50% [+7.00..+10.00]" in row and "+4.50% [+3.00..+6.00]" in row and "+7.00% [+6.00..+8.00]" in row
    assert lines[1].rstrip().endswith("-")                                # the default's missing summary_cm


def test_a_runs_name_splits_at_the_build_it_ends_with(load_bench):
    """Build names hold "_" (obssm4defer_w4) and may end one another (obssm4defer_ring4 ends
    with ring4): the longest build that ends the name is the build (session 37: rsplit at the
    last "_" took "w4" for a build and the bench stopped)."""
    split = load_bench("hooks").run_and_build
    builds = ("obssm4defer", "obssm4defer_w4", "ring4", "obssm4defer_ring4")
    assert split("summary_cm_obssm4defer_w4", builds) == ("summary_cm", "obssm4defer_w4")
    assert split("off_obssm4defer_ring4", builds) == ("off", "obssm4defer_ring4")
    assert split("summary_ring4", builds) == ("summary", "ring4")
    assert split("summary_obssm4defer", builds) == ("summary", "obssm4defer")
    assert split("summary_cm", builds) == ("summary_cm", None)              # a default build's run
    assert split("off", ()) == ("off", None)
    hooks = load_bench("hooks")
    for name in hooks.BUILD_VARIANTS:                                       # every variant, every run
        for run in hooks.BUILD_VARIANT_RUNS.get(name, hooks.BUILD_RUNS):
            assert split(f"{run}_{name}", hooks.BUILD_VARIANTS) == (run, name)


def test_the_targets_table_reads_each_target_from_the_paired_ratios(load_bench):
    """bench/hooks.py's last lines: issue 5's targets, each met or not with its figure -- off
    from the default build, hot / compiled (the shipped summary_cm, not the summary_cmgen A/B)
    from the best build over its OWN off, the trace
    against the cheapest summary, bytes on the wire, and no attach latency from a clock
    pairing that has a worker load a generation before the host wrote it (session 49)."""
    hooks = load_bench("hooks")
    times = {"nohooks": [1000.0, 1000.0], "off": [1004.0, 1004.0], "trace": [1030.0, 1030.0],
             "summary": [1300.0, 1300.0], "off_obssm4fold": [1020.0, 1020.0],
             "summary_obssm4fold": [1060.8, 1060.8], "summary_cm_obssm4fold": [1030.1, 1030.1],
             "summary_cmgen_obssm4fold": [1021.0, 1021.0]}    # the generic-helper A/B: not the target's
    r = {"preset": "1b", "own_off": hooks.own_off(times, ("obssm4fold",)),
         "us_per_step": {k: v[0] for k, v in times.items()},
         "trace_wire_bytes_per_step": 211_788, "summary_wire_bytes": 562,
         "attach_cmd_to_first_event_ms_median": 6.3,
         "attach": [{"write_to_first_load_ms": 0.4, "clock_err_us": 4.6}]}
    lines = hooks.target_lines(r)
    assert lines == [
        "1b     off <= 0.5% (hook build / no hooks): met (+0.40% [+0.40%..+0.40%])",
        "1b     summary hot <= 5% (over its own off): met (+4.00% [+4.00%..+4.00%], obssm4fold summary)",
        "1b     summary compiled <= 1%: met (+0.99% [+0.99%..+0.99%], obssm4fold summary_cm)",
        "1b     summary >= 5x cheaper than the trace: NOT met (trace +2.59% / summary +0.99% (obssm4fold summary_cm) = 2.6x)",
        "1b     >= 100x fewer bytes (wire): met (377x)",
        "1b     hot attach <= 10 ms (command -> first counted event): met (6.300 ms)"]
    # rounds on both sides of a target: the verdict is the median's, and the line says they straddle
    times.update({"summary_cm_obssm4fold": [1005.0, 1009.0, 1030.0], "off_obssm4fold": [1000.0] * 3,
                  "nohooks": [1000.0] * 3, "off": [1004.0, 1004.0, 1010.0]})
    r2 = dict(r, own_off=hooks.own_off(times, ("obssm4fold",)))
    got = hooks.target_lines(r2)
    assert got[0] == "1b     off <= 0.5% (hook build / no hooks): met (+0.40% [+0.40%..+1.00%]; the rounds straddle it)"
    assert got[2] == ("1b     summary compiled <= 1%: met (+0.90% [+0.50%..+3.00%], obssm4fold summary_cm; "
                      "the rounds straddle it)")
    r["attach"] = [{"write_to_first_load_ms": -2.682, "clock_err_us": 4.6}]
    assert lines[-1] != hooks.target_lines(r)[-1]
    assert hooks.target_lines(r)[-1].endswith("not measured: a load before the write: the clock pairing is off (-2.682 ms)")
    del r["own_off"]["default"]["off"], r["trace_wire_bytes_per_step"]
    got = hooks.target_lines(r)
    assert got[0].endswith("off <= 0.5% (hook build / no hooks): not measured") and got[4].endswith("not measured")


class FakeMegakernel:                         # the layer below (gpu.Megakernel) stands in here
    SMS = list(range(132))

    def __init__(self, cfg, batch, weights, defines):
        self.defines, self.order = defines, None

    def place_workers(self, order=None):
        self.order = list(self.SMS) if order is None else list(order)
        return sorted(self.SMS)


@pytest.fixture
def fake_hooks(load_bench, monkeypatch):
    hooks = load_bench("hooks")
    monkeypatch.setattr(hooks.gpu, "Megakernel", FakeMegakernel)
    monkeypatch.setattr(hooks, "PLACED", [])
    monkeypatch.setattr(hooks, "SM_IDS", [])
    monkeypatch.setattr(hooks, "OBS_PIN", [])
    return hooks


def test_hw_placement_leaves_the_builds_alone(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "hw")
    mk = fake_hooks.megakernel(None, None, ("DTMK_NO_HOOKS",))
    assert (mk.defines, mk.order) == (("DTMK_NO_HOOKS",), None)
    fake_hooks.place_round(3)
    assert mk.order is None and fake_hooks.PLACED == []


def test_sorted_placement_pins_every_build_to_the_same_sms(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "sorted")
    mk = fake_hooks.megakernel(None, None, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"))
    assert mk.defines == ("DTMK_OBS_SM", "DTMK_OBS_SMS=4", "DTMK_SM_WORKER") and mk.order == list(range(132))
    assert fake_hooks.megakernel(None, None).defines == ("DTMK_SM_WORKER",)        # the default build too
    assert fake_hooks.placed(("DTMK_NO_HOOKS",)) == ("DTMK_NO_HOOKS", "DTMK_SM_WORKER")  # what --offpath precompiles
    fake_hooks.place_round(1)                                                      # sorted stays sorted
    assert mk.order == list(range(132))


def test_paired_placement_gives_every_build_one_order_per_round(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "paired")
    a, b = fake_hooks.megakernel(None, None), fake_hooks.megakernel(None, None, ("DTMK_NO_HOOKS",))
    fake_hooks.place_round(0)
    r0 = a.order
    assert b.order == r0 and sorted(r0) == list(range(132)) and r0 != list(range(132))
    fake_hooks.place_round(1)
    assert b.order == a.order != r0                                                # a new draw per round
    fake_hooks.place_round(0)
    assert a.order == r0                                                           # seeded by the round
    monkeypatch.setattr(FakeMegakernel, "SMS", list(range(128)))                   # a grid on other SMs
    with pytest.raises(RuntimeError, match=r"--placement paired: build \('DTMK_X',\) gets SMs .*\(128\)"):
        fake_hooks.megakernel(None, None, ("DTMK_X",))


def test_obs_sms_put_the_observers_on_the_sms_named_in_every_round(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "paired")
    monkeypatch.setattr(fake_hooks, "OBS_PIN", [[32, 33, 65, 68]])
    obs = fake_hooks.megakernel(None, None, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"))
    plain = fake_hooks.megakernel(None, None)
    for rnd in (0, 1):
        fake_hooks.place_round(rnd)
        assert obs.order == plain.order and obs.order[-4:] == [32, 33, 65, 68]   # observers = the last workers
        assert sorted(obs.order) == list(range(132))
    assert obs.order[:128] != fake_hooks.round_order(0)[:128]                    # the rest still drawn per round
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "sorted")
    assert fake_hooks.round_order(7) == [x for x in range(132) if x not in (32, 33, 65, 68)] + [32, 33, 65, 68]


def test_obs_sms_that_do_not_fit_the_grid_or_the_build_are_refused(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "sorted")
    monkeypatch.setattr(fake_hooks, "OBS_PIN", [[1, 2, 3, 4], [1, 2, 3, 140]])
    with pytest.raises(RuntimeError, match=r"--obs-sms: SMs \[140\] are not among the 132 the grid gets \(0..131\)"):
        fake_hooks.megakernel(None, None)
    monkeypatch.setattr(fake_hooks, "OBS_PIN", [[1, 2]])
    monkeypatch.setattr(FakeMegakernel, "obs_sm", True, raising=False)
    monkeypatch.setattr(FakeMegakernel, "obs_sms", 4, raising=False)
    with pytest.raises(RuntimeError, match=r"--obs-sms names 2 SMs \(1,2\); build .* has 4 observer SMs"):
        fake_hooks.megakernel(None, None, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"))


def test_obs_sms_sets_take_turns_by_round_under_either_pinned_placement(fake_hooks, monkeypatch):
    sets = [[32, 33, 65, 68], [128, 129, 130, 131], [0, 1, 16, 17]]
    monkeypatch.setattr(fake_hooks, "OBS_PIN", sets)
    for placement in ("paired", "sorted"):
        monkeypatch.setattr(fake_hooks, "PLACEMENT", placement)
        fake_hooks.PLACED.clear()
        obs = fake_hooks.megakernel(None, None, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"))
        for rnd in (0, 1, 2, 3, 5):
            fake_hooks.place_round(rnd)                                  # (sorted too: the set changes)
            assert obs.order[-4:] == sets[rnd % 3] and sorted(obs.order) == list(range(132))
    assert fake_hooks.round_order(4, pins=[32, 33, 65, 68])[-4:] == [32, 33, 65, 68]   # a result's flat list
    assert fake_hooks.pins_text(sets) == "32,33,65,68/128,129,130,131/0,1,16,17"


@pytest.mark.parametrize("argv, err", [
    (["--placement", "best"], "invalid choice: 'best'"),
    (["--obs-sms", "1,2,3,4"], "--obs-sms: with --placement sorted or paired"),
    (["--placement", "paired", "--obs-sms", "1,1,2,3"], "--obs-sms: distinct SM ids in each set, got '1,1,2,3'"),
    (["--placement", "paired", "--obs-sms", "1,2/3,3"], "--obs-sms: distinct SM ids in each set"),
    (["--placement", "paired", "--obs-sms", "1,2/3"], "--obs-sms: every set names the same number of SMs"),
    (["--placement", "paired", "--reps", "2", "--obs-sms", "1/2/3"], "--obs-sms: 3 sets need at least as many rounds"),
    (["--placement", "paired", "--obs-sms", "1,x"], "--obs-sms: SM ids separated by commas, sets by '/', got '1,x'")])
def test_bad_placement_arguments_are_refused_by_name(load_bench, capsys, argv, err):
    hooks = load_bench("hooks")
    with pytest.raises(SystemExit):
        hooks.main(argv)
    assert err in capsys.readouterr().err


def test_paired_rounds_list_where_the_observers_ran_beside_each_rounds_cost(fake_hooks, monkeypatch):
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "paired")
    times = {"nohooks": [1000.0] * 3, "off": [1000.0] * 3, "off_obssm4fold": [1000.0] * 3,
             "summary_obssm4fold": [1019.3, 1077.0, 1030.0], "summary_cm_obssm4fold": [1018.8, 1052.3, 1020.0]}
    r = {"preset": "1b", "placement": "paired", "sm_ids": list(range(132)), "obs_sms": [],
         "own_off": fake_hooks.own_off(times, ("obssm4fold",))}
    lines = fake_hooks.round_lines(r)
    assert len(lines) == 4 and lines[0].split()[2:] == ["round", "observer", "SMs", "summary", "summary_cm"]
    for k, line in enumerate(lines[1:]):
        cells = line.split()
        assert cells[:3] == ["1b", "obssm4fold", str(k)]
        assert cells[3] == ",".join(map(str, sorted(fake_hooks.round_order(k, list(range(132)), [])[-4:])))
    assert lines[2].split()[4:] == ["+7.70%", "+5.23%"]                 # round 1's own ratios
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "sorted")              # the result's placement, not this run's
    assert fake_hooks.round_lines(r) == lines
    r["obs_sms"] = [32, 33, 65, 68]                                     # pinned (a flat list before session 51)
    assert {line.split()[3] for line in fake_hooks.round_lines(r)[1:]} == {"32,33,65,68"}
    r["obs_sms"] = [[32, 33, 65, 68]]                                   # one set: no per-set lines
    assert {line.split()[3] for line in fake_hooks.round_lines(r)[1:]} == {"32,33,65,68"}
    assert fake_hooks.round_lines(dict(r, placement="hw")) == []        # no order to name
    assert fake_hooks.round_lines(dict(r, placement="sorted")) == []    # one order for every round
    del r["own_off"]["obssm4fold"]                                      # the default build has no observers
    assert fake_hooks.round_lines(r) == []


def test_the_null_program_shows_the_floor_under_the_observer_builds_monitors(fake_hooks, monkeypatch):
    """obssm4fold runs null3 too (a program doing nothing on the summary's hooks: the records'
    capture and push alone, the floor the compiled summary cannot go under): over its own
    off, in the last table and the per-round one; the default build's null3 over its off."""
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "paired")
    assert "null3" in fake_hooks.BUILD_VARIANT_RUNS["obssm4fold"]
    times = {"nohooks": [1000.0] * 2, "off": [1000.0] * 2, "null3": [1200.0, 1210.0], "off_obssm4fold": [1000.0] * 2,
             "null3_obssm4fold": [1021.0, 1023.0], "summary_obssm4fold": [1030.0, 1032.0]}
    t = fake_hooks.own_off(times, ("obssm4fold",))
    assert t["obssm4fold"]["null3"]["ratios"] == pytest.approx([0.021, 0.023])
    assert t["default"]["null3"]["median"] == pytest.approx(0.205)
    rows = fake_hooks.own_off_lines("1b", t)
    assert rows[0].split()[2:6] == ["off", "/nohooks", "null3", "/own"]
    assert "+2.20% [+2.10..+2.30]" in rows[2]
    r = {"preset": "1b", "placement": "paired", "sm_ids": list(range(132)), "obs_sms": [], "own_off": t}
    lines = fake_hooks.round_lines(r)
    assert lines[0].split()[-2:] == ["null3", "summary"] and lines[1].split()[-2:] == ["+2.10%", "+3.00%"]


def test_obs_sms_sets_get_a_median_over_their_own_rounds(fake_hooks):
    times = {"nohooks": [1000.0] * 4, "off": [1000.0] * 4, "off_obssm4fold": [1000.0] * 4,
             "summary_obssm4fold": [1068.0, 1063.0, 1070.0, 1065.0]}   # set 0 rounds 0, 2; set 1 rounds 1, 3
    r = {"preset": "1b", "placement": "sorted", "sm_ids": list(range(132)),
         "obs_sms": [[32, 33, 65, 68], [128, 129, 130, 131]], "own_off": fake_hooks.own_off(times, ("obssm4fold",))}
    lines = fake_hooks.round_lines(r)
    assert [line.split()[3] for line in lines[1:5]] == ["32,33,65,68", "128,129,130,131"] * 2
    assert lines[5].split()[2:4] == ["set", "observer"]
    assert lines[6].split()[2:] == ["0", "32,33,65,68", "+6.90%", "[+6.80..+7.00]"]
    assert lines[7].split()[2:] == ["1", "128,129,130,131", "+6.40%", "[+6.30..+6.50]"]


def test_obs_sms_calibrate_pins_the_cheapest_set_for_every_build(fake_hooks, monkeypatch):
    """--obs-sms calibrate: the production calibration (obs_place.calibrate_session, standing
    in here) runs on the observer-SM build with its summary wired, then every build is placed
    with the observers on the set it chose, in every round."""
    from types import SimpleNamespace
    from dtrace_mk.megakernel import obs_place
    monkeypatch.setattr(fake_hooks, "PLACEMENT", "paired")
    monkeypatch.setattr(fake_hooks, "OBS_CAL", 3)
    obs = fake_hooks.megakernel(None, None, ("DTMK_OBS_SM", "DTMK_OBS_SMS=4"))
    plain = fake_hooks.megakernel(None, None)
    wired = []
    obs.reset = lambda: wired.append("reset")
    obs.set_observer = lambda ptr, state: wired.append((ptr, state))
    live = SimpleNamespace(rt=SimpleNamespace(tables=SimpleNamespace(data=SimpleNamespace(ptr=4096))), state="st")
    seen = {}

    def fake_session(lv, obj, steps, k, progress):
        seen.update(live=lv, obj=obj, steps=steps, k=k, wired=list(wired))
        return obs_place.Calibration(best=[5, 6, 7, 8], us_per_step=[[1.0, 1.0]] * 3,
                                     candidates=[[128, 129, 130, 131], [5, 6, 7, 8], [1, 2, 3, 4]])
    monkeypatch.setattr(obs_place, "calibrate_session", fake_session)
    logged = []
    got = fake_hooks.calibrate_observers({"obssm4fold": {"mk": obs, "live": live}}, SimpleNamespace(obj="mon"),
                                         16, logged.append)
    assert seen == {"live": live, "obj": "mon", "steps": 16, "k": 3, "wired": ["reset", (4096, "st")]}
    assert wired[-1] == (0, None)                                    # unwired again after
    assert got["best"] == [5, 6, 7, 8] and fake_hooks.OBS_PIN == [[5, 6, 7, 8]]
    assert obs.order[-4:] == [5, 6, 7, 8] and plain.order == obs.order
    fake_hooks.place_round(3)
    assert obs.order[-4:] == [5, 6, 7, 8] and plain.order == obs.order
    assert "* observers on SMs 5,6,7,8" in logged[-1]
    with pytest.raises(RuntimeError, match="--obs-sms calibrate: no observer-SM build among --variants"):
        fake_hooks.calibrate_observers({"ring4": {}}, None, 16, logged.append)


@pytest.mark.parametrize("argv", [["--obs-sms", "calibrate"], ["--placement", "paired", "--obs-sms", "calibrate:0"]])
def test_obs_sms_calibrate_needs_a_pinned_placement_and_candidates(load_bench, capsys, argv):
    hooks = load_bench("hooks")
    with pytest.raises(SystemExit):
        hooks.main(argv)
    assert "--obs-sms calibrate[:K]: K >= 1 candidate sets, with --placement sorted or paired" in capsys.readouterr().err


def test_compiled_links_run_side_by_side_and_load_on_the_calling_thread(load_bench):
    """bench/hooks.py Links: the queued links' host halves run at once (a barrier all of them
    must reach together), each module loads on the caller's thread, and a failed link reaches
    its own failed() while the others still load."""
    import threading
    hooks = load_bench("hooks")
    gate = threading.Barrier(3, timeout=10)
    main = threading.get_ident()
    loaded, done, failed, logged = [], [], [], []

    class Live:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def link_work(self):
            def work():
                gate.wait()                                   # all three links in flight together
                if self.fail:
                    raise RuntimeError(f"{self.name}: ptxas error")
                return f"{self.name}.cubin", 1.5
            return work

        def load_linked(self, cubin):
            loaded.append((cubin, threading.get_ident() == main))
    links = hooks.Links(workers=3)                            # (default: at most one per core)
    for name, fail in (("cm", False), ("ring", True), ("obs_cm", False)):
        links.add(Live(name, fail), lambda s, n=name: done.append((n, s)), lambda e, n=name: failed.append((n, str(e))))
    links.run(logged.append)
    assert loaded == [("cm.cubin", True), ("obs_cm.cubin", True)]
    assert done == [("cm", 1.5), ("obs_cm", 1.5)] and failed == [("ring", "ring: ptxas error")]
    assert logged[0].startswith("3 compiled-tier links, 3 at a time") and links.todo == []


def test_a_shuffled_table_round_moves_every_variant_and_repeats_by_seed(load_bench):
    """--order shuffled (session 62): each timed round a permutation seeded by the round, so a
    variant's place (and its neighbours) varies across rounds and a rerun reproduces it; fixed
    keeps the listed order, the way every table before session 62 ran."""
    hooks = load_bench("hooks")
    vs = ["nohooks", "off", "off2", "live_idle", "summary", "trace", "ring_all", "summary_cm", "null3", "mask3"]
    assert all(hooks.round_variants(vs, r, "fixed") == vs for r in range(4))
    rounds = [hooks.round_variants(vs, r, "shuffled") for r in range(8)]
    assert all(sorted(o) == sorted(vs) for o in rounds)                       # each round runs each variant once
    assert rounds == [hooks.round_variants(vs, r, "shuffled") for r in range(8)]   # the seed is the round
    assert len({tuple(o) for o in rounds}) == 8
    for v in ("nohooks", "off"):                                               # no variant keeps its place
        assert len({o.index(v) for o in rounds}) >= 3
    assert len({o[o.index("off") - 1] if o.index("off") else None for o in rounds}) >= 3   # ... nor its predecessor


def test_the_order_flag_is_checked(load_bench, capsys):
    hooks = load_bench("hooks")
    with pytest.raises(SystemExit):
        hooks.main(["--order", "random"])
    assert "--order: invalid choice: 'random'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [(["--late-modules", "4"], "--late-modules: with --offpath"),
                                       (["--offpath", "--late-modules", "-1"], "--late-modules: a count >= 0, got -1")])
def test_late_modules_is_an_offpath_count(load_bench, capsys, argv, msg):
    with pytest.raises(SystemExit):
        load_bench("hooks").main(argv)
    assert msg in capsys.readouterr().err


def test_the_offpath_table_prints_the_late_copies_as_a_build(load_bench, capsys):
    """--late-modules: the default's nohooks / off loaded again after K modules print as build
    `late`, off over its own (late) nohooks and over the early nohooks (off/nh(def))."""
    hooks = load_bench("hooks")
    u = {"nohooks": 1000.0, "off": 1002.0, "off2": 1001.0, "summary": 1370.0,
         "nohooks_late": 995.0, "off_late": 1010.0}
    tok = {k: True for k in u}
    hooks.print_offpath({"card": "H100", "date": "d", "presets": [
        {"preset": "1b", "us_per_step": u, "builds": ["default", "late"], "tokens_equal": tok}]})
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("1b")]
    assert rows[0][:2] == ["1b", "default"] and "+0.20%" in rows[0]
    late = rows[1]
    assert late[:5] == ["1b", "late", "995.0", "1010.0", "-"]
    assert late[5:8] == ["+1.51%", "-", "+1.00%"] and late[8] == "-0.50%" and late[-1] == "True"


def test_the_shadow_sink_reads_the_kernel_s_layout(load_bench, monkeypatch):
    """benchio.shadow_sink (bench/hooks.py wshincta, bench/obs_split.py shadow16 ...): the sink's
    size from megakernel.cu's WSH_CLS / WSH_B; with launch_once it zeroes the sink, then launches."""
    import re
    import sys
    import types

    import numpy as np
    from dtrace_mk.kernels import KERNEL_DIR
    src = (KERNEL_DIR / "megakernel.cu").read_text()
    cls, b = (int(re.search(rf"#define {k} (\d+)", src).group(1)) for k in ("WSH_CLS", "WSH_B"))
    mem = np.full(cls * b + cls + 4, 7, dtype=np.uint64)           # a sink left from earlier launches

    class Dev(np.ndarray):
        def get(self):
            return np.asarray(self).copy()
    fake = types.SimpleNamespace(uint64=np.uint64,
                                 ndarray=lambda shape, dtype, ptr: (mem[:shape[0]].view(Dev)
                                                                    if shape == mem.shape else None))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    mk = types.SimpleNamespace(module=types.SimpleNamespace(get_global=lambda name: name))

    def launch():                                                   # one launch: 5 task:end, 2 dep:release, 5 ready
        assert not mem.any()                                        # (zeroed first)
        mem[3] += 5
        mem[-3:] = (5, 2, 5)
    sb = load_bench("benchio").shadow_sink
    assert sb(mk, launch) == {"hist": 5, "n": [5, 2, 5]}
    mem[cls * b] = 99                                               # a wait sum: not a bin
    assert sb(mk) == {"hist": 5, "n": [5, 2, 5]}                    # without a launch: as it stands
