/* bpf_prog_flags.h: the bits of dtmk_prog.flags (bpf_maps.cuh's program table), one place
 * for every reader: the VM (bpf_vm.cuh / bpf_run_prog.cuh), the compiled tier
 * (bpf_compiled.cuh), the site form (bpf_inline.cuh) and the host (runtime/device.py,
 * compiled/runtime.py; tests read them back from here).  Bits 16..31: the compiled tier's cm_id. */
#ifndef DTMK_BPF_PROG_FLAGS_H
#define DTMK_BPF_PROG_FLAGS_H
#define DTMK_PROG_F_COMPILED 1u   /* the slot runs the linked monitor's code */
#define DTMK_PROG_F_INLINE 2u     /* ... at the hook site (the site form), never from records */
#define DTMK_PROG_F_SERIAL 4u     /* run the warp's events one lane at a time */
#define DTMK_PROG_F_DESC 8u       /* with INLINE: from aggregation descriptors (dtmk_prog.descs) */
#define DTMK_PROG_F_LEAN 16u      /* with INLINE | DESC: its AGGs index dense per-worker cells (the lean form) */
#endif
