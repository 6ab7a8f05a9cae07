"""eBPF verifier: instruction -> assertions -> checker -> one message format."""
