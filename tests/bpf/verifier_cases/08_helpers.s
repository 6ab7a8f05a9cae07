; Helper calls: ids, program types, argument kinds, map types, memory arguments.

; case: unknown helper id
; expect: reject insn 0: helper-unknown: call to unknown helper id 99
call 99
mov r0, 0
exit

; case: control helper in an observe program
; expect: reject insn 1: helper-not-allowed: helper set_priority_hint (id 300) is not allowed in observe programs (allowed: map_lookup_elem
mov r1, 1
call set_priority_hint
mov r0, 0
exit

; case: observe-only helper in a control program
; type: control
; verify-as: control
; expect: reject insn 3: helper-not-allowed: helper trace_printk (id 6) is not allowed in control programs
stdw [r10-8], 0
mov r1, r10
add r1, -8
call trace_printk
mov r0, 0
exit

; case: map helpers in a control program
; type: control
; verify-as: control
; maps: counts=hash,4,8,16
; expect: accept
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r0, 0
exit

; case: time and worker helpers
; expect: accept
; helpers: 5,8
call ktime_get_ns
mov r6, r0
call get_worker_id
add r0, r6
exit

; case: map argument is a scalar
; maps: counts=hash,4,8,16
; expect: reject insn 4: helper-arg: argument 1 of map_lookup_elem (r1) must be a map pointer (lddw map:NAME), got scalar 0
stw [r10-4], 0
mov r1, 0
mov r2, r10
add r2, -4
call map_lookup_elem
mov r0, 0
exit

; case: key argument is a scalar
; maps: counts=hash,4,8,16
; expect: reject insn 3: helper-arg: argument 2 of map_lookup_elem (r2) must be a stack pointer to the key (4 bytes of map 'counts'), got scalar 0
lddw r1, map:counts
mov r2, 0
call map_lookup_elem
mov r0, 0
exit

; case: key argument not passed
; maps: counts=hash,4,8,16
; expect: reject insn 2: uninit-reg: r2 is read before it is written
lddw r1, map:counts
call map_lookup_elem
mov r0, 0
exit

; case: key not initialised
; maps: counts=hash,4,8,16
; expect: reject insn 4: helper-mem: argument 2 of map_lookup_elem: 4 bytes at fp-4 are not initialised (fp-4)
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r0, 0
exit

; case: 8-byte key half initialised
; maps: pairs=hash,8,8,16
; expect: reject insn 5: helper-mem: argument 2 of map_lookup_elem: 8 bytes at fp-8 are not initialised (fp-4)
stw [r10-8], 0
lddw r1, map:pairs
mov r2, r10
add r2, -8
call map_lookup_elem
mov r0, 0
exit

; case: key sticks out above the stack
; maps: counts=hash,4,8,16
; expect: reject insn 5: helper-mem: argument 2 of map_lookup_elem: 4 bytes at fp-2 are out of bounds (stack is [fp-512, fp))
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -2
call map_lookup_elem
mov r0, 0
exit

; case: key holding a spilled pointer
; maps: pairs=hash,8,8,16
; expect: reject insn 5: helper-mem: argument 2 of map_lookup_elem: 8 bytes at fp-8 contain a spilled pointer at fp-8
stxdw [r10-8], r10
lddw r1, map:pairs
mov r2, r10
add r2, -8
call map_lookup_elem
mov r0, 0
exit

; case: update with key, value and flags
; maps: counts=hash,4,16,16
; expect: accept
; stack-depth: 24
stw [r10-4], 7
stdw [r10-24], 1
stdw [r10-16], 2
lddw r1, map:counts
mov r2, r10
add r2, -4
mov r3, r10
add r3, -24
mov r4, 0
call map_update_elem
mov r0, 0
exit

; case: update with a half-written value
; maps: counts=hash,4,16,16
; expect: reject insn 9: helper-mem: argument 3 of map_update_elem: 16 bytes at fp-24 are not initialised (fp-16)
stw [r10-4], 7
stdw [r10-24], 1
lddw r1, map:counts
mov r2, r10
add r2, -4
mov r3, r10
add r3, -24
mov r4, 0
call map_update_elem
mov r0, 0
exit

; case: pointer passed as update flags
; maps: counts=hash,4,8,16
; expect: reject insn 9: pointer-leak: r4 (stack pointer fp+0) passed as scalar argument 4 of map_update_elem
stw [r10-4], 7
stdw [r10-16], 1
lddw r1, map:counts
mov r2, r10
add r2, -4
mov r3, r10
add r3, -16
mov r4, r10
call map_update_elem
mov r0, 0
exit

; case: delete
; maps: counts=hash,4,8,16
; expect: accept
; helpers: 3
stw [r10-4], 7
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_delete_elem
exit

; case: lookup in a ringbuf
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: reject insn 5: helper-map-type: map_lookup_elem needs a map with keys (not a ringbuf); map 'ev' is ringbuf
stw [r10-4], 0
lddw r1, map:ev
mov r2, r10
add r2, -4
call map_lookup_elem
mov r0, 0
exit

; case: ringbuf output of a stack record
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: accept
; helpers: 130
ldxdw r2, [r1+96]
stxdw [r10-16], r2
ldxdw r2, [r1+8]
stxdw [r10-8], r2
lddw r1, map:ev
mov r2, r10
add r2, -16
mov r3, 16
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: ringbuf output of a map value
; maps: ev=ringbuf,0,0,1,budget_bytes=4096 counts=hash,4,64,16
; expect: accept
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
mov r2, r0
add r2, 32
lddw r1, map:ev
mov r3, 32
mov r4, 0
call ringbuf_output
out: mov r0, 0
exit

; case: ringbuf output past a map value
; maps: ev=ringbuf,0,0,1,budget_bytes=4096 counts=hash,4,64,16
; expect: reject insn 13: helper-mem: argument 2 of ringbuf_output: 40 bytes at map value pointer 'counts'+32 are out of bounds (value_size 64)
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
mov r2, r0
add r2, 32
lddw r1, map:ev
mov r3, 40
mov r4, 0
call ringbuf_output
out: mov r0, 0
exit

; case: ringbuf output of uninitialised stack
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: reject insn 7: helper-mem: argument 2 of ringbuf_output: 16 bytes at fp-16 are not initialised (fp-16)
stdw [r10-8], 1
lddw r1, map:ev
mov r2, r10
add r2, -16
mov r3, 16
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: ringbuf output with an unknown size
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: reject insn 7: helper-size: argument 3 of ringbuf_output (r3) must be a constant size in 1..512, got scalar in [0, 4294967295]
ldxw r3, [r1+24]
stdw [r10-8], 1
lddw r1, map:ev
mov r2, r10
add r2, -8
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: ringbuf output of zero bytes
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: reject insn 7: helper-size: argument 3 of ringbuf_output (r3) must be a constant size in 1..512, got scalar 0
stdw [r10-8], 1
lddw r1, map:ev
mov r2, r10
add r2, -8
mov r3, 0
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: ringbuf output into a hash map
; maps: counts=hash,4,64,16
; expect: reject insn 7: helper-map-type: ringbuf_output needs a ringbuf map; map 'counts' is hash
stdw [r10-8], 1
lddw r1, map:counts
mov r2, r10
add r2, -8
mov r3, 8
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: ringbuf output of a scalar
; maps: ev=ringbuf,0,0,1,budget_bytes=4096
; expect: reject insn 5: helper-arg: argument 2 of ringbuf_output (r2) must be a pointer to stack or map value memory, got scalar 8
lddw r1, map:ev
mov r2, 8
mov r3, 8
mov r4, 0
call ringbuf_output
mov r0, 0
exit

; case: hist_add on a log2 histogram
; maps: lat=hist_log2,4,512,64
; expect: accept
; helpers: 200
ldxdw r6, [r1+96]
ldxw r2, [r1+60]
stxw [r10-4], r2
lddw r1, map:lat
mov r2, r10
add r2, -4
mov r3, r6
call hist_add
mov r0, 0
exit

; case: hist_add on a linear histogram
; maps: lat=hist_linear,4,96,64,lin_lo=0,lin_hi=100,lin_step=10
; expect: accept
stw [r10-4], 0
lddw r1, map:lat
mov r2, r10
add r2, -4
mov r3, 42
call hist_add
mov r0, 0
exit

; case: hist_add on a hash map
; maps: counts=hash,4,8,16
; expect: reject insn 6: helper-map-type: hist_add needs a hist_log2 or hist_linear map; map 'counts' is hash
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
mov r3, 42
call hist_add
mov r0, 0
exit

; case: trace_printk with a format on the stack
; expect: accept
stdw [r10-8], 0x0a6425
mov r1, r10
add r1, -8
mov r2, 8
mov r3, 1
mov r4, 2
mov r5, 3
call trace_printk
exit

; case: trace_printk with r5 unset (trailing format arguments are optional)
; expect: accept
stdw [r10-8], 0x0a6425
mov r1, r10
add r1, -8
mov r2, 8
mov r3, 1
mov r4, 2
call trace_printk
mov r0, 0
exit

; case: trace_printk with a pointer as a format argument
; expect: reject insn 5: pointer-leak: r3 (stack pointer fp+0) passed as scalar argument 3 of trace_printk
stdw [r10-8], 0x0a6425
mov r1, r10
add r1, -8
mov r2, 8
mov r3, r10
call trace_printk
mov r0, 0
exit

; case: trace_printk format longer than the stack slot
; expect: reject insn 7: helper-mem: argument 1 of trace_printk: 16 bytes at fp-8 are out of bounds
stdw [r10-8], 0x0a6425
mov r1, r10
add r1, -8
mov r2, 16
mov r3, 1
mov r4, 2
mov r5, 3
call trace_printk
exit

; case: helper result is a scalar
; expect: accept
call ktime_get_ns
exit

; case: ringbuf output of an unchecked lookup result
; maps: ev=ringbuf,0,0,1,budget_bytes=4096 counts=hash,4,64,16
; expect: reject insn 11: null-check: r2 may be NULL (map_value_or_null of map 'counts'); compare it with 0 before passing it to ringbuf_output
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r2, r0
lddw r1, map:ev
mov r3, 8
mov r4, 0
call ringbuf_output
mov r0, 0
exit
