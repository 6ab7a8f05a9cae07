; Context reads.  Layout: abi_version 0, hook 4, ts_ns 8, rank 16, sm 20, worker 24,
; task_class 28, task_index 32, task_gen 36, tile 40, request_slot 48, request_gen 52,
; decode_step 56, layer 60, expert 64, event_id 68, event_gen 72, comm_op 80, comm_gen 84,
; peer_rank 88, queue_depth 92, dur_ns 96, wait_ns 104, flags 112, reserved0 116,
; reserved1 120.

; case: dur_ns on task:end
; hook: task:end
; expect: accept
ldxdw r0, [r1+96]
exit

; case: dur_ns is not valid on task:begin
; hook: task:begin
; expect: reject insn 0: ctx-field-invalid: read of ctx+96 (dur_ns, 8 bytes) is not valid for hook task:begin (valid: abi_version, hook, ts_ns
ldxdw r0, [r1+96]
exit

; case: common fields are valid everywhere
; hook: gen:advance
; expect: accept
ldxdw r0, [r1+8]
ldxw r2, [r1+16]
ldxw r2, [r1+56]
ldxw r2, [r1+112]
exit

; case: task fields are not valid on gen:advance
; hook: gen:advance
; expect: reject insn 0: ctx-field-invalid: read of ctx+28 (task_class, 4 bytes) is not valid for hook gen:advance
ldxw r0, [r1+28]
exit

; case: queue:pressure has queue_depth
; hook: queue:pressure
; expect: accept
ldxw r0, [r1+92]
exit

; case: comm fields on comm:wait
; hook: comm:wait
; expect: accept
ldxw r0, [r1+80]
ldxw r2, [r1+84]
ldxw r3, [r1+88]
ldxdw r4, [r1+104]
exit

; case: peer_rank is not valid on task:end
; expect: reject insn 0: ctx-field-invalid: read of ctx+88 (peer_rank, 4 bytes)
ldxw r0, [r1+88]
exit

; case: reserved0 is never readable
; expect: reject insn 0: ctx-field-invalid: read of ctx+116 (reserved0, 4 bytes): reserved fields are never readable
ldxw r0, [r1+116]
exit

; case: reserved1 is never readable
; expect: reject insn 0: ctx-field-invalid: read of ctx+120 (reserved1, 8 bytes): reserved fields
ldxdw r0, [r1+120]
exit

; case: narrow loads at a field's start
; expect: accept
ldxw r0, [r1+96]
ldxh r2, [r1+28]
ldxb r3, [r1+0]
exit

; case: narrow load inside a field
; expect: reject insn 0: ctx-access: read of ctx+100 (4 bytes) is not a load of field dur_ns (offset 96, 8 bytes) from its start
ldxw r0, [r1+100]
exit

; case: load wider than the field
; expect: reject insn 0: ctx-access: read of ctx+16 (8 bytes) is not a load of field rank (offset 16, 4 bytes)
ldxdw r0, [r1+16]
exit

; case: misaligned ctx load
; expect: reject insn 0: ctx-align: read of ctx+2 (4 bytes) is not aligned to 4
ldxw r0, [r1+2]
exit

; case: ctx load past the record
; expect: reject insn 0: ctx-bounds: read of ctx+128 (8 bytes) is outside the context record (0..128)
ldxdw r0, [r1+128]
exit

; case: ctx load before the record
; expect: reject insn 0: ctx-bounds: read of ctx-4 (4 bytes)
ldxw r0, [r1-4]
exit

; case: store to ctx
; expect: reject insn 0: ctx-store: write to ctx+16: the context is read-only
stw [r1+16], 1
mov r0, 0
exit

; case: register store to ctx
; expect: reject insn 1: ctx-store: write to ctx+96
mov r2, 1
stxdw [r1+96], r2
mov r0, 0
exit

; case: ctx plus a constant, then load
; expect: accept
add r1, 8
ldxdw r0, [r1+0]
exit

; case: ctx plus a known register, then load
; expect: accept
mov r2, 96
add r1, r2
ldxdw r0, [r1+0]
exit

; case: ctx moved by a constant reaches an invalid field
; hook: task:begin
; expect: reject insn 1: ctx-field-invalid: read of ctx+96 (dur_ns, 8 bytes)
add r1, 100
ldxdw r0, [r1-4]
exit

; case: ctx plus an unknown scalar
; expect: reject insn 1: ctx-arith: add of scalar in [0, 4294967295] to the ctx pointer r1
ldxw r2, [r1+24]
add r1, r2
mov r0, 0
exit

; case: ctx spilled to the stack
; expect: reject insn 0: ctx-leak: ctx pointer r1 is stored to memory; it may only be used for loads
stxdw [r10-8], r1
mov r0, 0
exit

; case: ctx passed to a helper
; maps: h=hist_log2,4,512,16
; expect: reject insn 4: ctx-leak: ctx pointer r2 is passed to hist_add
mov r2, r1
lddw r1, map:h
mov r3, 1
call hist_add
mov r0, 0
exit

; case: ctx compared with zero
; expect: reject insn 0: pointer-compare: jeq compares r1 (ctx pointer ctx+0) with 0 (scalar 0)
jeq r1, 0, +0
mov r0, 0
exit

; case: ctx copy in r6 survives a call
; expect: accept
mov r6, r1
call ktime_get_ns
ldxdw r0, [r6+96]
exit
