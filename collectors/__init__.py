"""dtrace_mk.collectors (installed under the dtrace_mk namespace)."""
