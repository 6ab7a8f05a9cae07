"""Language passes, one module each; the ordered pipeline is dtrace_mk.lang.pipeline."""
