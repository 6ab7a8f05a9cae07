"""CI (no GPU, no nvdisasm): tools/gcc_layout.py keeps a profiled launch's hot code per function
(save) and lays it out as another build places its functions (predict), judged by the GPC-cache
model of tools/ncu_footprint.py (64 sets x 16 ways of 128-byte lines).  The builds' SASS symbols are
given here (the tool compiles and disassembles them on a machine with the GPU image's NVRTC)."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gl(load_tool):
    return load_tool("gcc_layout")


def export(tmp_path, launches):
    text = ""
    for counts in launches:
        text += ('"Kernel Name","dtmk_megakernel",\n'
                 '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n')
        text += "".join(f'"0x{16 * i:x}","  NOP","0","{c}"\n' for i, c in enumerate(counts))
    p = tmp_path / "src.csv"
    p.write_text(text)
    return p


def test_save_keeps_each_builds_hot_runs_and_predict_lays_them_out(gl, tmp_path, monkeypatch):
    # two builds told apart by size: A = f (16) g (16); B = f (16) pad (8) g (16)
    syms = {"1b:A": ["f"] * 16 + ["g"] * 16, "1b:B": ["f"] * 16 + ["pad"] * 8 + ["g"] * 16,
            "1b:C": ["a0g"] * 16 + ["f"] * 16, "1b:D": ["f"] * 41}
    monkeypatch.setattr(gl.nf, "build_lines", lambda spec: [("", "", 0, s) for s in syms[spec]])
    a = [1000] * 2 + [0] * 14 + [0] * 8 + [5000] * 3 + [0] * 5
    b = [1000] * 2 + [0] * 14 + [0] * 8 + [0] * 8 + [5000] * 3 + [0] * 5
    csv = export(tmp_path, [a, b, a])
    doc = gl.save(csv, ["a=1b:A", "b=1b:B"], 1000)
    assert doc["builds"]["a"]["launch"] == 0 and doc["builds"]["b"]["launch"] == 1
    assert doc["builds"]["a"]["functions"] == {"f": {"size": 16, "runs": [[0, 2]]}, "g": {"size": 16, "runs": [[8, 3]]}}
    assert doc["builds"]["a"]["hot_lines"] == 2 and doc["builds"]["a"]["overflow"] == 0
    out = tmp_path / "hot.json"
    out.write_text(json.dumps(doc))
    back = gl.load(out)
    # a's hot code in B's layout: f's run in line 0, g's (B's offset 24 + 8) in line 4
    n, over, gone, resized = gl.predict(back, "a", syms["1b:B"], {})
    assert (n, over, gone, resized) == (2, 0, set(), set())
    # ... and in C's, where g is renamed a0g and comes first: g's run at 8 (line 1), f's at 16 (line 2)
    lines, _, _ = gl.nf.lay_out(back["builds"]["a"]["functions"], syms["1b:C"], {"a0g": "g"})
    assert lines == {1, 2}
    with pytest.raises(ValueError, match="no launch of d"):
        gl.save(csv, ["a=1b:A", "d=1b:D"], 1000)
    # a hot-first build is saved under the names before -DDTMK_HOT_FIRST's renames (a1run_body: run_body)
    syms["1b:E"] = ["a1run_body"] * 16 + ["f"] * 8
    e = gl.save(export(tmp_path, [[1000] * 24]), ["e=1b:E"], 1000)["builds"]["e"]
    assert set(e["functions"]) == {"run_body", "f"} and e["layout"] == [["run_body", 16], ["f", 8]]


def test_load_refuses_another_file(gl, tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"builds": {}}')
    with pytest.raises(ValueError, match="not a tools/gcc_layout.py save"):
        gl.load(p)


def test_saved_profiles_reproduce_the_model_counts(gl):
    """The committed saves (session 58, plans 153 and 157): each build's hot code laid out again in its
    own saved layout gives the overflow recorded from the profile -- no hooks 1, offxw 3, off 20,
    offcopyw 26 (trace off) -- and in another build's layout another count."""
    doc = gl.load(ROOT / "docs" / "results" / "data" / "gcc_hot_s58_plan157.json")
    assert {k: b["overflow"] for k, b in doc["builds"].items()} == {"nohooks": 1, "off": 20, "offxw": 3, "offcopyw": 26}
    for name, b in doc["builds"].items():
        syms = gl.symbols_of(b["layout"])
        assert len(syms) == b["instructions"]
        n, over, gone, resized = gl.predict(doc, name, syms, {})
        assert (n, over, gone, resized) == (b["hot_lines"], b["overflow"], set(), set()), name
    # the hook build's hot code in the no-hook build's layout: its own functions lie elsewhere there
    n, over, _, resized = gl.predict(doc, "off", gl.symbols_of(doc["builds"]["nohooks"]["layout"]), {})
    assert resized and over != 20
    on = gl.load(ROOT / "docs" / "results" / "data" / "gcc_hot_s57_plan153_trace_on.json")
    assert on["builds"]["nohooks"]["overflow"] == 1 and on["builds"]["offxsync"]["overflow"] == 10


def test_hot_first_profile_lays_out_in_the_default_layout_and_back(gl):
    """Session 59's save (plan 160, trace off): the hot-first builds (-DDTMK_HOT_FIRST, saved under the
    functions' names before the renames) -- no hooks 1, off 1, offxw's wait 0 lines beyond their ways,
    the default layout's off 20 -- and the hot-first off build's hot code in the default layout
    overflows again, the default's in the hot-first layout not: the layout, not the code, decides."""
    doc = gl.load(ROOT / "docs" / "results" / "data" / "gcc_hot_s59_plan160.json")
    b = doc["builds"]
    assert {k: v["overflow"] for k, v in b.items()} == {"nohooks": 1, "off": 20, "hfxw": 0, "hotfirst_nh": 1,
                                                       "hotfirst": 1}
    assert "run_body" in b["hotfirst"]["functions"] and not any(f.startswith("a1") for f in b["hotfirst"]["functions"])
    default, hot_first = gl.symbols_of(b["off"]["layout"]), gl.symbols_of(b["hotfirst"]["layout"])
    _, over, gone, _ = gl.predict(doc, "hotfirst", default, {})
    assert over >= 10 and not gone
    _, over, gone, _ = gl.predict(doc, "off", hot_first, {})
    assert over <= 2 and not gone
