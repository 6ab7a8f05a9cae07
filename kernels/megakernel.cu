/* megakernel.cu: the reference persistent decode megakernel of dtrace_mk.
 *
 * One worker CTA per SM.  The task graph comes from dtrace_mk/megakernel/graph.py
 * (TaskGraph.device_tables(), packed by gpu.py): worker w walks plan w every step; a
 * task waits (acquire) until counter[wait_event] >= wait_count * (step + 1), runs its
 * body (mk_ops.cuh), then signals (release add) its event.  MoE expert tasks come from
 * one FIFO per MoE layer that the router fills; a worker takes one whenever its next
 * static task is not ready (graph.py "Dynamic queue").  Steps step0 .. step0+n_steps-1
 * run in one launch; events are never reset, so one launch per step works the same.
 *
 * Observation, all compiled in, off by default:
 *   hooks   every ABI v1 hook at its place (comm:* in tensor-parallel runs: mk_comm.cuh); a hook enabled in
 *           control[CTL_HOOK_MASK] writes the 128-byte dtmk_ctx to a per-worker global
 *           ring; a hook with device-VM programs attached (dtrace_mk/runtime/live.py)
 *           appends it to a shared-memory ring that warp 0 runs through the VM
 *           (the observer, kernels/mk_observer.cuh; -DDTMK_COMPILED_TIER: through
 *           dtmk_cm_run_records, linked with a compiled monitor); -DDTMK_NO_HOOKS
 *           builds the kernel with no hook code at all (the benchmark's baseline);
 *   trace   MPK-style full task trace, 32-byte records with 64-bit stamps, task
 *           identity, a stamp before the dependency wait, and a per-worker drop count;
 *   control the hook mask and trace switch live in shared memory, refreshed from
 *           global memory every `refresh` tasks (a volatile global flag per task costs
 *           ~20% at 1 us tasks);
 *   watchdog a wait that exceeds control[WD] microseconds (or a host-set abort flag)
 *           records the worker's state (task, event, counter vs target) and ends the
 *           run instead of hanging.
 *
 * Layout of the tables (int32 unless noted), see gpu.py pack_tables():
 *   tasks[T][16]: cls layer expert slot lo hi wait_event wait_count signal_event dynamic
 *                 tile_lo tile_hi aux_norm aux_fold aux_ord first_of_layer | triggers << 1
 *                 (word 15: bit 0 first task of its layer in its worker's plan, bits 1..:
 *                  the triggers of its signal event, so task:end's event_gen needs no
 *                  dependent global load after the release signal)
 *                 (allreduce: aux = all-reduce index l*2+op, MoE fold, destination rank;
 *                  rmsnorm: aux_ord = the all-reduce it reduces, -1 = none;
 *                  fused lowering (graph.fused_aux): qkv / gate_up / lm_head aux_norm =
 *                  norm kind 0/1/2 and aux_fold = split_k; split attn_o / mlp_down
 *                  aux_norm = split_k, split index = tile w)
 *   moe[n_moe][8]: layer router_task expert_base expert_tiles router_event expert_event 0 0
 *   control u32[32] (CTL_*), worker_state u64[W][8], faults int64[n][8],
 *   observer state u64[W][OBS_WORDS] (OBS_*; its address in control[CTL_OBS])
 */
/* Weight streaming through a shared-memory ring (mk_ops.cuh, docs/dev/megakernel_speed.md
 * "Session 4"): the megakernel's default since session 4 (1b batch 1 on an H200: 1538.8
 * vs 1648.6 us/step, logits bit-equal); -DDTMK_NO_WSTREAM builds the old path.  Defined
 * here, not in mk_ops.cuh: the per-operator baseline (baseline.cu) has no ring. */
#if !defined(DTMK_NO_WSTREAM) && !defined(DTMK_WSTREAM)
#define DTMK_WSTREAM
#endif
#if defined(DTMK_NO_WSTREAM) && defined(DTMK_WSTREAM)
#error "DTMK_NO_WSTREAM and DTMK_WSTREAM exclude each other"
#endif
#if defined(DTMK_PHASE_PROF) && defined(DTMK_NO_WSTREAM)
#error "DTMK_PHASE_PROF profiles the weight stream's tiles (drop DTMK_NO_WSTREAM)"
#endif
/* MEASUREMENT ONLY (session 55, bench/hooks.py --offpath variants offxw / offxr / offxall):
 * -DDTMK_OFFX=B makes the per-task path's "observing?" gates constant 0 in the default hook
 * build -- bit 0 wait_event's, bit 1 run_task's, bit 2 HOOK_ON / HOOKS_ANY everywhere (the
 * pressure, comm and dynamic-push sites) and the main loop's -- so the compiler drops the hook
 * code behind them there, all else (Obs, tables, refresh, the observer's entry and exit) as
 * built.  Where does the hook build's off cost (+2.5..3.1% over -DDTMK_NO_HOOKS, 1b) sit: in
 * the per-task path's code (then two copies of it, chosen per call, would remove it) or
 * elsewhere?  Nothing is observed in such a build. */
/* The hook build's default since session 60 (plan 161, 1b on an H100: +0.35..+0.56% over the
 * no-hook build, against +1.58..+2.00% with one wait): the hot-first layout (-DDTMK_HOT_FIRST,
 * below) in every build, and in the hook build the wait in two copies (-DDTMK_OFF_COPY=1).
 * -DDTMK_NO_HOT_FIRST builds the old layout, -DDTMK_ONE_WAIT the one wait (bench/hooks.py
 * variants legacy / hotfirst); a measurement define (-DDTMK_OFFX, -DDTMK_OBS_SM) takes one wait. */
#if defined(DTMK_NO_HOT_FIRST) && defined(DTMK_HOT_FIRST)
#error "DTMK_NO_HOT_FIRST and DTMK_HOT_FIRST exclude each other"
#endif
#if !defined(DTMK_NO_HOT_FIRST) && !defined(DTMK_HOT_FIRST)
#define DTMK_HOT_FIRST
#endif
#if defined(DTMK_ONE_WAIT) && defined(DTMK_OFF_COPY)
#error "DTMK_ONE_WAIT and DTMK_OFF_COPY exclude each other"
#endif
#if !defined(DTMK_NO_HOOKS) && !defined(DTMK_OBS_SM) && !defined(DTMK_OFFX) && !defined(DTMK_OFF_COPY) && !defined(DTMK_ONE_WAIT)
#define DTMK_OFF_COPY 1
#endif
/* -DDTMK_OFF_COPY=B (session 55; B: bit 0 wait_event, bit 1 run_task): those functions in two
 * copies, templates on WCOPY / RCOPY -- 1 the observing copy (today's code), 0 a copy whose
 * "observing?" gates are constant 0 (DTMK_OFFX's code, which measured the off cost away) --
 * chosen per static task by the whole CTA from s_obs_copy (below: the "observing?" latch).
 * Measurement only in sessions 56-59 (plan 146, 1b over no hooks on an H100): =1 +1.54 / +1.83%
 * against the default's +1.85 / +2.05% and offxw's +0.07 / -0.14% -- copy 0 is offxw's wait_event,
 * so what it keeps of the off cost is not code it runs.  It was the layout (sessions 58-59): with
 * -DDTMK_HOT_FIRST and the copies as functions of their own names (wait_event_off in the hot region,
 * wait_event_obs after it) +0.35..+0.56% over the hot-first no-hook build (plan 161, H100). */
#if defined(DTMK_OFF_COPY) && !defined(DTMK_NO_HOOKS)
#if defined(DTMK_OFFX)
#error "-DDTMK_OFF_COPY and the measurement -DDTMK_OFFX exclude each other"
#endif
#if defined(DTMK_OBS_SM)
#error "-DDTMK_OFF_COPY is not with -DDTMK_OBS_SM (plan 146: its final epochs stopped advancing while the kernel ran)"
#endif
#define OFF_COPY_BIT(b) (((DTMK_OFF_COPY) >> (b)) & 1)
#else
#define OFF_COPY_BIT(b) 0
#endif
/* MEASUREMENT (session 60, bench/hooks.py variant copyinwait): -DDTMK_COPY_IN_WAIT -- copy 0 of the
 * wait calls copy 1 itself when the latch says, so the main loop has one wait call and one run_task
 * call instead of two each.  ptxas (1b, placed): the kernel entry's spills (stores, loads) 136 / 144
 * -> 112 / 132 bytes (offxw's wait 104 / 124), copy 0's 100 / 72 -> 128 / 76.  Is the rest of the
 * default's off cost over offxw's (~0.8%, plan 161) the entry's spills around the two call sites? */
#if defined(DTMK_COPY_IN_WAIT) && !(OFF_COPY_BIT(0) && !OFF_COPY_BIT(1))
#error "-DDTMK_COPY_IN_WAIT is for the wait's two copies alone (-DDTMK_OFF_COPY=1, the hook build's default)"
#endif
#if defined(DTMK_OFFX) && !defined(DTMK_NO_HOOKS)
#if defined(DTMK_OBS_SM)
#error "-DDTMK_OFFX is measurement only: the default hook build (not -DDTMK_OBS_SM)"
#endif
#define OFFX_BIT(b) (((DTMK_OFFX) >> (b)) & 1)
#define WAIT_CODE (!OFFX_BIT(0))                        /* wait_event's hook code compiled in */
#define RUN_CODE (!OFFX_BIT(1))                         /* run_task's */
#define OBS_WAIT(W) (OFFX_BIT(0) ? 0u : (W).observe)   /* wait_event's "observing?" */
#define OBS_RUN(W) (OFFX_BIT(1) ? 0u : (W).observe)    /* run_task's */
#define OBS_MAIN(W) (OFFX_BIT(2) ? 0u : (W).observe)   /* the main loop's */
/* (session 56) wait_event's sites apart: bit 3 the first look's call, bit 4 the drains after
 * its barrier, bit 5 the spin loop's and the rest (dep:wait, a drain, a reload's break, the
 * capture); bits 3-5 together gate what bit 0 gates in the wait */
#define WC_LOOK (!(OFFX_BIT(0) || OFFX_BIT(3)))
#define WC_SYNC (!(OFFX_BIT(0) || OFFX_BIT(4)))
#define WC_SPIN (!(OFFX_BIT(0) || OFFX_BIT(5)))
#elif OFF_COPY_BIT(0) || OFF_COPY_BIT(1)
#define OFFX_BIT(b) 0
#if OFF_COPY_BIT(0)
#define WAIT_CODE WCOPY                                  /* (the copies' template parameters) */
#else
#define WAIT_CODE 1u
#endif
#if OFF_COPY_BIT(1)
#define RUN_CODE RCOPY
#else
#define RUN_CODE 1u
#endif
#define OBS_WAIT(W) (WAIT_CODE ? (W).observe : 0u)
#define OBS_RUN(W) (RUN_CODE ? (W).observe : 0u)
#define OBS_MAIN(W) ((W).observe)
#else
#define OFFX_BIT(b) 0
#define WAIT_CODE 1
#define RUN_CODE 1
#define OBS_WAIT(W) ((W).observe)
#define OBS_RUN(W) ((W).observe)
#define OBS_MAIN(W) ((W).observe)
#endif
#ifndef WC_LOOK                        /* (DTMK_OFFX's sites apart; else each is WAIT_CODE) */
#define WC_LOOK WAIT_CODE
#define WC_SYNC WAIT_CODE
#define WC_SPIN WAIT_CODE
#endif
#if OFF_COPY_BIT(0)                    /* a call of copy c (the others have one copy) */
#define WAIT_EVENT_COPY(c) WAIT_EVENT_COPY_##c
#define WAIT_EVENT_COPY_0u wait_event_off
#define WAIT_EVENT_COPY_1u wait_event_obs
#else
#define WAIT_EVENT_COPY(c) wait_event
#endif
#if OFF_COPY_BIT(1)
#define RUN_TASK_COPY(c) run_task<c>
#else
#define RUN_TASK_COPY(c) run_task
#endif
/* (session 58; the default since session 60, -DDTMK_NO_HOT_FIRST without): -DDTMK_HOT_FIRST renames the workers'
 * hot functions (1b batch 1, plan 157: ~95 KB of 128-byte lines executed per launch, spread over
 * ~860 KB of code) so that they follow the kernel's entry in the cubin, which orders the
 * subroutines by mangled name (_Z10a0... first): a contiguous hot region instead of one
 * interleaved with the cold functions.  Plan 158: the GPC cache's fetches from L2 -35%, the no-hook
 * build -0.7% per step, the hook build's off cost not (the wait's code, -DDTMK_OFF_COPY above). */
#ifdef DTMK_HOT_FIRST
#define run_task a0run_task
#define run_body a1run_body
#define ws_proj a2ws_projx
#define ws_gate_up a3wsgateup
#define stage_norm a4stagenrm
#define ws_prestart a5prestart
#define wait_event a6wait_evt
#define wait_event_off a6wait_evt   /* (-DDTMK_OFF_COPY's copy 0; its copy 1, wait_event_obs, stays cold) */
#define op_attn_staged a7attnstgd
#define op_rope_attn a8ropeattn
#endif
/* MEASUREMENT (session 66; bench/hooks.py variant hottiny): -DDTMK_HOT_TINY extends the hot-first layout to
 * the standard lowering's task functions (tiny: not weight-streamed, so op_proj / op_gate_up, plus the
 * rmsnorm and rope levels and attention's dispatch), which lie among the cold functions -- in the hook build
 * between hook_event / hook_flush, the VM and the map helpers (tiny's per-step code spans ~390 KB there, ~250
 * KB in the no-hook build: sessions 58-59's conflict misses).  Is that tiny's off cost (+5.31%, H200, session
 * 65; 1b's is +0.28%)?  Ten-letter names sort right after a8ropeattn. */
#ifdef DTMK_HOT_TINY
#if defined(DTMK_NO_HOT_FIRST)
#error "-DDTMK_HOT_TINY extends the hot-first layout: not with -DDTMK_NO_HOT_FIRST"
#endif
#define op_proj a9op_projx
#define op_gate_up b6gateupop
#define op_rmsnorm b7rmsnorm_
#define op_rope_kv b8rope_kv_
#define op_attn b9op_attn_
#define mv_row_nl c0mv_rownl
#endif
/* MEASUREMENT (session 61; bench variants obssm4hotobs, obs_split hotobs16): -DDTMK_HOT_OBS extends the
 * hot-first layout to the observer-SM build.  Its workers call osq_defer_flush at most waits' first failed
 * poll and osq_raise in long waits; its observers run osq_observer -> osq_run_entry -> hook_flush, obs_sync
 * -> the programs -- all named among the cold functions, so they lie far from the hot region (and from
 * each other) in the GPC cache the workers of an observer's GPC share with it.  Renamed, they follow the
 * workers' hot functions.  (Not the map helpers: a compiled monitor calls them by their names.) */
#ifdef DTMK_HOT_OBS
#if !defined(DTMK_OBS_SM) || !defined(DTMK_HOT_FIRST)
#error "-DDTMK_HOT_OBS extends the hot-first layout to the observer-SM build: with -DDTMK_OBS_SM, without -DDTMK_NO_HOT_FIRST"
#endif
#define osq_defer_flush a9osqflush
#define osq_raise b0osqraise
#define osq_observer b1osqobsrv
#define osq_run_entry b2osqrunen
#define hook_flush b3hookflsh
#define obs_sync b4obs_sync
#define dtmk_vm_run_records b5vmrunrec
#endif
#include "mk_ops.cuh"
#include "mk_comm.cuh"      /* tensor parallelism: comm tasks, system-scope signals, comm hooks */
/* DTMK_REC_FAST (round 8, docs/dev/hook_cost_analysis.md; the default since session 4,
 * -DDTMK_REC_GLOBAL builds the old path): hook_hold / hook_flush / hook_put take the task
 * record from the shared copy s_rec (wait_event, record early) when it holds the task,
 * instead of a global load: no L2 round trip before the release signal and one fewer after
 * it.  Record contents unchanged (s_rec is a verbatim copy; tests/gpu/test_rec_fast_gpu.py). */
#if !defined(DTMK_REC_GLOBAL) && !defined(DTMK_REC_FAST) && !defined(DTMK_NO_HOOKS) && !defined(DTMK_REC_LATE)
#define DTMK_REC_FAST
#endif
#if defined(DTMK_REC_GLOBAL) && defined(DTMK_REC_FAST)
#error "DTMK_REC_GLOBAL (the old record path) and DTMK_REC_FAST exclude each other"
#endif
#if defined(DTMK_OBS_PROF) && defined(DTMK_NO_HOOKS)
#error "DTMK_OBS_PROF profiles the hook code (not with DTMK_NO_HOOKS)"
#endif
#if defined(DTMK_DRAIN_POLL) && (defined(DTMK_NO_HOOKS) || defined(DTMK_OBS_SM))
#error "DTMK_DRAIN_POLL polls beside the workers' own drains (not with DTMK_NO_HOOKS or DTMK_OBS_SM)"
#endif
#if defined(DTMK_DRAIN_POLL) && defined(DTMK_NO_DRAIN_POLL)
#error "DTMK_NO_DRAIN_POLL and DTMK_DRAIN_POLL exclude each other"
#endif
/* The drain's poller (mk_observer.cuh obs_sync_wait_cta): the default of the workers' hook
 * builds since session 48 -- without it a drain inside a dependency wait hides the event's
 * arrival and the monitor's own cost reads as notification lag (fault-free tiny serving:
 * late_notification in 5 of 6 jobs, none in 6 of 6 with it; H100, docs/results/hooks.md
 * "Session 48").  -DDTMK_NO_DRAIN_POLL builds the old wait (~0.7% shorter 1b serving step). */
#if !defined(DTMK_DRAIN_POLL) && !defined(DTMK_NO_DRAIN_POLL) && !defined(DTMK_NO_HOOKS) && !defined(DTMK_OBS_SM)
#define DTMK_DRAIN_POLL
#endif
#if defined(DTMK_GATE_POLL) && !defined(DTMK_DRAIN_POLL)
#error "DTMK_GATE_POLL extends DTMK_DRAIN_POLL's poller (not with DTMK_NO_DRAIN_POLL, DTMK_NO_HOOKS or DTMK_OBS_SM)"
#endif
#if defined(DTMK_DRAIN_POLL_ACQ) && !defined(DTMK_DRAIN_POLL)
#error "DTMK_DRAIN_POLL_ACQ is a form of DTMK_DRAIN_POLL's poller (not with DTMK_NO_DRAIN_POLL, DTMK_NO_HOOKS or DTMK_OBS_SM)"
#endif
#if defined(DTMK_REC_FAST) && (defined(DTMK_NO_HOOKS) || defined(DTMK_REC_LATE))
#error "DTMK_REC_FAST needs the hook code and the record-early s_rec (not with DTMK_NO_HOOKS, DTMK_REC_LATE)"
#endif
#ifndef DTMK_NO_HOOKS
#ifdef DTMK_OBS_PROF
/* -DDTMK_OBS_PROF (bench/level_profile.py --prof): where thread 0's observation time goes,
 * in SM clock cycles, summed over workers at the kernel end into dtmk_obs_prof:
 * [0, 1] one-batch drains (count, cycles), [2, 3] whole-ring drains, [4, 5] hook_post
 * (after the release signal), [6, 7] drains after which the awaited event was already
 * there at the next poll (count, cycles of those drains: an upper bound on the delay),
 * inside drains: [8, 9] VM / compiled calls on a batch, [10, 11] the coverage flush and
 * epoch publish, [12, 13] the ring moves; inside the VM / compiled calls (lane 0, per program
 * run): [14, 15] the exec step, [16, 17] the coverage count (bpf_run_prog.cuh), [18, 19]
 * accumulator flushes to the global coverage rows (epoch changes); inside the VM's exec step
 * (lane 0, warp-wide instructions): [20, 21] helper calls, [22, 23] memory instructions;
 * thread 0 around a task's release signal: [24, 25] hook_hold (before it: on the
 * consumers' path), [26, 27] one record built and stored in hook_flush (after it);
 * the compiled tier's inline form: [28, 29] one event through a hook's inline programs
 * (hk_inline, thread 0; the lean form's hk_lean in a -DDTMK_LEAN_SITE build), [30, 31] the
 * shadow's flush in obs_sync (lane 0); an observer-SM build's worker thread 0: [32, 33] a task's post path (its end stamp -> refresh_control
 * done: signal, push, bookkeeping), [34, 35] the release signal alone (post_signal or
 * comm_post), [36, 37] osq_raise calls in the wait, [38, 39] of those the ones after which
 * the next poll found the event met (the raise delayed its detection), [40, 41] the push after
 * the signal (publish, entry stores); any build's worker thread 0: [42, 43] worker-state
 * stores + post_pending after the signal, [44, 45] refresh_control, [46, 47] wait_event's
 * first look (record copy, post_pending, first acquire); an observer-SM build's worker thread 0:
 * [48, 49] of the push, the queue head's publish alone */
#define PROF_N 50
extern "C" __device__ unsigned long long dtmk_obs_prof[PROF_N];
__device__ unsigned long long dtmk_obs_prof[PROF_N];
__shared__ unsigned long long s_prof[PROF_N];
__shared__ long long s_prof_drain;      /* cycles of the drain just done (thread 0), 0 = none */
__shared__ long long s_prof_raise;      /* cycles of the osq_raise just done (worker thread 0), 0 = none */
/* a counter pair: DTMK_PROF_BEGIN(t) ... DTMK_PROF_END1(k, t) (the calling thread) or
 * DTMK_PROF_END(k, t) (lane 0 of warp 0 only); empty without DTMK_OBS_PROF (bpf_maps.cuh) */
#define DTMK_PROF_BEGIN(name) const long long name = clock64()
#define DTMK_PROF_END(k, name) do { if ((threadIdx.x & 31) == 0 && threadIdx.x < 32) { s_prof[k] += 1; \
    s_prof[(k) + 1] += (unsigned long long)(clock64() - (name)); } } while (0)
#ifndef DTMK_OBS_SM
#define DTMK_PROF_END1(k, name) do { s_prof[k] += 1; s_prof[(k) + 1] += (unsigned long long)(clock64() - (name)); } while (0)
#else   /* (with the observer SM: observer warp 0 alone, tools/obs_sm_probe.py --prof; the others' lane 0 would race) */
#define DTMK_PROF_END1(k, name) do { if (threadIdx.x < 32) { s_prof[k] += 1; \
    s_prof[(k) + 1] += (unsigned long long)(clock64() - (name)); } } while (0)
#endif
#endif
#ifdef DTMK_OBS_SM
/* the observer's batches mix workers at different decode steps: two coverage accumulators
 * per (hook, slot), by epoch parity, so adjacent steps do not flush each other */
#define DTMK_COV_ACC_WAYS 2u
#define DTMK_COV_ACC_STRIDE (DTMK_NUM_HOOKS * DTMK_MAX_PROGS)
#endif
#include "bpf_vm.cuh"
#ifdef DTMK_COMPILED_TIER      /* LTO build linked with a compiled monitor (bpf_compiled.cuh) */
#include "bpf_compiled.cuh"
#define DTMK_RUN_RECORDS dtmk_cm_run_records
#else
#define DTMK_RUN_RECORDS dtmk_vm_run_records
#define DTMK_INL_DESC_ONLY     /* the site form runs descriptors only: no compiled programs to call */
#endif
#include "bpf_inline.cuh"      /* the site form (shadow, descriptors); already in via bpf_compiled.cuh */
#if !defined(DTMK_NO_HOOKS) && (defined(DTMK_SITE_FORM) || defined(DTMK_COMPILED_TIER)) && !defined(DTMK_OBS_SM)
/* The site form: hook slots flagged DTMK_PROG_F_INLINE run at the site (aggregation
 * descriptors; compiled inline programs) with their updates in the shadow.  In the
 * compiled tier's linked kernels, and with -DDTMK_SITE_FORM (bench variant siteform).
 * Not in the default hook build: measured on 1b (docs/results/hooks.md "Session 10") it
 * cost the off path ~3.5 points (+6.1% vs +2.4% over no hooks, same run) while the hot
 * summary from descriptors (+36.9%) was no faster in us per step than the VM summary of
 * the build without it; without it every slot takes records through the ring and the VM.
 * Not with the observer SM: its compiled tier runs the linked programs over the records
 * (dtmk_cm_run_records), off the workers' path like the VM */
#define HK_SITE_FORM
#endif
#if !defined(DTMK_NO_HOOKS) && defined(DTMK_LEAN_SITE)
#ifdef DTMK_OBS_SM
#error "-DDTMK_LEAN_SITE is the in-CTA sites' lean form: not with -DDTMK_OBS_SM"
#endif
/* The lean form (kernels/bpf_inline.cuh): descriptor programs whose keys have dense domains
 * (DTMK_PROG_F_LEAN) run at the site from its record (a shared-memory copy) into the worker's dense
 * cells, folded into the maps by obs_sync -- no ring, no drain, no interpreter, no probe.
 * Opt-in (bench variant lean): measured no cheaper than the VM's summary on 1b (session 63,
 * docs/dev/hook_cost_analysis.md); with or without the site form */
#define HK_LEAN
#endif
#if defined(HK_SITE_FORM) || defined(HK_LEAN)
#define HK_DESC_COPY        /* the descriptor programs' shared copy (O.desc) */
#endif
#endif
#ifndef DTMK_PROF_BEGIN   /* -DDTMK_NO_HOOKS (no bpf headers): the counters are empty here too */
#define DTMK_PROF_BEGIN(name)
#define DTMK_PROF_END(k, name)
#define DTMK_PROF_END1(k, name)
#endif

/* control words (u32) */
#define CTL_HOOK_MASK 0
#define CTL_TRACE 1
#define CTL_ABORT 2        /* != 0: stop (1 host request, 2 watchdog) */
#define CTL_REFRESH 3      /* refresh period in tasks */
#define CTL_WD_US 4        /* watchdog: max wait in microseconds (0 = off) */
#define CTL_ABORT_WORKER 5 /* worker that fired the watchdog */
#define CTL_STEP_OVERRIDE 6
#define CTL_GEN 7          /* global program generation: the host bumps it after writing hook tables */
#define CTL_TABLES 8       /* u64 (words 8, 9): device address of dtmk_hook_table[DTMK_NUM_HOOKS], 0 = none */
#define CTL_OBS 10         /* u64 (words 10, 11): observer state u64[W][OBS_WORDS] */
#define CTL_STAMP 12       /* u64 (words 12, 13): host's attach stamp on the device clock (read by the host) */
#define CTL_GATE 14        /* resident launches (P.resident): steps < (gate & GATE_STEPS) may run; with
                            * GATE_STOP set, every worker ends at step (gate & GATE_STEPS).  The host
                            * writes grant | stop in ONE store, so all workers end at the same step. */
#define GATE_STEPS 0x7fffffffu
#define GATE_STOP 0x80000000u
#define CTL_GEN_DUE 16     /* resident launches: the first step whose gate must load the tables of the
                            * generation the host publishes with it (the host writes it before CTL_GEN;
                            * min over changes some worker has not loaded yet); a worker loads them
                            * earlier only in idle time (a wait that is not ready): O.lazy, obs_sync */
#define CTL_SM_MAP 18     /* u64 (words 18, 19), -DDTMK_SM_WORKER: device address of int32 map[smid] ->
                            * worker (0 = worker = blockIdx.x): which SM runs which plan, fixed
                            * across launches; bit 0 set: int32 out[block] <- its SM ("worker
                            * placement" below) */
#define CTL_OBSQ 20       /* u64 (words 20, 21), -DDTMK_OBS_SM: device address of the observer queues
                            * ("observer SM" below; 0 = none) */
#define CTL_WORDS 32

/* ---- observer SM (-DDTMK_OBS_SM; opt-in.  Exact on the H200 but one SM cannot keep up
 * with 1b: docs/dev/hook_cost_analysis.md "Session 15") -----------------------------------
 * DTMK_OBS_SMS (default 1) CTAs more than workers: blocks P.n_workers + m are the
 * OBSERVERS, each on its own SM (one SM costs nothing measurable: docs/results/hooks.md
 * "Session 13"; 1b's ops have 128 tiles, so up to 4 SMs of 132 are spare).  Worker thread 0 writes
 * each task's captured hooks as one 128-byte entry into its queue in global memory
 * BEFORE the task's release signal and bumps the queue's head right AFTER it (the
 * signal's MEMBAR orders the entry before the head: no fence of its own); records
 * built elsewhere (hook_event, gen:advance) are pushed with a fence.  The observer runs
 * Kl warps each (mk_obs_sm.cuh: as many as the launch's dynamic shared memory holds an Obs
 * for, DTMK_OBS_SM_WARPS at most), K = DTMK_OBS_SMS x Kl in all, warp k (observer m's
 * warp kl: k = m Kl + kl) serving workers k, k + K, ...: each lane pops one
 * worker's next entry and builds its records (hook_flush: the warp's ring, the host
 * ring), so a round builds up to 32 tasks' records at once; the VM runs batches that mix
 * workers (each lane takes its record's worker); coverage accumulates per epoch parity.
 * Workers load no tables: each observer warp loads its own copy and publishes the hook
 * mask with a live bit in its workers' OSQ_W_MASK (a launch's workers wait for it) and
 * the generation in their observer-state rows.  OBS_PENDING: each worker holds its row
 * before its signals (hold_epoch) and raises it to OSQ_W_LOW (its observer warp's lowest
 * held epoch, lowered before the tails), bounded by the step of its oldest entry the
 * observer has not taken.  Queue memory (gpu.py OSQ_*): per worker 64 bytes of words (OSQ_W_*) and OSQ_N
 * entries. */
#ifndef DTMK_OSQ_N
#define OSQ_N 64
#else                   /* -DDTMK_OSQ_N=K: K entries per worker (gpu.osq_depth_of allocates them) */
#if (DTMK_OSQ_N) < 16 || (DTMK_OSQ_N) > 1024 || ((DTMK_OSQ_N) & ((DTMK_OSQ_N) - 1))
#error "DTMK_OSQ_N=K: want a power of two 16..1024 (the queue's entries per worker)"
#endif
#define OSQ_N (DTMK_OSQ_N)
#endif
#define OSQ_W_BYTES (64 + OSQ_N * 128)
#define OSQ_W_HEAD 0       /* u64 words of a worker's area: entries pushed (worker thread 0) */
#define OSQ_W_TAIL 1       /* entries consumed (observer) */
#define OSQ_W_DONE 2       /* worker: 1 after its last push */
#define OSQ_W_HOOK_N 3     /* the host ring's cursor of this worker (observer): hook_n, slot, drop */
#define OSQ_W_HOOK_SLOT 4
#define OSQ_W_HOOK_DROP 5
#define OSQ_W_MASK 6       /* (observer) bit 32: live (its first tables are in); bit 33: the full pre-signal
                            * hold (O.hold_full); low bits: the hook mask */
#define OSQ_W_LOW 7        /* (observer) the lowest epoch its warp holds (~0u: none); OBS_PENDING's bound */
/* -DDTMK_OSQ_SPLIT (opt-in, session 35; mk_obs_sm.cuh osq_builder / osq_drainer): the observer
 * SMs' two phases on different TPCs -- the first half of the observer SMs BUILD records from the
 * entries, the second half RUN them (VM, maps, coverage, epochs) -- so each TPC's instruction
 * cache holds one phase's code (docs/dev/hook_cost_analysis.md "Session 34").  Builder warp p hands
 * its records to drainer warp p through blocks in global memory after the workers' areas (gpu.py
 * osq_split_bytes): a u64 build cursor per worker (the entries the builder has read; the TAIL
 * still moves only when the drainer has the records), then per pair OSQ_PAIR_BYTES: 128 bytes of
 * words (OSQ_P_*) and OSQ_SPLIT_NH blocks of OSQ_BLK_BYTES (a 512-byte header, then OBS_RING records).
 * Exact on the H200 (tests/gpu -k obssm4split) but SLOWER (docs/results/hooks.md "Session 35", 1b
 * obs_sm_probe: hot summary +26% over its off vs +12% for the CLI build): the builders' GPC is spared,
 * the drainers' GPC-mates are slowed as much as before (+700..+1130 ns per task), and 12 drain warps
 * cannot do 24 warps' VM work (its map updates are L2 round trips; the code's own fetch is not what
 * limits them).  With the descriptor path on the drainers they kept up and the hook table was
 * unchanged (+7.07% vs +7.65%): kept opt-in as the instrument that split the two phases' costs */
#define OSQ_SPLIT_NH 4
#define OSQ_BLK_HDR 512
#define OSQ_BLK_BYTES (OSQ_BLK_HDR + OBS_RING * 128)
#define OSQ_PAIR_BYTES (128 + OSQ_SPLIT_NH * OSQ_BLK_BYTES)
#define OSQ_P_HEAD 0       /* u64 words of a pair: blocks published (builder) */
#define OSQ_P_TAIL 1       /* blocks taken (drainer) */
#define OSQ_P_SEQ 2        /* (drainer) tables loaded: 1 + reloads; OSQ_P_MASK / OSQ_P_GEN before it */
#define OSQ_P_MASK 3       /* the VM's hooks (O.vm_mask), bit 31: O.hold_full */
#define OSQ_P_GEN 4        /* the tables' generation (O.gen_seen) */
#define OSQ_P_DONE 5       /* (builder) 1 after its last block */
#define OSQ_BLK_RELOAD 1u  /* block header word 16 (flags): no records; the drainer reloads the tables.  Header
                            * u32 words 0-15: records per hook, 16-19: flags, commits, lowest epoch, highest
                            * step; 32 + i: commit i's worker; u64 word 32 + i: its tail (the builder's cursor) */
#define OSQ_TAG_PEND 0xffffffffu   /* entry word 0: a task's captured hooks (else a built record: its ABI version) */
#define OSQ_TAG_STEP 0xfffffffeu   /* entry word 0: a resident launch's step gate (words 1-2: steps finished) */
#if defined(DTMK_OBS_SM) && (defined(DTMK_NO_HOOKS) || defined(DTMK_SITE_FORM))
#error "-DDTMK_OBS_SM: a hook build, its compiled tier or its handoff build (no site form)"
#endif
#ifndef DTMK_OBS_SMS
#define DTMK_OBS_SMS 1             /* observer SMs of an observer-SM job (its lean grid leaves them free too) */
#endif
#ifdef DTMK_OBS_SM
__shared__ dtmk_u32 s_osq_obs;     /* m + 1: this CTA is observer m (the last DTMK_OBS_SMS blocks, or the map's
                                    * SMs n_workers + m); 0: a worker */
#define HO_OBSERVER s_osq_obs      /* (the observer resumes no worker) */
#else
#define HO_OBSERVER 0
#endif
#define MK_IDLE 7                  /* W.aborted: the observer's SM in a build without an observer (sm_worker) */
#ifdef DTMK_SM_IDLE
/* -DDTMK_SM_IDLE (with -DDTMK_SM_WORKER): a CTA on an SM the placement map marks -2 leaves at
 * once, before it touches any worker's rows, so that SM runs nothing (serve's pinned observers:
 * a grid of every SM, one left free for the clock pairs; bench/obs_split.py --idle-smids) */
#ifndef DTMK_SM_WORKER
#error "DTMK_SM_IDLE leaves the SMs a placement map marks -2 idle: add DTMK_SM_WORKER"
#endif
#define MK_IDLE_SM 8               /* W.aborted: an SM left idle (sm_worker) */
#endif

/* ---- grid handoff -------------------------------------------------------------------
 * The off path of a hook build costs the persistent loop a few percent through code that
 * never runs (register allocation across calls: docs/dev/hook_cost_analysis.md, sessions
 * 6-12).  So a job with nothing attached runs the no-hook build itself, with worker
 * placement (-DDTMK_NO_HOOKS -DDTMK_SM_WORKER: the "lean" grid, not one instruction of
 * handoff code), and the first attach launches the hook build (-DDTMK_HANDOFF
 * -DDTMK_SM_WORKER) as a second grid, then asks the lean grid to stop with control[
 * CTL_ABORT] = ABORT_LEAVE.  A lean worker stops where any abort stops it: in a
 * dependency wait's poll, before the awaited task runs; its worker_state row then holds
 * that wait (WS_EVENT, WS_TARGET), its tasks done, and at its exit, behind a fence,
 * WS_STATE = WS_LEFT (3 when it had finished).  Its deferred late signals are posted as
 * it exits (up to a late_notification's delay early).  A CTA of the hook grid can only
 * be placed on an SM a lean CTA has left (one CTA per SM: each takes the whole register
 * file, checked by the host), and it resumes the worker the placement map gives its SM,
 * the one that ran there: no queue, no claim order, nothing to wait for but the row's
 * final state (Session 11's claim-by-push protocol and the lean build's leave test are
 * gone: they cost the lean loop 1.2-1.4% on 1b, bench/placement.py 2026-12-01).  Event
 * counters, queues and request slots are in global memory, so nothing else moves.
 *
 * P.handoff_in (the successor grid's; 0 otherwise): u64 [0] workers resumed mid-run,
 * [1] workers resumed, then per worker HO_WORDS: [0] step resumed (~0: it had finished),
 * [1] plan index resumed, [2] tasks done at the leave, [3] 1 if its phantoms were re-added,
 * [12] %globaltimer at the leave, [13] at the resume, [14] the SM. */
#define HO_WORDS 16
#define ABORT_LEAVE 6u     /* control[CTL_ABORT]: lean grid, stop for a handoff (the hook grid runs on) */
#define WS_LEFT 6          /* worker_state WS_STATE: stopped for a handoff, exited (the row is final) */
#if defined(DTMK_HANDOFF) && defined(DTMK_NO_HOOKS)
#error "-DDTMK_HANDOFF is the hook build's (it resumes); the lean grid is -DDTMK_NO_HOOKS -DDTMK_SM_WORKER"
#endif
#if defined(DTMK_HANDOFF) && !defined(DTMK_NO_HOOKS)
#define HO_RESUME 1
#ifndef DTMK_SM_WORKER
#error "-DDTMK_HANDOFF: a successor CTA resumes the worker of its SM (-DDTMK_SM_WORKER)"
#endif
#define ABORT_ASKED(a) ((a) != 0u && (a) != ABORT_LEAVE)    /* the lean grid's leave is not ours */
#else
#define ABORT_ASKED(a) ((a) != 0u)
#endif
#if defined(DTMK_HANDOFF) && defined(DTMK_WS_NEXT)
#error "-DDTMK_HANDOFF: a leave must not find a stream or record started for the next task"
#endif

/* observer state per worker (u64 words, global memory, read by the host while running) */
#define OBS_PENDING 0      /* lowest decode step of a record not yet run + flushed; ~0 = none */
#define OBS_DRAINED 1      /* records run through the VM */
#define OBS_LOST 2         /* records refused by a full shared ring (counted lost in coverage) */
#define OBS_GEN 3          /* global generation whose tables this worker holds */
#define OBS_LOADED_TS 4    /* %globaltimer when it loaded them */
#define OBS_FIRST_TS 5     /* ts_ns of the first record counted under OBS_GEN (0 = none yet) */
#define OBS_DONE 6         /* 1 when the worker has drained for the last time */
#define OBS_DRAINS 7       /* low 32 bits: drains (warp-0 VM calls); high 32 bits: epoch publishes
                            * (an emptied ring that fenced and moved OBS_PENDING) */
#define OBS_WORDS 8
#define OBS_RING 96        /* shared-memory ring of contexts per worker, split evenly between the hooks
                            * that have VM programs (one sub-ring each: a drain runs 32-record batches
                            * of one hook back to back); static smem + gpu.py's SMEM_LIMIT <= 227 KB */
#define OBS_ROOM 8         /* a sub-ring keeps room for this many records of one task (must-drain below) */
#define OBS_EARLY_POLLS 16 /* a wait drains (one 32-record batch per 16 polls) after this many polls when it
                            * is long (this one or the worker's previous one lasted OBS_LONG_WAIT_NS), ... */
#define OBS_LONG_WAIT_NS 50000ull   /* tiny waits ~110 us: drain early; 1b waits (mostly < 50 us) are left alone */
#define OBS_AT_GATE 0x80000000u   /* obs_sync's step argument at a granted step gate (steps < 2^31: GATE_STEPS) */
#define OBS_LAG 4          /* ... or when the lowest epoch held is this many steps behind (bounded lag) */
#ifdef DTMK_COV_ACC_WAYS
#define OBS_NACC (DTMK_NUM_HOOKS * DTMK_MAX_PROGS * DTMK_COV_ACC_WAYS)   /* per (way, hook, slot) */
#else
#define OBS_NACC (DTMK_NUM_HOOKS * DTMK_MAX_PROGS)   /* coverage accumulators: one per (hook, slot) */
#endif
#define DTMK_OBS_DESC 32   /* descriptor entries (kernels/bpf_inline.cuh) kept in shared memory (2.5 KB) */
#ifndef DTMK_OBS_CODE
#define DTMK_OBS_CODE 256  /* -DDTMK_VM_CODE_SMEM: instruction records of VM code kept in shared memory (4 KB) */
#endif

/* worker_state u64 words */
#define WS_TASK 0
#define WS_STEP 1
#define WS_EVENT 2
#define WS_VALUE 3
#define WS_TARGET 4
#define WS_STATE 5         /* 1 running, 2 waiting, 3 done, 4 aborted by watchdog, 5 stopped */
#define WS_TS 6
#define WS_DONE 7

/* fault kinds (faults.py) */
#define F_SLOW 1
#define F_LATE 3
#define F_SAT 4
#define F_STARVE 5

#define MK_PENDING 4        /* deferred (late) signals per worker */

#define TREC_WORDS 16
#define TRACE_BYTES 32

struct TraceRec {          /* 32 bytes; stamps are %globaltimer ns */
    dtmk_u64 t_dispatch;   /* taken from the plan / queue, before the dependency wait */
    dtmk_u32 wait_ns;      /* dispatch -> begin (dependency wait) */
    dtmk_u32 dur_ns;       /* begin -> end */
    dtmk_u32 task_index;
    dtmk_u32 step;
    dtmk_u16 sm;
    dtmk_u16 worker;
    dtmk_u16 flags;        /* DTMK_FLAG_* */
    dtmk_u16 cls;
};

struct Worker {            /* per-CTA scheduler state, in shared memory */
    dtmk_u32 hook_mask, trace_on, refresh, wd_us, since_refresh, aborted;
    dtmk_u32 worker, sm;
    dtmk_u64 hook_n, trace_n;
    dtmk_u64 hook_tail, hook_drop;           /* records the host consumed (read at step gates) / not stored: ring full */
    dtmk_u64 hook_slot;                      /* hook_n % P.hook_cap: the streaming ring's next slot */
    int gate;                                /* resident step gate outcome (thread 0 -> CTA): 0 run, 1 park, 2 stop */
    int dyn_task, dyn_step, ready;
    dtmk_u32 phantoms;                       /* queue_saturation entries not yet drained */
    dtmk_u64 done;                           /* tasks this worker completed (all launches: no) */
    int pend_event[MK_PENDING];              /* late_notification: deferred signals */
    dtmk_u64 pend_due[MK_PENDING];
    /* the one "observing?" word: hook_mask | trace_on | table reload pending (obs_update).
     * 0: no hook site, timer, trace record or observer check runs for the task. */
    dtmk_u32 observe;
    int first;                               /* wait_event's first look: 1 ready, 2 drain now */
    dtmk_u32 long_wait;                      /* observing: the previous dependency wait was long */
    /* thread 0, hook / trace only (written while observe != 0; t_ready also for starve
     * faults): kept here instead of run_task arguments so the hot call carries none */
    dtmk_u64 t_disp, t_ready, t_begin, dep_wait;
    dtmk_u64 pend_rg;                        /* bit 32 set: the deferred records' request_gen (hook_hold) */
#ifdef HO_RESUME
    int rs_step, rs_i, rs_phant;             /* where the predecessor left (rs_i -1: a fresh start,
                                              * -2: it finished, this CTA only ends the launch;
                                              * -3: only the end-of-run drain is left); rs_phant:
                                              * its phantoms were unspent (re-added) */
#endif
#ifndef DTMK_NO_HOOKS
    /* Deferred records of the running task (thread 0).  dep:release, task:ready,
     * queue:pressure, comm:wait, task:dispatch, task:begin and task:end are captured on
     * the critical path as a few shared stores (these scalars; no clock read, table or
     * global load beyond the stamps the task takes anyway) and built by hook_flush after
     * the task's release signal, in hook order, each with its captured stamp. */
    dtmk_u32 pend;                           /* hook bits captured, not yet built */
    dtmk_u32 pend_q;                         /* task:ready's queue depth (phantoms + 1) */
    int pend_t, pend_step;                   /* the task and step they belong to */
    dtmk_u32 pend_flags;                     /* its DTMK_FLAG_* bits (task_faults) */
    dtmk_u32 cw_peer;                        /* comm:wait: the last remote sender (hook_hold) */
    dtmk_u64 ts_rel, t_end;                  /* dep:release / task:end stamps */
#ifdef DTMK_DRAIN_POLL
    /* when this static task's dependency was seen met while warp 0 drained the observer
     * (0: not during a drain): task:ready is stamped with it, DTMK_FLAG_OBS_DELAY set */
    dtmk_u64 t_seen;
#endif
#ifdef DTMK_OBS_SM
    dtmk_u64 osq_head, osq_tail;             /* worker thread 0: entries pushed; the observer's tail last read */
    dtmk_u32 osq_unpub;                      /* an entry written before the signal, its head bump due after it
                                              * (-DDTMK_OSQ_LAZY_PUB: written after it, due after the next) */
    dtmk_u32 osq_lo;                         /* (an observer lane) lowest epoch it put in the ring this round */
    dtmk_u64 *osq_area;                      /* worker thread 0: its queue words (osq_mine), set once its
                                              * worker index is known */
#endif
#endif
};
#ifdef DTMK_OBS_SM
/* the CTA's W at file scope in the observer-SM build, so that osq_write_pend, naming it, reads
 * the entry's fields with shared-memory loads: through the `Worker &` every __noinline__
 * function takes they are generic loads (LD.E), a dependent chain in front of each store of
 * the push (H200, 1b: the push 0.57 -> 0.47 us per task, the hot summary ~1 point cheaper:
 * docs/results/hooks.md "Session 19"; the same for run_task / wait_event gained nothing) */
__shared__ Worker s_worker;
#endif
#ifdef DTMK_OSQ_WSHADOW
/* MEASUREMENT ONLY (session 54, bench/obs_split.py shadow16): the summary monitor's three
 * updates done by the worker itself, after the release signal, into a shared-memory shadow --
 * task:end's log2 latency per class, dep:release's wait sum per class, task:ready's depth max --
 * with no entry pushed (the observers idle).  What would a compiled tier that aggregates on the
 * workers cost above the capture (nopush16)?  The shadow goes to dtmk_wsh_sink at the worker's
 * end (a real form would fold it per epoch in an idle wait: off the critical path).
 * Without -DDTMK_OBS_SM (session 62, bench/hooks.py wshincta, run mask3): the in-CTA build's
 * sites do the same -- the task's captured hooks into the shadow after the signal instead of
 * hook_post's records (no record, no trace, no gen:advance: nothing readable), with the light
 * pre-signal hold -- the in-CTA site at its leanest, beside idealsite (hook_post, hook_flush and
 * the capture there, then the same three updates). */
#if defined(DTMK_OBS_SM) && !defined(DTMK_OSQ_NOPUSH)
#error "-DDTMK_OSQ_WSHADOW is measurement only: with -DDTMK_OBS_SM -DDTMK_OSQ_NOPUSH"
#endif
#ifdef DTMK_NO_HOOKS
#error "-DDTMK_OSQ_WSHADOW is measurement of hook code: not with -DDTMK_NO_HOOKS"
#endif
#elif defined(DTMK_OSQ_WSHADOW_DEFER)
#error "-DDTMK_OSQ_WSHADOW_DEFER defers -DDTMK_OSQ_WSHADOW's updates: add it"
#endif
#ifdef DTMK_OSQ_WSHADOW
#define WSH_CLS 16
#define WSH_B 40
__shared__ dtmk_u32 s_wsh_lat[WSH_CLS][WSH_B];
__shared__ dtmk_u64 s_wsh_dep[WSH_CLS];
__shared__ dtmk_u32 s_wsh_q, s_wsh_n[3];
#ifdef DTMK_OSQ_WSHADOW_DEFER
#define WSH_ST 16
__shared__ uint4 s_wsh_st[WSH_ST];       /* {pend, cls << 16 | depth, duration, dependency wait}, ns clamped to 32 bits */
__shared__ dtmk_u32 s_wsh_nst;
#endif
extern "C" __device__ unsigned long long dtmk_wsh_sink[WSH_CLS * WSH_B + WSH_CLS + 4];
__device__ unsigned long long dtmk_wsh_sink[WSH_CLS * WSH_B + WSH_CLS + 4];
__device__ __forceinline__ void wsh_zero() {      /* thread 0, at the launch's start */
    /* (the shadow's loops not unrolled: once per launch, so kept small -- session 61) */
#pragma unroll 1
    for (int i = 0; i < WSH_CLS * WSH_B; ++i) (&s_wsh_lat[0][0])[i] = 0;
#pragma unroll 1
    for (int i = 0; i < WSH_CLS; ++i) s_wsh_dep[i] = 0;
    s_wsh_q = 0; s_wsh_n[0] = s_wsh_n[1] = s_wsh_n[2] = 0;
#ifdef DTMK_OSQ_WSHADOW_DEFER
    s_wsh_nst = 0;
#endif
}
__device__ __forceinline__ void wsh_apply(dtmk_u32 c, dtmk_u32 pend, dtmk_u64 d, dtmk_u64 dep_wait, dtmk_u32 q) {
    c &= WSH_CLS - 1;
    if (pend & (1u << DTMK_HOOK_TASK_END)) {
        s_wsh_lat[c][min(64 - __clzll((long long)d), WSH_B - 1)] += 1; s_wsh_n[0] += 1;
    }
    if (pend & (1u << DTMK_HOOK_DEP_RELEASE)) { s_wsh_dep[c] += dep_wait; s_wsh_n[1] += 1; }
    if (pend & (1u << DTMK_HOOK_TASK_READY)) { s_wsh_q = max(s_wsh_q, q); s_wsh_n[2] += 1; }
}
#ifdef DTMK_OSQ_WSHADOW_DEFER
/* MEASUREMENT ONLY (session 62, obs_split shadowdefer16): the update staged after the signal and
 * applied one per failed poll of a later wait -- thread 0 polls anyway, and the update touches
 * shared memory only (the poll's acquire empties L1, not shared memory), inline.  Is a worker-side
 * aggregation free when it runs in the worker's idle polls (shadow16, after the signal: +2.04%)? */
__device__ __forceinline__ dtmk_u32 wsh_u32(dtmk_u64 x) { return x > 0xffffffffull ? 0xffffffffu : (dtmk_u32)x; }
__device__ __forceinline__ void wsh_apply_one() {   /* thread 0: the newest staged update (order-free sums) */
    const uint4 u = s_wsh_st[--s_wsh_nst];
    wsh_apply(u.y >> 16, u.x, u.z, u.w, u.y & 0xffffu);
}
#endif
__device__ __forceinline__ void wsh_update(const Worker &S, int cls, dtmk_u32 pend) {   /* thread 0, after the signal */
#ifdef DTMK_OSQ_WSHADOW_DEFER
    if (s_wsh_nst == WSH_ST) wsh_apply_one();       /* (no failed poll in 16 tasks: one now) */
    s_wsh_st[s_wsh_nst++] = make_uint4(pend, ((dtmk_u32)cls & (WSH_CLS - 1)) << 16 | min(S.pend_q, 0xffffu),
                                       wsh_u32(S.t_end - S.t_begin), wsh_u32(S.dep_wait));
#else
    wsh_apply((dtmk_u32)cls, pend, S.t_end - S.t_begin, S.dep_wait, S.pend_q);
#endif
}
__device__ __noinline__ void wsh_flush() {        /* thread 0, at the worker's end */
#ifdef DTMK_OSQ_WSHADOW_DEFER
    while (s_wsh_nst) wsh_apply_one();
#endif
#pragma unroll 1      /* (partly unrolled, this loop was ~3 KB more of cold code among the sorted functions) */
    for (int i = 0; i < WSH_CLS * WSH_B; ++i)
        if ((&s_wsh_lat[0][0])[i]) atomicAdd(&dtmk_wsh_sink[i], (unsigned long long)(&s_wsh_lat[0][0])[i]);
    for (int i = 0; i < WSH_CLS; ++i) if (s_wsh_dep[i]) atomicAdd(&dtmk_wsh_sink[WSH_CLS * WSH_B + i], s_wsh_dep[i]);
    atomicMax(&dtmk_wsh_sink[WSH_CLS * WSH_B + WSH_CLS], (unsigned long long)s_wsh_q);
    for (int i = 0; i < 3; ++i) atomicAdd(&dtmk_wsh_sink[WSH_CLS * WSH_B + WSH_CLS + 1 + i], (unsigned long long)s_wsh_n[i]);
}
#endif
#ifndef DTMK_OSQ_NOWAITCAP
#define OSQ_WAIT_CAPTURE 1
#else
#define OSQ_WAIT_CAPTURE 0   /* measurement only (with NOPUSH): the wait captures no dep:release */
#endif
#if (defined(DTMK_OSQ_NOPRE) || defined(DTMK_OSQ_NOHOLD) || defined(DTMK_OSQ_NOWAITCAP)) && !defined(DTMK_OSQ_NOPUSH)
#error "-DDTMK_OSQ_NOPRE / NOHOLD / NOWAITCAP are measurement only: with -DDTMK_OSQ_NOPUSH (their captures feed no entry)"
#endif

__device__ __forceinline__ const int *trec(const MkParams &P, int t) { return (const int *)P.tasks + t * TREC_WORDS; }
#if OFF_COPY_BIT(0) || OFF_COPY_BIT(1)
/* the "observing?" latch of -DDTMK_OFF_COPY: which copy the CTA's next static task's wait_event /
 * run_task run.  Thread 0 copies W.observe into it only where a barrier follows before any thread
 * reads it (the main loop, before calling wait_event) -- in run_task's prologue, before its first
 * barrier, and in a forced refresh_control (the launch's start and the step gate, each followed by
 * one) -- and no thread reads it between such a barrier and the next write (the next write is
 * behind the next wait_event's first barrier), so the choice is uniform over the CTA.  A change of
 * W.observe after the latch (refresh_control at a task's end, a reload in a wait) takes effect from
 * the task after the next: the observing copy is exact for any W.observe; the other one is taken
 * only when W.observe was 0 at the latch, and a monitor attached meanwhile starts one task later. */
__shared__ dtmk_u32 s_obs_copy;
#endif

/* ---- faults ----------------------------------------------------------------------- */
/* sum of param_a over the rows of `kind` that select (task t, step) (faults.py) */
__device__ long long fault_sum(const MkParams &P, int kind, int t, int step, int cls, int layer) {
    const long long *F = (const long long *)P.faults;
    long long s = 0;
    for (int i = 0; i < (int)P.n_faults; ++i) {
        const long long *r = F + i * 8;
        if (r[0] != kind) continue;
        if (r[1] >= 0 && r[1] != cls) continue;
        if (r[2] >= 0 && r[2] != layer) continue;
        if (step < r[3] || step > r[4]) continue;
        if (r[6] < 1000000 && fault_pick((dtmk_u64)r[7], (dtmk_u32)t, (dtmk_u32)step) >= (dtmk_u32)r[6]) continue;
        s += r[5];
    }
    return s;
}

struct TaskFaults { dtmk_u64 slow, late, starve; dtmk_u32 flags; };

/* thread 0: the fault effects on task t at step k (sim: computed at readiness) */
__device__ TaskFaults task_faults(const MkParams &P, int t, int step, const int *rec = 0) {
    TaskFaults f; f.slow = f.late = f.starve = 0; f.flags = 0;
    const int *r = rec ? rec : (const int *)P.tasks + t * 16;   /* rec: run_task's copy */
    int cls = r[0], layer = r[1];
    if (P.n_faults) {
        f.slow = (dtmk_u64)fault_sum(P, F_SLOW, t, step, cls, layer);
        f.late = (dtmk_u64)fault_sum(P, F_LATE, t, step, cls, layer);
        f.starve = (dtmk_u64)fault_sum(P, F_STARVE, t, step, cls, layer);
        if (f.slow || f.late || f.starve) f.flags |= DTMK_FLAG_FAULT;
        if (cls == 7) {  /* a router whose layer has a routing_skew row in scope */
            const long long *F = (const long long *)P.faults;
            for (int i = 0; i < (int)P.n_faults; ++i) {
                const long long *q = F + i * 8;
                if (q[0] == F_SKEW && (q[2] < 0 || q[2] == layer) && step >= q[3] && step <= q[4]) f.flags |= DTMK_FLAG_FAULT;
            }
        }
    }
    if (r[9]) f.flags |= DTMK_FLAG_DYNAMIC;
    if (cls == MK_CLS_ALLREDUCE && comm_late_ns(P, t, step)) f.flags |= DTMK_FLAG_FAULT;   /* late_comm */
    return f;
}

#include "mk_observer.cuh"   /* hook records and the observer (the device VM ring) */

/* thread 0: re-read the control words every `refresh` tasks */
__device__ __forceinline__ void refresh_control(const MkParams &P, Worker &W, bool force) {
    if (!force && ++W.since_refresh < W.refresh) return;
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    W.since_refresh = 0;
#ifndef DTMK_NO_HOOKS
    O.ring_mask = ld_volatile_u32(ctl + CTL_HOOK_MASK);
#ifdef DTMK_OBS_SM
    if (O.tables) {                    /* hooks its observer runs programs for; the hold they need */
        const dtmk_u64 m = osq_ld(osq_mine(P, W) + OSQ_W_MASK);
        O.vm_mask = (dtmk_u32)m;
#ifndef DTMK_HOLD_EAGER
        O.hold_full = (dtmk_u32)(m >> 33) & 1u;
#endif
    }
    W.hook_mask = O.ring_mask | obs_prog_hooks();
#else
    W.hook_mask = O.ring_mask | obs_prog_hooks();
    if (O.tables && ld_volatile_u32(ctl + CTL_GEN) != O.gen_seen) O.reload = 1;
#endif
#else
    W.hook_mask = 0;
#endif
    W.trace_on = ld_volatile_u32(ctl + CTL_TRACE);
    W.refresh = max(1u, ld_volatile_u32(ctl + CTL_REFRESH));
    W.wd_us = ld_volatile_u32(ctl + CTL_WD_US);
#ifndef DTMK_NO_HOOKS
    obs_update(W);
#else
    W.observe = W.trace_on;
#endif
#if OFF_COPY_BIT(0) || OFF_COPY_BIT(1)
    if (force) s_obs_copy = W.observe;   /* (its callers' barrier follows) */
#endif
}

__device__ __forceinline__ dtmk_u64 *wstate(const MkParams &P, int w) { return (dtmk_u64 *)P.worker_state + w * 8; }

#define XS smem + P.xs_off, (int)P.xs_cap
__device__ __noinline__ void run_body(const MkParams &P, Worker &W, int t, int step, float *smem, const int *r) {
    int cls = r[0], layer = r[1], lo = r[4], hi = r[5];
    int B = (int)P.batch, H = (int)P.hidden;
    switch (cls) {
    case 0: { /* rmsnorm: aux_norm 0 attention (layer 0 embeds first), 1 mlp, 2 final */
        int kind = r[12], fold = r[13];
        if (fold >= 0) { moe_fold(P, fold); __threadfence(); MK_SYNC(); }
        if (r[14] >= 0) op_tp_reduce(P, r[14]);   /* tensor parallel: h += the all-reduce's R slots */
        if (kind == 0 && layer == 0) { for (int b = 0; b < B; ++b) op_embed(P, b); __threadfence(); MK_SYNC(); }
        const unsigned short *w = kind == 2 ? (const unsigned short *)P.w_final_norm
            : (const unsigned short *)(kind == 0 ? P.w_attn_norm : P.w_mlp_norm) + (long)layer * H;
        op_rmsnorm(P, w, (const float *)P.h, (float *)P.xn, 0, B, smem);
        break;
    }
    case 1: /* qkv (r[12] >= 0: fused attention norm, split_k r[13]) */
        if (r[12] >= 0) {
            op_fused_proj(P, (const unsigned short *)P.w_qkv + (long)layer * P.qkv_dim * H,
                          (float *)P.qkv + (long)layer * B * P.qkv_dim, (int)P.qkv_dim, lo, hi, 0, layer, r[13], smem);
            break;
        }
        op_proj((const unsigned short *)P.w_qkv + (long)layer * P.qkv_dim * H, H, (const float *)P.xn,
                (float *)P.qkv + (long)layer * B * P.qkv_dim, (int)P.qkv_dim, B, lo, hi, false, XS);
        break;
    case 2: op_rope_kv(P, layer, lo, hi); break;
#ifdef DTMK_ROPE_IN_ATTN   /* rope_in_attn graphs (graph.py; gpu.Megakernel adds the define) */
    case 3: {
        const int g = lo / mk_rep(P);
        if (r[12] == 1) op_rope_attn(P, layer, r[3], g, smem);   /* this slot's q / k rope + cache row first */
        else op_attn(P, layer, r[3], g, smem);
        break;
    }
#else
    case 3: op_attn(P, layer, r[3], lo / mk_rep(P), smem); break;
#endif
    case 4: { /* attn_o: h[:, lo:hi] += Wo attn (tensor parallel: the partial sum, no residual) */
        int qd = (int)(P.n_heads * P.head_dim);
        bool tp = P.ranks > 1;
        if (r[12] > 1) {   /* split-K (graph.py split_k = r[12]): split index = tile w */
            op_split_proj(P, (const unsigned short *)P.w_o + (long)layer * H * qd, qd, (const float *)P.attn + (long)layer * B * qd,
                          2, (int)((dtmk_u32)r[11] >> 16), r[12], lo, hi, false, layer, smem);
            break;
        }
        op_proj((const unsigned short *)P.w_o + (long)layer * H * qd, qd, (const float *)P.attn + (long)layer * B * qd,
                tp ? tp_part(P, layer * 2) : (float *)P.h, H, B, lo, hi, !tp, XS);
        break;
    }
    case 5: { /* mlp gate/up */
        int di = r[14], F = (int)P.ffn;
        if (r[12] >= 0) {   /* fused MLP norm, split_k r[13] */
            op_fused_gate_up(P, (const unsigned short *)P.w_gate + (long)di * F * H, (const unsigned short *)P.w_up + (long)di * F * H,
                             (float *)P.act + (long)layer * B * F, lo, hi, layer, r[13], smem);
            break;
        }
        op_gate_up((const unsigned short *)P.w_gate + (long)di * F * H, (const unsigned short *)P.w_up + (long)di * F * H,
                   H, (const float *)P.xn, (float *)P.act + (long)layer * B * F, F, B, lo, hi, 0, 0, XS);
        break;
    }
    case 6: { /* mlp down: h[:, lo:hi] += Wd act (tensor parallel: the partial sum) */
        int di = r[14], F = (int)P.ffn;
        bool tp = P.ranks > 1;
        if (r[12] > 1) {   /* split-K: tile w = split; split 0 commits the residual */
            int sk = (int)((dtmk_u32)r[11] >> 16);
            op_split_proj(P, (const unsigned short *)P.w_down + (long)di * H * F, F, (const float *)P.act + (long)layer * B * F,
                          layer & 1, sk, r[12], lo, hi, sk == 0, layer, smem);
            break;
        }
        op_proj((const unsigned short *)P.w_down + (long)di * H * F, F, (const float *)P.act + (long)layer * B * F,
                tp ? tp_part(P, layer * 2 + 1) : (float *)P.h, H, B, lo, hi, !tp, XS);
        break;
    }
    case 7: op_router(P, r[14], layer, step, smem); break;
    case 8: {
        int mi = r[14];
        const int *m = (const int *)P.moe + mi * 8;
        int e = r[2], tile = (t - m[2]) - e * m[3];
        op_expert(P, mi, e, tile, lo, hi, smem);
        break;
    }
    case 9: op_lm_tile(P, lo, hi, smem, r[12] >= 0 ? r[13] : -1); break;   /* r[12] == 2: fused final norm */
    case 10: op_argmax_step(P, step, smem); break;
    case MK_CLS_ALLREDUCE: op_comm_tile(P, r[12], r[13], r[14], lo, hi); break;
    default: break;
    }
}

/* ---- weight prefetch ------------------------------------------------------------------ */
/* thread 0: stream the weight rows task t will read into L2 while the worker waits for
 * its dependency (weights never depend on the step's activations).  Runtime opt-in
 * (Megakernel(prefetch=True)), off by default: slower in v4, and in session 3 every
 * in-kernel prefetch variant (head-only, first rows, D rows ahead) was 0.86-0.94x the
 * default on H200 1b (docs/dev/megakernel_speed.md "Session 3"): the prefetches compete
 * with the demand stream for HBM / L2 bandwidth, so they were removed. */
__device__ void prefetch_task_weights(const MkParams &P, int t) {
    const int *r = trec(P, t);
    int cls = r[0], layer = r[1], lo = r[4], hi = r[5];
    dtmk_u64 H = P.hidden, rows = (dtmk_u64)(hi - lo);
    const unsigned short *w = 0, *w2 = 0;
    dtmk_u64 K = 0;
    switch (cls) {
    case 1: w = (const unsigned short *)P.w_qkv + ((dtmk_u64)layer * P.qkv_dim + lo) * H; K = H; break;
    case 4: K = P.n_heads * P.head_dim; w = (const unsigned short *)P.w_o + ((dtmk_u64)layer * H + lo) * K; break;
    case 5: K = H; w = (const unsigned short *)P.w_gate + ((dtmk_u64)r[14] * P.ffn + lo) * H;
            w2 = (const unsigned short *)P.w_up + ((dtmk_u64)r[14] * P.ffn + lo) * H; break;
    case 6: K = P.ffn; w = (const unsigned short *)P.w_down + ((dtmk_u64)r[14] * H + lo) * K; break;
    case 9: K = H; w = (const unsigned short *)P.w_lm_head + (dtmk_u64)lo * H; break;
    default: return;
    }
    prefetch_l2(w, rows * K * 2);
    if (w2) prefetch_l2(w2, rows * K * 2);
}

/* ---- scheduler ---------------------------------------------------------------------- */
__device__ __forceinline__ dtmk_u64 *counter(const MkParams &P, int e) { return (dtmk_u64 *)P.events + e; }

#include "mk_hooks.cuh"      /* the hook sites' cold code (capture, hold, hook_flush) */
#include "mk_obs_sm.cuh"     /* -DDTMK_OBS_SM: the observer SM's warps */


/* thread 0: post deferred (late_notification) signals that are due (all: force) */
__device__ void post_pending(const MkParams &P, Worker &W, bool force) {
    if (P.ranks > 1) comm_poll(P, W, force);   /* deferred comm signals (mk_comm.cuh) */
    dtmk_u64 now = mk_now();
    for (int i = 0; i < MK_PENDING; ++i) {
        if (W.pend_event[i] >= 0 && (force || now >= W.pend_due[i])) {
            red_release_add(counter(P, W.pend_event[i]), 1);
            W.pend_event[i] = -1;
        }
    }
}

/* thread 0: signal event e now, or `late` ns from now without holding the worker */
__device__ void post_signal(const MkParams &P, Worker &W, int e, dtmk_u64 late) {
    if (!late) { red_release_add(counter(P, e), 1); return; }   /* after bar.sync: cumulative release */
    dtmk_u64 due = mk_now() + late;
    for (;;) {
        for (int i = 0; i < MK_PENDING; ++i)
            if (W.pend_event[i] < 0) { W.pend_event[i] = e; W.pend_due[i] = due; return; }
        post_pending(P, W, false);        /* all slots busy: wait for the earliest */
        __nanosleep(100);
    }
}

/* thread 0: pop one dynamic task (FIFO per MoE layer); -1 when all queues are empty */
__device__ int dyn_pop(const MkParams &P, int *step_out, dtmk_u64 *ts_out) {
    for (int m = 0; m < (int)P.n_moe; ++m) {
        dtmk_u64 *head = (dtmk_u64 *)P.dyn_head + m;
        dtmk_u64 tail = ld_acquire((const dtmk_u64 *)P.dyn_tail + m);
        dtmk_u64 h = *(volatile dtmk_u64 *)head;
        while (h < tail) {
            dtmk_u64 prev = atomicCAS((unsigned long long *)head, h, h + 1);
            if (prev == h) {
                const dtmk_u64 *it = (const dtmk_u64 *)P.dyn_items + ((long)m * P.dyn_cap + h % P.dyn_cap) * 2;
                dtmk_u64 item = __ldcg(it);
                *ts_out = __ldcg(it + 1);
                *step_out = (int)(item >> 32);
                return (int)(dtmk_u32)item;
            }
            h = prev;
        }
    }
    return -1;
}

/* thread 0, router end: push the (expert, tile) tasks whose expert got a token
 * (ascending), signal the expert-done event for the others, fire their task:ready. */
__device__ __noinline__ void router_publish(const MkParams &P, Worker &W, int t, int step) {
    const int *r = trec(P, t);
    int mi = r[14], B = (int)P.batch, K = (int)P.top_k, E = (int)P.n_experts;
    const int *m = (const int *)P.moe + mi * 8;
    int base = m[2], et = m[3];
    __threadfence();                     /* the router's routing stores, made by other threads */
    dtmk_u64 tail = *(volatile dtmk_u64 *)((dtmk_u64 *)P.dyn_tail + mi);
    dtmk_u64 head = *(volatile dtmk_u64 *)((dtmk_u64 *)P.dyn_head + mi);
    dtmk_u64 *items = (dtmk_u64 *)P.dyn_items + (long)mi * P.dyn_cap * 2;
    const int *re = (const int *)P.route_expert + (long)mi * B * K;
    dtmk_u64 now = mk_now();
    int pushed = 0, skipped = 0;
    for (int e = 0; e < E; ++e) {
        int on = 0;
        for (int i = 0; i < B * K; ++i) on |= __ldcg(re + i) == e;
        if (!on) { skipped += et; continue; }
        for (int x = 0; x < et; ++x) {
            dtmk_u64 slot = (tail + pushed++) % P.dyn_cap;
            items[slot * 2] = ((dtmk_u64)step << 32) | (dtmk_u32)(base + e * et + x);
            items[slot * 2 + 1] = now;
        }
    }
    __threadfence();
    red_release_add((dtmk_u64 *)P.dyn_tail + mi, (dtmk_u64)pushed);
    if (skipped) red_release_add(counter(P, m[5]), (dtmk_u64)skipped);
    if (HOOKS_ANY(W, (1u << DTMK_HOOK_TASK_READY) | (1u << DTMK_HOOK_QUEUE_PRESSURE))) {
        dtmk_u64 depth0 = tail - head;   /* entries of this layer not yet popped before the push */
        for (int i = 0; i < pushed; ++i) {
            int dt = (int)(dtmk_u32)items[((tail + i) % P.dyn_cap) * 2];
            dtmk_u32 depth = (dtmk_u32)(depth0 + i + 1);
            if (HOOK_ON(W, DTMK_HOOK_TASK_READY))
                hook_event(P, W, DTMK_HOOK_TASK_READY, dt, step, HK_FAULTS, m[4], (dtmk_u64)(step + 1), 0, 0, depth);
            pressure(P, W, step, depth - 1, depth, dt);
        }
    }
}

/* whole CTA: run task t of `step` (its dependency is met).  plan: a static task of the
 * plan (task:ready, phantom fillers here; a dynamic task had them at the router).
 * Thread 0 computes the faults; the hook / trace values (t_disp, t_ready, dep_wait)
 * are Worker fields, so the call carries nothing hook-only.  Hook records of the task
 * are captured before the body (shared stores only) and built after its release signal. */
#ifndef DTMK_REC_LATE
/* record early (default; -DDTMK_REC_LATE = the session-2 path, run_task reads trec): wait_event
 * copies the waiting static task's record into shared memory BEFORE its acquire (the
 * acquire's CCTL.IVALL empties L1, so run_task's first record read was an L2 round trip on
 * every level's critical path, and the signal's r[8] after the body another one).  H200, 1b
 * batch 1: 1636.6 vs 1660.9 us/step (-1.5%), docs/dev/megakernel_speed.md "Session 3".
 * s_rec_t: whose record s_rec holds (-1 none; set by wait_event, cleared by run_task:
 * run_task never runs before the first wait_event). */
__shared__ __align__(16) int s_rec[TREC_WORDS];
__shared__ int s_rec_t;
#ifdef DTMK_PLAN_SMEM
/* -DDTMK_PLAN_SMEM=N (measurement, bench/megakernel.py variant plansmem): the worker's static
 * plan -- task ids and their records -- copied into shared memory at the launch's start (when
 * it has at most N tasks), so that the plan loop's head (plan[i], then r[6], r[7]) and
 * wait_event's record copy read shared memory instead of two dependent L2 round trips (every
 * acquire poll empties L1) on the path from a task's end to its successor's start */
__shared__ int s_plan_n;                /* tasks held (0: the plan is longer than N: global reads) */
__shared__ int s_plan_t[DTMK_PLAN_SMEM];
__shared__ __align__(16) int s_plan_rec[DTMK_PLAN_SMEM * TREC_WORDS];
__shared__ const int *s_plan_src;       /* thread 0: the record wait_event copies (0: trec) */
#endif
#endif
/* static task t's record: wait_event's shared copy when it holds t, else the global table */
__device__ __forceinline__ const int *task_rec(const MkParams &P, int t) {
#ifndef DTMK_REC_LATE
    return s_rec_t == t ? (const int *)s_rec : trec(P, t);
#else
    return trec(P, t);
#endif
}
/* thread 0's operands of the post-body path (the record pointer, the faults, t, step), kept in
 * shared memory across the body: held in registers, they went to the call's local-memory save
 * area and came back with LDL after run_body, the record pointer before each r[...] read (r[8]:
 * the release signal's event) -- and 512 threads' spills in the body evict that area from L1,
 * so a reload can be an L2 round trip on the signal's path.  H200, 1b batch 1 (session 20, as
 * -DDTMK_POST_SMEM, two runs): hook build 1194.8 -> 1166.6 and 1189.2 -> 1159.3 us/step, no-hook
 * build -0.2 / -0.6%, observer-SM plain 1199.5 -> 1173.6; bits equal (docs/results/megakernel.md
 * "Session 20").  Reading them (and r[0], r[8], r[14], t_end) from s_post by name after the body
 * as well -- no LDL left on the path -- was slower: hook build +1.3 / +1.4% in two side-by-side
 * runs, push window 0.51 vs 0.52 us (session 21: those reloads hit L1) */
struct PostOps { const int *r; TaskFaults f; int t, step; };
__shared__ PostOps s_post;
#ifdef DTMK_WK_ICODE
/* MEASUREMENT ONLY (session 34, plan 83): every worker's thread 0 runs ~DTMK_WK_ICODE * 12
 * instructions of fresh straight-line code after each task -- the workers' executed code grown
 * alike on every GPC.  Question: is the observers' GPC-mate slowdown the union of the workers'
 * and the observers' code in the GPC's L1.5 (then worker code alone makes harmless observer
 * code harmful), or the observers' own instruction cache overflowing?  (Plan 83 ran 51426d0's
 * copy: other shifts and multipliers, the same shape and size.) */
__device__ unsigned long long dtmk_wk_sink;
__device__ __noinline__ dtmk_u32 wk_icode(dtmk_u32 a) { return probe_icode<(DTMK_WK_ICODE), 0x5a5a5a5au>(a); }
#endif
#if OFF_COPY_BIT(1)
template <unsigned RCOPY>
#endif
__device__ __noinline__ void run_task(const MkParams &P, Worker &W, int t, int step, bool plan, float *smem) {
    const int *r = task_rec(P, t);
    TaskFaults f;
    if (threadIdx.x == 0) {
#if OFF_COPY_BIT(0) || OFF_COPY_BIT(1)
        s_obs_copy = W.observe;           /* the latch (read after this task, before the next wait) */
#endif
#ifndef DTMK_OSQ_NOPRE
        const dtmk_u32 obs = OBS_RUN(W);  /* the task's one "observing?" load */
#else
        const dtmk_u32 obs = 0;           /* measurement only (with NOPUSH): no stamp or hook bit before the body */
#endif
        f = task_faults(P, t, step, r);
        s_post.r = r; s_post.f = f; s_post.t = t; s_post.step = step;
#ifndef DTMK_NO_HOOKS
        dtmk_u32 pend = 0;
#endif
        if (plan) {
            if (obs | f.starve) {
                W.t_ready = mk_now();
#ifndef DTMK_NO_HOOKS
                /* task:ready, queue:pressure, comm:wait: captured (stamp t_ready, depth) */
                pend = HOOKS_ANY(W, HK_BIT(TASK_READY) | HK_BIT(QUEUE_PRESSURE) | HK_BIT(COMM_WAIT));
                W.pend_q = W.phantoms + 1;
#endif
            }
            if (W.phantoms) { mk_spin_ns((dtmk_u64)W.phantoms * P.filler_ns); W.phantoms = 0; }
        }
        if (f.starve) { dtmk_u64 due = W.t_ready + f.starve; while (mk_now() < due) __nanosleep(100); }
        dtmk_u64 *ws = wstate(P, W.worker);
        ws[WS_TASK] = t; ws[WS_STEP] = step; ws[WS_STATE] = 1;
        if (obs) {
            W.t_begin = mk_now();
#ifndef DTMK_NO_HOOKS
            /* task:dispatch / task:begin: captured (stamp t_begin); whose records they are */
            W.pend |= pend | HOOKS_ANY(W, HK_BIT(TASK_DISPATCH) | HK_BIT(TASK_BEGIN));
            W.pend_t = t; W.pend_step = step; W.pend_flags = f.flags;
#ifdef DTMK_DRAIN_POLL
            if (plan && W.t_seen) W.pend_flags |= DTMK_FLAG_OBS_DELAY;   /* task:ready at t_seen */
#endif
#endif
        }
    }
    MK_SYNC();
    run_body(P, W, t, step, smem, r);
    MK_SYNC();
    if (threadIdx.x == 0) {
#ifndef DTMK_REC_LATE
        s_rec_t = -1;                   /* every thread read s_rec before the barrier above */
#endif
        r = s_post.r; f = s_post.f; t = s_post.t; step = s_post.step;   /* (shared loads: the barrier) */
        if (f.slow) mk_spin_ns(f.slow);
        if (r[0] == 7) router_publish(P, W, t, step);
        dtmk_u64 t_end = mk_now();
#ifdef DTMK_OBS_SM
        DTMK_PROF_BEGIN(prof_post);    /* (counter 32: the observer-SM build's) */
#endif
        int sig = r[8];
        /* the task's hook records (captured ones, task:end, gen:advance) and the trace
         * record are built AFTER the release signal (off the successor's critical path;
         * their values were taken before it); only the epoch hold (OBS_PENDING <= step)
         * and the reads of what may change after the signal precede it */
#ifdef DTMK_OSQ_WSHADOW
        dtmk_u32 wsh_pend = 0;          /* (measurement only: the captured hooks, for the shadow after the signal) */
#endif
        if (HOOKS_ANY(W, RUN_CODE ? ~0u : 0u)) {
            DTMK_PROF_BEGIN(prof_h);
#ifndef DTMK_OSQ_NOHOLD
            if (HOLD_FULL()) hook_hold(P, W, t, (dtmk_u32)step, t_end);
            else hold_light(P, W, r[0], r[14], (dtmk_u32)step, t_end);   /* not with -DDTMK_HOLD_EAGER */
#endif
#ifdef DTMK_OBS_SM
#if defined(DTMK_OSQ_NOPUSH)
            /* measurement only (tools/obs_sm_probe.py): the capture without its entry */
#ifdef DTMK_OSQ_WSHADOW
            W.t_end = t_end; wsh_pend = W.pend | HOOKS_ANY(W, HK_BIT(TASK_END));
#endif
            W.pend = 0; W.pend_rg = 0;
#elif !defined(DTMK_OSQ_PEND_LATE) && !defined(DTMK_OSQ_LAZY_PUB)
            /* the entry's stores before the signal's MEMBAR, its head after the signal */
            if (W.pend) { osq_write_pend(P, W); W.osq_unpub = 1; }
#endif
#endif
            DTMK_PROF_END1(24, prof_h);
        }
        DTMK_PROF_BEGIN(prof_sig);
        if (r[0] == MK_CLS_ALLREDUCE) comm_post(P, W, t, step, f.late, f.flags);   /* to rank r[14] */
        else post_signal(P, W, sig, f.late);
#ifdef DTMK_OBS_SM
        DTMK_PROF_END1(34, prof_sig);
        DTMK_PROF_BEGIN(prof_push);
#ifndef DTMK_OSQ_PEND_LATE
        /* the unpublished entry -- this task's, stored before the signal, or with
         * -DDTMK_OSQ_LAZY_PUB the previous task's, stored after its own signal (long done:
         * this signal's MEMBAR waited for none of it); a deferred (late) or comm signal had
         * no MEMBAR here: fence */
        if (W.osq_unpub) {
            DTMK_PROF_BEGIN(prof_head);
            W.osq_unpub = 0; osq_publish(P, W, f.late != 0 || r[0] == MK_CLS_ALLREDUCE);
            DTMK_PROF_END1(48, prof_head);
        }
#ifdef DTMK_OSQ_LAZY_PUB
        /* this task's entry, published by the next signal (or the next wait's osq_raise,
         * another push, the worker's end: mk_observer.cuh).  This window costs ~0.4 us per
         * task with an entry, whatever its form: the head's scope or place (in the signal,
         * after the entry), W by name instead of generic loads, the stores by other lanes or
         * by warp 2 after a CTA-fenced hand-over (slower) -- sessions 20-22,
         * docs/dev/hook_cost_analysis.md */
#ifndef DTMK_OSQ_DEFER
        if (W.pend) { osq_write_pend(P, W); W.osq_unpub = 1; }
#else
        if (W.pend) osq_defer_stage(P, W);   /* (stored by the next wait whose first poll fails) */
#endif
#endif
#else
        /* measurement only: the entry's stores after the signal (off its MEMBAR), fenced */
        if (W.pend) { osq_write_pend(P, W); osq_publish(P, W, true); }
#endif
#ifdef DTMK_OSQ_WSHADOW
        if (wsh_pend) wsh_update(s_worker, r[0], wsh_pend);
#endif
        DTMK_PROF_END1(40, prof_push);
#endif
#ifdef DTMK_OBS_SM
        /* the captured records went to the observer: no call per task, only for gen:advance
         * (the argmax task, class 10) and the trace; the next task captures afresh */
        W.pend_rg = 0;
        if (OBS_RUN(W) && (W.trace_on || r[0] == 10)) hook_post(P, W, t, step, f.flags, t_end);
#elif defined(DTMK_OSQ_WSHADOW)
        /* measurement only (the shadow's comment): the captured hooks to the shadow, no record */
        if (OBS_RUN(W)) {
            W.t_end = t_end; W.pend |= HOOKS_ANY(W, HK_BIT(TASK_END));   /* (a plain capture: no record) */
            const dtmk_u32 p = W.pend;
            W.pend = 0; W.pend_rg = 0;
            if (p) wsh_update(W, r[0], p);
        }
#else
        if (OBS_RUN(W)) { DTMK_PROF_BEGIN(prof_c0); hook_post(P, W, t, step, f.flags, t_end); DTMK_PROF_END1(4, prof_c0); }
#endif
        DTMK_PROF_BEGIN(prof_tail);
        dtmk_u64 *ws = wstate(P, W.worker);
        ws[WS_DONE] = ++W.done; ws[WS_TS] = t_end;
        post_pending(P, W, false);
        DTMK_PROF_END1(42, prof_tail);
        DTMK_PROF_BEGIN(prof_refr);
        refresh_control(P, W, false);
        DTMK_PROF_END1(44, prof_refr);
#ifdef DTMK_OBS_SM
        DTMK_PROF_END1(32, prof_post);
#endif
#ifdef DTMK_WK_ICODE
        if (wk_icode((dtmk_u32)(t * 131 + step)) == 0x12345678u) dtmk_wk_sink = 1;   /* (measurement only) */
#endif
    }
#ifdef DTMK_EXTRA_SYNC
    MK_SYNC();
#endif
    /* no barrier here: the other threads next wait at wait_event's (or the spin loop's)
     * first barrier, behind thread 0's post-task work; they read nothing it writes */
}


#ifdef DTMK_WSTREAM
/* warp 1 of wait_event (whole warp): start the weight stream static task t's body will
 * consume (ws_task_desc), after any started stream that nobody consumed (ws_drop) */
__device__ __noinline__ void ws_prestart(const MkParams &P, int t) {
    const int *r = task_rec(P, t);
    WsDesc d;
#ifndef DTMK_WS_NEXT
    if (!ws_task_desc(P, r, d)) return;
    ws_drop();
    ws_start(d);
    if ((threadIdx.x & 31) == 0) ++ws_s.npre;
#else
    /* t's stream is usually live already (chained by the previous stream's end): then only
     * the slots it leaves free go to the next task's stream (ws_fill).  A t without a stream
     * (rope, attention, ...) leaves the ring to the next task's stream at once. */
    if (ws_task_desc(P, r, d)) {
        if (ws_s.live && ws_same(ws_s.d, d)) { ws_fill(); return; }
        ws_drop();
        ws_start(d);
    } else {
        if (!ws_s.nvalid) return;
        ws_drop();
        ws_start_next();
    }
    if ((threadIdx.x & 31) == 0) ++ws_s.npre;
#endif
}
#ifdef DTMK_WS_NEXT
/* warp 1 in the plan loop, before static task t's wait (the ring quiescent: the previous body
 * ended with a barrier, the next starts after wait_event's): tn is the worker's next static
 * task (-1: none); its stream, if any, follows t's in the ring (mk_ops.cuh "DTMK_WS_NEXT") */
__device__ __noinline__ void ws_next(const MkParams &P, int tn) {
    /* a next stream still pending here was never consumed (its task's body took the old path):
     * its issued stages are waited for before nd changes meaning (never in the plan order) */
    if (ws_s.nvalid) ws_drop();
    if ((threadIdx.x & 31) == 0)         /* ws_task_desc writes nd only when it returns true */
        ws_s.nvalid = tn >= 0 && ws_task_desc(P, trec(P, tn), ws_s.nd);
    __syncwarp();
}
#endif
#endif

/* whole CTA: wait until counter[e] >= target, running dynamic tasks meanwhile.  Fires
 * dep:wait / dep:release for static task t (t < 0: the end-of-run drain, no hooks).
 * Thread 0 leaves the dependency wait in W.dep_wait (ns) while observing; sets
 * W.aborted on abort / watchdog.  The observer drains only inside a wait that lasted. */
#if OFF_COPY_BIT(0)
template <unsigned WCOPY>
__device__ __forceinline__ void wait_event_body(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {
#else
__device__ __noinline__ void wait_event(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {
#endif
    __shared__ dtmk_u64 s_t0;
    if (threadIdx.x == 0) {
        DTMK_PROF_BEGIN(prof_look);
#ifndef DTMK_REC_LATE
        if (t >= 0) {                   /* before the acquire below (see s_rec) */
#ifndef DTMK_PLAN_SMEM
            const int4 *src = (const int4 *)trec(P, t);
#else
            const int4 *src = (const int4 *)(s_plan_src ? s_plan_src : trec(P, t));
            s_plan_src = 0;
#endif
#pragma unroll
            for (int k = 0; k < TREC_WORDS / 4; ++k) ((int4 *)s_rec)[k] = src[k];
        }
        s_rec_t = t;
#endif
        post_pending(P, W, false);
        W.dep_wait = 0;
#ifdef DTMK_DRAIN_POLL
        /* the drain poller's event, stored before the acquire: its CCTL.IVALL empties L1, and
         * stored after it `target` came back from its spill slot (kept across obs_first_look's
         * call) through L2 on every task's critical path (session 56; plan 150 measured no
         * change either way) */
        s_poll_ev = counter(P, e); s_poll_target = target;
#endif
        int rd = ev_ld_acquire(P, counter(P, e)) >= target;   /* system scope when ranks > 1 */
        W.ready = rd;
        DTMK_PROF_END1(46, prof_look);
#ifndef DTMK_NO_HOOKS
        /* after this first look (never before it): a ring that cannot take another
         * task's records, or new tables, is drained at once */
#if !defined(DTMK_OBS_SM) || defined(DTMK_OSQ_LOOK_CALL)
        if (WC_LOOK && OBS_WAIT(W)) rd |= obs_first_look(W, rd, (dtmk_u32)step);
#endif
#endif
        W.first = rd;
#ifdef DTMK_DRAIN_POLL
#ifdef DTMK_GATE_POLL
        /* ready at the first look: when a step gate's drain just before saw its event met
         * (s_seen), else, draining before the task, now; s_seen is 0 for the wait's own drains */
        const dtmk_u64 gate_seen = s_seen;
        s_seen = 0;
        W.t_seen = !(rd & 1) ? 0 : gate_seen ? gate_seen : (rd & 6) ? mk_now() : 0;
#else
        /* ready at the first look and draining before the task: it was ready now */
        W.t_seen = (rd & 1) && (rd & 6) ? mk_now() : 0;
#endif
        s_drain_busy = 1;
#endif
        if (!(rd & 1)) {
            dtmk_u64 *ws = wstate(P, W.worker);
            ws[WS_TASK] = t; ws[WS_STEP] = step; ws[WS_EVENT] = e; ws[WS_TARGET] = target; ws[WS_STATE] = 2;
            if (t >= 0 && WC_SPIN && HOOK_ON(W, DTMK_HOOK_DEP_WAIT))
                hook_event(P, W, DTMK_HOOK_DEP_WAIT, t, step, HK_FAULTS, e, target, 0);
            s_t0 = mk_now();
        }
    }
    MK_SYNC();
#if defined(DTMK_WSTREAM) && !defined(DTMK_WS_NOPRE)
    /* warp 1 starts the waiting task's weight stream (its first stages into shared memory)
     * while thread 0 polls: weights do not depend on the awaited event (mk_ops.cuh);
     * -DDTMK_WS_NOPRE: the body starts it (measures the ring without the early start) */
    if (t >= 0 && (threadIdx.x >> 5) == 1) ws_prestart(P, t);
#endif
    /* W.first is written only here: the next write is behind run_task's barriers, so
     * one barrier suffices (W.ready is the spin loop's) */
    const int first = W.first;
#ifndef DTMK_NO_HOOKS
    OBS_SYNC_WAIT_IF(WC_SYNC && (first & 6), !(first & 2), (dtmk_u32)step, !(first & 1));
#endif
    if (first & 1) return;
    dtmk_u64 t0 = s_t0, t_idle = t0, last_v = 0;
    unsigned it = 0;                     /* polls of this wait (thread 0): kept across drain chunks */
    for (;;) {
        /* thread 0 spins on the counter alone (one acquire load per poll); every 16th
         * poll it also posts due late signals, tries the dynamic queues and checks the
         * abort flag and the watchdog.  The CTA synchronizes only on an outcome. */
        if (threadIdx.x == 0) {
            W.dyn_task = -1;
            const bool sys = P.ranks > 1;   /* receive events are added to by peer GPUs */
            for (;;) {
                ++it;
#ifndef DTMK_POLL_FENCE
                /* acquire poll, no fence after it: bench/notify.py variant b, 928 vs 1168 ns
                 * per handoff (docs/dev/notify_latency.md); sys scope when ranks > 1 */
                dtmk_u64 v = ev_ld_acquire(P, counter(P, e));
#ifdef DTMK_OBS_PROF
                if (s_prof_drain) {
                    if (v >= target) { s_prof[6] += 1; s_prof[7] += (unsigned long long)s_prof_drain; }
                    s_prof_drain = 0;
                }
#endif
#if defined(DTMK_OBS_PROF) && defined(DTMK_OBS_SM)
                if (s_prof_raise) {        /* the raise just done delayed this poll */
                    if (v >= target) { s_prof[38] += 1; s_prof[39] += (unsigned long long)s_prof_raise; }
                    s_prof_raise = 0;
                }
#endif
                if (v >= target) { W.ready = 1; break; }
#else           /* the session-2 poll: relaxed loads, one fence.acq_rel once satisfied */
                dtmk_u64 v = ev_ld_relaxed(sys, counter(P, e));
                if (v >= target) { ev_fence_acquire(sys); W.ready = 1; break; }
#endif
#ifdef DTMK_OSQ_WSHADOW_DEFER
                if (s_wsh_nst) { wsh_apply_one(); continue; }   /* (measurement: one staged update per failed poll) */
#endif
#ifdef DTMK_OSQ_DEFER
                /* the poll failed: thread 0 waits anyway -- the staged entries to the queue
                 * now, then poll again at once.  -DDTMK_OSQ_DEFER_AFTER=K (measurement, session
                 * 54): only from the K-th failed poll on, so that a short wait -- a handoff met
                 * a poll or two later -- does not see its dependency late by a flush (~16
                 * stores and a fence); the raise at poll 16 flushes in any case.  OSQ_WAIT_FLUSH:
                 * the call (-DDTMK_OSQ_DEFER_INLINE: inline) */
#if defined(DTMK_OSQ_DEFER_AFTER) && (DTMK_OSQ_DEFER_AFTER) > 1
                if (s_osq_nst && it >= (unsigned)(DTMK_OSQ_DEFER_AFTER)) { OSQ_WAIT_FLUSH(P, W); continue; }
#else
                if (s_osq_nst) { OSQ_WAIT_FLUSH(P, W); continue; }
#endif
#endif
                if (it & 15) continue;
                post_pending(P, W, false);
                dtmk_u64 now = mk_now();
                if (v != last_v) { last_v = v; t_idle = now; }   /* the awaited event progressed */
#ifndef DTMK_NO_HOOKS
                /* drain one 32-record batch of the fullest sub-ring, re-poll 16 times, next
                 * batch: when a sub-ring is O.full_at full, or the wait is long (this one or
                 * the worker's previous one), or the lowest held epoch lags OBS_LAG steps
                 * (then all at once).  Short waits of a busy worker are left alone. */
#ifdef DTMK_OBS_SM
#ifndef DTMK_OSQ_NORAISE                /* (measurement only: epochs final at the launch's end alone) */
                if (OBS_WAIT(W)) {            /* workers drain nothing: OBS_PENDING up */
                    DTMK_PROF_BEGIN(prof_raise);
                    osq_raise(P, W, (dtmk_u32)step);   /* (a gate's wait, t < 0: step - 1, lower than needed) */
                    DTMK_PROF_END1(36, prof_raise);
#ifdef DTMK_OBS_PROF
                    s_prof_raise = clock64() - prof_raise;
#endif
                }
#endif
#else
                if (WC_SPIN && OBS_WAIT(W) && obs_spin_drain(W, now - t0, (dtmk_u32)step)) break;
#endif
#endif
                if (P.n_moe) {
                    dtmk_u64 ts;
                    W.dyn_task = dyn_pop(P, &W.dyn_step, &ts);
                    if (W.dyn_task >= 0) { s_t0 = ts; t_idle = now; break; }
                }
                const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
#ifndef DTMK_NO_HOOKS
                /* both control words loaded before either is tested (one L2 round trip) */
                const dtmk_u32 gen = O.tables ? ld_volatile_u32(ctl + CTL_GEN) : O.gen_seen;
                const dtmk_u32 abort_req = ld_volatile_u32(ctl + CTL_ABORT);
#ifndef DTMK_OBS_SM                   /* (workers of the observer SM take tables from its mask) */
                /* (the other copy of DTMK_OFF_COPY polls on: the next observing wait loads them) */
                if (gen != O.gen_seen) { O.reload = 1; obs_update(W); if (WC_SPIN) break; }
#endif
                if (ABORT_ASKED(abort_req)) W.aborted = 5;
#else
                if (ld_volatile_u32(ctl + CTL_ABORT)) W.aborted = 5;
#endif
                else if (W.wd_us && now - t_idle > (dtmk_u64)W.wd_us * 1000ull) {
                    atomicCAS((unsigned int *)ctl + CTL_ABORT_WORKER, 0xffffffffu, W.worker);
                    atomicExch((unsigned int *)ctl + CTL_ABORT, 2u);
                    W.aborted = 4;
                }
                if (W.aborted) {
                    dtmk_u64 *ws = wstate(P, W.worker);
                    ws[WS_VALUE] = v; ws[WS_STATE] = W.aborted; ws[WS_TS] = now;
                    __threadfence();
                    break;
                }
            }
#ifdef DTMK_DRAIN_POLL
            s_drain_busy = 1;            /* a drain may follow: its poller polls until warp 0 clears it */
#endif
        }
        MK_SYNC();
        int ready = W.ready, aborted = W.aborted, dt = W.dyn_task, ds = W.dyn_step;
        dtmk_u64 pushed_at = s_t0;
#ifndef DTMK_EXTRA_SYNC
        /* leaving: thread 0 writes none of these before run_task's first barrier */
        if (ready || aborted) break;
        MK_SYNC();                 /* everyone read W before thread 0 writes it again */
#else                              /* (the variant keeps session 6's barrier on the way out) */
        MK_SYNC();
        if (ready || aborted) break;
#endif
#ifndef DTMK_NO_HOOKS
        /* new tables published while waiting, or a long wait: one hook group, then re-poll */
        OBS_SYNC_WAIT_IF(dt < 0 && WC_SYNC && OBS_WAIT(W), O.maxc < O.must_at && !OBS_LAGGING(step), (dtmk_u32)step, true);
#endif
        if (dt >= 0) {
            dtmk_u64 saved_disp = 0;       /* the waiting static task's dispatch stamp */
            if (threadIdx.x == 0) {
                saved_disp = W.t_disp;
                W.t_ready = pushed_at;     /* task:dispatch wait and starve faults count from the push */
                if (WC_SPIN && OBS_WAIT(W)) { W.t_disp = mk_now(); W.dep_wait = 0; }
            }
            RUN_TASK_COPY(WAIT_CODE)(P, W, dt, ds, false, smem);
            if (threadIdx.x == 0) { W.t_disp = saved_disp; t_idle = mk_now(); }
        }
    }
    if (threadIdx.x == 0) {
        dtmk_u64 now = mk_now();
#ifdef DTMK_DRAIN_POLL
        /* the event seen met by the drain's poller (obs_sync_wait_cta), else at `now` */
        const dtmk_u64 seen = s_seen;
        s_seen = 0;
        W.t_seen = seen;
        const dtmk_u64 met = seen ? seen : now;
#else
        const dtmk_u64 met = now;
#endif
        if (!W.aborted) {
            wstate(P, W.worker)[WS_STATE] = 1;
            if (OSQ_WAIT_CAPTURE && WC_SPIN && OBS_WAIT(W)) {
                W.dep_wait = met - t0;
#if !defined(DTMK_OBS_SM) || defined(DTMK_OSQ_LOOK_CALL)
                W.long_wait = now - t0 >= OBS_LONG_WAIT_NS;   /* (obs_spin_drain's; the observer SM drains) */
#endif
#ifndef DTMK_NO_HOOKS
                /* dep:release: captured (stamp, wait in dep_wait), built after the task's
                 * release signal (hook_flush); nothing of the previous task is pending */
                if (t >= 0) { W.pend = HOOKS_ANY(W, HK_BIT(DEP_RELEASE)); W.ts_rel = met; }
#endif
            }
        }
    }
}
#if OFF_COPY_BIT(0)
/* the two copies as functions of their own names (session 59, plan 161), not one template's two
 * instantiations: the cubin orders functions by mangled name, so the observing copy -- cold while
 * nothing observes -- no longer sits in -DDTMK_HOT_FIRST's hot region beside the other */
#ifdef DTMK_COPY_IN_WAIT
__device__ __noinline__ void wait_event_obs(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem);
#endif
__device__ __noinline__ void wait_event_off(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {
#ifdef DTMK_COPY_IN_WAIT
    if (s_obs_copy) {                   /* (uniform: the latch) copy 1, from here: one call in the main loop */
        wait_event_obs(P, W, t, step, e, target, smem);
        return;
    }
#endif
    wait_event_body<0u>(P, W, t, step, e, target, smem);
}
__device__ __noinline__ void wait_event_obs(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {
    wait_event_body<1u>(P, W, t, step, e, target, smem);
}
#endif


/* thread 0: queue_saturation rows for this worker (layer < 0: at the step start; a
 * layer: when the worker reaches its first task of that layer) -> phantom entries */
__device__ void add_phantoms(const MkParams &P, Worker &W, int step, int layer) {
    const long long *F = (const long long *)P.faults;
    for (int i = 0; i < (int)P.n_faults; ++i) {
        const long long *r = F + i * 8;
        if (r[0] != F_SAT || r[5] != (long long)W.worker || step < r[3] || step > r[4]) continue;
        if ((layer < 0) != (r[2] < 0) || (layer >= 0 && r[2] != layer)) continue;
        dtmk_u32 d0 = W.phantoms;
        W.phantoms += (dtmk_u32)r[6];
        pressure(P, W, step, d0, W.phantoms, -1);
    }
}

/* ---- resident launches (P.resident): the step gate and the streaming hook ring -------
 * thread 0: publish what this worker stored for the host, which reads it with D2H copies
 * while the kernel runs: records first (system fence), then hook_head (records stored),
 * hook_drop (records refused by a full ring) and steps_done (all of this worker's records
 * of steps < fin are stored). */
__device__ __noinline__ void gate_publish(const MkParams &P, Worker &W, dtmk_u64 fin) {
#ifdef DTMK_OBS_SM
    /* the observer writes this worker's records: it publishes the head, the drops and the
     * steps finished once it has run every entry before this one (osq_run_entry) */
    uint4 *d = osq_slot(P, W);
    d[0] = make_uint4(OSQ_TAG_STEP, (dtmk_u32)fin, (dtmk_u32)(fin >> 32), 0u);
    osq_publish(P, W, true);
#else
    __threadfence_system();
    ((volatile dtmk_u64 *)P.hook_head)[W.worker] = W.hook_n;
    ((volatile dtmk_u64 *)P.hook_drop)[W.worker] = W.hook_drop;
    ((volatile dtmk_u64 *)P.steps_done)[W.worker] = fin;
#endif
}
/* thread 0: may `step` run?  0 granted, 1 not yet, 2 stop here (stop bit with the grant
 * at or below `step`, or a host abort).  Parking at the gate is not a dependency wait:
 * no watchdog runs here. */
__device__ __noinline__ int gate_look(const MkParams &P, Worker &W, int step) {
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    const dtmk_u32 g = ld_volatile_u32(ctl + CTL_GATE);
    if ((dtmk_u32)step < (g & GATE_STEPS)) return 0;
    if (g & GATE_STOP) return 2;
    if (ABORT_ASKED(ld_volatile_u32(ctl + CTL_ABORT))) { W.aborted = 5; return 2; }
    return 1;
}

#ifdef DTMK_SM_WORKER
/* ---- worker placement (-DDTMK_SM_WORKER) ---------------------------------------------
 * The hardware places block b on some SM, differently in each launch, and a worker's
 * static plan follows its block: the same build ran 1b's steps in discrete levels ~1.5%
 * apart from launch to launch (bench/paired.py, bench/placement.py, 2026-12-01).  With a
 * map in control[CTL_SM_MAP] the worker is the one mapped to the block's SM instead, so
 * each plan runs on the same SM in every launch (an address with bit 0 set instead
 * records each block's SM there: the hardware's placement, to find a fast one), and a
 * grid handoff's successor CTA knows whose plan ran on its SM.  One block per SM and
 * every block resident (persistent) make the map a permutation when it covers the SMs
 * the grid gets; a block on an SM outside it (-1) stops the launch (control[CTL_ABORT] =
 * 3), as does a successor grid without a map.  An observer-SM job's map names DTMK_OBS_SMS
 * SMs n_workers + m: their CTAs are the observers (-DDTMK_OBS_SM) or, in the lean grid,
 * leave at once (MK_IDLE) so that the hook grid's observer CTAs find the SMs free. */
__device__ __noinline__ void sm_worker(const MkParams &P, Worker &W) {
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    const dtmk_u64 map = (dtmk_u64)ctl[CTL_SM_MAP] | ((dtmk_u64)ctl[CTL_SM_MAP + 1] << 32);
    if (!map) {
#ifdef HO_RESUME
        if (P.handoff_in) { W.aborted = 3; atomicExch((unsigned int *)ctl + CTL_ABORT, 3u); }
#endif
        return;
    }
    if (map & 1) { ((int *)(map - 1))[blockIdx.x] = (int)W.sm; return; }   /* record the block order's placement */
    const int w = ((const int *)map)[W.sm];
#ifdef DTMK_SM_IDLE
    if (w == -2) { W.worker = 0; W.aborted = MK_IDLE_SM; return; }
#endif
#if DTMK_OBS_SMS == 1                   /* (one observer: the GPU-tested code of session 15, same PTX) */
    const bool observers_sm = w == (int)P.n_workers;
#else
    const bool observers_sm = w >= (int)P.n_workers && w < (int)P.n_workers + DTMK_OBS_SMS;
#endif
    if (observers_sm) {                /* an observer's SM (an observer-SM job's map) */
        W.worker = 0;
#ifdef DTMK_OBS_SM
        s_osq_obs = (dtmk_u32)(w - (int)P.n_workers) + 1u;   /* this CTA is observer w - n_workers */
#else
        W.aborted = MK_IDLE;           /* any other build (the lean grid): leave the SM free at once */
#endif
        return;
    }
    if (w < 0 || w >= (int)P.n_workers) { W.aborted = 3; atomicExch((unsigned int *)ctl + CTL_ABORT, 3u); return; }
    W.worker = (dtmk_u32)w;
#ifdef DTMK_OBS_SM
    s_osq_obs = 0;
#endif
}
#define MK_WID W.worker          /* the worker of this block's SM */
#else
#define MK_WID blockIdx.x
#endif

#ifdef HO_RESUME
/* thread 0 of a successor CTA, its worker set by the placement map (sm_worker): wait for
 * the row of the lean worker that ran on this SM to be final (its CTA has left the SM, so
 * it is being or has been written), then resume where it stopped.  The stop was in a
 * dependency wait's poll for (WS_EVENT, WS_TARGET): the task it waited for is the first
 * of its plan, in (step, index) order, that waits for that event and target (a later one
 * with the same pair was satisfied with it, an earlier one was); the end-of-run drain
 * waits for (step_event, last) and no task does.  WS_TASK / WS_STEP still name that task
 * unless a dynamic task ran during the wait, which also spent the worker's phantoms. */
__device__ __noinline__ void ho_resume(const MkParams &P, Worker &W) {
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    dtmk_u64 *ws = wstate(P, W.worker);
    dtmk_u64 st;
    while ((st = ld_acquire(ws + WS_STATE)) != 3 && st != WS_LEFT) {
        if (ABORT_ASKED(ld_volatile_u32(ctl + CTL_ABORT))) { W.aborted = 5; return; }
        __nanosleep(256);
    }
    const int last = (int)(P.step0 + P.n_steps);
    const int e = (int)ws[WS_EVENT];
    const dtmk_u64 target = ws[WS_TARGET];
    W.done = ws[WS_DONE];
    W.rs_step = last; W.rs_i = st == 3 ? -2 : -3;          /* finished / only the drain left */
    W.rs_phant = 0;
    if (st == WS_LEFT && !(e == (int)P.step_event && target == (dtmk_u64)last)) {
        const int *plan = (const int *)P.plan_tasks;
        const int p0 = ((const int *)P.plan_off)[W.worker], p1 = ((const int *)P.plan_off)[W.worker + 1];
        for (int i = p0; i < p1; ++i) {
            const int *r = trec(P, plan[i]);
            long long cs = -1;                                 /* the step at which it waits for (e, target) */
            if (r[6] >= 0) { if (r[6] == e && r[7] > 0 && target % (dtmk_u64)r[7] == 0) cs = (long long)(target / (dtmk_u64)r[7]) - 1; }
            else if (e == (int)P.step_event) cs = (long long)target;
            if (cs >= (long long)P.step0 && cs < last && (cs < W.rs_step || (cs == W.rs_step && i < W.rs_i))) {
                W.rs_step = (int)cs; W.rs_i = i;
            }
        }
        W.rs_phant = W.rs_i >= 0 && ws[WS_TASK] == (dtmk_u64)plan[W.rs_i] && ws[WS_STEP] == (dtmk_u64)W.rs_step;
    }
    dtmk_u64 *b = (dtmk_u64 *)P.handoff_in, *rec = b + 2 + (dtmk_u64)W.worker * HO_WORDS;
    rec[0] = W.rs_i == -2 ? ~0ull : (dtmk_u64)W.rs_step; rec[1] = (dtmk_u64)(dtmk_s64)W.rs_i;
    rec[2] = W.done; rec[3] = W.rs_phant; rec[12] = ws[WS_TS]; rec[13] = mk_now(); rec[14] = W.sm;
    if (W.rs_i >= 0) atomicAdd((unsigned long long *)b, 1ull);
    atomicAdd((unsigned long long *)b + 1, 1ull);
}
#define HO_FINISHED (W.rs_i == -2)
#else
#define HO_FINISHED false
#endif

extern "C" __global__ void MK_KERNEL_BOUNDS dtmk_megakernel(const dtmk_u64 *params) {
    __shared__ MkParams P;
#ifndef DTMK_OBS_SM
    __shared__ Worker W;
#else
    Worker &W = s_worker;              /* (file scope: osq_write_pend reads it as shared memory) */
#endif
    extern __shared__ float smem[];
    for (int i = threadIdx.x; i < (int)(sizeof(MkParams) / 8); i += blockDim.x) ((dtmk_u64 *)&P)[i] = params[i];
    if (threadIdx.x == 0) {
        dtmk_u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        W.worker = blockIdx.x; W.sm = sm; W.aborted = 0; W.since_refresh = 0; W.phantoms = 0; W.done = 0; W.long_wait = 0; W.pend_rg = 0;
#ifdef DTMK_DRAIN_POLL
        s_seen = 0; W.t_seen = 0;
#endif
#ifdef DTMK_OBS_SM
        s_osq_obs = blockIdx.x + DTMK_OBS_SMS >= gridDim.x ? blockIdx.x + DTMK_OBS_SMS + 1 - gridDim.x : 0u;   /* (-DDTMK_SM_WORKER: the map's say) */
        if (s_osq_obs) W.worker = 0;               /* (its observer-state row: 0's) */
        W.osq_head = W.osq_tail = 0; W.osq_unpub = 0;
#ifdef DTMK_OSQ_DEFER
        s_osq_nst = 0;
#endif
#endif
#ifdef DTMK_OSQ_WSHADOW
        wsh_zero();
#endif
        for (int i = 0; i < MK_PENDING; ++i) { W.pend_event[i] = -1; W.pend_due[i] = 0; }
        comm_init();
#ifdef DTMK_OBS_PROF
        for (int i = 0; i < PROF_N; ++i) s_prof[i] = 0;
        s_prof_drain = 0; s_prof_raise = 0;
#endif
#ifdef DTMK_PHASE_PROF
        for (int i = 0; i < PH_OPS * PH_N; ++i) s_ph[i] = 0;
        s_ph_op = -1;
#endif
#ifdef DTMK_SMEM_PAD
        ((volatile char *)dtmk_smem_pad)[0] = 0;     /* keep the padding allocated */
#endif
    }
#ifdef DTMK_SM_WORKER
    MK_SYNC();                     /* P is complete */
    if (threadIdx.x == 0) sm_worker(P, W);
#endif
#ifdef DTMK_SM_IDLE
    MK_SYNC();                     /* (sm_worker's verdict) */
    if (W.aborted == MK_IDLE_SM) return;   /* an idle SM: before obs_init touches worker 0's rows */
#endif
#ifndef DTMK_NO_HOOKS
    MK_SYNC();                     /* P is complete (thread 0 reads P.control below) */
#ifdef DTMK_OBS_SM
    if (!osq_is_observer()) {          /* (each observer warp clears its own Obs: osq_observer) */
#endif
    for (int i = threadIdx.x; i < (int)(sizeof(O.tabs) / 4); i += blockDim.x) ((dtmk_u32 *)O.tabs)[i] = 0;
    for (int i = threadIdx.x; i < OBS_NACC; i += blockDim.x) { O.accs[i].cov = 0; O.accs[i].eligible = 0; }
#ifdef DTMK_OBS_SM
    }
#endif
#ifdef HK_SITE_FORM
    for (int i = threadIdx.x; i < (int)DTMK_SH_N; i += blockDim.x) O.sh.e[i].map = 0;
    if (threadIdx.x == 0) O.inl_mask = 0;
#endif
#ifdef HK_LEAN
    for (int i = threadIdx.x; i < 2 * (int)DTMK_LEAN_CELLS; i += blockDim.x) (&O.lean[0][0])[i] = 0;
    if (threadIdx.x == 0) { O.lean_mask = 0; O.lean_ep[0] = O.lean_ep[1] = ~0u; }
#endif
    if (threadIdx.x == 0) {
#ifdef HO_RESUME
        W.rs_step = (int)P.step0; W.rs_i = -1; W.rs_phant = 0;
        if (P.handoff_in && !W.aborted && !HO_OBSERVER) ho_resume(P, W);   /* before anything indexed by the worker */
#endif
        obs_init(P, W);
#ifdef DTMK_OBS_SM
        if (!osq_is_observer()) O.reload = 0;   /* workers load no tables */
#endif
        W.pend = 0;
    }
#endif
    MK_SYNC();
#ifdef DTMK_SM_WORKER
    if (W.aborted == MK_IDLE) return;  /* the observer's SM in a build without an observer */
#endif
#ifdef DTMK_OBS_SM
    if (osq_is_observer()) {           /* the observer SM: its loop instead of a plan */
        osq_observer(P);
#ifdef DTMK_OBS_PROF
        if (threadIdx.x == 0) for (int i = 0; i < PROF_N; ++i) atomicAdd(&dtmk_obs_prof[i], s_prof[i]);   /* (warp 0's) */
#endif
        return;
    }
#endif
#ifdef DTMK_WSTREAM
    if (threadIdx.x == 0) ws_init(P, smem);      /* the weight ring after xs (P complete) */
#endif
    if (threadIdx.x == 0) {
        W.hook_n = ((const dtmk_u64 *)P.hook_head)[MK_WID];
        W.hook_slot = P.hook_cap ? W.hook_n % P.hook_cap : 0;
        W.trace_n = ((const dtmk_u64 *)P.trace_head)[MK_WID];
        W.hook_tail = P.hook_tail ? *((const volatile dtmk_u64 *)P.hook_tail + MK_WID) : 0;
        W.hook_drop = P.hook_drop ? ((const dtmk_u64 *)P.hook_drop)[MK_WID] : 0;
        W.gate = 0;
#ifdef DTMK_OBS_SM
        W.osq_area = osq_w(P, W.worker);   /* (after sm_worker's placement: the worker index is final) */
        /* the observer's first tables in (their hook mask), or the first tasks go uncaptured */
        if (O.tables) while (!(osq_ld(osq_mine(P, W) + OSQ_W_MASK) >> 32)) __nanosleep(256);
#endif
        refresh_control(P, W, true);
    }
    MK_SYNC();
#ifndef DTMK_NO_HOOKS
    OBS_SYNC_IF(O.reload, false, 0u);
    MK_SYNC();
#endif
    const int *plan = (const int *)P.plan_tasks;
    int p0 = ((const int *)P.plan_off)[MK_WID], p1 = ((const int *)P.plan_off)[MK_WID + 1];
    int last = (int)(P.step0 + P.n_steps);
    int step = (int)P.step0, i_first = -1;     /* i_first >= 0: resume mid-plan (grid handoff) */
#ifdef DTMK_PLAN_SMEM
    {
        const int n = p1 - p0 <= DTMK_PLAN_SMEM ? p1 - p0 : 0;
        for (int k = threadIdx.x; k < n; k += blockDim.x) s_plan_t[k] = plan[p0 + k];
        for (int k = threadIdx.x; k < n * TREC_WORDS; k += blockDim.x)
            s_plan_rec[k] = trec(P, plan[p0 + k / TREC_WORDS])[k % TREC_WORDS];
        if (threadIdx.x == 0) { s_plan_n = n; s_plan_src = 0; }
        MK_SYNC();
    }
#endif
#ifdef HO_RESUME
    step = W.rs_step; i_first = W.rs_i;
#endif
    for (; step < last && !W.aborted; ++step) {
        /* a resumed step's gate and step-start phantoms were its predecessor's */
        if (P.resident && i_first < 0) {
            /* the step gate: publish (steps < min(step, completed steps) are whole for
             * this worker: a dynamic task of a completed step can no longer be taken),
             * then run, park or stop.  Hooks of this step are stamped after it opened.
             * The first barrier: every thread is done reading W.gate / W.aborted of the
             * previous step (a worker with an empty plan has no barrier in between). */
            MK_SYNC();
            if (threadIdx.x == 0) {
                const dtmk_u64 v = ev_ld_acquire(P, counter(P, (int)P.step_event));
                gate_publish(P, W, v < (dtmk_u64)step ? v : (dtmk_u64)step);
                W.gate = gate_look(P, W, step);
                /* granted: pick up what the host wrote before granting this step (a query
                 * attached with first_epoch = this step: its tables and generation were
                 * written before the grant), so it counts from this step's first event
                 * without the kernel ever parking for an attach; a few loads per step */
                if (W.gate == 0) refresh_control(P, W, true);
#ifdef DTMK_GATE_POLL
                if (W.gate == 0 && O.reload) s_drain_busy = 1;   /* the gate drain's poller: obs_sync_cta */
#endif
            }
            MK_SYNC();
#ifndef DTMK_NO_HOOKS
            if (W.gate == 0 && O.reload) {     /* uniform: every thread reads O.reload after the barrier */
                /* ... if due by this step (OBS_AT_GATE: obs_sync reads control[CTL_GEN_DUE]) */
                OBS_SYNC_IF(true, false, (dtmk_u32)step | OBS_AT_GATE);
                MK_SYNC();
            }
#endif
            if (W.gate == 1) {
                /* not granted yet: first finish the previous step everywhere (its dynamic
                 * tasks: a parked worker takes none), so that all of it is published */
                WAIT_EVENT_COPY(1u)(P, W, -1, step - 1, (int)P.step_event, (dtmk_u64)step, smem);
#ifndef DTMK_NO_HOOKS
                OBS_SYNC_IF(O.tables && !W.aborted, false, (dtmk_u32)step);   /* device VM: epochs < step flushed */
#endif
                if (threadIdx.x == 0) {
                    if (!W.aborted) {
                        gate_publish(P, W, (dtmk_u64)step);
                        /* deferred (late) signals still fall due while parked: a peer rank
                         * may need one to finish the step this rank has finished */
                        while ((W.gate = gate_look(P, W, step)) == 1) {
                            post_pending(P, W, false);
#ifdef DTMK_OBS_SM
                            if (W.observe) osq_raise(P, W, (dtmk_u32)step);   /* parked: epochs < step become final */
#endif
                            __nanosleep(2000);
                        }
                        /* what the host wrote while the kernel was parked (hook mask, device-VM
                         * tables: a query attached at this step boundary) holds from this step */
                        if (W.gate == 0) refresh_control(P, W, true);
                    } else {
                        W.gate = 2;
                    }
                }
                MK_SYNC();
#ifndef DTMK_NO_HOOKS
                OBS_SYNC_IF(W.gate == 0 && O.reload, false, (dtmk_u32)step);
                MK_SYNC();
#endif
            }
            if (W.gate == 2 || W.aborted) { last = step; break; }
            if (threadIdx.x == 0)       /* the host's tail only grows: a stale one is conservative */
                W.hook_tail = *((const volatile dtmk_u64 *)P.hook_tail + W.worker);
        }
        /* a resumed step's step-start phantoms: re-added if its worker left them unspent
         * (it left at the step's first task, with no dynamic task run while waiting) */
#ifdef HO_RESUME
        if (threadIdx.x == 0 && P.n_faults && (i_first < 0 || (i_first == p0 && W.rs_phant))) add_phantoms(P, W, step, -1);
#else
        if (threadIdx.x == 0 && P.n_faults && i_first < 0) add_phantoms(P, W, step, -1);
#endif
        for (int i = i_first >= 0 ? i_first : p0; i < p1 && !W.aborted; ++i) {
#ifndef DTMK_PLAN_SMEM
            int t = plan[i];
            const int *r = trec(P, t);
#else
            const bool in_sm = s_plan_n > 0;   /* (uniform) */
            int t = in_sm ? s_plan_t[i - p0] : plan[i];
            const int *r = in_sm ? s_plan_rec + (i - p0) * TREC_WORDS : trec(P, t);
            if (threadIdx.x == 0) s_plan_src = in_sm ? r : 0;
#endif
            /* no barrier here: t_disp is thread 0's (trace only), W.aborted was last
             * written before wait_event's / run_task's final barrier */
            if (threadIdx.x == 0) {
                if (OBS_MAIN(W)) W.t_disp = mk_now();
#ifdef HO_RESUME
                /* a resumed task's layer phantoms: re-added unless a dynamic task spent them */
                if (P.n_faults && (r[15] & 1) && (i != i_first || W.rs_phant)) add_phantoms(P, W, step, r[1]);
#else
                if (P.n_faults && (r[15] & 1)) add_phantoms(P, W, step, r[1]);
#endif
                if (P.prefetch) prefetch_task_weights(P, t);
            }
            int e = r[6];
            dtmk_u64 target = e >= 0 ? (dtmk_u64)r[7] * (dtmk_u64)(step + 1) : (dtmk_u64)step;
            if (e < 0) e = (int)P.step_event;
#ifdef DTMK_WS_NEXT
            /* the worker's next static task (the next step's first one within a launch; not
             * across a resident step gate) streams after t: mk_ops.cuh "DTMK_WS_NEXT" */
            if ((threadIdx.x >> 5) == 1)
                ws_next(P, i + 1 < p1 ? plan[i + 1] : (!P.resident && step + 1 < last ? plan[p0] : -1));
#endif
#if defined(DTMK_COPY_IN_WAIT)
            wait_event_off(P, W, t, step, e, target, smem);   /* (it calls copy 1 when the latch says) */
            if (W.aborted) break;
            run_task(P, W, t, step, true, smem);
#elif OFF_COPY_BIT(0) || OFF_COPY_BIT(1)
            if (s_obs_copy) {              /* (uniform: the latch) */
                WAIT_EVENT_COPY(1u)(P, W, t, step, e, target, smem);
                if (W.aborted) break;
                RUN_TASK_COPY(1u)(P, W, t, step, true, smem);
            } else {
                WAIT_EVENT_COPY(0u)(P, W, t, step, e, target, smem);
                if (W.aborted) break;
                RUN_TASK_COPY(0u)(P, W, t, step, true, smem);
            }
#else
            wait_event(P, W, t, step, e, target, smem);
            if (W.aborted) break;
            run_task(P, W, t, step, true, smem);
#endif
        }
        i_first = -1;
    }
    /* drain: keep taking dynamic tasks until the last step is done everywhere */
    if (!W.aborted && !HO_FINISHED) WAIT_EVENT_COPY(1u)(P, W, -1, last - 1, (int)P.step_event, (dtmk_u64)last, smem);
#if !defined(DTMK_OBS_SM) && !defined(DTMK_NO_HOOKS)
    if (O.tables) {
        OBS_SYNC_IF(true, false, ~0u);   /* last drain: every record counted, coverage flushed */
        if (threadIdx.x == 0) { __threadfence(); *(volatile dtmk_u64 *)(obs_state(W) + OBS_DONE) = 1; }
    }
#endif
#ifdef DTMK_WSTREAM
    if ((threadIdx.x >> 5) == 0) ws_drop();      /* a stream started for a task that never ran (abort) */
    if (threadIdx.x == 0) {
        atomicAdd(&dtmk_ws_stats[0], (unsigned long long)ws_s.seq);
        atomicAdd(&dtmk_ws_stats[1], (unsigned long long)ws_s.npre);
        atomicAdd(&dtmk_ws_stats[2], (unsigned long long)ws_s.nmiss);
#ifdef DTMK_WS_NEXT
        atomicAdd(&dtmk_ws_next_stats[0], (unsigned long long)ws_s.nchain);
        atomicAdd(&dtmk_ws_next_stats[1], (unsigned long long)ws_s.nearly);
#endif
    }
#endif
    if (threadIdx.x == 0) {
#ifdef DTMK_OBS_PROF
        for (int i = 0; i < PROF_N; ++i) atomicAdd(&dtmk_obs_prof[i], s_prof[i]);
#endif
#ifdef DTMK_PHASE_PROF
        for (int i = 0; i < PH_OPS * PH_N; ++i) atomicAdd(&dtmk_phase_prof[i], s_ph[i]);
#endif
        post_pending(P, W, true);     /* (a worker leaving for a handoff: up to a late signal's delay early) */
#ifndef DTMK_OBS_SM                   /* (the observer writes the host rings' heads) */
        ((dtmk_u64 *)P.hook_head)[MK_WID] = W.hook_n;
#endif
        ((dtmk_u64 *)P.trace_head)[MK_WID] = W.trace_n;
#ifndef DTMK_OBS_SM
        if (P.hook_drop) ((dtmk_u64 *)P.hook_drop)[MK_WID] = W.hook_drop;
#endif
        /* (a leaving worker's step is not whole; a finished one's successor has nothing to add) */
        const bool ends_here = !W.aborted && !HO_FINISHED;
        if (P.resident && ends_here) gate_publish(P, W, (dtmk_u64)last);   /* every step < last is whole */
#ifdef DTMK_OSQ_WSHADOW
        wsh_flush();
#endif
#ifdef DTMK_OBS_SM
        OSQ_DEFER_FLUSH(P, W);          /* (-DDTMK_OSQ_DEFER: the staged entries) */
        osq_flush_unpub(P, W);          /* (-DDTMK_OSQ_LAZY_PUB: the last task's entry) */
        __threadfence();                /* no more entries (the last gate's too): the observer may end */
        *(volatile dtmk_u64 *)(osq_mine(P, W) + OSQ_W_DONE) = 1;
#endif
        dtmk_u64 *ws = wstate(P, W.worker);
#ifdef DTMK_SM_WORKER
        /* the row's last word, behind a fence (the heads above included): a grid handoff's
         * successor on this SM resumes from the row once it reads 3 or WS_LEFT */
        const bool leaving = W.aborted == 5 && ld_volatile_u32((const dtmk_u32 *)P.control + CTL_ABORT) == ABORT_LEAVE;
        if (ends_here || leaving) __threadfence();
        if (leaving) ws[WS_STATE] = WS_LEFT;
#endif
        if (ends_here) ws[WS_STATE] = 3;
    }
}

#ifdef DTMK_REC_FAST
/* the hook code's view of wait_event's record copy (declared before the hooks, see hk_trec) */
__device__ __forceinline__ int hk_srec_t() { return s_rec_t; }
__device__ __forceinline__ const int *hk_srec() { return (const int *)s_rec; }
#endif
