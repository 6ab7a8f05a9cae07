; task:end, count events per task class in hash map `counts` (u32 class -> u64 count):
; a null-checked lookup + atomic add, else an insert.  Shared by bench/vm.py and the
; runtime / sim tests (each brings its own map size).
    ldxw r2, [r1+28]
    stxw [r10-4], r2
    lddw r1, map:counts
    mov r2, r10
    add r2, -4
    call map_lookup_elem
    jeq r0, 0, insert
    mov r1, 1
    xadddw [r0+0], r1
    mov r0, 0
    exit
insert:
    stdw [r10-16], 1
    lddw r1, map:counts
    mov r2, r10
    add r2, -4
    mov r3, r10
    add r3, -16
    mov r4, 0
    call map_update_elem
    mov r0, 0
    exit
