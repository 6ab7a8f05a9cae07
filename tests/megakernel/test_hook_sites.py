"""CI (no GPU): the megakernel's hook sites stay cheap when hooks are off
(docs/dev/hook_cost_analysis.md, "Session 2 changes").  These pin the kernel text the
static analysis depends on: every hook context is built out of line in a cold
__noinline__ function, the scheduler's hot functions carry no hook-only arguments, the
plan loop has no barrier before the wait, and the observer never drains before a wait's
first look."""
import inspect
import re

import pytest

from dtrace_mk.megakernel import gpu
from dtrace_mk.kernels import megakernel_text

SRC = megakernel_text()
COLD = ("hook_event", "hook_put", "hook_flush", "hook_hold", "hook_post")


def body(name: str) -> str:
    """Text of the function `name` (from its signature to the matching brace)."""
    m = re.search(r"^[^\n;]*\b" + name + r"\([^;{]*\)\s*\{", SRC, re.M)
    assert m, name
    depth, i = 0, m.end() - 1
    while True:
        c = SRC[i]
        depth += c == "{"
        depth -= c == "}"
        i += 1
        if depth == 0:
            return SRC[m.start():i]


def test_cold_hook_functions_are_out_of_line():
    for f in COLD:
        assert re.search(r"__device__ __noinline__ void " + f + r"\(", SRC), f
    assert "HOW TO WRITE A HOOK SITE" in SRC


@pytest.mark.parametrize("fn", ["run_task", "wait_event", "dtmk_megakernel"])
def test_hot_functions_build_no_context(fn):
    b = body(fn)
    for needle in ("struct dtmk_ctx", "HkRec", "hk_rec(", "hk_store(", "hook_put(", "ctx_task(", "mk_hook(",
                   "trace_rec("):
        assert needle not in b, (fn, needle)
    # every hook test in a hot function guards a call of a cold function (or a block that
    # makes one): no record is built inline
    for m in re.finditer(r"\bif \((?=[^;]*HOOKS?_(ON|ANY)\()", b):
        depth, i = 0, m.end() - 1
        while True:                                   # the end of the if's condition
            depth += b[i] == "("
            depth -= b[i] == ")"
            i += 1
            if depth == 0:
                break
        if not re.search(r"HOOKS?_(ON|ANY)\(", b[m.start():i]):
            continue                                  # the hook test is in the block, not the condition
        rest = b[i:i + 400].lstrip()
        assert re.match(r"(\{[^}]*?)?\bhook_\w+\(", rest, re.S), (fn, b[m.start():i + 80])
    # a hook value captured without an `if` is a plain Worker store (no record, no call)
    for m in re.finditer(r"^[^\n]*HOOKS?_(ON|ANY)\([^\n]*$", b, re.M):
        line = m.group(0)
        assert "if (" in line or re.match(r"\s*(W\.\w+ (\|)?=|pend =)", line), (fn, line)


def test_run_task_carries_no_hook_only_arguments():
    sig = re.search(r"void run_task\(([^)]*)\)", SRC).group(1)
    assert "dtmk_u64" not in sig and "TaskFaults" not in sig, sig


def test_plan_loop_has_no_barrier_before_the_wait():
    b = body("dtmk_megakernel")
    loop = b[b.index("int t = plan[i];"):]
    assert "MK_SYNC" not in loop[:loop.index("wait_event(")] and "__syncthreads" not in loop[:loop.index("wait_event(")]


def test_observer_never_drains_before_the_first_look():
    b = body("wait_event")
    first_look = re.search(r"= (ev_)?ld_acquire\(", b)
    assert first_look
    assert "OBS_SYNC_IF" not in b[:first_look.start()]
    # one barrier publishes the first look (W.first) to the CTA
    assert b[first_look.start():b.index("for (;;)")].count("MK_SYNC()") == 1   # __syncthreads
    # no drain at the end of a task: it happens at the next wait's first look or in the spin
    assert "OBS_SYNC_IF" not in body("run_task")


def test_control_words_loaded_before_tested():
    b = body("wait_event")
    i_gen, i_abort = b.index("ctl + CTL_GEN"), b.index("ctl + CTL_ABORT")
    between = b[i_gen:i_abort]
    assert "break" not in between and "if (" not in between


def test_coverage_accumulators_per_hook_and_slot():
    assert re.search(r"struct dtmk_cov_acc accs\[OBS_NACC\]", SRC)
    assert "#define OBS_NACC (DTMK_NUM_HOOKS * DTMK_MAX_PROGS)" in SRC
    assert "O.accs + h * DTMK_MAX_PROGS" in body("obs_sync")


def test_cold_functions_stay_separate_in_ptx(tmp_path, monkeypatch):
    """NVRTC keeps the cold hook functions as separate .func (not inlined into run_task,
    wait_event or the kernel); the no-hooks build has none of them called."""
    monkeypatch.setenv("DTRACE_MK_CACHE", str(tmp_path))
    ptx = gpu.compile_source("sm_90a", "ptx", use_cache=False).decode(errors="replace")
    funcs = set(re.findall(r"\.func\s+(?:\([^)]*\)\s*)?(\w+)\(", ptx))
    for f in COLD:
        assert any(f in x for x in funcs), f
    calls = set(re.findall(r"call(?:\.uni)?\s*(?:\([^)]*\),\s*)?(\w+),", ptx))
    assert any("hook_event" in c for c in calls)


# ---- round 2 (docs/dev/hook_cost_analysis.md "Round 2") -------------------------------

def test_task_end_records_built_after_the_release_signal():
    """task:end / gen:advance / trace records are built after the successor is signalled;
    the epoch hold (OBS_PENDING) comes before the signal, so snapshots stay exact."""
    b = body("run_task")
    i_hold, i_post, i_sig = b.index("hook_hold("), b.index("hook_post("), b.index("post_signal(")
    assert i_hold < i_sig < i_post
    assert b.index("comm_post(") < i_post
    h = body("hook_hold")
    assert "hold_epoch(" in h                       # the epoch hold, shared with the lazy hold_light
    e = body("hold_epoch")
    assert "OBS_PENDING" in e and "O.pub" in e


def test_no_drain_on_a_ready_first_look_below_must_at():
    f = body("obs_first_look")
    assert "O.maxc >= O.must_at" in f
    # 3/4 full (full_at) and the epoch-lag drain only when the first look was not ready
    assert "(!rd && O.maxc >= O.full_at)" in f and "!rd && OBS_LAGGING(step)" in f
    w = body("wait_event")
    assert "OBS_SYNC_WAIT_IF(dt < 0 && WC_SYNC && OBS_WAIT(W), O.maxc < O.must_at && !OBS_LAGGING(step)" in w
    # the poll count survives a drain chunk (chunks 16 polls apart, not 64)
    assert "unsigned it = 0;" in w and "for (unsigned it" not in w
    assert "obs_spin_drain(W, now - t0, (dtmk_u32)step)" in w


def test_the_drain_poller_stamps_the_event_seen_met():
    """Session 47, the default since session 48 (-DDTMK_NO_DRAIN_POLL: off): both drains of a dependency
    wait (at the first look, in the spin) run obs_sync_wait_cta, whose warp-1 lane 0 polls
    the awaited event (left in shared memory at the first look) while warp 0 drains; a first
    look that was ready asks for no poller (its task was ready then: t_seen is that look's
    stamp).  The wait's end stamps dep:release and the dependency wait at the moment seen,
    task:ready takes it through the task's FLAG_OBS_DELAY, and the dispatch wait still counts
    from run_task's own stamp (the drain left out).  Without the define every drain is
    obs_sync_cta as before."""
    assert "!defined(DTMK_DRAIN_POLL) && !defined(DTMK_NO_DRAIN_POLL) && !defined(DTMK_NO_HOOKS) && " \
           "!defined(DTMK_OBS_SM)\n#define DTMK_DRAIN_POLL" in SRC
    c = body("obs_sync_wait_cta")
    assert "threadIdx.x == 32 && poll" in c and "drain_poll(P, s_poll_ev, s_poll_target)" in c
    assert "s_drain_busy = 0" in c
    d = body("drain_poll")
    assert "while (s_drain_busy)" in d and "s_seen = mk_now()" in d
    assert "ev_ld_relaxed(" in d                    # (thread 0's next poll is the acquire)
    assert "#define OBS_SYNC_WAIT_IF(cond, chunk, step, poll) OBS_SYNC_IF(cond, chunk, step)" in SRC
    w = body("wait_event")
    assert "OBS_SYNC_WAIT_IF(WC_SYNC && (first & 6), !(first & 2), (dtmk_u32)step, !(first & 1))" in w
    assert "s_poll_ev = counter(P, e); s_poll_target = target;" in w
    assert "OBS_SYNC_IF(" not in w                   # every drain in a wait has the poller
    assert w.count("s_drain_busy = 1") == 2          # set before the barrier each drain follows
    assert "const dtmk_u64 met = seen ? seen : now;" in w and "W.ts_rel = met" in w
    assert "W.dep_wait = met - t0" in w
    # -DDTMK_GATE_POLL (session 48; opt-in, session 49's GPU A/B showed no gain): a resident step gate's
    # drain for new tables -- the kernel arms the poller
    # (no plan loads on its step loop: its spill budget, test_site_form.py), obs_sync_cta's
    # warp-1 lane 0 polls the worker's first static task's event (the plan loop's event and
    # target), and that task's first look takes the stamp
    k = SRC[SRC.index("dtmk_megakernel(const dtmk_u64 *params)"):]
    assert k.count("if (W.gate == 0 && O.reload) s_drain_busy = 1;") == 1
    assert "OBS_SYNC_IF(true, false, (dtmk_u32)step | OBS_AT_GATE);" in k
    o = body("obs_sync_cta")
    assert "threadIdx.x == 32 && (step & OBS_AT_GATE)" in o and "gate_poll(P, W, step & ~OBS_AT_GATE)" in o
    g = body("gate_poll")
    assert "(dtmk_u64)r[7] * (dtmk_u64)(step + 1) : (dtmk_u64)step" in g and "drain_poll(P," in g
    assert "target = e >= 0 ? (dtmk_u64)r[7] * (dtmk_u64)(step + 1) : (dtmk_u64)step;" in SRC
    assert "W.t_seen = !(rd & 1) ? 0 : gate_seen ? gate_seen : (rd & 6) ? mk_now() : 0;" in w
    r = body("run_task")
    assert "if (plan && W.t_seen) W.pend_flags |= DTMK_FLAG_OBS_DELAY;" in r
    f = body("hook_flush")
    assert "if (flags & DTMK_FLAG_OBS_DELAY) ts = W.t_seen;" in f
    assert "wait = t_begin - t_ready" in f


def test_the_drain_poller_is_in_the_default_build_and_off_with_its_opt_out(megakernel_ptx):
    """CI (NVRTC): the default build's PTX has the poller (session 48), the explicit define
    changes nothing, -DDTMK_NO_DRAIN_POLL's PTX has none (the wait session 46 measured), the
    no-hook build none; the builds it cannot run in are refused by name."""
    from dtrace_mk.kernels.build import CompileError, nvrtc_compile
    from dtrace_mk.kernels import KERNEL_DIR
    on = megakernel_ptx(())
    assert "obs_sync_wait_cta" in on and "s_seen" in on and "ld.relaxed.gpu" in on
    assert megakernel_ptx(("DTMK_DRAIN_POLL",)) == on
    for off in (("DTMK_NO_DRAIN_POLL",), ("DTMK_NO_HOOKS",)):
        assert "obs_sync_wait_cta" not in megakernel_ptx(off) and "s_seen" not in megakernel_ptx(off)
    assert "gate_poll" not in on                    # (the gate drain's poller is opt-in)
    assert "gate_poll" in megakernel_ptx(("DTMK_GATE_POLL",))
    for bad, why in ((("DTMK_DRAIN_POLL", "DTMK_OBS_SM"), "not with DTMK_NO_HOOKS or DTMK_OBS_SM"),
                     (("DTMK_GATE_POLL", "DTMK_NO_DRAIN_POLL"), "extends DTMK_DRAIN_POLL"),
                     (("DTMK_DRAIN_POLL", "DTMK_NO_DRAIN_POLL"), "exclude each other"),
                     (("DTMK_DRAIN_POLL_ACQ", "DTMK_NO_DRAIN_POLL"), "form of DTMK_DRAIN_POLL")):
        with pytest.raises(CompileError, match=why):
            nvrtc_compile((KERNEL_DIR / "megakernel.cu").read_text(), "megakernel.cu", "sm_90a", "ptx", bad)



def test_the_poller_event_is_stored_before_the_first_acquire(megakernel_ptx):
    """Session 56: the acquire's L1 invalidation (CCTL.IVALL) makes every local-memory reload after
    it an L2 round trip; storing the poller's event and target after it reloaded `target` from its
    spill slot on every wait's critical path.  The default build's wait stores both before its
    first acquire (plan 150 measured no change either way: free, so kept)."""
    from dtrace_mk.kernels.build import mangled, ptx_function, wait_copies
    w = body("wait_event")
    assert w.index("s_poll_ev = counter(P, e); s_poll_target = target;") < w.index("ev_ld_acquire(P, counter(P, e))")

    def order(defines, wait):
        f = ptx_function(megakernel_ptx(defines), wait)
        st = re.search(r"st\.shared\.u64\s+\[s_poll_target\]", f)
        return st.start() < f.index("ld.acquire.gpu")
    assert all(order((), mangled(w)) for w in wait_copies())   # (its two copies)


# ---- round 4: rare, large drains ---------------------------------------------------------

def test_ring_split_per_hook_and_drained_in_32_record_batches():
    """The shared ring holds a sub-ring per hook with VM programs; a drain runs each
    sub-ring in back-to-back 32-record VM calls (not one call per hook group of a
    32-record window), short waits drain only when 3/4 full or the epoch lags."""
    ring = int(re.search(r"#define OBS_RING (\d+)", SRC).group(1))
    assert ring >= 96
    lay = body("obs_layout")
    assert "OBS_RING / k" in lay and "O.must_at" in lay and "O.full_at" in lay
    s = body("obs_sync")
    assert "for (dtmk_u32 w = 0; w < todo; w += 32)" in s and "min(todo - w, 32u)" in s
    c = body("hk_store")
    assert "O.cnt[hook]" in c and "< O.cap" in c and "obs_lost(" in c
    d = body("obs_spin_drain")
    assert "O.maxc >= O.full_at" in d and "OBS_LAGGING(step)" in d and "OBS_LONG_WAIT_NS" in d
    assert re.search(r"#define OBS_LAGGING\(step\) \(O\.pub < ", SRC)


def test_pending_published_only_when_it_moves():
    s = body("obs_sync")
    i_cond = s.index("keep != O.pub")
    assert "__threadfence()" not in s[s.index("if (n == 0 && (ran"):i_cond]
    c = body("hk_store")
    assert "lo < O.pub" in c and "OBS_PENDING" in c


def test_smem_pad_build_matches_bench():
    """bench/hooks.py's nohooks_pad build pads the no-hooks kernel by the difference of
    the two loaded kernels' static shared memory (measured, not a constant)."""
    assert "DTMK_SMEM_PAD" in SRC
    bench = (gpu.KERNEL_DIR.parent / "bench" / "hooks.py").read_text()
    assert 'f"DTMK_SMEM_PAD={pad}"' in bench and "pad = mk.shared_memory()[0] - mk0.shared_memory()[0]" in bench
    assert "self.kernel.shared_size_bytes" in inspect.getsource(gpu.Megakernel.shared_memory)


# ---- round 3 (docs/dev/hook_cost_analysis.md "Round 3") -------------------------------

HOOK_ORDER = ("DEP_RELEASE", "TASK_READY", "QUEUE_PRESSURE", "COMM_WAIT", "TASK_DISPATCH", "TASK_BEGIN", "TASK_END")


def test_no_record_built_between_readiness_and_the_release_signal():
    """dep:release / task:ready / queue:pressure / comm:wait / task:dispatch / task:begin
    are captured (bits in W.pend + scalars in Worker fields), not built: no cold call and
    no global load for hooks before the body; hook_hold is the only hook call before the
    release signal; the records are built by hook_flush after it."""
    rt = body("run_task")
    pre = rt[:rt.index("run_body(")]
    assert not re.search(r"\bhook_\w+\(", pre), "a hook call before the body"
    assert "__ldcg" not in pre and "W.pend |=" in pre
    post = rt[rt.index("run_body("):]
    before_sig = post[:post.index("post_signal(")]
    assert re.findall(r"\bhook_\w+\(", before_sig) == ["hook_hold("]
    we = body("wait_event")
    tail = we[we.rindex("for (;;)"):]
    assert "W.ts_rel = met" in tail and "hook_event(P, W, DTMK_HOOK_DEP_RELEASE" not in SRC
    for h in ("DEP_RELEASE", "TASK_READY", "QUEUE_PRESSURE", "COMM_WAIT", "TASK_DISPATCH", "TASK_BEGIN"):
        assert "hook_event(P, W, DTMK_HOOK_" + h not in rt + we, h


def test_flush_builds_captured_records_in_hook_order():
    m = re.search(r"#define HK_ORDER \(([^\n]*(?:\\\n[^\n]*)*)\)\n", SRC)
    assert m, "HK_ORDER"
    names = re.findall(r"DTMK_HOOK_(\w+)", m.group(1))
    assert tuple(names) == HOOK_ORDER
    f = body("hook_flush")
    assert "HK_ORDER" in f and f.count("hk_store(") == 1      # one emit site
    # any other record first flushes what was captured (per-worker ring in time order)
    e = body("hook_event")
    assert e.index("hook_flush(") < e.index("hook_put(")
    assert body("hook_post").index("hook_flush(") < body("hook_post").index("trace_rec(")


def test_hold_reads_what_may_change_after_the_signal():
    h = body("hook_hold")
    assert "hk_capture(" in h and "hold_epoch(" in h and "OBS_PENDING" in body("hold_epoch")
    c = body("hk_capture")
    assert "P.req_gen" in c and "ld_relaxed_sys" in c
    # records are built in registers and stored with 16-byte stores (no local struct
    # outside the linked-monitor build)
    s = body("hk_store")
    assert "uint4" in s
    assert s.count("struct dtmk_ctx") == 1 and "DTMK_LINKED_MONITOR" in s


def test_hook_event_stamps_before_it_flushes_captured_records():
    """A record's ts is when its event happened: hook_event reads the clock BEFORE
    building the task's captured records (~1 us).  Stamping after it made comm:signal
    ~1.3 us late and gave the collector causal violations on 2 GPUs (2026-11-30)."""
    body = SRC[SRC.index("__device__ __noinline__ void hook_event("):]
    body = body[:body.index("\n}\n")]
    assert body.index("mk_now()") < body.index("hook_flush(P, W)")
    assert "hook_put(P, W, (dtmk_u32)hook, ts," in body


def test_streaming_ring_slot_without_a_modulo_per_record():
    """The streaming ring's slot is kept incrementally (W.hook_slot = hook_n % hook_cap,
    set once per launch): a 64-bit modulo per record was a call into the runtime's urem."""
    st = body("hk_store")
    assert "% P.hook_cap" not in st and "W.hook_slot = slot + 1 == P.hook_cap ? 0 : slot + 1" in st
    k = SRC[SRC.index("dtmk_megakernel(const dtmk_u64 *params)"):]
    assert "W.hook_slot = P.hook_cap ? W.hook_n % P.hook_cap : 0;" in k


def test_the_compiled_tier_links_the_drain_poller_builds():
    """serve --kernel-define DTMK_NO_DRAIN_POLL (or the poller's forms) with a compiled monitor:
    the linked kernel is the same variant (a define missing from MK_PASS_DEFINES would be
    silently absent from it)."""
    from dtrace_mk.runtime.compiled.link import megakernel_spec
    for defs in (("DTMK_NO_DRAIN_POLL", "DTMK_ROPE_IN_ATTN"),
                 ("DTMK_DRAIN_POLL", "DTMK_DRAIN_POLL_ACQ", "DTMK_DRAIN_POLL_NS=50", "DTMK_ROPE_IN_ATTN")):
        spec = megakernel_spec(defs)
        assert set(defs) - {"DTMK_DRAIN_POLL"} <= set(spec.defines), defs
