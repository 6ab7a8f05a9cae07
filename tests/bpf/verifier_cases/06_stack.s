; Stack: bounds, alignment, initialisation, spills.

; case: store then load
; expect: accept
; stack-depth: 8
stdw [r10-8], 5
ldxdw r0, [r10-8]
exit

; case: the deepest slot
; expect: accept
; stack-depth: 512
stdw [r10-512], 1
ldxdw r0, [r10-512]
exit

; case: below the stack
; expect: reject insn 0: stack-bounds: write of fp-520 (8 bytes) is outside the stack [fp-512, fp)
stdw [r10-520], 1
mov r0, 0
exit

; case: at or above the frame pointer
; expect: reject insn 0: stack-bounds: write of fp+0 (4 bytes) is outside the stack
stw [r10+0], 1
mov r0, 0
exit

; case: access straddling the top
; expect: reject insn 0: stack-bounds: read of fp-4 (8 bytes)
ldxdw r0, [r10-4]
exit

; case: misaligned 8-byte store
; expect: reject insn 0: stack-align: write of fp-12 (8 bytes) is not aligned to 8
stdw [r10-12], 1
mov r0, 0
exit

; case: misaligned 2-byte load
; expect: reject insn 1: stack-align: read of fp-3 (2 bytes) is not aligned to 2
stdw [r10-8], 0
ldxh r0, [r10-3]
exit

; case: byte accesses anywhere
; expect: accept
stb [r10-3], 1
ldxb r0, [r10-3]
exit

; case: read of never-written stack
; expect: reject insn 0: stack-uninit-read: read of fp-8 (8 bytes) reads uninitialised stack at fp-8
ldxdw r0, [r10-8]
exit

; case: read of half-written stack
; expect: reject insn 1: stack-uninit-read: read of fp-8 (8 bytes) reads uninitialised stack at fp-4
stw [r10-8], 1
ldxdw r0, [r10-8]
exit

; case: written on one path only
; expect: reject insn 4: stack-uninit-read: read of fp-16 (8 bytes) reads uninitialised stack at fp-16
ldxw r2, [r1+24]
jgt r2, 5, skip
stdw [r10-16], 1
skip: mov r0, 0
ldxdw r0, [r10-16]
exit

; case: pointer spill and fill keeps the type
; expect: accept
stxdw [r10-8], r10
ldxdw r2, [r10-8]
stdw [r2-16], 7
ldxdw r0, [r2-16]
exit

; case: partial overwrite makes a spilled pointer a scalar
; expect: reject insn 3: mem-not-pointer: read through r2, which is unknown scalar, not a pointer to memory
stxdw [r10-8], r10
stw [r10-8], 0
ldxdw r2, [r10-8]
ldxdw r0, [r2-16]
exit

; case: partially overwritten pointer read back as a scalar
; expect: accept
stxdw [r10-8], r10
stb [r10-1], 0
ldxdw r0, [r10-8]
exit

; case: narrow read of a spilled pointer
; expect: reject insn 1: spill-partial-read: read of fp-4 (4 bytes) reads part of a spilled stack pointer fp+0 at fp-8
stxdw [r10-8], r10
ldxw r0, [r10-4]
exit

; case: narrow read of a spilled scalar
; expect: accept
stdw [r10-8], 0x1234
ldxh r0, [r10-8]
exit

; case: spilled constant read back narrow keeps its value
; maps: arr=array,4,16,1
; expect: accept
stdw [r10-8], 0x0800
ldxb r2, [r10-7]
lddw r0, map_value:arr
add r0, r2
ldxdw r0, [r0+0]
exit

; case: stack pointer moved by constants
; expect: accept
; stack-depth: 24
mov r2, r10
add r2, -16
sub r2, 8
stdw [r2+0], 1
ldxdw r0, [r2+0]
exit

; case: stack pointer moved by a known register
; expect: accept
mov r2, -16
mov r3, r10
add r3, r2
stdw [r3+0], 1
ldxdw r0, [r3+0]
exit

; case: stack pointer moved by an unknown scalar
; expect: reject insn 2: stack-var-offset: add of scalar in [0, 4294967295] to the stack pointer r3
ldxw r2, [r1+24]
mov r3, r10
add r3, r2
mov r0, 0
exit

; case: stack pointer moved out of the stack
; expect: reject insn 2: stack-bounds: write of fp-600 (8 bytes)
mov r2, r10
add r2, -600
stdw [r2+0], 1
mov r0, 0
exit

; case: narrow store of a pointer
; expect: reject insn 0: pointer-leak: stxw stores 4 bytes of r10 (stack pointer fp+0); pointers are spilled with 8-byte stores only
stxw [r10-8], r10
mov r0, 0
exit

; case: atomic add on the stack
; expect: reject insn 2: atomic-target: atomic add through r10, which is stack pointer fp+0; atomics target map values
stdw [r10-8], 0
mov r1, 1
xadddw [r10-8], r1
mov r0, 0
exit

; case: load through a scalar
; expect: reject insn 1: mem-not-pointer: read through r2, which is scalar 0, not a pointer to memory
mov r2, 0
ldxdw r0, [r2+0]
exit

; case: pointer spilled on one path, data on the other
; expect: reject insn 4: spill-partial-read: read of fp-8 (4 bytes) reads part of a spilled mixed types
ldxw r2, [r1+24]
stdw [r10-8], 0
jgt r2, 5, skip
stxdw [r10-8], r10
skip: ldxw r0, [r10-8]
exit

; case: pointer or data, read back whole
; expect: reject insn 5: reg-type: r3 has different types on the paths reaching here
ldxw r2, [r1+24]
stdw [r10-8], 0
jgt r2, 5, skip
stxdw [r10-8], r10
skip: ldxdw r3, [r10-8]
ldxdw r0, [r3-16]
exit
