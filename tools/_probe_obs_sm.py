import time, numpy as np, cupy as cp
from dtrace_mk.megakernel import gpu
from dtrace_mk.megakernel.presets import PRESETS
from dtrace_mk.runtime.live import LiveSession, summary_monitor
mk = gpu.Megakernel(PRESETS["tiny"], batch=2, seed=0, defines=("DTMK_OBS_SM",))
live = LiveSession(mk); aid = live.attach(summary_monitor(mk.graph.schema).obj)
live.start(3000); time.sleep(0.1)
for k in range(3):
    st = live.read_state(); pend = st[:, 0]
    q = mk.buf["obsq"][:64].get().view(np.uint32)
    ev = int(mk.buf["events"][mk.graph.step_event].get())
    vals, cnt = np.unique(pend, return_counts=True)
    print("steps", ev, "low", q[2], "live", q[3], "mask", hex(q[0]), "pending values", list(zip(vals.tolist()[:6], cnt.tolist()[:6])))
    W = mk.num_workers
    a = mk.buf["obsq"][64:64 + W * gpu.OSQ_W_BYTES].get().view(np.uint64).reshape(W, -1)[:, :3]
    held = np.where(pend < 1 << 40)[0]
    print("  held rows", held[:10].tolist(), "head/tail/done", a[held[:5]].tolist())
    time.sleep(0.05)
res = live.wait(); print("done", res.steps if hasattr(res, 'steps') else '')
