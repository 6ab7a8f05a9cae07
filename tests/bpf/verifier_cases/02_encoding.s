; Encoding rules: each slot on its own.

; case: opcode not in the ISA table
; expect: reject insn 1: invalid-opcode: invalid opcode 0x8f
mov r0, 0
.insn 0x8f 0 0 0 0
exit

; case: opcode 0 outside an lddw
; expect: reject insn 0: invalid-opcode: opcode 0x00 outside the second slot of an lddw
.insn 0x00 0 0 0 0
mov r0, 0
exit

; case: src set on an immediate ALU op
; expect: reject insn 1: unused-field: add does not use src, which must be 0 (got 2)
mov r1, 0
.insn 0x07 1 2 0 1
mov r0, 0
exit

; case: offset set on an ALU op
; expect: reject insn 0: unused-field: mov does not use off, which must be 0 (got 1)
.insn 0xb7 0 0 1 0
exit

; case: imm set on a register ALU op
; expect: reject insn 1: unused-field: mov does not use imm, which must be 0 (got 5)
mov r1, 0
.insn 0xbf 0 1 0 5
exit

; case: dst set on ja
; expect: reject insn 1: unused-field: ja does not use dst, which must be 0 (got 1)
mov r0, 0
.insn 0x05 1 0 0 0
exit

; case: imm set on exit
; expect: reject insn 1: unused-field: exit does not use imm
mov r0, 0
.insn 0x95 0 0 0 1

; case: bpf-to-bpf call (src=1) is not supported
; expect: reject insn 0: unused-field: call with src=1: only helper calls (src=0) are supported
.insn 0x85 0 1 0 1
mov r0, 0
exit

; case: dst register 11
; expect: reject insn 0: bad-register: mov uses r11 as dst; registers are r0..r10
.insn 0xb7 11 0 0 0
mov r0, 0
exit

; case: src register 12
; expect: reject insn 0: bad-register: mov uses r12 as src
.insn 0xbf 0 12 0 0
exit

; case: mov into r10
; expect: reject insn 0: write-r10: mov writes r10, the read-only frame pointer
mov r10, 0
mov r0, 0
exit

; case: load into r10
; expect: reject insn 0: write-r10: ldxdw writes r10
ldxdw r10, [r1+8]
mov r0, 0
exit

; case: fetch-add writing r10
; maps: counts=hash,4,8,64
; expect: reject insn 0: write-r10: xadddw_fetch writes r10
xadddw_fetch [r0+0], r10
mov r0, 0
exit

; case: store through r10 is fine, writing it is not
; expect: accept
stdw [r10-8], 1
mov r0, 0
exit

; case: byte swap of 8 bits
; expect: reject insn 1: invalid-imm: le width 8 is not 16, 32 or 64
mov r1, 0
.insn 0xd4 1 0 0 8
mov r0, 0
exit

; case: atomic or is not supported
; expect: reject insn 0: invalid-imm: atomic operation 0x40 is not add (0x00) or fetch-add (0x01)
.insn 0xdb 0 1 0 0x40
mov r0, 0
exit

; case: constant shift by 64
; expect: reject insn 1: shift-range: lsh by 64 is out of range 0..63
mov r0, 1
lsh r0, 64
exit

; case: constant 32-bit shift by 32
; expect: reject insn 1: shift-range: rsh32 by 32 is out of range 0..31
mov r0, 1
rsh32 r0, 32
exit

; case: negative constant shift
; expect: reject insn 1: shift-range: arsh by -1 is out of range 0..63
mov r0, 1
arsh r0, -1
exit

; case: constant shift by 63 is fine
; expect: accept
mov r0, 1
lsh r0, 63
arsh r0, 63
exit

; case: lddw in the last slot
; expect: reject insn 1: lddw-missing-slot: lddw in the last slot has no second slot
mov r0, 0
.insn 0x18 1 0 0 0

; case: lddw second slot with an opcode
; expect: reject insn 1: lddw-second-slot: second slot of the lddw at insn 0 must have opcode, registers and offset 0 (got opcode 0x07
.insn 0x18 0 0 0 0
.insn 0x07 0 0 0 0
exit

; case: lddw second slot with a register
; expect: reject insn 1: lddw-second-slot: second slot of the lddw at insn 0 must have opcode, registers and offset 0 (got opcode 0x00, dst r2
.insn 0x18 0 0 0 0
.insn 0x00 2 0 0 0
exit

; case: lddw with unknown pseudo source
; maps: counts=hash,4,8,64
; expect: reject insn 0: lddw-pseudo: lddw src=3 is not a known pseudo source
.insn 0x18 1 3 0 0
.insn 0x00 0 0 0 0
mov r0, 0
exit

; case: map index out of range
; maps: counts=hash,4,8,64
; expect: reject insn 0: map-index: map index 3 out of range: the object has 1 map(s)
lddw r1, map#3
mov r0, 0
exit

; case: map_value reference to a hash map
; maps: counts=hash,4,8,64
; expect: reject insn 0: map-value-ref: lddw map_value needs an array map; map 'counts' is hash
lddw r1, map_value:counts
mov r0, 0
exit

; case: map_value reference past the value
; maps: arr=array,4,16,1
; expect: reject insn 0: map-value-ref: lddw map_value offset 16 outside value_size 16 of map 'arr'
lddw r1, map_value:arr+16
mov r0, 0
exit

; case: jump past the end
; expect: reject insn 0: jump-out-of-range: jump to insn 6 is outside the program (0..2)
ja +5
mov r0, 0
exit

; case: jump before the start
; expect: reject insn 1: jump-out-of-range: jump to insn -2 is outside the program (0..2)
mov r0, 0
jeq r0, 0, -4
exit

; case: jump into the middle of an lddw
; expect: reject insn 0: jump-into-lddw: jump to insn 2, the second slot of an lddw
ja +1
lddw r0, 5
exit

; case: jump over an lddw
; expect: accept
mov r0, 0
jeq r0, 0, +2
lddw r0, 5
exit

; case: immediate wider than 32 bits (an Insn built in Python)
; expect: reject insn 0: field-range: imm 4294967296 does not fit in 32 bits
.insn 0xb7 0 0 0 0x100000000
exit

; case: offset wider than 16 bits
; expect: reject insn 1: field-range: off 40000 does not fit in 16 bits
mov r0, 0
.insn 0x05 0 0 40000 0
exit

; case: negative register number
; expect: reject insn 0: field-range: dst -1 does not fit in 4 bits
.insn 0xb7 -1 0 0 0
exit
