; Register initialisation and types.

; case: exit without setting r0
; expect: reject insn 0: exit-r0: r0 is uninitialised at exit; programs return an initialised scalar
exit

; case: read of an unwritten register
; expect: reject insn 1: uninit-reg: r4 is read before it is written
mov r0, 0
mov r0, r4
exit

; case: ALU on an unwritten destination
; expect: reject insn 0: uninit-reg: r0 is read before it is written
add r0, 1
exit

; case: r2..r9 start unwritten
; expect: reject insn 0: uninit-reg: r9 is read before it is written
mov r0, r9
exit

; case: helper calls clobber r1..r5
; expect: reject insn 2: uninit-reg: r2 is read before it is written
mov r2, 1
call ktime_get_ns
mov r0, r2
exit

; case: helper calls keep r6..r9
; expect: accept
mov r6, 1
call ktime_get_ns
mov r0, r6
exit

; case: written on one path only
; expect: reject insn 3: uninit-reg: r3 is read before it is written
ldxw r2, [r1+24]
jgt r2, 5, skip
mov r3, 1
skip: mov r0, r3
exit

; case: written on both paths
; expect: accept
ldxw r2, [r1+24]
mov r3, 2
jgt r2, 5, skip
mov r3, 1
skip: mov r0, r3
exit

; case: stack pointer on one path, scalar on the other
; expect: reject insn 4: reg-type: r3 has different types on the paths reaching here (fp+0, scalar)
ldxw r2, [r1+24]
mov r3, r10
jgt r2, 5, skip
mov r3, 7
skip: add r3, 1
mov r0, 0
exit

; case: stack pointer returned
; expect: reject insn 1: exit-r0: r0 is stack pointer fp+0 at exit
mov r0, r10
exit

; case: ctx pointer returned
; expect: reject insn 1: exit-r0: r0 is ctx pointer ctx+0 at exit
mov r0, r1
exit

; case: 32-bit copy of a pointer
; expect: reject insn 0: pointer-arith: mov32 on r10, which is stack pointer fp+0
mov32 r0, r10
exit

; case: 64-bit copy of a pointer keeps its type
; expect: accept
mov r2, r10
stdw [r2-8], 3
ldxdw r0, [r2-8]
exit
