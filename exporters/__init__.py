"""dtrace_mk.exporters (installed under the dtrace_mk namespace)."""
