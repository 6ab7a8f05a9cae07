// dtrace_mk default summary monitors, comm half (see summary_tasks.d): remote waits
// with one evidence record each, and the last signal per all-reduce and peer.  The
// agent runs it on the host over the comm:* records the kernel streams.
//
//   @remote_wait[step]           comm:wait totals; evidence: one record per remote wait
//                                for the cross-rank join.  The agent starts
//                                a remote wait no earlier than the last local producer end
//                                of the awaited event (@end_ts): before that the task was
//                                also waiting on local work, which is not a remote wait.
//   @signal_last[step, op, gen, peer, layer]  last signal to peer of one all-reduce

comm:wait {
  @remote_wait[step] = stats(comm.wait_ns);
  evidence(comm.op, comm.gen, comm.peer, step, task.layer, task.class, ts, comm.wait_ns, event.id);
}

// sender-side signal times: the last tile's signal per (peer, op, gen) is the release the
// collector joins on, so one map entry per all-reduce and peer instead of one per tile
comm:signal { @signal_last[step, comm.op, comm.gen, comm.peer, task.layer] = max(ts); }
