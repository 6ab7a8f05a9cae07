"""Compiler passes, one per module; `dtrace_mk.lang.pipeline` lists them in order."""
