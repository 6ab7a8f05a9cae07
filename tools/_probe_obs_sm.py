import time, numpy as np
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.runtime.live import LiveSession, summary_monitor
for defs in [(), ("DTMK_OBS_SM",)]:
    mk = gpu.Megakernel(PRESETS["tiny"], batch=1, seed=0, defines=defs)
    mk.reset(); r = mk.run(60, poison=False); print(defs, "plain 60", round(r.elapsed_ms * 1e3 / 60, 1), "us/step")
    live = LiveSession(mk); aid = live.attach(summary_monitor(mk.graph.schema).obj)
    for n in (60, 200):
        mk.reset(); live.start(n); res = live.wait()
        st = live.read_state()
        print(defs, "summary", n, round(res.elapsed_ms * 1e3 / n, 1), "us/step", "lost", int(st[:, 2].sum()))
    live.detach(aid)
