// dtrace_mk default summary monitors, task half: what the per-rank agent ships to the
// collector.  With summary_comm.d (the comm half) it is the agent's summary query: the two
// files concatenated, tasks first.  On a GPU rank with device summaries the task half runs
// in the megakernel's device VM and the comm half on the host (runtime/agent.py).
// Every map is keyed by step (the epoch = one decode step) so the agent can read and
// clear one epoch at a time.  The agent (dtrace_mk/runtime/agent.py) reads these maps by
// name (SUMMARY_MAPS there); change names here and there together.  One clause per probe
// keeps it to one program run per hook event.
//
//   @dur[step, class]            task duration stats (begin -> end)
//   @end_ts[step, event, class]  last task:end of the producers of an event
//   @ready_ts[step, event]       first task:ready of its consumers (local events only); the
//                                agent joins the two:
//                                notification lag = ready - last producer end, charged to
//                                the producer's class
//   @dispatch_wait[step, class]  ready -> dispatch (the local-imbalance signal)
//   @dep_wait[step, class]       dep:wait -> dep:release of local events (remote: comm:wait)
//   @queue_max[step, worker]     ready-queue depth maximum
//   @expert_ns[step, expert]     MoE: task time per expert (grows with its tokens)
//   @t_begin[step]               the epoch's first task:ready on this rank's device clock (its
//                                end, the last task:end, is the largest @end_ts of the step)
//   (@remote_wait, @signal_last and the remote-wait evidence: summary_comm.d)

task:end {
  @dur[step, task.class] = stats(task.dur_ns);
  @end_ts[step, event.id, task.class] = max(ts);
  if (task.expert != NONE) { @expert_ns[step, task.expert] = sum(task.dur_ns); }
}

task:ready {
  @queue_max[step, worker] = max(queue.depth);
  @t_begin[step] = min(ts);
  // events fed by other ranks (FLAG_REMOTE) are remote waits, not notification lag
  if (!(flags & FLAG_REMOTE)) { @ready_ts[step, event.id] = min(ts); }
}

task:dispatch {
  @dispatch_wait[step, task.class] = sum(task.wait_ns);
  @queue_max[step, worker] = max(queue.depth);
}

queue:pressure { @queue_max[step, worker] = max(queue.depth); }

dep:release /!(flags & FLAG_REMOTE)/ { @dep_wait[step, task.class] = sum(dep.wait_ns); }
