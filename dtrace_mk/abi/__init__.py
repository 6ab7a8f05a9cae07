"""Hook ABI v1 (definition.py is the one source of truth) and the task schema."""
