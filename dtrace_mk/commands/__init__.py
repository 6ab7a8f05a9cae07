"""CLI subcommands, one module each (see dtrace_mk/cli.py for the contract)."""
