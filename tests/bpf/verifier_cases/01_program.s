; Program-level rules: size, program type.  Default hook task:end.

; case: empty program
; expect: reject empty-program: program 'empty program' has no instructions

; case: 4097 slots is one too many
; expect: reject program-too-large: program '4097 slots is one too many' has 4097 slots, more than the limit of 4096
mov r0, 0
.repeat 4095 add r0, 1
exit

; case: exactly 4096 slots, straight line
; expect: accept
; max-path: 4096
mov r0, 0
.repeat 4094 add r0, 1
exit

; case: lddw counts two slots but one executed insn
; expect: accept
; max-path: 2
lddw r0, 0x1122334455667788
exit

; case: control program on an observe hook is refused
; type: control
; expect: reject prog-type-not-attachable: control programs are not attachable in ABI v1 (hook task:end)
mov r0, 0
exit

; case: control program verified explicitly
; type: control
; verify-as: control
; expect: accept
; helpers: 300
mov r1, 1
call set_priority_hint
mov r0, 0
exit

; case: unknown program type
; verify-as: kernel
; expect: reject prog-type-unknown: unknown program type 'kernel' (expected one of observe, control)
mov r0, 0
exit

; case: result reports helpers, maps and stack depth
; maps: counts=hash,4,8,64 other=array,4,8,4
; expect: accept
; helpers: 1,5
; maps-used: 0
; stack-depth: 8
call ktime_get_ns
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
mov r0, 0
exit
