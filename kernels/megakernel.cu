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
 *           (the "observer" section below; -DDTMK_COMPILED_TIER: through
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
 * (hk_inline, thread 0), [30, 31] the shadow's flush in obs_sync (lane 0) */
#define PROF_N 32
extern "C" __device__ unsigned long long dtmk_obs_prof[PROF_N];
__device__ unsigned long long dtmk_obs_prof[PROF_N];
__shared__ unsigned long long s_prof[PROF_N];
__shared__ long long s_prof_drain;      /* cycles of the drain just done (thread 0), 0 = none */
/* a counter pair: DTMK_PROF_BEGIN(t) ... DTMK_PROF_END1(k, t) (the calling thread) or
 * DTMK_PROF_END(k, t) (lane 0 of warp 0 only); empty without DTMK_OBS_PROF (bpf_maps.cuh) */
#define DTMK_PROF_BEGIN(name) const long long name = clock64()
#define DTMK_PROF_END(k, name) do { if ((threadIdx.x & 31) == 0 && threadIdx.x < 32) { s_prof[k] += 1; \
    s_prof[(k) + 1] += (unsigned long long)(clock64() - (name)); } } while (0)
#define DTMK_PROF_END1(k, name) do { s_prof[k] += 1; s_prof[(k) + 1] += (unsigned long long)(clock64() - (name)); } while (0)
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
#if !defined(DTMK_NO_HOOKS) && (defined(DTMK_SITE_FORM) || defined(DTMK_COMPILED_TIER))
/* The site form: hook slots flagged DTMK_PROG_F_INLINE run at the site (aggregation
 * descriptors; compiled inline programs) with their updates in the shadow.  In the
 * compiled tier's linked kernels, and with -DDTMK_SITE_FORM (bench variant siteform).
 * Not in the default hook build: measured on 1b (docs/results/hooks.md "Session 10") it
 * cost the off path ~3.5 points (+6.1% vs +2.4% over no hooks, same run) while the hot
 * summary from descriptors (+36.9%) was no faster in us per step than the VM summary of
 * the build without it; without it every slot takes records through the ring and the VM */
#define HK_SITE_FORM
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
#define CTL_SM_MAP 18     /* u64 (words 18, 19), -DDTMK_SM_WORKER: device address of int32 map[smid] ->
                            * worker (0 = worker = blockIdx.x): which SM runs which plan, fixed
                            * across launches; bit 0 set: int32 out[block] <- its SM ("worker
                            * placement" below) */
#define CTL_WORDS 32

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
#define OBS_LAG 4          /* ... or when the lowest epoch held is this many steps behind (bounded lag) */
#define OBS_NACC (DTMK_NUM_HOOKS * DTMK_MAX_PROGS)   /* coverage accumulators: one per (hook, slot) */
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
#endif
};

__device__ __forceinline__ const int *trec(const MkParams &P, int t) { return (const int *)P.tasks + t * TREC_WORDS; }

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

/* ---- observer: the device VM at the hook sites ---------------------------------------- *
 * Per CTA in shared memory: copies of the hook tables (refreshed when the host bumps
 * control[CTL_GEN], checked with the other control words every `refresh` tasks and
 * every 16 polls of a dependency wait), a ring of OBS_RING contexts that thread 0
 * appends to at the hook sites (split evenly into one sub-ring per hook with VM
 * programs, obs_layout), the VM's register file and coverage accumulators.
 * Warp 0 drains through DTMK_RUN_RECORDS, one sub-ring at a time in 32-record VM calls
 * back to back (round 4: drains rare and large).  When: a wait that is not ready at its
 * first look, or its 16-poll spin check, finds a sub-ring O.full_at (<= 3/4) full: one
 * batch of the fullest sub-ring per 16 polls; a long wait (this one or the worker's
 * previous one lasted OBS_LONG_WAIT_NS): everything, one batch per 16 polls, starting
 * after OBS_EARLY_POLLS polls; the lowest held epoch OBS_LAG steps behind (not ready):
 * everything at once, so epochs finalise with a bounded lag; a first look (ready or
 * not) that finds a sub-ring O.must_at full (room for one task's records): everything;
 * before any table reload (records are run under the tables they were taken with) and
 * at kernel end.  Never before the first poll of a wait, never after a task.
 * Coverage is counted in one accumulator per (hook, slot); an emptied ring flushes those of epochs before the
 * worker's current step (a reload or the last drain: all) and publishes OBS_PENDING =
 * the lowest epoch still held (a record or an accumulator), so the host knows which
 * epochs are final.  A hook with no program keeps its enable bit clear. */
#ifndef DTMK_NO_HOOKS
struct __align__(16) Obs {
    struct dtmk_hook_table tabs[DTMK_NUM_HOOKS];
    struct dtmk_hook_table scratch;
    struct dtmk_ctx ring[OBS_RING];
    dtmk_u32 cnt[DTMK_NUM_HOOKS], base[DTMK_NUM_HOOKS];   /* per hook: records held, first ring index */
    dtmk_u32 cap, full_at, must_at, maxc;   /* sub-ring size; drain thresholds; max(cnt) */
    dtmk_u64 regs[DTMK_VM_NREGS * 32];
    struct dtmk_cov_acc accs[OBS_NACC];     /* per (hook, slot): a drain never flushes mid-way */
    dtmk_u64 tables, state;
    dtmk_u64 drained, drains;               /* mirrors of OBS_DRAINED / OBS_DRAINS (stored, never re-read) */
    dtmk_u32 n, gen_seen, reload, vm_mask, ring_mask, min_step;
    dtmk_u32 acc_min;                       /* lowest epoch held unflushed in accs; ~0 = none */
#ifndef DTMK_HOLD_EAGER
    /* the lazy hold (default since session 9; -DDTMK_HOLD_EAGER: always the full hook_hold;
     * docs/dev/hook_cost_analysis.md sessions 8-9): 1 when a loaded program reads request_gen
     * (context word 13, the tables' ctx_reads) or comm:wait is observed: only then does
     * hook_hold's pre-signal work run */
    dtmk_u32 hold_full;
#endif
    /* the site form (HK_SITE_FORM, kernels/bpf_inline.cuh): hooks with a slot flagged
     * DTMK_PROG_F_INLINE (a compiled program of the compiled tier, or descriptors:
     * DTMK_PROG_F_DESC) run it at the site (hk_inline), its map updates held in the shadow
     * until obs_sync's epoch flush (before the accumulators'); vm_mask then names only
     * hooks with slots that take records.  desc: every loaded descriptor program, copied
     * at table load (the site reads only these); gdesc: where each came from */
#ifdef HK_SITE_FORM
    dtmk_u32 inl_mask;
    struct dtmk_shadow sh;
    struct dtmk_desc desc[DTMK_OBS_DESC];
    dtmk_u64 gdesc[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];   /* each slot's descriptors in global memory */
#endif
    dtmk_u32 pub;                           /* the value last stored in OBS_PENDING (~0 = none) */
    dtmk_u64 pubs;                          /* epoch publishes (high half of OBS_DRAINS) */
    dtmk_u32 first_seen;                    /* OBS_FIRST_TS already set under this generation */
#ifdef DTMK_REC_FAST
    int rec_t;                              /* s_rec_t at the last observing first look (a static task or -1) */
#endif
#ifdef DTMK_VM_CODE_SMEM
    /* -DDTMK_VM_CODE_SMEM (variant, not measured yet; docs/dev/hook_cost_analysis.md
     * "Session 5"): the VM programs' code (+ the padding record the VM prefetches) copied
     * here at table load while it fits, so a drain fetches no instruction from global
     * memory (a null program measured 1.9 us per run, mostly such dependent trips).
     * gcode: each slot's code in global memory (the tables' insns then point here) */
    struct dtmk_dinsn code[DTMK_OBS_CODE];
    dtmk_u64 gcode[DTMK_NUM_HOOKS][DTMK_MAX_PROGS];
#endif
};
__shared__ Obs O;
#define HOOK_ON(W, h) ((W).hook_mask & (1u << (h)))
#define HOOKS_ANY(W, m) ((W).hook_mask & (m))
#else
#define HOOK_ON(W, h) 0
#define HOOKS_ANY(W, m) 0
#endif
#ifdef DTMK_SMEM_PAD   /* bench/hooks.py "nohooks_pad": the no-hooks code with the default build's static
                        * shared memory, to split the off cost into smem vs code; in any build, to move
                        * it into a larger shared-memory carveout (less L1) and measure what that costs */
__shared__ __align__(16) char dtmk_smem_pad[DTMK_SMEM_PAD];
#endif

/* ---- hooks ------------------------------------------------------------------------- */
#ifdef DTMK_LINKED_MONITOR
extern "C" __device__ void dtmk_monitor(const struct dtmk_ctx *ctx);  /* linked LTO-IR tier */
#endif

/* A record in registers: the 128-byte dtmk_ctx as 8 x 16 bytes (the field offsets are
 * pinned by dtrace_mk_abi.h's static_asserts).  hk_store writes it with 16-byte stores
 * straight into the observer's shared ring and / or the global ring: no local struct. */
struct HkRec { uint4 v[DTMK_CTX_SIZE / 16]; };

#if defined(DTMK_REC_FAST) && !defined(DTMK_NO_HOOKS)
__device__ __forceinline__ int hk_srec_t();           /* s_rec_t / s_rec (declared with run_task; */
__device__ __forceinline__ const int *hk_srec();      /* defined at the end of this file) */
/* hook_hold / hook_flush / hook_post only (t: the task running or just ended): task t's
 * record.  The shared copy when the last observing first look was t's wait (O.rec_t holds
 * only static tasks: a dynamic t never matches) and no wait_event has copied another record
 * since (run_task cleared s_rec_t to -1 after its body; a later wait_event sets it >= 0);
 * else the global table */
__device__ __forceinline__ const int *hk_trec(const MkParams &P, int t) {
    return O.rec_t == t && hk_srec_t() < 0 ? hk_srec() : trec(P, t);
}
#else
#define hk_trec trec
#endif

/* the task fields of a record (ctx_task of ABI v1): t >= 0 task t, else none */
struct HkTask { dtmk_u32 cls, index, tile_lo, tile_hi, slot, rg, layer, expert; };

/* thread 0, cold: task t's fields; rg bit 32 set: its request_gen (captured before the
 * release signal), else read now */
__device__ __forceinline__ HkTask hk_task(const MkParams &P, int t, dtmk_u64 rg) {
    HkTask k;
    if (t < 0) {
        k.cls = k.index = k.slot = k.rg = k.layer = k.expert = DTMK_NONE_U32; k.tile_lo = k.tile_hi = 0;
        return k;
    }
    const int *r = trec(P, t);
    const int slot = r[3];
    k.cls = (dtmk_u32)r[0]; k.index = (dtmk_u32)t; k.tile_lo = (dtmk_u32)r[10]; k.tile_hi = (dtmk_u32)r[11];
    k.slot = (dtmk_u32)slot;
    k.rg = (rg >> 32) ? (dtmk_u32)rg : slot >= 0 ? (dtmk_u32)__ldcg((const int *)P.req_gen + slot) : DTMK_NONE_U32;
    k.layer = (dtmk_u32)r[1]; k.expert = (dtmk_u32)r[2];
    return k;
}

__device__ __forceinline__ void hk_rec(HkRec &c, const MkParams &P, const Worker &W, dtmk_u32 hook, dtmk_u64 ts,
                                       const HkTask &k, dtmk_u32 step, dtmk_u32 event, dtmk_u64 event_gen,
                                       dtmk_u64 wait_ns, dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op,
                                       dtmk_u32 comm_gen, dtmk_u32 peer_rank, dtmk_u32 flags) {
    c.v[0] = make_uint4(DTMK_ABI_VERSION, hook, (dtmk_u32)ts, (dtmk_u32)(ts >> 32));            /* +0 */
    c.v[1] = make_uint4((dtmk_u32)P.rank, W.sm, W.worker, k.cls);                               /* +16 */
    c.v[2] = make_uint4(k.index, step, k.tile_lo, k.tile_hi);                                   /* +32 task_gen */
    c.v[3] = make_uint4(k.slot, k.rg, step, k.layer);                                           /* +48 decode_step */
    c.v[4] = make_uint4(k.expert, event, (dtmk_u32)event_gen, (dtmk_u32)(event_gen >> 32));    /* +64 */
    c.v[5] = make_uint4(comm_op, comm_gen, peer_rank, queue_depth);                             /* +80 */
    c.v[6] = make_uint4((dtmk_u32)dur_ns, (dtmk_u32)(dur_ns >> 32), (dtmk_u32)wait_ns, (dtmk_u32)(wait_ns >> 32));
    c.v[7] = make_uint4(flags, 0u, 0u, 0u);                                                     /* +112 */
}

/* The hook site: thread 0, after the caller checked the mask bit. */
#ifndef DTMK_NO_HOOKS
__device__ __forceinline__ dtmk_u64 *obs_state(const Worker &W) { return (dtmk_u64 *)O.state + W.worker * OBS_WORDS; }

/* thread 0: a record the full ring cannot take is counted lost for every program of its hook */
__device__ __noinline__ void obs_lost(const Worker &W, dtmk_u32 hook, dtmk_u32 step) {
    const struct dtmk_hook_table &T = O.tabs[hook];
    for (dtmk_u32 k = 0; k < T.n_progs; ++k)
        dtmk_cov_row_add((struct dtmk_cov *)T.progs[k].cov, step, T.gen >> 1, 1, 0, 0, 1, 0);
    obs_state(W)[OBS_LOST] += 1;
}

/* thread 0: W.observe after any change of hook_mask, trace_on or O.reload */
__device__ __forceinline__ void obs_update(Worker &W) { W.observe = W.hook_mask | W.trace_on | O.reload; }

/* hooks whose device programs want this worker's records: through the ring (vm_mask) or,
 * in a site-form build, at the site (inl_mask) */
__device__ __forceinline__ dtmk_u32 obs_prog_hooks() {
#ifdef HK_SITE_FORM
    return O.vm_mask | O.inl_mask;
#else
    return O.vm_mask;
#endif
}


/* warp 0: move ring record `lane` (valid) to index `dst`; every lane reads before any writes */
__device__ __forceinline__ void obs_move(bool valid, dtmk_u32 src, dtmk_u32 dst) {
    uint4 v[DTMK_CTX_SIZE / 16];
    if (valid) {
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) v[i] = ((const uint4 *)&O.ring[src])[i];
    }
    __syncwarp();
    if (valid) {
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&O.ring[dst])[i] = v[i];
    }
    __syncwarp();
}

/* one thread, ring empty: split the ring evenly between the hooks of `mask` (VM programs) */
__device__ __forceinline__ void obs_layout(dtmk_u32 mask) {
    const dtmk_u32 k = __popc(mask);
    const dtmk_u32 cap = k ? OBS_RING / k : 0;
    dtmk_u32 b = 0;
    for (int h = 0; h < DTMK_NUM_HOOKS; ++h) {
        O.cnt[h] = 0; O.base[h] = b;
        if (mask & (1u << h)) b += cap;
    }
    O.cap = cap; O.maxc = 0;
#ifdef DTMK_REC_FAST
    O.rec_t = -1;                                             /* (start / reload) the global table */
#endif
    O.must_at = cap > OBS_ROOM ? cap - OBS_ROOM : 1u;          /* room for one task's records */
    O.full_at = min(cap - cap / 4, cap > 2 * OBS_ROOM ? cap - 2 * OBS_ROOM : 1u);   /* <= 3/4 full */
    if (!O.full_at) O.full_at = 1;
}

/* warp 0 (all 32 lanes, converged): run the ring through the VM, each hook's sub-ring in
 * 32-record VM calls back to back (within a hook in time order); `chunk`: one 32-record
 * batch of the fullest sub-ring only (a spin loop calls it again after re-polling).  Once the ring is empty: flush the coverage accumulators of
 * epochs < `step` (all on a reload or with step ~0), publish OBS_PENDING, then reload the
 * hook tables if the host published new ones. */
__device__ __noinline__ void obs_sync(const MkParams &P, Worker &W, bool chunk, dtmk_u32 step) {
    const unsigned lane = threadIdx.x & 31;
    dtmk_u32 n = O.n;
    dtmk_u64 *g = obs_state(W);
    const bool reload = O.reload;
    if (reload) { chunk = false; step = ~0u; }
    bool ran = false;
    if (n && lane == 0 && !O.first_seen) {            /* attach latency: first counted event */
        dtmk_u64 first = ~0ull;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            if (!O.tabs[h].n_progs) continue;
            for (dtmk_u32 i = 0; i < O.cnt[h]; ++i)
                if (O.ring[O.base[h] + i].ts_ns < first) first = O.ring[O.base[h] + i].ts_ns;
        }
        if (first != ~0ull) { g[OBS_FIRST_TS] = first; O.first_seen = 1; }
    }
    __syncwarp();
    /* one hook's sub-ring per round, in batches of 32 records (one VM call each) back to
     * back; `chunk`: one batch, then the rest of that sub-ring moves to its front */
    int hsel = 0;                                   /* chunk: the fullest sub-ring */
    if (chunk) {
        dtmk_u32 mx = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) if (O.cnt[h] > mx) { mx = O.cnt[h]; hsel = h; }
    }
    for (int h = 1; n && h < DTMK_NUM_HOOKS; ++h) {
        const dtmk_u32 c = O.cnt[h];
        if (!c || (chunk && h != hsel)) continue;
        const dtmk_u32 b = O.base[h], todo = chunk ? min(c, 32u) : c;
        for (dtmk_u32 w = 0; w < todo; w += 32) {
            DTMK_PROF_BEGIN(prof_c0);
            DTMK_RUN_RECORDS(O.tabs, O.ring + b + w, min(todo - w, 32u), O.regs, O.accs + h * DTMK_MAX_PROGS,
                             W.worker, 0);
            __syncwarp();
            if (lane == 0) DTMK_PROF_END1(8, prof_c0);
        }
        const dtmk_u32 rem = c - todo;
        DTMK_PROF_BEGIN(prof_c0);
        for (dtmk_u32 w = 0; w < rem; w += 32)          /* ascending: a batch is read before it is overwritten */
            obs_move(w + lane < rem, b + todo + w + lane, b + w + lane);
        if (lane == 0) DTMK_PROF_END1(12, prof_c0);
        n -= todo;
        if (lane == 0) {
            O.cnt[h] = rem; O.n = n; O.drained += todo; O.drains += (todo + 31) / 32;
            dtmk_u32 mx = 0;
            for (int k = 1; k < DTMK_NUM_HOOKS; ++k) mx = max(mx, O.cnt[k]);
            O.maxc = mx;
        }
        __syncwarp();
        ran = true;
        if (chunk) break;
    }
    /* "|| false": the observer warp's removed refusal flag; kept so the PTX stays that of 1e256b7 (without it
     * NVVM orders this cold branch differently; same behaviour) */
    if (n == 0 && (ran || O.acc_min < step || false)) {
        DTMK_PROF_BEGIN(prof_c0);
        dtmk_u32 keep = ~0u;
        bool flushed = false;
#ifdef HK_SITE_FORM
        /* the site form's map updates first (all epochs: moving the current one's early
         * is harmless), so an epoch's values are in before its coverage and OBS_PENDING */
        DTMK_PROF_BEGIN(prof_sh);
        flushed = dtmk_sh_flush(&O.sh, O.tabs, O.accs, lane, 32);
        __syncwarp();
        DTMK_PROF_END(30, prof_sh);
#endif
        for (int i = lane; i < OBS_NACC; i += 32) {
            struct dtmk_cov_acc *a = &O.accs[i];
            if (a->cov && a->eligible) {
                if (a->epoch < step) { dtmk_cov_acc_flush(a); flushed = true; }
                else keep = min(keep, a->epoch);
            }
        }
        keep = __reduce_min_sync(0xffffffffu, keep);
        /* fence + publish only when coverage was flushed or OBS_PENDING moves (an epoch
         * end): between epoch ends the lowest held epoch is the one already published, so
         * nothing becomes final and the map / coverage writes need no fence yet */
        if (__any_sync(0xffffffffu, flushed) || keep != O.pub) {
            __threadfence();                           /* this lane's coverage before OBS_PENDING */
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                O.pub = keep;
                O.pubs += 1;
                *(volatile dtmk_u64 *)(g + OBS_PENDING) = keep == ~0u ? ~0ull : (dtmk_u64)keep;
            }
        }
        if (lane == 0) {
            O.acc_min = keep;
            g[OBS_DRAINED] = O.drained;
            g[OBS_DRAINS] = (O.drains & 0xffffffffull) | (O.pubs << 32);
        }
        __syncwarp();
        if (lane == 0) DTMK_PROF_END1(10, prof_c0);
    }
    if (lane == 0 && reload && n == 0) {
        const dtmk_u32 gen = ld_volatile_u32((const dtmk_u32 *)P.control + CTL_GEN);
        const struct dtmk_hook_table *gt = (const struct dtmk_hook_table *)O.tables;
        bool ok = true;
        dtmk_u32 mask = 0, inl = 0;            /* hooks whose slots take records / run inline */
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            if (*(volatile const dtmk_u32 *)&gt[h].gen != O.tabs[h].gen) {
                if (dtmk_vm_load_table(gt + h, &O.scratch)) {
                    O.tabs[h] = O.scratch;
#ifdef HK_SITE_FORM
                    for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) O.gdesc[h][k] = O.tabs[h].progs[k].descs;
#endif
#ifdef DTMK_VM_CODE_SMEM
                    for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) O.gcode[h][k] = O.tabs[h].progs[k].insns;
#endif
                } else {
                    ok = false;                       /* being written: keep the old copy, retry */
                }
            }
#ifdef HK_SITE_FORM
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                if (O.tabs[h].progs[k].flags & DTMK_PROG_F_INLINE) inl |= 1u << h;
                else mask |= 1u << h;
            }
#else       /* no site form: every slot takes records; one the host flagged for the site runs its code in the VM */
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k)
                O.tabs[h].progs[k].flags &= ~(DTMK_PROG_F_INLINE | DTMK_PROG_F_DESC);
            if (O.tabs[h].n_progs) mask |= 1u << h;
#endif
        }
#ifdef DTMK_VM_CODE_SMEM
        /* lay every program's code out again (the ring is empty: no drain reads it now);
         * a program that does not fit keeps running from global memory */
        dtmk_u32 used = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                struct dtmk_prog &pg = O.tabs[h].progs[k];
                const dtmk_u32 n = pg.n_insns + 1;
                pg.insns = O.gcode[h][k];
                if (used + n > DTMK_OBS_CODE) continue;
                const struct dtmk_dinsn *src = (const struct dtmk_dinsn *)O.gcode[h][k];
                for (dtmk_u32 i = 0; i < n; ++i) O.code[used + i] = src[i];
                pg.insns = (dtmk_u64)(O.code + used);
                used += n;
            }
        }
#endif
        /* every descriptor program into shared memory again, from its global copy (the
         * shadow is empty here): the site reads descriptors only from here (desc_at).  The
         * host keeps the sum of all entries within DTMK_OBS_DESC (runtime/descform.py
         * DESC_CAP); one that did not fit would count its events lost, never read garbage */
#ifdef HK_SITE_FORM
        dtmk_u32 nd = 0;
        for (int h = 1; h < DTMK_NUM_HOOKS; ++h) {
            for (dtmk_u32 k = 0; k < O.tabs[h].n_progs; ++k) {
                struct dtmk_prog &pg = O.tabs[h].progs[k];
                pg.desc_at = 0;
                if (!(pg.flags & DTMK_PROG_F_DESC) || nd + pg.n_descs > DTMK_OBS_DESC) continue;
                const struct dtmk_desc *src = (const struct dtmk_desc *)O.gdesc[h][k];
                for (dtmk_u32 i = 0; i < pg.n_descs; ++i) O.desc[nd + i] = src[i];
                pg.desc_at = nd + 1;
                nd += pg.n_descs;
            }
        }
#endif
        O.vm_mask = mask;
        obs_layout(mask);                             /* the ring is empty here */
#ifndef DTMK_HOLD_EAGER
        {
            dtmk_u32 reads = 0;
            for (int h = 1; h < DTMK_NUM_HOOKS; ++h) if (O.tabs[h].n_progs) reads |= O.tabs[h].ctx_reads;
            O.hold_full = ((reads >> 13) & 1u) || ((mask | inl) & (1u << DTMK_HOOK_COMM_WAIT)) ? 1u : 0u;
        }
#endif
#ifdef HK_SITE_FORM
        O.inl_mask = inl;                             /* the shadow is empty here (flushed above) */
#endif
        W.hook_mask = O.ring_mask | mask | inl;
        if (ok) {
            O.gen_seen = gen;
            O.reload = 0;
            O.first_seen = 0;
            g[OBS_FIRST_TS] = 0;
            g[OBS_LOADED_TS] = mk_now();
            *(volatile dtmk_u64 *)(g + OBS_GEN) = gen;
        }
        obs_update(W);
    }
    __syncwarp();
}
/* whole CTA calls it (a uniform call site: no divergence bookkeeping in the hot caller) */
__device__ __noinline__ void obs_sync_cta(const MkParams &P, Worker &W, bool chunk, dtmk_u32 step) {
    DTMK_PROF_BEGIN(prof_c0);
    if (threadIdx.x < 32) obs_sync(P, W, chunk, step);
#ifdef DTMK_OBS_PROF
    if (threadIdx.x == 0) { DTMK_PROF_END1(chunk ? 0 : 2, prof_c0); s_prof_drain = clock64() - prof_c0; }
#endif
}
#define OBS_SYNC_IF(cond, chunk, step) do { if (cond) obs_sync_cta(P, W, chunk, step); } while (0)
/* the lowest epoch held (published) is OBS_LAG or more steps behind `step`: drain all */
#define OBS_LAGGING(step) (O.pub < (dtmk_u32)(step) && (dtmk_u32)(step) - O.pub >= OBS_LAG)
/* cold, thread 0, while observing, at a wait's first look (rd: ready): 2 when the ring
 * must be drained at once (nearly full, or new tables).  A ring of OBS_FULL_AT.. records
 * waits for the spin (not ready) or the next wait (ready): no drain on the critical path. */
__device__ __noinline__ int obs_first_look(Worker &W, int rd, dtmk_u32 step) {
#ifdef DTMK_REC_FAST
    O.rec_t = hk_srec_t();                                  /* s_rec holds this static task's record */
    if (rd) W.long_wait = 0;
    /* no device observer (hooks to the global ring only, e.g. bench mask3): nothing to drain
     * or reload.  The default build returns 2 here at every non-ready first look of steps
     * >= OBS_LAG: O.pub stays 0 without observer state, so OBS_LAGGING is always true and
     * warp 0 calls an empty obs_sync before the spin */
    if (!O.tables) return 0;
#else
    if (rd) W.long_wait = 0;
#endif
    if (O.maxc >= O.must_at || O.reload) return 2;          /* all at once */
    if (!rd && OBS_LAGGING(step)) return 2;               /* bounded epoch lag: all, publish */
    /* the site form: the shadow holds an earlier epoch -> flush it in this idle wait
     * (every step: ~40 entries per worker and step, the 128-entry shadow would overflow
     * into the global helpers within OBS_LAG steps) */
#ifdef HK_SITE_FORM
    if (!rd && O.inl_mask && O.acc_min < step) return 2;
#endif
    return (!rd && O.maxc >= O.full_at) ? 4 : 0;            /* not ready, 3/4 full: one batch now */
}
/* cold, thread 0, every 16th poll of a wait while observing: leave the spin to drain? */
__device__ __noinline__ bool obs_spin_drain(const Worker &W, dtmk_u64 waited, dtmk_u32 step) {
    return O.maxc >= O.full_at ||
           ((O.n || O.acc_min < step) && (W.long_wait || waited >= OBS_LONG_WAIT_NS || OBS_LAGGING(step)));
}
#else
#define OBS_SYNC_IF(cond, chunk, step) do { } while (0)
#endif

#ifdef HK_SITE_FORM
#if defined(DTMK_INL_PROBE) && defined(DTMK_OBS_PROF)
__device__ __noinline__ void hk_probe_empty() { asm volatile(""); }
#endif
/* the hook's site-form programs (descriptors; compiled inline) over the context in the
 * shadow's scratch, inlined into the site.  Session 9 made it one noinline copy for code
 * size (1.16 -> 1.08 us per event); session 10 measured the call itself on 1b
 * (the inlined form, then a variant, same run): hot summary +43.2 -> +36.2%, compiled +37.4 ->
 * +29.3%, a null program +25.7 -> +20.8% over off -- the call's ABI saves / restores go
 * to local memory, whose lines miss L1 on the busy SM (docs/dev/hook_cost_analysis.md
 * "Session 10").  -DDTMK_INL_NOINLINE (bench variant inlcall): the call again */
#ifdef DTMK_INL_NOINLINE   /* (bench variant inlcall: session 9's one noinline copy) */
__device__ __noinline__
#else
__device__ __forceinline__
#endif
void hk_inline_run(Worker &W, dtmk_u32 hook, dtmk_u32 step) {
    dtmk_inl_event(O.tabs[hook], hook, &O.sh.ctx, W.worker, step, 0u, &O.sh, O.accs + hook * DTMK_MAX_PROGS, 0, 0,
                   O.desc);
}
/* thread 0 (in the cold hk_store callers): record c through the hook's inline programs (kernels/bpf_inline.cuh):
 * no ring slot, no drain; map updates into the shadow, coverage into O.accs, both
 * flushed by obs_sync.  Holds OBS_PENDING <= step as a ring record does (hook_hold held
 * it before the task's release signal when the record comes after it). */
__device__ __forceinline__ void hk_inline(Worker &W, const HkRec &c, dtmk_u32 hook, dtmk_u32 step) {
    DTMK_PROF_BEGIN(prof_i);
#pragma unroll
    for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&O.sh.ctx)[i] = c.v[i];
    hk_inline_run(W, hook, step);
    DTMK_PROF_END1(28, prof_i);
#if defined(DTMK_INL_PROBE) && defined(DTMK_OBS_PROF)
    /* profiling only (maps count each event twice): the same event again at once (code
     * and data now warm) -> [20, 21]; an empty noinline call -> [22, 23] */
    { DTMK_PROF_BEGIN(prof_i2); hk_inline_run(W, hook, step); DTMK_PROF_END1(20, prof_i2); }
    { DTMK_PROF_BEGIN(prof_i3); hk_probe_empty(); DTMK_PROF_END1(22, prof_i3); }
#endif
    if (step < O.acc_min) O.acc_min = step;
    if (O.acc_min < O.pub) {
        O.pub = O.acc_min;
        *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = O.acc_min;
    }
    if (!O.first_seen) { obs_state(W)[OBS_FIRST_TS] = O.sh.ctx.ts_ns; O.first_seen = 1; }
}
#endif

/* cold, thread 0: publish record c of `hook` (epoch `step`): linked monitor, the
 * observer's shared ring when a VM program of the hook wants it (counted lost when the
 * ring is full), the global ring when the hook is enabled there (else no copy) */
__device__ __forceinline__ void hk_store(const MkParams &P, Worker &W, const HkRec &c, dtmk_u32 hook, dtmk_u32 step) {
#ifdef DTMK_LINKED_MONITOR
    {
        struct dtmk_ctx loc;
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) ((uint4 *)&loc)[i] = c.v[i];
        dtmk_monitor(&loc);
    }
#endif
#ifndef DTMK_NO_HOOKS
    const dtmk_u32 bit = 1u << hook;
#ifdef HK_SITE_FORM
    if (O.inl_mask & bit) hk_inline(W, c, hook, step);
#endif
    if (O.vm_mask & bit) {
        const dtmk_u32 cn = O.cnt[hook];
        if (cn < O.cap) {
            uint4 *d = (uint4 *)&O.ring[O.base[hook] + cn];
#pragma unroll
            for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) d[i] = c.v[i];
            /* OBS_PENDING (lowest epoch held) only moves down here; a record built after
             * its task's release signal had it held by hook_hold before the signal;
             * obs_sync moves it up once the ring is empty */
            const dtmk_u32 lo = min(step, O.acc_min);
            if (lo < O.pub) {
                O.pub = lo;
                *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = lo;
            }
            O.cnt[hook] = cn + 1; O.n += 1;
            if (cn >= O.maxc) O.maxc = cn + 1;
        } else {
            obs_lost(W, hook, step);
        }
    }
    if (!(O.ring_mask & bit)) return;
#endif
    /* streaming ring: hook_head = records stored; slot n % cap (W.hook_slot: no 64-bit
     * modulo per record) while the host's tail (consumed, 0 outside resident launches)
     * leaves room, else counted in hook_drop */
    const dtmk_u64 n = W.hook_n;
    if (n - W.hook_tail < P.hook_cap) {
        const dtmk_u64 slot = W.hook_slot;
        uint4 *dst = (uint4 *)((char *)P.hook_ring + ((dtmk_u64)W.worker * P.hook_cap + slot) * DTMK_CTX_SIZE);
#pragma unroll
        for (int i = 0; i < DTMK_CTX_SIZE / 16; ++i) dst[i] = c.v[i];
        W.hook_slot = slot + 1 == P.hook_cap ? 0 : slot + 1;
        W.hook_n = n + 1;
    } else {
        W.hook_drop += 1;
    }
}

/* cold, thread 0: build and publish one record (ts given: no clock read here); t >= 0:
 * the task fields of t (request_gen: rg, see hk_task) and FLAG_REMOTE (mk_comm.cuh) */
__device__ __forceinline__ void hk_put_rec(const MkParams &P, Worker &W, dtmk_u32 hook, dtmk_u64 ts, int t, int step,
                                           dtmk_u32 flags, dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns,
                                           dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op, dtmk_u32 comm_gen,
                                           dtmk_u32 peer_rank, dtmk_u64 rg) {
    const HkTask k = hk_task(P, t, rg);
    if (t >= 0) flags |= tp_flags(P, trec(P, t), (int)hook);
    HkRec c;
    hk_rec(c, P, W, hook, ts, k, (dtmk_u32)step, event, event_gen, wait_ns, dur_ns, queue_depth, comm_op, comm_gen,
           peer_rank, flags);
    hk_store(P, W, c, hook, (dtmk_u32)step);
}
__device__ __noinline__ void hook_put(const MkParams &P, Worker &W, dtmk_u32 hook, dtmk_u64 ts, int t, int step,
                                      dtmk_u32 flags, dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns,
                                      dtmk_u64 dur_ns, dtmk_u32 queue_depth, dtmk_u32 comm_op, dtmk_u32 comm_gen,
                                      dtmk_u32 peer_rank, dtmk_u64 rg) {
    hk_put_rec(P, W, hook, ts, t, step, flags, event, event_gen, wait_ns, dur_ns, queue_depth, comm_op, comm_gen,
               peer_rank, rg);
}

__device__ void trace_rec(const MkParams &P, Worker &W, int t, int step, dtmk_u64 t0, dtmk_u64 t1, dtmk_u64 t2,
                          dtmk_u32 flags) {
    dtmk_u64 n = W.trace_n++;
    if (n < P.trace_cap) {
        TraceRec r;
        r.t_dispatch = t0; r.wait_ns = (dtmk_u32)min(t1 - t0, 0xffffffffull);
        r.dur_ns = (dtmk_u32)min(t2 - t1, 0xffffffffull); r.task_index = t; r.step = step;
        r.sm = (dtmk_u16)W.sm; r.worker = (dtmk_u16)W.worker; r.flags = (dtmk_u16)flags;
        r.cls = (dtmk_u16)trec(P, t)[0];
        uint4 *dst = (uint4 *)((char *)P.trace_ring + ((dtmk_u64)W.worker * P.trace_cap + n) * TRACE_BYTES);
        dst[0] = ((uint4 *)&r)[0]; dst[1] = ((uint4 *)&r)[1];
    }
}

/* thread 0: re-read the control words every `refresh` tasks */
__device__ __forceinline__ void refresh_control(const MkParams &P, Worker &W, bool force) {
    if (!force && ++W.since_refresh < W.refresh) return;
    const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
    W.since_refresh = 0;
#ifndef DTMK_NO_HOOKS
    O.ring_mask = ld_volatile_u32(ctl + CTL_HOOK_MASK);
    W.hook_mask = O.ring_mask | obs_prog_hooks();
    if (O.tables && ld_volatile_u32(ctl + CTL_GEN) != O.gen_seen) O.reload = 1;
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
        const int g = lo / (int)(P.n_heads / P.n_kv_heads);
        if (r[12] == 1) op_rope_attn(P, layer, r[3], g, smem);   /* this slot's q / k rope + cache row first */
        else op_attn(P, layer, r[3], g, smem);
        break;
    }
#else
    case 3: op_attn(P, layer, r[3], lo / (int)(P.n_heads / P.n_kv_heads), smem); break;
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

/* ---- hook sites ------------------------------------------------------------------------
 * HOW TO WRITE A HOOK SITE.  Hooks are off almost always and the off path must cost
 * (almost) nothing, so a site is, on thread 0, ONE mask test and ONE call of a cold
 * __noinline__ function:
 *
 *     if (HOOK_ON(W, DTMK_HOOK_COMM_WAIT))
 *         hook_event(P, W, DTMK_HOOK_COMM_WAIT, t, step, flags, event, gen, wait_ns,
 *                    0, 0, 0, comm_op, comm_gen, peer_rank);
 *
 *   * No dtmk_ctx, clock read (%globaltimer), table load or hook-only computation at the
 *     site: pass the scalars the site already has.  hook_event fills the common and task
 *     fields (none for t < 0), reads the clock (ts_ns 0: now), and hook_put builds the
 *     record in registers and stores it (16-byte stores) into the observer's shared ring
 *     and / or the global ring, wherever the hook is enabled.
 *   * flags: the task's DTMK_FLAG_* bits, or HK_FAULTS to let hook_event compute
 *     task_faults(P, t, step).flags itself (cold).
 *   * Several hooks at one place: `if (HOOKS_ANY(W, bits)) my_cold_fn(...)` with the
 *     HOOK_ON tests inside the cold __noinline__ function (see hook_post).
 *   * A value only hooks or the trace need on the per-task path (a timer, a wait) is
 *     computed under `if (W.observe)` (one shared load per task: hook_mask | trace_on |
 *     reload pending) and kept in a Worker field, never passed through run_task.
 *   * Between a task's readiness and its release signal (its successor's critical path)
 *     a site builds nothing and calls nothing: it sets its bit in W.pend and keeps the
 *     scalars that cannot be recomputed later (stamps, waits, queue depth) in Worker
 *     fields.  hook_hold (before the signal) holds OBS_PENDING and reads what may change
 *     once the signal is out (request_gen, comm:wait's sender); hook_flush builds the
 *     records after the signal, in hook order (dep:release, task:ready, queue:pressure,
 *     comm:wait, task:dispatch, task:begin, task:end), each with its captured stamp.
 *     hook_event flushes them first, so a record built elsewhere in that window (router
 *     task:ready, comm:signal) keeps the worker's ring in time order.
 *   * -DDTMK_NO_HOOKS makes HOOK_ON / HOOKS_ANY constant 0: the site compiles away.
 */
#define HK_FAULTS 0x80000000u   /* hook_event flags: add task_faults(P, t, step).flags */
#define HK_BIT(h) (1u << DTMK_HOOK_##h)

#ifndef DTMK_NO_HOOKS
/* thread 0, cold: complete the records captured for task W.pend_t (fields cls, slot,
 * dep = r[6], a14 = r[14] of its task record, loaded by the caller in one batch): drop
 * queue:pressure without an upward threshold crossing and comm:wait of a task that is no
 * consumer of a receive event, and read what may change after the release signal
 * (request_gen; the last remote sender).  Marks W.pend_rg (bit 32) done; hook_flush
 * does it if hook_hold has not (a router's task:ready records flush before its hold). */
__device__ __forceinline__ dtmk_u32 hk_capture(const MkParams &P, Worker &W, dtmk_u32 pend, int cls, int slot, int dep,
                                               int a14) {
    if (pend & HK_BIT(QUEUE_PRESSURE)) {
        const dtmk_u32 th = (dtmk_u32)P.queue_threshold, q = W.pend_q;
        if (!(th != 0 && q - 1 < th && th <= q)) pend &= ~HK_BIT(QUEUE_PRESSURE);
    }
    if (pend & HK_BIT(COMM_WAIT)) {
        if (cls == MK_CLS_RMSNORM && a14 >= 0) {
            const int e = dep >= 0 ? dep : (int)P.step_event;
            W.cw_peer = (dtmk_u32)ld_relaxed_sys((const dtmk_u64 *)P.events + P.n_events + e);
        } else {
            pend &= ~HK_BIT(COMM_WAIT);
        }
    }
#ifndef DTMK_HOLD_EAGER
    /* no loaded program reads request_gen and no host ring takes records: not read */
    const bool rg = O.ring_mask || O.hold_full;
#else
    const bool rg = true;
#endif
    W.pend_rg = (1ull << 32) | (rg && slot >= 0 && pend ? (dtmk_u32)__ldcg((const int *)P.req_gen + slot) : DTMK_NONE_U32);
    W.pend = pend;
    return pend;
}

/* the order hook_flush builds captured records in (4-bit hook ids, lowest nibble first):
 * dep:release, task:ready, queue:pressure, comm:wait, task:dispatch, task:begin, task:end */
#define HK_ORDER ((DTMK_HOOK_DEP_RELEASE) | (DTMK_HOOK_TASK_READY << 4) | (DTMK_HOOK_QUEUE_PRESSURE << 8) | \
                  (DTMK_HOOK_COMM_WAIT << 12) | (DTMK_HOOK_TASK_DISPATCH << 16) | (DTMK_HOOK_TASK_BEGIN << 20) | \
                  (DTMK_HOOK_TASK_END << 24))

/* thread 0, cold: build the records captured for task W.pend_t (see Worker) after its
 * release signal, in hook order, each with its captured stamp; every field as it was
 * when captured.  The task's fields are loaded once; one emit site for all records. */
__device__ __noinline__ void hook_flush(const MkParams &P, Worker &W) {
    const int t = W.pend_t, step = W.pend_step;
    const int *r = hk_trec(P, t);
    const int cls = r[0], slot = r[3], dep = r[6], dep_n = r[7], sig = r[8], dyn = r[9], a14 = r[14], r15 = r[15];
    HkTask k;
    k.cls = (dtmk_u32)cls; k.index = (dtmk_u32)t; k.tile_lo = (dtmk_u32)r[10]; k.tile_hi = (dtmk_u32)r[11];
    k.slot = (dtmk_u32)slot; k.layer = (dtmk_u32)r[1]; k.expert = (dtmk_u32)r[2];
    dtmk_u32 rem = 0;                    /* hooks of this task that carry FLAG_REMOTE (mk_comm.cuh) */
#pragma unroll
    for (int h = 1; h < DTMK_NUM_HOOKS; ++h) rem |= tp_flags(P, r, h) ? 1u << h : 0u;
    dtmk_u32 pend = W.pend;
    if (!(W.pend_rg >> 32)) pend = hk_capture(P, W, pend, cls, slot, dep, a14);
    W.pend = 0;
    k.rg = (dtmk_u32)W.pend_rg;
    W.pend_rg = 0;
    /* the awaited event: the plan's dependency (a dynamic task: its MoE layer's queue event) */
    int e = dep >= 0 ? dep : (int)P.step_event;
    dtmk_u64 target = dep >= 0 ? (dtmk_u64)dep_n * (dtmk_u64)(step + 1) : (dtmk_u64)step;
    if (dyn) { e = ((const int *)P.moe)[a14 * 8 + 4]; target = (dtmk_u64)(step + 1); }
    const dtmk_u32 flags = W.pend_flags, N = DTMK_NONE_U32;
    const dtmk_u64 t_ready = W.t_ready, t_begin = W.t_begin, t_end = W.t_end, dep_wait = W.dep_wait;
#ifdef DTMK_IDEAL_SITE
    /* MEASUREMENT ONLY (bench/hooks.py variant idealsite, run mask3; no record, no
     * observer, nothing readable): the floor of a site that does the summary's three
     * updates itself -- the data-driven site of docs/dev/hook_cost_analysis.md "Session 9"
     * at its cheapest: a histogram bucket, a sum and a maximum in shared memory (the
     * observer's ring, unused without an observer), volatile so nothing is optimized out */
    {
        volatile dtmk_u32 *hist = (volatile dtmk_u32 *)O.ring;          /* [16 classes][64 buckets] */
        volatile dtmk_u64 *sum = (volatile dtmk_u64 *)(O.ring) + 16 * 64 / 2;
        volatile dtmk_u32 *qmax = (volatile dtmk_u32 *)(sum + 16);
        const dtmk_u32 c = (dtmk_u32)cls & 15u;
        if (pend & HK_BIT(TASK_END)) {
            const dtmk_u64 d = t_end - t_begin;
            hist[c * 64 + (d ? min(64 - __clzll((long long)d), 63) : 0)] += 1;
        }
        if (pend & HK_BIT(DEP_RELEASE)) sum[c] += dep_wait;
        if ((pend & HK_BIT(TASK_READY)) && W.pend_q > *qmax) *qmax = W.pend_q;
        (void)flags; (void)t_ready; (void)e; (void)target; (void)rem; (void)k;
        return;
    }
#endif
    for (dtmk_u32 o = HK_ORDER; o; o >>= 4) {
        const dtmk_u32 h = o & 15u;
        if (!(pend & (1u << h))) continue;
        dtmk_u64 ts = t_ready, gen = target, wait = 0, dur = 0;
        dtmk_u32 ev = (dtmk_u32)e, qd = 0, op = N, cg = 0, peer = N, fl = flags;
        switch (h) {
        case DTMK_HOOK_DEP_RELEASE: ts = W.ts_rel; wait = dep_wait; break;
        case DTMK_HOOK_TASK_READY: qd = W.pend_q; break;
        case DTMK_HOOK_QUEUE_PRESSURE: ev = N; gen = 0; qd = (dtmk_u32)P.queue_threshold; fl = 0; break;
        case DTMK_HOOK_COMM_WAIT:
            wait = dep_wait; op = (dtmk_u32)((const int *)P.ev_comm_op)[e];
            cg = (dtmk_u32)((dtmk_u64)step * P.n_layers + (dtmk_u64)(a14 >> 1)); peer = W.cw_peer;
            break;
        case DTMK_HOOK_TASK_DISPATCH: ts = t_begin; ev = N; gen = 0; wait = t_begin - t_ready; qd = W.phantoms; break;
        case DTMK_HOOK_TASK_BEGIN: ts = t_begin; wait = dep_wait; qd = W.phantoms; break;
        default: /* task:end */
            ts = t_end; ev = (dtmk_u32)sig; gen = (dtmk_u64)((dtmk_u32)r15 >> 1) * (dtmk_u64)(step + 1);
            wait = dep_wait; dur = t_end - t_begin;
            break;
        }
        if (rem & (1u << h)) fl |= DTMK_FLAG_REMOTE;
        DTMK_PROF_BEGIN(prof_r);
        HkRec c;
        hk_rec(c, P, W, h, ts, k, (dtmk_u32)step, ev, gen, wait, dur, qd, op, cg, peer, fl);
        hk_store(P, W, c, h, (dtmk_u32)step);
        DTMK_PROF_END1(26, prof_r);
    }
}
#endif

__device__ __noinline__ void hook_event(const MkParams &P, Worker &W, int hook, int t, int step, dtmk_u32 flags,
                                        dtmk_u32 event, dtmk_u64 event_gen, dtmk_u64 wait_ns, dtmk_u64 dur_ns = 0,
                                        dtmk_u32 queue_depth = 0, dtmk_u64 ts_ns = 0,
                                        dtmk_u32 comm_op = DTMK_NONE_U32, dtmk_u32 comm_gen = 0,
                                        dtmk_u32 peer_rank = DTMK_NONE_U32) {
    /* stamp first: the flush below takes ~1 us, and e.g. comm:signal's stamp is what the
     * collector's causal check compares the peer's release with */
    const dtmk_u64 ts = ts_ns ? ts_ns : mk_now();
#ifndef DTMK_NO_HOOKS
    if (W.pend) hook_flush(P, W);   /* records captured before this one go first (ring order = time order) */
#endif
    if (flags & HK_FAULTS) flags = (flags & ~HK_FAULTS) | (t >= 0 ? task_faults(P, t, step).flags : 0u);
    hook_put(P, W, (dtmk_u32)hook, ts, t, step, flags, event, event_gen, wait_ns, dur_ns,
             queue_depth, comm_op, comm_gen, peer_rank, 0);
}

/* thread 0: queue:pressure on an upward crossing of the threshold */
__device__ void pressure(const MkParams &P, Worker &W, int step, dtmk_u32 d0, dtmk_u32 d1, int t) {
    dtmk_u32 th = (dtmk_u32)P.queue_threshold;
    if (!HOOK_ON(W, DTMK_HOOK_QUEUE_PRESSURE) || th == 0 || !(d0 < th && th <= d1)) return;
    hook_event(P, W, DTMK_HOOK_QUEUE_PRESSURE, t, step, 0, DTMK_NONE_U32, 0, 0, 0, th);
}

/* cold, thread 0, while observing, after a task's body and before its release signal:
 * task:end (stamp t_end) joins the captured records; hk_capture reads what may change
 * once the signal is out; and when a VM program will get a record of this task after the
 * signal (captured, gen:advance of the argmax task, comm:signal of a comm task to a
 * peer), OBS_PENDING holds `step` before it (a snapshot that sees the step counter move
 * must not call the epoch final) */
#ifndef DTMK_NO_HOOKS
/* thread 0, before the release signal: OBS_PENDING holds `step` when a program will get a
 * record of this task after it (pend: the captured hooks) */
__device__ __forceinline__ void hold_epoch(const MkParams &P, Worker &W, dtmk_u32 pend, int cls, int a14,
                                           dtmk_u32 step) {
    dtmk_u32 later = pend;
    if (cls == 10) later |= HK_BIT(GEN_ADVANCE);
    if (cls == MK_CLS_ALLREDUCE && a14 != (int)P.rank) later |= HK_BIT(COMM_SIGNAL);
    if ((obs_prog_hooks() & later) && step < O.pub) {
        O.pub = step;
        *(volatile dtmk_u64 *)(obs_state(W) + OBS_PENDING) = step;
    }
}
__device__ __noinline__ void hook_hold(const MkParams &P, Worker &W, int t, dtmk_u32 step, dtmk_u64 t_end) {
    const int *r = hk_trec(P, t);
    const int cls = r[0], slot = r[3], dep = r[6], a14 = r[14];   /* one batch of loads */
    dtmk_u32 pend = W.pend | HOOKS_ANY(W, HK_BIT(TASK_END));
    W.t_end = t_end;
    if (pend) pend = hk_capture(P, W, pend, cls, slot, dep, a14);
    hold_epoch(P, W, pend, cls, a14, step);
}
#ifndef DTMK_HOLD_EAGER
/* thread 0, before the release signal, when nothing reads what hook_hold reads early
 * (O.hold_full == 0, no host ring): task:end joins the captured records and OBS_PENDING
 * holds `step` -- shared memory only, no call; hk_capture runs after the signal */
__device__ __forceinline__ void hold_light(const MkParams &P, Worker &W, int cls, int a14, dtmk_u32 step,
                                           dtmk_u64 t_end) {
    W.t_end = t_end;
    W.pend |= HOOKS_ANY(W, HK_BIT(TASK_END));
    hold_epoch(P, W, W.pend, cls, a14, step);
}
#ifndef DTMK_IDEAL_SITE
#define HOLD_FULL() (O.ring_mask | O.hold_full)   /* hook_hold's pre-signal work is needed */
#else
/* measurement only: a descriptor site reads nothing before the signal (mask3's host ring
 * would otherwise take the full hold, which the floor must not count) */
#define HOLD_FULL() false
#endif
#else
#define HOLD_FULL() true
__device__ __forceinline__ void hold_light(const MkParams &, Worker &, int, int, dtmk_u32, dtmk_u64) {}
#endif
#else
__device__ __forceinline__ void hook_hold(const MkParams &, Worker &, int, dtmk_u32, dtmk_u64) {}
__device__ __forceinline__ void hold_light(const MkParams &, Worker &, int, int, dtmk_u32, dtmk_u64) {}
#define HOLD_FULL() true
#endif

/* cold, thread 0, after a task's release signal: its captured records (hook_flush),
 * gen:advance and the trace record */
__device__ __noinline__ void hook_post(const MkParams &P, Worker &W, int t, int step, dtmk_u32 flags, dtmk_u64 t_end) {
#ifndef DTMK_NO_HOOKS
    if (W.pend) hook_flush(P, W);
    W.pend_rg = 0;                       /* the next task captures afresh */
#endif
    if (hk_trec(P, t)[0] == 10 && HOOK_ON(W, DTMK_HOOK_GEN_ADVANCE)) {
        const HkTask none = hk_task(P, -1, 0);
        for (int b = 0; b < (int)P.batch; ++b) {
            /* the request that got this step's token: a refilled slot (pos 0) was gen-1 */
            const int g = __ldcg((const int *)P.req_gen + b), p = __ldcg((const int *)P.pos + b);
            HkTask k = none;
            k.slot = (dtmk_u32)b; k.rg = (dtmk_u32)(p == 0 ? g - 1 : g);
            HkRec c;
            hk_rec(c, P, W, DTMK_HOOK_GEN_ADVANCE, t_end, k, (dtmk_u32)step, DTMK_NONE_U32, 0, 0, 0, 0, DTMK_NONE_U32, 0,
                   DTMK_NONE_U32, 0);
            hk_store(P, W, c, DTMK_HOOK_GEN_ADVANCE, (dtmk_u32)step);
        }
    }
    if (W.trace_on) trace_rec(P, W, t, step, W.t_disp, W.t_begin, t_end, flags);
}


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
#endif
/* static task t's record: wait_event's shared copy when it holds t, else the global table */
__device__ __forceinline__ const int *task_rec(const MkParams &P, int t) {
#ifndef DTMK_REC_LATE
    return s_rec_t == t ? (const int *)s_rec : trec(P, t);
#else
    return trec(P, t);
#endif
}
__device__ __noinline__ void run_task(const MkParams &P, Worker &W, int t, int step, bool plan, float *smem) {
    const int *r = task_rec(P, t);
    TaskFaults f;
    if (threadIdx.x == 0) {
        const dtmk_u32 obs = W.observe;   /* the task's one "observing?" load */
        f = task_faults(P, t, step, r);
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
        if (f.slow) mk_spin_ns(f.slow);
        if (r[0] == 7) router_publish(P, W, t, step);
        dtmk_u64 t_end = mk_now();
        int sig = r[8];
        /* the task's hook records (captured ones, task:end, gen:advance) and the trace
         * record are built AFTER the release signal (off the successor's critical path;
         * their values were taken before it); only the epoch hold (OBS_PENDING <= step)
         * and the reads of what may change after the signal precede it */
        if (HOOKS_ANY(W, ~0u)) {
            DTMK_PROF_BEGIN(prof_h);
            if (HOLD_FULL()) hook_hold(P, W, t, (dtmk_u32)step, t_end);
            else hold_light(P, W, r[0], r[14], (dtmk_u32)step, t_end);   /* not with -DDTMK_HOLD_EAGER */
            DTMK_PROF_END1(24, prof_h);
        }
        if (r[0] == MK_CLS_ALLREDUCE) comm_post(P, W, t, step, f.late, f.flags);   /* to rank r[14] */
        else post_signal(P, W, sig, f.late);
        if (W.observe) { DTMK_PROF_BEGIN(prof_c0); hook_post(P, W, t, step, f.flags, t_end); DTMK_PROF_END1(4, prof_c0); }
        dtmk_u64 *ws = wstate(P, W.worker);
        ws[WS_DONE] = ++W.done; ws[WS_TS] = t_end;
        post_pending(P, W, false);
        refresh_control(P, W, false);
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
__device__ __noinline__ void wait_event(const MkParams &P, Worker &W, int t, int step, int e, dtmk_u64 target, float *smem) {
    __shared__ dtmk_u64 s_t0;
    if (threadIdx.x == 0) {
#ifndef DTMK_REC_LATE
        if (t >= 0) {                   /* before the acquire below (see s_rec) */
            const int4 *src = (const int4 *)trec(P, t);
#pragma unroll
            for (int k = 0; k < TREC_WORDS / 4; ++k) ((int4 *)s_rec)[k] = src[k];
        }
        s_rec_t = t;
#endif
        post_pending(P, W, false);
        W.dep_wait = 0;
        int rd = ev_ld_acquire(P, counter(P, e)) >= target;   /* system scope when ranks > 1 */
        W.ready = rd;
#ifndef DTMK_NO_HOOKS
        /* after this first look (never before it): a ring that cannot take another
         * task's records, or new tables, is drained at once */
        if (W.observe) rd |= obs_first_look(W, rd, (dtmk_u32)step);
#endif
        W.first = rd;
        if (!(rd & 1)) {
            dtmk_u64 *ws = wstate(P, W.worker);
            ws[WS_TASK] = t; ws[WS_STEP] = step; ws[WS_EVENT] = e; ws[WS_TARGET] = target; ws[WS_STATE] = 2;
            if (t >= 0 && HOOK_ON(W, DTMK_HOOK_DEP_WAIT))
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
    OBS_SYNC_IF((first & 6), !(first & 2), (dtmk_u32)step);
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
                if (v >= target) { W.ready = 1; break; }
#else           /* the session-2 poll: relaxed loads, one fence.acq_rel once satisfied */
                dtmk_u64 v = ev_ld_relaxed(sys, counter(P, e));
                if (v >= target) { ev_fence_acquire(sys); W.ready = 1; break; }
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
                if (W.observe && obs_spin_drain(W, now - t0, (dtmk_u32)step)) break;
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
                if (gen != O.gen_seen) { O.reload = 1; obs_update(W); break; }
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
        OBS_SYNC_IF(dt < 0 && W.observe, O.maxc < O.must_at && !OBS_LAGGING(step), (dtmk_u32)step);
#endif
        if (dt >= 0) {
            dtmk_u64 saved_disp = 0;       /* the waiting static task's dispatch stamp */
            if (threadIdx.x == 0) {
                saved_disp = W.t_disp;
                W.t_ready = pushed_at;     /* task:dispatch wait and starve faults count from the push */
                if (W.observe) { W.t_disp = mk_now(); W.dep_wait = 0; }
            }
            run_task(P, W, dt, ds, false, smem);
            if (threadIdx.x == 0) { W.t_disp = saved_disp; t_idle = mk_now(); }
        }
    }
    if (threadIdx.x == 0) {
        dtmk_u64 now = mk_now();
        if (!W.aborted) {
            wstate(P, W.worker)[WS_STATE] = 1;
            if (W.observe) {
                W.dep_wait = now - t0;
                W.long_wait = now - t0 >= OBS_LONG_WAIT_NS;
#ifndef DTMK_NO_HOOKS
                /* dep:release: captured (stamp, wait in dep_wait), built after the task's
                 * release signal (hook_flush); nothing of the previous task is pending */
                if (t >= 0) { W.pend = HOOKS_ANY(W, HK_BIT(DEP_RELEASE)); W.ts_rel = now; }
#endif
            }
        }
    }
}


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
    __threadfence_system();
    ((volatile dtmk_u64 *)P.hook_head)[W.worker] = W.hook_n;
    ((volatile dtmk_u64 *)P.hook_drop)[W.worker] = W.hook_drop;
    ((volatile dtmk_u64 *)P.steps_done)[W.worker] = fin;
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
 * 3), as does a successor grid without a map. */
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
    if (w < 0 || w >= (int)P.n_workers) { W.aborted = 3; atomicExch((unsigned int *)ctl + CTL_ABORT, 3u); return; }
    W.worker = (dtmk_u32)w;
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
    __shared__ Worker W;
    extern __shared__ float smem[];
    for (int i = threadIdx.x; i < (int)(sizeof(MkParams) / 8); i += blockDim.x) ((dtmk_u64 *)&P)[i] = params[i];
    if (threadIdx.x == 0) {
        dtmk_u32 sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        W.worker = blockIdx.x; W.sm = sm; W.aborted = 0; W.since_refresh = 0; W.phantoms = 0; W.done = 0; W.long_wait = 0; W.pend_rg = 0;
        for (int i = 0; i < MK_PENDING; ++i) { W.pend_event[i] = -1; W.pend_due[i] = 0; }
        comm_init();
#ifdef DTMK_OBS_PROF
        for (int i = 0; i < PROF_N; ++i) s_prof[i] = 0;
        s_prof_drain = 0;
#endif
#ifdef DTMK_SMEM_PAD
        ((volatile char *)dtmk_smem_pad)[0] = 0;     /* keep the padding allocated */
#endif
    }
#ifdef DTMK_SM_WORKER
    MK_SYNC();                     /* P is complete */
    if (threadIdx.x == 0) sm_worker(P, W);
#endif
#ifndef DTMK_NO_HOOKS
    MK_SYNC();                     /* P is complete (thread 0 reads P.control below) */
    for (int i = threadIdx.x; i < (int)(sizeof(O.tabs) / 4); i += blockDim.x) ((dtmk_u32 *)O.tabs)[i] = 0;
    for (int i = threadIdx.x; i < OBS_NACC; i += blockDim.x) { O.accs[i].cov = 0; O.accs[i].eligible = 0; }
#ifdef HK_SITE_FORM
    for (int i = threadIdx.x; i < (int)DTMK_SH_N; i += blockDim.x) O.sh.e[i].map = 0;
    if (threadIdx.x == 0) O.inl_mask = 0;
#endif
    if (threadIdx.x == 0) {
#ifdef HO_RESUME
        W.rs_step = (int)P.step0; W.rs_i = -1; W.rs_phant = 0;
        if (P.handoff_in && !W.aborted) ho_resume(P, W);   /* before anything indexed by the worker */
#endif
        const dtmk_u32 *ctl = (const dtmk_u32 *)P.control;
        O.tables = (dtmk_u64)ctl[CTL_TABLES] | ((dtmk_u64)ctl[CTL_TABLES + 1] << 32);
        O.state = (dtmk_u64)ctl[CTL_OBS] | ((dtmk_u64)ctl[CTL_OBS + 1] << 32);
        if (!O.state) O.tables = 0;
        O.n = 0; O.vm_mask = 0; O.ring_mask = 0; O.min_step = 0; O.acc_min = ~0u;
#ifndef DTMK_HOLD_EAGER
        O.hold_full = 1;
#endif
        obs_layout(0u);
        O.drained = O.drains = O.pubs = 0; O.first_seen = 0; O.pub = 0;
        if (O.state) {
            const dtmk_u64 *g = obs_state(W);
            const dtmk_u64 d = g[OBS_DRAINS], pend = g[OBS_PENDING];
            O.drained = g[OBS_DRAINED]; O.drains = d & 0xffffffffull; O.pubs = d >> 32;
            O.first_seen = g[OBS_FIRST_TS] != 0;
            O.pub = pend >= 0xffffffffull ? ~0u : (dtmk_u32)pend;   /* what the host sees now */
        }
        O.gen_seen = 0xffffffffu; O.reload = O.tables ? 1u : 0u;
        W.pend = 0;
    }
#endif
    MK_SYNC();
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
            }
            MK_SYNC();
#ifndef DTMK_NO_HOOKS
            if (W.gate == 0 && O.reload) {     /* uniform: every thread reads O.reload after the barrier */
                OBS_SYNC_IF(true, false, (dtmk_u32)step);
                MK_SYNC();
            }
#endif
            if (W.gate == 1) {
                /* not granted yet: first finish the previous step everywhere (its dynamic
                 * tasks: a parked worker takes none), so that all of it is published */
                wait_event(P, W, -1, step - 1, (int)P.step_event, (dtmk_u64)step, smem);
#ifndef DTMK_NO_HOOKS
                OBS_SYNC_IF(O.tables && !W.aborted, false, (dtmk_u32)step);   /* device VM: epochs < step flushed */
#endif
                if (threadIdx.x == 0) {
                    if (!W.aborted) {
                        gate_publish(P, W, (dtmk_u64)step);
                        /* deferred (late) signals still fall due while parked: a peer rank
                         * may need one to finish the step this rank has finished */
                        while ((W.gate = gate_look(P, W, step)) == 1) { post_pending(P, W, false); __nanosleep(2000); }
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
            int t = plan[i];
            const int *r = trec(P, t);
            /* no barrier here: t_disp is thread 0's (trace only), W.aborted was last
             * written before wait_event's / run_task's final barrier */
            if (threadIdx.x == 0) {
                if (W.observe) W.t_disp = mk_now();
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
            wait_event(P, W, t, step, e, target, smem);
            if (W.aborted) break;
            run_task(P, W, t, step, true, smem);
        }
        i_first = -1;
    }
    /* drain: keep taking dynamic tasks until the last step is done everywhere */
    if (!W.aborted && !HO_FINISHED) wait_event(P, W, -1, last - 1, (int)P.step_event, (dtmk_u64)last, smem);
#ifndef DTMK_NO_HOOKS
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
        post_pending(P, W, true);     /* (a worker leaving for a handoff: up to a late signal's delay early) */
        ((dtmk_u64 *)P.hook_head)[MK_WID] = W.hook_n;
        ((dtmk_u64 *)P.trace_head)[MK_WID] = W.trace_n;
        if (P.hook_drop) ((dtmk_u64 *)P.hook_drop)[MK_WID] = W.hook_drop;
        /* (a leaving worker's step is not whole; a finished one's successor has nothing to add) */
        const bool ends_here = !W.aborted && !HO_FINISHED;
        if (P.resident && ends_here) gate_publish(P, W, (dtmk_u64)last);   /* every step < last is whole */
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
