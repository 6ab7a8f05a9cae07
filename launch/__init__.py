"""dtrace_mk.launch (installed under the dtrace_mk namespace): run dtrace_mk next to a
serving job and attach to it live.

    serve      the reference server: python -m dtrace_mk.launch.serve --model tiny|small-moe|1b
    api        ServingHost: the agent, live queries and the control socket inside a serving loop
    control    the job's control socket (server on serving rank 0, client), its protocol
    jobs       the job registry: ids, private directories, sockets, tokens
    launcher   start_job: mpiexec (serving ranks + the MPMD collector), graceful stop, result
    collector  the MPMD collector process (diagnosis, span export, live Prometheus metrics)

Commands: dtrace-mk launch | attach | detach | list | demo.  See docs/operations.md.
"""
