; Map values: null checks, bounds (constant and variable offsets), alignment, leaks.
; Most cases share a prologue: key 0 on the stack, lookup in 'counts' (value 64 bytes),
; insns 0..6, the null check at insn 7.

; case: lookup, null check, read and write the value
; maps: counts=hash,4,64,128
; expect: accept
; helpers: 1
; maps-used: 0
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r1, [r0+56]
add r1, 1
stxdw [r0+56], r1
stdw [r0+0], 7
out: mov r0, 0
exit

; case: value used without a null check
; maps: counts=hash,4,64,128
; expect: reject insn 7: null-check: r0 may be NULL (map_value_or_null of map 'counts'); compare it with 0 before accessing memory through it
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
ldxdw r1, [r0+0]
mov r0, 0
exit

; case: null check with jne
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jne r0, 0, have
mov r0, 0
exit
have: ldxdw r0, [r0+0]
exit

; case: null check with a register holding 0
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r1, 0
jeq r0, r1, out
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: the null check refines copies
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r7, r0
jeq r0, 0, out
ldxdw r1, [r7+0]
out: mov r0, 0
exit

; case: the null check refines spilled copies
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
stxdw [r10-16], r0
jeq r0, 0, out
ldxdw r7, [r10-16]
ldxdw r1, [r7+8]
out: mov r0, 0
exit

; case: checked value joined with NULL needs a new check
; maps: counts=hash,4,64,128
; expect: reject insn 10: null-check: r0 may be NULL
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jne r0, 0, have
mov r0, 0
have: mov r1, 0
ldxdw r1, [r0+0]
mov r0, 0
exit

; case: NULL returned unchecked
; maps: counts=hash,4,64,128
; expect: reject insn 7: exit-r0: r0 is map_value_or_null of map 'counts' at exit
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
exit

; case: read past the value
; maps: counts=hash,4,64,128
; expect: reject insn 8: map-value-bounds: access [r0+60, 8 bytes] outside value_size 64 of map 'counts'
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r1, [r0+60]
out: mov r0, 0
exit

; case: read before the value
; maps: counts=hash,4,64,128
; expect: reject insn 8: map-value-bounds: access [r0-8, 8 bytes] outside value_size 64
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r1, [r0-8]
out: mov r0, 0
exit

; case: misaligned constant offset
; maps: counts=hash,4,64,128
; expect: reject insn 8: map-value-align: access [r0+4, 8 bytes] of map 'counts' is not provably aligned to 8
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxdw r1, [r0+4]
out: mov r0, 0
exit

; case: variable offset bounded by and and shift
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
and r2, 7
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: variable offset one bucket too far
; maps: counts=hash,4,64,128
; expect: reject insn 12: map-value-bounds: access [r0+[0, 120], 8 bytes] outside value_size 64 of map 'counts'
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
and r2, 15
lsh r2, 3
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: variable offset not provably aligned
; maps: counts=hash,4,64,128
; expect: reject insn 11: map-value-align: access [r0+[0, 15], 8 bytes] of map 'counts' is not provably aligned to 8
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
and r2, 15
add r0, r2
ldxdw r1, [r0+0]
out: mov r0, 0
exit

; case: unbounded variable offset
; maps: counts=hash,4,64,128
; expect: reject insn 10: map-value-bounds: access [r0+[0, 4294967295], 1 bytes]
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxw r2, [r6+24]
add r0, r2
ldxb r1, [r0+0]
out: mov r0, 0
exit

; case: scalar plus map value pointer
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
mov r2, 8
add r2, r0
ldxdw r1, [r2+0]
out: mov r0, 0
exit

; case: atomic add, plain and fetching
; maps: counts=hash,4,64,128
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
mov r1, 1
xadddw [r0+8], r1
xaddw_fetch [r0+16], r1
add r1, 2
out: mov r0, 0
exit

; case: atomic add past the value
; maps: counts=hash,4,64,128
; expect: reject insn 9: map-value-bounds: access [r0+64, 8 bytes] outside value_size 64
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
mov r1, 1
xadddw [r0+64], r1
out: mov r0, 0
exit

; case: stack pointer stored into a map value
; maps: counts=hash,4,64,128
; expect: reject insn 8: pointer-leak: storing r10 (stack pointer fp+0) into a value of map 'counts' would leak a pointer
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
stxdw [r0+0], r10
out: mov r0, 0
exit

; case: map value pointer stored into its own value
; maps: counts=hash,4,64,128
; expect: reject insn 8: pointer-leak: storing r0 (map value pointer 'counts'+0) into a value of map 'counts'
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
stxdw [r0+0], r0
out: mov r0, 0
exit

; case: atomic add of a pointer
; maps: counts=hash,4,64,128
; expect: reject insn 8: pointer-leak: storing r10 (stack pointer fp+0) into a value of map 'counts'
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
xadddw [r0+0], r10
out: mov r0, 0
exit

; case: direct value reference into an array
; maps: arr=array,4,16,1
; expect: accept
; maps-used: 0
lddw r1, map_value:arr+8
ldxdw r0, [r1+0]
exit

; case: direct value reference read past the value
; maps: arr=array,4,16,1
; expect: reject insn 2: map-value-bounds: access [r1+16, 8 bytes] outside value_size 16 of map 'arr'
lddw r1, map_value:arr+8
ldxdw r0, [r1+8]
exit

; case: load through a map pointer
; maps: counts=hash,4,64,128
; expect: reject insn 2: mem-not-pointer: read through r2, which is map pointer 'counts', not a pointer to memory
lddw r2, map:counts
ldxdw r0, [r2+0]
exit

; case: lookups in two maps, each checked
; maps: counts=hash,4,64,128 arr=array,4,16,4
; expect: accept
; maps-used: 0,1
; helpers: 1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r7, r0
lddw r1, map:arr
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
jeq r7, 0, out
ldxdw r1, [r0+8]
ldxdw r2, [r7+56]
out: mov r0, 0
exit

; case: bounds use the right map after two lookups
; maps: counts=hash,4,64,128 arr=array,4,16,4
; expect: reject insn 14: map-value-bounds: access [r0+56, 8 bytes] outside value_size 16 of map 'arr'
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r7, r0
lddw r1, map:arr
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
jeq r7, 0, out
ldxdw r1, [r0+56]
out: mov r0, 0
exit
