/* bpf_compiled_harness.cu: the device VM's test harness (kernels/bpf_vm_harness.cu,
 * dtmk_vm_harness) with the compiled tier: a program table slot whose dtmk_prog.flags has
 * DTMK_PROG_F_COMPILED runs the compiled monitor linked into this module (dtmk_cm_run_prog,
 * kernels/bpf_compiled.cuh) instead of the interpreter; the other slots run the VM.  Same
 * arguments, shared memory layout, outputs and coverage flushing as dtmk_vm_harness, so
 * the host launches either kernel the same way and the tests compare them directly: it is
 * the same kernel body, bpf_vm_harness.cu built with DTMK_HARNESS_COMPILED, as
 * dtmk_compiled_harness.  -DDTMK_CM_NO_VM: compiled slots only (interpreted ones do not run).
 *
 * Built as LTO-IR (NVRTC -dlto -rdc=true) and linked by nvJitLink with the monitor's
 * LTO-IR (dtrace_mk/runtime/compiled/: translator.py, link.py), which defines dtmk_cm_hook_<id>; the link
 * inlines the compiled programs here.  Also compiled with the empty monitor (every hook
 * function returns DTMK_OUT_FAULT) when nothing is compiled.
 */
#define DTMK_HARNESS_COMPILED
#include "bpf_vm_harness.cu"
