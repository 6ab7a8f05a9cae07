// dtrace_mk escalated evidence, DTrace-style speculation: every task run of an epoch is
// held in this monitor's own evidence ring (a byte budget per worker per epoch, apart from
// the summary's), and the agent ships an epoch's slowest runs only when a summary
// predicate fires on that epoch -- a slow step, or a class whose slowest run is far above
// its mean (dtrace_mk/runtime/agent.py "Escalated evidence"); other epochs' are discarded.
// The agent reads the record's words by position: keep them in this order.
task:end { evidence(step, task.class, task.layer, task.tile, task.index, ts, task.dur_ns); }
