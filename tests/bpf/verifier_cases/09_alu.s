; Scalar arithmetic as modelled: most cases use the result as an offset into the
; 16-byte value of array map 'arr' (lddw map_value:arr), so a wrong model flips the verdict.

; case: division by zero is defined as 0
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, 100
div r2, 0
add r0, r2
ldxdw r0, [r0+0]
exit

; case: division by a zero register is 0 too
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, 100
mov r3, 0
div r2, r3
add r0, r2
ldxdw r0, [r0+8]
exit

; case: modulo by zero leaves dst unchanged
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, 8
mod r2, 0
add r0, r2
ldxdw r0, [r0+0]
exit

; case: modulo by zero does not make dst 0
; maps: arr=array,4,16,1
; expect: reject insn 5: map-value-bounds: access [r0+16, 8 bytes] outside value_size 16 of map 'arr'
lddw r0, map_value:arr
mov r2, 8
mod r2, 0
add r0, r2
ldxdw r0, [r0+8]
exit

; case: 32-bit modulo by zero zero-extends dst
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
lddw r2, 0x100000008
mod32 r2, 0
add r0, r2
ldxdw r0, [r0+0]
exit

; case: 32-bit division by zero is 0
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
lddw r2, 0x100000008
div32 r2, 0
add r0, r2
ldxdw r0, [r0+8]
exit

; case: division bounds
; maps: arr=array,4,16,1
; expect: accept
mov r6, r1
lddw r0, map_value:arr
ldxw r2, [r6+24]
and r2, 255
div r2, 32
lsh r2, 1
add r0, r2
ldxh r0, [r0+0]
exit

; case: modulo bounds
; maps: arr=array,4,16,1
; expect: accept
mov r6, r1
lddw r0, map_value:arr
ldxw r2, [r6+24]
mod r2, 16
add r0, r2
ldxb r0, [r0+0]
exit

; case: mov32 zero-extends
; maps: arr=array,4,16,1
; expect: reject insn 4: map-value-bounds: access [r0+4294967288, 8 bytes]
lddw r0, map_value:arr
mov32 r2, -8
add r0, r2
ldxdw r0, [r0+0]
exit

; case: mov sign-extends its immediate
; maps: arr=array,4,16,1
; expect: reject insn 4: map-value-bounds: access [r0-8, 8 bytes]
lddw r0, map_value:arr
mov r2, -8
add r0, r2
ldxdw r0, [r0+0]
exit

; case: add32 wraps and zero-extends
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
lddw r2, 0xfffffffffffffff8
add32 r2, 16
add r0, r2
ldxdw r0, [r0+0]
exit

; case: shift by a known register amount
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, 1
mov r3, 3
lsh r2, r3
add r0, r2
ldxdw r0, [r0+0]
exit

; case: shift by a register amount >= 64 is unknown
; maps: arr=array,4,16,1
; expect: reject insn 6: map-value-bounds: access [r0+
lddw r0, map_value:arr
mov r2, 1
mov r3, 64
lsh r2, r3
add r0, r2
ldxb r0, [r0+0]
exit

; case: shift by an unknown amount is unknown
; maps: arr=array,4,16,1
; expect: reject insn 7: map-value-bounds: access [r0+
mov r6, r1
lddw r0, map_value:arr
mov r2, 1
ldxw r3, [r6+24]
lsh r2, r3
add r0, r2
ldxb r0, [r0+0]
exit

; case: arithmetic shift keeps the sign
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, -32
arsh r2, 2
add r2, 16
add r0, r2
ldxdw r0, [r0+0]
exit

; case: logical shift of a negative number
; maps: arr=array,4,16,1
; expect: reject insn 5: map-value-bounds: access [r0+2305843009213693948
lddw r0, map_value:arr
mov r2, -32
rsh r2, 3
add r0, r2
ldxdw r0, [r0+0]
exit

; case: neg, xor, or, sub, mul
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, -8
neg r2
xor r2, 12
or r2, 8
sub r2, 4
mul r2, 1
add r0, r2
ldxdw r0, [r0+0]
exit

; case: byte swaps
; maps: arr=array,4,16,1
; expect: accept
lddw r0, map_value:arr
mov r2, 0x0800
be16 r2
lddw r3, 0x1234560000000008
le32 r3
add r0, r2
add r0, r3
ldxb r0, [r0-8]
exit

; case: unknown be16 is 16 bits
; maps: arr=array,4,16,1
; expect: reject insn 6: map-value-bounds: access [r0+[0, 65535], 1 bytes]
mov r6, r1
lddw r0, map_value:arr
ldxw r2, [r6+24]
be16 r2
add r0, r2
ldxb r0, [r0+0]
exit

; case: ctx loads are zero-extended by width
; maps: counts=hash,4,512,16
; expect: accept
mov r6, r1
stw [r10-4], 0
lddw r1, map:counts
mov r2, r10
add r2, -4
call map_lookup_elem
jeq r0, 0, out
ldxb r2, [r6+24]
add r0, r2
ldxb r1, [r0+0]
out: mov r0, 0
exit
