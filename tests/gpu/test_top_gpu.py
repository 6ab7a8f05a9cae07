"""`dtrace-mk top --backend gpu` on the lent GPU: the live view attached to a running
megakernel shows every task class of the model with counts, and coverage whose executed
equals eligible with nothing lost -- with the records built on the workers (default) and
on an observer SM (--observer sm, kernels/megakernel.cu "observer SM")."""
import re

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("observer", ["workers", "sm"])
def test_top_on_the_gpu_shows_every_class_with_exact_coverage(observer):
    from dtrace_mk.commands import top
    from dtrace_mk.megakernel.graph import build_graph
    from dtrace_mk.megakernel.presets import get_preset
    frames = list(top.gpu_frames("tiny", steps=3000, interval_ms=50, frames=4, observer=observer))
    assert len(frames) == 4 and all(f.startswith("dtrace-mk top  model tiny  backend gpu") for f in frames)
    last = frames[-1]
    classes = {t.class_name for t in build_graph(get_preset("tiny"), 1, 8).tasks}
    for name in classes:
        assert re.search(rf"^{name}\s+\d+\s", last, re.M), (name, last)
    cov = re.search(r"coverage eligible (\d+) executed (\d+) throttled (\d+) lost (\d+)", last)
    assert cov and int(cov.group(1)) > 0 and cov.group(1) == cov.group(2) and cov.group(4) == "0", last
