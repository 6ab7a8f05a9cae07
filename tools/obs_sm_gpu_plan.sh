#!/usr/bin/env bash
# The observer SM's first GPU runs (docs/dev/hook_cost_analysis.md "Session 14"), as device
# calls of under 10 minutes each (run from the repo root on the device machine, through
# tools/gpu_session.sh: logs come back in $OUT/logs.tgz).  Priority order 1, 2, 4, 3:
#   tools/obs_sm_gpu_plan.sh 1   every build, then exactness (hot: tiny, small-moe, 1b's six
#                                warps, attach/detach bits, the epoch test) and the probe
#   tools/obs_sm_gpu_plan.sh 2   the builds whose default code changed (lean / handoff:
#                                test_handoff_gpu.py, test_placement_gpu.py whole) and the
#                                compiled tier on the observer
#   tools/obs_sm_gpu_plan.sh 3   resident + serve, top and the run CLI (default and obssm)
#   tools/obs_sm_gpu_plan.sh 4   bench/hooks.py: obssm / obssm1 / obssmin beside the default
# Session 15 ran 1-4 (one observer SM is exact and cannot keep up with 1b); next, several
# observer SMs (-DDTMK_OBS_SMS=M), priority order 5, 6, 7:
#   tools/obs_sm_gpu_plan.sh 5   the M = 3 / 4 builds, exactness (test_hot_attach -k obssm3) and
#                                the probe with 3 and 4 observer SMs (does it keep up now?)
#   tools/obs_sm_gpu_plan.sh 6   bench/hooks.py: obssm3 / obssm4 beside the default (hot, compiled)
#   tools/obs_sm_gpu_plan.sh 7   handoff, serving and the compiled tier with three observer SMs
# Session 16 ran 5, 7 and the probes that split 1b's hot summary with four observer SMs
# (+15.6% over its plain run: capture ~2%, the workers' pushes ~4.5%, the observers' VM work
# ~9% -- hook_cost_analysis.md "Session 16").  Next, priority order 8, 9:
#   tools/obs_sm_gpu_plan.sh 8   the lazy-publish build (-DDTMK_OSQ_LAZY_PUB): exactness (hot
#                                attach, epochs, serving); bench/obs_split.py: the split side by
#                                side in one process (nopush / discard / lazy, and which kind of
#                                the observers' work costs the workers: discard + fences / atomics / loads)
#   tools/obs_sm_gpu_plan.sh 9   bench/hooks.py: obssm4 / obssm4lazy beside the default
# Session 17 ran 8 (lazy exact; lazy +9.5% over plain vs base +13.6%; fences / atomics / loads
# reproduce none of the observers' share).  Then:
#   tools/obs_sm_gpu_plan.sh 10  bench/obs_split.py: record building (novm) vs the VM vs the
#                                epochs' lows (nolow), with lazy; top's GPU test (M = 4)
#   tools/obs_sm_gpu_plan.sh 11  the CLI's observer SM now lazy (top, serve GPU tests); scattered
#                                synthetic atomics / loads (atoms8s, loads16s); level_profile of the
#                                lazy observer-SM build (durations or handoffs?)
#   tools/obs_sm_gpu_plan.sh 12  the worker's queue words kept in W (osq_mine): exact (lazy
#                                build's tests), and its gain beside -DDTMK_OSQ_AREA_CTL
# Session 17 ran 8-12 (hooks.md / hook_cost_analysis.md "Session 17").  Next:
#   tools/obs_sm_gpu_plan.sh 13  d96b6e1's untested observer-SM cases (M = 1 / 3: epochs, handoff,
#                                serving, the compiled tier); level_profile of the lazy build with
#                                DISCARD / NOVM (does a worker's post-task time grow without the VM?)
#   tools/obs_sm_gpu_plan.sh 14  obs_split, the lazy build's parts side by side (reps 7): the push
#                                inlined, discarded, built without the VM
# Session 18 ran 13-14 (the post-task time grows half as much without the VM).  Then:
#   tools/obs_sm_gpu_plan.sh 15  do the builds run at different SM clocks?  obs_split's parts
#                                with nvidia-smi sampling each build's sustained run (--clocks)
#   tools/obs_sm_gpu_plan.sh 16  the VM run without map memory (lazynomaps) beside lazy / novm
#   tools/obs_sm_gpu_plan.sh 17  lanes of a VM batch share a key's probe and RED (5612b17's
#                                dtmk_hash_find / dtmk_red_u64; exact, no gain: reverted)
#   tools/obs_sm_gpu_plan.sh 18  the observers run descriptor programs into a shared-memory shadow
#                                (-DDTMK_OSQ_DESC, lazydesc / obssm4desc): its cost, then exactness
# Session 18 ran 13-18 (hooks.md "Session 18": the map helpers' share, ~5%, is neither the VM
# nor the volume of map requests; lazydesc costs what lazy does).  Next:
#   tools/obs_sm_gpu_plan.sh 19  lazydesc vs lazydescnoflush (no map written at all) vs lazynomaps,
#                                reps 7: do the epoch-end flushes' writes carry the cost?  First the
#                                probe: its desc column must be > 0 (the descriptor path ran)
# Session 19 ran 19 (desc ran; lazydescnoflush +8.3% beside lazydesc +7.5%, nomaps +5.5%: the
# epoch-end writes carry nothing).  Next:
#   tools/obs_sm_gpu_plan.sh 20  where the workers' extra post-task time goes: level_profile --prof
#                                (new worker counters: post path, signal, osq_raise, raises that
#                                delayed a met poll) of lazy / lazy+nomaps / lazydescnoflush, and
#                                obs_split lazy vs lazynoraise (-DDTMK_OSQ_NORAISE) vs nomaps, reps 9
# Session 19 ran 20 (the summary lengthens the workers' post path +0.8 us per task in lazy, nomaps
# and descnoflush alike; osq_raise and NORAISE change nothing).  Next:
#   tools/obs_sm_gpu_plan.sh 21  the post path split finer (push, worker-state stores, refresh, the
#                                next wait's first look) and nomaps + BURN (busy observers, no memory)
# Session 19 ran 21 (BURN 6000 cycles per entry after the run: free; the push after the signal is
# +0.5 us per task: 0.57 vs 0.08 us).  Next:
#   tools/obs_sm_gpu_plan.sh 22  the worker's W read with LDS instead of generic loads: the push
#                                (-DDTMK_OSQ_PUSH_LDS) or run_task / wait_event too (-DDTMK_W_LDS), in
#                                obs_split, level_profile --prof, and bench/megakernel.py (no-hook build)
# Session 19 ran 22 (push 0.57 -> 0.47 us with LDS; lazylds +8.5% beside lazy +11.2%, no-hook
# W_LDS no faster).  Next:
#   tools/obs_sm_gpu_plan.sh 23  the spread itself: two instances of lazy and of nomaps in one run,
#                                unplaced and with every build's workers placed (obs_split --place)
# Session 19 ran 23 (two instances of one build differ by 0.2-1.0 points; placed in id order every
# build is ~1-2% slower, the gaps the same).  Next (issue 4):
#   tools/obs_sm_gpu_plan.sh 24  -DDTMK_PLAN_SMEM=96: the plan loop's head and the first look from
#                                shared memory -- bits equal (variants test), then bench/megakernel.py
# Session 19 ran 24 (bits equal; no-hook build -1.2%, hook build +0.3%: not adopted) and then
# made the push's LDS form the observer-SM build's own.  Next:
#   tools/obs_sm_gpu_plan.sh 25  the observer-SM GPU tests on that build (hot attach, resident,
#                                handoff, compiled tier) and obs_split lazy vs plain, reps 7
# Session 19 ran 25 (23 + 2 passed; lazy +11.4% / +11.6% over plain, two instances).  Next (prepared,
# not run; the prof's post-path split suggests each global store thread 0 issues between a task's
# end and its successor's start costs ~75 ns):
#   tools/obs_sm_gpu_plan.sh 26  -DDTMK_WS_VEC (the worker-state words as 16-byte pairs: 6 stores per
#                                task instead of 10) and -DDTMK_OSQ_PUSH_WARP (the lazy push staged in
#                                shared memory, stored by warp 0's lanes 0-5): bits / exactness
#                                tests, bench/megakernel.py, obs_split (also five observer warps per
#                                SM: lazydesc had five, lazy six), level_profile --prof
# Session 20 ran 26 (WS_VEC no gain in either build; the push with PUSH_WARP still 0.44 us: the
# stores were not the cost -- the SASS shows thread 0 reloading the record pointer and the faults
# from the call's local save area after run_body, LDL -> dependent generic load).  Next:
#   tools/obs_sm_gpu_plan.sh 27  -DDTMK_POST_SMEM (those operands in shared memory): bits / exactness
#                                tests, bench/megakernel.py (default, no-hook), obs_split lazy /
#                                lazypost / lazywarp (second run) / nomaps, level_profile --prof
#   tools/obs_sm_gpu_plan.sh 28  its second run: bench/megakernel.py, obs_split with lazypost's
#                                own plain (--base lazypost)
# Session 20 ran 27 and 28 (hook build -2.4 / -2.5%, observer-SM plain -2.2%, lazy -3.4 / -1.3%,
# bits equal, exact): adopted in every build.  Then:
#   tools/obs_sm_gpu_plan.sh 29  the whole GPU suite on it (two parts, tools/gpu_suite.py)
#   tools/obs_sm_gpu_plan.sh 30  bench/megakernel.py --quick (issue 4's table) and bench/hooks.py 1b
#                                with obssm4lazy (issue 5's table)
# Session 20 ran 29 (the suite has outgrown two 270 s parts: 228 of 459 ran, 0 failed) and 30
# (hooks.md session 20; megakernel.py ran out of 100 s in the old lowering's rows).  Next:
#   tools/obs_sm_gpu_plan.sh 32 [N...]  parts N (default 2 3) of tests/gpu cut in four
#                                (tools/gpu_suite.py N/4; the variants test's 40 builds precompiled in
#                                parallel first: precompile.py --variants); then `32 4` -- with session 20's run
#                                (tests 1-207 and 230-250 of 459, i.e. part 1/4) the whole suite
#                                at de9fafa's kernels
# Session 21 ran 31 (HEAD_GPU: push window 0.53 us as before -- removed; PLAN_SMEM=96 -1.6% no-hook,
# +0.3% hook build), 32 2 (tests 114-217 of 453 in 260 s, 0 failed), 33 and 34 (the post path
# reading its operands from s_post by name, beside -DDTMK_POST_REGS = the code before: hook build
# +1.3 / +1.4% slower, push window 0.51 vs 0.52 us, obs_split within its noise -- reverted, both
# plans retired).  Next:
# Session 22 ran 35 (HEAD_IN_SIGNAL exact, no gain: push 0.57 -> 0.48 us, the head alone 0.11;
# obs_split lazyheadsig +11.32% beside lazy +11.86 / +11.08%), 32 215..250 380..452 (every test
# has now run at main's kernels) and 36 in two forms (ea642bb: -DDTMK_OSQ_PUSH_W2, warp 2 stores
# the entry after a CTA-fenced hand-over: push window 0.68 vs 0.55 us, obs_split +12.3 / +12.0%
# vs lazy +9.6 / +9.6%; f2bcb61: -DDTMK_OSQ_HEAD_LAST, entry before the previous head, push 0.58,
# and -DDTMK_OSQ_PUSH_SHW, the queue words by the CTA's name, push 0.50: both within obs_split's
# spread).  All four defines are gone; plans 35 and 36 retired.  Next:
#   tools/obs_sm_gpu_plan.sh 32 A..B   tests A..B of tests/gpu (tools/gpu_suite.py ranges; its -v names
#                                each test's result in the log as it ends)
# Session 23 (issue 4, docs/dev/megakernel_speed.md "Session 23") measured L2 lookahead (slower),
# ring-start variants (noise), the tile phase profile (-DDTMK_PHASE_PROF: a gate/up tile's 15 us
# through the ring wait only ~1-2 us for stages; warp 0's releases and what follows them carry
# ~12 us) and two release forms (acq_rel atomic, copies off lane 0: no change).  Next:
#   plan 37 (session 24) ran them: -DDTMK_WS_REL_MBAR, -DDTMK_WS_SKIP, both and -DDTMK_WS_REL_NOFENCE
#   bit-equal and 0.99-1.01x of the default; with SKIP a gate/up tile waits ~6 us for its stages
#   (the SM's share of HBM is its bound); the defines are gone, plan 37 retired.
# Session 24 (issue 5): -DDTMK_OSQ_DEFER=N (kernels/mk_observer.cuh osq_defer_flush: the task's entry
# staged in shared memory after the signal, stored by the next wait's first failed poll):
#   tools/obs_sm_gpu_plan.sh 38  exactness (hot attach + resident -k obssm4defer), obs_split lazy / lazyB /
#                                lazydefer / lazydefer1 twice (order swapped), level_profile --prof of
#                                lazydefer (does the push window leave the post path?)
#   tools/obs_sm_gpu_plan.sh 39  the CLI's --observer sm with DEFER (top, serve on the GPU) and the issue-5
#                                table: bench/hooks.py 1b with obssm4lazy and obssm4defer side by side
#   tools/obs_sm_gpu_plan.sh 40  what is left of DEFER's hot summary: obs_split --base lazydefer with deferB,
#                                lazydefer16, defernomaps (the map work's share), deferscan (observers pause
#                                2 us after each round: their memory traffic per entry), twice
# Session 25 ran 40 (DEFER=16 below 4 twice; nomaps -3 points; the observers' pause nothing: SCAN_NS
# is gone).  The CLI's observer build now stages 16 (gpu.OSQ_DEFER_DEFAULT):
#   tools/obs_sm_gpu_plan.sh 41  obssm4defer (DEFER=16) exact: hot attach, resident, top and serve on the
#                                GPU; obs_split lazydefer / lazydefer16 / deferB, reps 9
#   tools/obs_sm_gpu_plan.sh 42  the issue-5 table: bench/hooks.py 1b with obssm4defer (DEFER=16)
#   tools/obs_sm_gpu_plan.sh 43  bench/hooks.py 1b with obssm4defer (16) and obssm4defer4 side by side
#   tools/obs_sm_gpu_plan.sh 44  where the maps' ~3 points land on the workers: level_profile --prof of
#                                DEFER=16 with and without -DDTMK_OSQ_NOMAPS (post path? handoffs? levels?)
#   tools/obs_sm_gpu_plan.sh 45  is it the observer warps' contention on one key per class?  obs_split of
#                                lazydefer16 with the summary keyed by (class, worker): spread16, twice
# Session 25 ran 40-45 (spread16 = the per-class summary: not one key's contention).  Session 26:
#   tools/obs_sm_gpu_plan.sh 46  the maps' ~3 points: the hash probes' state loaded relaxed (relax16,
#                                -DDTMK_MAP_PROBE_RELAXED) and NOMAPS observers made as late as full
#                                ones (nomaps16burn30k) beside nomaps16, obs_split twice
#   tools/obs_sm_gpu_plan.sh 47  does the maps' share reach the workers through the TPC an observer
#                                shares with a worker?  obs_split --place with the observers on the
#                                last four SMs, on SMs 1,3,5,7 (each beside a worker) and on SMs 0-3
#   tools/obs_sm_gpu_plan.sh 48  plan 47 placed the workers by SM id (plain +7% over no hooks vs +4.5%
#                                unplaced): the same with the workers in the unplaced block order, the
#                                observers on that order's last four SMs, or on SMs 0-3
#   tools/obs_sm_gpu_plan.sh 49  plans 47-48: the maps' share depends on which SMs observe beside which
#                                workers (+6.4..+12.3% over plain).  What reaches the neighbours?  nomaps16
#                                with 4 loads on 2 MB pages per entry (TLB) or ~3 K / ~11 K instructions of
#                                straight-line code (instruction caches), obs_split twice
#   tools/obs_sm_gpu_plan.sh 50  plan 49: 4 page loads per entry cost nothing, ~3 K instructions of new code per
#                                entry +28%.  Slow observers (backpressure) or neighbours?  obs_sm_probe (queue-full
#                                waits, now also the DEFER flush's; observer cycles) of N 16, + NOMAPS, + ICODE=256
#   tools/obs_sm_gpu_plan.sh 51  plan 50: the observers are busy ~all of the step either way (full: 35 full-queue
#                                waits, NOMAPS none): throughput.  Six observer SMs instead of four, obs_split
#   tools/obs_sm_gpu_plan.sh 52  the observer warps run up to D entries of one worker per round (-DDTMK_OSQ_MULTI,
#                                session 26): exact (hot attach, resident, final epochs: obssm4multi), then
#                                obs_split multi2 / multi4 / multi8 / multi4nomaps beside lazydefer16 / nomaps16
#   tools/obs_sm_gpu_plan.sh 53  (retired: MULTI no cheaper) the issue-5 table with obssm4multi beside obssm4defer
#   tools/obs_sm_gpu_plan.sh 54  (retired) plan 52's obs_split again, the order swapped
#   tools/obs_sm_gpu_plan.sh 55  plan 52: MULTI exact but no cheaper (multi4 +9.8%, multi8 +6.7% vs +7.3%).  Do the
#                                workers pay for full queues?  Deeper queues (-DDTMK_OSQ_N=256; 16: room waits
#                                often): obs_split deep16 / deep16x / deep16nomaps, exactness, obs_sm_probe 64 vs 256
#   tools/obs_sm_gpu_plan.sh 56  plan 55: no full-queue wait left with 256 entries and the summary costs the same.
#                                Does map-like memory work beside the real VM cost what the maps do?  obs_split
#                                nomaps16 + 8 atomics / 16 dependent loads per entry (a word per lane), twice
#                                (session 27 ran it: +0.1..+1.1 points over nomaps16 vs the maps' 2.5-3.2)
#   tools/obs_sm_gpu_plan.sh 57  the neighbour reading, directly: observers on SMs 0-3 with SMs 4-15 idle in every
#                                build (-DDTMK_SM_IDLE, obs_split --idle-smids; unrun) beside the same without
#                                idle SMs; full - nomaps in each
#   tools/obs_sm_gpu_plan.sh 58  plan 57 ran (idle 4-15: full - nomaps 73 us/step vs 34 busy, but 116 workers run
#                                1b's 128-tile levels in two rounds): its control, the same 116 workers with the
#                                idle SMs far from the observers (120-131), then near (4-15), then far again
# Session 28 ran 57 and 58: near-idle costs 2.4x far-idle (177-183 vs 66-75 us/step over plain; full - nomaps
# 72-78 vs 18-33): not the neighbours being busy (docs/results/hooks.md "Session 28").  Next:
#   tools/obs_sm_gpu_plan.sh 59  per worker, not per build: level_profile --workers of plan 58's far and near
#                                placements (nohooks / off / summary side by side), then both with NOMAPS: does the
#                                extra time sit on the workers beside the observers, or on the critical path's?
# Session 29 ran 59: neither -- a fixed set of SMs (16-19, 32-35, 48-51, 64-65, 78-79, 92-93, 106-107, 124-131)
# runs its tasks 0.3-0.8 us slower with the summary on, whichever worker runs there; near is dear because the
# two-round workers 0-3 land on SMs 16-19.  Next:
#   tools/obs_sm_gpu_plan.sh 60  the GPC layout (tools/gpc_probe.py: cluster co-residency), then 128 workers placed with
#                                the observers on SMs 0-3 / 16-19 / 64-67 / one per GPC / 0-3 again: does the slowed set
#                                move with them, and does spreading them over GPCs thin it?
# Session 29 ran 60: the GPCs are TPC-interleaved (GPC g: SMs 2g, 2g+1, 16+2g, ...), and the slowed set is exactly
# the observers' GPC-mates (0.7-0.8 us per task), wherever the observers sit; spread over 4 GPCs: 63 SMs slowed.
#   tools/obs_sm_gpu_plan.sh 61  the observers in ONE GPC (0,1,16,17); then which kind of observer work slows the
#                                GPC-mates: per entry nothing (DISCARD), 2000 cycles (BURN), 8 atomics, 16 dependent
#                                loads, the VM without maps (NOMAPS), NOMAPS + ~770 instructions of fresh code (ICODE)
# Session 29 ran 61: one GPC 12 SMs slowed +878 ns/task (+65 us/step); DISCARD / BURN / ATOMS / LOADS slow no GPC;
# NOMAPS slows the observers' GPCs (+284 / +586 ns), NOMAPS + ICODE more (+477 / +605): the code the observers run?
#   tools/obs_sm_gpu_plan.sh 62  fresh code alone: DISCARD with ICODE=64 / 256 (~770 / ~3 K instructions per entry, no
#                                VM, no memory) beside DISCARD and the full summary: do the GPC-mates slow?
# Session 29 ran 62: yes -- ICODE=256 alone slows GPCs 0 and 1 by +1018 / +1022 ns per task (the summary +658 /
# +629); DISCARD and ICODE=64 do not.  The observers' code reaches the workers through a GPC-shared instruction
# path (docs/dev/hook_cost_analysis.md "Session 29").  Next: smaller observer code (tools/sass_size.py), measured
# with a plan-62-style per-GPC table (tools/gpc_probe.py, then level_profile --workers --gpcs).
#   tools/obs_sm_gpu_plan.sh 63  Nsight Compute (never used before): the warps' stall reasons (no_instruction:
#                                waiting on an instruction fetch) in nohooks / off / summary (observers on 0-3)
#                                of 1b, and the metric names of the instruction caches for a later call
# Session 30 ran 63: no_instruction is ~6% of the warps' stall samples in every build, and the summary adds none
# in total (barrier +150 K samples: the longer dependency waits); the metric list names the instruction path:
# the SM's ICC, then the GPC's L1.5 (GCC, constants and instructions), then L2.  Next:
#   tools/obs_sm_gpu_plan.sh 64  ICC / GCC instruction requests, misses and L2 fetches (per SM and per GPC
#                                instance) in nohooks / off / summary, and DISCARD / DISCARD+ICODE=256
#   tools/obs_sm_gpu_plan.sh 65  tools/icache_probe.py: the ICC's and the GCC's capacity, and how much code of
#                                its own one SM may run before its GPC-mates slow
# Session 30 ran 64 (the summary's GPC: GCC instruction misses 1.30 M vs 0.35 M off, L2 instruction fetches 280 K vs
# 79 K) and 65 (ICC ~32-40 KB per TPC, GCC ~128-160 KB per GPC; 15 SMs on one 96 KB + one SM on its own 64 KB: 2.5x
# cycles per instruction, on its own 32 KB: +6%).  Next:
#   tools/obs_sm_gpu_plan.sh 66  the observers' code budget in the real kernel: DISCARD + ICODE = 96 / 128 / 160 / 192
#                                (~18 / 24 / 30 / 36 KB per entry), the GPC-mates' extra ns per task (64: none, 256: +1 us)
# Session 30 ran 66: the GPC-mates' excess over the other GPCs grows with the observers' fresh code per entry:
# ~18-24 KB +150-190 ns per task, ~30 KB +570, ~36 KB +1000 (12 KB: none): the budget is the TPC's ICC.  Next:
#   tools/obs_sm_gpu_plan.sh 67  the executed KB per source function (DTRACE_MK_LINEINFO=1 builds, ncu SourceCounters,
#                                tools/ncu_footprint.py --build on the device) of nohooks / off / summary: the diet's map
# Session 30 ran 67: nohooks executes 89.9 KB at least 1000 times, the summary 129.1 (+33: dtmk_vm_exec 7.6, obs_sync
# 3.4, hook_flush 2.6, osq_observer 2.2, ...).  Next: an observer diet to <= ~20 KB per entry, measured with 67 and
# a plan-66-style per-GPC table on the real summary (docs/dev/hook_cost_analysis.md "Session 30").
#   tools/obs_sm_gpu_plan.sh 68  the executed KB of the default build's nohooks / off / summary (hot, worker VM) /
#                                summary_cm (the compiled tier's inline form, +35%): does the inline monitor grow every
#                                worker's code past the GCC?
# Session 30 ran 68: default build, KB executed >= 1000 times: nohooks 89.9, off 93.9, hot summary (worker VM) 122.1,
# inline compiled summary 116.3: both add their code to every worker (+28 / +22 KB), in the order of their costs.
#   tools/obs_sm_gpu_plan.sh 69  the observer diet (session 31: the VM's memory group, pc sync, stack zeroing,
#                                atomics, div/mod; the map helpers' key loops): the device VM's exactness, then the
#                                per-GPC table of off / summary for the new build and the old one (.snap/base.tar,
#                                the tree before the diet) side by side, new / old / new
#   tools/obs_sm_gpu_plan.sh 70  the diet's exactness on the observer SM (hot attach and resident, the CLI's build)
#                                and its executed footprint (plan 67 without nohooks: off / summary, --diff 0:1)
#   tools/obs_sm_gpu_plan.sh 71  the diet's exactness beyond the VM harness (hot attach, the compiled tier against the
#                                VM, map churn, the golden queries, the observer ring) and the interpreter's ns per
#                                instruction, new and old tree side by side (bench/vm_device.py --quick)
# Session 31 ran 69-71: the observers' added code 34.3 -> 30.9 KB of lines, the step and the GPC-mates' excess unchanged
# within the spread; exact (tests/gpu: the VM, hot attach, compiled tier, maps, golden queries); the interpreter as fast.
# Next, priority order 73, 74, 75, 72 (one device call each; 73's three batches took more than one call's 600 s):
#   tools/obs_sm_gpu_plan.sh 73  the rest of tests/gpu at the diet's kernels, part 1: megakernel, variants, fused, handoff,
#                                placement; the final-epoch cases not yet run ([1b-obssm4deep], [1b-obssm4shallow])
#   tools/obs_sm_gpu_plan.sh 74  part 2: resident, top, run CLI, launch, launch attach, rec_fast, attn_staged
#                                (test_tp*, test_diagnose_gpu need two GPUs: the x2 kind)
#   tools/obs_sm_gpu_plan.sh 75  code that jumps versus a straight line of the same KB on the observers (-DDTMK_OSQ_JCODE,
#                                session 31): the per-GPC table (plan 66's form) of DISCARD + ICODE=128 (~27 KB straight),
#                                DISCARD + JCODE=176 (~27.5 KB, a compare tree), DISCARD + JCODE=128 (~19 KB)
# Session 32 ran 73: its first stage (the five files in one pytest) ran past 330 s (its log lost with the session's
# checkout); the final-epoch cases [1b-obssm4deep], [1b-obssm4shallow] passed.  Next, priority order 76, 74, 75, 72:
#   tools/obs_sm_gpu_plan.sh 76  73's first stage again, cut in two, the variants' builds compiled in parallel first
#                                (tools/precompile.py --variants), pytest -v so a timeout still shows what passed
# Session 33 ran 76: megakernel, variants, fused 100 passed; handoff 15 passed, its last case [1b-obssm3] (a new
# build, compiled in the test) and placement cut by the 200 s timeout.  Next, 77, 78 (74 in two calls), 75, 72:
#   tools/obs_sm_gpu_plan.sh 77  handoff [1b-obssm3] and placement; resident, top, run CLI
#   tools/obs_sm_gpu_plan.sh 78  launch, launch attach, rec_fast, attn_staged
# Session 33 ran 76-78 (tests/gpu at the diet's kernels all passed but test_tp*, test_diagnose_gpu: no x2 machine),
# 75 (jumping code costs the GPC-mates what straight-line code of the same KB does), 72 (the descriptor path: as much
# code, as much GPC cost, ~10 us cheaper in one sample) and 42 twice (hot +9.80% / +6.88%: hooks.md "Session 33").
#   (72, run)                      the descriptor path on the observers (-DDTMK_OSQ_DESC with the CLI's build): its executed
#                                footprint (off / summary) and the per-GPC table beside the CLI's build, new / desc / new
# Next, priority order 81 (only on the x2 kind), 79, 80:
#   tools/obs_sm_gpu_plan.sh 81  (nvidia-h200-x2) the two-GPU tests at the diet's kernels: test_tp.py, test_tp_baseline.py,
#                                test_diagnose_gpu.py, the two-GPU demo cases of test_launch_gpu.py / test_launch_attach_gpu.py
#   tools/obs_sm_gpu_plan.sh 79  where the summary's GPC-mate excess comes from: the per-GPC table of the CLI's build with
#                                off / null3 (a null program on each of the summary's hooks: hook_flush, the VM's entry,
#                                coverage rows, no maps) / summary, twice (session 33: fresh code explains ~280 of ~750 ns)
#   tools/obs_sm_gpu_plan.sh 80  the hook table of record: bench/hooks.py 1b --reps 6 with obssm4defer (its last table:
#                                each build over its own off, the launches' range)
# Session 34 ran 79 (null3 costs the GPC-mates +456..+492 ns per task, the summary +757..+820: the machinery a
# record goes through with no program work is ~60% of the excess) and 80 (hot +6.36% [+5.62..+8.07] over its own
# off, compiled +5.40% [+4.65..+7.43], default off +0.85% [+0.47..+2.86]: hooks.md "Session 34").  Next:
#   tools/obs_sm_gpu_plan.sh 82  null3's executed footprint on the CLI's build: KB per function of off / null3 /
#                                summary (plan 67's form), what null3 adds over off and the summary over null3
#   tools/obs_sm_gpu_plan.sh 83  is the GPC-mates' slowdown the union of the workers' and the observers' code in the
#                                GPC's L1.5?  Per-GPC tables (off / summary) of the CLI's build, with ~10 KB of fresh
#                                worker code per task (-DDTMK_WK_ICODE=48), DISCARD + JCODE=128 (observer code that
#                                alone slows nobody), and both
# Session 34 ran 82 (the observers' new lines: null3 24.1 KB, summary 32.6 -- a build phase of 10.5 KB and a
# drain phase of 13.8 / 22.1) and 83 (worker code +10 KB: with harmless observer code no GPC-specific slowdown,
# with the summary the GPC-mates' +730..+900 ns grew to +1080..+1120: the observers' own overflow is the trigger).
#   tools/obs_sm_gpu_plan.sh 84  full VM batches (-DDTMK_OSQ_IDLE_DRAIN=16: an idle round leaves the records in
#                                the ring): the per-GPC table beside the CLI's build, the observers' counters
#                                (obs_sm_probe: rounds, idle / room drains), the hook table (obssm4defer / obssm4idle)
#   tools/obs_sm_gpu_plan.sh 85  its exactness: hot attach, final epochs, resident (-k obssm4idle)
# Session 34 ran 84 (the observers ~20% less drain work, queues full 8x less often; the GPC-mates' excess and the
# step unchanged: kept opt-in) and 85 (7 passed).  Next (docs/dev/hook_cost_analysis.md "Session 34"): 81 when the
# x2 kind is lent; the observers' build and drain phases on separate TPCs (a new build, its protocol model first).
#   tools/obs_sm_gpu_plan.sh 86  the split's premise, build side: per-GPC tables of the CLI's build with NOVM (records
#                                built and moved, never run: the build phase and obs_sync's bookkeeping) and DISCARD
# Session 34 ran 86: NOVM costs GPC 1's mates +239 ns per task, GPCs 0 / "?" nothing; DISCARD nothing (hooks.md).
#   tools/obs_sm_gpu_plan.sh 87  the phases on separate TPCs (-DDTMK_OSQ_SPLIT: observer SMs 0-1 build records,
#                                2-3 run them, blocks in global memory between): its exactness (hot attach, final
#                                epochs, resident: -k obssm4split), then per-GPC tables of the CLI's build and the split
#   tools/obs_sm_gpu_plan.sh 89  the split's observers counted (obs_sm_probe: the builders' rows, then the drainers':
#                                batches, blocks, busy) beside the CLI build's, and the per-GPC table of the split with
#                                NOVM (the drainers copy the records in and commit, never run them)
# Session 35 ran 87 twice (416cfe4: a block per round; bc59dab: blocks of several passes, batched drains), 89, and
# with -DDTMK_OSQ_DESC on the drainers 90 (exactness, probe, per-GPC tables) and 88 (the hook table beside
# obssm4defer): the split is exact (7 passed) but slower -- the builders' GPC is spared, the drainers' GPC-mates pay
# as much as before (+571..+1127 ns per task), 12 drain warps cannot keep up without descriptors, and with them the
# hook table is unchanged (+7.07% vs +7.65%).  Split + DESC is refused since (its final epochs did not advance while
# 1b ran).  docs/results/hooks.md "Session 35".
# Session 36 (a worker diet: the per-task code's 64-bit divides and ws_task_desc's three inlined ws_desc copies
# out; the workers' per-task code is fetched again at every class switch -- docs/dev/megakernel_speed.md
# "Session 36"):
#   tools/obs_sm_gpu_plan.sh 91  bench/megakernel.py --quick, this tree against .snap/base.tar's (the commit before
#                                the diet), new / old / new in one call (us/step, % copy bandwidth, tokens)
#   tools/obs_sm_gpu_plan.sh 92  the hook build (off) against the no-hook build timed round-robin (bench/megakernel.py
#                                --variants; plan 91's blocks of five launches each put them ~4-5% apart), then
#                                the megakernel's GPU tests (bits: logits, tokens, fused, staged attention,
#                                variants) and the CLI observer build's exactness (-k obssm4defer)
#   tools/obs_sm_gpu_plan.sh 94  resume a cut plan 92 on a fresh machine: precompile --variants, then the test ids
#                                listed in .snap/var_todo.txt (the variants tests it did not reach)
#   tools/obs_sm_gpu_plan.sh 95  the hook builds in the no-hook build's carveout: ran at 2e7d617 with a 3-stage ring as the
#                                variants (ring3 / obssm4defer3 beside the 4-stage default, round-robin and in the hook
#                                table: off -2.5..-2.7%, the CLI build's hot summary / own off +8.10% -> +6.48%); since
#                                3 stages are the default it runs the 4-stage ring as the variants (ring4 / obssm4defer_ring4)
#   tools/obs_sm_gpu_plan.sh 96  the 3-stage default's exactness: precompile (default, no-hook, the variants), the
#                                megakernel's GPU tests, the CLI observer build's (-k obssm4defer: 5 observer warps now)
#   tools/obs_sm_gpu_plan.sh 93  bench/hooks.py --reps 3 --variants obssm4defer (the hook table on the diet's kernels)
# Session 36 ran 91 (the diet: no change), 92 + 94 (exact; the off cost on that card +4.9% round-robin), 93 (half
# the off cost is the carveout: pad / nohooks +2.34%), 95 at 2e7d617 (3 stages: off -2.66%, the CLI's hot summary
# +8.10% -> +6.48%) and 96 at e8d1fd7 (the 3-stage default exact: 7 + 31 + 72 passed).  docs/results/hooks.md "Session 36".
# Next:
#   tools/obs_sm_gpu_plan.sh 97  the 3-stage CLI build's observers (5 warps per SM now): per-GPC table and obs_sm_probe
#                                (busy share, queues full) -- are they nearer saturation, and what do the GPC-mates pay?
# Session 37 (the L1 again: 3 x 24 KB ring stages, 72 KB, would put every 1b build at batch 1 -- no-hook, default
# and the CLI's -- in the 132 KB carveout, and at batch 4 the hook builds in 164 instead of 196; session 4's
# 16 KB stages were +12%, are 24 KB ones as fast as 32?):
#   tools/obs_sm_gpu_plan.sh 98  bench/megakernel.py round-robin, batch 1 then batch 4: the hook build (off) and the
#                                no-hook build with the 3 x 32 KB default, 3 x 24 KB, 4 x 24 KB (batch 1) and
#                                2 x 32 KB (batch 4): us/step, % copy bandwidth, tokens
#   tools/obs_sm_gpu_plan.sh 99  bench/hooks.py --reps 3 --variants ring3x24,obssm4defer,obssm4defer_3x24: the hook
#                                table with 24 KB stages (the CLI build's observer SMs then run 4 warps)
#   tools/obs_sm_gpu_plan.sh 100 bench/hooks.py --reps 3 --variants obssm4defer,obssm4defer_w4,obssm4defer_w3: the CLI
#                                build with 5 / 4 / 3 observer warps per observer SM (do fewer busy warps cost the
#                                GPC-mates less?), then obs_sm_probe of the 4- and 3-warp builds (do they keep up?)
#   tools/obs_sm_gpu_plan.sh 101 the hook table of record on tiny and 1b in one run (the issue asks for both; 1b alone
#                                since session 17): bench/hooks.py --presets tiny,1b --reps 3 --variants obssm4defer
# Session 37 ran 98 (24 KB stages +2.6% / +3.5%, 2 stages at batch 4 +3.0%: 3 x 32 KB stays), 93 (1b: CLI hot +5.56%),
# 100 (4 / 3 observer warps fall behind: hot +8.50% / +24.87%), 101 (the table of record: 1b CLI hot +6.90%, compiled
# +7.34%, default off +4.05%; tiny +6.65% / +5.42% / +7.45%); 99 not run (98 settled it).  docs/results/hooks.md
# "Session 37".  Next: 81 on the x2 kind; 102; 97 (the observers' per-GPC table at 5 warps):
#   tools/obs_sm_gpu_plan.sh 102 the off path of a job started lean (grid handoff: the no-hook build runs until the first
#                                attach), last measured in session 12 (-1.12% 1b): bench/handoff.py on tiny and 1b at
#                                today's kernels, beside the plain hook build's off (the table of record's +4.05%)
# Session 38 (no device lent): the compiled tier's map helpers folded to each map's shape (kernels/bpf_map_ops.cuh:
# one shared probe per key size, no descriptor loads, key words in registers) and its interpreter slot out of
# dtmk_cm_run_records' lines; checked on the CPU only (host differential, NVRTC, nvJitLink + nvdisasm sizes):
#   tools/obs_sm_gpu_plan.sh 103 the compiled tier's GPU tests (three-way differential, harness stages, the megakernel's
#                                stages, inline form and observer SM: tests/gpu/test_compiled_tier.py whole)
#   tools/obs_sm_gpu_plan.sh 105 the hot tier's helpers (now bpf_map_ops.cuh's templates over the descriptor; their SASS
#                                moved by a few register moves): the device VM's and map-churn tests, then the CLI
#                                build's exactness (-k obssm4defer)
#   tools/obs_sm_gpu_plan.sh 104 bench/hooks.py --presets 1b --reps 3 --variants obssm4fold,obssm4look: the CLI build's
#                                compiled summary with folded (summary_cm) and generic (summary_cmgen) map helpers side
#                                by side; the hot summary with the generic helpers' register-only probe (opt-in
#                                -DDTMK_HASH_LOOK_FAST)
#   tools/obs_sm_gpu_plan.sh 106 the per-GPC table (plan 66's form) of the CLI build's compiled summary, folded
#                                (summary_cm) and generic (summary_cmgen): does the smaller drain slow the observers'
#                                GPC-mates less?
# Order: 103, 105, 104, 106.  Then: 81 on the x2 kind; 102; 97.
# Session 39 (no device lent again; no device code changed: the compiled tier's Python split into a package and
# gpu.py's build half into gpu_build.py, host side only): the order above stands, 103 and 105 first.
# Session 40 (no device lent again; no kernel code changed): device summaries for GPU ranks (serve --summaries
# device: the agent's summary task half in the device VM, attached per window of steps, read once final):
#   tools/obs_sm_gpu_plan.sh 107 tests/gpu/test_device_summaries_gpu.py on one GPU: window summaries == host summaries
#                                of the same resident launch (windows 3 and 16), serve --summaries device (workers / sm),
#                                a device query's clear(@map) and exit map read (DeviceQueries.clear_map / read_map)
#   (81 on the x2 kind now also runs the 2-GPU demo with --summaries device, and its launch/attach test
#   now checks exit() in a device query: the host reads its exit map once a step)
# Order: 103, 105, 107, 104, 106.  Then: 81 on the x2 kind; 102; 97.
# Session 40 ran 103 (14 passed), 105 (151 + 7 passed), 107 (the triple bug found, fixed; then 4 passed, the workers'
# serve case a strict xfail: window rotation reloads), 104 (fold_maps stays: compiled +3.92% vs +5.90%).  Next: 106;
# 81 on the x2 kind (now with the device-summaries demo); 102; 97.
# Session 41: a summary window ends on the device where its successor starts (dtmk_prog.end_epoch, attach
# replaces=) and a table change loads at the gate of the step it is due at, earlier only in idle time
# (control[CTL_GEN_DUE], O.lazy): kernel code of every hook build changed (the program table entry, the gate).
#   tools/obs_sm_gpu_plan.sh 108 the device-summaries GPU tests (the workers' serve case no longer an xfail);
#                                resident + hot attach on the default / site-form builds
#   tools/obs_sm_gpu_plan.sh 109 device VM + map churn (the table entry's layout), the compiled tier
# Order: 108, 109, 104 (the default build's off / hot / compiled beside session 40's).
# Session 41 got no device (five refusals, then none lent): 108, 109, 104 are the next session's first calls.
# Session 42 got none either (no kernel change; the inline form now takes a hist_add whose r0 is dead on every
# path).  Before the calls, compile their cubins on the CPU machine and carry .kcache (docs/dev/HELPERS.md):
#   tools/kcache.sh --plan 108 --plan 109 --plan 104 --plan 106 --plan 102 --plan 105 --plan 103 --plan 81 \
#                   --plan 97 --tests tests/gpu --variants DTMK_OBS_SM
# (~12 min on 2 cores, 11.5 MiB; git-ignored, so each session builds it again); gpu_session.sh installs it,
# the first time on a machine after one check build (does this image's NVRTC compile the same bytes?).
# Session 43: no start succeeded (eleven failed starts, 09:13-11:44).  108 now also runs the device-query cut test
# (tests/gpu/test_device_summaries_gpu.py, no new build); order unchanged: 108, 109, 104.
# Session 44: starts failed again.  81 (x2) now runs all of tests/gpu/test_launch_attach_gpu.py: also the
# job-aligned device-query cuts on 2 GPUs (every rank's interval tick covers the steps rank 0 named).
# 108's device-query cut test now runs in the hot and the compiled tier (two attachments linked once, rearmed
# by turns: a table change of the slots' epochs while the resident launch runs).
# Session 44's ninth start ran 108 (6 passed + the workers' serve case XPASS: its xfail dropped, device summaries
# the default; 21 passed), 109 (151 + 14 passed), 104 (obssm4fold hot +5.94%, compiled +5.09%; default off +3.37%).
# Next: 106; 81 on the x2 kind (now with the aligned-cuts test); 102; 97.
# Session 45 (H100s: the `nvidia-h200` calls were placed on H100 80GB; no x2 lent) ran 106 (folded and generic
# compiled drains cost the same, +3.4%), 102 (1b lean / nohooks +0.40%), the serving loop (device summaries'
# host side made cheap: 1b -17%, tiny -53% in one run) and 108 (21 passed; the workers' serve case failed while
# the windows were read after the grant -- reverted, then 4 passed).  Next: 81 on the x2 kind; 97; 108 and 104
# on an H200 (the lends of this session were H100s); the summary window's table reload when the host keeps up.
# Session 46: 110 (new) -- bench/serve.py: the serving loop (tiny, 1b; batch 4, 400 steps, device summaries)
# with the observer on the workers vs 4 observer SMs, beside the bare kernel (`dtrace-mk run`), rounds alternated.
# 111 (new): the serving bench's findings and collector dumps (fault-free jobs said `verdict fault` in 110).
# 112 (new): the reload drained in batches (ffbd90d, obs_first_look): the workers' serving findings, then 108 -- exact, neutral,
# the rotation artefact unchanged: reverted (hooks.md "Session 46").  113 (run inline, then removed): parked
# workers loading new tables at the gate before the grant (57962b1) -- exact (7 + 36 passed), the findings
# unchanged: reverted too.  hooks.md "Session 46" says what is known of the artefact.  Next: 114 (new) --
# bench/serve.py workers vs workers:w64 (serve --summary-window 64: a quarter of the rotations; does tiny serve
# faster, do its findings go?); 81 on the x2 kind; 104 on an H200.
# Session 47 (ran 115 and 116 at a66c5f7, whose default build had the poller; it is opt-in since, -DDTMK_DRAIN_POLL):
# 115 (new) -- the drain's poller (warp 1 polls the awaited event while warp 0 drains; FLAG_OBS_DELAY):
# test_obs_ring.py (its new stamp test), then the serving bench's findings (workers, tiny and 1b, dumps).
# 116 (new): the serving bench, .snap/base.tar's tree (the commit before the poller) and this one alternated,
# three rounds each (1b, tiny; workers; dumps): findings and us/step side by side (now 118 does it in one tree).
# 117 (new): tools/dispatch_probe.py on 1b: the default (no poller) / -DDTMK_DRAIN_POLL (the relaxed poller) /
# + -DDTMK_DRAIN_POLL_ACQ (a66c5f7's acquire poller), alternated: dispatch waits task by task.
# 118 (new, not run: no machine was lent after 116): the poller's serving A/B in one tree -- bench/serve.py configs
# workers / workers+DTMK_DRAIN_POLL / +DTMK_DRAIN_POLL_ACQ (serve --kernel-define), then its stamp test and device
# summaries' tests.  Next session: 118 first, then 117 if 1b's mlp_down dispatch waits still grow with the poller.
# Session 49 ran 122, 121, 123 and 124 (H100s): the gate poller stays opt-in; attach stamps read through a stale
# clock pairing (LiveSession.start re-pairs since).  Next session: 126 (the re-pairing: the attach test's bound,
# 1b's attach figures), then 125 (plan 104's table, best on an H200); 81 when the x2 kind is lent.
# Session 51 ran 129 (its benches timed out: ~2 min of builds and links before round 1) and then its three sets at
# reps 2-3 (one H100): pinned observers' rounds agree within +-0.3%; the sets read +6.35..+9.51% hot.  Next session:
# 130 (eight observer sets surveyed in one process, the GPC probe first), 131 (the observers' SMs calibrated:
# megakernel/obs_place.py's GPU test, top, the hook table); 81 when the x2 kind is lent.
# Session 55 ran 144 (no flush variant under defer16B).  145 (new): where the default hook build's off cost sits --
# bench/hooks.py --offpath, the measurement builds offxw / offxr / offxall (DTMK_OFFX: the per-task path's
# "observing?" gates constant 0 in wait_event / run_task / everywhere) beside default and no-hooks, twice.
# 146 (new): -DDTMK_OFF_COPY=1 / =3 (wait_event / and run_task in two copies, chosen per task by the CTA) in the
# off-path table beside offxw, twice, then its exactness (test_hot_attach.py -k offcopy: default and obs-SM builds).
# 147: dropped in session 56 (-DDTMK_OFF_COPY is measurement only, not with the observer SM).
# 148 (new): plan 146 cut short (offcopyw beside offxw once; the copies' attach / detach and every-task tests).
# Session 56 ran 146: offcopyw saved ~0.3 of ~1.9 points (offxw all of them).  149 (new): is the off cost the
# code's layout?  -DDTMK_WAIT_PAD=N (~12 x N never-executed instructions in wait_event: every function after it
# moves) in the no-hook and hook builds (pad14 / pad40 / pad94) and in offxw (offxwpad14 / offxwpad40), twice.
# 150 (new): the default hook build with the drain poller's event stored before the wait's first acquire (its old
# place reloaded `target` through L2 after the acquire's L1 invalidation): off beside offxw and polllate (the old
# place, -DDTMK_POLL_STORE_LATE) and pollfence (relaxed polls, one fence: the poll loop's spill reloads hit L1),
# twice; the default build's hot attach tests and the drain poller's.
# Session 56 ran 150: no change (default +1.89 / +1.88%, polllate +2.58 / +1.91%, offxw -0.30 / +0.44%; pollfence
# worse).  151 (new): wait_event's hook sites apart (-DDTMK_OFFX=8 / 16 / 32: the first look's call, the drains
# after the barrier, the spin loop's and the rest) beside offxw, and pollburst (-DDTMK_POLL_BURST: the spin
# loop's polls up to the 16th as an inner loop with its state in shared memory -- no spill reload through L2 per
# poll -- in the no-hook and the hook build), twice.
# 152 (new, after 151 if pollburst helps): the issue's table (plan 143's command) with the CLI's observer build
# and its POLL_BURST twin side by side (obssm4fold / obssm4fold_pb): off, hot and compiled summaries.
# Session 57 ran 151: no one site carries the cost (offxlook +2.64 / +2.64%, offxsync +1.45 / +1.25%, offxspin
# +1.07 / +0.49%, offxw -0.29 / -0.59%, default +1.69 / +1.80%); pollburst slowed the no-hook build (+0.59 /
# +0.73%).  149-152 are gone with their measurement defines (WAIT_PAD, POLL_STORE_LATE, POLL_BURST; record:
# docs/results/hooks.md "Session 56" / "Session 57").  153 (new): the off builds' executed SASS under ncu
# (SourceCounters, one launch each): is the off cost the instruction footprint?
# Session 57 ran 153 (with the trace on).  Session 58 ran 157 (153's counters on bench/hooks.py --offpath's own
# launches, trace off: the GPC caches' L2 instruction fetches follow the off cost) and 156 (-DDTMK_DIET: the task
# bodies' helpers as calls, +7% slower); 154-157 are gone with DTMK_DIET (record: docs/results/hooks.md "Session
# 58").  158 (new): the workers' hot functions first in the cubin (-DDTMK_HOT_FIRST), timed and under ncu.
# Session 59 ran 158 (fetches 226 K -> 148 K per launch, off cost down ~0.3% only).  159 (new): the hot-first
# layout with offxw's wait (hfxw) and offcopyw's two copies (hfcopyw).
# Session 59 ran 159 (H100: hfxw -0.1%, hfcopyw +1.3%, hotfirst +2.1% over the hot-first no-hook build).
# 160 (new): 159's builds under ncu (SourceCounters, local-memory sectors).  Session 59 ran 160 (hfcopyw's
# executed SASS that of hfxw; its GCC fetched 25% more).  161 (new): hfcopyw's observing copy out of the hot region.
# Session 59 ran 161 (hfcopyw +0.35 / +0.56 / +0.55 / +0.49% over the hot-first no-hook build).  162 (new): its GPU tests.
# Session 60 made hfcopyw the default (hot-first layout in every build, the wait's two copies in the hook
# build): plans before 163 that name "the default" measured the old one (now bench variant legacy, defines
# DTMK_NO_HOT_FIRST+DTMK_ONE_WAIT); 162 runs test_hot_attach's default now (-k default; onewait the old wait).
# 163 (new): the whole GPU suite on the new default, in ranges, and the hook table beside legacy.
# 164 (new): copyinwait (copy 0 calls copy 1: one wait call in the main loop, whose entry spills less)
# beside hfxw (the wait without hook code) and the default, twice swapped.
# (the kernel cache lives in the home directory: calls 2-4 reuse call 1's builds while the
# machine stays warm; a fresh machine compiles again)
set -u
R=DTMK_ROPE_IN_ATTN
OBS="DTMK_OBS_SM DTMK_OBS_SM+$R DTMK_OBS_SM+DTMK_OSQ_STATS DTMK_OBS_SM+DTMK_OSQ_STATS+$R"
OBS1="DTMK_OBS_SM+DTMK_OBS_SM_WARPS=1 DTMK_OBS_SM+DTMK_OBS_SM_WARPS=1+$R DTMK_OBS_SM+DTMK_OSQ_PUSH_INLINE"
OBS1="$OBS1 DTMK_OBS_SM+DTMK_OSQ_PUSH_INLINE+$R"
BASE="'' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R"
HO="DTMK_HANDOFF+DTMK_SM_WORKER DTMK_NO_HOOKS+DTMK_SM_WORKER DTMK_HANDOFF+DTMK_SM_WORKER+$R"
HO="$HO DTMK_NO_HOOKS+DTMK_SM_WORKER+$R DTMK_OBS_SM+DTMK_HANDOFF+DTMK_SM_WORKER"
HO="$HO DTMK_OBS_SM+DTMK_HANDOFF+DTMK_SM_WORKER+$R"
L4="DTMK_OBS_SM+DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB"   # four observer SMs, the lazy publish
PYT="timeout 170 python3 -m pytest -q -p no:cacheprovider"
L=$L4+DTMK_OSQ_DEFER=16                              # the CLI's observer build (plans 59-67)
# the pinned hook table's builds (bench/hooks.py --placement sorted|paired: every build -DDTMK_SM_WORKER; plans
# 129-131): default, no hooks, the CLI's observer build, no hooks padded to the hook build's shared memory
S=DTMK_SM_WORKER; P=DTMK_NO_HOOKS+DTMK_SMEM_PAD=25808
PINNED="$S+$R DTMK_NO_HOOKS+$S+$R $L+$S+$R $P+$S+$R"
# Nsight Compute (plans 63-68): found when the stage runs; ncu_run T ARGS REP: profile the megakernel's launches
# (timeout T, ncu ARGS) into $NCU_DIR/REP.ncu-rep, running the command that follows; ncu_src REP: its SASS source
# page as CSV; NCU_PACK: the stage that ships $NCU_DIR's text files back as one file
NCU='$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | tail -1)'
NCU_DIR=/tmp/ncu
ncu_run() { echo "timeout $1 $NCU --kernel-name regex:dtmk_megakernel --launch-count ${4:-6} --clock-control none $2 -f -o $NCU_DIR/$3"; }
ncu_src() { echo "$NCU -i $NCU_DIR/$1.ncu-rep --page source --csv --print-source sass > $NCU_DIR/$1_sass.csv"; }
NCU_PACK="cd $NCU_DIR && rm -f *.ncu-rep && ls -la && { gzip -f *_sass.csv 2>/dev/null; tar czf ${OUT:-/tmp/out}/ncu.tgz .; }"
# ICC_METRICS: the instruction caches' counters plans 153 and 158 take (--metrics; tools/ncu_footprint.py --raw reads them)
ICC_METRICS=gpu__time_duration.sum,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
for m in sm__icc_requests sm__icc_requests_lookup_miss gcc__cache_requests_type_instruction \
         gcc__cache_requests_type_instruction_lookup_miss gcc__gcc2xbar_requests_type_instruction; do
  ICC_METRICS="$ICC_METRICS,$m.sum,$m.max"; done
# HF_BUILDS: plans 159-161's builds -- default and no hooks, each in both layouts (-DDTMK_HOT_FIRST), and the
# hot-first layout with offxw's wait and with OFF_COPY's two copies
HF_BUILDS="$S+$R DTMK_NO_HOOKS+$S+$R DTMK_HOT_FIRST+$S+$R DTMK_HOT_FIRST+DTMK_NO_HOOKS+$S+$R DTMK_HOT_FIRST+DTMK_OFFX=1+$S+$R DTMK_HOT_FIRST+DTMK_OFF_COPY=1+$S+$R"
DEFER_EXACT="$PYT tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4defer -rA"
CLI_SM_EXACT="$PYT tests/gpu/test_top_gpu.py tests/gpu/test_resident_gpu.py -k 'sm and (top or serve)' -rA"
split1b() { echo "timeout ${4:-130} python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 --base $1 --variants $2 --out ${OUT:-/tmp/out}/$3"; }
# pytv T ARGS: verbose, so a cut run shows what passed; each ARG quoted (%q) for the stage's bash -c (a -k
# expression with spaces stays one argument)
pytv() { echo "timeout $1 python3 -m pytest -v -p no:cacheprovider$(printf ' %q' "${@:2}") -rA"; }
# osplit T REPS VARIANTS DIR: bench/obs_split.py on 1b beside the CLI's build (lazydefer16), four observer
# SMs on 0,1,16,88 (top's calibration on three H100 starts), workers in SM id order (plans 139-144)
# offpath T REPS VARIANTS DIR: bench/hooks.py --offpath (1b, workers pinned in SM id order) of those build variants (plans 145-146)
offpath() { echo "timeout $1 python3 bench/hooks.py --offpath --presets 1b --reps $2 --placement sorted --variants $3 --out ${OUT:-/tmp/out}/$4"; }
osplit() { echo "timeout $1 python3 bench/obs_split.py --presets 1b --reps $2 --sms 4 --place --observer-smids 0,1,16,88 --base lazydefer16 --variants $3 --out ${OUT:-/tmp/out}/$4"; }
# serve_b T ARGS: bench/serve.py (tiny and 1b, batch 4, 400 steps) into $OUT/serve; SERVE_PRE: its builds
serve_b() { echo "timeout $1 python3 bench/serve.py --presets tiny,1b --steps 400 ${*:2} --out ${OUT:-/tmp/out}/serve"; }
SERVE_PRE="timeout 150 python3 tools/precompile.py '' DTMK_NO_HOOKS $L $R DTMK_NO_HOOKS+$R $L+$R"
# (--dump's collector inputs as one file: a device call brings back only a few files)
DUMPS_PACK="cd ${OUT:-/tmp/out}/serve && tar czf dumps.tgz dumps && rm -rf dumps"
# gpc_lp DEFS NAME [T] [CONFIGS]: bench/level_profile.py's per-GPC table of 1b, workers pinned in SM id order, the
# observers on SMs 0-3 (plan 66's form); gpc_builds X...: the stages precompile + gpc_probe + gpc_lp of $L+X, each X
gpc_lp() { echo "timeout ${3:-110} python3 bench/level_profile.py --preset 1b --steps 16 --reps 2 --configs ${4:-off,summary} --workers --gpcs ${OUT:-/tmp/out}/gpc/gpc_probe.json --defines $1 --place --observer-smids 0,1,2,3 --out ${OUT:-/tmp/out}/$2"; }
gpc_builds() {
  local pre="python3 tools/precompile.py" x
  for x in "$@"; do pre="$pre $L+$x+DTMK_SM_WORKER+$R"; done
  stages=("$pre" "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc")
  for x in "$@"; do stages+=("$(gpc_lp $L+$x ${x//[+=]/_})"); done
}
hooks1b() { echo "timeout 480 python3 bench/hooks.py --presets 1b --reps 2 --variants $1 --out ${OUT:-/tmp/out}"; }
case "${1:-}" in
  1) exec tools/gpu_session.sh "python3 tools/precompile.py $BASE $OBS $OBS1 $HO" \
       "timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py -k obssm" \
       "timeout 200 python3 tools/obs_sm_probe.py --presets tiny,1b --reps 5 --out ${OUT:-/tmp/out}" ;;
  2) exec tools/gpu_session.sh \
       "timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_handoff_gpu.py tests/gpu/test_placement_gpu.py" \
       "timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_compiled_tier.py -k observer_sm" ;;
  3) exec tools/gpu_session.sh \
       "timeout 400 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_resident_gpu.py tests/gpu/test_top_gpu.py tests/gpu/test_run_cli_gpu.py" ;;
  4) exec tools/gpu_session.sh \
       "timeout 560 python3 bench/hooks.py --presets tiny,1b --reps 2 --variants obssm,obssm1,obssmin --out ${OUT:-/tmp/out}" ;;
  5) M3="DTMK_OBS_SM+DTMK_OBS_SMS=3"; M4="DTMK_OBS_SM+DTMK_OBS_SMS=4"
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py $BASE $M3 $M3+$R $M3+DTMK_OSQ_STATS $M3+DTMK_OSQ_STATS+$R $M4+DTMK_OSQ_STATS $M4+DTMK_OSQ_STATS+$R" \
       "timeout 250 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py -k obssm3" \
       "timeout 120 python3 tools/obs_sm_probe.py --presets 1b,tiny --reps 3 --defines DTMK_OBS_SMS=3 --out ${OUT:-/tmp/out}" \
       "timeout 120 python3 tools/obs_sm_probe.py --presets 1b --reps 3 --defines DTMK_OBS_SMS=4 --out ${OUT:-/tmp/out}" ;;
  6) exec tools/gpu_session.sh \
       "timeout 560 python3 bench/hooks.py --presets 1b,tiny --reps 2 --variants obssm3,obssm4 --out ${OUT:-/tmp/out}" ;;
  7) exec tools/gpu_session.sh \
       "timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_handoff_gpu.py tests/gpu/test_resident_gpu.py -k obssm3" \
       "timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_compiled_tier.py -k observer_sm" ;;
  8) M4="DTMK_OBS_SM+DTMK_OBS_SMS=4"
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py $BASE $M4+DTMK_OSQ_LAZY_PUB $M4+DTMK_OSQ_LAZY_PUB+$R" \
       "timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4lazy" \
       "timeout 330 python3 bench/obs_split.py --presets 1b --reps 5 --sms 4 --out ${OUT:-/tmp/out}" ;;
  9) exec tools/gpu_session.sh \
       "timeout 560 python3 bench/hooks.py --presets 1b,tiny --reps 2 --variants obssm4,obssm4lazy --out ${OUT:-/tmp/out}" ;;
  10) exec tools/gpu_session.sh \
       "timeout 400 python3 bench/obs_split.py --presets 1b --reps 5 --sms 4 --variants base,lazy,discard,novm,nolow,novmnolow,lazynolow,lazydiscard,lazycount1,count1 --out ${OUT:-/tmp/out}" \
       "timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_top_gpu.py" ;;
  11) exec tools/gpu_session.sh \
       "timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_resident_gpu.py -k serve_on_one_gpu" \
       "timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_top_gpu.py" \
       "timeout 250 python3 bench/obs_split.py --presets 1b --reps 5 --sms 4 --variants base,discard,atoms8s,loads16s,novm,count1 --out ${OUT:-/tmp/out}" \
       "timeout 150 python3 bench/level_profile.py --preset 1b --steps 16 --configs nohooks,off,summary --defines $L4 --out ${OUT:-/tmp/out}" ;;
  12) M4="DTMK_OBS_SM+DTMK_OBS_SMS=4"
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py DTMK_NO_HOOKS $M4+DTMK_OSQ_LAZY_PUB $M4+DTMK_OSQ_LAZY_PUB+$R $M4 $M4+DTMK_OSQ_AREA_CTL $M4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_AREA_CTL" \
       "timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4lazy" \
       "timeout 200 python3 bench/obs_split.py --presets 1b --reps 5 --sms 4 --variants base,areactl,lazy,lazyareactl --out ${OUT:-/tmp/out}" ;;
  13) exec tools/gpu_session.sh \
       "python3 tools/precompile.py DTMK_NO_HOOKS+$R DTMK_OBS_SM DTMK_OBS_SM+$R DTMK_OBS_SM+DTMK_OBS_SMS=3 DTMK_OBS_SM+DTMK_OBS_SMS=3+$R DTMK_OBS_SM+DTMK_HANDOFF+DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R $L4+$R $L4+DTMK_OSQ_DISCARD+$R $L4+DTMK_OSQ_NOVM+$R" \
       "timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py tests/gpu/test_handoff_gpu.py tests/gpu/test_resident_gpu.py -k 'obssm and not lazy'" \
       "timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_compiled_tier.py -k observer_sm" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --defines $L4+DTMK_OSQ_DISCARD --out ${OUT:-/tmp/out}/discard" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs nohooks,off,summary --defines $L4+DTMK_OSQ_NOVM --out ${OUT:-/tmp/out}/novm" ;;
  14) exec tools/gpu_session.sh \
       "timeout 300 python3 bench/obs_split.py --presets 1b --reps 7 --sms 4 --variants base,lazy,lazyinline,lazydiscard,lazynovm,nopush --out ${OUT:-/tmp/out}" ;;
  15) exec tools/gpu_session.sh \
       "nvidia-smi -q -d POWER,CLOCK,PERFORMANCE" \
       "timeout 300 python3 bench/obs_split.py --presets 1b --reps 3 --sms 4 --variants base,lazy,lazydiscard,lazynovm,nopush --clocks 2.5 --out ${OUT:-/tmp/out}" ;;
  16) exec tools/gpu_session.sh \
       "timeout 400 python3 bench/obs_split.py --presets 1b --reps 7 --sms 4 --variants base,lazy,lazynovm,lazynomaps,lazydiscard --out ${OUT:-/tmp/out}" ;;
  17) exec tools/gpu_session.sh \
       "timeout 200 python3 bench/obs_split.py --presets 1b --reps 5 --sms 4 --variants base,lazy,lazynomaps --out ${OUT:-/tmp/out}" \
       "timeout 220 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_device_vm.py tests/gpu/test_map_churn_gpu.py" \
       "timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py -k obssm4lazy" ;;
  18) exec tools/gpu_session.sh \
       "python3 tools/precompile.py DTMK_NO_HOOKS+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R $L4+$R $L4+DTMK_OSQ_DESC+$R $L4+DTMK_OSQ_DESC" \
       "timeout 110 python3 bench/obs_split.py --presets 1b --reps 4 --sms 4 --variants base,lazy,lazydesc --out ${OUT:-/tmp/out}" \
       "timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py -k obssm4desc" ;;
  19) exec tools/gpu_session.sh \
       "timeout 150 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DESC --out ${OUT:-/tmp/out}" \
       "timeout 300 python3 bench/obs_split.py --presets 1b --reps 7 --sms 4 --variants base,lazy,lazydesc,lazydescnoflush,lazynomaps,lazynovm --out ${OUT:-/tmp/out}" ;;
  20) P=DTMK_OBS_PROF
     D="$L4+DTMK_OSQ_DESC+DTMK_OSQ_NOFLUSH"
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py $P+$L4+$R $P+$L4+DTMK_OSQ_NOMAPS+$R $P+$D+$R DTMK_NO_HOOKS+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R $L4+$R $L4+DTMK_OSQ_NORAISE+$R $L4+DTMK_OSQ_NOMAPS+$R $D+$R $L4+DTMK_OSQ_DESC+$R" \
       "timeout 300 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 --variants lazy,lazynoraise,lazynomaps,lazydescnoflush,lazydesc --out ${OUT:-/tmp/out}" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $L4 --out ${OUT:-/tmp/out}/lazy" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $L4+DTMK_OSQ_NOMAPS --out ${OUT:-/tmp/out}/nomaps" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $D --out ${OUT:-/tmp/out}/descnoflush" ;;
  21) P=DTMK_OBS_PROF; N="$L4+DTMK_OSQ_NOMAPS"
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py $P+$L4+$R $P+$N+$R DTMK_NO_HOOKS+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R $L4+$R $N+$R $N+DTMK_OSQ_BURN=2000+$R $N+DTMK_OSQ_BURN=6000+$R $P+$R" \
       "timeout 300 python3 bench/obs_split.py --presets 1b --reps 7 --sms 4 --variants lazy,lazynomaps,nomapsburn2k,nomapsburn6k --out ${OUT:-/tmp/out}" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $L4 --out ${OUT:-/tmp/out}/lazy" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $N --out ${OUT:-/tmp/out}/nomaps" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --out ${OUT:-/tmp/out}/default" ;;
  22|23) echo "plans 22-23 measured -DDTMK_OSQ_PUSH_LDS / -DDTMK_W_LDS (97dc22e, 5d19994): the push's LDS form is the" \
       "observer-SM build's own since session 19, the defines are gone; see docs/results/hooks.md" >&2; exit 2 ;;
  24) PS=DTMK_PLAN_SMEM=96; NH=DTMK_NO_HOOKS
     exec tools/gpu_session.sh \
       "python3 tools/precompile.py '' $R $PS $PS+$R $PS+$NH $PS+$NH+$R DTMK_PLAN_SMEM=1 DTMK_PLAN_SMEM=1+$R $NH+$R" \
       "timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_megakernel_variants_gpu.py -k plansmem -rfE" \
       "timeout 250 python3 bench/megakernel.py --presets 1b --steps 16 --reps 7 --quick --no-old --variants nohooks=$NH,nhplan=$NH+$PS,plan=$PS --out ${OUT:-/tmp/out}" ;;
  25) exec tools/gpu_session.sh \
       "python3 tools/precompile.py DTMK_OBS_SM DTMK_OBS_SM+$R DTMK_OBS_SM+DTMK_OBS_SMS=3+$R $L4 $L4+$R $L4+DTMK_OSQ_DESC+$R DTMK_NO_HOOKS+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R" \
       "timeout 120 python3 bench/obs_split.py --presets 1b --reps 7 --sms 4 --variants lazy,lazyB --out ${OUT:-/tmp/out}" \
       "timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py tests/gpu/test_handoff_gpu.py -k 'obssm and not obssm3' -rfE" \
       "timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_compiled_tier.py -k observer_sm -rfE" ;;
  27|28) echo "plans 27-28 measured -DDTMK_POST_SMEM (553c7e5, 38461ff): thread 0's post-body operands in shared" \
       "memory are every build's since session 20, the define is gone; see docs/results/megakernel.md" >&2; exit 2 ;;
  29) exec tools/gpu_session.sh "python3 tools/precompile.py $BASE $OBS $HO $L4 $L4+$R" \
       "timeout 270 python3 tools/gpu_suite.py 1/2 -x" "timeout 270 python3 tools/gpu_suite.py 2/2 -x" ;;
  37) echo "plan 37 measured -DDTMK_WS_REL_MBAR / _SKIP / _REL_NOFENCE (567bf41): bit-equal, no gain (0.99-1.01x);" \
       "the defines are gone, see docs/dev/megakernel_speed.md \"Session 24\"" >&2; exit 2 ;;
  38) DF=DTMK_OSQ_DEFER=4; D1=DTMK_OSQ_DEFER=1
     exec tools/gpu_session.sh "python3 tools/precompile.py $L4 $L4+$R $L4+$DF $L4+$DF+$R $L4+$D1+$R DTMK_OBS_PROF+$L4+$DF+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R DTMK_NO_HOOKS+$R" \
       "$DEFER_EXACT" "$(split1b lazy lazyB,lazydefer,lazydefer1 s1)" \
       "timeout 70 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $L4+$DF --out ${OUT:-/tmp/out}/defer" \
       "$(split1b lazy lazydefer,lazydefer1,lazyB s2)" ;;
  39) exec tools/gpu_session.sh "python3 tools/precompile.py $L4+DTMK_OSQ_DEFER=16 $L4+DTMK_OSQ_DEFER=16+$R $L4+$R '' $R DTMK_NO_HOOKS+$R" \
       "$CLI_SM_EXACT" "$(hooks1b obssm4lazy,obssm4defer)" ;;
  40) echo "plan 40 measured -DDTMK_OSQ_SCAN_NS (observers pause after each round): no gain; the define is" \
       "gone, see docs/results/hooks.md session 25" >&2; exit 2 ;;
  41) exec tools/gpu_session.sh "python3 tools/precompile.py $L4+DTMK_OSQ_DEFER=16 $L4+DTMK_OSQ_DEFER=16+$R $L4+DTMK_OSQ_DEFER=4+$R DTMK_OBS_SM+DTMK_OBS_SMS=4+$R DTMK_NO_HOOKS+$R" \
       "$DEFER_EXACT" "$CLI_SM_EXACT" "$(split1b lazydefer lazydefer16,deferB s1)" ;;
  42) exec tools/gpu_session.sh "$(hooks1b obssm4defer)" ;;
  43) exec tools/gpu_session.sh "$(hooks1b obssm4defer4,obssm4defer)" ;;
  44) D=$L4+DTMK_OSQ_DEFER=16; N=$D+DTMK_OSQ_NOMAPS
     prof() { echo "timeout 90 python3 bench/level_profile.py --preset 1b --steps 16 --configs off,summary --prof --defines $1 --out ${OUT:-/tmp/out}/$2"; }
     exec tools/gpu_session.sh "python3 tools/precompile.py DTMK_OBS_PROF+$D+$R DTMK_OBS_PROF+$N+$R" \
       "$(prof $D defer16)" "$(prof $N nomaps)" "$(prof $D defer16b)" "$(prof $N nomapsb)" ;;
  45) exec tools/gpu_session.sh "$(split1b lazydefer16 spread16,defer16B s1)" "$(split1b lazydefer16 defer16B,spread16 s2)" ;;
  46) echo "plan 46 measured -DDTMK_MAP_PROBE_RELAXED (the hash probes' state loaded relaxed): no gain; the" \
       "define is gone, see docs/results/hooks.md session 26" >&2; exit 2 ;;
  47) placed() { echo "timeout 200 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 --place $2 --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/$1"; }
     exec tools/gpu_session.sh "$(placed last '')" "$(placed odd '--observer-smids 1,3,5,7')" "$(placed first '--observer-smids 0,1,2,3')" \
       "$(placed odd2 '--observer-smids 1,3,5,7')" "$(placed last2 '')" ;;
  48) placed() { echo "timeout 200 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 --place --worker-order natural $2 --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/$1"; }
     exec tools/gpu_session.sh "$(split1b lazydefer16 nomaps16,defer16B free)" "$(placed nat '')" "$(placed natfirst '--observer-smids 0,1,2,3')" \
       "$(placed nat2 '')" "$(placed natfirst2 '--observer-smids 0,1,2,3')" ;;
  49) exec tools/gpu_session.sh "$(split1b lazydefer16 nomaps16,nomaps16pages4,nomaps16icode,nomaps16icodeL s1 240)" \
       "$(split1b lazydefer16 nomaps16icodeL,nomaps16icode,nomaps16pages4,nomaps16 s2 240)" ;;
  50) D=DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16
     probe() { echo "timeout 170 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines $1 --out ${OUT:-/tmp/out}/$2"; }
     exec tools/gpu_session.sh "$(probe $D d16)" "$(probe $D+DTMK_OSQ_NOMAPS nomaps)" "$(probe $D+DTMK_OSQ_NOMAPS+DTMK_OSQ_ICODE=256 icode)" ;;
  51) exec tools/gpu_session.sh "timeout 150 python3 bench/obs_split.py --presets 1b --reps 7 --sms 6 --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/sms6" ;;
  52) D=$L4+DTMK_OSQ_DEFER=16
     exec tools/gpu_session.sh "python3 tools/precompile.py $D+DTMK_OSQ_MULTI=4 $D+DTMK_OSQ_MULTI=4+$R $D+DTMK_OSQ_MULTI=2+$R $D+DTMK_OSQ_MULTI=8+$R $D+DTMK_OSQ_MULTI=4+DTMK_OSQ_NOMAPS+$R $D+$R $D+DTMK_OSQ_NOMAPS+$R DTMK_NO_HOOKS+$R" \
       "$PYT tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4multi -rA" \
       "$(split1b lazydefer16 multi2,multi4,multi8,nomaps16,multi4nomaps s1 220)" ;;
  56) V=nomaps16,nomaps16atoms8s,nomaps16loads16s,defer16B
     exec tools/gpu_session.sh "$(split1b lazydefer16 $V s1 200)" "$(split1b lazydefer16 defer16B,nomaps16loads16s,nomaps16atoms8s,nomaps16 s2 150)" ;;
  57) P="--place --observer-smids 0,1,2,3"; I=$(seq -s, 4 15)
     exec tools/gpu_session.sh "timeout 240 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 $P --idle-smids $I --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/idle" \
       "timeout 200 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 $P --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/busy" ;;
  58) P="--place --observer-smids 0,1,2,3"; N=$(seq -s, 4 15); F=$(seq -s, 120 131)
     s() { echo "timeout 200 python3 bench/obs_split.py --presets 1b --reps 9 --sms 4 $P --idle-smids $1 --base lazydefer16 --variants nomaps16,defer16B --out ${OUT:-/tmp/out}/$2"; }
     exec tools/gpu_session.sh "$(s $F far)" "$(s $N near)" "$(s $F far2)" ;;
  59) N=$(seq -s, 4 15); F=$(seq -s, 120 131)
     w() { echo "timeout 240 python3 bench/level_profile.py --preset 1b --steps 16 --reps 3 --configs nohooks,off,summary --workers --defines $1 --place --observer-smids 0,1,2,3 --idle-smids $2 --out ${OUT:-/tmp/out}/$3"; }
     exec tools/gpu_session.sh "$(w $L $F far)" "$(w $L $N near)" "$(w $L+DTMK_OSQ_NOMAPS $N nearnomaps)" "$(w $L+DTMK_OSQ_NOMAPS $F farnomaps)" ;;
  60) w() { echo "timeout 200 python3 bench/level_profile.py --preset 1b --steps 16 --reps 3 --configs off,summary --workers --defines $L --place --observer-smids $1 --out ${OUT:-/tmp/out}/$2"; }
     exec tools/gpu_session.sh "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc" "$(w 0,1,2,3 o0)" "$(w 16,17,18,19 o16)" "$(w 64,65,66,67 o64)" \
       "$(w '$(python3 tools/gpc_probe.py --from '"${OUT:-/tmp/out}"'/gpc/gpc_probe.json --spread 4)' spread)" "$(w 0,1,2,3 o0b)" ;;
  61) D=DTMK_OSQ_DISCARD; S=DTMK_OSQ_SCATTER
     XS="$D $D+DTMK_OSQ_BURN=2000 $D+DTMK_OSQ_ATOMS=8+$S $D+DTMK_OSQ_LOADS=16+$S DTMK_OSQ_NOMAPS DTMK_OSQ_NOMAPS+DTMK_OSQ_ICODE=64"
     pre="python3 tools/precompile.py $L+DTMK_SM_WORKER+$R"; for x in $XS; do pre="$pre $L+$x+DTMK_SM_WORKER+$R"; done
     w() { echo "timeout 150 python3 bench/level_profile.py --preset 1b --steps 16 --reps 3 --configs off,summary --workers --defines $1 --place --observer-smids $2 --out ${OUT:-/tmp/out}/$3"; }
     stages=("$pre" "$(w $L 0,1,16,17 onegpc)"); for x in $XS; do stages+=("$(w $L+$x 0,1,2,3 ${x//[+=]/_})"); done
     exec tools/gpu_session.sh "${stages[@]}" ;;
  62) D=DTMK_OSQ_DISCARD
     XS="$D $D+DTMK_OSQ_ICODE=64 $D+DTMK_OSQ_ICODE=256"
     pre="python3 tools/precompile.py $L+DTMK_SM_WORKER+$R"; for x in $XS; do pre="$pre $L+$x+DTMK_SM_WORKER+$R"; done
     w() { echo "timeout 150 python3 bench/level_profile.py --preset 1b --steps 16 --reps 3 --configs off,summary --workers --defines $1 --place --observer-smids 0,1,2,3 --out ${OUT:-/tmp/out}/$2"; }
     stages=("$pre"); for x in $XS; do stages+=("$(w $L+$x ${x//[+=]/_})"); done
     exec tools/gpu_session.sh "${stages[@]}" "$(w $L full)" ;;
  63) O=$NCU_DIR; mkdir -p $O
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs nohooks,off,summary --defines $L --place --observer-smids 0,1,2,3"
     prof() { echo "$(ncu_run $1 "$2" $3) $lp --out $O/$3_lp && $NCU -i $O/$3.ncu-rep --page raw --csv > $O/$3_raw.csv && $NCU -i $O/$3.ncu-rep --page details --csv > $O/$3_details.csv"; }
     exec tools/gpu_session.sh "$NCU --version; $NCU --query-metrics --chip gh100 > $O/metrics.txt 2>&1; grep -ciE 'icc|inst_cache|no_instruction' $O/metrics.txt" \
       "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R" \
       "$(prof 160 '--section WarpStateStats --section InstructionStats --section SchedulerStats --section LaunchStats' ws)" \
       "$(prof 190 '--section SourceCounters --section WarpStateStats' src) && $(ncu_src src)" "$NCU_PACK" ;;
  64) D=DTMK_OSQ_DISCARD; O=$NCU_DIR; mkdir -p $O
     M=gpu__time_duration.sum,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
     for m in sm__icc_requests sm__icc_requests_lookup_miss sm__icc_requests_lookup_miss_tag_miss gcc__cache_requests_type_instruction \
              gcc__cache_requests_type_instruction_lookup_miss gcc__gcc2xbar_requests_type_instruction gcc__cache_requests_type_constant; do
       M="$M,$m.sum,$m.max,$m.min"; done
     prof() { echo "$(ncu_run $1 "--metrics $M" $2) python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --place --observer-smids 0,1,2,3 --out $O/$2_lp $3 && $NCU -i $O/$2.ncu-rep --page raw --csv --print-metric-instances values > $O/$2_raw.csv"; }
     exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R $L+$D+DTMK_SM_WORKER+$R $L+$D+DTMK_OSQ_ICODE=256+DTMK_SM_WORKER+$R" \
       "$(prof 150 base "--configs nohooks,off,summary --defines $L")" "$(prof 100 icode "--configs summary --defines $L+$D+DTMK_OSQ_ICODE=256")" \
       "$(prof 100 discard "--configs summary --defines $L+$D")" "$NCU_PACK" ;;
  65) exec tools/gpu_session.sh "timeout 420 python3 tools/icache_probe.py --out ${OUT:-/tmp/out}/icp" ;;
  66) D=DTMK_OSQ_DISCARD
     XS="$D+DTMK_OSQ_ICODE=96 $D+DTMK_OSQ_ICODE=128 $D+DTMK_OSQ_ICODE=160 $D+DTMK_OSQ_ICODE=192"
     gpc_builds $XS; exec tools/gpu_session.sh "${stages[@]}" ;;
  67) O=$NCU_DIR; mkdir -p $O; E="export DTRACE_MK_LINEINFO=1 PATH=$PATH:/usr/local/cuda/bin;"
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs nohooks,off,summary --defines $L --place --observer-smids 0,1,2,3"
     exec tools/gpu_session.sh "$E python3 tools/precompile.py $L+DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R" \
       "$E $(ncu_run 200 '--section SourceCounters' src) $lp --out $O/src_lp && $(ncu_src src)" \
       "$E python3 tools/ncu_footprint.py $O/src_sass.csv --min 1000,1,10000 --build 0=1b:DTMK_NO_HOOKS+DTMK_SM_WORKER --build 1,2=1b:$L+DTMK_SM_WORKER --diff 1:2 | tee $O/footprint.txt" \
       "$NCU_PACK" ;;
  68) O=$NCU_DIR; mkdir -p $O
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs nohooks,off,summary,summary_cm --place"
     exec tools/gpu_session.sh "python3 tools/precompile.py DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R" \
       "$(ncu_run 240 '--section SourceCounters' src 8) $lp --out $O/src_lp && $(ncu_src src)" \
       "python3 tools/ncu_footprint.py $O/src_sass.csv --min 1000,1,10000 --diff 1:2 | tee $O/footprint.txt" \
       "$NCU_PACK" ;;
  69) O=${OUT:-/tmp/out}; B=/tmp/wb
     w() { echo "timeout 110 python3 $1/bench/level_profile.py --preset 1b --steps 16 --reps 2 --configs off,summary --workers --gpcs $O/gpc/gpc_probe.json --defines $L --place --observer-smids 0,1,2,3 --out $O/$2"; }
     exec tools/gpu_session.sh "rm -rf $B && mkdir -p $B && tar xf .snap/base.tar -C $B && python3 tools/precompile.py $L+DTMK_SM_WORKER+$R && (cd $B && python3 tools/precompile.py $L+DTMK_SM_WORKER+$R)" \
       "timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_device_vm.py" \
       "timeout 60 python3 tools/gpc_probe.py --out $O/gpc" "$(w . new1)" "$(w $B old)" "$(w . new2)" ;;
  70) O=$NCU_DIR; mkdir -p $O; E="export DTRACE_MK_LINEINFO=1 PATH=$PATH:/usr/local/cuda/bin;"
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs off,summary --defines $L --place --observer-smids 0,1,2,3"
     exec tools/gpu_session.sh "$DEFER_EXACT" "$E python3 tools/precompile.py $L+DTMK_SM_WORKER+$R" \
       "$E $(ncu_run 150 '--section SourceCounters' src 4) $lp --out $O/src_lp && $(ncu_src src)" \
       "$E python3 tools/ncu_footprint.py $O/src_sass.csv --min 1000,1,10000 --build 0,1=1b:$L+DTMK_SM_WORKER --diff 0:1 | tee $O/footprint.txt" \
       "$NCU_PACK" ;;
  71) O=${OUT:-/tmp/out}; B=/tmp/wb
     exec tools/gpu_session.sh "rm -rf $B && mkdir -p $B && tar xf .snap/base.tar -C $B" \
       "timeout 100 python3 bench/vm_device.py --quick --out $O/vm_new" "cd $B && timeout 100 python3 bench/vm_device.py --quick --out $O/vm_old" \
       "timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py tests/gpu/test_compiled_tier.py tests/gpu/test_map_churn_gpu.py tests/gpu/test_lang_queries.py tests/gpu/test_obs_ring.py -k 'not obssm4defer' -rA" ;;
  72) O=${OUT:-/tmp/out}; N=$NCU_DIR; mkdir -p $N; E="export DTRACE_MK_LINEINFO=1 PATH=$PATH:/usr/local/cuda/bin;"
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs off,summary --defines $L+DTMK_OSQ_DESC --place --observer-smids 0,1,2,3"
     exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R $L+DTMK_OSQ_DESC+DTMK_SM_WORKER+$R" \
       "timeout 60 python3 tools/gpc_probe.py --out $O/gpc" "$(gpc_lp $L new1)" "$(gpc_lp $L+DTMK_OSQ_DESC desc)" "$(gpc_lp $L new2)" \
       "$E python3 tools/precompile.py $L+DTMK_OSQ_DESC+DTMK_SM_WORKER+$R && $(ncu_run 150 '--section SourceCounters' src 4) $lp --out $N/src_lp && $(ncu_src src)" \
       "$E python3 tools/ncu_footprint.py $N/src_sass.csv --min 1000,1,10000 --build 0,1=1b:$L+DTMK_OSQ_DESC+DTMK_SM_WORKER --diff 0:1 | tee $N/footprint.txt" \
       "$NCU_PACK" ;;
  73) F="tests/gpu/test_megakernel_gpu.py tests/gpu/test_megakernel_variants_gpu.py tests/gpu/test_megakernel_fused_gpu.py tests/gpu/test_handoff_gpu.py tests/gpu/test_placement_gpu.py"
     exec tools/gpu_session.sh "timeout 330 python3 -m pytest -q -p no:cacheprovider $F -rA" \
       "timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hot_attach.py -k 'final_epochs and (obssm4deep or obssm4shallow)' -rA" ;;
  76) F="tests/gpu/test_megakernel_gpu.py tests/gpu/test_megakernel_variants_gpu.py tests/gpu/test_megakernel_fused_gpu.py"
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py --variants" \
       "$(pytv 230 $F)" \
       "$(pytv 200 tests/gpu/test_handoff_gpu.py tests/gpu/test_placement_gpu.py)" ;;
  77) H="tests/gpu/test_resident_gpu.py tests/gpu/test_top_gpu.py tests/gpu/test_run_cli_gpu.py"
     exec tools/gpu_session.sh "$(pytv 240 "'tests/gpu/test_handoff_gpu.py::test_a_monitor_attached_to_a_lean_job_counts_exactly_what_the_hook_grid_ran[1b-obssm3]' tests/gpu/test_placement_gpu.py")" \
       "$(pytv 320 "$H -k 'not obssm4defer'")" ;;
  78) G="tests/gpu/test_launch_gpu.py tests/gpu/test_launch_attach_gpu.py tests/gpu/test_rec_fast_gpu.py tests/gpu/test_attn_staged_gpu.py"
     exec tools/gpu_session.sh "$(pytv 540 $G)" ;;
  79) lp() { gpc_lp $L $1 120 off,null3,summary; }
     exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R" \
       "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc" "$(lp null3a)" "$(lp null3b)" ;;
  80) exec tools/gpu_session.sh "timeout 540 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4defer --out ${OUT:-/tmp/out}" ;;
  82) O=${OUT:-/tmp/out}; N=$NCU_DIR; mkdir -p $N; E="export DTRACE_MK_LINEINFO=1 PATH=$PATH:/usr/local/cuda/bin;"
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs off,null3,summary --defines $L --place --observer-smids 0,1,2,3"
     fp="python3 tools/ncu_footprint.py $N/src_sass.csv --min 1000,1,10000 --build 0,1,2=1b:$L+DTMK_SM_WORKER"
     exec tools/gpu_session.sh "$E python3 tools/precompile.py $L+DTMK_SM_WORKER+$R && $(ncu_run 200 '--section SourceCounters' src 3) $lp --out $N/src_lp && $(ncu_src src)" \
       "$E $fp --diff 0:1 --lines hook_flush,hk_store,obs_sync,osq_observer,dtmk_vm_exec | tee $N/footprint_null3.txt" \
       "$E $fp --diff 1:2 | tee $N/footprint_sum.txt" "$NCU_PACK" ;;
  83) D=DTMK_OSQ_DISCARD+DTMK_OSQ_JCODE=128; K=DTMK_WK_ICODE=48
     gpc_builds $K $D $D+$K; stages[0]="${stages[0]} $L+DTMK_SM_WORKER+$R"
     exec tools/gpu_session.sh "${stages[@]:0:2}" "$(gpc_lp $L base)" "${stages[@]:2}" ;;
  84) I=DTMK_OSQ_IDLE_DRAIN=16; P4="timeout 100 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16"
     exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R $L+$I+DTMK_SM_WORKER+$R" \
       "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc" "$(gpc_lp $L base)" "$(gpc_lp $L+$I idle16)" \
       "$P4 --out ${OUT:-/tmp/out}/probe_base" "$P4+$I --out ${OUT:-/tmp/out}/probe_idle" \
       "timeout 300 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4defer,obssm4idle --out ${OUT:-/tmp/out}" ;;
  85) exec tools/gpu_session.sh "$(pytv 400 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4idle)" ;;
  86) gpc_builds DTMK_OSQ_NOVM DTMK_OSQ_DISCARD; exec tools/gpu_session.sh "${stages[@]}" ;;
  87) gpc_builds DTMK_OSQ_SPLIT; stages[0]="${stages[0]} $L+DTMK_SM_WORKER+$R"
     exec tools/gpu_session.sh "$(pytv 300 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4split)" \
       "${stages[@]:0:2}" "$(gpc_lp $L base)" "${stages[@]:2}" ;;
  89) P4="timeout 120 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16"
     gpc_builds DTMK_OSQ_SPLIT+DTMK_OSQ_NOVM
     exec tools/gpu_session.sh "$P4+DTMK_OSQ_SPLIT --out ${OUT:-/tmp/out}/probe_split" "$P4 --out ${OUT:-/tmp/out}/probe_base" "${stages[@]}" ;;
  88|90) echo "plans 88 and 90 ran the split with -DDTMK_OSQ_DESC at 0a8958d (docs/results/hooks.md session 35: no" \
       "gain, final epochs not advancing while 1b ran); the kernel refuses that combination since: not run" >&2; exit 2 ;;
  91) O=${OUT:-/tmp/out}; B=/tmp/wb
     mb() { echo "timeout 130 python3 $1/bench/megakernel.py --presets 1b --steps 16 --reps 5 --quick --no-old --out $O/$2"; }
     exec tools/gpu_session.sh "rm -rf $B && mkdir -p $B && tar xf .snap/base.tar -C $B && python3 tools/precompile.py $R DTMK_NO_HOOKS+$R && (cd $B && python3 tools/precompile.py $R DTMK_NO_HOOKS+$R)" \
       "$(mb . new1)" "$(mb $B old)" "$(mb . new2)" ;;
  92) F="tests/gpu/test_megakernel_gpu.py tests/gpu/test_megakernel_fused_gpu.py tests/gpu/test_attn_staged_gpu.py tests/gpu/test_megakernel_variants_gpu.py"
     V="timeout 150 python3 bench/megakernel.py --presets 1b --steps 16 --reps 9 --quick --no-old --variants nohooks=DTMK_NO_HOOKS --variant-presets 1b --out ${OUT:-/tmp/out}/rr"
     exec tools/gpu_session.sh "$V" "$(pytv 330 $F)" "$(pytv 240 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4defer)" ;;
  94) exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py --variants" "$(pytv 420 $(cat .snap/var_todo.txt))" ;;
  95) V="timeout 200 python3 bench/megakernel.py --presets 1b --steps 16 --reps 9 --quick --no-old --variant-presets 1b"
     exec tools/gpu_session.sh "$V --variants nst4=DTMK_WS_NST=4,nohooks=DTMK_NO_HOOKS,nohooks4=DTMK_NO_HOOKS+DTMK_WS_NST=4 --out ${OUT:-/tmp/out}/rr" \
       "timeout 400 python3 bench/hooks.py --presets 1b --reps 3 --variants ring4,obssm4defer,obssm4defer_ring4 --out ${OUT:-/tmp/out}" ;;
  96) F="tests/gpu/test_megakernel_gpu.py tests/gpu/test_megakernel_fused_gpu.py tests/gpu/test_attn_staged_gpu.py"
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py --variants $R DTMK_NO_HOOKS+$R" \
       "$(pytv 240 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4defer)" "$(pytv 200 $F)" \
       "$(pytv 200 tests/gpu/test_megakernel_variants_gpu.py)" ;;
  97) P4="timeout 120 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16"
     exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R" "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc" \
       "$(gpc_lp $L base)" "$P4 --out ${OUT:-/tmp/out}/probe" ;;
  93) exec tools/gpu_session.sh "timeout 540 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4defer --out ${OUT:-/tmp/out}" ;;
  98) S=DTMK_WS_STAGE=24576; N=DTMK_NO_HOOKS; O=${OUT:-/tmp/out}
     mb() { echo "timeout $1 python3 bench/megakernel.py --presets 1b --steps 16 --reps $2 --quick --no-old --variant-presets 1b --batch $3 --variants $4 --out $O/$5"; }
     exec tools/gpu_session.sh "timeout 200 python3 tools/precompile.py $R $N+$R $S+$R $N+$S+$R DTMK_WS_NST=4+$S+$R DTMK_WS_NST=2+$R $N+DTMK_WS_NST=2+$R" \
       "$(mb 200 9 1 r3x24=$S,n3x24=$N+$S,nohooks=$N,r4x24=DTMK_WS_NST=4+$S b1)" \
       "$(mb 200 7 4 r3x24=$S,n3x24=$N+$S,nohooks=$N,r2=DTMK_WS_NST=2,n2=$N+DTMK_WS_NST=2 b4)" ;;
  99) exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py $L+$R $L+DTMK_WS_STAGE=24576+$R DTMK_WS_STAGE=24576+$R" \
       "timeout 420 python3 bench/hooks.py --presets 1b --reps 3 --variants ring3x24,obssm4defer,obssm4defer_3x24 --out ${OUT:-/tmp/out}" ;;
  100) P4="timeout 100 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16"
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py $L+$R $L+DTMK_OBS_SM_WARPS=4+$R $L+DTMK_OBS_SM_WARPS=3+$R" \
       "timeout 400 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4defer,obssm4defer_w4,obssm4defer_w3 --out ${OUT:-/tmp/out}" \
       "$P4+DTMK_OBS_SM_WARPS=4 --out ${OUT:-/tmp/out}/probe_w4" "$P4+DTMK_OBS_SM_WARPS=3 --out ${OUT:-/tmp/out}/probe_w3" ;;
  101) exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py '' DTMK_NO_HOOKS $L $R DTMK_NO_HOOKS+$R $L+$R" \
       "timeout 420 python3 bench/hooks.py --presets tiny,1b --reps 3 --variants obssm4defer --out ${OUT:-/tmp/out}" ;;
  102) P="DTMK_HANDOFF+DTMK_SM_WORKER DTMK_NO_HOOKS+DTMK_SM_WORKER DTMK_HANDOFF+DTMK_SM_WORKER+$R DTMK_NO_HOOKS+DTMK_SM_WORKER+$R"
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $P '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R" \
       "timeout 460 python3 bench/handoff.py --presets tiny,1b --reps 5 --instances 3 --out ${OUT:-/tmp/out}" ;;
  103) exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $R $L+$R" "$(pytv 440 tests/gpu/test_compiled_tier.py)" ;;
  107) exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py '' $L" \
       "$(pytv 400 tests/gpu/test_device_summaries_gpu.py -k 'not two_gpus')" ;;
  104) exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R $L+$R $L+DTMK_HASH_LOOK_FAST+$R" \
       "timeout 440 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4fold,obssm4look --out ${OUT:-/tmp/out}" ;;
  105) exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $R $L+$R" \
       "$(pytv 200 tests/gpu/test_device_vm.py tests/gpu/test_map_churn_gpu.py)" \
       "$(pytv 240 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k obssm4defer)" ;;
  106) exec tools/gpu_session.sh "python3 tools/precompile.py $L+DTMK_SM_WORKER+$R" \
       "timeout 60 python3 tools/gpc_probe.py --out ${OUT:-/tmp/out}/gpc" "$(gpc_lp $L cmfold 300 off,summary_cm,summary_cmgen)" ;;
  108) K='not (obssm or recglobal or codesmem or holdeager)'
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' $L" \
       "$(pytv 300 tests/gpu/test_device_summaries_gpu.py -k 'not two_gpus')" \
       "$(pytv 330 tests/gpu/test_resident_gpu.py tests/gpu/test_hot_attach.py -k "$K")" ;;
  110) exec tools/gpu_session.sh "$SERVE_PRE" "$(serve_b 560 --reps 2)" ;;
  111) exec tools/gpu_session.sh "$SERVE_PRE" "$(serve_b 300 --configs workers,sm --reps 3 --dump)" "$DUMPS_PACK" ;;
  112) K='not (obssm or recglobal or codesmem or holdeager)'
     exec tools/gpu_session.sh "$SERVE_PRE" "$(serve_b 200 --configs workers --reps 3 --dump)" "$DUMPS_PACK" \
       "$(pytv 200 tests/gpu/test_device_summaries_gpu.py -k 'not two_gpus')" \
       "$(pytv 200 tests/gpu/test_resident_gpu.py tests/gpu/test_hot_attach.py -k "$K")" ;;
  114) exec tools/gpu_session.sh "$SERVE_PRE" "$(serve_b 400 --configs workers,workers:w64 --reps 3 --dump)" "$DUMPS_PACK" ;;
  116) O=${OUT:-/tmp/out}; B=/tmp/wb; N=$(pwd); OC=$(cat .snap/base_commit 2>/dev/null || echo base); NC=$(cat .snap/commit)
     # sv DIR NAME COMMIT: that tree installed, then one round of the serving bench (1b, tiny; workers; dumps)
     sv() { echo "cd $1 && python3 -m pip install -q --no-deps --no-build-isolation -e . && DTMK_COMMIT=$3 timeout 170 python3 bench/serve.py --presets 1b,tiny --steps 400 --configs workers --reps 1 --dump --out $O/$2"; }
     exec tools/gpu_session.sh "rm -rf $B && mkdir -p $B && tar xf .snap/base.tar -C $B && cd $B && python3 -m pip install -q --no-deps --no-build-isolation -e . && timeout 150 python3 tools/precompile.py '' $R" \
       "$(sv $B old1 $OC)" "$(sv $N new1 $NC)" "$(sv $B old2 $OC)" "$(sv $N new2 $NC)" "$(sv $B old3 $OC)" "$(sv $N new3 $NC)" \
       "cd $O && tar czf ab_dumps.tgz */dumps && rm -rf */dumps && grep -h 'workers:' */serve.log" ;;
  117) O=${OUT:-/tmp/out}
     # dp PRESET DEFINES NAME: tools/dispatch_probe.py (batch 4, summary_tasks.d hot, hooks streamed) of that build
     dp() { echo "timeout 110 python3 tools/dispatch_probe.py --preset $1 --batch 4 --steps 60 --reps 2 --defines '$2' | tee $O/$1_$3.txt"; }
     # (since session 48 the default build is the poller's: '' = poll, DTMK_NO_DRAIN_POLL = off)
     NP=DTMK_NO_DRAIN_POLL; AQ=DTMK_DRAIN_POLL_ACQ
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py $R $NP+$R $AQ+$R" \
       "$(dp 1b $NP off1)" "$(dp 1b '' poll1)" "$(dp 1b $AQ acq1)" \
       "$(dp 1b $NP off2)" "$(dp 1b '' poll2)" "$(dp 1b $AQ acq2)" ;;
  118) DP=DTMK_DRAIN_POLL; DA=$DP+DTMK_DRAIN_POLL_ACQ
     # the poller's serving A/B in one tree (serve --kernel-define): workers / +poll / +poll acquire, 3 rounds,
     # dumps; then its stamp test (both forms) and device summaries' GPU tests (the default build)
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' $R $DP $DP+$R $DA $DA+$R" \
       "$(serve_b 330 --configs workers,workers+$DP,workers+$DA --reps 3 --dump)" \
       "python3 -m dtrace_mk.collectors.replay --shape ${OUT:-/tmp/out}/serve/dumps/*.pkl" "$DUMPS_PACK" \
       "$(pytv 60 tests/gpu/test_obs_ring.py -k drain_poller)" \
       "$(pytv 200 tests/gpu/test_device_summaries_gpu.py -k 'not two_gpus')" ;;
  175) # session 66 (static): tiny's off cost (+5.31% on the H200, 1b's +0.28%) -- is it the layout again?  tiny's
     # task functions (standard lowering: op_proj, op_gate_up, op_rmsnorm, op_rope_kv, op_attn, mv_row_nl) lie
     # among the cold ones, in the hook build between hook_event / the VM / obs_sync (its per-step code spans
     # ~390 KB there, ~250 KB without hooks).  -DDTMK_HOT_TINY moves them after the hot region in both builds
     # (bench variant hottiny); --offpath on tiny and 1b, twice (~4 min).  Adopt into the hot-first default only
     # if tiny's off falls and 1b's does not rise.
     P2="DTMK_SM_WORKER DTMK_NO_HOOKS+DTMK_SM_WORKER DTMK_HOT_TINY+DTMK_SM_WORKER DTMK_NO_HOOKS+DTMK_HOT_TINY+DTMK_SM_WORKER"
     tw() { echo "timeout 170 python3 bench/hooks.py --offpath --presets tiny,1b --reps 10 --placement sorted --variants hottiny --out ${OUT:-/tmp/out}/$1"; }
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $P2 $S+$R DTMK_NO_HOOKS+$S+$R DTMK_HOT_TINY+$S+$R DTMK_NO_HOOKS+DTMK_HOT_TINY+$S+$R" \
       "$(tw a)" "$(tw b)" ;;
  174) # session 66: the sim's timing table (dtrace_mk/megakernel/data/cost_table.json) is session 5's (2026-11-30):
     # the sim puts 1b's step at 1377 us where the H200 ran 1122 (hooks.md "Session 65").  One bench/megakernel.py
     # run: the step table (now with the sim's step beside the GPU's: `sim us`, `sim/mk`) and --costs for the three
     # presets, 1b as built (its fused lowering); then, here: bench/megakernel.py --from-json OUT/mk/bench.json
     # --write-cost-table dtrace_mk/megakernel/data/cost_table.json --commit SHA (the plans do not move:
     # tests/megakernel/test_cost_table.py).  ~5 min
     # (its builds are unplaced: tiny / small-moe '' and DTMK_NO_HOOKS, 1b's with DTMK_ROPE_IN_ATTN at batch 1)
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R" \
       "timeout ${BENCH_S:-420} python3 bench/megakernel.py --presets tiny,small-moe,1b --steps 16 --reps 5 --quick --no-old --costs tiny,small-moe,1b --out ${OUT:-/tmp/out}/mk" ;;
  173) # session 65: issue 5 asks for its table on an H200; every table since session 48 was an H100's.
     # PART=1: the table (tiny and 1b; hot, compiled, trace, bytes, attach; the observer-SM build beside the
     # default, observers calibrated as top does); PART=2: --offpath, the interpreter, the compiled swap
     if [ "${PART:-1}" = 1 ]; then
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $PINNED" \
       "timeout ${BENCH_S:-420} python3 bench/hooks.py --presets tiny,1b --reps 8 --variants obssm4fold --placement sorted --obs-sms calibrate --out ${OUT:-/tmp/out}/tab"
     fi
     exec tools/gpu_session.sh \
       "timeout ${OFFPATH_S:-150} python3 bench/hooks.py --offpath --presets 1b --reps 8 --placement sorted --out ${OUT:-/tmp/out}/off" \
       "timeout 120 python3 bench/vm_device.py --quick --out ${OUT:-/tmp/out}/vm" \
       "timeout 150 python3 bench/compiled.py --quick --out ${OUT:-/tmp/out}/cm" ;;
  172) # session 64: plan 171 put ~1.2 of hk_lean's ~1.3 us per event in its programs, and -DDTMK_LEAN_SPLIT
     # ~0.74 us in the descriptor walk of one one-AGG program with its loads issued together (no faster than
     # field by field).  The fast ops (bpf_inline.cuh dtmk_lean_compile / dtmk_lean_fast): the lean tests,
     # hk_lean's profile, and the issue's table with the lean build beside the default (~7 min, two calls:
     # PART=1 then PART=2)
     if [ "${PART:-1}" = 1 ]; then
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py DTMK_LEAN_SITE DTMK_LEAN_SITE+$S+$R DTMK_LEAN_SITE+$R $S+$R DTMK_NO_HOOKS+$S+$R" \
       "$(pytv 150 tests/gpu/test_hot_attach.py -k lean)" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --configs off,mask3,summary --defines DTMK_LEAN_SITE --prof --steps 16 --reps 2 --out ${OUT:-/tmp/out}/lp_prof"
     fi
     exec tools/gpu_session.sh "timeout ${BENCH_S:-400} python3 bench/hooks.py --presets 1b --reps 6 --placement sorted --variants lean --out ${OUT:-/tmp/out}/tab" ;;
  171) # session 63 (for the next): the lean form costs what the VM costs (~1 us per event after the signal,
     # a zero-update program as much): where inside?  -DDTMK_OBS_PROF counters 28 / 29 count hk_lean; the
     # NOEVENT build is hk_lean without its programs (hook_cost_analysis.md "Session 63" item 5)
     exec tools/gpu_session.sh \
       "timeout 100 python3 bench/level_profile.py --preset 1b --configs mask3,summary --defines DTMK_LEAN_SITE --prof --steps 16 --reps 2 --out ${OUT:-/tmp/out}/lp_prof" \
       "timeout 80 python3 bench/level_profile.py --preset 1b --configs summary --defines DTMK_LEAN_SITE+DTMK_LEAN_NOEVENT --prof --steps 16 --reps 2 --out ${OUT:-/tmp/out}/lp_prof_noev" ;;
  170) # session 63: the lean form (-DDTMK_LEAN_SITE, kernels/bpf_inline.cuh): the summary's descriptor
     # programs (dense keys) update per-worker cells at the in-CTA sites, no ring / drain / VM.  Its GPU
     # tests, the post-task time per class beside mask3 (level_profile), and the issue's table with the
     # lean build beside the default (one call, ~4 min; the lean builds compile there: ~20 s)
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py DTMK_LEAN_SITE DTMK_LEAN_SITE+$S+$R DTMK_LEAN_SITE+$R" \
       "$(pytv 120 tests/gpu/test_hot_attach.py -k lean)" \
       "timeout 100 python3 bench/level_profile.py --preset 1b --configs off,mask3,summary --defines DTMK_LEAN_SITE --steps 16 --reps 2 --out ${OUT:-/tmp/out}/lp_lean" \
       "timeout ${BENCH_S:-300} python3 bench/hooks.py --presets 1b --reps 6 --placement sorted --variants lean --out ${OUT:-/tmp/out}/tab" ;;
  169) # session 62 (for the next): the off cost by the table's pairing reads ~1.2 points above --offpath's on the
     # same cubins (sessions 61-62: +1.3..+1.7% vs +0.15..+0.22%), and obs_split showed a ~0.5-point bias by a
     # variant's place in the round.  The table with its rounds in a seeded random order (--order shuffled;
     # hooks.json `positions`) beside the fixed one, and --offpath with the default's nohooks / off loaded again
     # after 20 more modules (--late-modules 20, build `late`): the per-launch data of session 62 put the gap in
     # the process (the table's off is slow also where only it and live_idle alternate), not the order
     T="timeout ${BENCH_S:-200} python3 bench/hooks.py --presets 1b --reps 8 --placement sorted"
     exec tools/gpu_session.sh \
       "timeout ${OFFPATH_S:-150} python3 bench/hooks.py --offpath --late-modules 20 --presets 1b --reps 8 --placement sorted --out ${OUT:-/tmp/out}/late" \
       "$T --order shuffled --out ${OUT:-/tmp/out}/shuf" \
       "python3 tools/order_bias.py ${OUT:-/tmp/out}/shuf/hooks.json --variants nohooks,off,off2,nohooks_pad,summary,mask3" \
       "$T --out ${OUT:-/tmp/out}/fixed" ;;
  168) # session 62: idealsite read +7.5% over its off (plan 167): the in-CTA site's capture path (hook_post,
     # hook_flush, hk_capture) then three updates.  wshincta: the same updates from the capture in place into the
     # shadow after the signal (the observer-SM workers' shadow16, +1.59% there); wshdeferincta: deferred to the
     # waits' failed polls (shadowdefer16, +1.23%).  Without observer SMs: the lean in-CTA site's cost
     exec tools/gpu_session.sh "timeout ${BENCH_S:-400} python3 bench/hooks.py --presets 1b --reps ${REPS:-8} --placement sorted --variants wshincta,wshdeferincta --out ${OUT:-/tmp/out}/tab" ;;
  167) # session 62: shadow16 / shadowdefer16 put the summary's three updates on the observer-SM build's workers
     # at +1.2..+1.6% over its off; the default (in-CTA) build's compiled summary costs +31%.  idealsite (session
     # 10, old layout: +4.99% -- the in-CTA capture path, hook_post / hook_flush, then three shared-memory updates,
     # no record) in today's hot-first layout: how much of the +31% is the in-CTA site's capture?
     exec tools/gpu_session.sh "timeout ${BENCH_S:-400} python3 bench/hooks.py --presets 1b --reps 8 --placement sorted --variants idealsite --out ${OUT:-/tmp/out}/tab" ;;
  166) # session 62: plan 165 put the compiled summary's worker cost in the push (nopush16 +0.35%, lazydefer16
     # +1.85%) and found the workers' own aggregation dearer still (shadow16, after the signal: +2.04%).
     # shadowdefer16 (-DDTMK_OSQ_WSHADOW_DEFER): shadow16's updates staged, applied one per failed poll of a
     # later wait -- free in the worker's idle polls?  Twice swapped, one call (the builds compile there:
     # the sources changed since .kcache's; ~60 s of the first run)
     exec tools/gpu_session.sh "$(osplit ${OSPLIT_S:-300} 10 nopush16,shadow16,shadowdefer16 a)" \
       "$(osplit ${OSPLIT_S:-240} 10 shadowdefer16,shadow16,nopush16 b)" ;;
  165) # session 61: the compiled summary's cost on the workers (plans 139-144, old layout: capture ~1 point,
     # the entry's push ~1.1, shadow16 -- the summary's three updates on the workers, no entry -- +1.95..+2.75%
     # with its run_task's code unexamined) measured again now that every build is in the hot-first layout (the
     # off cost was the GCC's conflict misses, sessions 58-59): if shadow16 reads at nopush16, a worker-side
     # compiled tier (no entry) is the way to compiled <= 1%.  And hotobs16 / obssm4hotobs (-DDTMK_HOT_OBS): the
     # observer-SM build's hot functions (workers' flush / raise, the observers' loop, records, VM) placed after
     # the workers' hot region instead of among the cold functions.  `165`: twice, swapped (one call);
     # `165 tab`: the issue's table with obssm4hotobs beside obssm4fold, top's placement (a second call)
     if [ "${2:-}" = tab ]; then
       exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py $PINNED $L+DTMK_HOT_OBS+$S+$R" \
         "timeout ${BENCH_S:-300} python3 bench/hooks.py --presets 1b --reps 8 --variants obssm4fold,obssm4hotobs --placement sorted --obs-sms calibrate --out ${OUT:-/tmp/out}/tab"
     fi
     V=defer16B,nopush16,discard16,shadow16,hotobs16
     exec tools/gpu_session.sh "$(osplit ${OSPLIT_S:-240} 10 $V a)" "$(osplit ${OSPLIT_S:-240} 10 hotobs16,shadow16,discard16,nopush16,defer16B b)" ;;
  164) # session 60: the default's off cost over offxw's wait (hfxw) was ~0.8% (plan 161); ptxas puts 32 / 20 more
     # spill bytes in the kernel entry (the main loop's two wait and two run_task calls) -- copyinwait has one
     # of each (entry 112 / 132 vs 136 / 144, hfxw 104 / 124).  Off path beside hfxw, twice swapped
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_OFFX=1+$S+$R DTMK_COPY_IN_WAIT+$S+$R" \
       "$(offpath ${OFFPATH_S:-150} 8 copyinwait,hfxw a)" "$(offpath ${OFFPATH_S:-150} 8 hfxw,copyinwait b)" ;;
  163) # session 60: the new default (hot-first layout, the wait's two copies; plan 161 +0.35..+0.56% off).
     # Args: suite ranges A..B (tools/gpu_suite.py; since session 65 a range stops starting tests past its
     # budget and prints the range left: `163 1..9999`, then `163 N..9999` as printed, runs the whole suite;
     # session 53: 1-171 in 217 s, 172-276 ~4.2 s a test, 277-432 ~2.4 s, 433-513 211 s) and `bench`: the
     # issue's hook table (hot, compiled, attach) with legacy (the old default) beside it, then --offpath with
     # legacy's own no-hook build (old layout)
     stages=()
     for a in "${@:2}"; do
       if [ "$a" = bench ]; then
         stages+=("timeout 100 python3 tools/precompile.py $PINNED DTMK_NO_HOT_FIRST+DTMK_ONE_WAIT+$S+$R DTMK_NO_HOT_FIRST+DTMK_NO_HOOKS+$S+$R"
                  "timeout ${BENCH_S:-200} python3 bench/hooks.py --presets 1b --reps 8 --placement sorted --variants legacy --out ${OUT:-/tmp/out}/tab"
                  "$(offpath ${OFFPATH_S:-120} 8 legacy a)")
       else
         # (--budget: no test starts after SUITE_S - 70 s -- the longest test ~45 s, the collection ~15 --
         # so a range too long for one call ends cleanly and prints `the rest: A..B` for the next)
         T=${SUITE_S:-540}
         stages+=("timeout $T python3 tools/gpu_suite.py $a --budget $((T - 70)) -rfE")
       fi
     done
     exec tools/gpu_session.sh "${stages[@]}" ;;
  162) # session 59, plan 161: hfcopyw (hot-first layout, OFF_COPY's observing copy out of the hot region) +0.35 /
     # +0.56% over the hot-first no-hook build: the candidate default's hot attach / detach, exactness and watchdog
     # (session 59 ran it as -k offcopy; that build is test_hot_attach's default since session 60)
     exec tools/gpu_session.sh "$(pytv 330 tests/gpu/test_hot_attach.py -k default)" ;;
  161) # session 59, plan 160: hfcopyw's copy 0 and run_body execute what hfxw's do (instructions, local loads),
     # its GCC fetched more (219 K vs 175 K per launch): its observing copy, one template's other instantiation,
     # sat cold in the hot-first region.  Now a function of its own name (wait_event_obs, after the hot region)
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $HF_BUILDS" \
       "$(offpath 170 10 hotfirst,hfxw,hfcopyw a)" "$(offpath 170 10 hotfirst,hfxw,hfcopyw b)" ;;
  160) # session 59, plan 159 (H100): hfxw (hot-first layout, offxw's wait) -0.1% over the hot-first no-hook build,
     # the hot-first default +2.1%, hfcopyw (offxw's wait as copy 0, chosen per task) +1.3% -- with copy 0 and
     # run_body all but the same SASS as hfxw's.  Where do hfcopyw's 17 us per step go?  Its executed SASS beside
     # hfxw's and the local-memory traffic (warm-up skipped: nohooks, off, off2, summary, off_hfxw, off_hfcopyw,
     # summary_hfcopyw, nohooks_hotfirst, off_hotfirst, summary_hotfirst)
     O=$NCU_DIR; mkdir -p $O
     M=$ICC_METRICS,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum,smsp__inst_executed.sum
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $HF_BUILDS" \
       "$(ncu_run 330 "--launch-skip 10 --section SourceCounters --metrics $M" off 10) $(offpath 320 1 hfxw,hfcopyw,hotfirst hk) && $NCU -i $O/off.ncu-rep --page raw --csv > ${OUT:-/tmp/out}/off_raw.csv && $(ncu_src off)" "$NCU_PACK" ;;
  159) # session 59, plan 158: the hot-first layout cut the GCC's instruction fetches from L2 (off 226 K -> 148 K,
     # no hooks 182 K -> 152 K per launch; the model's 20 lines beyond their ways -> 1) but the off cost only a
     # little (off 1304 -> 1301, no hooks 1283 -> 1274 us/step): the layout is one part.  The other, the wait's hook
     # code (offxw ~0 in the old layout): the hot-first layout with offxw's wait and with offcopyw's two copies
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $HF_BUILDS" \
       "$(offpath 170 10 hotfirst,hfxw,hfcopyw a)" "$(offpath 170 10 hotfirst,hfxw,hfcopyw b)" "$(offpath 170 10 hotfirst,hfxw,hfcopyw c)" ;;
  158) # session 58, plan 157: the off path's GCC -> L2 instruction fetches follow the off cost (no hooks 181 K,
     # offxw 182 K, offcopyw 217 K, off 224-226 K per launch) while its executed lines barely move (96 -> 101 KB), and
     # the diet (calls for inlined copies) ran +19% instructions, +7% slower.  Layout instead: the workers' hot
     # functions first in the cubin (-DDTMK_HOT_FIRST, hook and no-hook builds; predicted by tools/gcc_layout.py at
     # 0 and 1 lines beyond their set's ways, from 20 and 1), timed twice, then under ncu (warm-up skipped:
     # nohooks, off, off2, summary, nohooks_hotfirst, off_hotfirst, summary_hotfirst)
     O=$NCU_DIR; mkdir -p $O
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_HOT_FIRST+$S+$R DTMK_HOT_FIRST+DTMK_NO_HOOKS+$S+$R" \
       "$(offpath 150 10 hotfirst a)" "$(offpath 150 10 hotfirst b)" \
       "$(ncu_run 220 "--launch-skip 7 --section SourceCounters --metrics $ICC_METRICS" off 7) $(offpath 210 1 hotfirst hk) && $NCU -i $O/off.ncu-rep --page raw --csv > ${OUT:-/tmp/out}/off_raw.csv && $(ncu_src off)" "$NCU_PACK" ;;
  153) # session 57, plan 151: no one site of the wait carries the off cost (offxlook +2.6, offxsync +1.3,
     # offxspin +0.5..1.1, offxw -0.3..-0.6%) and offcopyw, which runs offxw's wait, kept it: is it the code's
     # footprint in the instruction caches (session 30)?  The executed SASS of each build, per launch
     # (ncu SourceCounters; tools/ncu_footprint.py here, with the device's NVRTC, maps it to functions)
     O=$NCU_DIR; mkdir -p $O
     V=offxw=DTMK_OFFX=1,offxlook=DTMK_OFFX=8,offxsync=DTMK_OFFX=16,offxspin=DTMK_OFFX=32,offcopyw=DTMK_OFF_COPY=1
     lp="python3 bench/level_profile.py --preset 1b --steps 16 --reps 1 --configs nohooks,off --variants $V --place"
     # ... and the instruction caches' counters of the same launches (ICC_METRICS)
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_OFFX=1+$S+$R DTMK_OFFX=8+$S+$R DTMK_OFFX=16+$S+$R DTMK_OFFX=32+$S+$R DTMK_OFF_COPY=1+$S+$R" \
       "$(ncu_run 200 "--metrics $ICC_METRICS" icc 24) $lp --out ${OUT:-/tmp/out}/icc_lp && $NCU -i $O/icc.ncu-rep --page raw --csv > ${OUT:-/tmp/out}/icc_raw.csv" \
       "$(ncu_run 300 '--section SourceCounters' src 24) $lp --out $O/src_lp && $(ncu_src src)" "$NCU_PACK" ;;
  148) # session 55: plan 146 cut to what a short lend holds (device starts kept failing): one off-path run of
     # offcopyw beside offxw, then the copies' hot attach / detach and every-task tests
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_OFFX=1+$S+$R DTMK_OFF_COPY=1+$S+$R" \
       "$(offpath 120 8 offcopyw,offxw a)" \
       "$(pytv 150 tests/gpu/test_hot_attach.py -k 'default and (while_running or every_task)')" ;;
  146) O=${OUT:-/tmp/out}
     # session 55, plan 145: with wait_event's gates constant 0 (offxw) the default build's off cost went
     # (+1.54 / +1.55% -> -0.12 / +0.11% over no hooks; offxall -0.20 / -0.87%).  DTMK_OFF_COPY: that code as
     # a second copy of wait_event (=1) / and of run_task (=3: run_body's spills grow 123 -> 152 LDL), taken
     # while the worker observes nothing; then the copies' exactness (hot attach / detach, before launch,
     # every task counted, final epochs)
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_OFFX=1+$S+$R DTMK_OFF_COPY=1+$S+$R DTMK_OFF_COPY=3+$S+$R" \
       "$(offpath 200 10 offxw,offcopyw,offcopywr a)" \
       "$(pytv 280 tests/gpu/test_hot_attach.py -k default)" \
       "$(offpath 200 10 offcopywr,offcopyw,offxw b)" ;;
  145) O=${OUT:-/tmp/out}
     # session 55: the default hook build costs 1b +2.5..3.1% over the no-hook build with nothing attached;
     # statically its wait_event has 34 vs 19 LDL and 12 vs 3 call sites.  The same build with its per-task
     # "observing?" gates constant 0 (DTMK_OFFX, measurement only): wait_event's (offxw), run_task's (offxr),
     # all of them (offxall: statically the no-hook path) -- is the off cost that code?  Twice, order swapped
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R DTMK_OFFX=1+$S+$R DTMK_OFFX=2+$S+$R DTMK_OFFX=7+$S+$R" \
       "$(offpath 200 10 offxw,offxr,offxall a)" \
       "$(offpath 200 10 offxall,offxr,offxw b)" ;;
  144) O=${OUT:-/tmp/out}
     # session 54 (plans 139-143): without the first-look call the compiled summary reads +1.64 / +1.68%
     # over its own off under top's placement; the entry's push (discard16 - nopush16, ~1.1 points in plan
     # 139) is the larger part left.  The staged entries are stored at a wait's FIRST failed poll: a short
     # wait then sees its dependency late by the flush.  From the 4th / 12th failed poll instead
     # (dafter4 / dafter12), or inline, not through a call whose restores miss the L1 the poll emptied
     # (dinline), beside defer16B and discard16 / nopush16, twice swapped; if one is >= 0.5 points under
     # defer16B in both orders, the hook table with it (bench/hooks.py variant to add)
     # (the default builds' SASS is cc3dbd8's, whose observer-SM tests passed in plans 140-142)
     exec tools/gpu_session.sh "$(osplit 170 12 defer16B,dafter4,dafter12,dinline,discard16,nopush16 a)" \
       "$(osplit 170 12 nopush16,discard16,dinline,dafter12,dafter4,defer16B b)" ;;
  143) O=${OUT:-/tmp/out}
     # session 54, plan 141's table (no first-look call, the raise capped; sorted + calibrated, 8 rounds):
     # hot +1.66%, compiled +1.68%, null3 +1.69% over own off (session 53: +3.85 / +2.82 / +3.72%).  Again
     # (6 rounds), then the hardware's placement (6 rounds)
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py $PINNED $R DTMK_NO_HOOKS+$R $L+$R $P+$R" \
       "timeout 150 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --placement sorted --obs-sms calibrate --out $O/sorted" \
       "timeout 150 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --out $O/hw" ;;
  142) O=${OUT:-/tmp/out}
     # session 54, plan 141: the capped raise did not read cheaper -- lazydefer16 +2.82 / +2.69% and its
     # twin defer16B +2.26 / +2.09% over plain vs uncap16 (the old raise) +1.93 / +1.59% -- though it
     # stores less (mechanism: fewer raises, no hold store).  Two instances of each, 12 rounds, twice
     # swapped: is the difference real?  Then the compiled tier on the observer SM (1b was cut by 141's
     # stage timeout)
     exec tools/gpu_session.sh "$(osplit 150 12 uncap16,defer16B,uncapB a)" "$(osplit 150 12 uncapB,defer16B,uncap16 b)" \
       "$(pytv 220 tests/gpu/test_compiled_tier.py -k observer_sm_compiled_tier)" ;;
  141) O=${OUT:-/tmp/out}
     # session 54, plan 140: lazydefer16 +2.10 / +2.12% over plain without the wait's first-look call
     # (lookcall16, the call back: +3.56 / +3.47%); nohold16 -0.78 / -0.70% vs nopush16 +0.43 / +1.55%:
     # the hold before the signal costs ~1.5 points -- its OBS_PENDING store after every raise that went
     # past the awaited step, waited for by the signal's MEMBAR.  The raise is now capped there (the hold
     # stores nothing after it); uncap16 is the old raise.  Then the issue's table (obssm4fold, top's
     # placement) and the observer-SM exactness tests on the changed protocol
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py $PINNED $R DTMK_NO_HOOKS+$R $L+$R $P+$R" \
       "$(osplit 150 9 uncap16,nopush16,nohold16,defer16B a)" \
       "$(pytv 200 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k 'obssm4defer or obssm3')" \
       "timeout 200 python3 bench/hooks.py --presets 1b --reps 8 --variants obssm4fold --placement sorted --obs-sms calibrate --out $O/sorted" \
       "$(osplit 150 9 defer16B,nohold16,nopush16,uncap16 b)" \
       "$(pytv 130 tests/gpu/test_obs_place_gpu.py tests/gpu/test_top_gpu.py tests/gpu/test_compiled_tier.py -k 'observer or obs or top')" ;;
  140) # session 54 (plan 139: over plain, nopush16 +0.93 / +1.41%, discard16 +2.12 / +2.46%, the summary
     # +3.29 / +3.16%: the capture alone is ~1%, so compiled <= 1% needs a cheaper capture AND no entry).
     # Which part of the capture: before the body (stamps, hook bits), the hold before the signal, the
     # wait's dep:release capture?  What does aggregating on the workers add (shadow16)?  And the
     # first-look call the observer-SM build no longer makes (lookcall16 restores it).  Twice, swapped;
     # then the observer-SM builds' exactness tests on the changed kernel
     V=nopush16,nopre16,nohold16,nowait16,shadow16,lookcall16
     exec tools/gpu_session.sh "$(osplit 150 9 $V a)" "$(osplit 150 9 lookcall16,shadow16,nowait16,nohold16,nopre16,nopush16 b)" \
       "$(pytv 240 tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k 'obssm4defer or obssm3')" \
       "$(pytv 110 tests/gpu/test_obs_place_gpu.py tests/gpu/test_top_gpu.py tests/gpu/test_compiled_tier.py -k 'observer or obs or top')" ;;
  139) # session 53: the compiled summary (+2.82%) costs less than null3 (+3.72%) in the CLI's build, so
     # its floor is on the workers: the capture (stamps, hold) or the entry (96 B, staged, pushed)?
     # The CLI's build (lazydefer16) beside nopush16 (captured, no entry) and discard16 (entries
     # pushed, dropped by the observers), all with the summary attached; workers in id order around
     # the observers top calibrates to (0,1,16,88 on three H100 starts), twice in swapped order.  If
     # nopush16 alone is >= 1% over plain, compiled <= 1% needs a cheaper capture, not only no entry
     exec tools/gpu_session.sh "$(osplit 270 9 nopush16,discard16,defer16B a)" "$(osplit 270 9 defer16B,discard16,nopush16 b)" ;;
  138) # session 53 ran the whole suite's tests 1-432 of 513 (402 passed, 30 skipped, 0 failed) in
     # three calls; the rest, 433-513 (test_megakernel_variants_gpu.py's tail, obs_place, obs_ring,
     # placement, rec_fast, resident, run_cli, top, tp, tp_baseline), in one call.  kcache:
     # tools/kcache.sh --tests tests/gpu (every build the suite asks for).  If the suite's count is
     # not 513, the tree changed: read the first line (gpu_suite: range ... of N) and the names
     exec tools/gpu_session.sh "timeout 560 python3 tools/gpu_suite.py 433..513 -rfE" ;;
  137) O=${OUT:-/tmp/out}
     # session 52: serve 1b with its observers pinned (--observer-place calibrate) read 5416 / 5208 us/step
     # of launch time at batch 4 vs 4615 / 4825 hardware-placed (separate CLI runs), and lm_head's
     # local_imbalance came in 5 of 5 pinned runs vs 2 of 4.  Side by side in one bench (smpin / sm), with
     # the collector's inputs dumped: which worker's lm_head dispatch waits, and is it next to an observer?
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py $L+$R $L+$S+DTMK_SM_IDLE+$R" \
       "timeout 420 python3 bench/serve.py --presets 1b --configs sm,smpin --reps 4 --steps 200 --dump --out $O/serve" \
       "$DUMPS_PACK" ;;   # (session 53 ran it without: 8 dumps + 4 files, over the 8 files that come back)
  136) O=${OUT:-/tmp/out}
     # session 52: under top's placement (--placement sorted, observers calibrated) obssm4fold's hot summary
     # read +2.96 / +3.28% (met) and the compiled one +2.55% (target 1%).  What is the floor under it?
     # obssm4fold now runs null3 too (a program doing nothing on the summary's three hooks: the records'
     # capture and push alone).  If null3 is ~+2.5%, compiled <= 1% needs less per record on the workers,
     # not a faster monitor.  Then the same table with the hardware's placement for comparison.  Best on an
     # H200 (issue 5 names one; no H200 start in sessions 49-52)
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py $PINNED $R DTMK_NO_HOOKS+$R $L+$R $P+$R" \
       "timeout 270 python3 bench/hooks.py --presets 1b --reps 8 --variants obssm4fold --placement sorted --obs-sms calibrate --out $O/sorted" \
       "timeout 240 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --out $O/hw" ;;
  135) O=${OUT:-/tmp/out}
     # session 52: serve --observer sm pins its observers too (calibrated on a twin sharing the weights;
     # a grid of every SM, the clock pairs' SM idle: -DDTMK_SM_IDLE); megakernel.cu's comment changed
     # (every build's source hash): the placement GPU tests, serve's three observer cases, then serve
     # on 1b with the calibration (its table, tokens, coverage)
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py '' $L+$S $L+$S+DTMK_SM_IDLE $L $L+$S+DTMK_SM_IDLE+$R" \
       "$(pytv 150 tests/gpu/test_obs_place_gpu.py)" \
       "$(pytv 240 tests/gpu/test_resident_gpu.py -k serve)" \
       "timeout 120 python3 -m dtrace_mk.launch.serve --backend gpu --model 1b --steps 200 --observer sm --result $O/serve1b.json" ;;
  134) O=${OUT:-/tmp/out}
     # session 52: top --observer sm calibrates by default (--observer-place auto), 12 candidates; the GPU
     # tests of what sessions 51-52 changed: top (both observers), placement (sm_ids once), the compiled
     # tier (link_compiled's halves), calibration; then top on 1b with the default
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py '' $L+$S" \
       "$(pytv 300 tests/gpu/test_top_gpu.py tests/gpu/test_placement_gpu.py tests/gpu/test_compiled_tier.py tests/gpu/test_obs_place_gpu.py)" \
       "timeout 60 python3 -m dtrace_mk top --model 1b --backend gpu --observer sm --frames 1 --no-clear --steps 300" ;;
  133) O=${OUT:-/tmp/out}
     # session 52: plan 132's calibration is reproducible (the six shared candidates read within 0.3% of
     # plan 131's) but measures top's configuration -- the workers on the other SMs in id order -- while
     # --placement paired redraws the workers every round: its pick among 12 (0,1,16,88, -2% in the
     # calibration) read hot +5.88% under paired, 71,82,94,125 +4.65%.  Measure what top runs: --placement
     # sorted (workers in id order, observers pinned), the calibration among 12, then three sets side by side
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $PINNED" \
       "timeout 240 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --placement sorted --obs-sms calibrate:12 --out $O/cal12s" \
       "timeout 240 python3 bench/hooks.py --presets 1b --reps 9 --variants obssm4fold --placement sorted --obs-sms 0,1,16,88/71,82,94,125/128,129,130,131 --out $O/sets" ;;
  132) O=${OUT:-/tmp/out}
     # session 52: plan 131's calibration (6 candidates x 2 launches of 16 steps, 1.9 s) chose 71,82,94,125
     # (+0.00%; the other five +0.6..+2.2% dearer) and the bench then read hot +4.76% (met); plan 130's survey
     # (same card map as plan 129's) ranged +4.21% (6,54,78,110) .. +7.52% (124-127).  Does the 1.9 s
     # calibration rank sets as the long bench does?  Survey its six candidates (2 rounds each), then
     # calibrate among 12
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $PINNED" \
       "timeout 240 python3 bench/hooks.py --presets 1b --reps 12 --variants obssm4fold --placement paired --obs-sms 128,129,130,131/35,66,82,109/2,22,85,106/71,82,94,125/0,52,87,105/23,94,98,110 --out $O/cands" \
       "timeout 240 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --placement paired --obs-sms calibrate:12 --out $O/cal12" ;;
  131) O=${OUT:-/tmp/out}
     # session 51: the observers' SMs chosen by measuring (megakernel/obs_place.py, `top --observer-place
     # calibrate`, bench/hooks.py --obs-sms calibrate): its GPU test (tiny: observers where named, every bit
     # kept, the cheapest candidate kept), top on 1b with it, and the hook table with the calibrated set
     # pinned (6 candidates x 2 launches of 16 steps first) -- hot <= 5% on this machine?
     exec tools/gpu_session.sh "timeout 90 python3 tools/precompile.py '' $L+$S $PINNED" \
       "$(pytv 120 tests/gpu/test_obs_place_gpu.py)" \
       "timeout 60 python3 -m dtrace_mk top --model 1b --backend gpu --observer sm --observer-place calibrate --frames 2 --no-clear --steps 600" \
       "timeout 270 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --placement paired --obs-sms calibrate --out $O/cal" ;;
  130) O=${OUT:-/tmp/out}
     # session 51: plan 129's three runs timed out at 160 s (the builds and the compiled tier's
     # links take 126-145 s before round 1; a round is ~3.2 s).  Run again on one H100 (reps 2-3):
     # pinned observers make rounds agree within +-0.3% whatever the workers' draw -- the observers'
     # SMs set the cost -- but 32,33,65,68 (+1.9% on plan 128's machine) read +6.87% there, 128-131
     # +6.35%, 0,1,16,17 (four observers in an 8-SM GPC) +9.51%.  Survey eight sets in one process
     # (--obs-sms sets take turns, 2 rounds each): plan 128's cheap / middle / dear rounds' SMs, sorted's
     # tail, GPC 0's two TPCs, one observer in each of four GPCs' last TPCs, two big GPCs' last TPCs,
     # the 124-127 half of "?" -- is some set under 5% on every machine, and is it the same set?
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $PINNED" \
       "timeout 30 python3 tools/gpc_probe.py --out $O" \
       "timeout 330 python3 bench/hooks.py --presets 1b --reps 16 --variants obssm4fold --placement paired --obs-sms 32,33,65,68/128,129,130,131/0,1,16,17/6,54,78,110/37,63,118,124/107,109,111,113/120,121,122,123/124,125,126,127 --out $O/survey" ;;
  129) O=${OUT:-/tmp/out}
     # (session 51: each bench timed out at 160 s -- its builds and links alone take ~2 min; plan 130
     # surveys these sets and five more in one process)
     # session 50: under --placement paired obssm4fold's monitors cost +1.9% in the rounds whose observers
     # sat on SMs 32,33,65,68 (6,54,78,110: +2.6%) and up to +7.7% elsewhere; sorted (128-131) +10.2%.  Is it
     # where the observers run (hooks.md session 29: they slow their GPC-mates), or where the workers do?
     # Observers pinned (--obs-sms), the workers drawn per round: the cheap round's SMs; one GPC's two TPCs
     # (0,1,16,17: GPC 0 by plan 60's probe, an H200's: the probe first, on this card); GPC 0's tail
     # (128-131, sorted's); 3 sets x 5 rounds
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $PINNED" \
       "timeout 30 python3 tools/gpc_probe.py --out $O" \
       "timeout 160 python3 bench/hooks.py --presets 1b --reps 5 --variants obssm4fold --placement paired --obs-sms 32,33,65,68 --out $O/cheap" \
       "timeout 160 python3 bench/hooks.py --presets 1b --reps 5 --variants obssm4fold --placement paired --obs-sms 128,129,130,131 --out $O/last" \
       "timeout 160 python3 bench/hooks.py --presets 1b --reps 5 --variants obssm4fold --placement paired --obs-sms 0,1,16,17 --out $O/gpc0" ;;
  128) S=DTMK_SM_WORKER; P=DTMK_NO_HOOKS+DTMK_SMEM_PAD=25808
     # session 50: plan 127's pinned (sorted) placement made rounds agree within ~1% but is one placement's
     # cost (obssm4fold hot +10.2% vs +4.4% placed by the hardware): one random SM order per round, the
     # same for every build (--placement paired), 10 rounds, beside the hardware's (6)
     exec tools/gpu_session.sh "timeout 60 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R $L+$S+$R $R DTMK_NO_HOOKS+$R $L+$R $P+$S+$R $P+$R" \
       "timeout 200 python3 bench/hooks.py --presets 1b --reps 10 --variants obssm4fold --placement paired --out ${OUT:-/tmp/out}/paired" \
       "timeout 140 python3 bench/hooks.py --presets 1b --reps 6 --variants obssm4fold --out ${OUT:-/tmp/out}/hw" ;;
  127) S=DTMK_SM_WORKER; P=DTMK_NO_HOOKS+DTMK_SMEM_PAD=25808   # (nohooks_pad: the hook build's 27184 - 1376 B)
     # session 50: the hook table's rounds spread -1..+6% (each launch places the workers anew) and the
     # compiled summary read +0.14 / +1.50 / +2.83% in three runs; pinned placement (--placement sorted)
     # beside the hardware's, 8 rounds each, obssm4fold only (the build that met hot <= 5%)
     exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $S+$R DTMK_NO_HOOKS+$S+$R $L+$S+$R $R DTMK_NO_HOOKS+$R $L+$R $P+$S+$R $P+$R" \
       "timeout 260 python3 bench/hooks.py --presets 1b --reps 8 --variants obssm4fold --placement sorted --out ${OUT:-/tmp/out}/sorted" \
       "timeout 200 python3 bench/hooks.py --presets 1b --reps 8 --variants obssm4fold --out ${OUT:-/tmp/out}/hw" ;;
  126) # plan 125 slim (session 49's budget): the re-paired attach figures (1b, default build) and the attach test
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R" \
       "$(pytv 100 tests/gpu/test_hot_attach.py -k 'hot_attach_detach_while_running and default')" \
       "timeout 150 python3 bench/hooks.py --presets 1b --reps 1 --compiled-presets none --out ${OUT:-/tmp/out}" ;;
  125) # session 49: attach latencies read negative (a clock pairing ~140 s stale): LiveSession.start re-pairs;
     # plan 104's hook table again (its attach figures re-paired; a third read of the hot summary) and the hot
     # attach test's new bound
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R $L+$R $L+DTMK_HASH_LOOK_FAST+$R" \
       "timeout 250 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4fold,obssm4look --out ${OUT:-/tmp/out}" \
       "$(pytv 150 tests/gpu/test_hot_attach.py -k 'hot_attach_detach_while_running and (default or obssm4defer)')" ;;
  124) # plan 104's hook table with 5 rounds (session 49: plan 123's obssm4fold hot read +3.40% [+1.48..+5.87] on an H100)
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' DTMK_NO_HOOKS $R DTMK_NO_HOOKS+$R $L+$R $L+DTMK_HASH_LOOK_FAST+$R" \
       "timeout 500 python3 bench/hooks.py --presets 1b --reps 5 --variants obssm4fold,obssm4look --out ${OUT:-/tmp/out}" ;;
  123) O=${OUT:-/tmp/out}; G=DTMK_GATE_POLL
     # session 49: plan 122's tiny jobs showed no park + 2 spike with or without the gate poller (and no cost):
     # more rounds and 1b (its cost there), then plan 104's hook table on the poller default (issue 5's figures)
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' $R $G $G+$R DTMK_NO_HOOKS DTMK_NO_HOOKS+$R $L+$R $L+DTMK_HASH_LOOK_FAST+$R" \
       "$(serve_b 200 --configs workers,workers+$G --reps 4 --dump)" \
       "python3 -m dtrace_mk.collectors.replay --shape $O/serve/dumps/*.pkl" "$DUMPS_PACK" \
       "timeout 330 python3 bench/hooks.py --presets 1b --reps 3 --variants obssm4fold,obssm4look --out $O" ;;
  122) O=${OUT:-/tmp/out}; G=DTMK_GATE_POLL
     # session 48's opt-in gate drain poller (obs_sync_cta gate_poll): fault-free tiny serving's park + 2 qkv lag
     # spikes gone with it?  workers / workers+G alternated, 3 rounds, dumps; then the stamp tests, the compiled
     # tier and plan 109's VM stages are plan 121 (one call holds 600 s).  If it holds: make it the default
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py '' $R $G $G+$R" \
       "timeout 240 python3 bench/serve.py --presets tiny --steps 400 --configs workers,workers+$G --reps 3 --dump --out $O/serve" \
       "python3 -m dtrace_mk.collectors.replay --shape $O/serve/dumps/*.pkl" "$DUMPS_PACK" \
       "$(pytv 90 tests/gpu/test_obs_ring.py -k drain_poller)" ;;
  121) # plan 109's stages, the compiled tier first (a short budget): the poller's default build linked
     exec tools/gpu_session.sh "timeout 100 python3 tools/precompile.py $R $L+$R" "$(pytv 200 tests/gpu/test_compiled_tier.py)" \
       "$(pytv 160 tests/gpu/test_device_vm.py tests/gpu/test_map_churn_gpu.py)" ;;
  120) K='not (obssm or recglobal or codesmem or holdeager)'
     # session 48: the drain's poller the default -- its ring tests (poll / acquire / DTMK_NO_DRAIN_POLL), then
     # plan 108's stages (device summaries: the workers' serve case the artefact failed; resident + hot attach)
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' $R $L $L+$R DTMK_NO_DRAIN_POLL DTMK_DRAIN_POLL_ACQ" \
       "$(pytv 120 tests/gpu/test_obs_ring.py)" \
       "$(pytv 200 tests/gpu/test_device_summaries_gpu.py -k 'not two_gpus')" \
       "$(pytv 300 tests/gpu/test_resident_gpu.py tests/gpu/test_hot_attach.py -k "$K")" ;;
  119) DP=DTMK_DRAIN_POLL; N0=$DP+DTMK_DRAIN_POLL_NS=0; N50=$DP+DTMK_DRAIN_POLL_NS=50
     # the poller's pause (session 48): plan 118's relaxed form (200 ns) slowed 1b's step 1.1%, tiny's not; is it
     # the barrier after the drain waiting out the poller's pause?  workers / +poll 200 / 50 / 0 ns, 3 rounds, dumps
     exec tools/gpu_session.sh "timeout 150 python3 tools/precompile.py '' $R $DP $DP+$R $N0 $N0+$R $N50 $N50+$R" \
       "$(serve_b 400 --configs workers,workers+$DP,workers+$N50,workers+$N0 --reps 3 --dump)" \
       "python3 -m dtrace_mk.collectors.replay --shape ${OUT:-/tmp/out}/serve/dumps/*.pkl" "$DUMPS_PACK" \
       "$(pytv 60 tests/gpu/test_obs_ring.py -k drain_poller)" ;;
  115) exec tools/gpu_session.sh "$SERVE_PRE" "$(pytv 200 tests/gpu/test_obs_ring.py)" \
       "$(serve_b 300 --configs workers --reps 3 --dump)" "$DUMPS_PACK" ;;
  109) exec tools/gpu_session.sh "timeout 120 python3 tools/precompile.py $R $L+$R" \
       "$(pytv 200 tests/gpu/test_device_vm.py tests/gpu/test_map_churn_gpu.py)" "$(pytv 300 tests/gpu/test_compiled_tier.py)" ;;
  81) T="tests/gpu/test_tp.py tests/gpu/test_tp_baseline.py tests/gpu/test_diagnose_gpu.py"
     exec tools/gpu_session.sh "$(pytv 540 $T tests/gpu/test_launch_gpu.py::test_demo_on_two_gpus_live_query_in_the_device_vm_diagnosis_and_spans tests/gpu/test_launch_attach_gpu.py tests/gpu/test_device_summaries_gpu.py::test_demo_on_two_gpus_with_device_summaries)" ;;
  74) G="tests/gpu/test_resident_gpu.py tests/gpu/test_top_gpu.py tests/gpu/test_run_cli_gpu.py tests/gpu/test_launch_gpu.py tests/gpu/test_launch_attach_gpu.py tests/gpu/test_rec_fast_gpu.py tests/gpu/test_attn_staged_gpu.py"
     exec tools/gpu_session.sh "timeout 520 python3 -m pytest -q -p no:cacheprovider $G -k 'not obssm4defer' -rA" ;;
  75) D=DTMK_OSQ_DISCARD
     XS="$D+DTMK_OSQ_ICODE=128 $D+DTMK_OSQ_JCODE=176 $D+DTMK_OSQ_JCODE=128"
     gpc_builds $XS; exec tools/gpu_session.sh "${stages[@]}" ;;
  53|54) echo "plans 53-54 were for -DDTMK_OSQ_MULTI, which plans 52 and 55 measured no cheaper than the" \
       "default (docs/results/hooks.md session 27): not run" >&2; exit 2 ;;
  55) D=DTMK_OBS_SMS=4+DTMK_OSQ_LAZY_PUB+DTMK_OSQ_DEFER=16; S=DTMK_OBS_SM+DTMK_OSQ_STATS+$D; F=DTMK_OBS_SM+$D
     probe() { echo "timeout 100 python3 tools/obs_sm_probe.py --presets 1b --reps 2 --defines $1 --out ${OUT:-/tmp/out}/$2"; }
     exec tools/gpu_session.sh "$(split1b lazydefer16 deep16,multi8,nomaps16,deep16nomaps,deep16x s2 200)" \
       "python3 tools/precompile.py $S+$R $S+DTMK_OSQ_N=256+$R $R $F+DTMK_OSQ_N=256 $F+DTMK_OSQ_N=256+$R $F+DTMK_OSQ_N=16 $F+DTMK_OSQ_N=16+$R" \
       "$PYT tests/gpu/test_hot_attach.py tests/gpu/test_resident_gpu.py -k 'obssm4deep or obssm4shallow' -rA" \
       "$(probe $D d16)" "$(probe $D+DTMK_OSQ_N=256 deep)" ;;
  30) exec tools/gpu_session.sh \
       "timeout 100 python3 bench/megakernel.py --presets 1b --steps 16 --reps 7 --quick --out ${OUT:-/tmp/out}" \
       "timeout 300 python3 bench/hooks.py --presets 1b --reps 2 --variants obssm4lazy --out ${OUT:-/tmp/out}" ;;
  35|36) echo "plans 35-36 measured the lazy push's forms (-DDTMK_OSQ_HEAD_IN_SIGNAL, _PUSH_W2, _HEAD_LAST," \
       "_PUSH_SHW): exact, no gain; the defines are gone, see docs/results/hooks.md session 22" >&2; exit 2 ;;
  32) stages=(); for n in "${@:2}"; do [[ $n == *..* ]] || n=$n/4; stages+=("timeout ${SUITE_S:-260} python3 tools/gpu_suite.py $n -x"); done
     [ ${#stages[@]} -gt 0 ] || stages=("timeout 260 python3 tools/gpu_suite.py 2/4 -x" "timeout 260 python3 tools/gpu_suite.py 3/4 -x")
     exec tools/gpu_session.sh "python3 tools/precompile.py --variants $BASE $OBS $HO" "${stages[@]}" ;;
  26) echo "plan 26 measured -DDTMK_WS_VEC / -DDTMK_OSQ_PUSH_WARP (6e819b1): no gain over the default / over the" \
       "post-body operands in shared memory; the defines are gone, see docs/results/hooks.md session 20" >&2; exit 2 ;;
  *) echo "usage: tools/obs_sm_gpu_plan.sh N  (the plans the header names: 1..21, 24, 25, 29, 30, 32, 38, 39, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 55..81, 91..146, 148, 153, 158, 159, 160, 161, 162)" >&2; exit 2 ;;
esac
