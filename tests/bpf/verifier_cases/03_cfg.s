; Control flow: no loops, nothing unreachable, no falling off the end.

; case: code after exit is unreachable
; expect: reject insn 2: unreachable: insn 2 is unreachable
mov r0, 0
exit
mov r0, 1
exit

; case: code jumped over is unreachable
; expect: reject insn 2: unreachable: insn 2 is unreachable
mov r0, 0
ja +1
mov r0, 1
exit

; case: loop with a back edge
; expect: reject insn 2: back-edge: jump back to insn 1 forms a loop; loops are not allowed in v1
mov r0, 0
again: add r0, 1
jlt r0, 10, again
exit

; case: jump to itself
; expect: reject insn 1: back-edge: jump back to insn 1
mov r0, 0
ja -1
exit

; case: backward jump that closes no cycle
; expect: accept
; max-path: 4
mov r0, 0
ja +1
exit
ja -2

; case: program without exit falls off the end
; expect: reject insn 1: fall-off-end: execution falls off the end of the program after insn 1
mov r0, 0
add r0, 1

; case: conditional jump in the last slot falls off the end
; expect: reject insn 3: fall-off-end: execution falls off the end of the program after insn 3
mov r0, 0
ja +1
exit
jeq r0, 0, -2

; case: diamond: longest path counts the longer arm
; expect: accept
; max-path: 7
ldxw r2, [r1+24]
mov r0, 0
jgt r2, 5, big
mov r0, 1
ja out
big: mov r0, 2
add r0, 1
add r0, 1
out: exit

; case: two exits
; expect: accept
; max-path: 4
ldxw r0, [r1+24]
jeq r0, 0, zero
exit
zero: mov r0, 1
exit

; case: conditional jump to the next insn
; expect: accept
ldxw r0, [r1+24]
jeq r0, 0, +0
exit
