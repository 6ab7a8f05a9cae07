// dtrace_mk default summary monitors: what the per-rank agent ships to the collector.
// Every map is keyed by step (the epoch = one decode step) so the agent can read and
// clear one epoch at a time.  The agent (dtrace_mk/runtime/agent.py) reads these maps by
// name; change names here and there together.

// task class duration: count, sum, min, max per (step, class)
task:end { @dur[step, task.class] = stats(task.dur_ns); }

// dispatch wait: ready -> dispatch, per (step, class) (the local-imbalance signal)
task:dispatch { @dispatch_wait[step, task.class] = sum(task.wait_ns); }

// local dependency wait: dep:wait -> dep:release of local events (remote ones are comm:wait)
dep:release /!(flags & FLAG_REMOTE)/ { @dep_wait[step, task.class] = sum(dep.wait_ns); }

// notification lag: the producer's task:end -> the event's task:ready (joined by the agent
// per (step, event): ready - the last producer end, charged to that producer's class)
task:end { @end_ts[step, event.id, task.class] = max(ts); }
task:ready { @ready_ts[step, event.id] = min(ts); }

// ready-queue depth maximum per (step, worker)
task:ready, task:dispatch, queue:pressure { @queue_max[step, worker] = max(queue.depth); }

// MoE: work per expert (task time, which grows with the tokens routed to it)
task:end /task.expert != NONE/ { @expert_ns[step, task.expert] = sum(task.dur_ns); }

// epoch bounds on this rank's device clock
task:ready { @t_begin[step] = min(ts); }
task:end { @t_end[step] = max(ts); }

// remote waits: totals, and one evidence record per wait for the cross-rank join
comm:wait { @remote_wait[step] = stats(comm.wait_ns);
            evidence(comm.op, comm.gen, comm.peer, step, task.layer, task.class, ts, comm.wait_ns); }

// sender-side signal times
comm:signal { evidence(comm.op, comm.gen, comm.peer, step, task.layer, ts); }
