"""Observer placement by measurement (dtrace_mk/megakernel/obs_place.py): the orders it gives
place_workers, the candidate sets, the choice (rounds rotated so drift is not charged to the
late candidates), the LiveSession driver and the CLI's --observer-place.  The layer below
(Megakernel, LiveSession) stands in here; tests/gpu/test_obs_place_gpu.py runs the real one."""
from types import SimpleNamespace

import pytest

from dtrace_mk.errors import UserError
from dtrace_mk.megakernel import obs_place
from dtrace_mk.megakernel.obs_place import Calibration, calibrate, candidate_sets, observer_order

IDS = list(range(132))


def test_observer_order_puts_the_observers_last_and_the_workers_in_id_order():
    order = observer_order(IDS[::-1], [65, 32, 68, 33])
    assert order[-4:] == [65, 32, 68, 33]                        # observer m on the m-th SM named
    assert order[:-4] == [x for x in IDS if x not in (32, 33, 65, 68)]


@pytest.mark.parametrize("obs, err", [
    ([1, 2, 3, 140], r"observer SMs \[140\] are not among the 132 SMs the grid gets \(0..131\)"),
    ([1, 2, 2, 3], r"observer SMs: each SM once, got \[1, 2, 2, 3\]")])
def test_observer_order_refuses_sms_the_grid_lacks_or_repeats(obs, err):
    with pytest.raises(UserError, match=err):
        observer_order(IDS, obs)


def test_candidates_are_the_tail_then_distinct_seeded_draws():
    c = candidate_sets(IDS, 4, k=6)
    assert c[0] == [128, 129, 130, 131] and len(c) == 6
    assert len({tuple(x) for x in c}) == 6 and all(len(x) == 4 == len(set(x)) and set(x) <= set(IDS) for x in c)
    assert c == candidate_sets(IDS[::-1], 4, k=6)                # the same on every run
    assert c != candidate_sets(IDS, 4, k=6, seed=1)
    assert len(candidate_sets([3, 5, 7], 2, k=8)) == 3            # a small grid has 3 distinct pairs


@pytest.mark.parametrize("m, k, err", [(0, 3, "0 observer SMs of 132"), (132, 3, "132 observer SMs of 132"),
                                       (4, 0, "want at least one candidate, got 0")])
def test_candidates_refuse_impossible_requests(m, k, err):
    with pytest.raises(UserError, match=err):
        candidate_sets(IDS, m, k)


def fake_card(cost, drift=0.0):
    """place / measure over a cost per set plus `drift` us per launch; records the visits."""
    st = SimpleNamespace(at=None, calls=0, visits=[])

    def place(s):
        st.at = tuple(s)
        st.visits.append(tuple(s))

    def measure():
        st.calls += 1
        return cost[st.at] + drift * (st.calls - 1)
    return st, place, measure


def test_calibration_keeps_the_cheapest_median_and_leaves_the_observers_there():
    a, b, c = (1, 2), (3, 4), (5, 6)
    st, place, measure = fake_card({a: 1300.0, b: 1250.0, c: 1280.0})
    said = []
    cal = calibrate(place, measure, [a, b, c], rounds=3, progress=said.append)
    assert cal.best == [3, 4] and st.at == b
    assert cal.us_per_step == [[1300.0] * 3, [1250.0] * 3, [1280.0] * 3]
    assert st.visits[:9] == [a, b, c, b, c, a, c, a, b]           # round r starts at candidate r
    assert said == [f"observer placement: round {r}/3 of 3 candidate sets" for r in (1, 2, 3)]
    lines = cal.lines()
    assert lines[1].startswith("* observers on SMs 3,4") and lines[1].endswith("+0.00%")
    assert lines[0].startswith("  observers on SMs 1,2") and lines[0].endswith("+4.00%")


def test_rotated_rounds_do_not_charge_a_drift_to_the_later_candidate():
    a, b = (1,), (2,)
    # b is 0.5 us cheaper, and every launch runs 1 us slower than the one before: in a fixed
    # order (a, b, a, b) a would win; rotated (a, b, b, a) b does
    st, place, measure = fake_card({a: 100.0, b: 99.5}, drift=1.0)
    cal = calibrate(place, measure, [a, b], rounds=2)
    assert cal.us_per_step == [[100.0, 103.0], [100.5, 101.5]] and cal.best == [2]


def test_a_tie_goes_to_the_earlier_candidate():
    st, place, measure = fake_card({(1,): 5.0, (2,): 5.0})
    assert calibrate(place, measure, [(2,), (1,)], rounds=2).best == [2]


@pytest.mark.parametrize("cands, rounds, err", [([], 2, "no candidate observer sets"),
                                                ([(1,)], 0, "want at least one round, got 0")])
def test_calibration_refuses_nothing_to_measure(cands, rounds, err):
    with pytest.raises(UserError, match=err):
        calibrate(lambda s: None, lambda: 1.0, cands, rounds)


class FakeLive:
    """A LiveSession over an observer-SM Megakernel stand-in: launches cost by observer set."""

    def __init__(self, cost, obs_sm=True):
        self.log = []
        self.at = None
        live = self

        class Mk:
            obs_sms = 2

            def sm_ids(self):
                return [0, 1, 2, 3, 4, 5]

            def place_observers(self, sms):
                live.at = tuple(sms)
        self.mk = Mk()
        self.mk.obs_sm = obs_sm
        self.cost = cost

    def attach(self, obj, tier=None):
        self.log.append(("attach", obj, tier))
        return 7

    def detach(self, aid):
        self.log.append(("detach", aid))

    def start(self, steps):
        self.log.append(("start", steps))

    def wait(self):
        return SimpleNamespace(elapsed_ms=self.cost(self.at) * 16 / 1e3)


def test_the_session_driver_attaches_the_monitor_for_the_launches_only():
    live = FakeLive(lambda at: 1000.0 + sum(at))
    cal = obs_place.calibrate_session(live, "summary", steps=16, k=4, rounds=2)
    assert cal.candidates[0] == [4, 5] and len(cal.candidates) == 4
    assert cal.best == min(cal.candidates, key=sum) and live.at == tuple(cal.best)
    assert cal.medians() == pytest.approx([1000.0 + sum(c) for c in cal.candidates])
    assert live.log[0] == ("attach", "summary", "hot") and live.log[-1] == ("detach", 7)
    assert live.log[1:-1] == [("start", 16)] * 8


def test_the_session_driver_detaches_when_a_launch_fails_and_refuses_a_build_without_observers():
    def boom(at):
        raise RuntimeError("watchdog")
    live = FakeLive(boom)
    with pytest.raises(RuntimeError, match="watchdog"):
        obs_place.calibrate_session(live, "summary")
    assert live.log[-1] == ("detach", 7)
    with pytest.raises(UserError, match=r"the build has no observer SMs \(--observer sm\)"):
        obs_place.calibrate_session(FakeLive(lambda at: 1.0, obs_sm=False), "summary")


def observer_build(placed: list, **changes):
    """A stand-in for place_observers' Megakernel: 4 observer SMs of 132, placements into `placed`."""
    mk = dict(obs_sm=True, obs_sms=4, idle_sms=0, defines=("DTMK_OBS_SM", "DTMK_SM_WORKER"),
              sm_ids=lambda: IDS, place_workers=lambda order: placed.append(order) or order)
    return SimpleNamespace(**{**mk, **changes})


def test_place_observers_checks_the_build_before_placing():
    from dtrace_mk.megakernel import gpu
    placed = []
    mk = observer_build(placed)
    order = gpu.Megakernel.place_observers(mk, [32, 33, 65, 68])
    assert placed == [order] and order[-4:] == [32, 33, 65, 68]
    for change, err in ((dict(obs_sm=False), r"has no observer SMs \(-DDTMK_OBS_SM\)"),
                        (dict(defines=("DTMK_OBS_SM",)), "lacks -DDTMK_SM_WORKER"),
                        (dict(obs_sms=2), r"has 2 observer SMs, got 4 \(\[32, 33, 65, 68\]\)")):
        with pytest.raises(UserError, match=err):
            gpu.Megakernel.place_observers(SimpleNamespace(**{**vars(mk), **change}), [32, 33, 65, 68])


def test_top_observer_place_needs_observer_sms_and_the_gpu(capsys, megakernel_builds):
    from dtrace_mk.cli import main
    from dtrace_mk.commands import top
    assert main(["top", "--backend", "sim", "--observer-place", "calibrate", "--steps", "2"]) != 0
    assert "--observer-place calibrate: only with --observer sm" in capsys.readouterr().err
    assert main(["top", "--backend", "sim", "--observer", "sm", "--observer-place", "calibrate", "--steps", "2"]) != 0
    err = capsys.readouterr().err
    assert "--observer sm: a placement of the GPU kernel's observer" in err and "use --backend gpu" in err
    assert top.observer_place_defines("sm", "calibrate") == ("DTMK_SM_WORKER",)
    assert top.observer_place_defines("sm", "hw") == top.observer_place_defines("workers", "hw") == ()
    with pytest.raises(UserError, match="--observer-place: expected one of auto, hw, calibrate, got 'best'"):
        top.observer_place_defines("sm", "best")
    built, Stop = megakernel_builds
    with pytest.raises(Stop):
        next(top.gpu_frames("tiny", steps=2, observer="sm", observer_place="calibrate"))
    assert built[0][0] == "DTMK_OBS_SM" and built[0][-1] == "DTMK_SM_WORKER"


def test_top_calibrates_the_observer_sms_unless_told_hw(megakernel_builds):
    """auto (the default): observer SMs are calibrated (session 52: +3.0% calibrated vs +6.2% on
    the highest SMs); the workers' own observers have nothing to place."""
    from dtrace_mk.cli import build_parser
    from dtrace_mk.commands import top
    args = build_parser().parse_args(["top", "--observer", "sm"])
    assert args.observer_place == "auto"
    assert top.resolve_observer_place("sm", "auto") == "calibrate"
    assert top.resolve_observer_place("workers", "auto") == "hw"
    assert top.observer_place_defines("sm", "auto") == ("DTMK_SM_WORKER",)
    assert top.observer_place_defines("workers", "auto") == ()
    built, Stop = megakernel_builds
    for place, pinned in (("auto", True), ("hw", False)):
        built.clear()
        with pytest.raises(Stop):
            next(top.gpu_frames("tiny", steps=2, observer="sm", observer_place=place))
        assert ("DTMK_SM_WORKER" in built[0]) is pinned, (place, built[0])
    built.clear()
    with pytest.raises(Stop):
        next(top.gpu_frames("tiny", steps=2))
    assert "DTMK_SM_WORKER" not in built[0] and "DTMK_OBS_SM" not in built[0]


def test_serve_pins_its_observers_in_a_grid_of_every_sm_with_one_idle(capsys):
    """serve --observer sm --observer-place calibrate (or auto): pinned in a grid of every SM
    whose clock-pair SM idles (-DDTMK_SM_IDLE); hw, serve's default, keeps the grid one SM
    short, unpinned; the workers' observers refuse a placement, on the sim as on the GPU."""
    from argparse import Namespace
    from dtrace_mk.launch import serve
    from dtrace_mk.megakernel import gpu
    assert serve.build_parser().parse_args(["--observer", "sm"]).observer_place == "hw"
    lazy = gpu.observer_defines("sm", None)
    for place, want in (("auto", (lazy + ("DTMK_SM_WORKER", "DTMK_SM_IDLE", "DTMK_X"), 1)),
                        ("calibrate", (lazy + ("DTMK_SM_WORKER", "DTMK_SM_IDLE", "DTMK_X"), 1)),
                        ("hw", (lazy + ("DTMK_X",), 0))):
        assert serve.observer_build(Namespace(observer="sm", observer_sms=None, observer_place=place),
                                    ("DTMK_X",)) == want, place
    assert serve.main(["--backend", "sim", "--observer-place", "calibrate", "--steps", "2"]) != 0
    assert "--observer-place calibrate: only with --observer sm" in capsys.readouterr().err


def test_place_observers_idles_the_highest_other_sm_after_the_observers():
    from dtrace_mk.megakernel import gpu
    mk = observer_build([], idle_sms=1)
    order = gpu.Megakernel.place_observers(mk, [128, 129, 130, 131])
    assert order[-5:] == [128, 129, 130, 131, 127] and sorted(order) == IDS
    assert order[:-5] == IDS[:127]                 # the workers in id order
    order = gpu.Megakernel.place_observers(mk, [0, 1, 16, 88])
    assert order[-5:] == [0, 1, 16, 88, 131] and order[:-5] == [x for x in IDS if x not in (0, 1, 16, 88, 131)]
