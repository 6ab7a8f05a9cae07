"""dtrace_mk.launch (installed under the dtrace_mk namespace)."""
