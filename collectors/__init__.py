"""dtrace_mk.collectors (installed under the dtrace_mk namespace): the analysis core of
the cross-rank collector.  Pure functions over records; the MPI transport feeds them.

    records    fixed-size msgpack records the per-rank agents ship (EpochSummary,
               RemoteWait, Signal, ClockSample, PingPong), size bounds
    clock      device->host least-squares fits (piecewise), host ping-pong offsets,
               ClockModel (aligned clock), causal check/clamp, error bound
    join       waits <-> signals by (comm_op, comm_gen, sender, receiver)
    patterns   wait-state pattern records (docs/patterns.md is generated from them)
    classify   one detector per pattern, thresholds, aligned waits
    rootcause  Scalasca-style delay analysis: stalls followed upstream to the root rank
    scenario   scenario files (faults), the fault kind/parameter table
    score      result validation and scoring against a scenario (`dtrace-mk score`)
    diagnose   diagnose(...) -> result dict; Accumulator/RecordSink: the transport seam
    synth      synthetic records (tests, benchmark)
"""
