; Branch refinement and path merging.  'counts' values are 64 bytes; after the shared
; prologue (insns 0..7) r0 is a checked map value and r6 the ctx.

; case: unsigned upper bound from jge
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
jge r2, 8, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: bound checked on the wrong side
; maps: counts=hash,4,64,16
; expect: reject insn 12: map-value-bounds: access [r0+[64, 34359738360], 8 bytes]
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
jlt r2, 8, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: signed bounds from two checks
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r2, [r6+8]
jsgt r2, 7, out
jslt r2, 0, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: signed upper bound alone allows negatives
; maps: counts=hash,4,64,16
; expect: reject insn 12: map-value-bounds: access [r0+
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r2, [r6+8]
jsgt r2, 7, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: 32-bit compare bounds a 32-bit value
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
jgt32 r2, 7, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: 32-bit compare does not bound a 64-bit value
; maps: counts=hash,4,64,16
; expect: reject insn 12: map-value-bounds: access [r0+
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r2, [r6+8]
jgt32 r2, 7, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: register compare bounds both sides
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
mov r3, 7
jgt r2, r3, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: equality makes a constant
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
jne r2, 56, out
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: jset clears low bits on the fallthrough
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
and r2, 63
jset r2, 7, out
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: join of two constants keeps both bounds and alignment
; maps: counts=hash,4,32,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r3, [r6+24]
mov r2, 8
jgt r3, 5, join
mov r2, 16
join: add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: join of two constants, one too large
; maps: counts=hash,4,32,16
; expect: reject insn 13: map-value-bounds: access [r0+[8, 32], 8 bytes] outside value_size 32
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r3, [r6+24]
mov r2, 8
jgt r3, 5, join
mov r2, 32
join: add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: branch decided by constants skips dead code
; hook: task:begin
; expect: accept
mov r2, 1
jeq r2, 1, ok
ldxdw r0, [r1+96]
exit
ok: mov r0, 0
exit

; case: branch that may go either way checks both arms
; hook: task:begin
; expect: reject insn 2: ctx-field-invalid: read of ctx+96 (dur_ns, 8 bytes)
ldxw r2, [r1+24]
jeq r2, 1, ok
ldxdw r0, [r1+96]
exit
ok: mov r0, 0
exit

; case: pointer compared with a non-zero constant
; maps: counts=hash,4,64,16
; expect: reject insn 8: pointer-compare: jgt compares r0 (map value pointer 'counts'+0) with 5 (scalar 5)
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
jgt r0, 5, out
out: mov r0, 0
exit

; case: 32-bit null check is not a null check
; maps: counts=hash,4,64,16
; expect: reject insn 7: pointer-compare: jeq32 compares r0 (map_value_or_null of map 'counts') with 0
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq32 r0, 0, out
out: mov r0, 0
exit

; case: two pointers compared
; expect: reject insn 2: pointer-compare: jeq compares r10 (stack pointer fp+0) with r2 (stack pointer fp-8)
mov r2, r10
add r2, -8
jeq r10, r2, +0
mov r0, 0
exit

; case: scalar compared with a pointer
; expect: reject insn 1: pointer-compare: jgt compares r10 (stack pointer fp+0) with r0 (scalar 0)
mov r0, 0
jgt r0, r10, +0
exit

; case: a bound checked on a copy narrows the original
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
mov r3, r2
jgt r3, 7, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: a bound checked on a copy narrows a spilled copy
; maps: counts=hash,4,64,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
mov r3, r2
stxdw [r10-16], r2
jgt r3, 7, out
ldxdw r2, [r10-16]
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: a copy rewritten after the check is not narrowed
; maps: counts=hash,4,64,16
; expect: reject insn 14: map-value-bounds: access [r0+[0, 34359738360], 8 bytes]
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
mov r3, r2
ldxw r2, [r6+28]
jgt r3, 7, out
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit
