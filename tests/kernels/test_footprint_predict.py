"""CI (no GPU): tools/footprint_predict.py estimates a changed build's added code from an
earlier build's export: each source line weighs the share of its instructions the monitor's
launch added, carried to the changed tree through a line map."""
import pytest


@pytest.fixture(scope="module")
def fp(load_tool):
    return load_tool("footprint_predict")


def test_weights_are_each_source_lines_added_share(fp):
    lines = [("a.cuh", "f", 10), ("a.cuh", "f", 10), ("a.cuh", "g", 20), ("b.cuh", "h", 5)]
    off = [0, 0, 3, 0]
    on = [2000, 0, 3000, 10]           # line 10: one of two copies added; line 20 ran before; line 5 < min
    assert fp.added_weights(off, on, lines, 1000) == {("a.cuh", 10): 0.5}
    assert fp.added_weights(off, on, lines, 1) == {("a.cuh", 10): 0.5, ("b.cuh", 5): 1.0}
    with pytest.raises(ValueError, match="not the profiled build"):
        fp.added_weights(off, on, lines[:3], 1)


def test_line_map_keeps_unchanged_lines_and_drops_edited_ones(fp):
    old = "a\nb\nc\nd\n"
    new = "a\nnew\nb\nd\n"                # b moved down one, c edited away
    assert fp.line_map(old, new) == {1: 1, 2: 3, 4: 4}


def test_predict_sums_the_weights_per_function_of_the_new_build(fp):
    w = {("a.cuh", 10): 0.5, ("a.cuh", 30): 1.0}
    new = [("a.cuh", "f", 10), ("a.cuh", "f", 10), ("a.cuh", "f", 10), ("a.cuh", "k", 30), ("a.cuh", "k", 31)]
    assert fp.predict(new, w) == {"f": 1.5, "k": 1.0}   # (three copies of line 10 now: 1.5 expected)
